"""Keeping attached projections current on a thread of their own.

A projection is derived data: the log is the source of truth, and a write is
acknowledged once the log has committed it.  So :class:`Projector` applies new
events to the attached projections *after* the write returns, on one background
thread per log, and the agent's turn never waits for a transcript table or a
search index.  While the caller's commit waits on its fsync, the projector's
SQLite work runs on another core.

Readers that need what they just wrote call :meth:`Projector.wait` (a projection
that was given it through ``bind`` does so before each read), which returns once
every write made before the call has been applied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .log import EventLog

logger = logging.getLogger("eventlog")

RETRY_MIN = 0.05
RETRY_MAX = 5.0
"""Seconds before a failed catch-up is tried again by itself: from the first, doubling to the second."""


class Projection(Protocol):
    """What :meth:`EventLog.open` accepts in ``projections``.

    ``catch_up(log)`` applies the log's events after the projection's checkpoint.
    A projection may also define ``bind(wait)``: the log then hands it a callable
    that blocks until every write made so far has been applied, for its readers.
    """

    def catch_up(self, log: EventLog) -> int: ...


class Projector:
    """Applies new events to ``projections`` on a daemon thread, after each write.

    :meth:`poke` (called after every committed write, with the newest ``seq``) is
    cheap and never blocks on SQLite.  A projection that fails is logged and tried
    again: after a pause that doubles up to :data:`RETRY_MAX` seconds, on the next
    write, at once when a reader waits for it, and one last time on :meth:`close`.
    It never fails the write, which is already committed.
    """

    def __init__(self, log: EventLog, projections: Sequence[Projection]) -> None:
        self._log = log
        self._projections = list(projections)
        self._cond = threading.Condition()
        self._wanted = 0  # newest seq a write has asked for
        self._done = 0  # every seq up to this one has been applied (or attempted)
        self._failed = False  # the last catch-up of some projection raised
        self._rounds = 0  # catch-up rounds finished
        self._retry = False  # a reader asks for another round after a failed one
        self._pause = 0.0  # before the next round after a failed one
        self._stopping = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="eventlog-projector", daemon=True)
        self._thread.start()

    def poke(self, seq: int) -> None:
        """Ask for everything up to ``seq`` to be applied."""
        with self._cond:
            if seq > self._wanted:
                self._wanted = seq
                self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every write poked so far has been applied.

        When the last round failed, first asks for another one and waits for it.  False
        on timeout, or when the catch-up of a projection failed again (it was logged).
        Returns at once on the projector's own thread (a projection reading while it
        catches up) and once the thread has stopped.
        """
        if threading.current_thread() is self._thread:
            return True
        with self._cond:
            target = self._wanted
            if self._failed and not self._stopped:
                rounds = self._rounds
                self._retry = True
                self._cond.notify_all()
                if not self._cond.wait_for(lambda: self._rounds > rounds or self._stopped, timeout):
                    return False
            if not self._cond.wait_for(lambda: self._done >= target or self._stopped, timeout):
                return False
            return self._done >= target and not self._failed

    def close(self) -> None:
        """Apply what is still waiting, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _due(self) -> bool:
        return self._wanted > self._done or self._stopping or self._retry

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    # After a failed round, the pause running out is due too.
                    self._cond.wait_for(self._due, self._pause if self._failed else None)
                    if self._wanted <= self._done and not self._failed:
                        if self._stopping:
                            return  # nothing left
                        continue
                    target = self._wanted
                    self._retry = False
                    last_try = self._stopping  # this round began after close() asked to stop
                failed = False
                for projection in self._projections:
                    try:
                        projection.catch_up(self._log)
                    except Exception:
                        # The write is committed; the projection is tried again (see the class).
                        logger.exception("projection %r failed to catch up", projection)
                        failed = True
                with self._cond:
                    self._done = max(self._done, target)
                    self._failed = failed
                    self._rounds += 1
                    self._pause = min(max(2 * self._pause, RETRY_MIN), RETRY_MAX) if failed else 0.0
                    self._cond.notify_all()
                    if failed and last_try:
                        return  # closing: that was the last try
        finally:
            with self._cond:
                self._stopped = True
                self._cond.notify_all()


def bind(projection: Projection, wait: Callable[[float | None], bool]) -> None:
    """Give ``projection`` the log's wait, if it takes one."""
    binder = getattr(projection, "bind", None)
    if binder is not None:
        binder(wait)
