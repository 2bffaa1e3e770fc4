"""A stateful Hypothesis test: the log against a plain-list model.

The machine plays an agent loop: it keeps, per session, the live list of message
dicts it would flush, mutates it the ways agent loops do (grow, rewind, edit in
place, insert scaffolding, compact, replace with fresh copies), writes through
every API, forks and reopens the log; after every step the stored transcripts
equal the model and the log verifies.
"""

from __future__ import annotations

import copy
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from eventlog import EventLog

texts = st.sampled_from(["ok", "yes", "no", "hello", "ok", "done", "retry", ""])
roles = st.sampled_from(["user", "assistant", "tool"])
SESSIONS = ["a", "b", "c", "d", "e"]


def make(role: str, text: str, n: int) -> dict:
    message = {"role": role, "content": text}
    if n % 3 == 0:
        message["_local"] = n  # process-local annotation: not stored
    return message


def stored(message: dict) -> dict:
    return {k: v for k, v in message.items() if not k.startswith("_")}


class LogMachine(RuleBasedStateMachine):
    @initialize(trust=st.booleans())
    def open_log(self, trust: bool) -> None:
        self.dir = tempfile.mkdtemp()
        self.trust = trust
        self.log = EventLog.open(self.dir, trust_identity=trust)
        self.lists: dict[str, list[dict]] = {}
        self.counter = 0

    def teardown(self) -> None:
        if hasattr(self, "log"):
            self.log.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    def model(self, session: str) -> list[dict]:
        return [stored(m) for m in self.lists.get(session, []) if not m.get("_thinking_prefill")]

    def fresh(self, role: str, text: str) -> dict:
        self.counter += 1
        return make(role, text, self.counter)

    def replace_list(self, session: str, new: list[dict]) -> None:
        # In trust mode the caller never mutates a flushed dict: it builds new ones.
        self.lists[session] = new

    @rule(session=st.sampled_from(SESSIONS), new=st.lists(st.tuples(roles, texts), min_size=1, max_size=4))
    def grow_and_flush(self, session, new):
        current = self.lists.setdefault(session, [])
        current.extend(self.fresh(r, t) for r, t in new)
        self.log.flush(session, current)

    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def rewind_by_flush(self, session, data):
        current = self.lists.get(session)
        if not current or len(self.model(session)) < 2:
            return
        keep = data.draw(st.integers(1, len(current) - 1))
        if not [m for m in current[:keep] if not m.get("_thinking_prefill")]:
            return
        self.replace_list(session, current[:keep])
        self.log.flush(session, self.lists[session])

    @rule(session=st.sampled_from(SESSIONS), data=st.data(), text=texts)
    def edit_and_flush(self, session, data, text):
        current = self.lists.get(session)
        kept = [i for i, m in enumerate(current or []) if not m.get("_thinking_prefill")]
        if len(kept) < 2:
            return  # editing the first stored message is a HistoryMismatchError, tested elsewhere
        index = data.draw(st.sampled_from(kept[1:]))
        if self.trust:
            current = list(current)
            current[index] = dict(current[index], content=text + "!")
            self.replace_list(session, current)
        else:
            current[index]["content"] = text + "!"  # in place, as agent loops do
        self.log.flush(session, self.lists[session])

    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def scaffolding(self, session, data):
        current = self.lists.get(session)
        if not current:
            return
        index = data.draw(st.integers(0, len(current)))
        current.insert(index, {"role": "assistant", "content": "", "_thinking_prefill": True})
        self.log.flush(session, current)

    @rule(session=st.sampled_from(SESSIONS))
    def fresh_copies(self, session):
        if session in self.lists:
            self.replace_list(session, copy.deepcopy(self.lists[session]))
            result = self.log.flush(session, self.lists[session])
            assert result.appended == 0 and result.tombstoned == 0

    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def compact_by_flush(self, session, data):
        current = self.lists.get(session)
        if not current:
            return
        start = data.draw(st.integers(0, len(current)))
        summary = {"role": "user", "content": f"summary {self.counter}", "_compressed_summary": True}
        self.counter += 1
        self.replace_list(session, [summary] + current[start:])
        self.log.flush(session, self.lists[session])

    @rule(session=st.sampled_from(SESSIONS), new=st.lists(st.tuples(roles, texts), min_size=1, max_size=3))
    def append(self, session, new):
        batch = [self.fresh(r, t) for r, t in new]
        self.log.append(session, batch, expected_head=self.log.head(session) or "0" * 64)
        self.replace_list(session, list(self.lists.get(session, [])) + batch)

    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def rewind(self, session, data):
        if session not in self.log:
            return
        live = self.model(session)
        to = data.draw(st.integers(0, len(live)))
        self.log.rewind(session, to=to)
        self.replace_list(session, [dict(m) for m in live[:to]])

    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def rewound_elsewhere_then_flush(self, session, data):
        """Another process rewinds the log under this one's snapshot cache (this log is not
        told); the agent then flushes its unchanged list, which must be stored whole again."""
        current = self.lists.get(session)
        if session not in self.log or not current:
            return
        to = data.draw(st.integers(0, len(self.model(session))))
        self.log._store.write(lambda txn: self.log._writer.rewind(txn, session, to))
        self.log.flush(session, current)

    @rule(session=st.sampled_from(SESSIONS), data=st.data(), text=texts)
    def compact(self, session, data, text):
        if session not in self.log:
            return
        live = self.model(session)
        start = data.draw(st.integers(0, len(live)))
        end = data.draw(st.integers(start, len(live)))
        summary = {"role": "user", "content": "S:" + text}
        self.log.compact(session, start=start, end=end, summary=[summary])
        self.replace_list(session, [dict(m) for m in live[:start]] + [summary] + [dict(m) for m in live[end:]])

    @rule(source=st.sampled_from(SESSIONS), name=st.sampled_from(SESSIONS), data=st.data())
    def fork(self, source, name, data):
        if source not in self.log or name in self.log:
            return
        live = self.model(source)
        at = data.draw(st.integers(0, len(live)))
        self.log.fork(source, name, at=at)
        self.replace_list(name, [dict(m) for m in live[:at]])

    @precondition(lambda self: hasattr(self, "log"))
    @rule()
    def reopen(self):
        self.log.close()
        self.log = EventLog.open(self.dir, trust_identity=self.trust)

    @invariant()
    def matches_model(self):
        if not hasattr(self, "log"):
            return
        for session in self.log.sessions():
            assert self.log.messages(session) == self.model(session), session
        assert self.log.verify().ok


LogMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLog = LogMachine.TestCase
