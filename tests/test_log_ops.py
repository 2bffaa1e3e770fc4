"""append, rewind, compact, fork, session metadata, replay and history."""

from __future__ import annotations

import pytest
from factories import assistant, tool, user

from eventlog import EMPTY_HEAD, ConflictError, HistoryMismatchError, InvalidMessageError, UnknownSessionError, events
from eventlog.replay import NO_RESULT, repair


def test_append_recognises_a_retry(log):
    first = log.append("s", [user("q1")], expected_head=EMPTY_HEAD)
    batch = [assistant("a1"), user("q2")]
    second = log.append("s", batch, expected_head=first.head)
    seq = log.last_seq
    retry = log.append("s", batch, expected_head=first.head)  # the ack was lost; the caller retries
    assert retry.appended == 0 and retry.head == second.head
    assert log.last_seq == seq
    with pytest.raises(ConflictError):
        log.append("s", [user("other")], expected_head=first.head)
    with pytest.raises(ConflictError):
        log.append("s", batch[:1], expected_head=EMPTY_HEAD)


def test_append_without_expected_head_always_appends(log):
    log.append("s", [user("x")])
    log.append("s", [user("x")])
    assert len(log.messages("s")) == 2


def test_append_many_lands_in_one_transaction_or_not_at_all(log):
    first = log.append("chat", [user("q1")])
    commits = log.info()["commits"]
    out = log.append_many(
        {"chat": [assistant("a1")], "records": [{"refers": 1}]},
        expected_heads={"chat": first.head, "records": EMPTY_HEAD},
    )
    assert log.info()["commits"] == commits + 1
    assert log.messages("chat") == [user("q1"), assistant("a1")] and log.messages("records") == [{"refers": 1}]
    assert out["chat"].head == log.head("chat") and out["records"].head == log.head("records")
    seq = log.last_seq
    # One stale head: nothing is written for either session.
    with pytest.raises(ConflictError, match="'records'"):
        log.append_many({"chat": [user("q2")], "records": [{"refers": 2}]}, expected_heads={"records": EMPTY_HEAD})
    assert log.last_seq == seq and len(log.messages("chat")) == 2
    # A retry whose messages already follow the expected heads writes nothing.
    again = log.append_many({"chat": [assistant("a1")]}, expected_heads={"chat": first.head})
    assert again["chat"].appended == 0 and log.last_seq == seq
    with pytest.raises(InvalidMessageError, match="session 'records'"):
        log.append_many({"chat": [user("q3")], "records": [{"bad": b"bytes"}]})
    assert log.last_seq == seq
    with pytest.raises(ValueError, match="not in transcripts"):
        log.append_many({"chat": [user("q3")]}, expected_heads={"other": EMPTY_HEAD})


def test_message_reads_one_live_position(log):
    log.flush("s", [user("q1"), assistant("a1"), user("q2")])
    assert [log.message("s", i) for i in range(4)] == [user("q1"), assistant("a1"), user("q2"), None]
    log.rewind("s", to=1)
    assert log.message("s", 1) is None and log.message("s", 0) == user("q1")
    assert log.message("unknown", 0) is None
    with pytest.raises(ValueError):
        log.message("s", -1)


def test_rewind(log):
    log.flush("s", [user("q1"), assistant("a1"), user("q2")])
    result = log.rewind("s", to=1)
    assert (result.tombstoned, result.unchanged) == (2, 1)
    assert log.messages("s") == [user("q1")]
    assert log.rewind("s", to=1).tombstoned == 0
    with pytest.raises(ValueError, match="has 1 messages"):
        log.rewind("s", to=5)
    with pytest.raises(UnknownSessionError):
        log.rewind("nope", to=0)


def test_compact_carries_tail_and_late_messages(log):
    messages = [user(f"m{i}") for i in range(6)]
    log.flush("s", messages)
    seen = log.head("s")
    # While the caller summarises m1..m3, another exit path appends two messages.
    log.flush("s", messages + [assistant("late 1"), assistant("late 2")])
    result = log.compact("s", start=1, end=4, summary=[user("summary of m1-m3")], expected_head=seen)
    assert result.tombstoned == 7 and result.unchanged == 1
    contents = [m["content"] for m in log.messages("s")]
    assert contents == ["m0", "summary of m1-m3", "m4", "m5", "late 1", "late 2"]
    last = [r.event for r in log.events() if isinstance(r.event, events.MessagesAppended)][-1]
    assert sorted(last.carried) == [1, 2, 3, 4] and last.summaries == 1
    hist = log.history("s")
    carried = [o for o in hist if o.origin == "carry"]
    originals = {o.digest for o in hist if o.origin == "append" and o.tombstone and o.tombstone.reason == "compaction"}
    assert {o.digest for o in carried} <= originals  # linked to the originals by content digest
    assert log.verify().ok


def test_compact_conflicts_when_seen_head_is_gone(log):
    log.flush("s", [user("a"), user("b"), user("c")])
    seen = log.head("s")
    log.rewind("s", to=1)
    with pytest.raises(ConflictError, match="not in the live transcript"):
        log.compact("s", start=0, end=2, summary=[user("sum")], expected_head=seen)
    with pytest.raises(ValueError, match="start <= end"):
        log.compact("s", start=0, end=3, summary=[user("sum")])


def test_a_stale_head_on_an_empty_transcript_is_a_conflict(log):
    """A session rewound to nothing, or holding only metadata, has no node but the empty head."""
    stale = log.flush("s", [user("a")]).head
    log.rewind("s", to=0)
    log.update_session("meta", title="no messages yet")
    for session in ("s", "meta"):
        with pytest.raises(ConflictError):
            log.append(session, [user("retry")], expected_head=stale)
        with pytest.raises(ConflictError, match="not in the live transcript"):
            log.compact(session, start=0, end=0, summary=[user("sum")], expected_head=stale)
    assert log.messages("s") == [] and log.messages("meta") == []


def test_fork_shares_prefix_then_diverges(log):
    log.flush("main", [user("q1"), assistant("a1"), user("q2"), assistant("a2")])
    result = log.fork("main", "branch", at=2)
    main_hist = log.history("main")
    assert result.head == main_hist[1].node
    log.flush("branch", log.messages("branch") + [user("q2 on branch")])
    log.flush("main", log.messages("main") + [user("q3")])
    assert [m["content"] for m in log.messages("branch")] == ["q1", "a1", "q2 on branch"]
    assert [m["content"] for m in log.messages("main")] == ["q1", "a1", "q2", "a2", "q3"]
    branch_hist = log.history("branch")
    assert [o.origin for o in branch_hist] == ["fork", "fork", "append"]
    assert branch_hist[0].node == main_hist[0].node
    with pytest.raises(ConflictError, match="already exists"):
        log.fork("main", "branch")
    with pytest.raises(ValueError):
        log.fork("main", "b2", at=99)
    assert log.verify().ok


def test_fork_default_is_whole_transcript(log):
    log.flush("a", [user("x"), user("y")])
    log.fork("a", "b")
    assert log.messages("b") == log.messages("a")
    assert log.head("b") == log.head("a")


def test_history_has_every_occurrence_with_tombstones(log):
    messages = [user("q1"), assistant("a1"), user("q2")]
    log.flush("s", messages)
    messages[1] = assistant("a1 v2")
    log.flush("s", messages)
    log.rewind("s", to=2)
    hist = log.history("s")
    summary = [(o.position, o.message["content"], o.origin, o.tombstone and o.tombstone.reason) for o in hist]
    assert summary == [
        (0, "q1", "append", None),
        (1, "a1", "append", "edit"),
        (2, "q2", "append", "edit"),
        (1, "a1 v2", "append", None),
        (2, "q2", "carry", "rewind"),
    ]
    assert [o.seq for o in hist] == sorted(o.seq for o in hist)


def test_messages_as_of(log):
    log.flush("s", [user("q1")])
    seq1 = log.last_seq
    log.flush("s", [user("q1"), assistant("a1")])
    log.rewind("s", to=0)
    assert log.messages("s") == []
    assert log.messages("s", as_of=seq1) == [user("q1")]
    assert log.messages("s", as_of=log.last_seq - 1) == [user("q1"), assistant("a1")]


def test_repair_on_resume_does_not_change_the_log(log):
    messages = [
        user("run it"),
        assistant("", tool_calls=[{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]),
        tool("zz", "orphan result"),
        user("are you there?"),
    ]
    log.flush("s", messages)
    repaired = log.messages("s", repair_tool_calls=True)
    assert [m["role"] for m in repaired] == ["user", "assistant", "tool", "user"]
    assert repaired[2]["tool_call_id"] == "c1"
    assert log.messages("s") == messages


def test_update_and_close_session_are_events(log):
    log.flush("s", [user("q")])
    log.update_session("s", title="Greeting", input_tokens=10, cost_usd=0.5)
    log.update_session("s", input_tokens=5)
    log.close_session("s", reason="user_exit")
    kinds = [type(r.event).__name__ for r in log.events()]
    assert kinds[-3:] == ["SessionUpdated", "SessionUpdated", "SessionClosed"]
    updated = [r.event for r in log.events() if isinstance(r.event, events.SessionUpdated)]
    assert updated[0].fields == {"title": "Greeting"} and updated[0].counters == {"input_tokens": 10, "cost_usd": 0.5}
    with pytest.raises(TypeError, match="counter must be a number"):
        log.update_session("s", input_tokens="many")
    with pytest.raises(UnknownSessionError):
        log.close_session("nope")


def test_events_are_gapless_and_chained(log):
    for i in range(5):
        log.flush(f"s{i % 2}", [user(f"m{j}") for j in range(i + 1)])
    records = list(log.events())
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    for prev, cur in zip(records, records[1:]):
        assert cur.prev_hash == prev.hash
    assert [r.seq for r in log.events(after=3)] == list(range(4, len(records) + 1))


def test_unknown_session_reads(log):
    assert log.messages("x") == [] and log.history("x") == [] and log.session("x") is None
    assert log.head("x") is None
    assert "x" not in log


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork()")
def test_a_log_used_in_a_forked_child_refuses_with_a_clear_error(log):
    """LMDB's environment belongs to the process that opened it: a child made by fork() must
    open the log again, and is told so instead of corrupting the parent's locks."""
    import os

    log.flush("s", [user("q")])
    pid = os.fork()
    if pid == 0:  # the child: report through the exit code only
        code = 3
        try:
            log.flush("s", [user("q"), assistant("from the child")])
            code = 1
        except Exception as e:
            code = 0 if "before a fork()" in str(e) else 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert log.messages("s") == [user("q")]
    assert log.flush("s", [user("q"), assistant("a")]).appended == 1  # the parent goes on


def test_flush_many_writes_every_session_in_one_transaction(log):
    parent = [user("plan the trip"), assistant("delegating")]
    child = [user("find trains"), assistant("the 9:05")]
    results = log.flush_many({"parent": parent, "child": child})
    assert {s: r.appended for s, r in results.items()} == {"parent": 2, "child": 2}
    seq = log.last_seq
    assert results["parent"].head == log.head("parent") and log.messages("child") == child
    again = log.flush_many({"parent": parent, "child": child, "new": []})  # nothing new: no write
    assert log.last_seq == seq and {r.appended for r in again.values()} == {0} and again["new"].head is None
    child.append(user("and back?"))
    assert log.flush_many({"parent": parent, "child": child})["child"].appended == 1
    assert log.flush("child", child).appended == 0  # the cache holds what flush_many stored


def test_flush_many_writes_nothing_when_one_session_refuses(log):
    log.flush("b", [user("something else")])
    seq = log.last_seq
    with pytest.raises(HistoryMismatchError) as refused:
        log.flush_many({"a": [user("x")], "b": [user("y")]})
    assert refused.value.session == "b"
    assert log.last_seq == seq and "a" not in log.sessions()  # the session before it was not written
    with pytest.raises(InvalidMessageError, match=r"session 'a': messages\[1\]"):
        log.flush_many(
            {"b": [user("something else"), user("more")], "a": [user("x"), {"role": "user", "n": float("nan")}]}
        )
    assert log.last_seq == seq
    results = log.flush_many({"a": [user("x")], "b": [user("y")]}, replace=True)
    assert (results["b"].tombstoned, log.messages("b")) == (1, [user("y")])


def test_flush_many_keeps_the_flush_contract_turn_after_turn(log):
    parent, child = [user("plan")], [user("find trains")]
    for turn in range(3):
        parent.append(assistant(f"parent {turn}"))
        child.append(assistant(f"child {turn}"))
        results = log.flush_many({"parent": parent, "child": child})
        assert results["parent"].appended == (2 if turn == 0 else 1) and results["child"].appended == (
            2 if turn == 0 else 1
        )
    child[1]["content"] = "edited in place"  # an edit of a stored message is recorded, never lost
    results = log.flush_many({"parent": parent, "child": child})
    assert (results["child"].tombstoned, results["child"].appended, results["parent"].appended) == (3, 3, 0)
    assert (
        log.messages("child") == child
        and [o.tombstone.reason for o in log.history("child") if o.tombstone] == ["edit"] * 3
    )
    parent.append(user("and hotels?"))
    assert log.flush("parent", parent).appended == 1  # flush and flush_many share what they cached
    assert log.flush_many({"parent": parent})["parent"].appended == 0


def _use(use_id):
    return {"type": "tool_use", "id": use_id, "name": "search", "input": {"q": "lmdb"}}


def _result(use_id, text="found"):
    return {"type": "tool_result", "tool_use_id": use_id, "content": text}


def test_repair_answers_anthropic_tool_use_and_drops_orphan_results(log):
    messages = [
        {"role": "user", "content": "look up two things"},
        {"role": "assistant", "content": [{"type": "text", "text": "searching"}, _use("t1"), _use("t2")]},
        {"role": "user", "content": [_result("t2"), _result("zz", "orphan"), {"type": "text", "text": "go on"}]},
        {"role": "assistant", "content": [_use("t3")]},  # the loop stopped inside this tool
    ]
    log.flush("a", messages)
    repaired = log.messages("a", repair_tool_calls=True)
    assert repaired[:2] == messages[:2]
    assert repaired[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": NO_RESULT, "is_error": True},
        _result("t2"),
        {"type": "text", "text": "go on"},
    ]
    assert repaired[3] == messages[3]
    assert repaired[4] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t3", "content": NO_RESULT, "is_error": True}],
    }
    assert log.messages("a") == messages  # the log and the stored dicts are as they were
    orphan_only = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [_result("x")]},
    ]
    assert repair(orphan_only) == orphan_only[:2]


def test_repair_answers_responses_function_calls_and_drops_stray_outputs():
    call = lambda call_id: {"type": "function_call", "call_id": call_id, "name": "search", "arguments": "{}"}  # noqa: E731
    output = lambda call_id: {"type": "function_call_output", "call_id": call_id, "output": "found"}  # noqa: E731
    items = [
        {"role": "user", "content": "look up two things"},
        call("c1"),
        call("c2"),
        output("c2"),
        output("c2"),  # a second output for one call
        output("zz"),  # answers no call
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "one done"}]},
        {"type": "custom_tool_call", "call_id": "c3", "name": "shell", "input": "ls"},
    ]
    repaired = repair(items)
    assert repaired == [
        items[0],
        call("c1"),
        call("c2"),
        output("c2"),
        {"type": "function_call_output", "call_id": "c1", "output": NO_RESULT},
        items[6],
        items[7],
        {"type": "custom_tool_call_output", "call_id": "c3", "output": NO_RESULT},
    ]
    complete = items[:4] + [output("c1")]
    assert repair(complete) == complete


def test_repair_leaves_a_complete_transcript_of_each_shape_as_it_is():
    chat = [
        user("q"),
        assistant("", tool_calls=[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]),
        tool("c", "r"),
        assistant("done"),
    ]
    anthropic = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [_use("t")]},
        {"role": "user", "content": [_result("t")]},
        {"role": "assistant", "content": "done"},
    ]
    for messages in (chat, anthropic, [user("just"), assistant("talk")]):
        assert repair(messages) == messages


def test_repair_takes_any_json_value_where_an_id_or_type_stands():
    odd = [
        {"role": "user", "content": "x", "type": ["odd"]},
        {"type": "function_call_output", "call_id": ["x"], "output": "answers no call"},
        {"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": ["z"]}]},
    ]
    assert repair(odd) == [odd[0], odd[2], odd[3]]
