"""The LMDB environment of one log: opening it, transactions, and the reads every module shares.

One environment directory per log, four named databases (key formats in
:mod:`eventlog.keys`, the layout in docs/design.md):

``events``    ``seq`` -> envelope + encoded event payload; keys only ever grow, so
              every put is an append at the right edge.
``meta``      the log's id, its format, the next session number.
``sessions``  session id -> session number, written once.
``index``     per session number, in one B-tree so that a flush touches few pages:
              the live chain, the session's state, display overrides.

Everything but ``events`` and ``meta`` is derived: written in the same transaction as
the events, and rebuildable from the events alone.  Writes go through
:mod:`eventlog.commit` (group commit); the map grows by :mod:`eventlog.space`.

The envelope of a stored event: previous event hash (32 bytes), time in
nanoseconds (8), kind tag (1), session number (8), and the seq of the session's
previous event (8, 0 for its first), then the payload.  The hash of an event is
SHA-256(seq key || envelope || payload), so the whole log is one chain, and each
session's events are linked backwards through the envelope.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import struct
import tempfile
import threading
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import islice
from typing import Any, Final, TypeVar

import lmdb

from . import events as ev
from .commit import WAKE_POLL, GroupCommit, Tip
from .errors import (
    CorruptLogError,
    EventLogError,
    LogInUseError,
    ReadOnlyError,
    StorageFullError,
    UnsafeDirectoryError,
    translate,
)
from .files import check_private_directory, open_own_file, reserve_lock_file, write_atomic
from .keys import (
    FORMAT,
    HEADER,
    LINK,
    LOCATION,
    REDACTIONS_DB,
    SEQ,
    STATE,
    Record,
    SessionState,
    chain_key,
    event_hash,
    got,
    note_key,
    pairs,
    state_key,
)
from .overlap import sha256_during
from .space import MIB, RESERVE_FROM, ZeroedSpace, grown_size, reserved_size
from .tree import CHECKPOINTS_DB, TREE_DB, Tree, leaf_input
from .upgrade import UPGRADABLE, upgrade

__all__ = [
    "DURABILITY",
    "HEADER",
    "LINK",
    "SEQ",
    "STATE",
    "Batch",
    "Record",
    "SessionState",
    "Store",
    "chain_key",
    "event_hash",
    "iter_events",
    "note_key",
    "state_key",
    "translate",
]

T = TypeVar("T")

DURABILITY: Final = {
    # mode: (sync, meta page synced); what each survives is in docs/design.md.  LMDB itself
    # syncs the data pages under its writer lock; the meta page of a ``full`` commit is synced
    # after the lock is released (eventlog/commit.py), so other processes' commits go ahead
    # meanwhile and a later commit's sync can carry it.
    "full": (True, True),
    "process": (True, False),
    "none": (False, False),
}

_ZERO_VIEW = memoryview(bytes(MIB))  # slices without copies
EVENT_BUFFER_KEEP = 4 * MIB
"""A store keeps the buffer it encodes events into for the next event while it stays this small."""
HASHES_KEPT: Final = 64
"""How many of the newest events this process wrote :class:`WrittenHashes` remembers."""
HASHED_EVENT_MAX: Final = 64 * 1024
"""Bytes of the largest event it remembers (a turn's is about ten kilobytes)."""
PAGE = 4096
MARKER = "eventlog.id"
"""A file written beside the LMDB files once the log exists (its id in hex): with it, an empty
or missing data file is damage, not a log still being created by another process."""


def _prepare_files(path: str, readonly: bool, allow_shared: bool) -> bool:
    """Refuse a directory others can write, and create LMDB's files safely before it opens them.

    LMDB opens ``lock.mdb`` and ``data.mdb`` by name, following symlinks; so they are
    created here first with ``O_NOFOLLOW``, and a planted link or another user's file is
    refused.  The lock file also gets its blocks (see :func:`~eventlog.files.reserve_lock_file`),
    so that a full disk is :class:`StorageFullError`, not SIGBUS.

    Returns whether LMDB may use its lock file.  A read-only open of another user's
    directory (a service's log, writable by its owner only) or of a lock file this process
    may not write reads without it: nothing in the directory is then opened for writing.
    """
    try:
        if readonly:
            try:
                check_private_directory(path, what="log", allow_shared=allow_shared)
            except UnsafeDirectoryError:
                if os.stat(path).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                    raise  # others could plant files in it
                return False  # another user's private directory (a service's log): opened for reading only
        else:
            check_private_directory(path, what="log", allow_shared=allow_shared)
        lock = os.path.join(path, "lock.mdb")
        if not readonly:
            reserve_lock_file(lock)
            os.close(open_own_file(os.path.join(path, "data.mdb"), create=True))
        elif os.path.lexists(lock):
            try:
                os.close(open_own_file(lock, create=False))
            except UnsafeDirectoryError:
                raise
            except OSError as e:
                if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                    return False  # a read-only file system or a file we may not write: LMDB reads without it
                raise
        return True
    except UnsafeDirectoryError:
        raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFullError(f"{path}: no space left on device for the log's files ({e})") from e
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise ReadOnlyError(f"{path}: cannot write the log's files ({e})") from e
        raise


def _copy_error(path: str, e: OSError) -> EventLogError:
    """The error a compacting copy that the file system refused is reported as (the old file stays in place)."""
    if isinstance(e, EventLogError):
        return e
    text = f"{path}: the compacting copy of the data file failed, the data file is unchanged ({e})"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"{text}; it needs room for the whole file once more")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return ReadOnlyError(text)
    return EventLogError(text)


COPY_PREFIX: Final = ".compact-"
"""The name prefix of the scratch directory a compacting copy is made in (inside the log directory)."""


def _remove_stale_copies(path: str) -> None:
    """Remove what compacting copies cut short (a process killed during one) left in the log directory.

    Called holding the open lock exclusively: no other process's copy is under way.  Each is a
    directory holding a partial copy of the data file, as big as the file: left in place, they
    would fill the disk one interrupted copy at a time.  A symbolic link is unlinked, never followed.
    """
    for entry in os.scandir(path):
        if not entry.name.startswith(COPY_PREFIX):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                pass


UNVACUUMED: Final = b"unvacuumed"
"""The ``meta`` key a redaction sets (to the seq of its last event) and a compacting copy clears:
while it is there, the data file's free pages may still hold erased content (the process that
redacted was stopped, or its copy refused, before the copy was swapped in)."""


OPEN_LOCK = "eventlog.open"
"""A file beside the LMDB files that every process with the log open holds a shared ``flock`` on
(from before its environment opens until it closes): a compacting copy (:meth:`Store.vacuum`)
is swapped in only by a process that gets it exclusively, and a process opening the log
meanwhile waits for it."""


def _hold_open_lock(path: str, readonly: bool) -> int | None:
    """Open :data:`OPEN_LOCK` and take it shared (waiting while a compacting copy is swapped in).

    None for a read-only open that cannot use it (no such file, another user's directory): like
    a reader without LMDB's lock file, it must not read while the log is written."""
    try:
        fd = open_own_file(os.path.join(path, OPEN_LOCK), create=not readonly)
    except (FileNotFoundError, UnsafeDirectoryError, PermissionError):
        if readonly:
            return None
        raise
    except OSError as e:
        if readonly and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return None
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


_OPEN: weakref.WeakSet[Store] = weakref.WeakSet()
"""Every store open in this process, for :func:`_inherited_by_child`."""


def _inherited_by_child() -> None:
    """After ``fork()``, in the child: keep every inherited environment and open read
    transaction alive for good.

    The child's copies share the parent's lock file: freeing one (explicitly, or when the
    interpreter exits) aborts its transactions, which releases reader slots that are the
    parent's, and a snapshot the parent holds open then loses its pages to the next
    writer (``MDB_PAGE_NOTFOUND``).  So they are never freed; every use in the child is
    refused (:meth:`Store.slot`), and ``close()`` there only marks the store closed.
    """
    import ctypes

    for store in list(_OPEN):
        for held in (store.env, *store._live):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(held))


os.register_at_fork(after_in_child=_inherited_by_child)


class Store:
    """An open LMDB environment holding one log.

    Reads are context-managed snapshot transactions; :meth:`write` runs a function in a
    write transaction (grouped with other threads' writes by :attr:`group`) and retries
    it after growing the map.  :attr:`tip` is the newest event this process knows,
    :attr:`space` the zeroed space ahead of the data file (synced modes only).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "full",
        map_size: int = 16 * MIB,
        max_map_size: int | None = None,
        readonly: bool = False,
        allow_shared_directory: bool = False,
    ) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {sorted(DURABILITY)}, not {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self.max_map_size = max_map_size
        sync, sync_meta = DURABILITY[durability]
        self.sync_meta = sync_meta and not readonly
        """Whether commits' meta pages are synced by the log (``full``; see :meth:`sync`)."""
        self.sync_data = sync
        """Whether LMDB syncs a commit's data pages (``full`` and ``process``)."""
        self._close_sync_error: Exception | None = None
        self._close_synced = threading.Event()  # close() synced (or failed to: _close_sync_error)
        if not readonly:
            os.makedirs(self.path, exist_ok=True)
        elif not os.path.isdir(self.path):
            raise FileNotFoundError(f"{self.path}: no event log here")
        if max_map_size is not None:
            map_size = min(map_size, max_map_size)
        data = os.path.join(self.path, "data.mdb")
        marker = os.path.join(self.path, MARKER)
        if os.path.islink(marker):  # planted: the marker is only ever a file this code wrote
            raise UnsafeDirectoryError(f"{marker} is a symbolic link; refusing to follow it")
        if os.path.exists(marker) and (not os.path.exists(data) or os.path.getsize(data) < 2 * PAGE):
            # This directory held a log (the marker is written once it exists), so an empty
            # or missing data file is damage; LMDB would quietly start a new, empty log.
            size = os.path.getsize(data) if os.path.exists(data) else 0
            raise CorruptLogError(
                f"{data}: the data file is missing or truncated ({size} bytes); restore it from a backup"
            )
        self.locked = _prepare_files(self.path, readonly, allow_shared_directory)
        """Whether LMDB's lock file is in use (see the read-only mode in docs/cli.md)."""
        self._open_lock = _hold_open_lock(self.path, readonly) if self.locked else None
        self.readonly = readonly
        self.allow_shared_directory = allow_shared_directory
        for _ in range(100):
            try:
                self._env_options: dict[str, Any] = {
                    "map_size": map_size,
                    "subdir": True,
                    "readonly": readonly,
                    "sync": sync,
                    "metasync": False,  # the meta page is synced after the commit (sync_meta)
                    "readahead": False,
                    "max_dbs": 8,
                    "max_readers": 512,
                    "lock": self.locked,
                }
                self.env = lmdb.open(self.path, **self._env_options)
                break
            except lmdb.MapResizedError:
                # Opening begins a transaction; another process grew the map in between.
                # Opening again reads the new size.
                continue
            except lmdb.Error as e:
                if readonly and self.locked and _denied(e):
                    # A reader that may not write the lock file (a service's log, a read-only
                    # backup) reads without LMDB's reader table: it cannot tell a writer which
                    # pages it is reading, so it is only safe while nobody writes the log.
                    self.locked = False
                    continue
                self._drop_open_lock()
                raise translate(e, self.path) from e
        else:
            self._drop_open_lock()
            raise EventLogError(f"{self.path}: the map kept being resized while opening the log")
        try:
            self._check_file_size(data)
            # Reader slots of processes that died holding a transaction pin old pages.
            if self.locked:
                self.env.reader_check()
            self._open_dbs(readonly)
        except lmdb.Error as e:
            self.env.close()
            self._drop_open_lock()
            raise translate(e, self.path) from e
        except BaseException:
            self.env.close()
            self._drop_open_lock()
            raise
        self._identity = _file_identity(data)
        # In-process coordination: no transaction open while the map is resized (LMDB
        # requires that of set_mapsize).  Re-entrant (a signal handler may read while its
        # thread holds it), and always taken directly (``with self._slot_lock``), never
        # through the Condition's Python __enter__: an interrupt landing as that returns
        # would leave the lock held for good.
        self._slot_lock = threading.RLock()
        self._cond = threading.Condition(self._slot_lock)
        self._active = 0
        self._held: defaultdict[int, int] = defaultdict(int)  # thread -> transaction slots it holds
        self._resizing = False
        self._closed = False
        self._pid = os.getpid()  # an environment must not be used across fork()
        self._live: set[lmdb.Transaction] = set()  # read transactions open now, for after a fork
        self.page_size = self.env.stat()["psize"]
        self.space = ZeroedSpace(data, self.page_size) if sync and not readonly else None
        self.tip = Tip()
        self.buffer = EventBuffer()
        self.written = WrittenHashes()
        self.group = GroupCommit(self, self.tip)
        _OPEN.add(self)
        try:
            self.log_id = self._init_meta() if not readonly else self._read_log_id()
            if not readonly and not os.path.exists(marker):
                write_atomic(marker, [(self.log_id.hex() + "\n").encode("ascii")])
        except BaseException:
            if self.space is not None:
                self.space.close()
            self.env.close()
            self._drop_open_lock()
            raise

    def _drop_open_lock(self) -> None:
        if self._open_lock is not None:
            os.close(self._open_lock)
            self._open_lock = None

    # -- lifecycle -------------------------------------------------------------

    @property
    def forked(self) -> bool:
        """Whether this is a child process that inherited the store through ``fork()``."""
        return os.getpid() != self._pid

    def close(self) -> None:
        """Close the environment once no other thread of this process has a transaction open.

        Slots this thread holds do not hold up its own close: one entered as an interrupt
        (Ctrl-C) landed stays counted while the exception lives, and ``close()`` in the
        ``except`` block that caught it must not wait for itself.  In a child that inherited
        the store through ``fork()`` nothing is closed: the environment's reader slots and
        locks are the parent's (see :func:`_inherited_by_child`).
        """
        if self.forked:
            self._closed = True
            return
        with self._slot_lock:
            self._closed = True
            own = self._held.get(threading.get_ident(), 0)
            while not self._cond.wait_for(lambda: self._active <= own, timeout=WAKE_POLL):
                pass
        synced = False
        try:
            if self.space is not None:
                self.space.close()
            if self.sync_meta and self.group.commits > self.group.synced:
                try:  # a caller between its commit and its sync finds the store closed: this is its sync
                    self.env.sync(True)
                    synced = True
                except lmdb.Error as e:
                    self._close_sync_error = e  # for that caller (sync())
            self.env.close()
            self._drop_open_lock()
        finally:
            if (
                self.sync_meta
                and not synced
                and self._close_sync_error is None
                and self.group.commits > self.group.synced
            ):
                self._close_sync_error = EventLogError(f"{self.path}: the log was closed before it was synced")
            self._close_synced.set()

    def sync(self) -> None:
        """Sync the data file: every commit made before the call survives an OS crash.

        A store closed since the commit was synced by :meth:`close`."""
        try:
            with self.slot():
                self.env.sync(True)
        except EventLogError:
            if not self._closed or self.forked:
                raise
            while not self._close_synced.wait(WAKE_POLL):
                pass
            if self._close_sync_error is not None:
                raise EventLogError(str(self._close_sync_error)) from None

    @staticmethod
    def format_of(path: str | os.PathLike[str]) -> str | None:
        """The format recorded in the log at ``path``, None when there is no log there."""
        if not os.path.isfile(os.path.join(path, "data.mdb")):
            return None
        try:
            env = lmdb.open(os.fspath(path), readonly=True, max_dbs=8, lock=False, subdir=True)
        except lmdb.Error as e:
            raise translate(e, os.fspath(path)) from e
        try:
            with env.begin() as txn:
                try:
                    meta = env.open_db(b"meta", txn=txn, create=False)
                except lmdb.NotFoundError:
                    return None
                found = txn.get(b"format", db=meta)
        finally:
            env.close()
        return None if found is None else bytes(found).decode("ascii", "replace")

    def _open_dbs(self, readonly: bool) -> None:
        for _ in range(100):
            try:
                self.events = self.env.open_db(b"events", create=not readonly)
                self.meta = self.env.open_db(b"meta", create=not readonly)
                self.sessions = self.env.open_db(b"sessions", create=not readonly)
                self.index = self.env.open_db(b"index", create=not readonly)
                self.tree = Tree(self.path, self._open_optional(TREE_DB, readonly), self.events)
                self.checkpoints = self._open_optional(CHECKPOINTS_DB, readonly)
                self.redactions = self._open_optional(REDACTIONS_DB, readonly)
                return
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)  # another process grew the map: adopt its size

    def vacuum(self) -> int:
        """Replace the data file with a compacting copy of itself; return the bytes it had before.

        Then clears :data:`UNVACUUMED` (in the new file: a stop between the swap and that
        commit leaves it set, and the next vacuum clears it).  See :meth:`_vacuum`.
        """
        before = self._vacuum()
        if self.vacuum_pending():
            self.write(lambda txn: txn.delete(UNVACUUMED, db=self.meta))
        return before

    def vacuum_pending(self) -> bool:
        """Whether a redaction was committed and no compacting copy swapped in since (:data:`UNVACUUMED`)."""
        with self.read() as txn:
            return txn.get(UNVACUUMED, db=self.meta) is not None

    def _vacuum(self) -> int:
        """Replace the data file with a compacting copy of itself; return the bytes it had before.

        The copy holds the pages in use and nothing else, so the bytes of pages LMDB had freed
        (old versions of rewritten events, after a redaction) are gone with the old file.  It is
        made and swapped in (``os.replace``, synced) while no transaction of this process is
        open and while this process holds LMDB's writer lock, so no other process commits to
        the old file meanwhile; then the environment is opened again on the new file, and this
        store goes on working.  Refused with :class:`LogInUseError` while another process has
        the log open (its reader slots show in LMDB's lock file): it would go on reading, and
        writing, the old file.
        """
        if self.readonly:
            raise ReadOnlyError(f"{self.path}: the log was opened read-only")
        data = os.path.join(self.path, "data.mdb")
        with self._slot_lock:
            self._resizing = True
            try:
                while not self._cond.wait_for(lambda: self._active == 0, timeout=WAKE_POLL):
                    pass
                self.check_identity()
                before = os.path.getsize(data)
                try:
                    self._replace_with_copy(data)
                except OSError as e:  # the scratch directory, the copy's file, its sync, the rename
                    raise _copy_error(self.path, e) from e
                try:
                    self._reopen(data)
                finally:
                    self._share()
                return before
            finally:
                self._resizing = False
                self._cond.notify_all()

    def shared(self) -> bool:
        """Whether another process has the log open (holds the open lock, :data:`OPEN_LOCK`)."""
        if not self._exclusive():
            return True
        self._share()
        return False

    def _exclusive(self) -> bool:
        """Take the open lock exclusively if no other process holds it; else keep it shared."""
        fd = self._open_lock
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # from shared: another holder refuses it
            return True
        except BlockingIOError:
            self._share()  # a refused conversion may have let go of the shared lock
            return False

    def _share(self) -> None:
        if self._open_lock is not None:
            fcntl.flock(self._open_lock, fcntl.LOCK_SH)

    def _replace_with_copy(self, data: str) -> None:
        mode = stat.S_IMODE(os.stat(data).st_mode)
        # Held exclusively until the new file is open: a process opening the log meanwhile
        # waits for it, and then maps the new file.
        if not self._exclusive():
            raise LogInUseError(
                f"{self.path}: another process has the log open; its data file cannot be replaced by a "
                "compacting copy until it closes the log (then run `eventlog vacuum`)"
            )
        scratch = None
        try:
            # Inside the try: a directory that refuses the scratch copy must not keep the open
            # lock exclusive (every process opening the log would wait for it).
            _remove_stale_copies(self.path)
            scratch = tempfile.mkdtemp(prefix=COPY_PREFIX, dir=self.path)
            try:
                writer = self.env.begin(write=True)  # LMDB's writer lock: nobody commits to the old file now
            except lmdb.Error as e:
                raise translate(e, self.path) from e
            try:
                copy = os.path.join(scratch, "data.mdb")
                # Our own file descriptor, not env.copy(path): that one writes with O_DIRECT, a
                # synchronous write per megabyte (measured: several times slower than one sync).
                fd = os.open(copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
                try:
                    self.env.copyfd(fd, compact=True)
                    os.fchmod(fd, mode)
                    os.fsync(fd)
                except lmdb.Error as e:
                    raise translate(e, self.path) from e
                finally:
                    os.close(fd)
                os.replace(copy, data)
                fd = os.open(self.path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            finally:
                writer.abort()
        except BaseException:
            self._share()
            raise
        finally:
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)

    def _reopen(self, data: str) -> None:
        """Open the environment again on the data file now in place (no transaction open here)."""
        if self.space is not None:
            self.space.close()
            self.space = None
        self._env_options["map_size"] = self.env.info()["map_size"]
        self.env.close()
        try:
            self.env = lmdb.open(self.path, **self._env_options)
        except lmdb.Error as e:
            raise translate(e, self.path) from e
        self._open_dbs(False)
        self._identity = _file_identity(data)
        self.page_size = self.env.stat()["psize"]
        if DURABILITY[self.durability][0]:
            self.space = ZeroedSpace(data, self.page_size)

    def _open_optional(self, name: bytes, readonly: bool) -> lmdb._Database | None:
        """A database added after the first format: None when a read-only store finds a log without it."""
        try:
            return self.env.open_db(name, create=not readonly)
        except lmdb.NotFoundError:
            return None

    def seal(self, txn: lmdb.Transaction) -> None:
        """Bring the Merkle tree up to the events of the open write transaction (before its commit)."""
        self.tree.extend(txn, self.tip.pending)

    def _init_meta(self) -> bytes:
        def init(txn: lmdb.Transaction) -> bytes:
            fmt = got(txn.get(b"format", db=self.meta))
            if fmt is None:
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"log_id", os.urandom(16), db=self.meta)
                txn.put(b"next_sid", SEQ.pack(1), db=self.meta)
            elif fmt in UPGRADABLE:
                upgrade(self, txn, fmt)
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

    def check_identity(self) -> None:
        """Refuse to write when the log's files were replaced or removed under this process."""
        if _file_identity(os.path.join(self.path, "data.mdb")) != self._identity:
            raise CorruptLogError(
                f"{self.path}: the log's files were replaced or removed while it was open; reopen the log"
            )

    # -- transactions ----------------------------------------------------------

    @contextmanager
    def slot(self) -> Iterator[None]:
        """Count a transaction open for the duration (the map is not resized while one is)."""
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

    def resize(self, new_size: int) -> None:
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
        self.check_identity()
        while True:
            with self.slot():
                try:
                    txn = self.env.begin(write=False, buffers=True) if buffers else self.env.begin(write=False)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    raise translate(e, self.path) from e
                if txn is not None:
                    self._live.add(txn)
                    try:
                        yield txn
                    except lmdb.Error as e:
                        raise translate(e, self.path) from e
                    finally:
                        self._live.discard(txn)
                        if not self.forked:  # a child's abort would free the parent's reader slot
                            txn.abort()
                    return
            self.resize(0)

    def write(self, body: Callable[[lmdb.Transaction], T]) -> T:
        """Run ``body(txn)`` in a write transaction, commit it, and return its result.

        All of ``body`` lands or none of it does, and this returns only after the
        commit that holds it (synced as the durability mode says).  ``body`` must not
        have side effects outside the transaction: it may run more than once, and runs
        in a nested transaction when other threads' writes share the commit
        (:mod:`eventlog.commit`).
        """
        return self.group.write(body)

    @property
    def commits(self) -> int:
        """Write transactions this process committed."""
        return self.group.commits

    @property
    def grouped_writes(self) -> int:
        """Writes those commits carried (more than commits: group commit merged them)."""
        return self.group.grouped_writes

    @property
    def committed_seq(self) -> int:
        """The seq of the last event this process committed or saw committed (0: none yet)."""
        return self.tip.committed[0]

    def reserve(self, nbytes: int) -> None:
        """Grow the map ahead of a write of about ``nbytes``, so it need not be retried."""
        if nbytes < RESERVE_FROM:
            return
        with self.slot():  # another thread may be resizing the map: read it in a slot
            info = self.env.info()
        size = reserved_size(info, self.page_size, nbytes, self.max_map_size)
        if size is not None:
            self.resize(size)

    def grown_size(self) -> int:
        """The map size after it ran full; raises :class:`StorageFullError` at the maximum."""
        return grown_size(self.env.info()["map_size"], self.max_map_size, self.path)

    # -- reading helpers -------------------------------------------------------

    def tail(self, txn: lmdb.Transaction) -> tuple[int, bytes]:
        """The seq and hash of the last event (0 and zeros for an empty log)."""
        cursor = txn.cursor(db=self.events)
        if not cursor.last():
            return 0, bytes(32)
        seq = self.seq_of(cursor.key())
        # The open write transaction's own last event, else the last committed one
        # this process knows; anything else (another process wrote) is hashed afresh.
        return self.tip.known(seq) or (seq, event_hash(seq, cursor.value()))

    def last_seq(self, txn: lmdb.Transaction) -> int:
        cursor = txn.cursor(db=self.events)
        return self.seq_of(cursor.key()) if cursor.last() else 0

    def seq_of(self, key: bytes | memoryview) -> int:
        """The seq an ``events`` key names; :class:`CorruptLogError` naming a malformed one."""
        if len(key) != SEQ.size:
            raise CorruptLogError(f"{self.path}: the events table has a malformed key {bytes(key).hex()} (run verify)")
        return int(SEQ.unpack(key)[0])

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
            for key, value in pairs(cursor):
                out.append(unpack(value))
                if key >= last:
                    break
        except struct.error:
            raise self._damaged_chain(number) from None
        if len(out) != stop - start or key != last:
            raise CorruptLogError(f"{self.path}: live chain of session {number} is shorter than its length")
        return out

    def locations(
        self, txn: lmdb.Transaction, number: int, length: int, start: int = 0
    ) -> list[tuple[bytes, int, int]]:
        """The content digest and body location of live messages ``start..length-1`` of session
        ``number``, in order (reads only those entries)."""
        if start >= length:
            return []
        cursor = txn.cursor(db=self.index)
        if not cursor.set_key(chain_key(number, start)):
            raise CorruptLogError(f"{self.path}: live chain entry {number}/{start} is missing")
        values = cursor.iternext(keys=False, values=True)
        try:
            found = list(map(LOCATION.unpack, islice(values, length - start)))
        except struct.error:
            raise self._damaged_chain(number) from None
        if len(found) != length - start or cursor.key() != chain_key(number, length - 1):
            raise CorruptLogError(f"{self.path}: live chain of session {number} is shorter than its length")
        return found

    def raw_event(self, txn: lmdb.Transaction, seq: int) -> bytes | None:
        return got(txn.get(SEQ.pack(seq), db=self.events))

    def load(self, seq: int, raw: bytes) -> Record:
        """Decode a stored event (the payload is decoded here, at the boundary)."""
        event = self.decode(seq, raw)  # first: it refuses an event shorter than its envelope
        prev, t, kind, _number, _before = HEADER.unpack_from(raw)
        return Record(seq, t, kind, prev, self.written.hash(seq, raw), event)

    def decode(self, seq: int, raw: bytes) -> ev.AnyEvent:
        """The payload of a stored event, for a reader that has its hash already (or needs none)."""
        try:
            if len(raw) < HEADER.size:
                raise ValueError(f"{len(raw)} bytes, shorter than its envelope")
            return ev.decoder.decode(memoryview(raw)[HEADER.size :])
        except Exception as e:
            raise CorruptLogError(f"{self.path}: event {seq} cannot be decoded ({e})") from e


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


class EventBuffer:
    """The buffer a store encodes events into, kept from one event to the next (see :meth:`Batch.emit`)."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = bytearray()

    def room(self, size: int) -> bytearray:
        """The buffer, at least ``size`` bytes long (the encoder takes its length as its room)."""
        data = self.data
        while len(data) < size:
            data += _ZERO_VIEW[: size - len(data)]
        return data


class WrittenHashes:
    """The hashes of the last events this process wrote, each kept with the bytes it hashed.

    A projection reads back, and checks, the events a write has just committed.  An event's
    hash is a function of its seq and its bytes alone (:func:`~eventlog.keys.event_hash`),
    so when the bytes read are those the writer hashed, the writer's hash is theirs, and
    the check need not hash them again (two thirds of the cost of reading a turn back).  The
    bytes are compared, never trusted: a write that was rolled back, an event that a
    redaction rewrote or that another process wrote under the same seq reads as different
    bytes, and is hashed afresh.

    Nothing is kept until :meth:`keep` (a log with projections read in this process): a
    ring of :data:`HASHES_KEPT` slots indexed by seq, where the writer (one thread at a
    time, in its transaction) replaces a slot whole and readers on other threads read one.
    """

    __slots__ = ("slots",)

    def __init__(self) -> None:
        self.slots: list[tuple[int, bytes, bytes] | None] = []

    def keep(self) -> None:
        """Remember the events written from now on."""
        if not self.slots:
            self.slots = [None] * HASHES_KEPT

    def remember(self, seq: int, raw: bytearray, digest: bytes) -> None:
        slots = self.slots
        if slots and len(raw) <= HASHED_EVENT_MAX:
            slots[seq % HASHES_KEPT] = (seq, bytes(raw), digest)

    def hash(self, seq: int, raw: bytes) -> bytes:
        """``event_hash(seq, raw)``, from the ring when it holds these very bytes."""
        slots = self.slots
        if slots:
            kept = slots[seq % HASHES_KEPT]
            if kept is not None and kept[0] == seq and kept[1] == raw:
                return kept[2]
        return event_hash(seq, raw)


class Batch:
    """The events of one write transaction, chained to the log's tail.

    ``emit`` appends an event, linking it to the previous event of the log and of
    its session.  It runs inside the caller's write transaction.
    """

    __slots__ = ("buffer", "hash", "now", "seq", "store", "tip", "txn")

    def __init__(self, store: Store, txn: lmdb.Transaction, now: int | None = None) -> None:
        self.store = store
        self.txn = txn
        self.tip = store.tip  # told of every event, so the commit knows the new tail
        self.buffer = store.buffer
        self.seq, self.hash = store.tail(txn)
        self.now = time.time_ns() if now is None else now

    def emit(
        self, event: ev.AnyEvent, state: SessionState, size: int = 0, meanwhile: Callable[[int], None] | None = None
    ) -> int:
        """Append ``event`` to the transaction; ``size`` is about how many bytes its encoding
        takes, when the caller knows it (a batch of message bodies).  ``meanwhile(seq)`` is
        the caller's further work in the transaction that needs the event's seq but not its
        hash (the chain entries of its messages): it runs while a large event is hashed."""
        seq = self.seq + 1
        # The envelope and the event are encoded into one buffer (no copy of the bodies),
        # and the store keeps that buffer from one event to the next.  A fresh buffer per
        # event grows by reallocations up to the event's size and is freed after it: for
        # the megabyte of a bulk flush, the C allocator hands that memory back to the
        # system and faults it in again at every flush (measured: a fifth of the cost of
        # an import in a fresh process).  The buffer is first filled up to ``size``,
        # because the encoder takes a buffer's length as its room: a shorter one it
        # would first shrink, to the length of the last event.
        raw = self.buffer.room(HEADER.size + size)
        HEADER.pack_into(raw, 0, self.hash, self.now, ev.KIND[type(event)], state.number, state.last_seq)
        ev.encoder.encode_into(event, raw, HEADER.size)
        if len(raw) > EVENT_BUFFER_KEEP:
            self.buffer.data = bytearray()  # a rare, large event: its memory goes back
        key = SEQ.pack(seq)
        if not self.txn.put(key, raw, db=self.store.events, append=True, overwrite=False):
            raise CorruptLogError(f"{self.store.path}: event {seq} already exists")
        # A bulk append's leaf is computed from the event at hand, so the commit's tree step
        # need not read it back.
        leafed = type(event) is ev.MessagesAppended and not (event.overrides or event.sealed)

        def work() -> bytes | None:
            if meanwhile is not None:
                meanwhile(seq)
            return leaf_input(seq, raw, event) if leafed else None

        previous = self.hash
        # The event's hash (keys.event_hash), a large event's on a second thread meanwhile.
        self.hash, leaf = sha256_during(key, raw, work)
        self.seq = seq
        self.store.written.remember(seq, raw, self.hash)
        if leaf is not None:
            self.store.tree.emitted(seq, previous, self.hash, leaf)
        self.tip.pending = (seq, self.hash)
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
    """Events with ``seq > after`` in order, read in short transactions of ``batch`` events.

    Each event is checked before it is yielded: it must decode and hash to what the log
    recorded for it, in the envelope of the event after it (or, for the newest event, in
    its session's state).  Since an envelope holds the previous event's hash, that also
    checks the chain.  A damaged event raises :class:`CorruptLogError` naming its seq,
    after every event before it was yielded: a projection that applies what this yields
    never applies a damaged event.
    """
    nxt = after + 1
    while True:
        chunk: list[tuple[int, bytes]] = []
        with store.read() as txn:
            cursor = txn.cursor(db=store.events)
            if not cursor.set_range(SEQ.pack(nxt)):
                return
            for key, value in pairs(cursor):
                chunk.append((store.seq_of(key), value))
                if len(chunk) > batch:  # one more than is yielded: its envelope vouches for the last
                    break
            more = len(chunk) > batch
            # the log's newest event is the last of its session, whose state records its hash
            anchor = chunk[-1][1][:32] if more else _recorded_last(store, txn, *chunk[-1])
        if more:
            chunk.pop()
        last = len(chunk) - 1
        for i, (seq, raw) in enumerate(chunk):
            if seq != nxt:
                raise CorruptLogError(f"{store.path}: event {nxt} is missing; the log is damaged (run verify)")
            record = store.load(seq, raw)
            # Each envelope starts with the hash of the event before it.
            recorded = anchor if i == last else chunk[i + 1][1][:32]
            if record.hash != recorded:
                if i < last:
                    after_seq, after_raw = chunk[i + 1]
                    following = anchor if i + 1 == last else chunk[i + 2][1][:32]
                    if event_hash(after_seq, after_raw) != following:
                        raise CorruptLogError(
                            f"{store.path}: events {seq} and {seq + 1} do not match the hashes recorded for them "
                            "(the link between them is damaged); the log is damaged (run verify)"
                        )
                raise CorruptLogError(
                    f"{store.path}: event {seq} does not match its recorded hash; the log is damaged (run verify)"
                )
            nxt = seq + 1
            yield record
        if not more:
            return


def _recorded_last(store: Store, txn: lmdb.Transaction, seq: int, raw: bytes) -> bytes:
    """The hash the log records for its newest event ``seq``: in its session's state."""
    if len(raw) < HEADER.size:
        raise CorruptLogError(
            f"{store.path}: event {seq} is shorter than its envelope; the log is damaged (run verify)"
        )
    state = txn.get(state_key(HEADER.unpack_from(raw)[3]), db=store.index)
    if state is None or len(state) != STATE.size:
        raise CorruptLogError(
            f"{store.path}: event {seq} names a session whose state is missing or damaged (run verify)"
        )
    return bytes(STATE.unpack(state)[3])


def _denied(e: lmdb.Error) -> bool:
    """Whether LMDB failed to open a file for lack of permission."""
    text = str(e)
    return getattr(e, "errno", None) in (errno.EACCES, errno.EPERM) or any(
        words in text for words in ("Permission denied", "Operation not permitted")
    )
