"""Checkpoints and proofs of a log: what ``eventlog checkpoint``, ``prove`` and ``verify --checkpoint`` do.

A checkpoint is a C2SP ``tlog-checkpoint`` signed note: the log's origin line, the tree
size (the number of events) and the root hash of the Merkle tree at that size
(:mod:`eventlog.tree`), signed with Ed25519 (:mod:`eventlog.signing`).  The log keeps
every checkpoint it issued in its ``checkpoints`` database; what makes one useful is a
copy kept somewhere the log's host cannot change.

Proofs are JSON documents that :mod:`eventlog.verifier` checks with nothing but the
proof and a verifier key (formats in ``docs/audit.md``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Sequence
from typing import Any

from . import codec
from . import events as ev
from .errors import EventLogError
from .keys import HEADER, SEQ
from .signing import Signer, sign_note
from .store import Store
from .tree import commitments, salt_of
from .verifier import (
    CONSISTENCY_FORMAT,
    PROOF_FORMAT,
    Checkpoint,
    ProofError,
    Verifier,
    open_checkpoint,
    split_note,
)


class AuditError(EventLogError, ValueError):
    """A checkpoint or proof that cannot be made or does not fit this log."""


def default_origin(log_id: bytes) -> str:
    """The origin line of a log's checkpoints unless one is given: ``eventlog/<log id>``."""
    return f"eventlog/{log_id.hex()}"


def parse_checkpoint(note: str) -> Checkpoint:
    """The checkpoint a note carries, signatures unchecked (for finding what to prove)."""
    try:
        text, _ = split_note(note)
        return Checkpoint.parse(text)
    except ProofError as e:
        raise AuditError(f"not a checkpoint: {e}") from None


def checkpoint(store: Store, signers: Sequence[Signer], *, origin: str | None = None) -> str:
    """Sign the tree as it is now and store the note in the log; return the note.

    A checkpoint at a size the log already signed adds the new signatures to that
    note (cosigning, or a second key during a rotation).
    """
    if not signers:
        raise AuditError("a checkpoint needs at least one signer")
    with store.read() as txn:
        size, root = store.tree.root(txn)
    if size == 0:
        raise AuditError(f"{store.path}: the log has no events to checkpoint")
    text = Checkpoint(origin or default_origin(store.log_id), size, root).text()
    note = sign_note(text, list(signers))  # outside any transaction: a signer may be slow

    def keep(txn: Any) -> str:
        found = txn.get(SEQ.pack(size), db=store.checkpoints)
        out = note
        if found is not None:
            old = bytes(found).decode("utf-8")
            if split_note(old)[0] == text:
                out = sign_note(text, [], existing=old) + "".join(note.split("\n\n", 1)[1:])
        txn.put(SEQ.pack(size), out.encode("utf-8"), db=store.checkpoints)
        return out

    return store.write(keep)


def checkpoints(store: Store) -> list[str]:
    """Every checkpoint the log issued, oldest first."""
    if store.checkpoints is None:
        return []
    with store.read() as txn:
        return [bytes(v).decode("utf-8") for v in txn.cursor(db=store.checkpoints).iternext(keys=False)]


def _matching(store: Store, txn: Any, note: str) -> Checkpoint:
    cp = parse_checkpoint(note)
    size = store.tree.size(txn)
    if cp.size > size:
        raise AuditError(f"the checkpoint is of {cp.size} events; this log has {size} (an older copy, or another log)")
    if store.tree.root(txn, cp.size)[1] != cp.root:
        raise AuditError(f"the checkpoint's root is not this log's at {cp.size} events (another log, or a rewrite)")
    return cp


def prove(store: Store, session_id: str, position: int, note: str) -> dict[str, Any]:
    """A proof that the live message at ``position`` of ``session_id`` is in the checkpointed log."""
    with store.read() as txn:
        cp = _matching(store, txn, note)
        state = store.session(txn, session_id)
        if state is None:
            raise AuditError(f"no session {session_id!r}")
        if not 0 <= position < state.length:
            raise AuditError(f"session {session_id!r} has {state.length} live messages; no position {position}")
        _node, _digest, seq, index = store.link(txn, state.number, position)
        if seq > cp.size:
            raise AuditError(
                f"the message is in event {seq}, after the checkpoint's {cp.size} events: sign a newer checkpoint"
            )
        raw = store.raw_event(txn, seq)
        if raw is None:
            raise AuditError(f"event {seq} is missing (run verify)")
        raw = bytes(raw)
        event = store.decode(seq, raw)
        if not isinstance(event, ev.MessagesAppended):
            raise AuditError(f"event {seq} holds no messages (run verify)")
        if index in event.sealed:
            raise AuditError(f"message {position} of session {session_id!r} was redacted: its content is gone")
        _, time_ns, kind, number, before = HEADER.unpack_from(raw)
        committed: list[str | None] = [c.hex() for c in commitments(event)]
        committed[index] = None
        override = event.overrides.get(index)
        canonical = bytes(event.bodies[index])
        path = store.tree.inclusion(txn, seq, cp.size)
    return {
        "format": PROOF_FORMAT,
        "log_id": store.log_id.hex(),
        "session": session_id,
        "position": position,
        "checkpoint": note,
        "event": {
            "seq": seq,
            "time_ns": time_ns,
            "kind": kind,
            "session": event.session,
            "number": number,
            "before": before,
            "position": event.position,
            "summaries": event.summaries,
            "commitments": committed,
        },
        "message": {
            "index": index,
            "content": codec.decode(canonical),
            "canonical": base64.b64encode(canonical).decode(),
            "salt": salt_of(event, index).hex(),
            "override_canonical": None if override is None else base64.b64encode(codec.encode(override)).decode(),
        },
        "inclusion": [h.hex() for h in path],
    }


def prove_consistency(store: Store, old_note: str, new_note: str) -> dict[str, Any]:
    """A proof that the log at the ``old_note`` checkpoint is a prefix of the log at ``new_note``."""
    with store.read() as txn:
        old, new = _matching(store, txn, old_note), _matching(store, txn, new_note)
        if old.size > new.size:
            raise AuditError(f"the old checkpoint ({old.size} events) is newer than the new one ({new.size})")
        path = store.tree.consistency(txn, old.size, new.size) if old.size else []
    return {
        "format": CONSISTENCY_FORMAT,
        "log_id": store.log_id.hex(),
        "old": old_note,
        "new": new_note,
        "consistency": [h.hex() for h in path],
    }


def check_checkpoints(store: Store, txn: Any, notes: Iterable[str], verifiers: Sequence[Verifier]) -> list[str]:
    """What is wrong with the log against trusted checkpoints (empty when nothing is)."""
    problems = []
    size = store.tree.size(txn) if store.tree.exists else 0
    for note in notes:
        try:
            cp = open_checkpoint(note, verifiers)
        except ProofError as e:
            problems.append(f"checkpoint: {e}")
            continue
        if cp.size > size:
            problems.append(
                f"checkpoint: the log has {size} events, fewer than the {cp.size} the checkpoint signed "
                "(rolled back to an older copy, or events deleted)"
            )
        elif store.tree.root(txn, cp.size)[1] != cp.root:
            problems.append(
                f"checkpoint: the log's first {cp.size} events are not those the checkpoint signed "
                "(history rewritten, events deleted, reordered or backdated)"
            )
    return problems
