"""The LMDB environment: named databases, key formats, transactions, map growth.

One environment directory per log, four named databases:

``events``    ``seq`` (8 bytes, big-endian) -> envelope + encoded event payload.
              Keys only ever grow, so every put is an append at the right edge.
``meta``      ``b"log_id"`` (16 random bytes), ``b"format"``, ``b"next_sid"``.
``sessions``  session id (UTF-8) -> session number (8 bytes), written once.
``index``     per session number, in one B-tree so that a flush touches few pages:
              ``number + b"c" + position`` -> chain entry (node digest, content digest,
              and the ``(seq, index)`` where the body is stored): the live chain;
              ``number + b"h"`` -> session state (length, head, last seq, closed),
              which sorts right after the chain's last entry;
              ``number + b"n" + position`` -> node + current display override.

Everything but ``events`` and ``meta`` is derived: written in the same transaction as
the events, and rebuildable from the events alone.  Message keys are fixed-width
and big-endian, and a session's writes land at the end of its own key range, so a
flush never inserts at a random (digest-keyed) place in a B-tree, and a commit
dirties the events' right edge and one or two index leaves.

The envelope of a stored event: previous event hash (32 bytes), time in
nanoseconds (8), kind tag (1), session number (8), and the seq of the session's
previous event (8, 0 for its first), then the payload.  The hash of an event is
SHA-256(seq key || envelope || payload), so the whole log is one chain, and each
session's events are linked backwards through the envelope.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import sha256
from itertools import islice
from typing import Any, Final, TypeVar

import lmdb

from . import events as ev
from .errors import CorruptLogError, EventLogError, ReadOnlyError, StorageFullError

T = TypeVar("T")

FORMAT: Final = b"1"

SEQ = struct.Struct(">Q")
PAIR = struct.Struct(">QQ")
HEADER = struct.Struct(">32sQBQQ")
"""Envelope: previous hash, time (ns), kind, session number, session's previous seq."""
STATE = struct.Struct(">Q32sQ32sB")
"""Session state: live length, head node, last seq, hash of that last event, closed flag.

The hash anchors the newest event of the log, which no later event names yet."""
LINK = struct.Struct(">32s32sQI")
"""Chain entry: node digest, content digest, seq and index of the stored body."""
LOCATION = struct.Struct(">32x32sQI")
"""The content digest and body location of a chain entry."""

DURABILITY: Final = {
    # mode: (sync, metasync)
    "full": (True, True),
    "process": (True, False),
    "none": (False, False),
}

MIB = 1 << 20
ZERO_MIN_STEP = 256 * 1024
ZERO_STEP = 8 * MIB
"""Zeroing steps: half the data file's size, between these bounds; a new step starts when less
than a quarter of one is left."""
_ZEROS = bytes(MIB)
_ZERO_VIEW = memoryview(_ZEROS)  # slices without copies
EVENT_BUFFER_KEEP = 4 * MIB
"""A store keeps the buffer it encodes events into for the next event while it stays this small."""
PAGE = 4096
MARKER = "eventlog.id"
"""A file written beside the LMDB files once the log exists (its id in hex): with it, an empty
or missing data file is damage, not a log still being created by another process."""
WAKE_POLL = 0.1
"""Seconds between the looks a waiting thread takes at what it waits for, in case an interrupt
of the thread that was to wake it skipped the wake-up (its state is set before it)."""
READER_CHECK_EVERY = 64
"""Commits between sweeps of reader slots left by dead processes (they pin old pages)."""


@dataclass(slots=True)
class SessionState:
    number: int
    length: int
    head: bytes
    last_seq: int
    last_hash: bytes = bytes(32)
    closed: bool = False
    new: bool = False
    """Created by the open transaction (its id is not registered yet)."""

    def pack(self) -> bytes:
        return STATE.pack(self.length, self.head, self.last_seq, self.last_hash, self.closed)

    @classmethod
    def unpack(cls, number: int, raw: bytes | memoryview) -> SessionState:
        length, head, last_seq, last_hash, closed = STATE.unpack(raw)
        return cls(number, length, head, last_seq, last_hash, bool(closed))


def chain_key(number: int, position: int) -> bytes:
    return SEQ.pack(number) + b"c" + SEQ.pack(position)


def note_key(number: int, position: int) -> bytes:
    return SEQ.pack(number) + b"n" + SEQ.pack(position)


def state_key(number: int) -> bytes:
    return SEQ.pack(number) + b"h"


@dataclass(frozen=True, slots=True)
class Record:
    """An event as stored: its ``seq``, time, hash chain links and decoded payload."""

    seq: int
    time_ns: int
    kind: int
    prev_hash: bytes
    hash: bytes
    event: ev.AnyEvent

    @property
    def session(self) -> str:
        return self.event.session


def translate(e: lmdb.Error, path: str) -> EventLogError:
    """Turn an LMDB error into the event log error a caller can act on."""
    code = getattr(e, "errno", None)
    text = str(e)
    if isinstance(e, lmdb.MapFullError):
        return StorageFullError(f"{path}: the log reached its maximum size ({text})")
    if code == errno.ENOSPC or "No space left" in text:
        return StorageFullError(f"{path}: no space left on device ({text})")
    if (code == errno.EIO or "Input/output error" in text) and _nearly_full(path):
        # LMDB reports a failed write of its pages as EIO; on a full disk, say so.
        return StorageFullError(f"{path}: no space left on device ({text})")
    if isinstance(e, lmdb.ReadonlyError) or code in (errno.EROFS, errno.EACCES, errno.EPERM) or "Read-only" in text:
        return ReadOnlyError(f"{path}: cannot write the log ({text})")
    if isinstance(e, lmdb.PanicError):  # this process's environment, not the files
        return EventLogError(f"{path}: LMDB stopped this process's use of the log ({text}); close and open it again")
    if isinstance(
        e,
        (
            lmdb.CorruptedError,
            lmdb.PageNotFoundError,
            lmdb.InvalidError,
            lmdb.VersionMismatchError,
            lmdb.BadChecksumError,
        ),
    ):
        return CorruptLogError(f"{path}: the log's files are damaged ({type(e).__name__}: {text})")
    return EventLogError(f"{path}: {type(e).__name__}: {text}")


def _nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < 4 * MIB


class Store:
    """An open LMDB environment holding one log.

    Reads and writes are context-managed transactions; :meth:`write` runs a
    function in a write transaction and retries it after growing the map.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "full",
        map_size: int = 16 * MIB,
        max_map_size: int | None = None,
        readonly: bool = False,
    ) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {sorted(DURABILITY)}, not {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self.max_map_size = max_map_size
        sync, metasync = DURABILITY[durability]
        if not readonly:
            os.makedirs(self.path, exist_ok=True)
        elif not os.path.isdir(self.path):
            raise FileNotFoundError(f"{self.path}: no event log here")
        if max_map_size is not None:
            map_size = min(map_size, max_map_size)
        data = os.path.join(self.path, "data.mdb")
        marker = os.path.join(self.path, MARKER)
        if os.path.exists(marker) and (not os.path.exists(data) or os.path.getsize(data) < 2 * PAGE):
            # This directory held a log (the marker is written once it exists), so an empty
            # or missing data file is damage; LMDB would quietly start a new, empty log.
            size = os.path.getsize(data) if os.path.exists(data) else 0
            raise CorruptLogError(
                f"{data}: the data file is missing or truncated ({size} bytes); restore it from a backup"
            )
        for _ in range(100):
            try:
                self.env = lmdb.open(
                    self.path,
                    map_size=map_size,
                    subdir=True,
                    readonly=readonly,
                    sync=sync,
                    metasync=metasync,
                    readahead=False,
                    max_dbs=8,
                    max_readers=512,
                    lock=True,
                )
                break
            except lmdb.MapResizedError:
                # Opening begins a transaction; another process grew the map in between.
                # Opening again reads the new size.
                continue
            except lmdb.Error as e:
                raise translate(e, self.path) from e
        else:
            raise EventLogError(f"{self.path}: the map kept being resized while opening the log")
        try:
            self._check_file_size(data)
            # Reader slots of processes that died holding a transaction pin old pages.
            self.env.reader_check()
            for _ in range(100):
                try:
                    self.events = self.env.open_db(b"events", create=not readonly)
                    self.meta = self.env.open_db(b"meta", create=not readonly)
                    self.sessions = self.env.open_db(b"sessions", create=not readonly)
                    self.index = self.env.open_db(b"index", create=not readonly)
                    break
                except lmdb.MapResizedError:
                    self.env.set_mapsize(0)  # another process grew the map: adopt its size
        except lmdb.Error as e:
            self.env.close()
            raise translate(e, self.path) from e
        except BaseException:
            self.env.close()
            raise
        self._identity = _file_identity(data)
        # In-process coordination: one writer at a time, and no transaction open
        # while the map is resized (LMDB requires that of set_mapsize).
        self._group = threading.Lock()  # guards the queue and the leader flag
        self._queue: list[_Request] = []
        self._leading = False  # a thread is committing a group
        self._holder: _Request | None = None  # the request whose caller leads, while one does
        self._last_group = 0  # how many writes the last commit carried
        self.max_group = 64
        self.commits = 0  # write transactions committed by this process
        self.grouped_writes = 0  # writes those commits carried
        # Re-entrant (a signal handler may read while its thread holds it), and always taken
        # directly (``with self._slot_lock``), never through the Condition's Python __enter__:
        # an interrupt landing as that returns would leave the lock held for good.
        self._slot_lock = threading.RLock()
        self._cond = threading.Condition(self._slot_lock)
        self._active = 0
        self._local = _PerThread()
        self._held: defaultdict[int, int] = defaultdict(int)  # thread -> transaction slots it holds
        self._resizing = False
        self._closed = False
        self._tail = (0, bytes(32))  # last committed event seen by this process: (seq, hash)
        # Synced commits write into space zeroed ahead of time (see _preallocate).
        self._zero_fd = os.open(data, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)) if sync and not readonly else None
        self._page_size = self.env.stat()["psize"]
        self._zeroed = 0  # the data file's size after our last zeroing
        self._zero_retry = 0  # no zeroing before this many commits (after a failure)
        self._pending_tail: tuple[int, bytes] | None = None  # written by the open write transaction
        self._map_filled_by: _Request | None = None  # the write a group's map ran out of room in
        self._event_buffer = bytearray()  # see Batch.emit
        self._pid = os.getpid()  # an environment must not be used across fork()
        try:
            self.log_id = self._init_meta() if not readonly else self._read_log_id()
            if not readonly and not os.path.exists(marker):
                _write_marker(marker, self.log_id)
        except BaseException:
            if self._zero_fd is not None:
                os.close(self._zero_fd)
            self.env.close()
            raise

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the environment once no other thread of this process has a transaction open.

        Slots this thread holds do not hold up its own close: one entered as an interrupt
        (Ctrl-C) landed stays counted while the exception lives, and ``close()`` in the
        ``except`` block that caught it must not wait for itself.
        """
        with self._slot_lock:
            self._closed = True
            own = self._held.get(threading.get_ident(), 0)
            while not self._cond.wait_for(lambda: self._active <= own, timeout=WAKE_POLL):
                pass
        if self._zero_fd is not None:
            os.close(self._zero_fd)
            self._zero_fd = None
        self.env.close()

    def _init_meta(self) -> bytes:
        def init(txn: lmdb.Transaction) -> bytes:
            fmt = txn.get(b"format", db=self.meta)
            if fmt is None:
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"log_id", os.urandom(16), db=self.meta)
                txn.put(b"next_sid", SEQ.pack(1), db=self.meta)
            elif fmt != FORMAT:
                raise CorruptLogError(f"{self.path}: unknown log format {fmt!r}")
            log_id = txn.get(b"log_id", db=self.meta)
            if log_id is None or len(log_id) != 16:
                raise CorruptLogError(f"{self.path}: the log has no valid id")
            return bytes(log_id)

        with self.read() as txn:
            found = txn.get(b"log_id", db=self.meta)
            if found is not None and txn.get(b"format", db=self.meta) == FORMAT:
                return bytes(found)
        return self.write(init)

    def _read_log_id(self) -> bytes:
        with self.read() as txn:
            found = txn.get(b"log_id", db=self.meta)
        if found is None:
            raise CorruptLogError(f"{self.path}: not an event log (no id)")
        return bytes(found)

    def _check_file_size(self, data: str) -> None:
        """Refuse a data file shorter than the pages its meta page says are in use.

        Reading past the end of a truncated, memory-mapped file would kill the
        process with SIGBUS instead of raising.
        """
        info = self.env.info()
        needed = (info["last_pgno"] + 1) * self.env.stat()["psize"]
        size = os.path.getsize(data) if os.path.exists(data) else 0
        if size < needed:
            raise CorruptLogError(
                f"{data}: the data file is truncated ({size} bytes, {needed} in use); restore it from a backup"
            )

    def _check_identity(self) -> None:
        """Refuse to write when the log's files were replaced or removed under this process."""
        if _file_identity(os.path.join(self.path, "data.mdb")) != self._identity:
            raise CorruptLogError(
                f"{self.path}: the log's files were replaced or removed while it was open; reopen the log"
            )

    # -- transactions ----------------------------------------------------------

    @contextmanager
    def _slot(self) -> Iterator[None]:
        if os.getpid() != self._pid:
            # LMDB's locks and map belong to the process that opened the environment.
            raise EventLogError(
                f"{self.path}: the log was opened in process {self._pid}, before a fork(); "
                "open it again in this process"
            )
        counted = False
        me = threading.get_ident()  # the generator may be finished on another thread
        try:
            with self._slot_lock:
                if self._closed:
                    raise EventLogError(f"{self.path}: the log is closed")
                while not self._cond.wait_for(lambda: not self._resizing, timeout=WAKE_POLL):
                    pass  # polled: an interrupt of the resizing thread may skip its notify
                self._active += 1
                self._held[me] += 1
                counted = True
            yield
        finally:
            if counted:
                with self._slot_lock:
                    self._active -= 1
                    self._held[me] -= 1
                    if not self._held[me]:
                        del self._held[me]
                with self._slot_lock:
                    self._cond.notify_all()  # if an interrupt skips this, waiters look again soon

    def _resize(self, new_size: int) -> None:
        """Set the map size (0: adopt the size another process set) with no transaction open here."""
        with self._slot_lock:
            self._resizing = True
            try:
                while not self._cond.wait_for(lambda: self._active == 0, timeout=WAKE_POLL):
                    pass
                self.env.set_mapsize(new_size)
            finally:
                self._resizing = False
                self._cond.notify_all()

    @contextmanager
    def read(self, *, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot transaction.

        With ``buffers``, values are read as memoryviews of the map rather than
        copied: nothing that refers to one may outlive the transaction.
        """
        self._check_identity()
        while True:
            with self._slot():
                try:
                    txn = self.env.begin(write=False, buffers=True) if buffers else self.env.begin(write=False)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise translate(e, self.path) from e
                if txn is not None:
                    try:
                        yield txn
                    except lmdb.Error as e:
                        raise translate(e, self.path) from e
                    finally:
                        txn.abort()
                    return
            self._resize(0)

    def write(self, body: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``body(txn)`` in a write transaction, commit it, and return its result.

        All of ``body`` lands or none of it does, and this returns only after the
        commit that holds it (synced as the durability mode says).  ``body`` must not
        have side effects outside the transaction: it may run more than once.

        Group commit: writes that arrive from other threads while a commit is in
        flight wait, and the next writer commits all of them in one LMDB transaction
        (one sync for the group), each in its own nested transaction, so a body that
        raises fails its own caller alone and leaves nothing behind.  A leader keeps
        committing groups until its own write is in one; waiters are woken as soon as
        the commit that holds their write is done.
        """
        local = self._local
        if local.writing:
            # This thread is inside a write already (a signal handler that writes, run in the
            # middle of one): waiting here could mean waiting for itself.
            raise EventLogError(
                f"{self.path}: a write was started while this thread is inside another write of this log "
                "(from a signal handler?); nothing of it was written: write after the interrupted call "
                "returns, for example in a finally block"
            )
        try:
            local.writing = True
            return self._write(_Request(body))
        finally:
            local.writing = False

    def _write(self, request: _Request) -> Any:
        # One try for the whole turn, so that an interrupt (Ctrl-C) anywhere leaves the queue
        # and the lead as the other writers need them; the finally makes no Python call before
        # the lead is passed on (an interrupt can land as a Python function starts).
        try:
            with self._group:
                self._queue.append(request)
                if not self._leading:
                    self._holder = request  # named before its lead is set, as everywhere (_take_lead_left_behind)
                    request.lead = True  # then: an interrupt after this leaves a lead to pass on
                    self._leading = True
            if not request.lead:
                # Woken once: a commit held this write, or the lead was handed to it.  Polled, in
                # case an interrupt of the leader skipped the release after marking it done, or
                # left the lead with a caller that is gone (see _take_lead_left_behind).
                while not request.wake.acquire(timeout=WAKE_POLL) and not (request.done or request.lead):
                    self._take_lead_left_behind(request)
                if not request.done and not request.lead:
                    # The leader was interrupted before it could say what became of this write.
                    raise _not_written(self.path, KeyboardInterrupt())
            while not request.done:  # this caller leads: commit groups until one holds its write
                if self._last_group > 1:
                    # Other threads were writing a moment ago: let those that are ready
                    # join this commit (one sync for all) before taking the queue.
                    time.sleep(0)
                group: list[_Request] = []
                try:
                    with self._group:
                        group = self._queue[: self.max_group]
                        del self._queue[: self.max_group]
                    self._commit_group(group)
                except BaseException as e:
                    # Every write of the group not yet acknowledged fails with it (an interrupt
                    # of this thread is not theirs: they hear that nothing of theirs was stored).
                    for other in group:
                        if not other.done:
                            other.abandoned = True  # taken, even if the interrupt came before the del
                    _fail(
                        [r for r in group if not r.done], e if isinstance(e, Exception) else _not_written(self.path, e)
                    )
                    raise
                finally:
                    for other in group:
                        if other is not request and not other.woken:
                            other.woken = True
                            other.wake.release()  # wake exactly the callers this commit acknowledged
        finally:
            with self._group:
                if not request.done:
                    request.abandoned = True  # interrupted before a commit held it: it never runs now
                if request.lead:
                    request.lead = False
                    queue = self._queue
                    following = queue[0] if queue else None  # no call here: one could end in an interrupt
                    if following is request:
                        following = queue[1] if queue[1:] else None
                    if following is None:
                        self._holder = None
                        self._leading = False
                    else:
                        self._holder = following
                        following.lead = following.woken = True
                        following.wake.release()
                if request in self._queue:  # an interrupt after the release leaves it queued, abandoned: never run
                    self._queue.remove(request)
        if request.error is not None:
            raise request.error
        return request.result

    def _take_lead_left_behind(self, request: _Request) -> None:
        """Take the lead for ``request`` (a waiting caller) if the request holding it is done or
        abandoned: its caller has left, or is leaving without committing again.

        A caller leaving a write passes the lead on in its ``finally``; a second interrupt can
        cut that short, or the lead can go to a queued request whose caller an interrupt took
        away before it could leave the queue.  Either way no thread would lead again and every
        waiter would wait for ever; the first waiter to look (every :data:`WAKE_POLL` seconds)
        leads instead.  A caller that is still passing the lead on finds it taken and leaves.

        The holder is always named before its lead is set, so an interrupt between the two
        leaves either the old holder, done or abandoned (a waiter takes over), or ``request``
        named without its lead (it takes the lead it was being handed).  The other way round,
        a waiter would take over from a holder that had already handed a live lead on, and
        two callers would lead at once.
        """
        with self._group:
            holder = self._holder
            if holder is None or request.done or request.lead:
                return
            if holder is not request:
                if not (holder.done or holder.abandoned):
                    return
                holder.lead = False
            self._holder = request
            request.lead = request.woken = True

    def _commit_group(self, group: list[_Request]) -> None:
        """Run every request of ``group`` in one write transaction and commit once."""
        if any(request.abandoned for request in group):  # callers interrupted before a group took them
            _fail(
                [r for r in group if r.abandoned],
                EventLogError(f"{self.path}: the write was abandoned before it was committed"),
            )
            group = [r for r in group if not r.abandoned]
            if not group:
                return
        try:
            self._check_identity()
        except CorruptLogError as e:
            _fail(group, e)
            return
        if self.commits % READER_CHECK_EVERY == READER_CHECK_EVERY - 1:
            self.env.reader_check()
        while True:
            with self._slot():
                try:
                    txn = self.env.begin(write=True)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    _fail(group, translate(e, self.path))
                    return
                grow_to = 0
                if txn is not None:
                    self._pending_tail = None  # this transaction's own, for _landed()
                    try:
                        if self._zero_fd is not None:
                            self._preallocate()
                        self._run_group(txn, group)
                        txn.commit()
                        self._committed(group)  # in the try: an interrupt here is found by _landed()
                    except _BodyFailed:
                        txn.abort()
                        group[0].done = True
                        return
                    except lmdb.MapFullError:
                        txn.abort()
                        if self.env.reader_check():
                            continue  # dead readers pinned free pages; retry before growing
                        try:
                            grow_to = self._next_size()
                        except StorageFullError as e:
                            culprit = self._map_filled_by
                            if culprit is None or len(group) == 1:
                                _fail(group, e)
                                return
                            # The write that filled the largest map fails alone; the others
                            # are committed without it (each may still fill it in turn).
                            _fail([culprit], e)
                            group = [r for r in group if r is not culprit]
                            continue
                    except lmdb.Error as e:
                        txn.abort()
                        _fail(group, translate(e, self.path))
                        return
                    except BaseException as e:
                        txn.abort()  # nothing to undo if the commit itself went through
                        if self._landed():
                            # Interrupted (Ctrl-C) as LMDB's commit returned: every write of the
                            # group is stored, and its caller is told so; only this thread stops.
                            self._committed(group)
                        else:
                            _fail(group, e if isinstance(e, Exception) else _not_written(self.path, e))
                        raise
                    else:
                        return
            self._resize(grow_to)

    def _committed(self, group: list[_Request]) -> None:
        """Mark ``group`` stored (run again by the interrupt path when an interrupt cut it short)."""
        for request in group:
            request.done = True
        if self._pending_tail is not None:
            self._tail = self._pending_tail
        self.commits += 1
        self.grouped_writes += len(group)
        self._last_group = len(group)

    def _landed(self) -> bool:
        """Whether the write transaction just cut short was committed all the same.

        Python raises an interrupt once the C call it arrived during returns, so it can follow
        a commit that went through.  The transaction's last event is then in the log: its
        hash names it and every event before it.  (Called inside the writer's slot.)
        """
        if self._pending_tail is None:
            return False  # the group wrote no event
        seq, digest = self._pending_tail
        txn = self.env.begin(write=False)
        try:
            raw = txn.get(SEQ.pack(seq), db=self.events)
            return raw is not None and event_hash(seq, raw) == digest
        finally:
            txn.abort()

    def _run_group(self, txn: lmdb.Transaction, group: list[_Request]) -> None:
        self._pending_tail = None
        self._map_filled_by = None
        if len(group) == 1:
            # Alone: the body's failure aborts the whole (single-caller) transaction.
            request = group[0]
            request.error = None
            try:
                request.result = request.body(txn)
            except lmdb.Error:
                raise
            except Exception as e:
                request.error = e
                raise _BodyFailed from e
            return
        for request in group:
            request.error = None
            before = self._pending_tail
            child = self.env.begin(write=True, parent=txn)
            try:
                request.result = request.body(child)
                child.commit()
            except lmdb.MapFullError:
                child.abort()
                self._map_filled_by = request
                raise
            except lmdb.Error as e:
                child.abort()
                request.error = translate(e, self.path)
                self._pending_tail = before
            except Exception as e:
                child.abort()
                request.error = e
                self._pending_tail = before

    def _preallocate(self) -> None:
        """Keep zeroed, synced space after the last page of the data file (inside a write transaction).

        LMDB extends ``data.mdb`` page by page as it grows, and on ext4 and most other
        file systems a sync that also has to record new blocks and a new file size costs
        a journal commit on top of the data write.  Writing into blocks that already
        exist does not, so the file is kept ahead of LMDB in zeroed blocks, in steps of
        half its size up to :data:`ZERO_STEP` (measured: a commit of ten messages 12%
        cheaper with full sync, 20% with process sync).  Only zeros are written, only past the end of the
        file, and only while this process holds LMDB's writer lock, so no page in use
        or being written is touched; the space is ordinary free space to LMDB.  A
        failure (a full disk) is left for LMDB's own write to report.
        """
        fd = self._zero_fd
        assert fd is not None
        if self.commits < self._zero_retry:
            return
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self._page_size
        # Steps grow with the file (a small log stays small), up to ZERO_STEP.
        step = min(ZERO_STEP, max(ZERO_MIN_STEP, used // 2))
        if self._zeroed - used >= step // 4:
            return
        size = os.fstat(fd).st_size  # another process may have zeroed or extended it
        end = min(info["map_size"], max(size, used) + step)
        if size - used >= step // 4 or end <= size:
            self._zeroed = size
            return
        try:
            offset = size
            while offset < end:
                offset += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), end - offset)], offset)
            os.fdatasync(fd)
        except OSError:  # a full disk: LMDB's own write reports it; try again much later
            self._zeroed = os.fstat(fd).st_size
            self._zero_retry = self.commits + 1024
            return
        self._zeroed = end

    def reserve(self, nbytes: int) -> None:
        """Grow the map ahead of a write of about ``nbytes``, so it need not be retried.

        Small writes skip this: growing on ``MapFullError`` and retrying is cheap for them.
        """
        if nbytes < 4 * MIB:
            return
        with self._slot():  # another thread may be resizing the map: read it in a slot
            info = self.env.info()
        used = (info["last_pgno"] + 1) * self._page_size
        wanted = used + 2 * nbytes + MIB
        if wanted <= info["map_size"]:
            return
        size = info["map_size"]
        while size < wanted:
            size = size * 2 if size < 4096 * MIB else size + size // 4
        if self.max_map_size is not None:
            size = min(size, self.max_map_size)
        if size > info["map_size"]:
            self._resize(size)

    def _next_size(self) -> int:
        current = self.env.info()["map_size"]
        # Double while small, then grow by a quarter: sparse files make a large map cheap,
        # but address space and the size reported by tools should stay sensible.
        grown = current * 2 if current < 4096 * MIB else current + current // 4
        if self.max_map_size is not None:
            if current >= self.max_map_size:
                raise StorageFullError(f"{self.path}: the log reached its maximum size of {self.max_map_size} bytes")
            grown = min(grown, self.max_map_size)
        return grown

    # -- reading helpers -------------------------------------------------------

    def tail(self, txn: lmdb.Transaction) -> tuple[int, bytes]:
        """The seq and hash of the last event (0 and zeros for an empty log)."""
        cursor = txn.cursor(db=self.events)
        if not cursor.last():
            return 0, bytes(32)
        seq = SEQ.unpack(cursor.key())[0]
        # The open write transaction's own last event, else the last committed one
        # this process knows; anything else (another process wrote) is hashed afresh.
        for known in (self._pending_tail, self._tail):
            if known is not None and known[0] == seq:
                return known
        return seq, event_hash(seq, cursor.value())

    def last_seq(self, txn: lmdb.Transaction) -> int:
        cursor = txn.cursor(db=self.events)
        return SEQ.unpack(cursor.key())[0] if cursor.last() else 0

    def session(self, txn: lmdb.Transaction, session_id: str) -> SessionState | None:
        raw = txn.get(session_id.encode("utf-8"), db=self.sessions)
        if raw is None:
            return None
        try:
            number = SEQ.unpack(raw)[0]
            state = txn.get(state_key(number), db=self.index)
            if state is None:
                raise CorruptLogError(f"{self.path}: session {session_id!r} has no state in the index")
            return SessionState.unpack(number, state)
        except struct.error:
            raise CorruptLogError(
                f"{self.path}: session {session_id!r} has a damaged entry in the index (run verify)"
            ) from None

    def link(self, txn: lmdb.Transaction, number: int, position: int) -> tuple[bytes, bytes, int, int]:
        raw = txn.get(chain_key(number, position), db=self.index)
        if raw is None:
            raise CorruptLogError(f"{self.path}: live chain entry {number}/{position} is missing")
        try:
            return LINK.unpack(raw)
        except struct.error:
            raise self._damaged_chain(number) from None

    def _damaged_chain(self, number: int) -> CorruptLogError:
        return CorruptLogError(f"{self.path}: the live chain of session {number} has a damaged entry (run verify)")

    def links(self, txn: lmdb.Transaction, number: int, start: int, stop: int) -> list[tuple[bytes, bytes, int, int]]:
        """Chain entries for positions ``start .. stop-1`` of session ``number``."""
        out: list[tuple[bytes, bytes, int, int]] = []
        if stop <= start:
            return out
        cursor = txn.cursor(db=self.index)
        if not cursor.set_key(chain_key(number, start)):
            raise CorruptLogError(f"{self.path}: live chain entry {number}/{start} is missing")
        unpack = LINK.unpack
        last = chain_key(number, stop - 1)
        try:
            for key, value in cursor:
                out.append(unpack(value))
                if key >= last:
                    break
        except struct.error:
            raise self._damaged_chain(number) from None
        if len(out) != stop - start or key != last:
            raise CorruptLogError(f"{self.path}: live chain of session {number} is shorter than its length")
        return out

    def locations(self, txn: lmdb.Transaction, number: int, length: int) -> list[tuple[bytes, int, int]]:
        """The content digest and body location of each live message of session ``number``, in order."""
        if not length:
            return []
        cursor = txn.cursor(db=self.index)
        if not cursor.set_key(chain_key(number, 0)):
            raise CorruptLogError(f"{self.path}: live chain entry {number}/0 is missing")
        values = cursor.iternext(keys=False, values=True)
        try:
            found = list(map(LOCATION.unpack, islice(values, length)))
        except struct.error:
            raise self._damaged_chain(number) from None
        if len(found) != length or cursor.key() != chain_key(number, length - 1):
            raise CorruptLogError(f"{self.path}: live chain of session {number} is shorter than its length")
        return found

    def raw_event(self, txn: lmdb.Transaction, seq: int) -> bytes | None:
        return txn.get(SEQ.pack(seq), db=self.events)

    def load(self, seq: int, raw: bytes) -> Record:
        """Decode a stored event (the payload is decoded here, at the boundary)."""
        event = self.decode(seq, raw)  # first: it refuses an event shorter than its envelope
        prev, t, kind, _number, _before = HEADER.unpack_from(raw)
        return Record(seq, t, kind, prev, event_hash(seq, raw), event)

    def decode(self, seq: int, raw: bytes) -> ev.AnyEvent:
        """The payload of a stored event, for a reader that has its hash already (or needs none)."""
        try:
            if len(raw) < HEADER.size:
                raise ValueError(f"{len(raw)} bytes, shorter than its envelope")
            return ev.decoder.decode(memoryview(raw)[HEADER.size :])
        except Exception as e:
            raise CorruptLogError(f"{self.path}: event {seq} cannot be decoded ({e})") from e


class _Request:
    """A write waiting for (or done by) a group commit."""

    __slots__ = ("abandoned", "body", "done", "error", "lead", "result", "wake", "woken")

    def __init__(self, body: Callable[[lmdb.Transaction], object]) -> None:
        self.body = body
        self.done = False
        self.lead = False  # this caller leads the next group (set before its wake is released)
        self.abandoned = False  # its caller stopped waiting: never run it
        self.woken = False  # its wake lock was released (it is released once)
        self.result: object = None
        self.error: BaseException | None = None
        self.wake = threading.Lock()  # released once, to wake the waiting caller
        self.wake.acquire()


class _PerThread(threading.local):
    """What a store knows about the thread using it."""

    writing = False  # inside write(): a write from here now would wait for itself


class _BodyFailed(Exception):
    """A lone request's body raised; its error is on the request."""


def _not_written(path: str, interrupt: BaseException) -> EventLogError:
    """What the other writers of a group hear when the thread committing it was interrupted
    before the commit: nothing of theirs was stored, so they may retry."""
    return EventLogError(
        f"{path}: not written: the thread committing this write with others was interrupted "
        f"({type(interrupt).__name__}) before the commit; nothing of it was stored"
    )


def _fail(group: list[_Request], error: BaseException) -> None:
    for request in group:
        request.error = error
        request.done = True


def _write_marker(path: str, log_id: bytes) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as handle:
        handle.write(log_id.hex() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def event_hash(seq: int, raw: bytes) -> bytes:
    return sha256(SEQ.pack(seq) + raw).digest()


class Batch:
    """The events of one write transaction, chained to the log's tail.

    ``emit`` appends an event, linking it to the previous event of the log and of
    its session.  It runs inside the caller's write transaction.
    """

    __slots__ = ("hash", "now", "seq", "store", "txn")

    def __init__(self, store: Store, txn: lmdb.Transaction, now: int | None = None) -> None:
        self.store = store
        self.txn = txn
        self.seq, self.hash = store.tail(txn)
        self.now = time.time_ns() if now is None else now

    def emit(self, event: ev.AnyEvent, state: SessionState, size: int = 0) -> int:
        """Append ``event`` to the transaction; ``size`` is about how many bytes its encoding
        takes, when the caller knows it (a batch of message bodies)."""
        seq = self.seq + 1
        # The envelope and the event are encoded into one buffer (no copy of the bodies),
        # and the store keeps that buffer from one event to the next.  A fresh buffer per
        # event grows by reallocations up to the event's size and is freed after it: for
        # the megabyte of a bulk flush, the C allocator hands that memory back to the
        # system and faults it in again at every flush (measured: a fifth of the cost of
        # an import in a fresh process).  The buffer is first filled up to ``size``,
        # because the encoder takes a buffer's length as its room: a shorter one it
        # would first shrink, to the length of the last event.
        raw = self.store._event_buffer
        want = HEADER.size + size
        while len(raw) < want:
            raw += _ZERO_VIEW[: want - len(raw)]
        HEADER.pack_into(raw, 0, self.hash, self.now, ev.KIND[type(event)], state.number, state.last_seq)
        ev.encoder.encode_into(event, raw, HEADER.size)
        if len(raw) > EVENT_BUFFER_KEEP:
            self.store._event_buffer = bytearray()  # a rare, large event: its memory goes back
        key = SEQ.pack(seq)
        if not self.txn.put(key, raw, db=self.store.events, append=True, overwrite=False):
            raise CorruptLogError(f"{self.store.path}: event {seq} already exists")
        self.seq = seq
        digest = sha256(key)
        digest.update(raw)
        self.hash = digest.digest()
        self.store._pending_tail = (seq, self.hash)
        state.last_seq = seq
        state.last_hash = self.hash
        return seq

    def save(self, session_id: str, state: SessionState) -> None:
        """Write the session's state (and register its id when it is new)."""
        if state.new:
            self.txn.put(session_id.encode("utf-8"), SEQ.pack(state.number), db=self.store.sessions)
            state.new = False
        self.txn.put(state_key(state.number), state.pack(), db=self.store.index)

    def new_session_number(self) -> int:
        raw = self.txn.get(b"next_sid", db=self.store.meta)
        if raw is not None and len(raw) != SEQ.size:
            raise CorruptLogError(f"{self.store.path}: the session counter is damaged (run verify)")
        number = SEQ.unpack(raw)[0] if raw is not None else 1
        if self.txn.get(state_key(number), db=self.store.index) is not None:
            # A counter moved back would give a new session another one's messages.
            raise CorruptLogError(
                f"{self.store.path}: the session counter names session number {number}, which is taken (run verify)"
            )
        self.txn.put(b"next_sid", SEQ.pack(number + 1), db=self.store.meta)
        return number


def iter_events(store: Store, after: int = 0, batch: int = 1024) -> Iterator[Record]:
    """Events with ``seq > after`` in order, read in short transactions of ``batch`` events."""
    nxt = after + 1
    while True:
        chunk: list[tuple[int, bytes]] = []
        with store.read() as txn:
            cursor = txn.cursor(db=store.events)
            if not cursor.set_range(SEQ.pack(nxt)):
                return
            for key, value in cursor:
                chunk.append((SEQ.unpack(key)[0], value))
                if len(chunk) >= batch:
                    break
        for seq, raw in chunk:
            yield store.load(seq, raw)
        if len(chunk) < batch:
            return
        nxt = chunk[-1][0] + 1
