"""Catching projections up in a process of their own (``EventLog.open(..., projection_process=True)``).

A projection caught up on the log's thread shares this process's GIL with the writer:
its Python (deriving rows, binding them) runs between the writer's steps, and each
thread waits for the other at every hand-over.  In a child process the projection's
work runs beside the writer instead of taking turns with it.

The child is this process's Python running :func:`main`: it reads the
log through a read-only handle of its own and applies events with a projection of its
own, opened with the projection's :meth:`opener` (a picklable callable, sent to the
child).  The parent keeps the projection it was given, for its read methods, which read
the same database.  :class:`Offloaded` stands in for the projection on the projector's
thread: each catch-up round asks the child for one and waits for its answer, so waits,
retries and failures work as for a projection caught up on the thread.

A child that dies (killed, out of memory) fails its round; the next round starts a new
child.  A child whose parent is gone sees its pipe close and exits.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, Protocol, TypeGuard

from .errors import EventLogError
from .source import EventSource

logger = logging.getLogger("eventlog")

FRAME = struct.Struct("<I")
STOP_WAIT = 10.0
"""Seconds :meth:`Offloaded.close` waits for the child to finish its last round and exit."""


class Reopenable(Protocol):
    """A projection that can be opened again in another process."""

    def catch_up(self, log: EventSource) -> int: ...

    def opener(self) -> Callable[[], Any]:
        """A picklable callable that opens the same projection (same file, same settings)."""
        ...


class OffloadError(EventLogError):
    """The child process catching a projection up failed, or failed to start."""


class CannotStart(OffloadError):
    """No child process could be started, or it exited before it answered."""


def can_offload(projection: object) -> TypeGuard[Reopenable]:
    """Whether ``projection`` can be caught up in a process of its own (it has an ``opener()``)."""
    return callable(getattr(projection, "opener", None))


class Offloaded:
    """Catches ``projection`` up in a child process (started on the first round).

    ``log_path`` and ``options`` open the child's read-only handle on the log.
    """

    def __init__(self, projection: Reopenable, log_path: str, options: dict[str, Any]) -> None:
        self.projection = projection
        self._request = pickle.dumps((os.path.abspath(log_path), options, projection.opener()))
        self._lock = threading.Lock()
        self._child: subprocess.Popen[bytes] | None = None
        self._here = False  # no child could start: the rounds run in this process

    def __repr__(self) -> str:
        return repr(self.projection)

    @property
    def pid(self) -> int | None:
        """The child's process id while one runs."""
        child = self._child
        return child.pid if child is not None and child.poll() is None else None

    def catch_up(self, log: EventSource) -> int:
        """One catch-up round in the child; its count, or its error raised here.

        Where no child can start (an embedding program whose ``sys.executable`` is not
        Python, a process limit), says so once and catches up in this process from then on.
        """
        if self._here:
            return self.projection.catch_up(log)
        with self._lock:
            child = self._child
            if child is not None and child.poll() is not None:
                self._discard(child)  # it died between rounds: its pipes go with it
                child = None
            if child is None:
                try:
                    child = self._start()
                except CannotStart as e:
                    logger.warning("%s; catching it up in this process instead", e)
                    self._here = True
                    return self.projection.catch_up(log)
            status, value = self._exchange(child, b"catch_up", OffloadError, "during a catch-up")
        if status == "ok":
            return int(value)
        if isinstance(value, BaseException):
            raise value
        raise OffloadError(f"{self.projection!r}: its process failed to catch up: {value}")

    def _exchange(
        self, child: subprocess.Popen[bytes], request: bytes, failure: type[OffloadError], when: str
    ) -> tuple[str, Any]:
        """Send ``request`` to ``child`` and read its answer; raise ``failure`` if it is gone."""
        assert child.stdin is not None and child.stdout is not None
        try:
            _send(child.stdin, request)
            status, value = pickle.loads(_receive(child.stdout))
        except (OSError, EOFError) as e:
            self._discard(child)
            raise failure(f"{self.projection!r}: its process exited (code {child.returncode}) {when}") from e
        except BaseException:
            # Interrupted mid-exchange (Ctrl-C in a reader's round): its answer would be taken
            # for the next request's, so this child goes and the next round starts another.
            self._discard(child)
            raise
        return status, value

    def _discard(self, child: subprocess.Popen[bytes]) -> None:
        self._child = None
        child.kill()
        child.wait()
        for pipe in (child.stdin, child.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # a write buffered for a child that is gone

    def close(self) -> None:
        """Ask the child to close its projection and exit; stop it after :data:`STOP_WAIT`."""
        with self._lock:
            child, self._child = self._child, None
        if child is None:
            return
        assert child.stdin is not None
        try:
            _send(child.stdin, b"")
            child.stdin.close()
            child.wait(STOP_WAIT)
        except (OSError, subprocess.TimeoutExpired):
            pass  # gone already, or stuck: stopped below
        finally:
            self._discard(child)  # stops a child still running; closes both pipes

    def _start(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the parent's modules, for the opener
        try:
            child = subprocess.Popen(
                [sys.executable, "-c", "from eventlog.offload import main; main()"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=env,
                close_fds=True,
            )
        except OSError as e:
            raise CannotStart(f"{self.projection!r}: cannot start a process for it ({e})") from e
        status, value = self._exchange(child, self._request, CannotStart, "before it answered")
        if status != "ok":
            self._discard(child)
            if isinstance(value, BaseException):
                raise value
            raise OffloadError(f"{self.projection!r}: its process could not open it: {value}")
        self._child = child
        return child


def _send(out: IO[bytes], data: bytes) -> None:
    out.write(FRAME.pack(len(data)) + data)
    out.flush()


def _receive(source: IO[bytes]) -> bytes:
    head = source.read(FRAME.size)
    if len(head) < FRAME.size:
        raise EOFError("the pipe closed")
    (size,) = FRAME.unpack(head)
    data = source.read(size)
    if len(data) < size:
        raise EOFError("the pipe closed")
    return data


def _answer(out: IO[bytes], status: str, value: Any) -> None:
    try:
        data = pickle.dumps((status, value))
    except Exception:  # an error that does not pickle: its text
        data = pickle.dumps((status, f"{type(value).__name__}: {value}"))
    _send(out, data)


def serve(source: IO[bytes], out: IO[bytes]) -> None:
    """The child's loop: open the log and the projection, then a catch-up per request until
    an empty request or the pipe closes."""
    from .log import EventLog

    log_path, options, opener = pickle.loads(_receive(source))
    try:
        log = EventLog.open(log_path, readonly=True, relay=False, **options)
        try:
            projection = opener()
        except BaseException:
            log.close()
            raise
    except Exception as e:
        _answer(out, "error", e)
        return
    _answer(out, "ok", 0)
    try:
        while True:
            try:
                request = _receive(source)
            except EOFError:
                return  # the parent is gone
            if not request:
                return
            try:
                _answer(out, "ok", projection.catch_up(log))
            except Exception as e:
                _answer(out, "error", e)
    finally:
        try:
            projection.close()
        finally:
            log.close()


def main() -> None:
    # Ctrl-C in a terminal reaches the whole process group: the parent decides when this one
    # stops (it closes the pipe), so a round is never cut short by it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The answers get a descriptor of their own: whatever the projection prints goes to stderr.
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, answers)
