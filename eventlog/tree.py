"""The log's Merkle tree: one leaf per event, kept in LMDB in the same transaction as the events.

Leaf ``seq - 1`` of the tree is event ``seq``; its leaf input is the event's
*commitment* (:func:`leaf_input`), computed from the stored event: its place (seq,
time, kind, session, the session's previous event) and a commitment to its payload in
which every message appears salted (:func:`eventlog.verifier.message_commitment`).  The
tree therefore never changes when a message's content is erased: a redaction rewrites
the stored bytes, never the commitments, and every checkpoint signed before it, every
proof of another message, still verifies.

The ``tree`` database holds every *complete* node of the tree (RFC 9162 shape), keyed
by the index of the last leaf it covers, then its level: ``SEQ(last leaf) + level
byte`` -> 32-byte hash.  The nodes a new leaf completes all cover it last, so every put
is an append at the database's right edge, about two per event.  The tree's size is
the last key's leaf index plus one.  Every other hash a root or a proof needs is
computed from these (:func:`eventlog.merkle.subtree_hash`).

The tree is derived: :meth:`Tree.extend` brings it up to the events in the open write
transaction (the commit calls it after the writes and before committing), so a log
written before the tree existed gets it on the first write, and :meth:`Tree.rebuild`
recomputes it from the events alone.  ``verify()`` compares it node for node.
"""

from __future__ import annotations

from collections.abc import Iterator
from hashlib import sha256
from typing import Any, assert_never

import lmdb
import msgspec

from . import codec
from . import events as ev
from .errors import CorruptLogError
from .keys import HEADER, SEQ
from .merkle import Frontier, NodeGetter, consistency_proof, inclusion_proof, subtree_hash
from .verifier import (
    EMPTY_ROOT,
    SALT_SIZE,
    appended_commitment,
    carried_commitment,
    event_leaf,
    leaf_hash,
    message_commitment,
)

TREE_DB = b"tree"
CHECKPOINTS_DB = b"checkpoints"
"""Signed checkpoints the log issued: ``SEQ`` tree size -> the note (UTF-8)."""

_ENCODE = msgspec.msgpack.Encoder(order="deterministic")


def node_key(level: int, index: int) -> bytes:
    """The key of the complete node at ``level`` covering leaves ``index * 2**level ..``."""
    return SEQ.pack(((index + 1) << level) - 1) + bytes((level,))


def override_digest(override: dict[str, Any] | None) -> bytes | None:
    """SHA-256 of a display override's canonical bytes (None without one)."""
    return None if override is None else sha256(codec.encode(override)).digest()


class AppendedLeaf(msgspec.Struct, tag=2, tag_field="k", frozen=True, kw_only=True):
    """What the tree reads of a stored :class:`~eventlog.events.MessagesAppended`: every field
    but the bodies and node digests, which it does not commit to (decoding a bulk flush's event
    this way makes no object per body)."""

    session: str
    position: int
    digests: bytes
    carried: dict[int, tuple[int, int]] = {}
    overrides: dict[int, dict[str, Any]] = {}
    summaries: int = 0
    salts: bytes = b""
    sealed: dict[int, bytes] = {}

    def __len__(self) -> int:
        return len(self.digests) // 32

    def digest(self, i: int) -> bytes:
        return self.digests[32 * i : 32 * i + 32]


_APPENDED = ev.KIND[ev.MessagesAppended]
_leaf_decoder = msgspec.msgpack.Decoder(AppendedLeaf)
_NO_OVERRIDE = bytes(32)


def salt_of(event: ev.MessagesAppended | AppendedLeaf, i: int) -> bytes:
    return event.salts[SALT_SIZE * i : SALT_SIZE * i + SALT_SIZE]


def commitments(event: ev.MessagesAppended | AppendedLeaf) -> list[bytes]:
    """The commitment of each message of an append, as the tree sees it."""
    sealed, carried, overrides = event.sealed, event.carried, event.overrides
    if not (sealed or carried or overrides):
        # The common append (every import): message_commitment(salt, digest) of each, in one pass.
        salts, digests, none, size = event.salts, event.digests, _NO_OVERRIDE, SALT_SIZE
        return [
            sha256(b"M" + salts[size * i : size * i + size] + digests[32 * i : 32 * i + 32] + none).digest()
            for i in range(len(event))
        ]
    out = []
    for i in range(len(event)):
        if i in sealed:
            out.append(sealed[i])
        elif i in carried:
            out.append(carried_commitment(*carried[i]))
        else:
            out.append(message_commitment(salt_of(event, i), event.digest(i), override_digest(overrides.get(i))))
    return out


def payload_commitment(event: ev.AnyEvent | AppendedLeaf) -> bytes:
    """What the tree commits to of an event's payload: nothing unsalted that a message's content determines."""
    match event:
        case ev.MessagesAppended() | AppendedLeaf():
            return appended_commitment(event.position, event.summaries, commitments(event))
        case ev.MessagesTombstoned():
            # The node digests are derived from content: the count and the reason stand for them.
            sealed: Any = (event.session, event.position, event.count, event.reason)
        case ev.MessageAnnotated():
            note = event.sealed or message_commitment(event.salt, override_digest(event.override) or b"", None)
            sealed = (event.session, event.position, note)
        case ev.SessionOpened():
            sealed = (event.session, event.source, event.at)
        case ev.SessionClosed() | ev.SessionUpdated() | ev.MessageRedacted():
            sealed = event
        case _:
            assert_never(event)
    return sha256(b"E" + _ENCODE.encode(sealed)).digest()


def leaf_input(seq: int, raw: bytes | bytearray | memoryview, event: ev.AnyEvent | None = None) -> bytes:
    """The leaf input of stored event ``seq`` (``raw``: envelope and payload)."""
    if len(raw) < HEADER.size:
        raise CorruptLogError(f"event {seq} is shorter than its envelope")
    _, time_ns, kind, number, before = HEADER.unpack_from(raw)
    read: ev.AnyEvent | AppendedLeaf | None = event
    if read is None:
        payload = memoryview(raw)[HEADER.size :]
        try:
            read = _leaf_decoder.decode(payload) if kind == _APPENDED else None
        except msgspec.DecodeError:
            read = None  # not what its kind says: decoded as whatever it is, as every reader does
        if read is None:
            try:
                read = ev.decoder.decode(payload)
            except msgspec.DecodeError as e:
                raise CorruptLogError(f"event {seq} cannot be decoded ({e})") from e
    return event_leaf(seq, time_ns, kind, number, before, read.session, payload_commitment(read))


class Tree:
    """The ``tree`` database of one environment."""

    def __init__(self, path: str, db: lmdb._Database | None, events: lmdb._Database) -> None:
        self.path = path
        self._db = db
        self.events = events
        self._emitted: dict[int, tuple[bytes, bytes, bytes]] = {}
        """Leaf inputs of events this process wrote since the last :meth:`extend`, as their
        writer computed them: seq -> (the previous event's hash, the event's hash, leaf input)."""

    def emitted(self, seq: int, previous: bytes, digest: bytes, leaf: bytes) -> None:
        """Note the leaf input of event ``seq`` (hash ``digest``, after the event hashed
        ``previous``) as its writer computed it, so that :meth:`extend` need not read the
        event back; it takes it only for an event whose stored hash it can vouch for."""
        self._emitted[seq] = (previous, digest, leaf)

    @property
    def exists(self) -> bool:
        """False for a log opened read-only that predates the tree (format 1)."""
        return self._db is not None

    @property
    def db(self) -> lmdb._Database:
        if self._db is None:
            raise CorruptLogError(f"{self.path}: the log predates its Merkle tree; run `eventlog migrate`")
        return self._db

    def size(self, txn: lmdb.Transaction) -> int:
        """How many leaves (events) the stored tree has."""
        if self._db is None:
            return 0
        cursor = txn.cursor(db=self.db)
        if not cursor.last():
            return 0
        key = cursor.key()
        if len(key) != SEQ.size + 1:
            raise CorruptLogError(f"{self.path}: the tree has a malformed key (run verify)")
        return SEQ.unpack(key[:8])[0] + 1

    def getter(self, txn: lmdb.Transaction) -> NodeGetter:
        db, path = self.db, self.path

        def get(level: int, index: int) -> bytes:
            found = txn.get(node_key(level, index), db=db)
            if found is None or len(found) != 32:
                raise CorruptLogError(f"{path}: tree node {level}/{index} is missing or damaged (run verify)")
            return bytes(found)

        return get

    def extend(self, txn: lmdb.Transaction, tip: tuple[int, bytes] | None = None) -> int:
        """Add a leaf for every event of ``txn`` the tree does not have yet; return the new size.

        ``tip``: the seq and hash of the last event ``txn`` wrote, as its writer computed them.
        The newest events are then taken as noted by :meth:`emitted`, without reading them
        back, as far down as the hashes vouch for them: the last one's must be ``tip``'s, each
        one below it the hash its successor was chained to.  (An event's hash covers its bytes,
        those of its envelope included, so an event written again or never committed, in a
        nested transaction that was undone, cannot pass.)  Every other event is read."""
        emitted, self._emitted = self._emitted, {}
        size = self.size(txn)
        cursor = txn.cursor(db=self.events)
        if not cursor.last():
            return size
        last = SEQ.unpack(cursor.key())[0]
        if last <= size:
            if last < size:
                raise CorruptLogError(f"{self.path}: the tree has {size} leaves but the log {last} events")
            return size
        vouched: list[bytes] = []  # leaf inputs of events last, last - 1, ...
        if tip is not None and tip[0] == last and emitted:
            expected, seq = tip[1], last
            for key in cursor.iterprev(keys=True, values=False):
                entry = emitted.get(seq)
                if seq <= size or key != SEQ.pack(seq) or entry is None or entry[1] != expected:
                    break
                vouched.append(entry[2])
                expected, seq = entry[0], seq - 1
        read_up_to = last - len(vouched)
        frontier = Frontier.load(self.getter(txn), size)
        put, db = txn.put, self.db
        if read_up_to > size:
            if not cursor.set_key(SEQ.pack(size + 1)):
                raise CorruptLogError(f"{self.path}: event {size + 1} is missing")
            for key, raw in cursor:
                seq = SEQ.unpack(key)[0]
                if seq != frontier.size + 1:
                    raise CorruptLogError(f"{self.path}: events jump from {frontier.size} to {seq}")
                try:
                    leaf = leaf_input(seq, raw)
                except CorruptLogError as e:
                    raise CorruptLogError(f"{self.path}: {e}") from None
                for level, index, h in frontier.append(leaf_hash(leaf)):
                    put(node_key(level, index), h, db=db, append=True)
                if seq == read_up_to:
                    break
        for leaf in reversed(vouched):
            for level, index, h in frontier.append(leaf_hash(leaf)):
                put(node_key(level, index), h, db=db, append=True)
        return frontier.size

    def rebuild(self, txn: lmdb.Transaction) -> int:
        """Recompute the whole tree from the events; return its size."""
        txn.drop(self.db, delete=False)
        self._emitted = {}
        return self.extend(txn)

    def root(self, txn: lmdb.Transaction, size: int | None = None) -> tuple[int, bytes]:
        """``(size, root hash)`` of the tree at ``size`` leaves (default: all of it)."""
        full = self.size(txn)
        size = full if size is None else size
        if not 0 <= size <= full:
            raise ValueError(f"the tree has {full} leaves, not {size}")
        return size, (subtree_hash(self.getter(txn), 0, size) if size else EMPTY_ROOT)

    def inclusion(self, txn: lmdb.Transaction, seq: int, size: int) -> list[bytes]:
        return inclusion_proof(self.getter(txn), seq - 1, size)

    def consistency(self, txn: lmdb.Transaction, old: int, new: int) -> list[bytes]:
        return consistency_proof(self.getter(txn), old, new)

    def nodes(self, txn: lmdb.Transaction) -> Iterator[tuple[bytes, bytes]]:
        for key, value in txn.cursor(db=self.db):
            yield bytes(key), bytes(value)


def expected_nodes(leaves: list[bytes]) -> dict[bytes, bytes]:
    """Every stored node of the tree over ``leaves`` (leaf hashes), as :class:`Tree` keys them."""
    out = {}
    frontier = Frontier()
    for leaf in leaves:
        for level, index, h in frontier.append(leaf):
            out[node_key(level, index)] = h
    return out
