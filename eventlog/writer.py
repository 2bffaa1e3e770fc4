"""The write transactions of the log: what each write appends, and the indexes it keeps.

Every method here runs inside one LMDB write transaction handed to it by
:meth:`eventlog.store.Store.write` (which may run it again after growing the map,
or inside a nested transaction of a group commit), so none has side effects
outside the transaction.  Validation and hashing happen before, in
:mod:`eventlog.log` and :mod:`eventlog.snapshot`.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgspec

from . import codec
from . import events as ev
from .codec import ZERO, node_digest
from .errors import ConflictError, CorruptLogError, HistoryMismatchError, UnknownSessionError
from .keys import LINK, SEQ, SessionState, chain_entries, chain_key, note_key, pairs, redaction_key
from .redact import sealed_stand_in
from .snapshot import Prepared, bodies_from
from .store import Batch, Store
from .verifier import SALT_SIZE

EMPTY_HEAD = "0" * 64
"""``expected_head`` value meaning "the session must be empty (or not exist yet)"."""

SUMMARY_KEY = "_compressed_summary"
"""A truthy value under this (process-local) key marks a message as a compaction summary."""

EVENT_MESSAGES = 1024
"""At most this many messages per ``MessagesAppended`` event (a large flush writes several,
in one transaction), so that readers and projections handle events of bounded size."""


@dataclass(slots=True)
class Snapshot:
    """One session's part of a flush: its list as prepared, and what the caller asked of the write.

    ``notes`` are display overrides keyed by position in the stored transcript; ``expected``
    the head the caller read (None: any); ``replace`` allows replacing a transcript the list
    shares nothing with (reason ``clear``).
    """

    session_id: str
    prepared: Prepared
    notes: dict[int, dict[str, Any]]
    expected: bytes | None = None
    replace: bool = False


@dataclass(slots=True)
class NewMessages:
    """Messages one write makes live, per message: body, content digest and node digest.

    A carried message (its body already stored) has an empty body and its location in
    ``carried`` (index -> ``(seq, index)``); ``notes`` are display overrides by index, and
    the first ``summaries`` messages are compaction summaries.
    """

    bodies: list[bytes]
    digests: list[bytes]
    nodes: list[bytes]
    carried: dict[int, tuple[int, int]] = field(default_factory=dict)
    notes: dict[int, dict[str, Any]] = field(default_factory=dict)
    summaries: int = 0

    def part(self, start: int, stop: int) -> NewMessages:
        """Messages ``start .. stop-1``, indexes counted from ``start``."""
        if start == 0 and stop >= len(self.nodes):
            return self
        return NewMessages(
            self.bodies[start:stop],
            self.digests[start:stop],
            self.nodes[start:stop],
            {i - start: where for i, where in self.carried.items() if start <= i < stop},
            {i - start: note for i, note in self.notes.items() if start <= i < stop},
            max(0, min(self.summaries - start, stop - start)),
        )


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What a write did.

    ``appended``: messages written; ``tombstoned``: live messages that left the
    transcript; ``unchanged``: leading messages already stored; ``head``: the
    session's head node digest (64 lowercase hex) or ``None`` when it is empty.
    """

    appended: int
    tombstoned: int
    unchanged: int
    head: str | None
    seq: int = 0
    """The seq of the last event this write stored (0 when it stored none): a receipt to
    ask for a proof with later (``eventlog prove``, once a checkpoint covers it)."""


def _kept_notes(
    old_notes: dict[int, tuple[bytes, dict[str, Any]]],
    old_digests: list[bytes],
    k: int,
    digests: list[bytes],
    length: int,
) -> dict[int, dict[str, Any]]:
    """The display overrides that tombstoned positions ``k..`` (content ``old_digests``) hand
    on to the messages that come back at new positions ``k..length-1`` (content ``digests``).

    A message found at its old position keeps that position's override (an edit elsewhere);
    the others take, in order, the overrides of the remaining old positions with the same
    content (a compaction's tail moves up).  So two equal messages never trade or share an
    override.
    """
    kept: dict[int, dict[str, Any]] = {}
    matched: set[int] = set()
    for position in range(k, min(length, k + len(old_digests))):
        if digests[position] == old_digests[position - k]:
            matched.add(position)
            if position in old_notes:
                kept[position] = old_notes[position][1]
    waiting: dict[bytes, deque[int]] = {}
    for offset, digest in enumerate(old_digests):
        if k + offset not in matched:
            waiting.setdefault(digest, deque()).append(k + offset)
    for position in range(k, length):
        if position not in matched and (queue := waiting.get(digests[position])):
            old = queue.popleft()
            if old in old_notes:
                kept[position] = old_notes[old][1]
    return kept


def _head_hex(length: int, head: bytes) -> str | None:
    return head.hex() if length else None


class Writer:
    """The transaction bodies of every write, over one :class:`~eventlog.store.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def append(self, txn: lmdb.Transaction, session_id: str, prepared: Prepared, expected: bytes | None) -> FlushResult:
        """Append ``prepared`` after the head; a retry that already follows ``expected`` writes nothing."""
        state = self.store.session(txn, session_id)
        length = state.length if state else 0
        head = state.head if state else ZERO
        if expected is not None and expected != head:
            found = self.find_retry(txn, state, expected, prepared)
            if found is not None:
                return FlushResult(0, 0, found, _head_hex(length, head))
            raise ConflictError(
                f"session {session_id!r}: head is {_head_hex(length, head) or EMPTY_HEAD}, "
                f"not the expected {expected.hex()}"
            )
        if not prepared.bodies:
            return FlushResult(0, 0, length, _head_hex(length, head))
        batch = Batch(self.store, txn)
        if state is None:
            state = self.open_session(batch, session_id)
        digests = prepared.digests
        nodes = chain(head, digests)
        self.append_messages(batch, session_id, state, NewMessages(bodies_from(prepared, 0), digests, nodes))
        batch.save(session_id, state)
        return FlushResult(len(nodes), 0, length, state.head.hex(), seq=state.last_seq)

    def rewind(self, txn: lmdb.Transaction, session_id: str, to: int) -> FlushResult:
        """Tombstone the live messages from position ``to`` (reason ``rewind``)."""
        state = self.require(txn, session_id)
        if not isinstance(to, int) or isinstance(to, bool) or not 0 <= to <= state.length:
            raise ValueError(f"rewind to={to!r}: session {session_id!r} has {state.length} messages")
        if to == state.length:
            return FlushResult(0, 0, to, _head_hex(state.length, state.head))
        batch = Batch(self.store, txn)
        count = state.length - to
        self.tombstone(batch, session_id, state, to, "rewind")
        batch.save(session_id, state)
        return FlushResult(0, count, to, _head_hex(state.length, state.head), seq=state.last_seq)

    def compact(
        self, txn: lmdb.Transaction, session_id: str, start: int, end: int, prepared: Prepared, expected: bytes | None
    ) -> FlushResult:
        """Replace ``[start, end)`` with the summary and carry everything after ``end``."""
        state = self.require(txn, session_id)
        seen = state.length
        if expected is not None:
            found = self.position_of(txn, state, expected)
            if found is None:
                raise ConflictError(
                    f"session {session_id!r}: expected head {expected.hex()} is not in the live transcript"
                )
            seen = found
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= seen):
            raise ValueError(f"compact start={start!r}, end={end!r}: must satisfy 0 <= start <= end <= {seen}")
        batch = Batch(self.store, txn)
        length = state.length
        tail = self.store.links(txn, state.number, end, length)
        old_notes = self.notes_in(txn, state.number, end, length)
        self.tombstone(batch, session_id, state, start, "compaction")
        digests = prepared.digests + [link[1] for link in tail]
        nodes = chain(state.head, digests)
        bodies = bodies_from(prepared, 0) + [b""] * len(tail)
        carried = {len(prepared.bodies) + i: (link[2], link[3]) for i, link in enumerate(tail)}
        notes = {
            len(prepared.bodies) + i: old_notes[end + i]
            for i, link in enumerate(tail)
            if end + i in old_notes and old_notes[end + i][0] == link[0]
        }
        kept = {i: note for i, (_, note) in notes.items()}
        self.append_messages(
            batch, session_id, state, NewMessages(bodies, digests, nodes, carried, kept, len(prepared.bodies))
        )
        batch.save(session_id, state)
        return FlushResult(len(nodes), length - start, start, _head_hex(state.length, state.head), seq=state.last_seq)

    def fork(self, txn: lmdb.Transaction, source_id: str, new_id: str, at: int | None) -> FlushResult:
        """Open ``new_id`` with a copy of the source's chain entries for its first ``at`` messages."""
        source = self.require(txn, source_id)
        if self.store.session(txn, new_id) is not None:
            raise ConflictError(f"cannot fork into {new_id!r}: that session already exists")
        shared = source.length if at is None else at
        if not isinstance(shared, int) or isinstance(shared, bool) or not 0 <= shared <= source.length:
            raise ValueError(f"fork at={at!r}: session {source_id!r} has {source.length} messages")
        links = self.store.links(txn, source.number, 0, shared)
        head = links[-1][0] if links else ZERO
        batch = Batch(self.store, txn)
        state = self.open_session(batch, new_id, source=source_id, at=shared, source_head=head if links else None)
        for position, link in enumerate(links):
            txn.put(chain_key(state.number, position), LINK.pack(*link), db=self.store.index)
        for position, (node, note) in self.notes_in(txn, source.number, 0, shared).items():
            txn.put(note_key(state.number, position), node + codec.encode(note), db=self.store.index)
        state.length = shared
        state.head = head
        batch.save(new_id, state)
        return FlushResult(0, 0, shared, _head_hex(shared, head), seq=state.last_seq)

    def update(
        self, txn: lmdb.Transaction, session_id: str, plain: dict[str, Any], counters: dict[str, float | int]
    ) -> None:
        """Record session metadata (opening the session when it is new)."""
        batch = Batch(self.store, txn)
        state = self.store.session(txn, session_id) or self.open_session(batch, session_id)
        batch.emit(ev.SessionUpdated(session=session_id, fields=plain, counters=counters), state)
        batch.save(session_id, state)

    def close(self, txn: lmdb.Transaction, session_id: str, reason: str) -> None:
        """Record the end of the session."""
        state = self.require(txn, session_id)
        batch = Batch(self.store, txn)
        batch.emit(ev.SessionClosed(session=session_id, reason=reason), state)
        state.closed = True
        batch.save(session_id, state)

    def require(self, txn: lmdb.Transaction, session_id: str) -> SessionState:
        state = self.store.session(txn, session_id)
        if state is None:
            raise UnknownSessionError(f"no session {session_id!r} in {self.store.path}")
        return state

    def holds(self, txn: lmdb.Transaction, state: SessionState | None, snapshot: Snapshot) -> bool:
        """Whether the stored transcript is ``snapshot`` already, display overrides included."""
        nodes = snapshot.prepared.nodes
        if state is None:
            return not nodes
        return (
            len(nodes) == state.length
            and (not nodes or nodes[-1] == state.head)
            and not self.pending_notes(txn, state, snapshot.notes, snapshot.prepared)
        )

    def pending_notes(
        self, txn: lmdb.Transaction, state: SessionState, notes: dict[int, dict[str, Any]], prepared: Prepared
    ) -> dict[int, dict[str, Any]]:
        """The overrides for stored positions that differ from what is recorded.

        A redacted position takes no override: one the caller still holds for it is ignored,
        as the message it held there is (see :meth:`seal`)."""
        pending: dict[int, dict[str, Any]] = {}
        for position, note in notes.items():
            if position >= state.length:
                continue
            current = txn.get(note_key(state.number, position), db=self.store.index)
            wanted = prepared.nodes[position] + codec.encode(note)
            if current != wanted and not self.redacted_at(txn, state, position):
                pending[position] = note
        return pending

    def redacted_any(self, txn: lmdb.Transaction) -> bool:
        """Whether the log holds any redacted message (one cheap look, before a flush looks closer)."""
        db = self.store.redactions
        return db is not None and txn.stat(db)["entries"] > 0

    def redacted_at(self, txn: lmdb.Transaction, state: SessionState, position: int) -> bool:
        if not self.redacted_any(txn):
            return False
        link = self.store.link(txn, state.number, position)
        return txn.get(redaction_key(link[2], link[3]), db=self.store.redactions) is not None

    def seal(self, txn: lmdb.Transaction, state: SessionState, prepared: Prepared, k: int) -> int:
        """The common prefix once redacted positions are sealed; ``k``: the prefix before.

        A caller may still hold a message that was redacted since it flushed it (it kept its
        list).  At a redacted live position where the stored chain and the list agree up to
        it, the list's message is taken as the placeholder it redacts to: its digest, body and
        every node after it in ``prepared`` become what they would be with the placeholder
        there.  So holding the old list neither diverges nor stores the erased content again,
        and the rest of the list is compared as usual (``prepared`` goes back to the cache
        as it is now, so later flushes compare the same way).
        """
        while k < min(state.length, len(prepared.nodes)):
            link = self.store.link(txn, state.number, k)
            message = codec.as_message(prepared.raw[prepared.kept[k]], prepared.kept[k])
            found = sealed_stand_in(self.store, txn, link, message)
            if found is None:
                return k
            prepared.bodies[k], prepared.digests[k] = found
            nodes, digests = prepared.nodes, prepared.digests
            parent = nodes[k - 1] if k else ZERO
            for j in range(k, len(nodes)):
                parent = nodes[j] = node_digest(parent, digests[j])
            k = self.common_prefix(txn, state, nodes)
        return k

    def notes_in(
        self, txn: lmdb.Transaction, number: int, start: int, stop: int
    ) -> dict[int, tuple[bytes, dict[str, Any]]]:
        """Recorded overrides for positions ``start..stop-1``: position -> (node, override)."""
        found: dict[int, tuple[bytes, dict[str, Any]]] = {}
        cursor = txn.cursor(db=self.store.index)
        if not cursor.set_range(note_key(number, start)):
            return found
        last = note_key(number, stop)
        for key, value in pairs(cursor):
            if key >= last:
                break
            try:
                found[SEQ.unpack(key[9:])[0]] = (value[:32], codec.decode(value[32:]))
            except (struct.error, msgspec.DecodeError):
                raise CorruptLogError(
                    f"{self.store.path}: a display override of session {number} is damaged (run verify)"
                ) from None
        return found

    def flush(self, txn: lmdb.Transaction, snapshot: Snapshot, now: int | None = None) -> FlushResult:
        """Make the stored live transcript equal to ``snapshot`` (see :meth:`EventLog.flush`).

        ``now``: the time of the events, when this is part of a larger write (one time marks
        one write for the projections, which never show readers part of one)."""
        session_id, prepared, notes = snapshot.session_id, snapshot.prepared, snapshot.notes
        expected, replace = snapshot.expected, snapshot.replace
        store = self.store
        state = store.session(txn, session_id)
        length = state.length if state else 0
        head = state.head if state else ZERO
        nodes = prepared.nodes
        k = self.common_prefix(txn, state, nodes)
        if state is not None and k < min(length, len(nodes)) and self.redacted_any(txn):
            k = self.seal(txn, state, prepared, k)
        annotate = self.pending_notes(txn, state, {p: n for p, n in notes.items() if p < k}, prepared) if state else {}
        if k == length == len(nodes) and not annotate:
            return FlushResult(0, 0, k, _head_hex(length, head))  # already stored
        if expected is not None and expected != head:
            raise ConflictError(
                f"session {session_id!r}: head is {_head_hex(length, head) or EMPTY_HEAD}, "
                f"not the expected {expected.hex()}"
            )
        summaries = leading_summaries(prepared, k)
        reason: ev.Reason | None = None
        if k < length:
            if k == 0 and not replace and not summaries:
                what = "is empty" if not nodes else "shares no prefix with it"
                raise HistoryMismatchError(
                    f"session {session_id!r} has {length} stored messages and the flushed list {what}; "
                    "pass replace=True to replace the transcript",
                    session=session_id,
                )
            if summaries:
                reason = "compaction"
            elif k == 0 and replace:
                reason = "clear"
            elif len(nodes) == length:
                reason = "edit"
            else:
                reason = "rewind"
        batch = Batch(store, txn, now)
        if state is None:
            state = self.open_session(batch, session_id)
        tombstoned = length - k
        # Bodies of tombstoned messages that come back (an early edit, a compaction's
        # tail) are referenced, not stored again: digest -> (seq, index).
        carry_from: dict[bytes, tuple[int, int]] = {}
        kept_notes: dict[int, dict[str, Any]] = {}  # new position -> the override it keeps
        if reason is not None:
            links = store.links(txn, state.number, k, length)
            for link in links:
                carry_from.setdefault(link[1], (link[2], link[3]))
            old_notes = self.notes_in(txn, state.number, k, length)
            if old_notes:
                kept_notes = _kept_notes(old_notes, [link[1] for link in links], k, prepared.digests, len(nodes))
            self.tombstone(batch, session_id, state, k, reason)
        if len(nodes) > k:
            carried: dict[int, tuple[int, int]] = {}
            batch_notes: dict[int, dict[str, Any]] = {}
            if not carry_from and not notes:  # the common case: nothing carried, no overrides
                bodies = bodies_from(prepared, k)
            else:
                bodies = []
                for i, position in enumerate(range(k, len(nodes))):
                    where = carry_from.get(prepared.digests[position])
                    if where is None:
                        bodies += bodies_from(prepared, position, position + 1)
                    else:
                        bodies.append(b"")
                        carried[i] = (where[0], where[1])
                    note = notes.get(position)
                    if note is None and where is not None:
                        note = kept_notes.get(position)  # a carried message keeps its display override
                    if note is not None:
                        batch_notes[i] = note
            self.append_messages(
                batch,
                session_id,
                state,
                NewMessages(bodies, prepared.digests[k:], nodes[k:], carried, batch_notes, summaries),
            )
        for position, note in sorted(annotate.items()):
            batch.emit(
                ev.MessageAnnotated(
                    session=session_id,
                    position=position,
                    node=nodes[position],
                    override=note,
                    salt=os.urandom(SALT_SIZE),
                ),
                state,
            )
            txn.put(note_key(state.number, position), nodes[position] + codec.encode(note), db=store.index)
        batch.save(session_id, state)
        return FlushResult(len(nodes) - k, tombstoned, k, _head_hex(state.length, state.head), seq=state.last_seq)

    def extend(
        self, txn: lmdb.Transaction, session_id: str, length: int, head: bytes, messages: NewMessages, now: int
    ) -> FlushResult | None:
        """Append ``messages`` to ``session_id`` if its stored transcript is still ``length``
        messages ending in node ``head``; None, with nothing written, if it is not.

        A flush that only extends the stored transcript, prepared in another process and
        committed by this one (:mod:`eventlog.relay`): node digests chain every message to
        those before it, so the head names the whole prefix the list was compared with.
        """
        state = self.store.session(txn, session_id)
        stored = (state.length, state.head) if state else (0, ZERO)
        if stored != (length, head):
            return None
        batch = Batch(self.store, txn, now)
        if state is None:
            state = self.open_session(batch, session_id)
        self.append_messages(batch, session_id, state, messages)
        batch.save(session_id, state)
        return FlushResult(len(messages.nodes), 0, length, _head_hex(state.length, state.head), seq=state.last_seq)

    def common_prefix(self, txn: lmdb.Transaction, state: SessionState | None, nodes: list[bytes]) -> int:
        """Length of the longest common prefix of ``nodes`` and the stored live chain.

        Node digests commit to their whole prefix, so equality at ``k`` implies
        equality before it: one lookup when nothing diverged, a binary search otherwise.
        """
        if state is None or state.length == 0 or not nodes:
            return 0
        length = state.length
        top = min(length, len(nodes))
        if top == length and nodes[length - 1] == state.head:
            return length
        link = self.store.link
        if link(txn, state.number, top - 1)[0] == nodes[top - 1]:
            return top
        lo, hi = 0, top - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if link(txn, state.number, mid - 1)[0] == nodes[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def open_session(
        self, batch: Batch, session_id: str, *, source: str | None = None, at: int = 0, source_head: bytes | None = None
    ) -> SessionState:
        number = batch.new_session_number()
        state = SessionState(number, 0, ZERO, 0, new=True)
        batch.emit(ev.SessionOpened(session=session_id, source=source, at=at, source_head=source_head), state)
        return state

    def tombstone(self, batch: Batch, session_id: str, state: SessionState, position: int, reason: ev.Reason) -> None:
        store, txn = self.store, batch.txn
        links = store.links(txn, state.number, position, state.length)
        batch.emit(
            ev.MessagesTombstoned(
                session=session_id, position=position, nodes=b"".join(link[0] for link in links), reason=reason
            ),
            state,
        )
        for offset in range(len(links)):
            txn.delete(chain_key(state.number, position + offset), db=store.index)
            txn.delete(note_key(state.number, position + offset), db=store.index)
        state.length = position
        state.head = store.link(txn, state.number, position - 1)[0] if position else ZERO

    def append_messages(self, batch: Batch, session_id: str, state: SessionState, messages: NewMessages) -> None:
        """Append ``messages`` as one event per :data:`EVENT_MESSAGES` (all in this transaction)."""
        for start in range(0, len(messages.nodes), EVENT_MESSAGES):
            self.append_event(batch, session_id, state, messages.part(start, start + EVENT_MESSAGES))

    def append_event(self, batch: Batch, session_id: str, state: SessionState, messages: NewMessages) -> None:
        """Append ``messages`` as one event and make them the live chain's new tail."""
        store, txn = self.store, batch.txn
        bodies, digests, nodes, carried = messages.bodies, messages.digests, messages.nodes, messages.carried
        raw_bodies = (
            [ev.CARRIED if i in carried else msgspec.Raw(body) for i, body in enumerate(bodies)]
            if carried
            else list(map(msgspec.Raw, bodies))
        )
        number, pack_link, base = state.number, LINK.pack, state.length
        prefix, pack_position = chain_key(number, 0)[:9], SEQ.pack

        def put_entries(seq: int) -> None:
            """The chain entries of the new messages, and their display overrides."""
            if carried:
                entries = [
                    (prefix + pack_position(base + i), pack_link(node, digest, *(carried.get(i) or (seq, i))))
                    for i, (digest, node) in enumerate(zip(digests, nodes))
                ]
            else:  # the common case (every import)
                entries = chain_entries(number, base, nodes, digests, seq)
            notes = messages.notes.items()
            entries += [(note_key(number, base + i), nodes[i] + codec.encode(note)) for i, note in notes]
            txn.cursor(db=store.index).putmulti(entries)

        batch.emit(
            ev.MessagesAppended(
                session=session_id,
                position=base,
                digests=b"".join(digests),
                nodes=b"".join(nodes),
                bodies=raw_bodies,
                carried=carried,
                overrides=messages.notes,
                summaries=messages.summaries,
                salts=os.urandom(SALT_SIZE * len(bodies)),
            ),
            state,
            sum(map(len, bodies)) + 80 * len(bodies),  # each body, its digest and node, framing
            put_entries,
        )
        state.length = base + len(nodes)
        state.head = nodes[-1] if nodes else state.head
        state.closed = False

    def position_of(self, txn: lmdb.Transaction, state: SessionState, node: bytes) -> int | None:
        """How many live messages lead up to and include ``node`` (0 for EMPTY_HEAD); None if absent."""
        if node == ZERO:
            return 0
        if node == state.head:
            return state.length
        if state.length == 0:
            return None  # an empty transcript holds no other node
        store = self.store
        cursor = txn.cursor(db=store.index)
        # Scan back from the head: the node the caller saw is usually recent.
        if not cursor.set_key(chain_key(state.number, state.length - 1)):
            return None
        prefix = chain_key(state.number, 0)[:9]
        for key, value in cursor.iterprev():
            if key[:9] != prefix:
                break
            if value[:32] == node:
                return SEQ.unpack(key[9:])[0] + 1
        return None

    def find_retry(
        self, txn: lmdb.Transaction, state: SessionState | None, expected: bytes, prepared: Prepared
    ) -> int | None:
        """If ``prepared`` already follows ``expected`` in the live chain, the position where it ends."""
        if state is None:
            return None
        start = self.position_of(txn, state, expected)
        if start is None:
            return None
        end = start + len(prepared.digests)
        if end > state.length:
            return None
        if end > start and self.store.link(txn, state.number, end - 1)[0] != chain(expected, prepared.digests)[-1]:
            return None
        return end


def chain(parent: bytes, digests: list[bytes]) -> list[bytes]:
    nodes = []
    for digest in digests:
        parent = node_digest(parent, digest)
        nodes.append(parent)
    return nodes


def leading_summaries(prepared: Prepared, k: int) -> int:
    """How many of the kept messages from ``k`` on are compaction summaries, counted from ``k``."""
    summaries = 0
    for index in prepared.kept[k:]:
        if not _is_summary(prepared.raw[index]):
            break
        summaries += 1
    return summaries


def _is_summary(message: Any) -> bool:
    return isinstance(message, Mapping) and bool(message.get(SUMMARY_KEY))
