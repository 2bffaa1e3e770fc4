"""The asyncio API: :class:`AsyncEventLog`, an :class:`~eventlog.EventLog` whose calls are awaited.

Every blocking call (hashing, LMDB transactions, fsync) runs on a worker thread of the
log's own pool, so the event loop keeps serving other tasks while a turn is written.
Writes that are in flight at the same time from many tasks share commits: each worker
enters the log's group commit (see docs/design.md), so an asyncio server holding many
conversations pays one fsync for a whole group of turns.

>>> import asyncio, tempfile
>>> from eventlog.aio import AsyncEventLog
>>> async def main(path):
...     async with AsyncEventLog.open(path) as log:
...         turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
...         results = await asyncio.gather(*(log.flush(f"chat-{i}", turn) for i in range(8)))
...         return [r.appended for r in results], (await log.messages("chat-3"))[1]["content"]
>>> with tempfile.TemporaryDirectory() as tmp:
...     asyncio.run(main(tmp))
([2, 2, 2, 2, 2, 2, 2, 2], 'hello')

Cancellation (``task.cancel()``, ``asyncio.timeout``) follows one rule: an awaited call
that returned was committed whole, and a call that raised ``CancelledError`` was not
acknowledged.  A cancelled call that had not reached a worker yet never runs.  One that a
worker was already running cannot be stopped half way (its write lands whole or not at
all); the cancelled task waits for that worker to finish before ``CancelledError`` reaches
it, so whatever the task writes next (a flush in ``finally``) comes after it and is never
undone by it.  Because flushes are idempotent, the usual recovery is to flush the same list
again: whatever had landed is not written twice.

Calls naming the same session run in the order they were made, whichever worker takes them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from .errors import EventLogError
from .log import EventLog, FlushResult
from .redact import Redaction
from .replay import Occurrence, SessionInfo
from .verify import VerifyReport

__all__ = ["DEFAULT_WORKERS", "AsyncEventLog"]

T = TypeVar("T")

DEFAULT_WORKERS = 8
"""Worker threads of an :class:`AsyncEventLog`: how many of its calls can be in flight at once
(and so how many writes one commit can carry).  More calls than this wait their turn in order.

Eight carry about as many turns per second as 32 on the two-core reference machine
(benchmarks/bench_aio.py), while the event loop waits for the GIL far less: every worker
running Python between its syncs is one more thread the loop's thread competes with."""


def _copy(messages: Any) -> Any:
    """A shallow copy of a message list, made on the event loop's thread when the call is made.

    A worker reads the list later; another task appending to it meanwhile must not change
    what this call flushes.  Anything that is not a plain sequence is passed through, so the
    log's own checks name it.
    """
    if isinstance(messages, (list, tuple)):
        return list(messages)
    return messages


class AsyncEventLog:
    """An :class:`~eventlog.EventLog` for asyncio code: the same methods, awaited.

    Open one with ``await AsyncEventLog.open(path, **options)`` (the options of
    :meth:`EventLog.open`) and close it with ``await log.close()``, or use it as
    ``async with AsyncEventLog.open(path) as log``.  Or wrap a log you already
    have: ``AsyncEventLog(log)``; closing the wrapper then leaves ``log`` open unless
    ``owns_log=True``.

    ``max_workers`` bounds the calls in flight at once (:data:`DEFAULT_WORKERS`).  The
    synchronous log stays available as :attr:`sync`, for code that is not async.
    """

    def __init__(self, log: EventLog, *, max_workers: int = DEFAULT_WORKERS, owns_log: bool = False) -> None:
        if not isinstance(log, EventLog):
            raise TypeError(f"AsyncEventLog wraps an EventLog, not {type(log).__name__}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be a positive int, not {max_workers!r}")
        self._log = log
        self._owns_log = owns_log
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="eventlog-aio")
        self._closed = False
        # The newest call of each session not yet finished: the next call of that session
        # waits for it on its worker, so one session's calls run in the order they were made.
        self._tails: dict[str, concurrent.futures.Future[Any]] = {}
        self._tails_guard = threading.Lock()

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, max_workers: int = DEFAULT_WORKERS, **options: Any) -> _Opening:
        """Open (creating when needed) the log in directory ``path`` on a worker thread.

        ``await AsyncEventLog.open(path)`` returns the log; ``async with AsyncEventLog.open(path)
        as log`` also closes it at the end of the block.  ``options`` are those of
        :meth:`EventLog.open` (``durability``, ``projections``, ``readonly``, ...); the log
        owns the :class:`EventLog` it opens and closes it.
        """
        return _Opening(cls, path, max_workers, options)

    async def close(self) -> None:
        """Wait for the calls in flight, then close the pool (and the log, when this owns it).

        Calls made afterwards raise :class:`~eventlog.EventLogError`.  Closing twice is harmless.
        """
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._shutdown)

    def _shutdown(self) -> None:
        self._pool.shutdown(wait=True)
        if self._owns_log:
            self._log.close()

    async def __aenter__(self) -> AsyncEventLog:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    # -- properties that do not block ----------------------------------------------

    @property
    def sync(self) -> EventLog:
        """The synchronous :class:`EventLog` underneath (for code outside the event loop)."""
        return self._log

    @property
    def path(self) -> str:
        return self._log.path

    @property
    def id(self) -> str:
        """The log's random id (32 hex characters)."""
        return self._log.id

    @property
    def durability(self) -> str:
        return self._log.durability

    @property
    def closed(self) -> bool:
        return self._closed

    # -- writing -------------------------------------------------------------------

    async def flush(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        overrides: Mapping[int, Mapping[str, Any]] | None = None,
        expected_head: str | None = None,
        replace: bool = False,
    ) -> FlushResult:
        """:meth:`EventLog.flush`, awaited.  The list is copied when the call is made."""
        return await self._call(
            (session_id,),
            self._log.flush,
            session_id,
            _copy(messages),
            overrides=overrides,
            expected_head=expected_head,
            replace=replace,
        )

    async def flush_many(
        self,
        transcripts: Mapping[str, Sequence[Mapping[str, Any]]],
        *,
        expected_heads: Mapping[str, str | None] | None = None,
        replace: bool = False,
    ) -> dict[str, FlushResult]:
        """:meth:`EventLog.flush_many`, awaited: every session in one transaction."""
        if isinstance(transcripts, Mapping):
            copied: Any = {session_id: _copy(messages) for session_id, messages in transcripts.items()}
            sessions: tuple[Any, ...] = tuple(copied)
        else:
            copied, sessions = transcripts, ()
        options: dict[str, Any] = {"replace": replace}
        if expected_heads is not None:
            options["expected_heads"] = dict(expected_heads)
        return await self._call(sessions, self._log.flush_many, copied, **options)

    async def append(
        self, session_id: str, messages: Sequence[Mapping[str, Any]], *, expected_head: str | None = None
    ) -> FlushResult:
        """:meth:`EventLog.append`, awaited."""
        return await self._call(
            (session_id,), self._log.append, session_id, _copy(messages), expected_head=expected_head
        )

    async def rewind(self, session_id: str, *, to: int) -> FlushResult:
        """:meth:`EventLog.rewind`, awaited."""
        return await self._call((session_id,), self._log.rewind, session_id, to=to)

    async def compact(
        self,
        session_id: str,
        *,
        start: int,
        end: int,
        summary: Sequence[Mapping[str, Any]],
        expected_head: str | None = None,
    ) -> FlushResult:
        """:meth:`EventLog.compact`, awaited."""
        return await self._call(
            (session_id,),
            self._log.compact,
            session_id,
            start=start,
            end=end,
            summary=_copy(summary),
            expected_head=expected_head,
        )

    async def fork(self, source_id: str, new_id: str, at: int | None = None) -> FlushResult:
        """:meth:`EventLog.fork`, awaited."""
        return await self._call((source_id, new_id), self._log.fork, source_id, new_id, at)

    async def update_session(self, session_id: str, **fields: Any) -> None:
        """:meth:`EventLog.update_session`, awaited."""
        await self._call((session_id,), self._log.update_session, session_id, **fields)

    async def close_session(self, session_id: str, *, reason: str = "") -> None:
        """:meth:`EventLog.close_session`, awaited."""
        await self._call((session_id,), self._log.close_session, session_id, reason=reason)

    async def redact(
        self,
        session_id: str,
        position: int,
        *,
        reason: str,
        by: str = "",
        seq: int | None = None,
        spill_dir: str | os.PathLike[str] | None = None,
    ) -> list[Redaction]:
        """:meth:`EventLog.redact`, awaited (after the calls of the session made before it)."""
        return await self._call(
            (session_id,), self._log.redact, session_id, position, reason=reason, by=by, seq=seq, spill_dir=spill_dir
        )

    async def vacuum(self) -> dict[str, int]:
        """:meth:`EventLog.vacuum`, awaited."""
        return await self._call((), self._log.vacuum)

    # -- reading -------------------------------------------------------------------

    async def messages(
        self,
        session_id: str,
        *,
        last: int | None = None,
        as_of: int | None = None,
        repair_tool_calls: bool = False,
    ) -> list[dict[str, Any]]:
        """:meth:`EventLog.messages`, awaited."""
        options: dict[str, Any] = {"as_of": as_of, "repair_tool_calls": repair_tool_calls}
        if last is not None:
            options["last"] = last
        return await self._call((), self._log.messages, session_id, **options)

    async def history(self, session_id: str) -> list[Occurrence]:
        """:meth:`EventLog.history`, awaited."""
        return await self._call((), self._log.history, session_id)

    async def session(self, session_id: str) -> SessionInfo | None:
        """:meth:`EventLog.session`, awaited: what the log knows of the session, or ``None``."""
        return await self._call((), self._log.session, session_id)

    async def head(self, session_id: str) -> str | None:
        """:meth:`EventLog.head`, awaited."""
        return await self._call((), self._log.head, session_id)

    async def sessions(self) -> list[str]:
        """:meth:`EventLog.sessions`, awaited."""
        return await self._call((), self._log.sessions)

    async def contains(self, session_id: str) -> bool:
        """``session_id in log``, awaited."""
        return await self._call((), self._log.__contains__, session_id)

    async def info(self) -> dict[str, Any]:
        """:meth:`EventLog.info`, awaited."""
        return await self._call((), self._log.info)

    async def last_seq(self) -> int:
        """:attr:`EventLog.last_seq`, awaited."""
        return await self._call((), lambda: self._log.last_seq)

    async def verify(self, *, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
        """:meth:`EventLog.verify`, awaited (``progress`` is called on a worker thread)."""
        return await self._call((), self._log.verify, progress=progress)

    async def sync_projections(self, timeout: float | None = None) -> bool:
        """:meth:`EventLog.sync_projections`, awaited."""
        return await self._call((), self._log.sync_projections, timeout)

    async def run(self, fn: Callable[..., T], /, *args: Any, sessions: Iterable[str] = (), **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on one of the log's workers: several calls of :attr:`sync` in a row
        for one hop to a worker (adapters use it for read-then-write steps).

        ``sessions`` names the sessions ``fn`` writes: it runs after the calls of those sessions
        made before it, and the calls made after it wait for it, as for the methods above.
        """
        return await self._call(tuple(sessions), fn, *args, **kwargs)

    # -- the one way a call reaches a worker ---------------------------------------

    async def _call(self, sessions: Iterable[Any], fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise EventLogError(f"{self.path}: this AsyncEventLog is closed")
        keys = [key for key in sessions if isinstance(key, str)]
        with self._tails_guard:
            before = [tail for tail in (self._tails.get(key) for key in keys) if tail is not None]
            work = (
                functools.partial(_after, before, fn, args, kwargs)
                if before
                else functools.partial(fn, *args, **kwargs)
            )
            try:
                job: concurrent.futures.Future[T] = self._pool.submit(work)
            except RuntimeError:  # the pool was shut down by close() meanwhile
                raise EventLogError(f"{self.path}: this AsyncEventLog is closed") from None
            for key in keys:
                self._tails[key] = job
        if keys:
            job.add_done_callback(functools.partial(self._forget, keys))
        waiter = asyncio.wrap_future(job)
        try:
            return await asyncio.shield(waiter)
        except asyncio.CancelledError:
            if job.cancel():
                raise  # no worker had started it: it never runs
            # A worker is running it and cannot be stopped half way: let it finish before the
            # task hears of the cancellation, so the task's next write comes after this one.
            await _finish(waiter)
            raise

    def _forget(self, keys: list[str], job: concurrent.futures.Future[Any]) -> None:
        with self._tails_guard:
            for key in keys:
                if self._tails.get(key) is job:
                    del self._tails[key]


class _Opening:
    """What :meth:`AsyncEventLog.open` returns: awaitable, and an async context manager."""

    def __init__(
        self, cls: type[AsyncEventLog], path: str | os.PathLike[str], max_workers: int, options: dict[str, Any]
    ) -> None:
        self._args = (cls, path, max_workers, options)
        self._log: AsyncEventLog | None = None

    async def _open(self) -> AsyncEventLog:
        cls, path, max_workers, options = self._args
        log = await asyncio.to_thread(EventLog.open, path, **options)
        return cls(log, max_workers=max_workers, owns_log=True)

    def __await__(self) -> Generator[Any, None, AsyncEventLog]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncEventLog:
        self._log = await self._open()
        return self._log

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._log is not None:
            await self._log.close()


def _after(before: list[concurrent.futures.Future[Any]], fn: Callable[..., T], args: Any, kwargs: Any) -> T:
    """Run ``fn`` once the earlier calls of its sessions are finished (whatever their outcome).

    The pool takes calls in the order they were made, so each of ``before`` is running or
    finished by now and this never waits for a call queued behind it.
    """
    concurrent.futures.wait(before)
    return fn(*args, **kwargs)


async def _finish(waiter: asyncio.Future[Any]) -> None:
    """Wait until ``waiter`` is done, through any further cancellations, ignoring its outcome."""
    while not waiter.done():
        try:
            await asyncio.wait([waiter])
        except asyncio.CancelledError:
            continue
    if not waiter.cancelled():
        waiter.exception()  # retrieved: the outcome is not "never retrieved" in the loop's log
