"""The asyncio API: :class:`AsyncEventLog`, an :class:`~eventlog.EventLog` whose calls are awaited.

Every blocking call (hashing, LMDB transactions, fsync) runs on a worker thread of the
log's own pool, so the event loop keeps serving other tasks while a turn is written.

Flushes awaited at the same time from many tasks are written in batches: the flushes made
on one pass of the loop (and those made while earlier batches were being written) go to a
worker together and are written in one transaction, one sync for all of them, and the
loop is woken once per batch to resolve them.  Each call still gets its own
:class:`~eventlog.FlushResult` or its own error: when a flush of the batch fails (a
:class:`~eventlog.ConflictError`, a history mismatch, a bad message), nothing of the batch
was written, and it is written again in halves until every other flush is stored and the
failing one has raised exactly what :meth:`EventLog.flush` raises.  A batch is cut to about
:data:`BATCH_CPU_S` of a worker's CPU time, measured from the batches before it: the worker
holds the GIL while it prepares a batch, and the loop's thread waits for it if it wakes
meanwhile.  Two batches are written at once (:data:`DEFAULT_BATCHES`), one prepared while
the other syncs (LMDB's commit releases the GIL), and when they meet in the log's group
commit (see docs/design.md) they share its sync too.  Other writes (``append``, ``rewind``,
``flush`` with ``overrides``, ...) each take a worker and enter the group commit.

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
acknowledged.  A cancelled call that no worker had started yet never runs (one waiting on a
worker for the earlier calls of its session has not started).  One that a worker was
already running cannot be stopped half way (its write lands whole or not at
all); the cancelled task waits for that worker to finish before ``CancelledError`` reaches
it, so whatever the task writes next (a flush in ``finally``) comes after it and is never
undone by it.  Because flushes are idempotent, the usual recovery is to flush the same list
again: whatever had landed is not written twice.

A flush waiting in a batch that no worker has started writing is such a call: cancelled, it
never runs.  Once a worker writes the batch, it lands whole with the batch (or not at all,
with the batch).

Calls naming the same session run in the order they were made, whichever worker takes them:
two flushes of one session never share a batch, and the later one waits for the earlier.  A
call cancelled before it started keeps its place all the same: the calls made after it still
wait for those made before it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

from .errors import EventLogError
from .log import EventLog, FlushResult
from .redact import Redaction
from .replay import Occurrence, SessionInfo
from .verify import VerifyReport

__all__ = ["BATCH_CPU_S", "BATCH_SIZE", "DEFAULT_BATCHES", "DEFAULT_WORKERS", "AsyncEventLog"]

T = TypeVar("T")

DEFAULT_WORKERS = 8
"""Worker threads of an :class:`AsyncEventLog`: how many of its calls can be in flight at once.
More calls than this wait their turn in order.  A batch of flushes is one call, so however
many tasks flush, flushes take at most :data:`DEFAULT_BATCHES` workers and leave the others to
reads and other writes.  Every worker running Python at the same time is one more thread the
event loop's thread competes with for the GIL."""


DEFAULT_BATCHES = 2
"""Batches of flushes an :class:`AsyncEventLog` writes at once: while one batch is synced (the
GIL released), the next one is prepared."""

BATCH_SIZE = 64
"""The most flushes one batch carries."""

BATCH_CPU_S = 0.002
"""About how long (CPU seconds, measured on the worker) one batch may take to prepare (the
default ``batch_cpu``).

A worker holds the GIL while it validates, encodes and hashes a batch, and the event loop's
thread waits for it when it wakes meanwhile; batches are cut to about this much work (from the
cost of the batches before), so a loop waits for a worker about this long at most."""


FLUSH_CPU_S = 0.0002
"""What a flush of one turn is taken to cost a worker until batches have been measured."""


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

    ``max_workers`` bounds the calls in flight at once (:data:`DEFAULT_WORKERS`).  Concurrent
    flushes are written in batches: ``max_batches`` at once (:data:`DEFAULT_BATCHES`), each of
    at most ``batch_size`` flushes (:data:`BATCH_SIZE`) and about ``batch_cpu`` seconds of a
    worker's CPU time (:data:`BATCH_CPU_S`; larger: fewer syncs, longer waits of the event loop
    for the GIL).  The synchronous log stays available as :attr:`sync`, for code that is not async.
    """

    def __init__(
        self,
        log: EventLog,
        *,
        max_workers: int = DEFAULT_WORKERS,
        owns_log: bool = False,
        max_batches: int = DEFAULT_BATCHES,
        batch_size: int = BATCH_SIZE,
        batch_cpu: float = BATCH_CPU_S,
    ) -> None:
        if not isinstance(log, EventLog):
            raise TypeError(f"AsyncEventLog wraps an EventLog, not {type(log).__name__}")
        for name, value in (("max_workers", max_workers), ("max_batches", max_batches), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if isinstance(batch_cpu, bool) or not isinstance(batch_cpu, (int, float)) or not batch_cpu > 0:
            raise ValueError(f"batch_cpu must be a positive number of seconds, not {batch_cpu!r}")
        self._log = log
        self._owns_log = owns_log
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="eventlog-aio")
        self._closed = False
        # The newest call of each session not yet finished: the next call of that session
        # waits for it on its worker, so one session's calls run in the order they were made.
        self._tails: dict[str, concurrent.futures.Future[Any]] = {}
        self._tails_guard = threading.Lock()
        # Flushes made and not yet handed to a worker, in the order they were made, and
        # how many batches of them workers are writing (at most ``max_batches``).
        self._pending: list[_Flush] = []
        self._draining: asyncio.AbstractEventLoop | None = None  # the loop a drain of _pending is due on
        self._batches = 0
        self._max_batches = max_batches
        self._batch_size = batch_size
        self._batch_cpu = float(batch_cpu)
        self._flush_cpu = FLUSH_CPU_S  # CPU seconds a flush of a batch costs (averaged over batches)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        max_workers: int = DEFAULT_WORKERS,
        max_batches: int = DEFAULT_BATCHES,
        batch_size: int = BATCH_SIZE,
        batch_cpu: float = BATCH_CPU_S,
        **options: Any,
    ) -> _Opening:
        """Open (creating when needed) the log in directory ``path`` on a worker thread.

        ``await AsyncEventLog.open(path)`` returns the log; ``async with AsyncEventLog.open(path)
        as log`` also closes it at the end of the block.  ``options`` are those of
        :meth:`EventLog.open` (``durability``, ``projections``, ``readonly``, ...); the log
        owns the :class:`EventLog` it opens and closes it.
        """
        wrapper = {
            "max_workers": max_workers,
            "max_batches": max_batches,
            "batch_size": batch_size,
            "batch_cpu": batch_cpu,
        }
        return _Opening(cls, path, wrapper, options)

    async def close(self) -> None:
        """Wait for the calls in flight, then close the pool (and the log, when this owns it).

        Calls made afterwards raise :class:`~eventlog.EventLogError`.  Closing twice is harmless.
        """
        if self._closed:
            return
        self._closed = True
        self._dispatch(force=True)  # flushes already made are written, as before the close
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
        """:meth:`EventLog.flush`, awaited.  The list is copied when the call is made.

        Flushes awaited at the same time are written together, one transaction for a batch
        (see the module's notes); each call still gets its own result, or its own error.
        """
        if overrides is not None or not isinstance(session_id, str):
            return await self._call(
                (session_id,),
                self._log.flush,
                session_id,
                _copy(messages),
                overrides=overrides,
                expected_head=expected_head,
                replace=replace,
            )
        return await self._batched(_Flush(session_id, _copy(messages), expected_head, replace))

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
        if keys and self._pending:
            # A flush of one of these sessions may be waiting for its batch: hand it to a
            # worker first, so this call (queued behind it) never waits for a batch not queued.
            self._dispatch(force=True)
        claim = _Claim()
        with self._tails_guard:
            before = [tail for tail in (self._tails.get(key) for key in keys) if tail is not None]
            work = (
                functools.partial(self._after, claim, before, fn, args, kwargs)
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
            if before:
                # It waits for earlier calls of its sessions: it must stay in line (the calls
                # after it wait for it, and so for those), so it is told not to run instead.
                if self._cancel(claim):
                    raise  # no worker had started it: it never runs
            elif job.cancel():
                raise  # no worker had started it: it never runs
            # A worker is running it and cannot be stopped half way: let it finish before the
            # task hears of the cancellation, so the task's next write comes after this one.
            await _finish(waiter)
            raise

    # -- flushes, gathered into batches -------------------------------------------

    async def _batched(self, item: _Flush) -> FlushResult:
        if self._closed:
            raise EventLogError(f"{self.path}: this AsyncEventLog is closed")
        loop = asyncio.get_running_loop()
        item.loop = loop
        item.waiter = waiter = loop.create_future()
        with self._tails_guard:
            item.before = self._tails.get(item.session_id)
            self._tails[item.session_id] = item.done
            self._pending.append(item)
            drain = self._draining is not loop  # (a drain due on a loop since closed never runs)
            self._draining = loop
        item.done.add_done_callback(functools.partial(self._forget, [item.session_id]))
        if drain:
            # After the callbacks already due on this pass of the loop: every flush the tasks
            # woken with this one make joins the same batch.
            loop.call_soon(self._drain)
        try:
            return await waiter
        except asyncio.CancelledError:
            if self._cancel(item):
                # No worker had taken it: it never runs.  It stays in line all the same (a worker
                # resolves it once the calls before it are done), for the calls after it.
                raise
            # A worker is writing it and cannot be stopped half way: let it finish before the
            # task hears of the cancellation, so the task's next write comes after this one.
            await _finish(asyncio.wrap_future(item.done))
            raise

    def _drain(self) -> None:
        with self._tails_guard:
            self._draining = None
        self._dispatch()

    def _dispatch(self, *, force: bool = False) -> None:
        """Hand the pending flushes to workers, as batches, while fewer than ``max_batches`` are
        being written (``force``: all of them, now)."""
        while True:
            with self._tails_guard:
                if not self._pending or (self._batches >= self._max_batches and not force):
                    return
                batch = self._take_batch()
                if not batch:
                    return
                self._batches += 1
                befores = [item.before for item in batch if item.before is not None]
                try:
                    # Under the guard, as in _call: the pool takes calls in the order they were made.
                    self._pool.submit(self._write_batch, batch, befores)
                    continue
                except RuntimeError:  # the pool was shut down by close() meanwhile
                    pass
            # Outside the guard: resolving a flush runs _forget, which takes it.
            error = EventLogError(f"{self.path}: this AsyncEventLog is closed")
            for item in batch:
                if item.cancelled:
                    _give_up(item.done)
                else:
                    item.error = error
                    item.done.set_exception(error)
            self._settle_soon(batch)  # ends the batch

    def _take_batch(self) -> list[_Flush]:
        """Up to ``batch_size`` pending flushes for one batch, oldest first: one flush per session
        (a session's next one waits for the next batch) and one ``replace`` value per batch."""
        batch: list[_Flush] = []
        left: list[_Flush] = []
        sessions: set[str] = set()
        replace: bool | None = None
        limit = max(1, min(self._batch_size, int(self._batch_cpu / self._flush_cpu + 1e-9)))
        for item in self._pending:
            # (A flush cancelled meanwhile goes along: its worker resolves it after the calls before it.)
            if len(batch) < limit and item.session_id not in sessions and (replace is None or item.replace is replace):
                replace = item.replace
                sessions.add(item.session_id)
                batch.append(item)
            else:
                left.append(item)
        self._pending = left
        return batch

    def _write_batch(self, batch: list[_Flush], befores: list[concurrent.futures.Future[Any]]) -> None:
        """On a worker: write ``batch`` (one transaction when nothing fails), resolve each flush."""
        live: list[_Flush] = []
        try:
            if befores:
                # Earlier calls of these sessions; queued before this batch, so running or done.
                concurrent.futures.wait(befores)
            with self._tails_guard:
                for item in batch:
                    if not item.cancelled:
                        item.taken = True
                        live.append(item)
            for item in batch:
                if item.cancelled:
                    _give_up(item.done)  # (its callbacks take the guard)
            started = time.thread_time()
            self._write_together(live)
            if live:
                # What a flush cost this worker (CPU: the GIL held, mostly), for the next batches' size.
                cost = (time.thread_time() - started) / len(live)
                self._flush_cpu = 0.7 * self._flush_cpu + 0.3 * max(cost, 1e-6)
        except BaseException as e:
            for item in live:
                if item.result is None and item.error is None:
                    item.error = e if isinstance(e, Exception) else EventLogError(f"{self.path}: not written: {e!r}")
            raise
        finally:
            for item in live:
                if item.error is not None:
                    item.done.set_exception(item.error)
                else:
                    item.done.set_result(item.result)
            self._settle_soon(batch)

    def _write_together(self, items: list[_Flush]) -> None:
        """Flush ``items`` in one transaction; when that fails, in halves, down to single flushes,
        so each flush gets the result or the error its own :meth:`EventLog.flush` gives."""
        if not items:
            return
        if len(items) == 1:
            item = items[0]
            try:
                item.result = self._log.flush(
                    item.session_id, item.messages, expected_head=item.expected_head, replace=item.replace
                )
            except Exception as e:
                item.error = e
            return
        heads = {item.session_id: item.expected_head for item in items if item.expected_head is not None}
        try:
            results = self._log.flush_many(
                {item.session_id: item.messages for item in items},
                expected_heads=heads or None,
                replace=items[0].replace,
            )
        except Exception:
            # Nothing of the batch was written: one of its flushes fails; find it.
            middle = len(items) // 2
            self._write_together(items[:middle])
            self._write_together(items[middle:])
            return
        for item in items:
            item.result = results[item.session_id]

    def _settle_soon(self, batch: list[_Flush]) -> None:
        """Resolve the awaiting calls of ``batch`` on their event loop, in one callback per loop."""
        loops: dict[asyncio.AbstractEventLoop, list[_Flush]] = {}
        for item in batch:
            if item.loop is not None:
                loops.setdefault(item.loop, []).append(item)
        if not loops:
            with self._tails_guard:
                self._batches -= 1
            return
        first = True
        for loop, items in loops.items():
            try:
                loop.call_soon_threadsafe(self._settle, items, first)
            except RuntimeError:  # that loop is closed: nobody awaits these any more
                if first:
                    with self._tails_guard:
                        self._batches -= 1
            first = False

    def _settle(self, items: list[_Flush], ends_batch: bool) -> None:
        for item in items:
            waiter = item.waiter
            if waiter is None or waiter.done():
                continue  # its task was cancelled (as every flush given up before it ran was)
            if item.error is not None:
                waiter.set_exception(item.error)
            else:
                waiter.set_result(item.result)
        if ends_batch:
            with self._tails_guard:
                self._batches -= 1
            if self._pending:
                self._dispatch()

    def _cancel(self, claim: _Claim) -> bool:
        """Mark a call no worker has taken as not to be run; False when a worker has taken it."""
        with self._tails_guard:
            if claim.taken:
                return False
            claim.cancelled = True
            return True

    def _after(
        self,
        claim: _Claim,
        before: list[concurrent.futures.Future[Any]],
        fn: Callable[..., T],
        args: Any,
        kwargs: Any,
    ) -> Any:
        """Run ``fn`` once the earlier calls of its sessions are finished (whatever their outcome),
        unless the call was cancelled meanwhile.

        The pool takes calls in the order they were made, so each of ``before`` is running or
        finished by now, or waiting for calls before it, and this never waits for a call queued
        behind it.
        """
        concurrent.futures.wait(before)
        with self._tails_guard:
            if claim.cancelled:
                return None  # its task heard CancelledError; nobody reads this
            claim.taken = True
        return fn(*args, **kwargs)

    def _forget(self, keys: list[str], job: concurrent.futures.Future[Any]) -> None:
        with self._tails_guard:
            for key in keys:
                if self._tails.get(key) is job:
                    del self._tails[key]


class _Claim:
    """Whether a worker took a call (``taken``) or its task gave it up before (``cancelled``);
    set under the log's guard, one of the two at most."""

    __slots__ = ("cancelled", "taken")

    def __init__(self) -> None:
        self.cancelled = False
        self.taken = False


class _Flush(_Claim):
    """One awaited :meth:`AsyncEventLog.flush`, from the call until its batch is written.

    ``done`` is its outcome for the calls that must follow it (cancelled when its task gave
    it up before a worker took it, once the calls before it are done); ``waiter`` the awaiting
    task's future, on ``loop``.
    """

    __slots__ = (
        "before",
        "done",
        "error",
        "expected_head",
        "loop",
        "messages",
        "replace",
        "result",
        "session_id",
        "waiter",
    )

    def __init__(self, session_id: str, messages: Any, expected_head: str | None, replace: bool) -> None:
        super().__init__()
        self.session_id = session_id
        self.messages = messages
        self.expected_head = expected_head
        self.replace = replace
        self.done: concurrent.futures.Future[FlushResult] = concurrent.futures.Future()
        self.before: concurrent.futures.Future[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.waiter: asyncio.Future[FlushResult] | None = None
        self.result: Any = None  # a FlushResult once written
        self.error: BaseException | None = None


class _Opening:
    """What :meth:`AsyncEventLog.open` returns: awaitable, and an async context manager."""

    def __init__(
        self, cls: type[AsyncEventLog], path: str | os.PathLike[str], wrapper: dict[str, Any], options: dict[str, Any]
    ) -> None:
        self._args = (cls, path, wrapper, options)
        self._log: AsyncEventLog | None = None

    async def _open(self) -> AsyncEventLog:
        cls, path, wrapper, options = self._args
        log = await asyncio.to_thread(EventLog.open, path, **options)
        return cls(log, owns_log=True, **wrapper)

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


def _give_up(done: concurrent.futures.Future[Any]) -> None:
    """Cancel ``done`` and tell its waiters (``concurrent.futures.wait`` counts a cancelled
    future done only once notified)."""
    done.cancel()
    done.set_running_or_notify_cancel()


async def _finish(waiter: asyncio.Future[Any]) -> None:
    """Wait until ``waiter`` is done, through any further cancellations, ignoring its outcome."""
    while not waiter.done():
        try:
            await asyncio.wait([waiter])
        except asyncio.CancelledError:
            continue
    if not waiter.cancelled():
        waiter.exception()  # retrieved: the outcome is not "never retrieved" in the loop's log
