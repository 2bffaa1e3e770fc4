"""The live read's integrity checks, on sessions that span several events.

``messages()`` reads a session that only ever appended from its own events, and any
other session through the live chain; both read every event that holds a live body
once, check it against the hash the log recorded for it, and take runs of bodies as
slices.  These tests damage each part of both paths and expect
:class:`CorruptLogError`, never a wrong message.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import pytest
from crashkit import raw_env, raw_events

from eventlog import CorruptLogError, EventLog, overlap
from eventlog.keys import LINK, SEQ, STATE, chain_key, state_key
from eventlog.overlap import OVERLAP_FROM
from eventlog.replay import paused_gc


def _message(i: int) -> dict[str, object]:
    return {"role": "user" if i % 2 else "assistant", "content": f"message {i} " + "x" * (i % 7)}


def _multi_event_log(path: Path, *, edit: bool) -> list[dict[str, object]]:
    """Session ``s`` stored over several events; with ``edit``, some of its bodies are carried."""
    messages = [_message(i) for i in range(30)]
    with EventLog.open(path) as log:
        for start, end in ((0, 8), (8, 16), (16, 24)):
            log.append("s", messages[start:end])
        log.flush("other", [_message(100)])
        log.update_session("s", title="t")
        log.append("s", messages[24:])
        if edit:
            messages = [*messages[:10], {"role": "user", "content": "edited"}, *messages[11:]]
            log.flush("s", messages)  # positions 11.. are carried: their bodies stay in the older events
        assert log.messages("s") == messages
        return messages


def _session_number(path: Path, session_id: str) -> int:
    env = raw_env(path)
    try:
        with env.begin() as txn:
            return SEQ.unpack(txn.get(session_id.encode(), db=env.open_db(b"sessions", txn=txn)))[0]
    finally:
        env.close()


def _get(path: Path, db: bytes, key: bytes) -> bytes:
    env = raw_env(path)
    try:
        with env.begin() as txn:
            value = txn.get(key, db=env.open_db(db, txn=txn))
            assert value is not None
            return value
    finally:
        env.close()


def _put(path: Path, db: bytes, key: bytes, value: bytes) -> None:
    env = raw_env(path)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, value, db=env.open_db(db, txn=txn))
    finally:
        env.close()


@pytest.mark.parametrize("edit", [False, True], ids=["appended-only", "edited"])
def test_a_changed_byte_in_any_event_never_gives_a_wrong_transcript(tmp_path: Path, edit: bool) -> None:
    path = tmp_path / "log"
    expected = _multi_event_log(path, edit=edit)
    with EventLog.open(path) as log:
        # Events holding a live body must be found damaged; damage elsewhere may also
        # be found, or (an envelope whose kind no longer reads as append-only, say)
        # send the read through the live chain, which gives the true transcript.
        live = {occ.source[0] for occ in log.history("s") if occ.tombstone is None}
    assert len(live) >= 4  # bodies come from several events
    original = raw_events(path)
    rng = random.Random(1)
    for key, value in original:
        seq = SEQ.unpack(key)[0]
        positions = {0, 31, 32, 40, 56, len(value) // 2, len(value) - 1, *rng.sample(range(len(value)), 6)}
        for at in sorted(positions):
            changed = bytearray(value)
            changed[at] ^= 1 << rng.randrange(8)
            _put(path, b"events", key, bytes(changed))
            try:
                with EventLog.open(path) as log:
                    if seq in live:
                        with pytest.raises(CorruptLogError):
                            log.messages("s")
                    else:
                        try:
                            assert log.messages("s") == expected, (seq, at)
                        except CorruptLogError:
                            pass
            finally:
                _put(path, b"events", key, value)
    with EventLog.open(path) as log:
        assert log.messages("s") == expected


@pytest.mark.parametrize("field", ["length", "head", "last_seq"])
def test_an_append_only_session_whose_state_disagrees_with_its_events_is_a_corrupt_log_error(
    tmp_path: Path, field: str
) -> None:
    path = tmp_path / "log"
    _multi_event_log(path, edit=False)
    number = _session_number(path, "s")
    length, head, last_seq, last_hash, closed = STATE.unpack(_get(path, b"index", state_key(number)))
    with EventLog.open(path) as log:
        appends = [
            r.seq for r in log.events() if r.event.session == "s" and type(r.event).__name__ == "MessagesAppended"
        ]
    assert last_seq == appends[-1]
    if field == "length":
        length -= 1
    elif field == "head":
        head = bytes([head[0] ^ 1]) + head[1:]
    else:  # the state names an earlier event of the session as its last
        last_seq = appends[-2]
    _put(path, b"index", state_key(number), STATE.pack(length, head, last_seq, last_hash, closed))
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError):
            log.messages("s")


def test_an_append_only_session_is_read_from_its_events_whatever_its_live_chain_says(tmp_path: Path) -> None:
    path = tmp_path / "log"
    expected = _multi_event_log(path, edit=False)
    number = _session_number(path, "s")
    node, digest, seq, index = LINK.unpack(_get(path, b"index", chain_key(number, 5)))
    _put(path, b"index", chain_key(number, 5), LINK.pack(node, digest, seq, index + 1))
    with EventLog.open(path) as log:
        assert log.messages("s") == expected
        assert not log.verify().ok  # the damaged index is verify's to find


def test_a_chain_entry_moved_to_a_carried_slot_is_a_corrupt_log_error(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        first = [_message(0), _message(1), _message(2)]
        log.flush("s", first)
        log.flush("s", [first[0], {"role": "user", "content": "edited"}, first[2]])
        appended = [r for r in log.events() if type(r.event).__name__ == "MessagesAppended"]
        edit = appended[-1]
        assert edit.event.carried == {1: (appended[0].seq, 2)}
    env = raw_env(path)
    try:
        with env.begin() as txn:
            number = SEQ.unpack(txn.get(b"s", db=env.open_db(b"sessions", txn=txn)))[0]
            node, digest, seq, index = LINK.unpack(txn.get(chain_key(number, 2), db=env.open_db(b"index", txn=txn)))
    finally:
        env.close()
    assert (seq, index) == (appended[0].seq, 2)
    # Point position 2 at the edit's carried slot, whose digest column holds the same digest.
    assert edit.event.digest(1) == digest
    _put(path, b"index", chain_key(number, 2), LINK.pack(node, digest, edit.seq, 1))
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError):
            log.messages("s")


def _large_event_log(path: Path, *, edit: bool) -> tuple[list[dict[str, object]], bytes]:
    """Session ``s`` with one event past :data:`~eventlog.overlap.OVERLAP_FROM` (hashed on the
    second thread while it is decoded); returns the transcript and that event's key."""
    messages = [{"role": "user", "content": f"M{i:05d}" + "y" * 1000} for i in range(400)]
    with EventLog.open(path) as log:
        log.append("s", messages)
        log.append("s", [_message(1)])
        messages.append(_message(1))
        if edit:  # the read goes through the live chain, to the large event's bodies
            messages = [messages[0], {"role": "user", "content": "edited"}, *messages[2:]]
            log.flush("s", messages)
        assert log.messages("s") == messages
    return messages, next(key for key, value in raw_events(path) if len(value) >= OVERLAP_FROM)


@pytest.mark.parametrize("edit", [False, True], ids=["appended-only", "edited"])
@pytest.mark.parametrize("damage", ["content", "framing"])
def test_a_large_event_hashed_while_it_is_decoded_is_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, edit: bool, damage: str
) -> None:
    monkeypatch.setattr("eventlog.overlap.OFFLOAD", True)  # the worker hashes it, even with one CPU
    assert overlap._digest is not None  # built by `pip install` (the C extension)
    path = tmp_path / "log"
    expected, key = _large_event_log(path, edit=edit)
    value = _get(path, b"events", key)
    at = value.index(b"M00200")
    changed = bytearray(value)
    if damage == "content":
        changed[at + 1] ^= 1  # still decodes, to a message with other content
    else:
        assert changed[at - 3] == 0xDA  # the string's header: a code msgpack never uses instead
        changed[at - 3] = 0xC1
    _put(path, b"events", key, bytes(changed))
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError, match="does not match its recorded hash"):
            log.messages("s")
    _put(path, b"events", key, value)
    with EventLog.open(path) as log:
        assert log.messages("s") == expected


def test_paused_gc_leaves_the_applications_frozen_objects_frozen() -> None:
    if not gc.isenabled():
        pytest.skip("the collector is disabled in this process")
    kept = [[i] for i in range(100)]
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with paused_gc(10_000):
            made = [{"n": [i]} for i in range(10_000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    assert len(made) == 10_000 and len(kept) == 100


def test_paused_gc_hands_the_new_objects_over_without_a_collection() -> None:
    if not gc.isenabled() or gc.get_freeze_count():
        pytest.skip("the collector is disabled or objects are frozen in this process")
    gc.collect()
    collections: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        with paused_gc(50_000):
            made = [{"n": [i]} for i in range(50_000)]
        after = [[i] for i in range(100)]  # allocations that would start the deferred collection
    finally:
        gc.callbacks.remove(seen)
    assert gc.isenabled()
    # The objects made during the pause went to the oldest generation untraversed.
    assert collections == []
    assert len(made) == 50_000 and len(after) == 100
