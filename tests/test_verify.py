"""verify() recomputes digests, the hash chain and the derived indexes."""

from __future__ import annotations

import lmdb
import pytest
from factories import assistant, user

from eventlog import EventLog


def build(path):
    with EventLog.open(path) as log:
        messages = [user("q1"), assistant("a1"), user("q2")]
        log.flush("s", messages)
        messages[1] = assistant("a1 edited")
        log.flush("s", messages)
        log.fork("s", "b", at=2)
        log.compact("s", start=0, end=1, summary=[user("summary")])
        log.update_session("s", title="t")
        assert log.verify().ok


def tamper(path, db: bytes, key: bytes, mutate):
    env = lmdb.open(str(path), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            handle = env.open_db(db, txn=txn)
            value = txn.get(key, db=handle)
            txn.put(key, mutate(value), db=handle)
    finally:
        env.close()


def seq_key(seq: int) -> bytes:
    return seq.to_bytes(8, "big")


def test_intact_log_verifies(tmp_path):
    build(tmp_path / "l")
    with EventLog.open(tmp_path / "l") as log:
        report = log.verify()
        assert report.ok and report.events == log.last_seq and report.sessions == 2
        assert str(report).startswith("ok:")


def test_every_changed_byte_of_an_event_is_found(tmp_path):
    path = tmp_path / "l"
    build(path)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin() as txn:
        original = txn.get(seq_key(2), db=env.open_db(b"events", txn=txn))
    env.close()
    with EventLog.open(path) as log:
        log.close()
    for offset in range(len(original)):
        tamper(path, b"events", seq_key(2), lambda v, o=offset: v[:o] + bytes([v[o] ^ 0x01]) + v[o + 1 :])
        with EventLog.open(path) as log:
            report = log.verify()
        assert not report.ok, f"flipping byte {offset} of event 2 went unnoticed"
        tamper(path, b"events", seq_key(2), lambda v: original)
    with EventLog.open(path) as log:
        assert log.verify().ok


def test_changed_body_names_the_event(tmp_path):
    path = tmp_path / "l"
    build(path)
    tamper(path, b"events", seq_key(2), lambda v: v.replace(b"q1", b"Q1"))
    with EventLog.open(path) as log:
        report = log.verify()
    assert not report.ok
    assert report.first.seq == 2 and "content digest" in report.first.what


def test_damaged_index_is_found(tmp_path):
    path = tmp_path / "l"
    build(path)
    key = (1).to_bytes(8, "big") + b"c" + (0).to_bytes(8, "big")
    tamper(path, b"index", key, lambda v: bytes(32) + v[32:])
    with EventLog.open(path) as log:
        report = log.verify()
    assert not report.ok and "live chain" in str(report)


def test_deleted_last_event_is_found(tmp_path):
    path = tmp_path / "l"
    build(path)
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        events = env.open_db(b"events", txn=txn)
        last = txn.cursor(db=events)
        assert last.last()
        txn.delete(last.key(), db=events)
    env.close()
    with EventLog.open(path) as log:
        report = log.verify()
    assert not report.ok and "last event" in str(report)


@pytest.mark.parametrize("mode", ["full", "process", "none"])
def test_durability_modes_open_and_verify(tmp_path, mode):
    with EventLog.open(tmp_path / mode, durability=mode) as log:
        log.flush("s", [user("x")])
        assert log.durability == mode and log.verify().ok


def test_events_of_every_size_in_turn_are_stored_exactly(tmp_path):
    """The buffer events are encoded into is reused: after a large event, a small one or a
    larger one must hold its own bytes and nothing of the one before."""
    from eventlog import events as ev
    from eventlog.keys import HEADER
    from eventlog.store import EVENT_BUFFER_KEEP

    path = tmp_path / "l"
    sizes = [(1500, 900), (3, 10), (40, 2_000), (1, 5), (1024, EVENT_BUFFER_KEEP // 900), (2, 50), (300, 700)]
    with EventLog.open(path, durability="none") as log:
        for i, (count, chars) in enumerate(sizes):
            log.append(f"s{i % 3}", [user(f"{i}.{j} " + "x" * chars) for j in range(count)])
        assert log.verify().ok
        expected = {f"s{i}": [] for i in range(3)}
        for i, (count, chars) in enumerate(sizes):
            expected[f"s{i % 3}"] += [f"{i}.{j} " + "x" * chars for j in range(count)]
        for sid, contents in expected.items():
            assert [m["content"] for m in log.messages(sid)] == contents
    env = lmdb.open(str(path), max_dbs=8, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            stored = list(txn.cursor(db=env.open_db(b"events", txn=txn)))
    finally:
        env.close()
    assert len(stored) > len(sizes)
    for key, raw in stored:
        event = ev.decoder.decode(raw[HEADER.size :])
        assert len(raw) == HEADER.size + len(ev.encoder.encode(event)), f"event {key.hex()} has bytes it should not"


def test_a_changed_byte_of_a_tombstone_or_fork_never_gives_a_wrong_history(tmp_path):
    from eventlog import CorruptLogError, events

    path = tmp_path / "l"
    build(path)

    def reads(log):
        out = []
        for session in ("s", "b"):
            out.append(
                [(o.position, o.node, o.origin, o.source, o.override, o.tombstone) for o in log.history(session)]
            )
            out.extend(log.messages(session, as_of=seq) for seq in range(1, log.last_seq + 1))
        return out

    with EventLog.open(path, readonly=True) as log:
        expected = reads(log)
        structural = [
            r.seq for r in log.events() if isinstance(r.event, (events.MessagesTombstoned, events.SessionOpened))
        ]
    assert len(structural) == 4  # two opens (one a fork), an edit's and a compaction's tombstones
    for seq in structural:
        original = []
        tamper(path, b"events", seq_key(seq), lambda v: original.append(bytes(v)) or v)
        original = original[0]
        for offset in range(len(original)):
            changed = original[:offset] + bytes([original[offset] ^ 0x04]) + original[offset + 1 :]
            tamper(path, b"events", seq_key(seq), lambda v: changed)
            with EventLog.open(path, readonly=True) as log:
                try:
                    got = reads(log)
                except CorruptLogError:
                    continue
            assert got == expected, f"byte {offset} of event {seq} changed, and history read it without a word"
        tamper(path, b"events", seq_key(seq), lambda v: original)


def _index_key(number: int, kind: bytes, position: int | None = None) -> bytes:
    return seq_key(number) + kind + (b"" if position is None else seq_key(position))


def _put(path, db: bytes, key: bytes, value: bytes | None) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            handle = env.open_db(db, txn=txn)
            if value is None:
                txn.delete(key, db=handle)
            else:
                txn.put(key, value, db=handle)
    finally:
        env.close()


def build_with_override(path):
    with EventLog.open(path) as log:
        log.flush("s", [user("<ctx>notes</ctx> q1"), assistant("a1")], overrides={0: {"content": "q1"}})
        log.fork("s", "f")
        assert log.verify().ok


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (
            lambda p: tamper(p, b"index", _index_key(1, b"n", 0), lambda v: v.replace(b"q1", b"Q1")),
            "display overrides of session 's'",
        ),
        (lambda p: _put(p, b"index", _index_key(2, b"n", 0), None), "display overrides of session 'f'"),
        (lambda p: _put(p, b"index", _index_key(1, b"n", 1), bytes(32) + b"\x80"), "display overrides of session 's'"),
        (lambda p: _put(p, b"index", _index_key(9, b"h"), bytes(81)), "session number 9, which no indexed session has"),
        (lambda p: _put(p, b"index", _index_key(1, b"x"), b""), "entries of no known kind"),
        (lambda p: _put(p, b"meta", b"next_sid", seq_key(2)), "session counter is not past session number 2"),
        (lambda p: _put(p, b"sessions", b"f", seq_key(1)), "'f' is indexed under another number"),
    ],
    ids=[
        "override-changed",
        "override-lost",
        "override-added",
        "stray-number",
        "unknown-kind",
        "counter-moved-back",
        "session-renumbered",
    ],
)
def test_damage_to_what_verify_once_skipped_is_found(tmp_path, damage, fragment):
    path = tmp_path / "l"
    build_with_override(path)
    damage(path)
    with EventLog.open(path, readonly=True) as log:
        report = log.verify()
    assert not report.ok and any(fragment in str(p) for p in report.problems), report.problems


def test_a_session_counter_moved_back_never_gives_a_new_session_anothers_messages(tmp_path):
    from eventlog import CorruptLogError

    path = tmp_path / "l"
    build_with_override(path)
    _put(path, b"meta", b"next_sid", seq_key(1))
    with EventLog.open(path) as log:
        seq = log.last_seq
        with pytest.raises(CorruptLogError, match="session counter"):
            log.flush("new", [user("mine")])
        assert log.last_seq == seq and log.messages("s")[0] == user("<ctx>notes</ctx> q1")


@pytest.mark.parametrize(
    ("db", "key"),
    [
        (b"index", _index_key(1, b"h")),
        (b"index", _index_key(1, b"c", 1)),
        (b"sessions", b"s"),
        (b"index", _index_key(1, b"n", 0)),
    ],
    ids=["state", "chain-entry", "session-number", "override"],
)
def test_an_index_entry_of_the_wrong_length_is_reported_as_damage(tmp_path, db, key):
    from eventlog import CorruptLogError

    path = tmp_path / "l"
    build_with_override(path)
    tamper(path, db, key, lambda v: v[:-1] if db != b"index" or key[8:9] != b"n" else v[:20])
    with EventLog.open(path) as log:
        assert not log.verify().ok
        with pytest.raises(CorruptLogError, match="damaged"):
            if key[8:9] == b"n":  # overrides are read when their messages are tombstoned
                log.flush("s", [user("other")], replace=True)
            elif key[8:9] == b"c":  # the chain, when an edit finds what it tombstones
                log.flush("s", [user("<ctx>notes</ctx> q1"), assistant("a1 changed")])
            else:
                log.messages("s")
