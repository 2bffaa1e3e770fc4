"""Upgrading a log written in an earlier format, in place, in one write transaction.

Format 1 stored messages unsalted and had no Merkle tree.  Format 2 gives every stored
message (and display override) a random salt, so that the tree commits to salted
content and a later redaction leaves nothing that confirms a guess of what was erased,
and keeps the tree (:mod:`eventlog.tree`).  The upgrade

1. adds salts to every event that stores messages or an override, re-encoding those
   payloads (bodies are copied byte for byte: content and node digests do not change);
2. rewrites the envelope hash chain from the first changed event on, and the hash of
   each session's last event in its state;
3. builds the tree from the events, and records the new format.

It runs when a format 1 log is first opened for writing (``eventlog migrate`` does just
that); a read-only open reads a format 1 log as before but cannot verify a tree.  The
whole upgrade is one transaction: it lands whole or not at all.  Checkpoints do not
exist before it, so none is invalidated.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Final

import lmdb
import msgspec

from . import events as ev
from .errors import CorruptLogError
from .keys import FORMAT, HEADER, SEQ, STATE, SessionState, event_hash, state_key
from .verifier import SALT_SIZE

if TYPE_CHECKING:
    from .store import Store

UPGRADABLE: Final = (b"1",)


def upgrade(store: Store, txn: lmdb.Transaction, fmt: bytes) -> int:
    """Bring the log in ``txn`` from format ``fmt`` to the current one; return the events rewritten."""
    if fmt not in UPGRADABLE:
        raise CorruptLogError(f"{store.path}: cannot upgrade a log of format {fmt!r}")
    rewritten = 0
    prev = bytes(32)
    last_hash: dict[int, tuple[int, bytes]] = {}  # session number -> (seq, hash) of its last event
    changed = False
    cursor = txn.cursor(db=store.events)
    updates: list[tuple[bytes, bytes]] = []
    for key, raw in cursor:
        seq = SEQ.unpack(key)[0]
        if len(raw) < HEADER.size:
            raise CorruptLogError(f"{store.path}: event {seq} is truncated; repair the log before upgrading it")
        _, time_ns, kind, number, before = HEADER.unpack_from(raw)
        payload = bytes(raw[HEADER.size :])
        event = ev.decoder.decode(payload)
        salted = _salted(event)
        if salted is not None:
            payload = ev.encoder.encode(salted)
            changed = True
        if changed:
            raw = HEADER.pack(prev, time_ns, kind, number, before) + payload
            updates.append((bytes(key), raw))
            rewritten += 1
        prev = event_hash(seq, raw)
        last_hash[number] = (seq, prev)
    for key, raw in updates:
        txn.put(key, raw, db=store.events)
    for number, (seq, digest) in last_hash.items():
        state_raw = txn.get(state_key(number), db=store.index)
        if state_raw is None or len(state_raw) != STATE.size:
            continue  # verify reports it; the upgrade leaves damage as it found it
        state = SessionState.unpack(number, state_raw)
        if state.last_seq == seq:
            state.last_hash = digest
            txn.put(state_key(number), state.pack(), db=store.index)
    store.tree.rebuild(txn)
    txn.put(b"format", FORMAT, db=store.meta)
    return rewritten


def _salted(event: ev.AnyEvent) -> ev.AnyEvent | None:
    if isinstance(event, ev.MessagesAppended) and len(event.salts) != SALT_SIZE * len(event):
        return msgspec.structs.replace(event, salts=os.urandom(SALT_SIZE * len(event)))
    if isinstance(event, ev.MessageAnnotated) and not event.salt and not event.sealed:
        return msgspec.structs.replace(event, salt=os.urandom(SALT_SIZE))
    return None
