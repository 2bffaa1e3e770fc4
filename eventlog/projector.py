"""Keeping attached projections current on a thread of their own.

A projection is derived data: the log is the source of truth, and a write is
acknowledged once the log has committed it.  So :class:`Projector` applies new
events to the attached projections *after* the write returns, on one background
thread per log, and the agent's turn never waits for a transcript table or a
search index.  A round that runs on this thread waits for a pause in the writes
(see :data:`COALESCE_LAG`): the agent's own pauses between turns, where it takes
nothing from a write.

Readers that need what they just wrote call :meth:`Projector.wait` (a projection
that was given it through ``bind`` does so before each read), which returns once
every write made before the call has been applied.  When the thread is idle, such a
reader applies those writes itself rather than wake the thread and wait for it: its
own writes are then current one thread hand-over sooner, and with its caches warm.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from .source import EventSource

logger = logging.getLogger("eventlog")

COALESCE_WRITES = 16
COALESCE_LAG = 0.005
COALESCE_MAX_LAG = 0.05
"""Before a catch-up round, the projector gathers writes: it starts the round once this many
have arrived, once the writes have paused for this many seconds, or this many seconds after the
first of them arrived however fast they keep coming, and at once when a reader waits (the
projection's own read methods, ``sync_projections``).  So one round's fixed costs (a SQLite
transaction, its checkpoint, the search index's batch) serve many writes, and a round on the
log's thread runs in the writer's pauses rather than beside its writes, where the two take
turns for the GIL and the writer waits at each hand-over (measured: a round beside a run of
writes cost them more time than the same round took after them).  Readers of the database
itself see a write's rows at most about :data:`COALESCE_MAX_LAG` plus a round later."""

OFFLOADED_WRITES = 4
"""The :data:`COALESCE_WRITES` of a projector whose projections are all caught up in processes of
their own (:mod:`eventlog.offload`): their rounds do not take turns with the writer for the GIL, so
a round can start sooner and leave less for a reader to wait for at the end.  Measured on two
shared cores (blocks of ten trust-mode turns, ``durability="full"``, until rows current): 1.17-1.27x
the flush alone against 1.23-1.29x with 16 in the same runs, the wait at the end of a block about
1 ms shorter; 2, 3 and 8 were no better, a round per write worse (1.37x)."""

RETRY_MIN = 0.05
RETRY_MAX = 5.0
"""Seconds before a failed catch-up is tried again by itself: from the first, doubling to the second."""


class Projection(Protocol):
    """What :meth:`EventLog.open` accepts in ``projections``.

    ``catch_up(log)`` applies the log's events after the projection's checkpoint; it
    reads the log through :class:`~eventlog.source.EventSource` alone.
    A projection may also define ``bind(wait)``: the log then hands it a callable
    that blocks until every write made so far has been applied, for its readers.
    """

    def catch_up(self, log: EventSource) -> int: ...


class Projector:
    """Applies new events to ``projections`` on a daemon thread, after each write.

    :meth:`poke` (called after every committed write, with the newest ``seq``) is
    cheap and never blocks on SQLite.  A projection that fails is logged and tried
    again: after a pause that doubles up to :data:`RETRY_MAX` seconds, on the next
    write, at once when a reader waits for it, and one last time on :meth:`close`.
    It never fails the write, which is already committed.
    """

    def __init__(
        self,
        log: EventSource,
        projections: Sequence[Projection],
        *,
        runners: Sequence[Projection] | None = None,
        gather: int | None = None,
    ) -> None:
        self._log = log
        self._projections = list(projections)
        # What catches each projection up: itself, or what stands in for it elsewhere (eventlog.offload).
        self._runners = list(runners) if runners is not None else self._projections
        self._gather = gather  # writes a round gathers, instead of COALESCE_WRITES
        # Always taken as `with self._lock` (C code), never through the Condition's Python
        # __enter__: a Ctrl-C landing as that returns would leave the lock held for good.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._wanted = 0  # newest seq a write has asked for
        self._done = 0  # every seq up to this one has been applied (or attempted)
        self._failing: set[int] = set()  # indexes of the projections whose last catch-up raised
        self._streak = 0  # failed rounds in a row (the first is logged in full)
        self._rounds = 0  # catch-up rounds finished
        self._retry = False  # a reader asks for another round after a failed one
        self._pause = 0.0  # before the next round after a failed one
        self._stopping = False
        self._stopped = False
        self._pokes = 0  # writes poked since the last round began
        self._first_poke = 0.0  # when the first of them arrived (time.monotonic)
        self._last_poke = 0.0  # when the last of them arrived
        self._quiet = gather is None  # wait for a pause in the writes (see COALESCE_LAG)
        self._readers = 0  # callers in wait(): a round starts at once for them
        self._runner: int | None = None  # the thread running a round (the projector's or a reader's)
        self._thread = threading.Thread(target=self._run, name="eventlog-projector", daemon=True)
        self._thread.start()

    def poke(self, seq: int) -> None:
        """Ask for everything up to ``seq`` to be applied."""
        with self._lock:
            if seq > self._wanted:
                self._wanted = seq
                self._pokes += 1
                self._last_poke = time.monotonic()
                if self._pokes == 1:
                    self._first_poke = self._last_poke
                if self._pokes == 1 or self._pokes >= self._gathered():
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None, projection: Projection | None = None) -> bool:
        """Block until every write poked so far has been applied (to ``projection``, or to all).

        When the last round failed for it, first asks for another one and waits for that.
        False on timeout, or when its catch-up failed again (it was logged).  Returns at
        once on the thread running a round (a projection reading while it catches up), and
        once the thread has stopped or is gone (in a child after ``fork()``).  With no
        ``timeout``, while the projector's thread is idle, the round runs on the caller's
        thread (see :meth:`_apply_here`).
        """
        if threading.current_thread() is self._thread or self._runner == threading.get_ident():
            return True
        if timeout is None:
            self._apply_here()
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        with self._lock:
            self._readers += 1
            self._cond.notify_all()
            try:
                return self._wait_for(target=self._wanted, projection=projection, left=left)
            finally:
                self._readers -= 1

    def _wait_for(self, *, target: int, projection: Projection | None, left: Callable[[], float | None]) -> bool:
        with self._lock:
            if self._fails(projection) and self._running():
                rounds = self._rounds
                self._retry = True
                self._cond.notify_all()
                if not self._cond.wait_for(lambda: self._rounds > rounds or not self._running(), left()):
                    return False
            if not self._cond.wait_for(lambda: self._done >= target or not self._running(), left()):
                return False
            return self._done >= target and not self._fails(projection)

    def _apply_here(self) -> None:
        """Run the next round on the calling thread, when the projector's is idle and nothing failed.

        Only for a reader with no timeout: a round runs to its end.  A failure is handled as the
        projector's own rounds handle it; an interrupt leaves the writes to the next round.
        """
        me = threading.get_ident()
        claimed = False
        try:
            with self._lock:
                if self._runner is not None or not self._claimable():
                    return
                claimed = True  # before the claim itself: an interrupt between the two is handled below
                self._runner = me
                target = self._begin_round()
            failing = self._catch_up_all()
            with self._lock:
                self._end_round(target, failing)
                claimed = False
        finally:
            if claimed:
                with self._lock:
                    if self._runner == me:
                        self._runner = None
                        self._cond.notify_all()

    def _claimable(self) -> bool:
        return self._wanted > self._done and not self._failing and not self._stopping and self._running()

    def _begin_round(self) -> int:
        """Start a round (holding the lock): the seq it applies up to."""
        self._pokes = 0
        self._retry = False
        return self._wanted

    def _catch_up_all(self) -> set[int]:
        """Each projection's catch-up; the indexes of those that failed (logged)."""
        failing = set()
        for i, projection in enumerate(self._projections):
            try:
                self._runners[i].catch_up(self._log)
            except Exception as e:
                # The write is committed; the projection is tried again (see the class).
                failing.add(i)
                if self._streak == 0:
                    logger.exception("projection %r failed to catch up", projection)
                else:
                    logger.warning(
                        "projection %r still fails to catch up (%d rounds): %s", projection, self._streak + 1, e
                    )
        return failing

    def _end_round(self, target: int, failing: set[int]) -> None:
        """Record a finished round (holding the lock) and wake its waiters."""
        self._done = max(self._done, target)
        self._failing = failing
        self._streak = self._streak + 1 if failing else 0
        self._rounds += 1
        self._pause = min(max(2 * self._pause, RETRY_MIN), RETRY_MAX) if failing else 0.0
        self._runner = None
        self._cond.notify_all()

    def waiter(self, projection: Projection) -> Callable[[float | None], bool]:
        """:meth:`wait` for ``projection`` alone: another one failing is not its readers' concern."""
        return lambda timeout: self.wait(timeout, projection)

    def close(self) -> None:
        """Apply what is still waiting, then stop the thread."""
        with self._lock:
            self._stopping = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for projection, runner in zip(self._projections, self._runners):
            if runner is not projection:
                runner.close()  # type: ignore[attr-defined]

    def _fails(self, projection: Projection | None) -> bool:
        if projection is None:
            return bool(self._failing)
        return any(self._projections[i] is projection for i in self._failing)

    def _running(self) -> bool:
        return not self._stopped and self._thread.is_alive()

    def _due(self) -> bool:
        if self._runner is not None:
            return False  # a reader's round: look again when it ends
        return self._wanted > self._done or self._stopping or (self._retry and bool(self._failing))

    def _gathered(self) -> int:
        return COALESCE_WRITES if self._gather is None else self._gather

    def _no_more_gathering(self) -> bool:
        return self._readers > 0 or self._stopping or self._pokes >= self._gathered()

    def _gather_writes(self) -> None:
        """Wait (holding the lock) until a round is due: see :data:`COALESCE_LAG`.

        A projector whose rounds run in other processes (``gather`` given) does not wait for a
        pause: its rounds do not take turns with the writer, and it starts one
        :data:`COALESCE_LAG` after it was ready.
        """
        ready = time.monotonic()
        while not self._no_more_gathering():
            if self._quiet:
                due = min(self._last_poke + COALESCE_LAG, self._first_poke + COALESCE_MAX_LAG)
            else:
                due = ready + COALESCE_LAG
            left = due - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    # After a failed round, the pause running out is due too.
                    self._cond.wait_for(self._due, self._pause if self._failing else None)
                    if not self._failing:
                        self._gather_writes()
                    if self._runner is not None:
                        continue  # a reader took this round (see _apply_here)
                    if self._wanted <= self._done and not self._failing:
                        self._pokes = 0
                        self._retry = False
                        if self._stopping:
                            return  # nothing left
                        continue
                    self._runner = threading.get_ident()
                    target = self._begin_round()
                    last_try = self._stopping  # this round began after close() asked to stop
                failing = self._catch_up_all()
                with self._lock:
                    self._end_round(target, failing)
                    if failing and last_try:
                        return  # closing: that was the last try
        finally:
            with self._lock:
                self._stopped = True
                self._cond.notify_all()


def bind(projection: Projection, wait: Callable[[float | None], bool]) -> None:
    """Give ``projection`` the log's wait, if it takes one."""
    binder = getattr(projection, "bind", None)
    if binder is not None:
        binder(wait)
