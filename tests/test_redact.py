"""Redaction: the content is erased from every file of the log, every earlier checkpoint and every
proof of another message still verifies, and the redaction is reported, not taken for damage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from hashlib import sha256
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import assistant, tool, user
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import EventLog, LogInUseError, ReadOnlyError, RedactedError, UnknownSessionError, codec, signing
from eventlog.aio import AsyncEventLog
from eventlog.audit import AuditError
from eventlog.cli import cli
from eventlog.redact import REDACTED, placeholder
from eventlog.spill import SpillingWriter, write_spill
from eventlog.verifier import verify_proof

SECRET = "sk-live-7f3a9c2e41b8d6"


def secret_message() -> dict[str, object]:
    return assistant(f"the key is {SECRET}")


def files_holding(root: Path, needles: list[bytes]) -> dict[str, list[int]]:
    """Every file under ``root`` holding one of ``needles``: path -> indexes of the needles found."""
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            hits = [i for i, needle in enumerate(needles) if needle in data]
            if hits:
                found[str(path.relative_to(root))] = hits
    return found


def traces(proof: dict[str, object]) -> list[bytes]:
    """What would confirm or show the proven message: its text, its digest, its salt (raw and hex)."""
    message = proof["message"]
    assert isinstance(message, dict)
    canonical = codec.encode(message["content"])
    digest = sha256(canonical).digest()
    salt = bytes.fromhex(message["salt"])
    return [SECRET.encode(), digest, digest.hex().encode(), salt, salt.hex().encode()]


def run(log: Path, *args: str):
    return CliRunner().invoke(cli, ["--log", str(log), *args], catch_exceptions=False)


@pytest.fixture
def key():
    return signing.generate("example.com/agent-log")


def build(log: EventLog) -> list[dict[str, object]]:
    """A session whose secret (position 2) has a display override, an annotation later, a fork
    that shares it and goes on, and an edit before it that carries it."""
    messages = [user("be brief"), user("hello"), secret_message(), user("thanks")]
    log.flush("chat", messages, overrides={2: {"display": f"shown: {SECRET}"}})
    log.fork("chat", "fork")
    log.flush("fork", [*log.messages("fork"), assistant("fork goes on")])
    edited = [messages[0], user("hello!"), messages[2], messages[3]]
    log.flush("chat", edited, overrides={2: {"display": f"again: {SECRET}"}})  # carried, override kept
    log.flush("chat", edited, overrides={2: {"display": f"now: {SECRET}"}})  # an annotation
    log.flush("other", [user("unrelated"), assistant("fine")])
    return edited


def test_redaction_erases_the_content_from_every_file_and_keeps_every_proof(tmp_path, key):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        edited = build(log)
        note = log.checkpoint([key])
        proofs = {
            (session, position): log.prove(session, position, note)
            for session in ("chat", "fork", "other")
            for position in range(len(log.messages(session)))
        }
        head = log.log_head()
        assert head is not None
        secret_traces = traces(proofs[("chat", 2)])
        old_node = bytes.fromhex(log.history("chat")[2].node)
        assert files_holding(path, [*secret_traces, old_node])  # before: it is there

        store = log._store
        with store.read() as txn:
            nodes_before = list(store.tree.nodes(txn))

        done = log.redact("chat", 2, reason="a leaked API key", by="alice")

        with store.read() as txn:  # the tree only grew by the redaction event's leaf
            assert list(store.tree.nodes(txn))[: len(nodes_before)] == nodes_before

        assert [(r.session, r.position, r.reason, r.by) for r in done] == [("chat", 2, "a leaked API key", "alice")]
        assert files_holding(path, [*secret_traces, old_node]) == {}
        assert log.messages("chat")[2] == {"role": "assistant", "content": REDACTED}
        assert log.messages("fork")[2] == {"role": "assistant", "content": REDACTED}
        assert log.messages("chat")[1] == user("hello!")
        report = log.verify(checkpoints=[note], keys=[key.verifier()])
        assert report.ok, report.problems
        assert [(r.session, r.position, r.by, r.seq) for r in report.redactions] == [("chat", 2, "alice", done[0].seq)]
        # Heads written down before no longer match; the signed checkpoint does.
        assert not log.verify(expect=[head]).ok
        history = log.history("chat")
        redacted = [o for o in history if o.redaction is not None]
        assert [(o.origin, o.tombstone is None) for o in redacted] == [("append", False), ("carry", True)]
        assert all(o.message["content"] == REDACTED and o.override is None for o in redacted)
        assert all(o.override is None for o in log.history("fork") if o.redaction is not None)
        with pytest.raises(AuditError, match="redacted"):
            log.prove("chat", 2, note)
        # The log goes on: writes, a newer checkpoint, proofs of the other messages in it.
        log.flush("chat", [*log.messages("chat"), user("later")])
        newer = log.checkpoint([key])
        assert verify_proof(log.prove("chat", 3, newer), [key.verifier()]).message == user("thanks")
        assert log.verify(checkpoints=[note, newer], keys=[key.verifier()]).ok
    for (session, position), proof in proofs.items():
        if (session, position) != ("chat", 2) and (session, position) != ("fork", 2):
            assert verify_proof(proof, [key.verifier()]).position == position
    assert edited[2] == secret_message()  # the caller's list is never touched
    with EventLog.open(path, readonly=True) as again:
        assert again.verify(checkpoints=[note], keys=[key.verifier()]).ok


def test_the_stand_alone_verifier_checks_old_proofs_after_a_redaction(tmp_path, key):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message(), assistant("bye")])
        note = log.checkpoint([key])
        proof = log.prove("chat", 2, note)
        log.redact("chat", 1, reason="leak")
    (tmp_path / "proof.json").write_text(json.dumps(proof))
    signing.write_keys(key, str(tmp_path / "key"))
    script = Path(__file__).resolve().parent.parent / "eventlog" / "verifier.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "proof.json"), "--key", str(tmp_path / "key.pub")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "message 2 of session 'chat'" in done.stdout


def test_a_redaction_from_a_fork_erases_the_shared_message_in_its_source(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message(), user("go on")])
        log.fork("chat", "fork", at=2)
        log.flush("fork", [*log.messages("fork"), user("forked")])
        log.rewind("chat", to=1)  # the source no longer holds it live
        log.redact("fork", 1, reason="leak")
        assert files_holding(path, [SECRET.encode()]) == {}
        assert log.messages("fork")[1]["content"] == REDACTED
        assert [o.message["content"] for o in log.history("chat")][1] == REDACTED
        report = log.verify()
        assert report.ok, report.problems
        assert [(r.session, r.body_seq) for r in report.redactions] == [("fork", 2)]


def test_a_tombstoned_occurrence_is_redacted_by_the_event_that_made_it_live(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message()])
        log.rewind("chat", to=1)
        occurrence = log.history("chat")[1]
        assert occurrence.tombstone is not None
        with pytest.raises(ValueError, match="1 live messages; no position 1"):
            log.redact("chat", 1, reason="leak")
        with pytest.raises(ValueError, match="made live by event 99"):
            log.redact("chat", 1, reason="leak", seq=99)
        log.redact("chat", occurrence.position, reason="leak", seq=occurrence.seq)
        assert files_holding(path, [SECRET.encode()]) == {}
        assert log.history("chat")[1].redaction is not None
        assert log.verify().ok


def test_every_stored_copy_of_the_content_is_erased_with_it(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message()])
        log.flush("sub", [secret_message()])  # the same message, stored on its own
        done = log.redact("chat", 1, reason="leak", by="ops")
        assert [(r.session, r.position) for r in done] == [("chat", 1), ("sub", 0)]
        assert files_holding(path, [SECRET.encode()]) == {}
        assert log.messages("sub") == [{"role": "assistant", "content": REDACTED}]
        report = log.verify()
        assert report.ok and len(report.redactions) == 2


def test_an_agent_holding_the_old_list_does_not_store_the_secret_again(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        held = [user("hi"), secret_message(), user("thanks")]
        overrides = {1: {"display": SECRET}}
        log.flush("chat", held, overrides=overrides)
        log.flush("chat", held, overrides=overrides)  # cached
        head = log.head("chat")
        log.redact("chat", 1, reason="leak")
        assert log.head("chat") != head
        again = log.flush("chat", held, overrides=overrides)
        assert (again.appended, again.tombstoned, again.unchanged) == (0, 0, 3)
        held.append(assistant("more"))
        grown = log.flush("chat", held, overrides=overrides)
        assert (grown.appended, grown.tombstoned, grown.unchanged) == (1, 0, 3)
        assert log.flush("chat", held, overrides=overrides).appended == 0
        assert log.messages("chat")[1]["content"] == REDACTED
        assert log.messages("chat")[3] == assistant("more")
    with EventLog.open(path) as log:  # a new process holding the old list: no cache to help it
        assert log.flush("chat", held, overrides=overrides).appended == 0
        assert log.verify().ok
    assert files_holding(path, [SECRET.encode()]) == {}


def test_a_real_edit_of_a_redacted_position_is_an_edit(tmp_path):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message(), user("thanks")])
        log.redact("chat", 1, reason="leak")
        result = log.flush("chat", [user("hi"), user("something else"), user("thanks")])
        assert (result.tombstoned, result.appended) == (2, 2)
        assert log.messages("chat")[1] == user("something else")
        assert log.verify().ok


def test_tool_calls_and_results_still_pair_after_redaction(tmp_path):
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "login", "arguments": json.dumps({"pw": SECRET})}}
        ],
    }
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("log in"), call, tool("call_1", f"token {SECRET}"), assistant("done")])
        log.redact("chat", 1, reason="password in arguments")
        log.redact("chat", 2, reason="token in result")
        messages = log.messages("chat")
        assert messages[1]["tool_calls"] == [
            {"id": "call_1", "type": "function", "function": {"name": "login", "arguments": "{}"}}
        ]
        assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": REDACTED}
        assert log.messages("chat", repair_tool_calls=True) == messages  # nothing to repair
        assert files_holding(tmp_path / "log", [SECRET.encode()]) == {}


def test_placeholders_keep_ids_and_drop_text():
    blocks = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "tu_1", "content": SECRET},
            {"type": "text", "text": SECRET},
        ],
    }
    assert placeholder(blocks) == {
        "role": "user",
        "content": [
            {"type": "text", "text": REDACTED},
            {"type": "tool_result", "tool_use_id": "tu_1", "content": REDACTED},
        ],
    }
    item = {"type": "function_call", "call_id": "c1", "name": "login", "arguments": SECRET}
    assert placeholder(item) == {
        "type": "function_call",
        "call_id": "c1",
        "name": "login",
        "content": REDACTED,
        "arguments": "{}",
    }
    assert placeholder(user("hi", name="Ada Lovelace")) == {"role": "user", "content": REDACTED}  # a person's name goes
    for message in (blocks, item, user("x"), secret_message()):
        assert placeholder(placeholder(message)) == placeholder(message)


def test_bad_requests_are_refused_and_write_nothing(tmp_path):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message()])
        last = log.last_seq
        with pytest.raises(UnknownSessionError, match="no session 'nope'"):
            log.redact("nope", 0, reason="x")
        with pytest.raises(ValueError, match="no position 5"):
            log.redact("chat", 5, reason="x")
        with pytest.raises(ValueError, match="reason"):
            log.redact("chat", 1, reason="  ")
        with pytest.raises(TypeError):
            log.redact("chat", True, reason="x")  # type: ignore[arg-type]
        assert log.last_seq == last
        log.redact("chat", 1, reason="leak")
        with pytest.raises(RedactedError, match="redacted already"):
            log.redact("chat", 1, reason="again")
        log.flush("chat", [*log.messages("chat"), {"role": "assistant", "content": REDACTED}])
        with pytest.raises(RedactedError, match="placeholder already"):
            log.redact("chat", 2, reason="nothing to erase")


def test_a_read_only_log_refuses_a_redaction(tmp_path):
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message()])
    with EventLog.open(tmp_path / "log", readonly=True) as log, pytest.raises(ReadOnlyError, match="read-only"):
        log.redact("chat", 1, reason="leak")


def test_a_redaction_is_refused_while_another_process_has_the_log_open(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message()])
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; from eventlog import EventLog\n"
                f"log = EventLog.open({str(path)!r}); log.messages('chat'); print('open', flush=True); sys.stdin.read()",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == "open\n"
            last = log.last_seq
            with pytest.raises(LogInUseError, match="another process has the log open"):
                log.redact("chat", 1, reason="leak")
            assert log.last_seq == last
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait()
            assert holder.stdout is not None
            holder.stdout.close()
        log.redact("chat", 1, reason="leak")
        assert files_holding(path, [SECRET.encode()]) == {}


def test_spill_files_are_scrubbed(tmp_path):
    spill = tmp_path / "spill"
    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message()])
        write_spill(
            spill,
            "later",
            SpillingWriter(log, spill)._lines(
                "later", [user("x"), secret_message()], {1: {"display": SECRET}}, False, None
            ),
        )
        log.redact("chat", 1, reason="leak", spill_dir=spill)
        assert files_holding(spill, [SECRET.encode()]) == {}
        lines = [json.loads(line) for line in next(spill.iterdir()).read_text().splitlines()]
        assert lines[2]["message"] == {"role": "assistant", "content": REDACTED}


def test_the_cli_redacts_and_verify_reports_it(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message()])
    done = run(path, "redact", "chat", "1", "--reason", "leaked key", "--by", "alice")
    assert done.exit_code == 0, done.output
    assert "redacted: message 1 of session 'chat'" in done.output and "by alice: leaked key" in done.output
    verified = run(path, "verify")
    assert verified.exit_code == 0, verified.output
    assert "1 redacted" in verified.output and "by alice: leaked key" in verified.output
    again = run(path, "redact", "chat", "1", "--reason", "again")
    assert again.exit_code == 1 and "redacted already" in again.output
    assert run(path, "redact", "chat", "0", "--reason", "").exit_code == 1
    redone = run(path, "redact", "chat", "0", "--reason", "the greeting too", "--json")
    assert json.loads(redone.output)["redactions"][0]["position"] == 0
    history = run(path, "history", "chat", "--json")
    assert [o["redacted"] is not None for o in json.loads(history.output)] == [True, True]
    assert files_holding(path, [SECRET.encode()]) == {}
    assert run(path, "vacuum").exit_code == 0


def test_the_cli_erases_the_content_from_the_default_projection(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message()])
    assert run(path, "project").exit_code == 0
    db = tmp_path / "log.sqlite"
    assert files_holding(tmp_path, [SECRET.encode()])
    done = run(path, "redact", "chat", "1", "--reason", "leak")
    assert done.exit_code == 0, done.output
    assert f"projection {db}: brought up to date" in done.output
    assert files_holding(tmp_path, [SECRET.encode()]) == {}


def test_an_attached_projection_is_erased_before_redact_returns(tmp_path):
    from projections import SQLiteProjection

    projection = SQLiteProjection(tmp_path / "t.sqlite")
    with EventLog.open(tmp_path / "log", projections=[projection]) as log:
        log.flush("chat", [user("hi"), secret_message(), user("thanks")])
        log.sync_projections()
        assert files_holding(tmp_path, [SECRET.encode()])
        log.redact("chat", 1, reason="leak")
        assert files_holding(tmp_path, [SECRET.encode()]) == {}
        log.flush("chat", [*log.messages("chat"), user("later")])
        assert log.sync_projections()
    projection.close()
    assert files_holding(tmp_path, [SECRET.encode()]) == {}


def test_the_async_log_redacts(tmp_path):
    import asyncio

    async def main() -> list[dict[str, object]]:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            await log.flush("chat", [user("hi"), secret_message()])
            await log.redact("chat", 1, reason="leak")
            return await log.messages("chat")

    assert asyncio.run(main())[1]["content"] == REDACTED
    assert files_holding(tmp_path / "log", [SECRET.encode()]) == {}


# -- a property: random sessions, random redactions ------------------------------------------

texts = st.sampled_from(["a", "b", "ok", SECRET, "x" * 50])
operations = st.lists(
    st.tuples(st.sampled_from(["append", "edit", "rewind", "fork", "annotate"]), st.integers(0, 6), texts),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations, picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 20)), min_size=1, max_size=3))
def test_random_redactions_never_break_a_proof_of_another_message(tmp_path_factory, ops, picks):
    key = signing.generate("example.com/agent-log")
    path = tmp_path_factory.mktemp("log")
    with EventLog.open(path, durability="none") as log:
        lists: dict[str, list[dict[str, object]]] = {"s0": [user("start")]}
        log.flush("s0", lists["s0"])
        for n, (op, at, text) in enumerate(ops):
            name = sorted(lists)[at % len(lists)]
            held = lists[name]
            if op == "append":
                held.append(assistant(f"{text} {n}") if n % 2 else user(text))
            elif op == "edit" and len(held) > 1:
                held[at % (len(held) - 1) + 1] = user(f"edited {text} {n}")
            elif op == "rewind":
                del held[max(1, at % len(held) + 1) :]
            elif op == "fork" and len(lists) < 4:
                lists[f"s{len(lists)}"] = list(held)
                log.fork(name, f"s{len(lists) - 1}")
                continue
            if op == "annotate":
                log.flush(name, held, overrides={len(held) - 1: {"display": text}})
            else:
                log.flush(name, held)
        note = log.checkpoint([key])
        proofs = {}
        for name in lists:
            for position in range(len(log.messages(name))):
                proofs[(name, position)] = (log.prove(name, position, note), log.history(name))
        redacted_bodies = set()
        for which, position in picks:
            name = sorted(lists)[which % len(lists)]
            live = log.messages(name)
            if not live:
                continue
            position %= len(live)
            if live[position]["content"] == REDACTED:
                continue
            for r in log.redact(name, position, reason="property"):
                redacted_bodies.add((r.body_seq, r.body_index))
        report = log.verify(checkpoints=[note], keys=[key.verifier()])
        assert report.ok, report.problems
        assert {(r.body_seq, r.body_index) for r in report.redactions} == redacted_bodies
        for name, held in lists.items():  # the agents still hold their lists: nothing is stored again
            again = log.flush(name, held)
            assert (again.appended, again.tombstoned) == (0, 0), name
    for proof, _ in proofs.values():
        if (proof["event"]["seq"], proof["message"]["index"]) in redacted_bodies:
            continue
        assert verify_proof(proof, [key.verifier()]).message == proof["message"]["content"]
    if redacted_bodies and all(
        proof["message"]["content"] == secret_message() or SECRET not in json.dumps(proof["message"]["content"])
        for proof, _ in proofs.values()
    ):
        # Every stored copy of a redacted content is gone: no redacted proof's text remains.
        for proof, _ in proofs.values():
            if (proof["event"]["seq"], proof["message"]["index"]) in redacted_bodies:
                digest = sha256(codec.encode(proof["message"]["content"])).digest()
                assert files_holding(path, [digest]) == {}


def test_vacuum_keeps_the_log_usable_in_this_process(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        mode = os.stat(path / "data.mdb").st_mode
        log.flush("chat", [user(str(i)) for i in range(200)])
        log.rewind("chat", to=1)
        sizes = log.vacuum()
        assert sizes["after"] <= sizes["before"]
        log.flush("chat", [user("0"), user("again")])
        assert log.messages("chat") == [user("0"), user("again")]
        assert log.verify().ok
    with EventLog.open(path) as log:
        assert len(log.messages("chat")) == 2
    assert os.stat(path / "data.mdb").st_mode == mode  # the copy has the file's permissions


def test_verify_catches_a_redaction_that_kept_the_content(tmp_path):
    """A forger who puts the content back under the seal (every digest, link and index
    derived again, as a redaction does) is caught: a sealed body must be a placeholder."""
    import msgspec

    from eventlog.redact import _rewrite, _Target

    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message(), user("thanks")])
        (done,) = log.redact("chat", 1, reason="leak")
        store = log._store
        original = codec.encode(secret_message())
        target = _Target(msgspec.Raw(original), sha256(original).digest())

        def forge(txn):
            store.tip.pending = _rewrite(store, txn, {(done.body_seq, done.body_index): target}, done.body_seq)

        store.write(forge)
        assert log.messages("chat")[1] == secret_message()  # the forgery reads back
        problems = [str(p) for p in log.verify().problems]
        assert problems == [f"event {done.body_seq}: message 1 is sealed as redacted but still holds content"]


def test_verify_checks_the_redactions_index(tmp_path):
    from eventlog.keys import redaction_key

    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message()])
        (done,) = log.redact("chat", 1, reason="leak")
        store = log._store
        store.write(lambda txn: txn.delete(redaction_key(done.body_seq, done.body_index), db=store.redactions))
        assert [str(p) for p in log.verify().problems] == [
            "index: the redactions index differs from the redaction events"
        ]
        assert log.history("chat")[1].redaction is None  # what the index is for


def test_a_seal_that_is_not_the_signed_commitment_is_caught_by_the_checkpoint(tmp_path, key):
    """Whoever controls the host can seal any message (erase it) and rebuild the tree, but
    not to the root a checkpoint signed before: the seal must be the message's commitment."""
    import msgspec

    from eventlog import events as ev
    from eventlog.keys import HEADER, SEQ
    from eventlog.redact import _rewrite

    with EventLog.open(tmp_path / "log") as log:
        log.flush("chat", [user("hi"), secret_message()])
        note = log.checkpoint([key])
        (done,) = log.redact("chat", 1, reason="leak")
        assert log.verify(checkpoints=[note], keys=[key.verifier()]).ok
        store = log._store

        def forge(txn):
            raw = bytes(txn.get(SEQ.pack(done.body_seq), db=store.events))
            event = ev.decoder.decode(raw[HEADER.size :])
            forged = msgspec.structs.replace(event, sealed={done.body_index: bytes(32)})
            txn.put(SEQ.pack(done.body_seq), raw[: HEADER.size] + ev.encoder.encode(forged), db=store.events)
            store.tip.pending = _rewrite(store, txn, {}, done.body_seq)  # every link resealed
            store.tree.rebuild(txn)

        store.write(forge)
        assert log.verify().ok  # intact in itself
        report = log.verify(checkpoints=[note], keys=[key.verifier()])
        assert [p.what for p in report.problems] == [
            "checkpoint: the log's first 2 events are not those the checkpoint signed "
            "(history rewritten, events deleted, reordered or backdated)"
        ]


def test_writers_in_other_threads_go_on_through_a_redaction(tmp_path):
    """Flushes from other threads while a redaction rewrites the log and swaps its file in:
    each lands once, in the file that stays, and the log verifies."""
    import threading

    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message(), user("thanks")])
        stop = threading.Event()
        written: dict[str, int] = {}
        errors: list[BaseException] = []

        def writer(name: str) -> None:
            held: list[dict[str, object]] = []
            try:
                while not stop.is_set() or len(held) < 20:
                    held.append(user(f"{name} {len(held)}"))
                    log.flush(name, held)
                    written[name] = len(held)
            except BaseException as e:  # reported below
                errors.append(e)

        holding = threading.Event()
        seen: list[object] = []

        def reader() -> None:  # a snapshot open across the redaction stays readable until it ends
            try:
                with log._store.read() as txn:
                    holding.set()
                    stop.wait(1.0)
                    seen.append(log._store.session(txn, "chat"))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(3)]
        threads.append(threading.Thread(target=reader))
        for thread in threads:
            thread.start()
        assert holding.wait(10)
        log.redact("chat", 1, reason="leak")
        stop.set()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(seen) == 1 and seen[0] is not None
        for name, count in written.items():
            assert log.messages(name) == [user(f"{name} {i}") for i in range(count)]
        assert log.verify().ok
    with EventLog.open(path) as log:
        assert {name: len(log.messages(name)) for name in written} == written
    assert files_holding(path, [SECRET.encode()]) == {}


def test_verify_checkpoint_on_the_command_line_after_a_redaction(tmp_path):
    path, keyfile = tmp_path / "log", tmp_path / "keys" / "k"
    keyfile.parent.mkdir()
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), secret_message(), user("thanks")])
    assert run(path, "keygen", "--out", str(keyfile), "--name", "example.com/log").exit_code == 0
    assert run(path, "checkpoint", "--key", str(keyfile), "--out", str(tmp_path / "cp.txt")).exit_code == 0
    head = run(path, "head").output.strip()
    assert run(path, "redact", "chat", "1", "--reason", "leak").exit_code == 0
    checked = run(path, "verify", "--checkpoint", str(tmp_path / "cp.txt"), "--key", f"{keyfile}.pub")
    assert checked.exit_code == 0, checked.output
    assert "1 redacted" in checked.output
    stale = run(path, "verify", "--expect", head)
    assert stale.exit_code == 1 and "does not have the hash written down for it" in stale.output
