"""The tamper suite: each attack an operator with write access could try, caught by the mechanism meant for it.

The attacker uses the library itself, so every digest, link, index and even the Merkle
tree of the forged log is recomputed the way the library does: ``verify()`` alone
passes every forgery below (that is asserted, and is the mutation check of the
anchor: with the anchor disabled the attack goes through).  What catches them is
something kept outside the log: a signed checkpoint, and for a key holder who signs a
forged history, consistency with a checkpoint published earlier.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from factories import assistant, user

from eventlog import EventLog, signing
from eventlog.audit import AuditError
from eventlog.keys import HEADER, SEQ, STATE, SessionState, event_hash, state_key
from eventlog.verifier import Checkpoint, ProofError, open_checkpoint, split_note, verify_consistency

Ops = Callable[[EventLog, dict[str, str]], None]


def history(log: EventLog, names: dict[str, str], secret: str = "the transfer was 100 EUR") -> None:
    a, b = names.get("a", "a"), names.get("b", "b")
    log.flush(a, [user("pay alice"), assistant(secret)])
    log.flush(b, [user("what is lmdb?"), assistant("a B+tree store")])
    log.flush(a, [user("pay alice"), assistant(secret), user("thanks")])
    log.flush(b, [user("what is lmdb?"), assistant("a B+tree store"), user("ok")])


def build(path: Path, ops: Callable[[EventLog], None], log_id: bytes | None = None) -> None:
    with EventLog.open(path) as log:
        ops(log)
    if log_id is not None:  # the forger keeps the log's identity
        env = lmdb.open(str(path), max_dbs=8)
        with env.begin(write=True) as txn:
            txn.put(b"log_id", log_id, db=env.open_db(b"meta", txn=txn))
        env.close()
        (path / "eventlog.id").write_text(log_id.hex() + "\n")


def log_id_of(path: Path) -> bytes:
    with EventLog.open(path, readonly=True) as log:
        return bytes.fromhex(log.id)


@pytest.fixture
def key():
    return signing.generate("example.com/audit-test")


@pytest.fixture
def genuine(tmp_path, key):
    """A log with a checkpoint of its whole history kept outside it."""
    path = tmp_path / "genuine"
    build(path, lambda log: history(log, {}))
    with EventLog.open(path) as log:
        note = log.checkpoint([key])
    return path, note


def verdicts(path: Path, note: str, key: signing.KeySigner) -> tuple[bool, list[str]]:
    """(verify alone ok?, problems found against the checkpoint)."""
    with EventLog.open(path, readonly=True) as log:
        alone = log.verify().ok
        anchored = log.verify(checkpoints=[note], keys=[key.verifier()])
    return alone, [p.what for p in anchored.problems]


def test_the_genuine_log_passes_against_its_checkpoint(genuine, key):
    path, note = genuine
    assert verdicts(path, note, key) == (True, [])


def test_a_resealed_rewrite_is_caught_by_the_checkpoint(genuine, key, tmp_path):
    path, note = genuine
    forged = tmp_path / "forged"
    build(forged, lambda log: history(log, {}, secret="the transfer was 10 EUR"), log_id_of(path))
    alone, problems = verdicts(forged, note, key)
    assert alone  # every digest, link, index and tree node recomputed: verify alone is fooled
    assert problems == [
        "checkpoint: the log's first 6 events are not those the checkpoint signed "
        "(history rewritten, events deleted, reordered or backdated)"
    ]


def test_a_rollback_to_an_older_copy_is_caught_by_the_checkpoint(tmp_path, key):
    path, old = tmp_path / "log", tmp_path / "old"
    build(path, lambda log: log.flush("a", [user("hi")]))
    shutil.copytree(path, old)
    with EventLog.open(path) as log:
        log.flush("a", [user("hi"), assistant("a reply the operator regrets")])
        note = log.checkpoint([key])
    alone, problems = verdicts(old, note, key)
    assert alone
    assert problems == [
        "checkpoint: the log has 2 events, fewer than the 3 the checkpoint signed "
        "(rolled back to an older copy, or events deleted)"
    ]


def test_a_deleted_session_is_caught_by_the_checkpoint(genuine, key, tmp_path):
    path, note = genuine

    def without_b(log: EventLog) -> None:
        log.flush("a", [user("pay alice"), assistant("the transfer was 100 EUR")])
        log.flush("a", [user("pay alice"), assistant("the transfer was 100 EUR"), user("thanks")])

    forged = tmp_path / "forged"
    build(forged, without_b, log_id_of(path))
    alone, problems = verdicts(forged, note, key)
    assert alone and problems and "fewer than the 6" in problems[0]


def test_swapped_sessions_are_caught_by_the_checkpoint(genuine, key, tmp_path):
    path, note = genuine
    forged = tmp_path / "forged"
    build(forged, lambda log: history(log, {"a": "b", "b": "a"}), log_id_of(path))
    alone, problems = verdicts(forged, note, key)
    assert alone and problems and "not those the checkpoint signed" in problems[0]


def backdate(path: Path, seq: int, by_ns: int) -> None:
    """Move event ``seq`` back in time and reseal: the chain after it, the session states, the tree."""
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        events, index = env.open_db(b"events", txn=txn), env.open_db(b"index", txn=txn)
        prev = bytes(32)
        last: dict[int, bytes] = {}
        for key, raw in list(txn.cursor(db=events)):
            s = SEQ.unpack(key)[0]
            _, t, kind, number, before = HEADER.unpack_from(raw)
            raw = HEADER.pack(prev, t - by_ns if s == seq else t, kind, number, before) + raw[HEADER.size :]
            txn.put(key, raw, db=events)
            prev = last[number] = event_hash(s, raw)
        for number, digest in last.items():
            state = SessionState.unpack(number, txn.get(state_key(number), db=index))
            state.last_hash = digest
            txn.put(state_key(number), state.pack(), db=index)
            assert len(state.pack()) == STATE.size
    env.close()
    with EventLog.open(path) as log:  # the forger rebuilds the tree the library's way
        log._store.write(log._store.tree.rebuild)


def test_a_backdated_event_is_caught_by_the_checkpoint(genuine, key):
    path, note = genuine
    backdate(path, 3, by_ns=3600 * 10**9)
    alone, problems = verdicts(path, note, key)
    assert alone and problems and "not those the checkpoint signed" in problems[0]


def test_a_key_holder_signing_a_forked_history_is_caught_by_consistency(genuine, key, tmp_path):
    path, published = genuine  # published earlier: a witness, a second host, a file elsewhere
    forged = tmp_path / "forged"
    build(forged, lambda log: history(log, {}, secret="the transfer was 10 EUR"), log_id_of(path))
    with EventLog.open(forged) as log:
        log.flush("a", [user("pay alice"), assistant("the transfer was 10 EUR"), user("thanks"), user("more")])
        forked = log.checkpoint([key])  # the key holder signs the forged history
        # Signed by the trusted key, so the forged log passes against its own checkpoint ...
        assert log.verify(checkpoints=[forked], keys=[key.verifier()]).ok
        # ... but it cannot show that it extends the checkpoint published before.
        with pytest.raises(AuditError, match="not this log's"):
            log.prove_consistency(published, forked)
        old = Checkpoint.parse(split_note(published)[0])
        # Whatever proof the forger computes from its own tree fails against the published root.
        with log._store.read() as txn:
            proof = log._store.tree.consistency(txn, old.size, log.tree_size())
    new = open_checkpoint(forked, [key.verifier()])
    with pytest.raises(ProofError, match="old root"):
        verify_consistency(old.size, new.size, old.root, new.root, proof)
    # Mutation check: a witness that checked signatures only, not consistency, accepts the fork.
    assert open_checkpoint(forked, [key.verifier()]).size == new.size


def test_the_tree_check_in_verify_catches_a_tampered_tree_and_fails_when_disabled(genuine, monkeypatch):
    path, _ = genuine
    env = lmdb.open(str(path), max_dbs=8)
    with env.begin(write=True) as txn:
        tree = env.open_db(b"tree", txn=txn)
        key = next(iter(txn.cursor(db=tree)))[0]
        txn.put(key, bytes(32), db=tree)
    env.close()
    with EventLog.open(path, readonly=True) as log:
        assert "the Merkle tree differs from the events" in str(log.verify().problems)
        from eventlog import verify as verify_module

        monkeypatch.setattr(verify_module._TreeCheck, "add", lambda self, seq, raw, event: None)
        monkeypatch.setattr(verify_module._TreeCheck, "finish", lambda self: None)
        assert log.verify().ok  # the mechanism disabled, the tampered tree goes unnoticed
