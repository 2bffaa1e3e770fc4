"""The read contract frameworks code against: unknown sessions read as empty, the last N
messages, what the log knows about a session, and an atomic compare-and-set over several."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from factories import assistant, user

import eventlog
from eventlog import EMPTY_HEAD, ConflictError, EventLog, SessionInfo
from eventlog.store import Store


def test_unknown_session_reads_as_empty(log):
    assert log.messages("nope") == []
    assert log.messages("nope", last=3) == []
    assert log.messages("nope", repair_tool_calls=True) == []
    assert log.history("nope") == []
    assert log.head("nope") is None
    assert log.session("nope") is None
    log.flush("s", [user("q")])
    assert log.messages("nope", as_of=log.last_seq) == []
    assert "nope" not in log.sessions()  # reading wrote nothing


def test_resume_is_one_call(tmp_path: Path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        messages = log.messages("chat")  # the first start: nothing stored yet
        messages += [user("hi"), assistant("hello")]
        log.flush("chat", messages)
    with EventLog.open(path) as log:  # a restart resumes with the same one call
        messages = log.messages("chat")
        assert messages == [user("hi"), assistant("hello")]
        messages.append(user("again"))
        assert log.flush("chat", messages).appended == 1


@pytest.mark.parametrize("shape", ["appended", "rewound", "forked", "compacted"])
def test_messages_last_n(log, shape):
    whole = [user(f"m{i}") for i in range(40)]
    log.flush("s", whole)
    if shape == "rewound":
        log.rewind("s", to=30)
        whole = whole[:30]
    elif shape == "forked":
        log.fork("s", "t", at=25)
        log.flush("t", [*whole[:25], user("t0"), user("t1")])
        whole = [*whole[:25], user("t0"), user("t1")]
    elif shape == "compacted":
        log.compact("s", start=0, end=10, summary=[user("summary")])
        whole = [user("summary"), *whole[10:]]
    sid = "t" if shape == "forked" else "s"
    assert log.messages(sid) == whole
    for n in (0, 1, 3, len(whole) - 1, len(whole), len(whole) + 10):
        assert log.messages(sid, last=n) == (whole[-n:] if n else []), n
    # with as_of: the last N of the transcript as it was then
    seq = log.last_seq
    log.flush(sid, [*whole, user("later")])
    assert log.messages(sid, last=2, as_of=seq) == whole[-2:]
    assert log.messages(sid, last=2) == [whole[-1], user("later")]


def test_messages_last_n_repairs_the_window(log):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    log.flush("s", [user("q"), assistant("", tool_calls=[call])])
    out = log.messages("s", last=1, repair_tool_calls=True)
    assert [m["role"] for m in out] == ["assistant", "tool"]


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_messages_last_rejects_bad_values(log, bad):
    log.flush("s", [user("q")])
    with pytest.raises((TypeError, ValueError), match="last"):
        log.messages("s", last=bad)


def _event_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the stored events the log reads (each read of an event's bytes)."""
    reads: list[int] = []
    original = Store.raw_event

    def counting(self: Store, txn, seq):
        reads.append(seq)
        return original(self, txn, seq)

    monkeypatch.setattr(Store, "raw_event", counting)
    return reads


def test_messages_last_reads_only_the_last_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``last=N`` reads as many events for a session of 2,000 turns as for one of 20."""
    with EventLog.open(tmp_path / "log", durability="none") as log:
        for sid, turns in (("small", 20), ("huge", 2000)):
            messages = []
            for i in range(turns):  # one event per turn, as an agent loop writes them
                messages.append(user(f"{sid} {i}"))
                log.flush(sid, messages)
        reads = _event_reads(monkeypatch)
        assert log.messages("small", last=5) == [user(f"small {i}") for i in range(15, 20)]
        small = len(reads)
        reads.clear()
        assert log.messages("huge", last=5) == [user(f"huge {i}") for i in range(1995, 2000)]
        huge = len(reads)
        reads.clear()
        log.messages("huge")
        whole = len(reads)
    assert 0 < small <= 15 and huge == small, (small, huge)
    assert whole >= 2000  # the whole transcript does read every event: the count above is meaningful


def test_session_info(log):
    before = time.time_ns()
    log.flush("s", [user("q"), assistant("a")])
    log.update_session("s", title="Greeting", model="m1", input_tokens=10, cost_usd=0.25)
    log.update_session("s", title="Hello", input_tokens=5, cost_usd=0.5, tags=["x"])
    info = log.session("s")
    assert isinstance(info, SessionInfo)
    assert info.id == "s"
    assert info.length == 2 and info.head == log.head("s")
    assert info.metadata == {"title": "Hello", "model": "m1", "tags": ["x"]}
    assert info.counters == {"input_tokens": 15, "cost_usd": 0.75}
    assert before <= info.created_ns <= info.updated_ns <= time.time_ns()
    assert info.created_seq == 1 and info.updated_seq == log.last_seq
    assert not info.closed and info.close_reason is None
    assert info.forked_from is None and info.fork_position is None

    log.close_session("s", reason="user_exit")
    closed = log.session("s")
    assert closed.closed and closed.close_reason == "user_exit"
    assert closed.updated_seq == log.last_seq and closed.created_ns == info.created_ns

    log.fork("s", "t", at=1)
    forked = log.session("t")
    assert (forked.forked_from, forked.fork_position, forked.length) == ("s", 1, 1)
    assert forked.metadata == {} and forked.counters == {}
    assert log.session("s").length == 2  # the source is untouched

    log.flush("s", [user("q"), assistant("a"), user("more")])  # writing again reopens it
    reopened = log.session("s")
    assert not reopened.closed and reopened.close_reason is None and reopened.length == 3

    log.rewind("s", to=0)
    empty = log.session("s")
    assert empty.length == 0 and empty.head is None


def test_session_info_metadata_only_session(log):
    log.update_session("meta", title="only metadata")
    info = log.session("meta")
    assert info is not None and info.length == 0 and info.head is None
    assert info.metadata == {"title": "only metadata"}


def test_session_info_is_exported():
    assert "SessionInfo" in eventlog.__all__
    assert eventlog.__all__ == sorted(eventlog.__all__, key=lambda name: (not name.isupper(), name))


def test_flush_many_expected_heads_compare_and_set(log):
    log.flush("a", [user("a0")])
    log.flush("b", [user("b0")])
    head_a, head_b = log.head("a"), log.head("b")
    seq = log.last_seq
    results = log.flush_many(
        {"a": [user("a0"), user("a1")], "b": [user("b0"), user("b1")], "new": [user("n0")]},
        expected_heads={"a": head_a, "b": head_b, "new": EMPTY_HEAD},
    )
    assert {sid: r.appended for sid, r in results.items()} == {"a": 1, "b": 1, "new": 1}

    # b moved on meanwhile: nothing of the write lands, and the error names b
    log.flush("b", [user("b0"), user("b1"), user("b2")])
    seq = log.last_seq
    with pytest.raises(ConflictError, match="'b'") as caught:
        log.flush_many(
            {"a": [user("a0"), user("a1"), user("a2")], "b": [user("b0"), user("b1"), user("mine")]},
            expected_heads={"a": results["a"].head, "b": results["b"].head},
        )
    assert "'a'" not in str(caught.value)
    assert log.last_seq == seq
    assert log.messages("a") == [user("a0"), user("a1")]
    assert log.messages("b") == [user("b0"), user("b1"), user("b2")]

    with pytest.raises(ConflictError, match="'fresh'"):  # EMPTY_HEAD: the session must not exist yet
        log.flush_many({"fresh2": [user("x")], "fresh": [user("y")]}, expected_heads={"fresh": log.head("a")})
    assert "fresh2" not in log.sessions() and log.last_seq == seq

    # a session without an expected head is written as flush writes it
    log.flush_many({"a": [user("a0"), user("a1"), user("a2")]}, expected_heads={})
    assert len(log.messages("a")) == 3


def test_flush_many_expected_heads_rejects_bad_arguments(log):
    with pytest.raises(ValueError, match=r"expected_heads\['x'\]"):
        log.flush_many({"x": [user("q")]}, expected_heads={"x": "zz"})
    with pytest.raises(ValueError, match=r"expected_heads.*'other'.*not in transcripts"):
        log.flush_many({"x": [user("q")]}, expected_heads={"other": EMPTY_HEAD})
    with pytest.raises(TypeError, match="expected_heads"):
        log.flush_many({"x": [user("q")]}, expected_heads=[("x", EMPTY_HEAD)])
    assert log.sessions() == []


def test_flush_many_ten_thousand_sessions(tmp_path: Path):
    with EventLog.open(tmp_path / "log", durability="none") as log:
        transcripts = {f"s{i:05d}": [user(f"q{i}")] for i in range(10_000)}
        results = log.flush_many(transcripts)
        assert len(results) == 10_000 and all(r.appended == 1 for r in results.values())
        assert len(log.sessions()) == 10_000
        assert log.messages("s09999") == [user("q9999")]
        again = log.flush_many(transcripts)  # nothing new: still no recursion
        assert all(r.appended == 0 for r in again.values())
