"""The flush contract (SPEC section 3)."""

from __future__ import annotations

import copy
import gc

import pytest
from factories import assistant, user

from eventlog import (
    EMPTY_HEAD,
    ConflictError,
    EventLog,
    HistoryMismatchError,
    InvalidMessageError,
    events,
    snapshot,
)


def appended_events(log: EventLog) -> list[events.MessagesAppended]:
    return [r.event for r in log.events() if isinstance(r.event, events.MessagesAppended)]


def stored_bodies(log: EventLog) -> int:
    return sum(len(e) - len(e.carried) for e in appended_events(log))


def test_same_list_flushed_many_times_writes_each_message_once(log):
    messages = [user("hi"), assistant("hello")]
    first = log.flush("s", messages)
    seq = log.last_seq
    commits = log.info()["commits"]
    for _ in range(5):
        again = log.flush("s", messages)
        assert (again.appended, again.tombstoned, again.unchanged) == (0, 0, 2)
        assert again.head == first.head
    assert log.last_seq == seq
    assert log.info()["commits"] == commits  # no write transaction, nothing synced
    assert stored_bodies(log) == 2


def test_growing_list_appends_only_new_messages(log):
    messages = [user("q1")]
    log.flush("s", messages)
    messages += [assistant("a1"), user("q2")]
    result = log.flush("s", messages)
    assert (result.appended, result.unchanged) == (2, 1)
    assert log.messages("s") == messages
    assert stored_bodies(log) == 3


def test_fresh_copies_are_recognised(log):
    messages = [user("hi"), assistant("hello", tool_calls=[{"id": "c1", "type": "function"}])]
    log.flush("s", messages)
    result = log.flush("s", copy.deepcopy(messages))
    assert result.appended == 0 and result.unchanged == 2


def test_key_order_does_not_matter(log):
    log.flush("s", [{"role": "user", "content": "x"}])
    result = log.flush("s", [{"content": "x", "role": "user"}])
    assert result.appended == 0


def test_identical_content_at_two_positions_is_two_messages(log):
    ok = assistant("ok")
    result = log.flush("s", [user("a"), ok, user("b"), dict(ok)])
    assert result.appended == 4
    assert [m["content"] for m in log.messages("s")] == ["a", "ok", "b", "ok"]


def test_same_object_twice_in_the_list_is_two_messages(log):
    ok = assistant("ok")
    log.flush("s", [ok, ok])
    assert len(log.messages("s")) == 2


def test_underscore_keys_are_neither_stored_nor_counted(log):
    log.flush("s", [user("hi", _row_id=7, _marker=True)])
    assert log.messages("s") == [user("hi")]
    result = log.flush("s", [user("hi", _marker=False)])
    assert result.appended == 0


def test_callers_dicts_are_never_mutated(log):
    messages = [user("hi", _x=1), assistant("a", _compressed_summary=False)]
    before = copy.deepcopy(messages)
    log.flush("s", messages, overrides={0: {"content": "clean"}})
    log.flush("s", messages)
    assert messages == before


def test_recycled_ids_never_hide_a_new_message(log):
    """The id()-reuse bug: a freed dict's address given to a new message must not matter."""
    messages = [user("q1"), assistant("draft")]
    log.flush("s", messages)
    seen = {id(messages[1])}
    messages.pop()
    gc.collect()
    for i in range(200):  # allocate until CPython hands out the same address again (or not)
        candidate = assistant(f"real answer {i}")
        if id(candidate) in seen or i == 199:
            messages.append(candidate)
            break
    result = log.flush("s", messages)
    assert result.appended == 1
    assert log.messages("s")[-1]["content"] == messages[-1]["content"]


def test_scaffolding_is_never_stored_and_its_removal_tombstones_nothing(log):
    messages = [user("q"), assistant("", _empty_recovery_synthetic=True), user("nudge", _thinking_prefill=True)]
    result = log.flush("s", messages)
    assert result.appended == 1
    del messages[1:]
    messages.append(assistant("real"))
    result = log.flush("s", messages)
    assert (result.appended, result.tombstoned) == (1, 0)
    assert log.messages("s") == [user("q"), assistant("real")]


def test_scaffolding_rule_is_replaceable(tmp_path):
    with EventLog.open(tmp_path / "l", ephemeral=lambda m: m.get("role") == "debug") as log:
        log.flush("s", [user("q"), {"role": "debug", "content": "x"}, assistant("a", _thinking_prefill=True)])
        assert [m["role"] for m in log.messages("s")] == ["user", "assistant"]


def test_in_place_edit_is_recorded_as_edit(edit_check, log):
    messages = [user("q1"), assistant("a1"), user("q2")]
    log.flush("s", messages)
    messages[1]["content"] = "a1 (edited)"
    result = log.flush("s", messages)
    assert (result.appended, result.tombstoned, result.unchanged) == (2, 2, 1)
    assert log.messages("s")[1]["content"] == "a1 (edited)"
    stones = [r.event for r in log.events() if isinstance(r.event, events.MessagesTombstoned)]
    assert [(s.position, s.count, s.reason) for s in stones] == [(1, 2, "edit")]


def test_in_place_edit_is_detected_in_trust_mode_only_when_object_changes(tmp_path):
    with EventLog.open(tmp_path / "l", trust_identity=True) as log:
        messages = [user("q1"), assistant("a1")]
        log.flush("s", messages)
        messages[1]["content"] = "changed in place"
        assert log.flush("s", messages).appended == 0  # trusted: the caller promised not to do this
        messages[1] = assistant("a new object")
        assert log.flush("s", messages).appended == 1


def test_shorter_list_is_a_rewind(log):
    messages = [user("q1"), assistant("a1"), user("q2"), assistant("a2")]
    log.flush("s", messages)
    result = log.flush("s", messages[:2] + [user("q2 again")])
    assert (result.appended, result.tombstoned, result.unchanged) == (1, 2, 2)
    stone = next(r.event for r in log.events() if isinstance(r.event, events.MessagesTombstoned))
    assert stone.reason == "rewind"


def test_truncation_alone_is_a_rewind(log):
    messages = [user("q1"), assistant("a1"), user("q2")]
    log.flush("s", messages)
    result = log.flush("s", messages[:1])
    assert (result.appended, result.tombstoned) == (0, 2)
    assert log.messages("s") == messages[:1]


def test_summary_first_is_a_compaction_even_without_common_prefix(log):
    log.flush("s", [user("q1"), assistant("a1"), user("q2")])
    compacted = [user("summary of q1/a1", _compressed_summary=True), user("q2")]
    result = log.flush("s", compacted)
    assert (result.appended, result.tombstoned) == (2, 3)
    stone = next(r.event for r in log.events() if isinstance(r.event, events.MessagesTombstoned))
    assert stone.reason == "compaction"
    appended = appended_events(log)[-1]
    assert appended.summaries == 1
    assert appended.carried == {1: (2, 2)}  # q2's body is referenced, not stored again


def test_no_common_prefix_is_refused(log):
    log.flush("s", [user("q1"), assistant("a1")])
    seq = log.last_seq
    with pytest.raises(HistoryMismatchError, match="shares no prefix"):
        log.flush("s", [user("something else")])
    with pytest.raises(HistoryMismatchError, match="is empty"):
        log.flush("s", [])
    assert log.last_seq == seq


def test_replace_clears(log):
    log.flush("s", [user("q1"), assistant("a1")])
    result = log.flush("s", [user("fresh start")], replace=True)
    assert (result.appended, result.tombstoned) == (1, 2)
    assert log.messages("s") == [user("fresh start")]
    stone = next(r.event for r in log.events() if isinstance(r.event, events.MessagesTombstoned))
    assert stone.reason == "clear"
    log.flush("s", [], replace=True)
    assert log.messages("s") == [] and log.head("s") is None


def test_carried_bodies_are_not_stored_again(log):
    """An edit near the start of a long session must not double the log's size."""
    messages = [user(f"message {i} " + "x" * 500) for i in range(200)]
    log.flush("s", messages)
    size_before = sum(len(bytes(b)) for e in appended_events(log) for b in e.bodies)
    messages[1] = user("edited")
    result = log.flush("s", messages)
    assert (result.appended, result.tombstoned) == (199, 199)
    last = appended_events(log)[-1]
    assert len(last.carried) == 198
    size_after = sum(len(bytes(b)) for e in appended_events(log) for b in e.bodies)
    assert size_after - size_before < 2000
    assert log.messages("s") == messages
    assert log.verify().ok


def test_expected_head(log):
    messages = [user("q1")]
    first = log.flush("s", messages, expected_head=EMPTY_HEAD)
    messages.append(assistant("a1"))
    with pytest.raises(ConflictError, match="not the expected"):
        log.flush("s", messages, expected_head=EMPTY_HEAD)
    second = log.flush("s", messages, expected_head=first.head)
    # Already stored: succeeds whatever expected_head says.
    assert log.flush("s", messages, expected_head=EMPTY_HEAD).head == second.head
    assert log.flush("s", messages, expected_head=first.head).appended == 0


def test_expected_head_must_be_hex(log):
    with pytest.raises(ValueError, match="64 hex"):
        log.flush("s", [user("x")], expected_head="abc")


def test_failed_flush_leaves_nothing(log):
    log.flush("s", [user("q1")])
    seq = log.last_seq
    messages = [user("q1")] + [user(f"m{i}") for i in range(600)]
    messages[500] = user("bad", payload=b"\x00")
    with pytest.raises(InvalidMessageError, match=r'messages\[500\]\["payload"\]: bytes'):
        log.flush("s", messages)
    assert log.last_seq == seq
    assert log.messages("s") == [user("q1")]
    # the cache did not keep the failed snapshot
    messages[500] = user("good")
    assert log.flush("s", messages).appended == 600


@pytest.mark.parametrize("bad", [123, None, b"s"])
def test_session_id_type(log, bad):
    with pytest.raises(TypeError):
        log.flush(bad, [user("x")])


@pytest.mark.parametrize("bad", ["", "a\x00b", "x" * 257, "é" * 129, "\ud800"])
def test_session_id_value(log, bad):
    with pytest.raises(ValueError):
        log.flush(bad, [user("x")])


def test_session_id_limits_accept_256_bytes(log):
    log.flush("é" * 128, [user("x")])
    assert log.sessions() == ["é" * 128]


def test_messages_must_be_a_list(log):
    with pytest.raises(TypeError):
        log.flush("s", user("x"))  # type: ignore[arg-type]


def test_empty_flush_of_new_session_writes_nothing(log):
    assert log.flush("s", []).head is None
    assert log.last_seq == 0 and log.sessions() == []


def test_reopen_restores_everything(tmp_path):
    path = tmp_path / "l"
    messages = [user("q1"), assistant("a1")]
    with EventLog.open(path) as log:
        head = log.flush("s", messages).head
        log_id = log.id
    with EventLog.open(path) as log:
        assert log.id == log_id
        assert log.head("s") == head
        assert log.messages("s") == messages
        assert log.flush("s", messages).appended == 0


def test_overrides_go_into_the_event_not_the_message(log):
    messages = [user("wire text with injected context"), assistant("a")]
    log.flush("s", messages, overrides={0: {"content": "clean text"}})
    assert log.messages("s")[0]["content"] == "wire text with injected context"
    assert appended_events(log)[0].overrides == {0: {"content": "clean text"}}


def test_override_for_stored_message_is_an_annotation_once(log):
    messages = [user("q"), assistant("a")]
    log.flush("s", messages)
    seq = log.last_seq
    log.flush("s", messages, overrides={0: {"content": "clean"}})
    notes = [r.event for r in log.events() if isinstance(r.event, events.MessageAnnotated)]
    assert [(n.position, n.override) for n in notes] == [(0, {"content": "clean"})]
    assert log.last_seq == seq + 1
    log.flush("s", messages, overrides={0: {"content": "clean"}})  # same override again: nothing
    assert log.last_seq == seq + 1
    log.flush("s", messages, overrides={0: {"content": "cleaner"}})  # a later override is kept
    assert log.last_seq == seq + 2


def test_override_index_is_into_the_list_as_passed(log):
    messages = [user("q"), assistant("", _thinking_prefill=True), assistant("a")]
    log.flush("s", messages, overrides={2: {"display_kind": "answer"}})
    assert appended_events(log)[0].overrides == {1: {"display_kind": "answer"}}
    with pytest.raises(ValueError, match="scaffolding"):
        log.flush("s", messages, overrides={1: {"content": "x"}})
    with pytest.raises(ValueError, match="no such index"):
        log.flush("s", messages, overrides={9: {"content": "x"}})


def test_carried_message_keeps_its_override(log):
    messages = [user("q1"), assistant("a1"), user("q2 wire")]
    log.flush("s", messages, overrides={2: {"content": "q2 clean"}})
    messages[1] = assistant("a1 edited")
    log.flush("s", messages)
    assert appended_events(log)[-1].overrides == {1: {"content": "q2 clean"}}
    assert log.history("s")[-1].override == {"content": "q2 clean"}


@pytest.mark.parametrize("shown", [2, 4])
def test_equal_messages_never_trade_or_share_their_overrides(log, shown):
    messages = [user("sys"), user("question"), assistant("ok"), user("again"), assistant("ok")]
    log.flush("s", messages, overrides={shown: {"content": "OK (shown)"}})
    messages[1] = user("question, edited")  # an edit: positions 1.. are tombstoned and the rest carried
    log.flush("s", messages)
    live = {o.position: o.override for o in log.history("s") if o.tombstone is None}
    assert live == {p: ({"content": "OK (shown)"} if p == shown else None) for p in range(5)}
    # A compaction's tail moves up: the second "ok" keeps its own override, not the first's.
    log.flush("s", [{**user("summary"), "_compressed_summary": True}, *messages[2:]])
    live = {o.position: o.override for o in log.history("s") if o.tombstone is None}
    assert live == {p: ({"content": "OK (shown)"} if p == shown - 1 else None) for p in range(4)}


def test_tuples_come_back_as_lists(log):
    log.flush("s", [{"role": "assistant", "content": None, "args": (1, 2)}])
    assert log.messages("s") == [{"role": "assistant", "content": None, "args": [1, 2]}]


def test_large_flush_is_split_into_bounded_events_in_one_transaction(log):
    from eventlog.writer import EVENT_MESSAGES

    messages = [user(f"m{i}") for i in range(2 * EVENT_MESSAGES + 10)]
    result = log.flush("s", messages, overrides={EVENT_MESSAGES + 3: {"content": "clean"}})
    assert result.appended == len(messages)
    appended = appended_events(log)
    assert [len(e) for e in appended] == [EVENT_MESSAGES, EVENT_MESSAGES, 10]
    assert [e.position for e in appended] == [0, EVENT_MESSAGES, 2 * EVENT_MESSAGES]
    assert appended[1].overrides == {3: {"content": "clean"}}
    messages[5] = user("edited")  # everything after is carried, across event boundaries
    log.flush("s", messages)
    assert log.messages("s") == messages
    assert log.history("s")[-1].override is None
    assert [o.override for o in log.history("s") if o.tombstone is None and o.position == EVENT_MESSAGES + 3] == [
        {"content": "clean"}
    ]
    assert log.verify().ok


def _numbers_message():
    return {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "ok"}],
        "n": 1,
        "x": 0.0,
        "ok": False,
        "pair": ("a", "b"),
        "t": 1717200007.5,
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
    }


@pytest.fixture(params=["C check", "pure-Python check"])
def edit_check(request, monkeypatch):
    """Runs a test with each implementation of the default mode's edit check."""
    if request.param == "C check":
        if snapshot._check is None:
            pytest.skip("eventlog._check was not built (no C compiler)")
        monkeypatch.setattr(snapshot, "ACCELERATED", True)
    else:
        monkeypatch.setattr(snapshot, "ACCELERATED", False)
    return request.param


def _set(key, value):
    def edit(m):
        m[key] = value

    return edit


IN_PLACE_EDITS = {
    "int to bool": _set("n", True),
    "int to float": _set("n", 1.0),
    "bool to int": _set("ok", 0),
    "zero to minus zero": _set("x", -0.0),
    "timestamp changed": _set("t", 1717200007.75),
    "timestamp to text": _set("t", "1717200007.5"),
    "nested string": lambda m: m["tool_calls"][0]["function"].__setitem__("arguments", '{"a": 1}'),
    "nested list grows": lambda m: m["content"].append({"type": "text", "text": "more"}),
    "key added": _set("name", "x"),
    "key removed": lambda m: m.pop("n"),
}


@pytest.mark.parametrize("copied", [False, True], ids=["first-reflush", "after-copy"])
@pytest.mark.parametrize("edit", list(IN_PLACE_EDITS), ids=list(IN_PLACE_EDITS))
def test_every_in_place_edit_is_recorded(edit_check, log, edit, copied):
    """Edits that Python's == would call equal (1 == True == 1.0, 0.0 == -0.0) change the canonical
    bytes, so the cheap comparison of cached copies must not miss them."""
    messages = [user("q"), _numbers_message(), user("q2")]
    log.flush("s", messages)
    if copied:
        assert log.flush("s", messages).appended == 0  # checked by encoding, then copied
    IN_PLACE_EDITS[edit](messages[1])
    result = log.flush("s", messages)
    assert (result.appended, result.tombstoned) == (2, 2)
    assert log.messages("s") == copy.deepcopy(
        [*messages[:1], {**messages[1], "pair": list(messages[1]["pair"])}, *messages[2:]]
    )
    assert log.flush("s", messages).appended == 0


@pytest.mark.parametrize("copied", [False, True], ids=["first-reflush", "after-copy"])
def test_equal_replacements_in_place_write_nothing(edit_check, log, copied):
    messages = [user("q"), _numbers_message()]
    log.flush("s", messages)
    if copied:
        log.flush("s", messages)
    messages[1]["pair"] = ["a", "b"]  # a list where a tuple was: the same canonical bytes
    messages[1]["content"] = "".join(["o", "k"]) and copy.deepcopy(messages[1]["content"])  # equal, new objects
    messages[1]["_note"] = object()  # a process-local annotation
    messages[1]["t"] = float("1717200007.5")  # an equal timestamp, a new object
    assert log.flush("s", messages).appended == 0
    assert log.flush("s", messages).appended == 0


def test_in_place_flag_makes_a_stored_message_scaffolding(log):
    messages = [user("q"), assistant("thinking"), user("q2")]
    log.flush("s", messages)
    log.flush("s", messages)
    messages[1]["_thinking_prefill"] = True
    result = log.flush("s", messages)
    assert result.tombstoned == 2 and [m["content"] for m in log.messages("s")] == ["q", "q2"]


@pytest.mark.parametrize("trust", [False, True])
def test_a_refused_extension_leaves_the_cache_as_it_was(tmp_path, trust):
    with EventLog.open(tmp_path / "l", trust_identity=trust) as log:
        messages = [user("a"), assistant("b")]
        log.flush("s", messages)
        log.flush("s", messages + [user("c")])
        with pytest.raises(InvalidMessageError):
            log.flush("s", messages + [user("c"), assistant("d"), {"role": "user", "content": object()}])
        result = log.flush("s", messages + [user("c"), user("e")])
        assert (result.appended, result.unchanged) == (1, 3)
        assert [m["content"] for m in log.messages("s")] == ["a", "b", "c", "e"]
        assert log.verify().ok


class _RaisingEq:
    """A process-local `_` value whose == raises while armed (like a numpy array, or a Ctrl-C
    meanwhile), and otherwise equals another of its kind or ``[1]``."""

    error: type[BaseException] | None = None

    def __eq__(self, other):
        if _RaisingEq.error is not None:
            raise _RaisingEq.error("ambiguous truth value")
        return isinstance(other, _RaisingEq) or other == [1]

    __hash__ = None


@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
@pytest.mark.parametrize("trust", [False, True])
def test_a_comparison_that_raises_leaves_the_cache_sound(edit_check, tmp_path, trust, error):
    """The pure-Python check and trust mode compare with ``==``, which may run a ``_`` value's
    ``__eq__``; the C check never runs Python code (it tells the value apart by its type)."""
    _RaisingEq.error = None
    try:
        with EventLog.open(tmp_path / "l", trust_identity=trust) as log:
            first = {"role": "user", "content": "hi", "_meta": _RaisingEq() if trust else [1]}
            messages = [first, assistant("a")]
            log.flush("s", messages)
            log.flush("s", messages)
            if trust:  # a new dict, equal to the first
                messages[0] = {"role": "user", "content": "hi", "_meta": _RaisingEq()}
            else:  # an annotation replaced in place: equal to the copy's `[1]`, but compared by raising
                first["_meta"] = _RaisingEq()
            messages.append(user("third"))
            _RaisingEq.error = error
            if error is KeyboardInterrupt and (trust or not snapshot.ACCELERATED):
                with pytest.raises(KeyboardInterrupt):
                    log.flush("s", messages)  # interrupted: nothing written, the cache as it was
                assert len(log.messages("s")) == 2
                _RaisingEq.error = None
            assert log.flush("s", messages).appended == 1
            _RaisingEq.error = None
            assert log.flush("s", messages).appended == 0
            if not trust:
                messages[2]["content"] = "edited in place"
                assert log.flush("s", messages).tombstoned == 1
            assert log.messages("s") == [user("hi"), assistant("a"), messages[2]]
            assert log.verify().ok
    finally:
        _RaisingEq.error = None


def test_a_message_edited_while_it_is_being_flushed_is_caught_next_time(tmp_path):
    """The copy for the next check is taken before the message is encoded, so an edit racing
    with the flush (simulated here from the scaffolding rule, which runs in between) shows."""
    target: dict = {}

    def rule(message):
        if message is target and message["content"] == "streaming":
            message["content"] = "streaming, more text"  # another thread appends to the text
        return False

    with EventLog.open(tmp_path / "l", ephemeral=rule) as log:
        messages = [user("q")]
        log.flush("s", messages)
        target.update(assistant("streaming"))
        messages.append(target)
        log.flush("s", messages)  # stores the text as encoded, whichever it was
        result = log.flush("s", messages)
        assert log.messages("s")[1]["content"] == "streaming, more text"
        assert result.appended in (0, 1)


def _batch(n, **extra):
    return [
        {"role": "user" if i % 2 else "assistant", "content": f"m{i}", "n": i, "t": i / 3, **extra} for i in range(n)
    ]


@pytest.mark.parametrize("size", [12, 100], ids=["turn", "import"])
def test_a_large_batch_hashes_exactly_as_message_by_message(monkeypatch, size):
    from eventlog import snapshot

    messages = _batch(size)
    messages[7]["tool_calls"] = [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]
    fast = snapshot.prepare(messages, None)
    monkeypatch.setattr(snapshot, "BATCH_PATH", 10**9)
    slow = snapshot.prepare(messages, None)
    assert (fast.kept, fast.bodies, fast.digests, fast.nodes, fast.flags) == (
        slow.kept,
        slow.bodies,
        slow.digests,
        slow.nodes,
        slow.flags,
    )


@pytest.mark.parametrize("size", [12, 60], ids=["turn", "import"])
@pytest.mark.parametrize("odd", ["scaffolding", "private key", "invalid"])
def test_a_large_batch_with_an_odd_message_keeps_every_rule(log, odd, size):
    from eventlog import snapshot

    assert snapshot.BATCH_PATH <= 12 < snapshot.PLAIN_BATCH <= 60  # each size takes its own path
    messages = _batch(size)
    k = size - 5
    if odd == "scaffolding":  # dropped before any check, even holding what could not be stored
        messages[k]["content"] = {1, 2}
        messages[k]["_thinking_prefill"] = True
        log.flush("s", messages)
        assert len(log.messages("s")) == size - 1
    elif odd == "private key":
        messages[k]["_sent_at"] = object()
        log.flush("s", messages)
        assert log.messages("s")[k] == {key: v for key, v in messages[k].items() if key != "_sent_at"}
    else:
        messages[k]["content"] = {1, 2}
        with pytest.raises(InvalidMessageError, match=rf"messages\[{k}\]\[\"content\"\]"):
            log.flush("s", messages)
        assert log.last_seq == 0


def rewind_elsewhere(path, session_id: str, to: int) -> None:
    """Rewind the session from another process: this one's cache does not hear of it."""
    from crashkit import run_python

    done = run_python(
        """
        import sys
        from eventlog import EventLog
        with EventLog.open(sys.argv[1]) as log:
            log.rewind(sys.argv[2], to=int(sys.argv[3]))
        """,
        str(path),
        session_id,
        str(to),
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("trust", [False, True], ids=["default", "trust"])
@pytest.mark.parametrize("size", [12, 100], ids=["turn", "import"])
def test_a_cached_list_lets_go_of_stored_bodies_and_encodes_them_again_after_a_rewind(tmp_path, trust, size):
    """The cache holds no second copy of a stored message's bytes; when another process
    rewinds the log under it, flushing the same list writes those messages again, from
    their dicts."""
    with EventLog.open(tmp_path / "l", trust_identity=trust) as log:
        messages = [user(f"q{i}") if i % 2 == 0 else assistant(f"a{i}") for i in range(size)]
        log.flush("s", messages)
        cached = log._cache.get("s")
        assert cached is not None and cached.bodies == [None] * size
        rewind_elsewhere(tmp_path / "l", "s", 3)
        result = log.flush("s", messages)
        assert (result.appended, result.tombstoned) == (size - 3, 0)
        assert log.messages("s") == messages
        assert stored_bodies(log) == 2 * size - 3
        assert log.verify().ok
        assert log._cache.get("s").bodies == [None] * size


def test_a_message_changed_behind_a_trust_promise_is_stored_as_it_now_is(tmp_path):
    """Trust mode reuses a flushed dict without looking inside; if the log needs its body again
    and it no longer matches its digest, the list is hashed afresh, never stored half old."""
    with EventLog.open(tmp_path / "l", trust_identity=True) as log:
        messages = [user("q1"), assistant("a1"), user("q2"), assistant("a2")]
        log.flush("s", messages)
        rewind_elsewhere(tmp_path / "l", "s", 1)
        messages[2]["content"] = "changed in place"
        assert log.flush("s", messages).appended == 3
        assert log.messages("s") == messages
        assert log.verify().ok
        assert log.flush("s", messages).appended == 0


def test_an_interrupt_anywhere_in_letting_bodies_go_leaves_the_cache_sound(tmp_path):
    """Ctrl-C can land between any two lines of ``release``: whatever it leaves in the cache,
    the next flush after a rewind under it still stores every message, whole."""
    import inspect
    import sys

    from eventlog import snapshot

    lines, first = inspect.getsourcelines(snapshot.release)
    for at in range(first + 1, first + len(lines)):

        def tracer(frame, event, arg, at=at):
            if frame.f_code is not snapshot.release.__code__:
                return None

            def local(frame, event, arg):
                if event == "line" and frame.f_lineno == at:
                    sys.settrace(None)
                    raise KeyboardInterrupt  # as a signal handler would, between two lines
                return local

            return local

        with EventLog.open(tmp_path / f"l{at}", durability="none") as log:
            messages = [user(f"q{i}") if i % 2 == 0 else assistant(f"a{i}") for i in range(6)]
            sys.settrace(tracer)
            try:
                log.flush("s", messages)
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            log._store.write(lambda txn: log._writer.rewind(txn, "s", 2))  # as another process would
            assert log.flush("s", messages).appended == 4
            assert log.messages("s") == messages
            assert log.verify().ok


def test_an_interrupted_write_leaves_its_list_out_of_the_cache(log, monkeypatch):
    """A caller interrupted while its write waits in a group commit may see the leader run that
    write later, with the prepared list: no other flush may take that list from the cache."""
    messages = [user("q1"), assistant("a1")]
    log.flush("s", messages)
    messages.append(user("q2"))
    write = log._store.write

    def interrupted(body):
        write(body)  # the leader commits it after the caller has stopped waiting
        raise KeyboardInterrupt

    monkeypatch.setattr(log._store, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        log.flush("s", messages)
    monkeypatch.undo()
    assert log._cache.get("s") is None
    assert log.flush("s", messages).appended == 0
    assert log.messages("s") == messages


def test_a_message_replaced_while_a_trust_mode_flush_measures_the_list_is_stored(tmp_path):
    import sys

    with EventLog.open(tmp_path / "l", trust_identity=True) as log:
        messages = [user("a"), assistant("b"), user("c")]
        log.flush("s", messages)
        messages.pop()

        def another_thread_replaces_a_message(frame, event, arg):
            # Stands in for a thread switch right after the flush measured what it can reuse.
            if event == "return" and frame.f_code.co_name == "_reusable":
                sys.setprofile(None)
                messages[1] = assistant("b, replaced")

        sys.setprofile(another_thread_replaces_a_message)
        try:
            log.flush("s", messages)
        finally:
            sys.setprofile(None)
        log.flush("s", messages)
        assert log.messages("s") == [user("a"), assistant("b, replaced")]
