"""The live read's integrity checks, on sessions that span several events.

``messages()`` reads every event that holds a live body once, checks it against the
hash the log recorded for it, and takes runs of bodies as slices: these tests damage
each part of that path and expect :class:`CorruptLogError`, never a wrong message.
"""

from __future__ import annotations

import gc
import random
from pathlib import Path

import lmdb
import pytest

from eventlog import CorruptLogError, EventLog
from eventlog.replay import paused_gc
from eventlog.store import LINK, SEQ, chain_key


def _raw_env(path: Path) -> lmdb.Environment:
    return lmdb.open(str(path), subdir=True, max_dbs=8, max_readers=512)


def _message(i: int) -> dict[str, object]:
    return {"role": "user" if i % 2 else "assistant", "content": f"message {i} " + "x" * (i % 7)}


def _multi_event_log(path: Path) -> list[dict[str, object]]:
    """Session ``s`` stored over several events, with an edit so that some bodies are carried."""
    messages = [_message(i) for i in range(30)]
    with EventLog.open(path) as log:
        for end in (8, 16, 24, 30):
            log.append("s", messages[end - 8 if end != 30 else 24 : end])
        log.flush("other", [_message(100)])
        edited = [*messages[:10], {"role": "user", "content": "edited"}, *messages[11:]]
        log.flush("s", edited)  # positions 11.. are carried: their bodies stay in the older events
        assert log.messages("s") == edited
        return edited


def _events(path: Path) -> list[tuple[bytes, bytes]]:
    env = _raw_env(path)
    try:
        with env.begin() as txn:
            return list(txn.cursor(db=env.open_db(b"events", txn=txn)))
    finally:
        env.close()


def _put(path: Path, db: bytes, key: bytes, value: bytes) -> None:
    env = _raw_env(path)
    try:
        with env.begin(write=True) as txn:
            txn.put(key, value, db=env.open_db(db, txn=txn))
    finally:
        env.close()


def test_a_changed_byte_in_any_event_never_gives_a_wrong_transcript(tmp_path: Path) -> None:
    path = tmp_path / "log"
    expected = _multi_event_log(path)
    with EventLog.open(path) as log:
        live = {occ.source[0] for occ in log.history("s") if occ.tombstone is None}
    assert len(live) >= 4  # bodies come from several events
    original = _events(path)
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


def test_a_chain_entry_moved_to_a_carried_slot_is_a_corrupt_log_error(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        first = [_message(0), _message(1), _message(2)]
        log.flush("s", first)
        log.flush("s", [first[0], {"role": "user", "content": "edited"}, first[2]])
        appended = [r for r in log.events() if type(r.event).__name__ == "MessagesAppended"]
        edit = appended[-1]
        assert edit.event.carried == {1: (appended[0].seq, 2)}
    env = _raw_env(path)
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
