"""Commits shared across processes: one process of a log commits the others' flushes with its own.

LMDB lets one process write at a time and each commit pays its own syncs, so processes that
flush their own sessions queue on LMDB's writer lock, one commit and its syncs each, where
threads of one process share commits (:mod:`eventlog.commit`).  The relay lets processes share
them too.  One process of the log, the *carrier* (whichever holds the carrier lock file beside
the log), listens on a Unix socket in the log directory.  The others prepare a flush as usual
(the list compared with their cache, every new message encoded and hashed) and, when it only
extends the stored transcript, send the carrier what it appends: the session, the length and
head node it extends, the new messages' bodies, content digests and node digests.  The carrier
runs every request it has when it is ready to write in one write of its group commit, each in
a nested transaction, so they share its commit and its syncs, and answers each after the
commit is durable (two of its threads commit in turn, so one's sync overlaps the next commit).

What keeps it exact:

- The carrier writes a request only while the session's stored transcript is still the
  length and head the request names (:meth:`~eventlog.writer.Writer.extend`); node digests
  chain every message to those before it, so the head names the whole prefix.  Otherwise it
  answers "not written", and the sender writes the flush itself.
- A sender that hears nothing certain (the carrier died, closed, or did not answer in time)
  writes the flush itself.  A flush is idempotent: if the carrier's commit went through,
  the flush finds its list stored and writes nothing; the log is then synced once more, so
  the commit it found is durable before the call returns.
- A request carries a deadline on the system's monotonic clock, and the carrier checks it
  inside the write transaction, holding LMDB's writer lock: past it, it answers "not
  written".  A sender that stops waiting does so only after the deadline, and its own write
  then takes the writer lock after any commit of the carrier's that could hold the request.
  A carrier that was stopped (SIGSTOP) and resumes late can never apply a request its sender
  wrote itself meanwhile, even if the session came back to the same head since.
- Every answer is checked against the log before the call returns: the session's stored
  length and head must be those the request made.
- A request whose sender has gone (its connection hung up: the process died, or closed the
  log) is not written; that too is checked holding LMDB's writer lock.  Opening a log takes
  that lock too (its databases are opened in a write transaction), so a process started
  after the sender died, to take over its sessions, opens it once any commit in flight has
  ended: what it reads then is final for the dead sender, and no request of its lands later.

Only flushes that extend a transcript with no display overrides travel; rewinds, edits,
compactions, appends and every other write are committed by the process making them, as
before.  Processes of the log that opened it with another durability mode use another
carrier (the socket and lock are named after the mode), and ``durability="none"``, with no
syncs to share, uses none.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import queue
import select
import selectors
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from hashlib import sha256
from typing import TYPE_CHECKING

import lmdb
import msgspec

from .commit import WAKE_POLL
from .files import open_own_file
from .writer import FlushResult, NewMessages, chain

if TYPE_CHECKING:
    from .store import Store
    from .writer import Writer

logger = logging.getLogger(__name__)

WAIT = 2.0
"""Seconds a sender waits for the carrier's answer before it writes the flush itself."""
BUSY = 0.5
"""A carrier whose other threads kept more than this share of a core busy (its own Python, which
holds the GIL its threads need for every step) over two looks in a row stops carrying: its
senders' flushes would wait on its GIL."""
LOOK_EVERY = 0.5
"""Seconds between a carrier's looks at how busy its process is."""
RESIGNED = 30.0
"""Seconds a process that stopped carrying because it was busy leaves carrying to others."""
COMMITTERS = 2
"""Threads of a carrier committing batches: one commits while the other syncs and answers."""
SOON = 0.01
"""Seconds before a process that found the carrier's lock held but no socket yet looks again."""
RETRY = 1.0
"""Seconds before a process that found no carrier (and could not become it) looks again, or one
that could not set up the carrier's socket tries again."""
MAX_REQUEST = 16 << 20
"""Requests larger than this (in bytes of message bodies) are written by their own process."""
LINGER = 0.002
"""The longest a carrier waits, before a commit, for senders that were writing a moment ago
(as many as its last commit carried) to join it."""
_FRAME = struct.Struct("<I")


class Part(msgspec.Struct, array_like=True, frozen=True):
    """One session of a relayed flush: what it appends, and to what."""

    session: str
    length: int
    head: bytes
    bodies: list[bytes]
    digests: bytes
    nodes: bytes
    summaries: int


class Ask(msgspec.Struct, array_like=True, frozen=True):
    """A relayed flush: all of its sessions land in one nested transaction, or none does."""

    deadline: float
    """``time.monotonic()`` after which the carrier must not write it."""
    parts: list[Part]


class Answer(msgspec.Struct, array_like=True, frozen=True):
    """The carrier's answer: each part's result, or None when nothing was written."""

    results: list[tuple[int, int, int, str | None, int]] | None
    tip: tuple[int, bytes] = (0, b"")
    """The seq and hash of the request's last event."""


_ask_encoder = msgspec.msgpack.Encoder()
_ask_decoder = msgspec.msgpack.Decoder(Ask)
_answer_decoder = msgspec.msgpack.Decoder(Answer)


def _frame(message: msgspec.Struct) -> bytes:
    body = _ask_encoder.encode(message)
    return _FRAME.pack(len(body)) + body


class Relay:
    """This process's side of the relay for one open store: sending flushes, or carrying them.

    ``sent`` counts this process's flushes another process committed, ``carried`` the
    other processes' flushes this one committed.
    """

    def __init__(self, store: Store, writer: Writer, on_carried: Callable[[], None] | None = None) -> None:
        self.store = store
        self.writer = writer
        self.on_carried = on_carried
        self.sent = 0
        self.carried = 0
        name = f"eventlog.relay-{store.durability}"
        self._lock_path = os.path.join(store.path, name + ".lock")
        # An abstract socket (Linux): no file in the log directory, none left behind by a
        # carrier that dies.  Named after the data file itself, so that a copy of the log
        # (same id, other file) never reaches the original's carrier.
        st = os.stat(os.path.join(store.path, "data.mdb"))
        self._address = f"\0eventlog-relay-{st.st_dev:x}-{st.st_ino:x}-{store.durability}"
        self._guard = threading.Lock()  # one request at a time on the connection
        self._conn: socket.socket | None = None
        self._carrier: _Carrier | None = None
        self._next_carry = 0.0  # monotonic time before which this process does not try to carry again
        self._next_try = 0.0  # monotonic time before which it does not look for a carrier again
        self._closed = False
        _RELAYS.add(self)

    # -- sending -----------------------------------------------------------------

    def idle(self) -> bool:
        """Whether a flush would certainly be committed here: this process carries and nobody
        sends to it (so a flush need not be put into a request first)."""
        carrier = self._carrier
        if carrier is None:
            # No carrier here, and none found a moment ago: look again only every RETRY seconds.
            return self._closed or (self._conn is None and time.monotonic() < self._next_try)
        return self._closed or (not carrier.stopping and not carrier.buffers)

    def send(self, parts: list[Part]) -> list[FlushResult] | None:
        """Have the carrier commit ``parts``; their results, or None: write them here.

        None means nothing of them is stored, or the flush must find out by writing them
        itself (it is idempotent): see the module's notes."""
        if self._closed or sum(len(body) for part in parts for body in part.bodies) > MAX_REQUEST:
            return None
        carrier = self._carrier
        if carrier is not None:
            if not carrier.stopping:
                # This process carries.  While others send to it, its own flushes join their
                # commits; alone, they go through its group commit directly.
                return carrier.submit(parts) if carrier.buffers else None
            self._carrier = None  # its thread ended (logged): this process may carry anew, or send
            carrier.stop()
        if not self._guard.acquire(blocking=False):
            return None  # another thread of this process is waiting on the carrier: commit here
        try:
            conn = self._conn or self._connect()
            if conn is None:
                return None
            deadline = time.monotonic() + WAIT
            try:
                conn.settimeout(WAIT)
                conn.sendall(_frame(Ask(deadline, parts)))
            except OSError:
                self._drop()
                return None  # not sent whole: a carrier never writes a request it did not read whole
            try:
                answer = self._answer(conn, deadline)
            except TimeoutError:
                # The carrier may still write it: not before the deadline (see the module's notes).
                self._drop()
                while time.monotonic() <= deadline:
                    time.sleep(max(0.0, deadline - time.monotonic()) + 0.001)
                raise Uncertain from None
            except (OSError, EOFError, msgspec.DecodeError, ValueError):
                # The carrier closed the connection, or died: it writes nothing of it from now on.
                self._drop()
                raise Uncertain from None
            if answer.results is None:
                return None
            results = [FlushResult(*result) for result in answer.results]
            if len(results) != len(parts) or not self._stored(parts, results):
                raise Uncertain
            seq, digest = answer.tip
            tip = self.store.tip
            if seq > tip.committed[0]:
                tip.committed = (seq, digest)
            group = self.store.group  # answered once synced: a flush finding it stored needs no sync
            group.durable_seq = max(group.durable_seq, seq)
            self.sent += 1
            return results
        finally:
            self._guard.release()

    def _answer(self, conn: socket.socket, deadline: float) -> Answer:
        header = self._read(conn, _FRAME.size, deadline)
        (size,) = _FRAME.unpack(header)
        return _answer_decoder.decode(self._read(conn, size, deadline))

    @staticmethod
    def _read(conn: socket.socket, size: int, deadline: float) -> bytes:
        chunks: list[bytes] = []
        while size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the carrier in time")
            conn.settimeout(left)
            chunk = conn.recv(min(size, 1 << 20))
            if not chunk:
                raise EOFError("the carrier closed the connection")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def _stored(self, parts: list[Part], results: list[FlushResult]) -> bool:
        """Whether the log holds what the carrier says it wrote."""
        with self.store.read() as txn:
            for part, result in zip(parts, results):
                state = self.store.session(txn, part.session)
                if state is None or state.length < part.length + len(part.bodies):
                    return False
                length = part.length + len(part.bodies)
                if state.length == length and state.head != part.nodes[-32:]:
                    return False
                if result.appended != len(part.bodies) or result.unchanged != part.length:
                    return False
        return True

    def _connect(self) -> socket.socket | None:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self._address)
        except OSError as e:
            conn.close()
            now = time.monotonic()
            if e.errno not in (errno.ENOENT, errno.ECONNREFUSED):
                self._next_try = now + RETRY
            elif now >= self._next_carry:
                self._carry()  # no carrier: this process may become it
                if self._carrier is None:
                    self._next_try = now + SOON  # another process holds the lock: it is binding the socket
            else:
                self._next_try = now + RETRY  # this process left carrying to others, and none carries
            return None
        if not _same_user(conn):
            conn.close()  # anyone may bind an abstract name: only this user's carrier is heard
            self._next_try = time.monotonic() + RETRY
            return None
        self._conn = conn
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- carrying ----------------------------------------------------------------

    def _carry(self) -> None:
        """Become the carrier if no process is (the lock is free), else do nothing."""
        try:
            fd = open_own_file(self._lock_path, create=True)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        try:
            carrier = _Carrier(self, fd)
        except OSError as e:
            self._next_carry = time.monotonic() + RETRY
            logger.warning("%s: cannot carry other processes' flushes (%s)", self.store.path, e)
            os.close(fd)
            return
        self._carrier = carrier
        carrier.start()

    def close(self) -> None:
        """Stop carrying (after the commit under way) and sending; the next writer takes over."""
        self._closed = True
        with self._guard:
            self._drop()
        carrier, self._carrier = self._carrier, None
        if carrier is not None:
            carrier.stop()

    def forget(self) -> None:
        """In a child after ``fork()``: let go of the parent's sockets and files without touching them."""
        self._closed = True
        self._carrier = None
        self._conn = None


class Uncertain(Exception):
    """The carrier may or may not have committed the request: the flush writes it itself, then syncs."""


class _Carrier:
    """The threads that accept other processes' requests and commit them with this process's writes.

    One thread gathers requests from the connections and forms batches; two commit them, so
    that one batch's meta-page sync and answers overlap the next batch's commit (the group
    commit hands its lead on as a commit is done, before the sync).  The gathering thread owns
    the connections and the selector; a committing thread that cannot answer a connection
    leaves it in ``broken`` for the gathering thread to close.
    """

    def __init__(self, relay: Relay, lock_fd: int) -> None:
        self.relay = relay
        self.lock_fd = lock_fd
        address = relay._address
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.listener.bind(address)
            self.listener.listen(64)
            self.listener.setblocking(False)
        except BaseException:
            self.listener.close()
            raise
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.wake: tuple[int, int] | None = (self.wake_r, self.wake_w)  # None once stop() let them go
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        self.buffers: dict[socket.socket, bytearray] = {}
        self.lock = threading.Lock()  # guards own, broken, stopping and the relay's counter
        self.own: list[_Own] = []  # this process's flushes waiting for the next commit
        self.broken: list[socket.socket] = []  # connections a committing thread could not answer
        self.last = 0  # how many requests the last batch carried
        self.stopping = False
        self.free = threading.Semaphore(COMMITTERS)  # committing threads not busy with a batch
        self.batches: queue.SimpleQueue[list[tuple[socket.socket | _Own, Ask]] | None] = queue.SimpleQueue()
        self.committers = [
            threading.Thread(target=self._committer, name="eventlog-relay-commit", daemon=True)
            for _ in range(COMMITTERS)
        ]
        self.thread = threading.Thread(target=self._serve, name="eventlog-relay", daemon=True)
        self.idents: list[int] = []  # the carrier's threads, whose CPU time is not the process's own work
        self.looked = (time.monotonic(), time.process_time(), 0.0)  # wall, process CPU, carrier CPU
        self.busy_looks = 0

    def start(self) -> None:
        self.thread.start()  # the committing threads start with the first sender (see _accept)

    def submit(self, parts: list[Part]) -> list[FlushResult] | None:
        """Commit this process's ``parts`` with the requests of the next commit; as :meth:`Relay.send`."""
        own = _Own(Ask(float("inf"), parts))
        with self.lock:  # the pipe is open while the carrier is not stopping (stop() takes this lock)
            if self.stopping:
                return None
            self.own.append(own)
            os.write(self.wake_w, b"o")
        try:
            while not own.done.wait(WAIT):
                if not self.thread.is_alive():
                    raise Uncertain
        except BaseException:
            own.abandoned = True  # not run if the carrier has not taken it yet
            raise
        answer = own.answer
        if answer is None or answer.results is None:
            return None
        return [FlushResult(*result) for result in answer.results]

    def stop(self) -> None:
        """Stop the threads after the commits under way, and let go of the pipe (once, whoever calls)."""
        with self.lock:
            self.stopping = True
            wake, self.wake = self.wake, None
        if wake is None:
            return
        wake_r, wake_w = wake
        try:
            os.write(wake_w, b"x")
        except OSError:
            pass
        self.thread.join()
        os.close(wake_r)
        os.close(wake_w)

    def _serve(self) -> None:
        self.idents.append(threading.get_ident())
        try:
            while not self.stopping:
                self._round()
                if self._busy():
                    self.relay._next_carry = time.monotonic() + RESIGNED
                    logger.info(
                        "%s: this process is too busy to carry other processes' flushes; it leaves that to them",
                        self.relay.store.path,
                    )
                    return
        except BaseException:
            if not self.stopping:
                logger.exception("%s: stopped carrying other processes' flushes", self.relay.store.path)
        finally:
            # Whatever ended the thread, nothing may be left listening with nobody reading: the
            # senders would wait for every answer until their deadline.  Closed, they are
            # refused at once and one of them carries instead.
            with self.lock:
                self.stopping = True
            started = [committer for committer in self.committers if committer.ident is not None]
            for _ in started:
                self.batches.put(None)
            for committer in started:
                committer.join()  # the batches under way are committed and answered first
            self.listener.close()  # before the lock goes: the next carrier binds the name
            for conn in list(self.buffers):
                conn.close()
            self.buffers.clear()
            self.selector.close()
            os.close(self.lock_fd)
            with self.lock:
                for own in self.own:
                    own.done.set()  # never taken: written by its own thread
                self.own.clear()

    def _busy(self) -> bool:
        """Whether the process's own threads kept its GIL busy at the last two looks (see :data:`BUSY`)."""
        now = time.monotonic()
        wall, cpu, carrying = self.looked
        if now - wall < LOOK_EVERY:
            return False
        cpu_now, carrying_now = time.process_time(), self._carrier_cpu()
        self.looked = (now, cpu_now, carrying_now)
        share = ((cpu_now - cpu) - (carrying_now - carrying)) / (now - wall)
        self.busy_looks = self.busy_looks + 1 if share > BUSY else 0
        return self.busy_looks >= 2

    def _carrier_cpu(self) -> float:
        total = 0.0
        for ident in self.idents:
            try:
                total += time.clock_gettime(time.pthread_getcpuclockid(ident))
            except OSError:
                pass
        return total

    def _round(self) -> None:
        """Wait for a free committing thread, gather the requests that are ready (and those a
        moment away), and hand them to it."""
        while not self.free.acquire(timeout=WAKE_POLL):
            if self.stopping:
                return
        handed = False
        try:
            asks: list[tuple[socket.socket | _Own, Ask]] = []
            self._gather(asks, LOOK_EVERY)
            if asks and len(asks) < self.last:
                # As many senders as the last batch carried were writing a moment ago: a short
                # wait for those still preparing theirs shares this commit's syncs among them.
                until = time.monotonic() + LINGER
                while len(asks) < self.last and (left := until - time.monotonic()) > 0:
                    self._gather(asks, left)
            self.last = len(asks)
            if asks:
                self.batches.put(asks)
                handed = True
        finally:
            if not handed:
                self.free.release()

    def _committer(self) -> None:
        self.idents.append(threading.get_ident())
        while True:
            asks = self.batches.get()
            if asks is None:
                return
            try:
                self._commit(asks)
            except Exception:
                logger.exception("%s: carrying other processes' flushes failed", self.relay.store.path)
                for conn, _ in asks:
                    if isinstance(conn, _Own):
                        conn.done.set()  # no answer: its flush is written by its thread
                    else:
                        self._broke(conn)
            finally:
                self.free.release()

    def _broke(self, conn: socket.socket) -> None:
        """Leave ``conn`` to the gathering thread to close (it owns the selector)."""
        with self.lock:
            self.broken.append(conn)
            if not self.stopping:
                os.write(self.wake_w, b"b")

    def _gather(self, asks: list[tuple[socket.socket | _Own, Ask]], timeout: float | None) -> None:
        for key, _ in self.selector.select(timeout):
            source = key.fileobj
            if source is self.listener:
                self._accept()
            elif source == self.wake_r:
                try:
                    os.read(self.wake_r, 64)
                except OSError:
                    pass
                with self.lock:
                    asks += [(own, own.ask) for own in self.own if not own.abandoned]
                    self.own.clear()
                    broken, self.broken = self.broken, []
                for conn in broken:
                    self._close(conn)
            else:
                assert isinstance(source, socket.socket)
                asks += self._receive(source)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not _same_user(conn):
                conn.close()  # anyone may connect to an abstract name: only this user's writes are carried
                continue
            conn.setblocking(False)
            self.buffers[conn] = bytearray()
            self.selector.register(conn, selectors.EVENT_READ)
            for committer in self.committers:
                if committer.ident is None:  # alone, a process commits its own writes: none were needed
                    committer.start()

    def _close(self, conn: socket.socket) -> None:
        if conn in self.buffers:
            del self.buffers[conn]
            self.selector.unregister(conn)
            conn.close()

    def _receive(self, conn: socket.socket) -> list[tuple[socket.socket | _Own, Ask]]:
        buffer = self.buffers.get(conn)
        if buffer is None:
            return []
        try:
            chunk = conn.recv(1 << 20)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            chunk = b""
        if not chunk:
            self._close(conn)  # the sender is gone (or gave up): what it had not sent whole is dropped
            return []
        buffer += chunk
        asks: list[tuple[socket.socket | _Own, Ask]] = []
        while len(buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(buffer)
            if size > 2 * MAX_REQUEST:
                self._close(conn)
                return []
            if len(buffer) < _FRAME.size + size:
                break
            try:
                ask = _ask_decoder.decode(bytes(buffer[_FRAME.size : _FRAME.size + size]))
            except msgspec.DecodeError:
                self._close(conn)
                return []
            del buffer[: _FRAME.size + size]
            asks.append((conn, ask))
        return asks

    def _commit(self, asks: list[tuple[socket.socket | _Own, Ask]]) -> None:
        relay = self.relay
        store, writer = relay.store, relay.writer
        tip = store.tip

        def body(txn: lmdb.Transaction) -> list[Answer]:
            now = time.time_ns()
            answers = []
            for conn, ask in asks:
                answer = Answer(None)
                # Both checked holding LMDB's writer lock (see the module's notes).
                if time.monotonic() < ask.deadline and (isinstance(conn, _Own) or _connected(conn)):
                    before = tip.pending
                    child = store.env.begin(write=True, parent=txn)
                    try:
                        results = []
                        for part in ask.parts:
                            result = _extend(writer, child, part, now)
                            if result is None:
                                break
                            results.append(result)
                        else:
                            child.commit()
                            last = tip.pending or (0, b"")
                            answer = Answer(
                                [(r.appended, r.tombstoned, r.unchanged, r.head, r.seq) for r in results], last
                            )
                    except lmdb.MapFullError:
                        child.abort()
                        raise
                    except Exception:
                        logger.debug("a relayed flush was not written", exc_info=True)
                    if answer.results is None:
                        child.abort()
                        tip.pending = before
                answers.append(answer)
            return answers

        store.reserve(sum(len(b) + 200 for _, ask in asks for part in ask.parts for b in part.bodies))
        try:
            answers = store.write(body)
        except Exception:
            logger.debug("a relayed write failed", exc_info=True)
            answers = [Answer(None)] * len(asks)
        carried = sum(a.results is not None for (c, _), a in zip(asks, answers) if not isinstance(c, _Own))
        if carried:
            with self.lock:
                relay.carried += carried
            if relay.on_carried is not None:
                relay.on_carried()
        for (conn, _), answer in zip(asks, answers):
            if isinstance(conn, _Own):
                conn.answer = answer
                conn.done.set()
                continue
            frame = _frame(answer)
            try:
                # Non-blocking: a sender waits for its answer with room for it; one that does
                # not read (it sends without waiting) is cut off rather than waited for.
                sent = conn.send(frame)
            except OSError:
                sent = -1
            if sent != len(frame):
                self._broke(conn)


class _Own:
    """A flush of the carrier's own process, waiting for the commit that carries it."""

    __slots__ = ("abandoned", "answer", "ask", "done")

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        self.answer: Answer | None = None
        self.abandoned = False
        self.done = threading.Event()


def _extend(writer: Writer, txn: lmdb.Transaction, part: Part, now: int) -> FlushResult | None:
    """``part`` written onto its session, or None (nothing written) when the transcript moved
    or the part does not hold together: each content digest must be its body's, and the node
    digests the chain of them from the head it names."""
    count = len(part.bodies)
    if not count or len(part.digests) != 32 * count or len(part.nodes) != 32 * count or len(part.head) != 32:
        return None
    if not 0 <= part.summaries <= count:
        return None
    digests = [sha256(body).digest() for body in part.bodies]
    if b"".join(digests) != part.digests:
        return None
    nodes = chain(part.head, digests)
    if b"".join(nodes) != part.nodes:
        return None
    messages = NewMessages(part.bodies, digests, nodes, summaries=part.summaries)
    return writer.extend(txn, part.session, part.length, part.head, messages, now)


# POLLRDHUP (Linux): the peer closed even while data it sent is still unread.
_HUNG_UP = select.POLLHUP | getattr(select, "POLLRDHUP", 0) | select.POLLERR | select.POLLNVAL


def _connected(conn: socket.socket) -> bool:
    """Whether the sender at the other end of ``conn`` is still there to hear its answer.

    A sender that died (or closed) hung up its end; the gathering thread may also have closed
    this one on reading the end of the stream.  Data still unread does not hide a hang-up."""
    fd = conn.fileno()
    if fd < 0:
        return False
    poller = select.poll()
    poller.register(fd, _HUNG_UP)
    hung_up = any(events & _HUNG_UP for _, events in poller.poll(0))
    return not hung_up and conn.fileno() == fd  # closed meanwhile: the fd may be another's now


_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


def _same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as this process's user."""
    try:
        _, uid, _ = _CREDENTIALS.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size))
    except OSError:
        return False
    return uid == os.geteuid()


_RELAYS: weakref.WeakSet[Relay] = weakref.WeakSet()


def _forget_in_child() -> None:
    for relay in list(_RELAYS):
        relay.forget()


os.register_at_fork(after_in_child=_forget_in_child)
