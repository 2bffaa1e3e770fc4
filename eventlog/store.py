"""The LMDB environment: named databases, key formats, transactions, map growth.

One environment directory per log.  Named databases:

``events``    ``seq`` (8 bytes, big-endian) -> envelope + encoded event payload.
              Keys only ever grow, so every put is an append at the right edge.
``meta``      ``b"log_id"`` (16 random bytes), ``b"tail"`` (last seq + its hash),
              ``b"next_sid"`` (session number counter), ``b"format"``.
``sessions``  session id (UTF-8) -> :class:`SessionState` (number, length, head, ...).
``chain``     session number + position (8 + 8 bytes) -> node digest, content digest
              and the ``(seq, index)`` where the body is stored.  The live chain.
``timeline``  session number + seq (8 + 8 bytes) -> empty: the events of a session.
``notes``     session number + position -> node digest + the current display override.

Everything but ``events`` and ``meta`` is derived: written in the same transaction as
the events, and rebuildable from the events alone.  Message keys are fixed-width
and big-endian, and a session's writes land at the end of its own key range, so a
flush never inserts at a random (digest-keyed) place in a B-tree.

The envelope of a stored event: previous event hash (32 bytes), time in
nanoseconds (8), kind tag (1), session number (8), then the payload.  The hash of an
event is SHA-256(seq key || envelope || payload), so the whole log is one chain.
"""

from __future__ import annotations

import errno
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from hashlib import sha256
from typing import Final, TypeVar

import lmdb

from . import events as ev
from .errors import CorruptLogError, EventLogError, ReadOnlyError, StorageFullError

T = TypeVar("T")

FORMAT: Final = b"1"

SEQ = struct.Struct(">Q")
PAIR = struct.Struct(">QQ")
HEADER = struct.Struct(">32sQBQ")
"""Envelope: previous hash, time (ns), kind, session number."""
SESSION = struct.Struct(">QQ32sQB")
"""Session state: number, live length, head node, last seq, closed flag."""
LINK = struct.Struct(">32s32sQI")
"""Chain entry: node digest, content digest, seq and index of the stored body."""
TAIL = struct.Struct(">Q32s")

DURABILITY: Final = {
    # mode: (sync, metasync)
    "full": (True, True),
    "process": (True, False),
    "none": (False, False),
}

MIB = 1 << 20


@dataclass(slots=True)
class SessionState:
    number: int
    length: int
    head: bytes
    last_seq: int
    closed: bool = False

    def pack(self) -> bytes:
        return SESSION.pack(self.number, self.length, self.head, self.last_seq, self.closed)

    @classmethod
    def unpack(cls, raw: bytes) -> SessionState:
        number, length, head, last_seq, closed = SESSION.unpack(raw)
        return cls(number, length, head, last_seq, bool(closed))


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
    if isinstance(e, lmdb.ReadonlyError) or code in (errno.EROFS, errno.EACCES, errno.EPERM) or "Read-only" in text:
        return ReadOnlyError(f"{path}: cannot write the log ({text})")
    if isinstance(e, (lmdb.CorruptedError, lmdb.PageNotFoundError, lmdb.InvalidError, lmdb.VersionMismatchError, lmdb.PanicError, lmdb.BadChecksumError)):
        return CorruptLogError(f"{path}: the log's files are damaged ({type(e).__name__}: {text})")
    return EventLogError(f"{path}: {type(e).__name__}: {text}")


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
            # Reader slots of processes that died holding a transaction pin old pages.
            self.env.reader_check()
            self.events = self.env.open_db(b"events", create=not readonly)
            self.meta = self.env.open_db(b"meta", create=not readonly)
            self.sessions = self.env.open_db(b"sessions", create=not readonly)
            self.chain = self.env.open_db(b"chain", create=not readonly)
            self.timeline = self.env.open_db(b"timeline", create=not readonly)
            self.notes = self.env.open_db(b"notes", create=not readonly)
        except lmdb.Error as e:
            raise translate(e, self.path) from e
        # In-process coordination: one writer at a time, and no transaction open
        # while the map is resized (LMDB requires that of set_mapsize).
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self._active = 0
        self._resizing = False
        self._closed = False
        self.log_id = self._init_meta() if not readonly else self._read_log_id()

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.wait_for(lambda: self._active == 0)
        self.env.close()

    def _init_meta(self) -> bytes:
        def init(txn: lmdb.Transaction) -> bytes:
            fmt = txn.get(b"format", db=self.meta)
            if fmt is None:
                txn.put(b"format", FORMAT, db=self.meta)
                txn.put(b"log_id", os.urandom(16), db=self.meta)
                txn.put(b"next_sid", SEQ.pack(1), db=self.meta)
                txn.put(b"tail", TAIL.pack(0, bytes(32)), db=self.meta)
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

    # -- transactions ----------------------------------------------------------

    @contextmanager
    def _slot(self) -> Iterator[None]:
        with self._cond:
            if self._closed:
                raise EventLogError(f"{self.path}: the log is closed")
            self._cond.wait_for(lambda: not self._resizing)
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                self._cond.notify_all()

    def _resize(self, new_size: int) -> None:
        """Set the map size (0: adopt the size another process set) with no transaction open here."""
        with self._cond:
            self._resizing = True
            try:
                self._cond.wait_for(lambda: self._active == 0)
                self.env.set_mapsize(new_size)
            finally:
                self._resizing = False
                self._cond.notify_all()

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        """A read-only snapshot transaction."""
        while True:
            with self._slot():
                try:
                    txn = self.env.begin(write=False)
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
        """Run ``body(txn)`` in one write transaction and commit it.

        All of it lands or none of it does.  When the map is full the transaction is
        aborted, the map grown and ``body`` run again, so ``body`` must not have
        side effects outside the transaction.
        """
        with self._write_lock:
            while True:
                with self._slot():
                    try:
                        txn = self.env.begin(write=True)
                    except lmdb.MapResizedError:
                        txn = None
                    except lmdb.Error as e:
                        raise translate(e, self.path) from e
                    if txn is not None:
                        try:
                            result = body(txn)
                            txn.commit()
                            return result
                        except lmdb.MapFullError:
                            txn.abort()
                            grow_to = self._next_size()
                        except lmdb.Error as e:
                            txn.abort()
                            raise translate(e, self.path) from e
                        except BaseException:
                            txn.abort()
                            raise
                    else:
                        grow_to = 0
                self._resize(grow_to)

    def _next_size(self) -> int:
        current = self.env.info()["map_size"]
        # Double while small, then grow by a quarter: sparse files make a large map cheap,
        # but address space and the size reported by tools should stay sensible.
        grown = current * 2 if current < 4096 * MIB else current + current // 4
        if self.max_map_size is not None:
            if current >= self.max_map_size:
                raise StorageFullError(
                    f"{self.path}: the log reached its maximum size of {self.max_map_size} bytes"
                )
            grown = min(grown, self.max_map_size)
        return grown

    # -- reading helpers -------------------------------------------------------

    def tail(self, txn: lmdb.Transaction) -> tuple[int, bytes]:
        raw = txn.get(b"tail", db=self.meta)
        if raw is None:
            return 0, bytes(32)
        seq, digest = TAIL.unpack(raw)
        return seq, digest

    def session(self, txn: lmdb.Transaction, session_id: str) -> SessionState | None:
        raw = txn.get(session_id.encode("utf-8"), db=self.sessions)
        return None if raw is None else SessionState.unpack(raw)

    def link(self, txn: lmdb.Transaction, number: int, position: int) -> tuple[bytes, bytes, int, int]:
        raw = txn.get(PAIR.pack(number, position), db=self.chain)
        if raw is None:
            raise CorruptLogError(f"{self.path}: live chain entry {number}/{position} is missing")
        return LINK.unpack(raw)

    def links(self, txn: lmdb.Transaction, number: int, start: int, stop: int) -> list[tuple[bytes, bytes, int, int]]:
        """Chain entries for positions ``start .. stop-1`` of session ``number``."""
        out: list[tuple[bytes, bytes, int, int]] = []
        if stop <= start:
            return out
        cursor = txn.cursor(db=self.chain)
        if not cursor.set_key(PAIR.pack(number, start)):
            raise CorruptLogError(f"{self.path}: live chain entry {number}/{start} is missing")
        unpack = LINK.unpack
        last = PAIR.pack(number, stop - 1)
        for key, value in cursor:
            out.append(unpack(value))
            if key >= last:
                break
        if len(out) != stop - start:
            raise CorruptLogError(f"{self.path}: live chain of session {number} is shorter than its length")
        return out

    def raw_event(self, txn: lmdb.Transaction, seq: int) -> bytes | None:
        return txn.get(SEQ.pack(seq), db=self.events)

    def load(self, seq: int, raw: bytes) -> Record:
        """Decode a stored event (the payload is decoded here, at the boundary)."""
        try:
            prev, t, kind, _number = HEADER.unpack_from(raw)
            event = ev.decoder.decode(memoryview(raw)[HEADER.size :])
        except Exception as e:
            raise CorruptLogError(f"{self.path}: event {seq} cannot be decoded ({e})") from e
        return Record(seq, t, kind, prev, event_hash(seq, raw), event)


def event_hash(seq: int, raw: bytes) -> bytes:
    return sha256(SEQ.pack(seq) + raw).digest()


class Batch:
    """The events of one write transaction, chained to the log's tail.

    ``emit`` appends an event and indexes it in the session's timeline; ``finish``
    records the new tail.  Both run inside the caller's write transaction.
    """

    __slots__ = ("store", "txn", "seq", "hash", "now")

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self.store = store
        self.txn = txn
        self.seq, self.hash = store.tail(txn)
        self.now = time.time_ns()

    def emit(self, event: ev.AnyEvent, number: int) -> int:
        seq = self.seq + 1
        raw = HEADER.pack(self.hash, self.now, ev.KIND[type(event)], number) + ev.encoder.encode(event)
        key = SEQ.pack(seq)
        if not self.txn.put(key, raw, db=self.store.events, append=True, overwrite=False):
            raise CorruptLogError(f"{self.store.path}: event {seq} already exists")
        self.txn.put(PAIR.pack(number, seq), b"", db=self.store.timeline, append=False)
        self.seq = seq
        self.hash = sha256(key + raw).digest()
        return seq

    def finish(self) -> None:
        self.txn.put(b"tail", TAIL.pack(self.seq, self.hash), db=self.store.meta)

    def new_session_number(self) -> int:
        raw = self.txn.get(b"next_sid", db=self.store.meta)
        number = SEQ.unpack(raw)[0] if raw is not None else 1
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

