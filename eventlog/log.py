"""The :class:`EventLog` API: idempotent flushes of agent transcripts into LMDB."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import lmdb
import msgspec

from . import codec
from . import events as ev
from .codec import ZERO, content_digest, node_digest
from .errors import ConflictError, HistoryMismatchError, InvalidMessageError, UnknownSessionError
from .replay import BodyReader, Occurrence, fill, repair, replay
from .snapshot import Prepared, SnapshotCache, is_ephemeral, prepare
from .verify import VerifyReport, verify
from .store import LINK, SEQ, Batch, Record, SessionState, Store, chain_key, iter_events, note_key

logger = logging.getLogger("eventlog")

EMPTY_HEAD = "0" * 64
"""``expected_head`` value meaning "the session must be empty (or not exist yet)"."""

SUMMARY_KEY = "_compressed_summary"
"""A truthy value under this (process-local) key marks a message as a compaction summary."""

COUNTERS = frozenset(
    {
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "cost_usd",
        "api_calls",
        "tool_calls",
    }
)
"""Session metadata keys that add up across :meth:`EventLog.update_session` calls."""

MAX_SESSION_ID_BYTES = 256

EVENT_MESSAGES = 1024
"""At most this many messages per ``MessagesAppended`` event (a large flush writes several,
in one transaction), so that readers and projections handle events of bounded size."""


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


class Projection(Protocol):
    """What :meth:`EventLog.open` accepts in ``projections``."""

    def catch_up(self, log: EventLog) -> int: ...


def check_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is a valid session id; raise ``TypeError``/``ValueError`` otherwise."""
    if not isinstance(session_id, str):
        raise TypeError(f"session id must be a str, not {type(session_id).__name__}")
    if not session_id:
        raise ValueError("session id must not be empty")
    if "\x00" in session_id:
        raise ValueError("session id must not contain NUL")
    try:
        size = len(session_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("session id must be valid UTF-8 (it contains a lone surrogate)") from None
    if size > MAX_SESSION_ID_BYTES:
        raise ValueError(f"session id is {size} bytes of UTF-8; at most {MAX_SESSION_ID_BYTES} are allowed")
    return session_id


def _head_bytes(expected_head: str | None) -> bytes | None:
    if expected_head is None:
        return None
    if not isinstance(expected_head, str) or len(expected_head) != 64:
        raise ValueError(f"expected_head must be 64 hex characters, not {expected_head!r}")
    try:
        return bytes.fromhex(expected_head)
    except ValueError:
        raise ValueError(f"expected_head must be 64 hex characters, not {expected_head!r}") from None


def _head_hex(length: int, head: bytes) -> str | None:
    return head.hex() if length else None


class EventLog:
    """A durable, content-addressed log of agent transcripts.

    Open one with :meth:`EventLog.open`; it is a context manager.  Several threads
    and processes may use the same log; LMDB serialises writers.  Never use an open
    log in a child after ``fork()``: open it again there.
    """

    def __init__(
        self,
        store: Store,
        *,
        ephemeral: Callable[[Any], bool] = is_ephemeral,
        trust_identity: bool = False,
        cache_messages: int = 200_000,
        projections: Sequence[Projection] = (),
    ) -> None:
        self._store = store
        self._ephemeral = ephemeral
        self._trust_identity = trust_identity
        self._cache = SnapshotCache(cache_messages)
        self._projections = list(projections)
        self._pid = os.getpid()

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        durability: str = "full",
        ephemeral: Callable[[Any], bool] = is_ephemeral,
        trust_identity: bool = False,
        map_size: int = 16 << 20,
        max_map_size: int | None = None,
        cache_messages: int = 200_000,
        projections: Sequence[Projection] = (),
        readonly: bool = False,
    ) -> EventLog:
        """Open (creating when needed) the log in directory ``path``.

        ``durability``: ``"full"`` (default: fsync data and meta page on every commit,
        survives power loss), ``"process"`` (one fsync per commit, no meta-page sync:
        survives a process or OS crash intact but a power loss may undo the last
        commit), ``"none"`` (no fsync: survives a process crash, not an OS crash;
        for bulk imports).  ``ephemeral`` replaces the scaffolding rule.
        ``trust_identity`` promises that flushed message dicts are never mutated in
        place, so unchanged objects are not re-encoded.  The map starts at
        ``map_size`` bytes and grows by itself up to ``max_map_size``.  Each
        projection is caught up now and after every write.
        """
        store = Store(path, durability=durability, map_size=map_size, max_map_size=max_map_size, readonly=readonly)
        log = cls(
            store,
            ephemeral=ephemeral,
            trust_identity=trust_identity,
            cache_messages=cache_messages,
            projections=projections,
        )
        for projection in log._projections:
            projection.catch_up(log)
        return log

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the log; it cannot be used afterwards."""
        self._cache.clear()
        self._store.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def path(self) -> str:
        return self._store.path

    @property
    def id(self) -> str:
        """The log's random id (32 hex characters); projections remember it."""
        return self._store.log_id.hex()

    @property
    def durability(self) -> str:
        return self._store.durability

    @property
    def last_seq(self) -> int:
        """The seq of the newest event (0 for an empty log)."""
        with self._store.read() as txn:
            return self._store.last_seq(txn)

    def info(self) -> dict[str, Any]:
        """Sizes and counts: events, sessions, map size, bytes used on disk, and the
        write transactions this process committed (``commits``) for how many writes
        (``writes``; more writes than commits means group commit merged them)."""
        store = self._store
        with store.read() as txn:
            last = store.last_seq(txn)
            sessions = txn.stat(store.sessions)["entries"]
        info = store.env.info()
        stat = store.env.stat()
        data = os.path.join(store.path, "data.mdb")
        return {
            "path": store.path,
            "id": self.id,
            "durability": store.durability,
            "events": last,
            "sessions": sessions,
            "map_size": info["map_size"],
            "used_bytes": (info["last_pgno"] + 1) * stat["psize"],
            "file_bytes": os.path.getsize(data) if os.path.exists(data) else 0,
            "commits": store.commits,
            "writes": store.grouped_writes,
        }

    # -- writing ---------------------------------------------------------------

    def flush(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        overrides: Mapping[int, Mapping[str, Any]] | None = None,
        expected_head: str | None = None,
        replace: bool = False,
    ) -> FlushResult:
        """Make the stored live transcript of ``session_id`` equal to ``messages``.

        Scaffolding is dropped, the rest is compared with the stored chain by node
        digest, and only what changed is written, in one transaction:

        - nothing new: nothing is written and nothing synced;
        - the list extends the stored transcript: the new messages are appended;
        - the list diverges at position ``k``: stored positions ``k..`` are tombstoned
          (reason ``compaction`` when the first new message has a truthy
          ``_compressed_summary``, ``edit`` when the list is as long as the stored
          transcript, else ``rewind``) and the list's messages from ``k`` appended.

        ``overrides`` maps an index of ``messages`` to display fields for that row
        (see the projection); the message itself is stored as given.

        Raises :class:`HistoryMismatchError` when the list shares no prefix with a
        non-empty stored transcript (or is empty), unless ``replace=True`` or its first
        message is a compaction summary; :class:`ConflictError` when ``expected_head``
        is given, something must be written, and the stored head differs;
        :class:`InvalidMessageError` for a message that is not JSON-like.
        """
        check_session_id(session_id)
        expected = _head_bytes(expected_head)
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of message dicts, not {type(messages).__name__}")
        prepared = prepare(
            messages,
            self._cache.get(session_id),
            ephemeral=self._ephemeral,
            trust_identity=self._trust_identity,
        )
        notes = self._overrides(overrides, prepared)
        store = self._store
        # Most flushes change nothing (several exit paths flush the same list): decide
        # that in a read transaction, with no write lock and no sync.
        with store.read() as txn:
            state = store.session(txn, session_id)
            if state is not None and len(prepared.nodes) == state.length and (
                state.length == 0 or prepared.nodes[-1] == state.head
            ) and not self._pending_notes(txn, state, notes, prepared):
                self._cache.put(session_id, prepared)
                return FlushResult(0, 0, state.length, _head_hex(state.length, state.head))
            if state is None and not prepared.nodes:
                return FlushResult(0, 0, 0, None)

        store.reserve(sum(map(len, prepared.bodies[state.length if state else 0 :])) + 200 * len(prepared.bodies))
        result = store.write(lambda txn: self._flush(txn, session_id, prepared, notes, expected, replace))
        self._cache.put(session_id, prepared)
        self._after_write()
        return result

    def append(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        expected_head: str | None = None,
    ) -> FlushResult:
        """Append ``messages`` after the session's head (for callers that work in deltas).

        With ``expected_head``, a retried append whose messages already follow that
        head is recognised and writes nothing; any other head raises
        :class:`ConflictError`.  Without it, every call appends.
        """
        check_session_id(session_id)
        expected = _head_bytes(expected_head)
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of message dicts, not {type(messages).__name__}")
        prepared = prepare(messages, None, ephemeral=self._ephemeral, chain=False)

        def body(txn: lmdb.Transaction) -> FlushResult:
            batch = Batch(self._store, txn)
            state = self._store.session(txn, session_id)
            length = state.length if state else 0
            head = state.head if state else ZERO
            if expected is not None and expected != head:
                found = self._find_retry(txn, state, expected, prepared)
                if found is not None:
                    return FlushResult(0, 0, found, _head_hex(length, head))
                raise ConflictError(
                    f"session {session_id!r}: head is {_head_hex(length, head) or EMPTY_HEAD}, "
                    f"not the expected {expected.hex()}"
                )
            if not prepared.bodies:
                return FlushResult(0, 0, length, _head_hex(length, head))
            if state is None:
                state = self._open_session(batch, session_id)
            digests = prepared.digests
            nodes = _chain(head, digests)
            self._append(batch, session_id, state, prepared.bodies, digests, nodes, {}, {}, 0)
            self._save(batch, session_id, state)
            return FlushResult(len(nodes), 0, length, state.head.hex())

        self._store.reserve(sum(map(len, prepared.bodies)) + 200 * len(prepared.bodies))
        result = self._store.write(body)
        self._cache.discard(session_id)
        self._after_write()
        return result

    def rewind(self, session_id: str, *, to: int) -> FlushResult:
        """Keep the first ``to`` messages; tombstone the rest (reason ``rewind``)."""
        check_session_id(session_id)

        def body(txn: lmdb.Transaction) -> FlushResult:
            state = self._require(txn, session_id)
            if not isinstance(to, int) or isinstance(to, bool) or not 0 <= to <= state.length:
                raise ValueError(f"rewind to={to!r}: session {session_id!r} has {state.length} messages")
            if to == state.length:
                return FlushResult(0, 0, to, _head_hex(state.length, state.head))
            batch = Batch(self._store, txn)
            count = state.length - to
            self._tombstone(batch, session_id, state, to, "rewind")
            self._save(batch, session_id, state)
            return FlushResult(0, count, to, _head_hex(state.length, state.head))

        result = self._store.write(body)
        self._cache.discard(session_id)
        self._after_write()
        return result

    def compact(
        self,
        session_id: str,
        *,
        start: int,
        end: int,
        summary: Sequence[Mapping[str, Any]],
        expected_head: str | None = None,
    ) -> FlushResult:
        """Replace messages ``[start, end)`` with ``summary`` (reason ``compaction``).

        Messages after ``end`` are carried after the summary (new nodes, bodies not
        stored again).  ``expected_head`` is the head the caller summarised: messages
        appended after it while the caller worked are carried too, never lost.  If that
        head is no longer in the live transcript, :class:`ConflictError` is raised.
        """
        check_session_id(session_id)
        expected = _head_bytes(expected_head)
        prepared = prepare(summary, None, ephemeral=lambda m: False, chain=False)

        def body(txn: lmdb.Transaction) -> FlushResult:
            state = self._require(txn, session_id)
            seen = state.length
            if expected is not None:
                seen = self._position_of(txn, state, expected)
                if seen is None:
                    raise ConflictError(
                        f"session {session_id!r}: expected head {expected.hex()} is not in the live transcript"
                    )
            if not (isinstance(start, int) and isinstance(end, int) and 0 <= start <= end <= seen):
                raise ValueError(
                    f"compact start={start!r}, end={end!r}: must satisfy 0 <= start <= end <= {seen}"
                )
            batch = Batch(self._store, txn)
            length = state.length
            tail = self._store.links(txn, state.number, end, length)
            old_notes = self._notes_in(txn, state.number, end, length)
            self._tombstone(batch, session_id, state, start, "compaction")
            digests = prepared.digests + [link[1] for link in tail]
            nodes = _chain(state.head, digests)
            bodies = prepared.bodies + [b""] * len(tail)
            carried = {len(prepared.bodies) + i: (link[2], link[3]) for i, link in enumerate(tail)}
            notes = {
                len(prepared.bodies) + i: old_notes[end + i]
                for i, link in enumerate(tail)
                if end + i in old_notes and old_notes[end + i][0] == link[0]
            }
            self._append(
                batch, session_id, state, bodies, digests, nodes, carried,
                {i: note for i, (_, note) in notes.items()}, len(prepared.bodies),
            )
            self._save(batch, session_id, state)
            return FlushResult(len(nodes), length - start, start, _head_hex(state.length, state.head))

        result = self._store.write(body)
        self._cache.discard(session_id)
        self._after_write()
        return result

    def fork(self, source_id: str, new_id: str, at: int | None = None) -> FlushResult:
        """Start session ``new_id`` sharing the first ``at`` live messages of ``source_id``.

        The shared messages keep their node digests; afterwards the two sessions
        evolve independently.  ``at`` defaults to the whole live transcript.
        """
        check_session_id(source_id)
        check_session_id(new_id)

        def body(txn: lmdb.Transaction) -> FlushResult:
            source = self._require(txn, source_id)
            if self._store.session(txn, new_id) is not None:
                raise ConflictError(f"cannot fork into {new_id!r}: that session already exists")
            shared = source.length if at is None else at
            if not isinstance(shared, int) or isinstance(shared, bool) or not 0 <= shared <= source.length:
                raise ValueError(f"fork at={at!r}: session {source_id!r} has {source.length} messages")
            links = self._store.links(txn, source.number, 0, shared)
            head = links[-1][0] if links else ZERO
            batch = Batch(self._store, txn)
            state = self._open_session(batch, new_id, source=source_id, at=shared, source_head=head if links else None)
            for position, link in enumerate(links):
                txn.put(chain_key(state.number, position), LINK.pack(*link), db=self._store.index)
            for position, (node, note) in self._notes_in(txn, source.number, 0, shared).items():
                txn.put(note_key(state.number, position), node + codec.encode(note), db=self._store.index)
            state.length = shared
            state.head = head
            self._save(batch, new_id, state)
            return FlushResult(0, 0, shared, _head_hex(shared, head))

        result = self._store.write(body)
        self._after_write()
        return result

    def update_session(self, session_id: str, **fields: Any) -> None:
        """Record session metadata (title, model, source, free-form keys).

        Keys in :data:`COUNTERS` (``input_tokens``, ``output_tokens``, ``cost_usd``, ...)
        add up across calls; every other key replaces its previous value.
        """
        check_session_id(session_id)
        counters: dict[str, float | int] = {}
        plain: dict[str, Any] = {}
        for key, value in fields.items():
            if key in COUNTERS:
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise TypeError(f"update_session {key}={value!r}: a counter must be a number")
                counters[key] = value
            else:
                plain[key] = value
        try:
            codec.check(plain, 0)
            codec.check(counters, 0)
        except InvalidMessageError as e:
            raise InvalidMessageError(str(e).replace("messages[0]", "update_session fields")) from None
        if not plain and not counters:
            return

        def body(txn: lmdb.Transaction) -> None:
            batch = Batch(self._store, txn)
            state = self._store.session(txn, session_id) or self._open_session(batch, session_id)
            batch.emit(ev.SessionUpdated(session=session_id, fields=plain, counters=counters), state)
            self._save(batch, session_id, state)

        self._store.write(body)
        self._after_write()

    def close_session(self, session_id: str, *, reason: str = "") -> None:
        """Record that the session ended (``reason``: free text such as ``"user_exit"``)."""
        check_session_id(session_id)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, not {type(reason).__name__}")

        def body(txn: lmdb.Transaction) -> None:
            state = self._require(txn, session_id)
            batch = Batch(self._store, txn)
            batch.emit(ev.SessionClosed(session=session_id, reason=reason), state)
            state.closed = True
            self._save(batch, session_id, state)

        self._store.write(body)
        self._after_write()

    # -- reading ---------------------------------------------------------------

    def head(self, session_id: str) -> str | None:
        """The session's head node digest (64 hex), or ``None`` when it is empty or unknown."""
        check_session_id(session_id)
        with self._store.read() as txn:
            state = self._store.session(txn, session_id)
        return None if state is None else _head_hex(state.length, state.head)

    def sessions(self) -> list[str]:
        """The ids of every session in the log, sorted."""
        with self._store.read() as txn:
            cursor = txn.cursor(db=self._store.sessions)
            return [key.decode("utf-8") for key in cursor.iternext(keys=True, values=False)]

    def __contains__(self, session_id: object) -> bool:
        if not isinstance(session_id, str):
            return False
        with self._store.read() as txn:
            return self._store.session(txn, session_id) is not None

    def messages(self, session_id: str, *, as_of: int | None = None, repair_tool_calls: bool = False) -> list[dict[str, Any]]:
        """The live transcript as wire dicts, ready to resume the agent.

        Values come back JSON-like: a tuple that was flushed comes back as a list;
        ``_`` keys and scaffolding were never stored.  ``as_of`` replays the
        transcript as it was right after event ``as_of``.  ``repair_tool_calls``
        returns a copy fixed for model APIs (see :func:`eventlog.replay.repair`);
        the log is not changed.  Raises :class:`UnknownSessionError`.
        """
        check_session_id(session_id)
        store = self._store
        with store.read() as txn:
            state = self._require(txn, session_id)
            if as_of is None:
                out = BodyReader(store, txn).messages(store.locations(txn, state.number, state.length))
            else:
                occurrences, live = replay(store, txn, session_id, as_of)
                reader = BodyReader(store, txn)
                out = reader.messages((bytes.fromhex(occurrences[i].digest), *occurrences[i].source) for i in live)
        return repair(out) if repair_tool_calls else out

    def history(self, session_id: str) -> list[Occurrence]:
        """Every message occurrence of the session in seq order, tombstoned ones included.

        Each entry has the message, its position, node and content digests, the seq
        of the event that made it live, how it got there (``origin``), its display
        override, and its :class:`~eventlog.replay.Tombstone` (reason, seq) or None.
        """
        check_session_id(session_id)
        with self._store.read() as txn:
            self._require(txn, session_id)
            occurrences, _ = replay(self._store, txn, session_id)
            fill(self._store, txn, occurrences)
        return occurrences

    def events(self, after: int = 0) -> Iterator[Record]:
        """The events with ``seq > after``, in order (``seq`` is gapless from 1)."""
        return iter_events(self._store, after)

    def verify(self, *, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """Recompute every digest, the event hash chain and the derived indexes.

        Returns a :class:`~eventlog.verify.VerifyReport`: ``.ok``, and ``.problems``
        naming the event and what differs.  ``progress(done, total)`` is called as
        events are checked.
        """
        return verify(self._store, progress=progress)

    # -- internals -------------------------------------------------------------

    def _require(self, txn: lmdb.Transaction, session_id: str) -> SessionState:
        state = self._store.session(txn, session_id)
        if state is None:
            raise UnknownSessionError(f"no session {session_id!r} in {self._store.path}")
        return state

    def _after_write(self) -> None:
        for projection in self._projections:
            try:
                projection.catch_up(self)
            except Exception:
                # The log is the source of truth and the write is committed; the
                # projection catches up on its next call.
                logger.exception("projection %r failed to catch up", projection)

    def _overrides(self, overrides: Mapping[int, Mapping[str, Any]] | None, prepared: Prepared) -> dict[int, dict[str, Any]]:
        """Validate ``overrides`` and key them by position in the stored transcript."""
        if not overrides:
            return {}
        position_of = {index: position for position, index in enumerate(prepared.kept)}
        out: dict[int, dict[str, Any]] = {}
        for index, override in overrides.items():
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(prepared.raw):
                raise ValueError(f"overrides[{index!r}]: no such index in messages (0..{len(prepared.raw) - 1})")
            if not isinstance(override, Mapping):
                raise InvalidMessageError(f"overrides[{index}]: {type(override).__name__} is not a mapping", index=index)
            position = position_of.get(index)
            if position is None:
                raise ValueError(f"overrides[{index}]: messages[{index}] is scaffolding and is not stored")
            body = codec.strip(override)
            try:
                codec.check(body, index)
            except InvalidMessageError as e:
                raise InvalidMessageError(str(e).replace("messages[", "overrides[", 1), index=index, path=e.path) from None
            out[position] = body
        return out

    def _pending_notes(self, txn: lmdb.Transaction, state: SessionState, notes: dict[int, dict[str, Any]], prepared: Prepared) -> dict[int, dict[str, Any]]:
        """The overrides for stored positions that differ from what is recorded."""
        pending: dict[int, dict[str, Any]] = {}
        for position, note in notes.items():
            if position >= state.length:
                continue
            current = txn.get(note_key(state.number, position), db=self._store.index)
            wanted = prepared.nodes[position] + codec.encode(note)
            if current != wanted:
                pending[position] = note
        return pending

    def _notes_in(self, txn: lmdb.Transaction, number: int, start: int, stop: int) -> dict[int, tuple[bytes, dict[str, Any]]]:
        """Recorded overrides for positions ``start..stop-1``: position -> (node, override)."""
        found: dict[int, tuple[bytes, dict[str, Any]]] = {}
        cursor = txn.cursor(db=self._store.index)
        if not cursor.set_range(note_key(number, start)):
            return found
        last = note_key(number, stop)
        for key, value in cursor:
            if key >= last:
                break
            found[SEQ.unpack(key[9:])[0]] = (value[:32], codec.decode(value[32:]))
        return found

    def _flush(
        self,
        txn: lmdb.Transaction,
        session_id: str,
        prepared: Prepared,
        notes: dict[int, dict[str, Any]],
        expected: bytes | None,
        replace: bool,
    ) -> FlushResult:
        store = self._store
        state = store.session(txn, session_id)
        length = state.length if state else 0
        head = state.head if state else ZERO
        nodes = prepared.nodes
        k = self._common_prefix(txn, state, nodes)
        annotate = self._pending_notes(txn, state, {p: n for p, n in notes.items() if p < k}, prepared) if state else {}
        if k == length == len(nodes) and not annotate:
            return FlushResult(0, 0, k, _head_hex(length, head))  # already stored
        if expected is not None and expected != head:
            raise ConflictError(
                f"session {session_id!r}: head is {_head_hex(length, head) or EMPTY_HEAD}, "
                f"not the expected {expected.hex()}"
            )
        summaries = 0
        for index in prepared.kept[k:]:
            if not _is_summary(prepared.raw[index]):
                break
            summaries += 1
        reason = None
        if k < length:
            if k == 0 and not replace and not summaries:
                what = "is empty" if not nodes else "shares no prefix with it"
                raise HistoryMismatchError(
                    f"session {session_id!r} has {length} stored messages and the flushed list {what}; "
                    "pass replace=True to replace the transcript"
                )
            if summaries:
                reason = "compaction"
            elif k == 0 and replace:
                reason = "clear"
            elif len(nodes) == length:
                reason = "edit"
            else:
                reason = "rewind"
        batch = Batch(store, txn)
        if state is None:
            state = self._open_session(batch, session_id)
        tombstoned = length - k
        # Bodies of tombstoned messages that come back (an early edit, a compaction's
        # tail) are referenced, not stored again: digest -> (seq, index, old position).
        carry_from: dict[bytes, tuple[int, int, int]] = {}
        old_notes: dict[int, tuple[bytes, dict[str, Any]]] = {}
        if reason is not None:
            for offset, link in enumerate(store.links(txn, state.number, k, length)):
                carry_from.setdefault(link[1], (link[2], link[3], k + offset))
            old_notes = self._notes_in(txn, state.number, k, length)
            self._tombstone(batch, session_id, state, k, reason)
        if len(nodes) > k:
            bodies: list[bytes] = []
            carried: dict[int, tuple[int, int]] = {}
            batch_notes: dict[int, dict[str, Any]] = {}
            for i, position in enumerate(range(k, len(nodes))):
                where = carry_from.get(prepared.digests[position])
                if where is None:
                    bodies.append(prepared.bodies[position])
                else:
                    bodies.append(b"")
                    carried[i] = (where[0], where[1])
                note = notes.get(position)
                if note is None and where is not None and where[2] in old_notes:
                    note = old_notes[where[2]][1]  # a carried message keeps its display override
                if note is not None:
                    batch_notes[i] = note
            self._append(batch, session_id, state, bodies, prepared.digests[k:], nodes[k:], carried, batch_notes, summaries)
        for position, note in sorted(annotate.items()):
            batch.emit(ev.MessageAnnotated(session=session_id, position=position, node=nodes[position], override=note), state)
            txn.put(note_key(state.number, position), nodes[position] + codec.encode(note), db=store.index)
        self._save(batch, session_id, state)
        return FlushResult(len(nodes) - k, tombstoned, k, _head_hex(state.length, state.head))

    def _common_prefix(self, txn: lmdb.Transaction, state: SessionState | None, nodes: list[bytes]) -> int:
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
        link = self._store.link
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

    def _open_session(
        self, batch: Batch, session_id: str, *, source: str | None = None, at: int = 0, source_head: bytes | None = None
    ) -> SessionState:
        number = batch.new_session_number()
        state = SessionState(number, 0, ZERO, 0, new=True)
        batch.emit(ev.SessionOpened(session=session_id, source=source, at=at, source_head=source_head), state)
        return state

    def _tombstone(self, batch: Batch, session_id: str, state: SessionState, position: int, reason: str) -> None:
        store, txn = self._store, batch.txn
        links = store.links(txn, state.number, position, state.length)
        batch.emit(
            ev.MessagesTombstoned(session=session_id, position=position, nodes=b"".join(link[0] for link in links), reason=reason),
            state,
        )
        for offset in range(len(links)):
            txn.delete(chain_key(state.number, position + offset), db=store.index)
            txn.delete(note_key(state.number, position + offset), db=store.index)
        state.length = position
        state.head = store.link(txn, state.number, position - 1)[0] if position else ZERO

    def _append(
        self,
        batch: Batch,
        session_id: str,
        state: SessionState,
        bodies: list[bytes],
        digests: list[bytes],
        nodes: list[bytes],
        carried: dict[int, tuple[int, int]],
        notes: dict[int, dict[str, Any]],
        summaries: int,
    ) -> None:
        """Append messages as one event per :data:`EVENT_MESSAGES` (all in this transaction)."""
        for start in range(0, len(nodes), EVENT_MESSAGES):
            stop = min(start + EVENT_MESSAGES, len(nodes))
            self._append_event(
                batch,
                session_id,
                state,
                bodies[start:stop],
                digests[start:stop],
                nodes[start:stop],
                {i - start: where for i, where in carried.items() if start <= i < stop},
                {i - start: note for i, note in notes.items() if start <= i < stop},
                max(0, min(summaries - start, stop - start)),
            )

    def _append_event(
        self,
        batch: Batch,
        session_id: str,
        state: SessionState,
        bodies: list[bytes],
        digests: list[bytes],
        nodes: list[bytes],
        carried: dict[int, tuple[int, int]],
        notes: dict[int, dict[str, Any]],
        summaries: int,
    ) -> None:
        store, txn = self._store, batch.txn
        raw_bodies = [ev.CARRIED if i in carried else msgspec.Raw(body) for i, body in enumerate(bodies)]
        seq = batch.emit(
            ev.MessagesAppended(
                session=session_id,
                position=state.length,
                digests=b"".join(digests),
                nodes=b"".join(nodes),
                bodies=raw_bodies,
                carried=carried,
                overrides=notes,
                summaries=summaries,
            ),
            state,
        )
        number, pack_link, base = state.number, LINK.pack, state.length
        entries = [
            (chain_key(number, base + i), pack_link(node, digest, *(carried.get(i) or (seq, i))))
            for i, (digest, node) in enumerate(zip(digests, nodes))
        ]
        entries += [(note_key(number, base + i), nodes[i] + codec.encode(note)) for i, note in notes.items()]
        txn.cursor(db=store.index).putmulti(entries)
        state.length = base + len(nodes)
        state.head = nodes[-1] if nodes else state.head
        state.closed = False

    def _save(self, batch: Batch, session_id: str, state: SessionState) -> None:
        batch.save(session_id, state)

    def _position_of(self, txn: lmdb.Transaction, state: SessionState, node: bytes) -> int | None:
        """How many live messages lead up to and include ``node`` (0 for EMPTY_HEAD); None if absent."""
        if node == ZERO:
            return 0
        if node == state.head:
            return state.length
        store = self._store
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

    def _find_retry(self, txn: lmdb.Transaction, state: SessionState | None, expected: bytes, prepared: Prepared) -> int | None:
        """If ``prepared`` already follows ``expected`` in the live chain, the position where it ends."""
        if state is None:
            return None
        start = self._position_of(txn, state, expected)
        if start is None:
            return None
        end = start + len(prepared.digests)
        if end > state.length:
            return None
        if end > start and self._store.link(txn, state.number, end - 1)[0] != _chain(expected, prepared.digests)[-1]:
            return None
        return end

def _chain(parent: bytes, digests: list[bytes]) -> list[bytes]:
    nodes = []
    for digest in digests:
        parent = node_digest(parent, digest)
        nodes.append(parent)
    return nodes


def _is_summary(message: Any) -> bool:
    return isinstance(message, Mapping) and bool(message.get(SUMMARY_KEY))


