"""The :class:`EventLog` API: idempotent flushes of agent transcripts into LMDB."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, TypeVar

import lmdb

from . import audit, codec
from . import events as ev
from . import redact as redaction
from .codec import ZERO
from .errors import (
    CorruptLogError,
    EventLogError,
    InvalidMessageError,
    LogInUseError,
    ReadOnlyError,
    StorageFullError,
    UnsafeDirectoryError,
)
from .keys import SessionState
from .offload import Offloaded, can_offload
from .projector import OFFLOADED_WRITES, Projection, Projector, bind
from .redact import Redaction
from .relay import Part, Relay, Uncertain
from .replay import BodyReader, Occurrence, SessionInfo, fill, paused_gc, repair, replay, session_info
from .signing import Signer
from .snapshot import ChangedSince, Prepared, SnapshotCache, bodies_from, is_ephemeral, prepare, release
from .store import Record, Store, iter_events
from .verifier import Verifier
from .verify import LogHead, VerifyReport, verify
from .writer import EMPTY_HEAD, SUMMARY_KEY, FlushResult, Snapshot, Writer, _head_hex, leading_summaries

__all__ = [
    "COUNTERS",
    "EMPTY_HEAD",
    "SUMMARY_KEY",
    "EventLog",
    "FlushResult",
    "Projection",
    "SessionInfo",
    "check_session_id",
]

logger = logging.getLogger("eventlog")

COUNTERS = frozenset(ev.USAGE_COUNTERS)
"""Session metadata keys that add up across :meth:`EventLog.update_session` calls."""

MAX_SESSION_ID_BYTES = 256


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


T = TypeVar("T")

TURNS_KEPT = 4096
"""Sessions whose turn lock a log keeps after their flushes end (beyond this, those no flush
is using are forgotten)."""


_EMPTY = FlushResult(0, 0, 0, None)


@dataclass(slots=True)
class _Wanted:
    """One session of a flush as the caller gave it."""

    session_id: str
    messages: Sequence[Mapping[str, Any]]
    overrides: Mapping[int, Mapping[str, Any]] | None
    expected: bytes | None


class _Turn:
    """The lock that flushes of one session take turns on, and how many threads want it."""

    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0


def _holding(locks: list[Any], run: Callable[[], T]) -> T:
    """``run()`` holding every lock of ``locks``, taken in order and released in reverse.

    An exit stack rather than nested ``with`` blocks: a flush of ten thousand sessions
    would otherwise nest ten thousand frames deep.  An interrupt while taking them
    releases the ones already held.
    """
    with ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock)
        return run()


def _room(prepared: Prepared, stored: int) -> int:
    """Bytes a write of ``prepared`` onto ``stored`` messages may add to the map, at most."""
    nbytes = sum(map(len, filter(None, prepared.bodies[stored:]))) + 200 * len(prepared.bodies)
    if stored < prepared.released:  # bodies let go will be encoded again: count them at their average size
        nbytes += prepared.released_bytes * (prepared.released - stored) // prepared.released
    return nbytes


def _head_bytes(expected_head: str | None, name: str = "expected_head") -> bytes | None:
    if expected_head is None:
        return None
    if not isinstance(expected_head, str) or len(expected_head) != 64:
        raise ValueError(f"{name} must be 64 hex characters, not {expected_head!r}")
    try:
        return bytes.fromhex(expected_head)
    except ValueError:
        raise ValueError(f"{name} must be 64 hex characters, not {expected_head!r}") from None


def _expected_heads(expected_heads: Mapping[str, str] | None, transcripts: Mapping[str, Any]) -> dict[str, bytes]:
    """``flush_many``'s ``expected_heads`` validated, as bytes (a ``None`` head expects nothing)."""
    if expected_heads is None:
        return {}
    if not isinstance(expected_heads, Mapping):
        raise TypeError(f"expected_heads must map session ids to heads, not {type(expected_heads).__name__}")
    out: dict[str, bytes] = {}
    for session_id, head in expected_heads.items():
        if session_id not in transcripts:
            raise ValueError(f"expected_heads names session {session_id!r}, which is not in transcripts")
        found = _head_bytes(head, f"expected_heads[{session_id!r}]")
        if found is not None:
            out[session_id] = found
    return out


def _flag(value: object, name: str) -> bool:
    """``value`` if it is a bool; ``TypeError`` naming ``name`` otherwise (``"no"`` is truthy)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {type(value).__name__}")
    return value


def _count(value: object, name: str) -> int:
    """``value`` if it is an int >= 0; ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, not {value}")
    return value


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
        project_in_background: bool = True,
        projection_process: bool = False,
        relay: bool = True,
    ) -> None:
        self._store = store
        self._writer = Writer(store)
        self._ephemeral = ephemeral
        self._trust_identity = trust_identity
        self._cache = SnapshotCache(cache_messages)
        self._turns: dict[str, _Turn] = {}  # sessions being flushed in this process
        self._turns_guard = threading.Lock()
        self._projections = list(projections)
        self._projector: Projector | None = None
        offloaded = False
        if self._projections and project_in_background:
            runners: list[Projection] = list(self._projections)
            if projection_process:
                options = {"allow_shared_directory": store.allow_shared_directory}
                runners = [Offloaded(p, store.path, options) if can_offload(p) else p for p in runners]
            offloaded = all(isinstance(runner, Offloaded) for runner in runners)
            self._projector = Projector(
                self, self._projections, runners=runners, gather=OFFLOADED_WRITES if offloaded else None
            )
            for projection in self._projections:
                bind(projection, self._projector.waiter(projection))
        if self._projections and not offloaded:
            store.written.keep()  # the projections read back each write here: its hashes serve them
        self._relay: Relay | None = None
        if relay and not store.readonly and store.locked and store.sync_data:
            self._relay = Relay(store, self._writer, self._carried)

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
        project_in_background: bool = True,
        projection_process: bool = False,
        readonly: bool = False,
        allow_shared_directory: bool = False,
        relay: bool = True,
    ) -> EventLog:
        """Open (creating when needed) the log in directory ``path``.

        Several threads and processes may open the same directory; the returned log is a
        context manager that closes it.

        Parameters:

        - ``durability``: ``"full"`` (default), ``"process"`` or ``"none"``; what each
          survives is in the table in docs/design.md ("Durability modes").
        - ``ephemeral``: replaces the scaffolding rule (:func:`is_ephemeral`).
        - ``trust_identity``: a promise that flushed message dicts are never mutated in
          place, so a message that is the same object as last time (or a dict equal to it)
          is taken as unchanged without looking inside (docs/integration.md).
        - ``map_size``, ``max_map_size``: the map starts at ``map_size`` bytes and grows by
          itself up to ``max_map_size`` (no limit by default).
        - ``cache_messages``: bounds the snapshot cache, in messages over all sessions; the
          least recently flushed session goes first.  Each costs about 0.4 KB on the
          benchmark's messages (0.8 KB in the default mode once a second flush copied it).
          A longer session keeps its last ``cache_messages`` messages only, and a flush
          hashes the earlier ones again.
        - ``projections``: caught up now and after every write, on a background thread
          (``project_in_background``, the default: a write returns once the log committed
          it) or inside the write call.  Their own read methods wait for the thread; other
          readers call :meth:`sync_projections`.
        - ``projection_process``: with ``project_in_background``, catch up each projection
          that can be opened again elsewhere (it has an ``opener()``, as
          :class:`~projections.SQLiteProjection` does) in a child process of its own, where
          its work does not take turns with this process's threads for the GIL
          (``eventlog/offload.py``; docs/projection.md, "In a process of its own").
        - ``readonly``: open without write access; every write raises.  Works on a directory
          this process cannot write (a read-only backup, or a service's log owned by another
          user and writable by it only).  When LMDB's lock file cannot be used there, the log
          is read without LMDB's reader table: a process writing the log meanwhile is not told
          which pages this reader uses and may reuse them, so such a reader is consistent only
          while nobody writes (a backup, a stopped service).
        - ``allow_shared_directory``: trust a directory that users other than this one can
          write (or that another user owns); otherwise it is refused with
          :class:`~eventlog.errors.UnsafeDirectoryError`, as is a symlink or another user's
          file in place of the log's files, since whoever can write the directory could make
          this process write through a planted link (docs/reliability.md).
        - ``relay``: share commits with the other processes writing this log (same user,
          same durability mode, ``full`` or ``process``): a flush that extends a transcript is
          committed by whichever of them carries the others' flushes, together with theirs
          (``eventlog/relay.py``; docs/design.md, "Many processes").  With ``relay=False``
          this process neither sends its flushes nor carries others'.

        Raises :class:`CorruptLogError` for damaged files, :class:`ReadOnlyError` when the
        files cannot be written, ``FileNotFoundError`` for a ``readonly`` open of no log.
        """
        store = Store(
            path,
            durability=durability,
            map_size=map_size,
            max_map_size=max_map_size,
            readonly=readonly,
            allow_shared_directory=allow_shared_directory,
        )
        log = cls(
            store,
            ephemeral=ephemeral,
            trust_identity=trust_identity,
            cache_messages=cache_messages,
            projections=projections,
            project_in_background=project_in_background,
            projection_process=projection_process,
            relay=relay,
        )
        try:
            for projection in log._projections:
                projection.catch_up(log)
        except BaseException:
            log.close()
            raise
        return log

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Bring the attached projections up to date, then close the log; it cannot be used afterwards.

        In a child process that inherited the log through ``fork()``, where every use of it
        is refused, this only marks it closed: the log's files and locks stay the parent's.
        """
        if self._store.forked:
            self._store.close()
            return
        if self._relay is not None:
            self._relay.close()
        if self._projector is not None:
            self._projector.close()
        self._cache.clear()
        self._store.close()

    def sync_projections(self, timeout: float | None = None) -> bool:
        """Wait until the attached projections hold every write made so far.

        After a failed catch-up, first asks for another.  Returns False on timeout, or when
        a projection's catch-up failed again (the error is logged; it is tried again later).  Only needed by
        readers that query a projection's database directly (with ``sqlite3``, another
        process): the projection's own read methods wait by themselves.  Returns True at
        once when projecting inside the writes.
        """
        if self._projector is None:
            return True
        return self._projector.wait(timeout)

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
        (``writes``; more writes than commits means group commit merged them), this
        process's flushes another process committed (``relayed``) and the other processes'
        flushes this one committed (``carried``; see ``relay`` in :meth:`open`)."""
        store = self._store
        with store.read() as txn:  # the map is not resized while a transaction is open
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
            "relayed": self._relay.sent if self._relay else 0,
            "carried": self._relay.carried if self._relay else 0,
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

        - nothing new: nothing is written (in ``full`` mode, events this process does not
          know are synced yet, another process's commit, are synced first);
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
        _flag(replace, "replace")
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise TypeError(f"messages must be a list of message dicts, not {type(messages).__name__}")
        turn = self._turns_of([session_id])[0]
        try:
            with turn.lock:
                return self._flush([_Wanted(session_id, messages, overrides, expected)], replace, named=False)[0]
        finally:
            with self._turns_guard:
                turn.users -= 1  # a count an interrupt leaves high only keeps the entry longer

    def _turns_of(self, session_ids: list[str]) -> list[_Turn]:
        """The locks that flushes of ``session_ids`` take turns on, counted as wanted.

        A flush reads the caller's list and commits what it read; two threads flushing one
        growing list (a turn's end and a shutdown path) must commit in the order they read
        it, or the older list would tombstone the newer turn as a rewind.  So flushes of a
        session take turns, from the moment the list is read until the commit.  The lock
        is re-entrant: a signal handler that flushes while this thread is between a flush's
        read and its write goes ahead (:meth:`Store.write` refuses one that arrives during
        the write itself).  The caller takes the locks in the order given and lowers each
        ``users`` when done.
        """
        out = []
        with self._turns_guard:
            turns = self._turns
            if len(turns) >= TURNS_KEPT:  # forget the sessions nobody is flushing
                self._turns = turns = {key: turn for key, turn in turns.items() if turn.users > 0}
            for session_id in session_ids:
                turn = turns.get(session_id)
                if turn is None:
                    turn = turns[session_id] = _Turn()
                turn.users += 1
                out.append(turn)
        return out

    def _flush(self, wanted: list[_Wanted], replace: bool, *, named: bool) -> list[FlushResult]:
        """The flush of every list of ``wanted`` in one write (none when all are stored).

        ``named``: errors about a message name its session (a flush of several).
        """
        store, writer = self._store, self._writer
        # Each session's cached entry is taken out while this flush extends it.  Whatever
        # happens next, what a list was prepared into is what it hashes to: it goes back to
        # the cache, unless the flush is interrupted (Ctrl-C): a group commit may then still
        # be running its write with it, and no other flush may extend it meanwhile.
        taken: list[Prepared | None] = []
        snapshots: list[Snapshot] = []
        interrupted = False
        try:
            for want in wanted:
                taken.append(self._cache.take(want.session_id))
                snapshots.append(self._snapshot(want, taken[-1], replace, named))
            # Most flushes change nothing (several exit paths flush the same list): decide
            # that in a read transaction, with no write lock and no sync.
            states: list[SessionState | None] = []
            stored = True
            with store.read() as txn:
                for snapshot in snapshots:
                    state = store.session(txn, snapshot.session_id)
                    states.append(state)
                    stored = stored and writer.holds(txn, state, snapshot)
            if stored:
                results = [FlushResult(0, 0, s.length, _head_hex(s.length, s.head)) if s else _EMPTY for s in states]
                # Stored, but perhaps by a commit not synced yet (another process's, in full mode).
                store.group.durable_through(max((s.last_seq for s in states if s), default=0), lambda: self.last_seq)
            else:
                try:
                    relayed = self._relayed(snapshots, states)
                    if relayed is not None:
                        results = relayed
                    else:
                        results = self._write_flushes(snapshots, [state.length if state else 0 for state in states])
                except ChangedSince:
                    # A message the cache had let go of changed in place meanwhile: hash the lists afresh.
                    snapshots = [self._snapshot(want, None, replace, named) for want in wanted]
                    results = self._write_flushes(snapshots, [0] * len(snapshots))
            for snapshot in snapshots:
                release(snapshot.prepared)  # every list is now its stored transcript
        except Exception:
            raise
        except BaseException:
            interrupted = True
            raise
        finally:
            for i, previous in enumerate(taken):
                if i >= len(snapshots):
                    entry = previous  # its list was not prepared: the entry is as it was
                elif interrupted:
                    continue
                else:
                    entry = snapshots[i].prepared
                if entry is not None:
                    self._cache.put(wanted[i].session_id, entry)
        if not stored:
            self._after_write()
        return results

    def _snapshot(self, want: _Wanted, previous: Prepared | None, replace: bool, named: bool) -> Snapshot:
        """``want``'s list prepared (extending ``previous``, the cached entry) for the writer."""
        try:
            prepared = prepare(
                want.messages,
                previous,
                ephemeral=self._ephemeral,
                trust_identity=self._trust_identity,
                owned=True,
            )
        except InvalidMessageError as e:
            if not named:
                raise
            raise InvalidMessageError(f"session {want.session_id!r}: {e}", index=e.index, path=e.path) from None
        return Snapshot(want.session_id, prepared, self._overrides(want.overrides, prepared), want.expected, replace)

    def _relayed(self, snapshots: list[Snapshot], states: list[SessionState | None]) -> list[FlushResult] | None:
        """The flush committed by the process carrying other processes' writes (:mod:`eventlog.relay`);
        None when this process commits it: it does more than extend each transcript, or no
        other process carries."""
        relay = self._relay
        if relay is None or relay.idle():
            return None
        parts = []
        for snapshot, state in zip(snapshots, states):
            length, head = (state.length, state.head) if state else (0, ZERO)
            prepared = snapshot.prepared
            nodes = prepared.nodes
            if (
                snapshot.notes
                or len(nodes) <= length
                or (length and nodes[length - 1] != head)
                or (snapshot.expected is not None and snapshot.expected != head)
            ):
                return None
            parts.append(
                Part(
                    snapshot.session_id,
                    length,
                    head,
                    bodies_from(prepared, length),
                    b"".join(prepared.digests[length:]),
                    b"".join(nodes[length:]),
                    leading_summaries(prepared, length),
                )
            )
        try:
            return relay.send(parts)
        except Uncertain:
            # The carrier's commit may hold the flush: writing it again finds it stored if so
            # and writes nothing, and that write's commit, made after the carrier's, is synced
            # (full mode) before it returns, which makes what it found durable too.
            return self._write_flushes(snapshots, [part.length for part in parts])

    def _write_flushes(self, snapshots: list[Snapshot], stored: list[int]) -> list[FlushResult]:
        """The write of a flush, with room reserved for the bodies after the ``stored`` ones."""
        writer = self._writer

        def body(txn: lmdb.Transaction) -> list[FlushResult]:
            now = time.time_ns()  # one time for the whole write: projections show all of it or none
            return [writer.flush(txn, snapshot, now) for snapshot in snapshots]

        self._store.reserve(sum(_room(snapshot.prepared, n) for snapshot, n in zip(snapshots, stored)))
        return self._store.write(body)

    def flush_many(
        self,
        transcripts: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        expected_heads: Mapping[str, str] | None = None,
        replace: bool = False,
    ) -> dict[str, FlushResult]:
        """:meth:`flush` several sessions in one transaction: every one lands, or none does.

        ``transcripts`` maps a session id to its whole list, as :meth:`flush` takes it
        (for example a parent agent's session and its sub-agents', or the conversations
        of an import file).  Each is compared with its stored transcript under the same
        rules; when one of them raises, nothing of any of them is written.  An error
        about a message names its session.  Returns each session's result.

        ``expected_heads`` makes the write a compare-and-set across sessions (a
        conversation and its record, a session and its state): it maps some of the
        sessions to the head the caller read (:data:`EMPTY_HEAD` for "empty or new"),
        and when any of them has to be written and its stored head differs,
        :class:`ConflictError` names that session and nothing is written.  As with
        ``flush(expected_head=)``, a list that is already stored writes nothing and
        raises nothing.
        """
        if isinstance(transcripts, (str, bytes)) or not isinstance(transcripts, Mapping):
            raise TypeError(f"transcripts must map session ids to lists of messages, not {type(transcripts).__name__}")
        for session_id, messages in transcripts.items():
            check_session_id(session_id)
            if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
                raise TypeError(
                    f"session {session_id!r}: messages must be a list of message dicts, not {type(messages).__name__}"
                )
        expected = _expected_heads(expected_heads, transcripts)
        _flag(replace, "replace")
        wanted = [
            _Wanted(session_id, messages, None, expected.get(session_id))
            for session_id, messages in transcripts.items()
        ]
        turns = self._turns_of(sorted(transcripts))  # one order everywhere: no deadlock
        try:
            results = _holding([turn.lock for turn in turns], lambda: self._flush(wanted, replace, named=True))
            return {want.session_id: result for want, result in zip(wanted, results)}
        finally:
            with self._turns_guard:
                for turn in turns:
                    turn.users -= 1

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
        return self._write(
            lambda txn: self._writer.append(txn, session_id, prepared, expected),
            changes=session_id,
            room=_room(prepared, 0),
        )

    def append_many(
        self,
        appends: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        expected_heads: Mapping[str, str] | None = None,
    ) -> dict[str, FlushResult]:
        """:meth:`append` to several sessions in one transaction: every one lands, or none does.

        ``appends`` maps a session id to the messages to append after its head (a
        conversation's new messages and a record that refers to them, say).
        ``expected_heads`` maps some of the sessions to the head the caller read
        (:data:`EMPTY_HEAD` for "empty or new"); each is checked as
        ``append(expected_head=)`` checks it, and a :class:`ConflictError` for one
        session writes nothing for any.  An error about a message names its session.
        Returns each session's result.
        """
        if isinstance(appends, (str, bytes)) or not isinstance(appends, Mapping):
            raise TypeError(f"appends must map session ids to lists of messages, not {type(appends).__name__}")
        prepared: dict[str, Prepared] = {}
        for session_id, messages in appends.items():
            check_session_id(session_id)
            if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
                raise TypeError(
                    f"session {session_id!r}: messages must be a list of message dicts, not {type(messages).__name__}"
                )
            try:
                prepared[session_id] = prepare(messages, None, ephemeral=self._ephemeral, chain=False)
            except InvalidMessageError as e:
                raise InvalidMessageError(f"session {session_id!r}: {e}", index=e.index, path=e.path) from None
        expected = _expected_heads(expected_heads, appends)
        writer = self._writer

        def body(txn: lmdb.Transaction) -> dict[str, FlushResult]:
            return {sid: writer.append(txn, sid, found, expected.get(sid)) for sid, found in prepared.items()}

        self._store.reserve(sum(_room(found, 0) for found in prepared.values()))
        results = self._store.write(body)
        for session_id in prepared:
            self._cache.discard(session_id)
        self._after_write()
        return results

    def rewind(self, session_id: str, *, to: int) -> FlushResult:
        """Keep the first ``to`` messages; tombstone the rest (reason ``rewind``)."""
        check_session_id(session_id)
        return self._write(lambda txn: self._writer.rewind(txn, session_id, to), changes=session_id)

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
        return self._write(
            lambda txn: self._writer.compact(txn, session_id, start, end, prepared, expected), changes=session_id
        )

    def fork(self, source_id: str, new_id: str, at: int | None = None) -> FlushResult:
        """Start session ``new_id`` sharing the first ``at`` live messages of ``source_id``.

        The shared messages keep their node digests; afterwards the two sessions
        evolve independently.  ``at`` defaults to the whole live transcript.
        """
        check_session_id(source_id)
        check_session_id(new_id)
        return self._write(lambda txn: self._writer.fork(txn, source_id, new_id, at))

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
        self._write(lambda txn: self._writer.update(txn, session_id, plain, counters))

    def close_session(self, session_id: str, *, reason: str = "") -> None:
        """Record that the session ended (``reason``: free text such as ``"user_exit"``)."""
        check_session_id(session_id)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, not {type(reason).__name__}")
        self._write(lambda txn: self._writer.close(txn, session_id, reason))

    def redact(
        self,
        session_id: str,
        position: int,
        *,
        reason: str,
        by: str = "",
        seq: int | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
    ) -> list[Redaction]:
        """Erase the content of message ``position`` of the session for good; return the redactions.

        The message's body becomes a placeholder (:func:`eventlog.redact.placeholder`: its role
        and the ids that pair tool calls with results, ``"[redacted]"`` for the text), every
        digest derived from it is derived again, a ``MessageRedacted`` event records ``by``
        (who), ``reason`` (why) and the time, and the data file is replaced by a compacting
        copy, so that its bytes are nowhere in the log directory.  The Merkle tree does not
        change: every checkpoint signed before, and every proof of another message, still
        verifies.  Every other stored copy of the same content is erased with it, each with a
        redaction of its own (returned after the one asked for).  An agent that still holds
        the original message flushes it as the placeholder (the position is sealed).  See
        docs/audit.md ("Redaction").

        ``position`` is a live position; with ``seq``, it is the position of an occurrence
        that event ``seq`` made live, as :meth:`history` lists them (a tombstoned one too).
        ``spill_dir``: a spill directory (:class:`~eventlog.spill.SpillingWriter`) whose files
        are scrubbed of the content as well.  Attached projections are brought up to date
        before this returns.

        Raises :class:`UnknownSessionError`, ``ValueError`` for a position that is not there
        or an empty ``reason``, :class:`RedactedError` for a message redacted already,
        :class:`LogInUseError` (nothing written) while another process has the log open, and
        :class:`EventLogError` when an attached projection fails to catch up afterwards (the
        redaction itself is done).  When scrubbing the spill files or the compacting copy fails
        after the redaction is committed (a full disk: :class:`StorageFullError`; a process
        that opened the log meanwhile: :class:`LogInUseError`; a directory it may not write:
        :class:`ReadOnlyError`; a spill directory others can write: ``UnsafeDirectoryError``),
        the rest still runs (the copy, attached projections brought up to date), and the
        error says that the redaction is recorded and what is left to do (:meth:`vacuum`).
        """
        check_session_id(session_id)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, not {type(reason).__name__}")
        if not reason.strip():
            raise ValueError("reason must say why the message is redacted (it is kept in the log)")
        if not isinstance(by, str):
            raise TypeError(f"by must be a str, not {type(by).__name__}")
        store = self._store
        if store.readonly:
            raise ReadOnlyError(f"{store.path}: the log was opened read-only; a redaction writes")
        if store.shared():
            raise LogInUseError(
                f"{store.path}: another process has the log open; a redaction replaces the data file, "
                "so close the log there first (nothing was written)"
            )
        turn = self._turns_of([session_id])[0]
        try:
            with turn.lock:
                erased = store.write(
                    lambda txn: redaction.redact(store, txn, session_id, position, seq=seq, reason=reason, by=by)
                )
                # Cached lists hold the erased content's digest, and the buffer events are encoded
                # into may still hold its bytes: forget them.
                self._cache.clear()
                store.buffer.data = bytearray()
        finally:
            with self._turns_guard:
                turn.users -= 1
        # The redaction is committed: whatever fails from here on, the rest still runs (the
        # spill files, the compacting copy, the projections), and the caller is told what is
        # left to do.
        left: list[tuple[Exception, str]] = []
        if spill_dir is not None:
            from .spill import scrub

            try:
                scrub(spill_dir, erased.digest)
            except (EventLogError, OSError) as e:
                where = os.fspath(spill_dir)
                left.append(
                    (
                        e,
                        f"the spill files in {where} may still hold it: fold them in with `eventlog recover`, or delete them",
                    )
                )
        try:
            store.vacuum()
        except EventLogError as e:
            left.append((e, "the erased bytes stay in free pages of the data file until `eventlog vacuum` runs"))
        self._after_write()
        synced = self.sync_projections()
        if left:
            first = left[0][0]
            kinds = (LogInUseError, StorageFullError, ReadOnlyError, UnsafeDirectoryError, CorruptLogError)
            kind: type[EventLogError] = next((c for c in kinds if isinstance(first, c)), EventLogError)
            if isinstance(first, OSError) and first.errno in (errno.ENOSPC, errno.EDQUOT):
                kind = StorageFullError
            what = "; ".join(f"{e} ({then})" for e, then in left)
            projections = "" if synced else "; an attached projection also failed to catch up (logged)"
            raise kind(f"the redaction is recorded, but: {what}{projections}") from first
        if not synced:
            raise EventLogError(
                f"{store.path}: the redaction is recorded and erased from the log, but an attached projection "
                "failed to catch up (logged): it holds the content until it does (sync_projections())"
            )
        return erased.redactions

    def vacuum(self) -> dict[str, int]:
        """Replace the data file by a compacting copy: only the pages in use, free pages gone.

        :meth:`redact` does this by itself; call it again when that was refused because
        another process had the log open.  Returns the file's size before and after.  Raises
        :class:`LogInUseError` while another process has the log open.
        """
        before = self._store.vacuum()
        return {"before": before, "after": os.path.getsize(os.path.join(self.path, "data.mdb"))}

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
            return [str(key, "utf-8") for key in cursor.iternext(keys=True, values=False)]

    def __contains__(self, session_id: object) -> bool:
        if not isinstance(session_id, str):
            return False
        with self._store.read() as txn:
            return self._store.session(txn, session_id) is not None

    def messages(
        self,
        session_id: str,
        *,
        last: int | None = None,
        as_of: int | None = None,
        repair_tool_calls: bool = False,
    ) -> list[dict[str, Any]]:
        """The live transcript as wire dicts, ready to resume the agent.

        A session that does not exist reads as empty (``[]``), so a restarted agent
        resumes with ``messages = log.messages(session_id)`` and nothing else.  Values
        come back JSON-like: a tuple that was flushed comes back as a list; ``_`` keys
        and scaffolding were never stored.  ``last=N`` returns only the last ``N`` live
        messages, reading only those (the live chain is indexed by position).
        ``as_of`` replays the transcript as it was right after event ``as_of``.
        ``repair_tool_calls`` returns a copy fixed for model APIs (see
        :func:`eventlog.replay.repair`; with ``last``, the window is repaired); the log
        is not changed.  Raises ``TypeError``/``ValueError`` for a ``last`` or ``as_of``
        that is not an int >= 0.
        """
        check_session_id(session_id)
        if last is not None:
            _count(last, "last")
        if as_of is not None:
            _count(as_of, "as_of")
        store = self._store
        # The live transcript is read from memoryviews of the map (each event is
        # hashed and decoded in place, and no view outlives the transaction).
        with store.read(buffers=as_of is None) as txn:
            state = store.session(txn, session_id)
            if state is None:
                return []
            reader = BodyReader(store, txn)
            if as_of is not None:
                occurrences, live = replay(store, txn, session_id, as_of)
                if last is not None:
                    live = live[len(live) - last :] if last else []
                out = reader.messages((bytes.fromhex(occurrences[i].digest), *occurrences[i].source) for i in live)
            elif last is not None:
                reader.current(session_id, state)
                start = max(0, state.length - last)
                out = reader.messages(store.locations(txn, state.number, state.length, start))
            else:
                reader.current(session_id, state)
                with paused_gc(state.length):
                    found = reader.appended(state)
                    out = (
                        found
                        if found is not None
                        else reader.messages(store.locations(txn, state.number, state.length))
                    )
        return repair(out) if repair_tool_calls else out

    def message(self, session_id: str, position: int) -> dict[str, Any] | None:
        """The live message at ``position`` of the session's transcript, or ``None`` past its end.

        One lookup of the live chain's positional index and one body read, however long
        the transcript (for an index that names a position in a session).  Raises
        ``TypeError``/``ValueError`` for a ``position`` that is not an int >= 0.
        """
        check_session_id(session_id)
        _count(position, "position")
        store = self._store
        with store.read(buffers=True) as txn:
            state = store.session(txn, session_id)
            if state is None or position >= state.length:
                return None
            reader = BodyReader(store, txn)
            reader.current(session_id, state)
            return reader.messages(store.locations(txn, state.number, position + 1, position))[0]

    def session(self, session_id: str) -> SessionInfo | None:
        """What the log knows about a session, without a projection; ``None`` when it does not exist.

        Live length and head, the metadata and summed counters given to
        :meth:`update_session`, the times of its first and newest events, whether it is
        closed (and why), and the session it was forked from.  See
        :class:`~eventlog.replay.SessionInfo`.  Reads one envelope per event of the
        session, and decodes only its opening, metadata and close events.
        """
        check_session_id(session_id)
        with self._store.read(buffers=True) as txn:
            return session_info(self._store, txn, session_id)

    def history(self, session_id: str) -> list[Occurrence]:
        """Every message occurrence of the session in seq order, tombstoned ones included.

        Each entry has the message, its position, node and content digests, the seq
        of the event that made it live, how it got there (``origin``), its display
        override, and its :class:`~eventlog.replay.Tombstone` (reason, seq) or None.
        A session that does not exist has no history (``[]``).  A redacted message shows its
        placeholder and its :class:`~eventlog.redact.Redaction` (who, why, when) in ``redaction``.
        """
        check_session_id(session_id)
        with self._store.read() as txn:
            occurrences, _ = replay(self._store, txn, session_id)
            fill(self._store, txn, occurrences)
            redacted = redaction.redactions_of(self._store, txn, [o.source for o in occurrences])
        for occurrence in occurrences:
            occurrence.redaction = redacted.get(occurrence.source)
        return occurrences

    def events(self, after: int = 0) -> Iterator[Record]:
        """The events with ``seq > after``, in order (``seq`` is gapless from 1).

        Raises ``TypeError``/``ValueError`` at once for an ``after`` that is not an int >= 0.
        """
        return iter_events(self._store, _count(after, "after"))

    @staticmethod
    def format_of(path: str | os.PathLike[str]) -> str | None:
        """The format of the log in directory ``path`` ("1", "2", ...), None when there is none.

        Opening a log of an earlier format for writing upgrades it (:mod:`eventlog.upgrade`).
        """
        return Store.format_of(path)

    def tree_size(self) -> int:
        """How many events the log's Merkle tree holds (all of them, once upgraded)."""
        with self._store.read() as txn:
            return self._store.tree.size(txn)

    def checkpoint(self, signers: Sequence[Signer], *, origin: str | None = None) -> str:
        """Sign the Merkle tree as it is now: a C2SP checkpoint note, also stored in the log.

        ``signers``: :class:`eventlog.signing.KeySigner` (a key file) or
        :class:`eventlog.signing.CommandSigner` (an external command).  ``origin``
        names the log (default ``eventlog/<log id>``).  Publish the note somewhere
        the log's host cannot change; see docs/audit.md.
        """
        return audit.checkpoint(self._store, signers, origin=origin)

    def checkpoints(self) -> list[str]:
        """Every checkpoint note the log issued, oldest first."""
        return audit.checkpoints(self._store)

    def prove(self, session_id: str, position: int, checkpoint: str) -> dict[str, Any]:
        """A JSON-ready proof that live message ``position`` of the session is in the log at ``checkpoint``.

        Checked offline by :func:`eventlog.verifier.verify_proof`.  Raises
        :class:`eventlog.audit.AuditError` when the checkpoint is not of this log, or
        older than the message.
        """
        check_session_id(session_id)
        return audit.prove(self._store, session_id, position, checkpoint)

    def prove_consistency(self, old: str, new: str) -> dict[str, Any]:
        """A JSON-ready proof that the log at checkpoint ``old`` is a prefix of the log at ``new``."""
        return audit.prove_consistency(self._store, old, new)

    def log_head(self) -> LogHead | None:
        """The newest event's seq and hash, to write down and check later; None for an empty log.

        ``verify(expect=[head])`` then fails on a log that no longer holds that event
        with that hash: a restored older copy, or a history rewritten and resealed.
        """
        with self._store.read() as txn:
            seq, digest = self._store.tail(txn)
        return LogHead(seq, digest.hex()) if seq else None

    def verify(
        self,
        *,
        progress: Callable[[int, int], None] | None = None,
        expect: Iterable[LogHead] = (),
        checkpoints: Iterable[str] = (),
        keys: Iterable[Verifier] = (),
    ) -> VerifyReport:
        """Recompute every digest, the event hash chain and the derived indexes.

        Returns a :class:`~eventlog.verify.VerifyReport`: ``.ok``, and ``.problems``
        naming the event and what differs.  ``progress(done, total)`` is called as
        events are checked.  ``expect``: heads written down earlier
        (:meth:`log_head`) that the log must still hold.  ``checkpoints``: signed
        checkpoint notes kept outside the log; each must verify under one of ``keys``
        and the log's tree must have the root it signed at its size.
        """
        return verify(self._store, progress=progress, expect=expect, checkpoints=checkpoints, keys=keys)

    # -- internals -------------------------------------------------------------

    def _write(self, body: Callable[[lmdb.Transaction], T], *, changes: str | None = None, room: int = 0) -> T:
        """A delta write: ``body`` in one write transaction (with ``room`` bytes reserved first);
        then the cached list of the session it ``changes`` is forgotten, and projections told."""
        if room:
            self._store.reserve(room)
        result = self._store.write(body)
        if changes is not None:
            self._cache.discard(changes)
        self._after_write()
        return result

    def _carried(self) -> None:
        """Other processes' flushes were committed by this one: its projections catch up in the background."""
        if self._projector is not None:
            self._projector.poke(self._store.committed_seq)

    def _after_write(self) -> None:
        if self._projector is not None:
            self._projector.poke(self._store.committed_seq)
            return
        for projection in self._projections:
            try:
                projection.catch_up(self)
            except Exception:
                # The log is the source of truth and the write is committed; the
                # projection catches up on its next call.
                logger.exception("projection %r failed to catch up", projection)

    def _overrides(
        self, overrides: Mapping[int, Mapping[str, Any]] | None, prepared: Prepared
    ) -> dict[int, dict[str, Any]]:
        """Validate ``overrides`` and key them by position in the stored transcript."""
        if overrides is None:
            return {}
        if not isinstance(overrides, Mapping):
            raise TypeError(
                f"overrides must be a mapping of message index to display fields, not {type(overrides).__name__}"
            )
        if not overrides:
            return {}
        position_of = {index: position for position, index in enumerate(prepared.kept)}
        out: dict[int, dict[str, Any]] = {}
        for index, override in overrides.items():
            if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(prepared.raw):
                raise ValueError(f"overrides[{index!r}]: no such index in messages (0..{len(prepared.raw) - 1})")
            if not isinstance(override, Mapping):
                raise InvalidMessageError(
                    f"overrides[{index}]: {type(override).__name__} is not a mapping", index=index
                )
            position = position_of.get(index)
            if position is None:
                raise ValueError(f"overrides[{index}]: messages[{index}] is scaffolding and is not stored")
            body = codec.strip(override)
            try:
                codec.check(body, index)
            except InvalidMessageError as e:
                raise InvalidMessageError(
                    str(e).replace("messages[", "overrides[", 1), index=index, path=e.path
                ) from None
            out[position] = body
        return out
