"""Group commit: concurrent writes of one process share one LMDB write transaction.

Writes that arrive from other threads while a commit is in flight wait in a queue, and
the next writer (the *leader*) commits all of them in one transaction, one sync for
the group.  Each write runs in its own nested transaction, so a body that raises fails
its own caller alone and leaves nothing behind.  A leader keeps committing groups until
its own write is in one; waiters are woken as soon as the commit that holds theirs is
done, and the last step of a leader is to hand the lead to the first caller in line.

An interrupt (Ctrl-C, raised in whichever thread runs the signal handler) can land at
any point of this.  The code is written so that it never strands the lead, never lets
two callers lead at once, never runs a write whose caller has left, and tells every
caller the truth about whether its write is stored.  The rule that keeps the lead
safe: a request is named :attr:`GroupCommit.holder` before its ``lead`` is set, in
every place the lead moves (see :meth:`GroupCommit._take_lead_left_behind`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import lmdb

from .errors import EventLogError, StorageFullError, translate
from .keys import SEQ, event_hash
from .space import ZeroedSpace

T = TypeVar("T")

WAKE_POLL = 0.1
"""Seconds between the looks a waiting thread takes at what it waits for, in case an interrupt
of the thread that was to wake it skipped the wake-up (its state is set before it)."""
READER_CHECK_EVERY = 64
"""Commits between sweeps of reader slots left by dead processes (they pin old pages)."""
MAX_GROUP = 64
"""The most writes one commit carries."""


class Target(Protocol):
    """What a group commit needs of the store it commits to (:class:`eventlog.store.Store`)."""

    path: str
    env: lmdb.Environment
    events: lmdb._Database
    space: ZeroedSpace | None
    sync_meta: bool
    """Whether a commit's meta page is synced by the log, after LMDB's writer lock is released
    (durability ``full``; see :meth:`GroupCommit._make_durable`)."""

    def slot(self) -> AbstractContextManager[None]:
        """Count a transaction open (the map is not resized while one is)."""
        ...

    def resize(self, new_size: int) -> None:
        """Set the map size with no transaction open (0: adopt another process's size)."""
        ...

    def check_identity(self) -> None:
        """Raise :class:`CorruptLogError` when the files were replaced under the store."""
        ...

    def sync(self) -> None:
        """Sync the data file: every commit made before the call survives an OS crash."""
        ...

    def grown_size(self) -> int:
        """The map size after it ran full; raises :class:`StorageFullError` at the maximum."""
        ...

    def seal(self, txn: lmdb.Transaction) -> None:
        """Derive what the commit's events imply beyond the writes themselves (the Merkle
        tree), in the same transaction: called after the writes, before the commit."""
        ...


class Tip:
    """The newest event of the log as this process knows it: ``(seq, hash)``.

    ``committed`` is the last event of the last commit; ``pending`` the last event the open
    write transaction wrote (None before its first), which a commit makes ``committed``.
    The writer's :class:`~eventlog.store.Batch` chains its first event to them without
    reading and hashing the log's last event again.
    """

    __slots__ = ("committed", "pending")

    def __init__(self) -> None:
        self.committed: tuple[int, bytes] = (0, bytes(32))
        self.pending: tuple[int, bytes] | None = None

    def known(self, seq: int) -> tuple[int, bytes] | None:
        """``(seq, hash)`` when ``seq`` is the pending or committed event, else None."""
        for known in (self.pending, self.committed):
            if known is not None and known[0] == seq:
                return known
        return None


class Request:
    """A write waiting for (or done by) a group commit."""

    __slots__ = ("abandoned", "body", "commit", "done", "error", "lead", "result", "wake", "woken")

    def __init__(self, body: Callable[[lmdb.Transaction], object]) -> None:
        self.body = body
        self.done = False
        self.lead = False  # this caller leads the next group (set before its wake is released)
        self.abandoned = False  # its caller stopped waiting: never run it
        self.woken = False  # its wake lock was released (it is released once)
        self.result: object = None
        self.error: BaseException | None = None
        self.commit = 0  # the number of the commit that stored it (GroupCommit.commits), 0 before
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


def _fail(group: list[Request], error: BaseException) -> None:
    for request in group:
        request.error = error
        request.done = True


class GroupCommit:
    """The write queue of one store: :meth:`write` runs a transaction body, grouped with others.

    ``lock`` guards ``queue``, ``leading`` (a thread is committing a group) and ``holder``
    (the request whose caller leads, while one does).  ``commits`` counts the write
    transactions this process committed, ``grouped_writes`` the writes they carried.
    """

    def __init__(self, target: Target, tip: Tip) -> None:
        self.target = target
        self.tip = tip
        self.lock = threading.Lock()
        self.queue: list[Request] = []
        self.leading = False
        self.holder: Request | None = None
        self.last_group = 0  # how many writes the last commit carried
        self.max_group = MAX_GROUP
        self.commits = 0
        self.grouped_writes = 0
        self.synced = 0  # commits known synced (durability full: their meta pages)
        self.durable_seq = 0  # events known synced, whoever committed them (see durable_through)
        self.sync_lock = threading.Lock()  # one sync at a time; those queued behind it often need none
        self.map_filled_by: Request | None = None  # the write a group's map ran out of room in
        self.local = _PerThread()

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
        local = self.local
        if local.writing:
            # This thread is inside a write already (a signal handler that writes, run in the
            # middle of one): waiting here could mean waiting for itself.
            raise EventLogError(
                f"{self.target.path}: a write was started while this thread is inside another write of this log "
                "(from a signal handler?); nothing of it was written: write after the interrupted call "
                "returns, for example in a finally block"
            )
        try:
            local.writing = True
            return self._write(Request(body))
        finally:
            local.writing = False

    def _write(self, request: Request) -> Any:
        # One try for the whole turn, so that an interrupt (Ctrl-C) anywhere leaves the queue
        # and the lead as the other writers need them; the finally makes no Python call before
        # the lead is passed on (an interrupt can land as a Python function starts).
        try:
            with self.lock:
                self.queue.append(request)
                if not self.leading:
                    self.holder = request  # named before its lead is set, as everywhere (_take_lead_left_behind)
                    request.lead = True  # then: an interrupt after this leaves a lead to pass on
                    self.leading = True
            if not request.lead:
                # Woken once: a commit held this write, or the lead was handed to it.  Polled, in
                # case an interrupt of the leader skipped the release after marking it done, or
                # left the lead with a caller that is gone (see _take_lead_left_behind).
                while not request.wake.acquire(timeout=WAKE_POLL) and not (request.done or request.lead):
                    self._take_lead_left_behind(request)
                if not request.done and not request.lead:
                    # The leader was interrupted before it could say what became of this write.
                    raise _not_written(self.target.path, KeyboardInterrupt())
            while not request.done:  # this caller leads: commit groups until one holds its write
                if self.last_group > 1:
                    # Other threads were writing a moment ago: let those that are ready
                    # join this commit (one sync for all) before taking the queue.
                    time.sleep(0)
                group: list[Request] = []
                try:
                    with self.lock:
                        group = self.queue[: self.max_group]
                        del self.queue[: self.max_group]
                    self._commit_group(group)
                except BaseException as e:
                    # Every write of the group not yet acknowledged fails with it (an interrupt
                    # of this thread is not theirs: they hear that nothing of theirs was stored).
                    for other in group:
                        if not other.done:
                            other.abandoned = True  # taken, even if the interrupt came before the del
                    _fail(
                        [r for r in group if not r.done],
                        e if isinstance(e, Exception) else _not_written(self.target.path, e),
                    )
                    raise
                finally:
                    for other in group:
                        if other is not request and not other.woken:
                            other.woken = True
                            other.wake.release()  # wake exactly the callers this commit acknowledged
        finally:
            with self.lock:
                if not request.done:
                    request.abandoned = True  # interrupted before a commit held it: it never runs now
                if request.lead:
                    request.lead = False
                    queue = self.queue
                    following = queue[0] if queue else None  # no call here: one could end in an interrupt
                    if following is request:
                        following = queue[1] if queue[1:] else None
                    if following is None:
                        self.holder = None
                        self.leading = False
                    else:
                        self.holder = following
                        following.lead = following.woken = True
                        following.wake.release()
                if request in self.queue:  # an interrupt after the release leaves it queued, abandoned: never run
                    self.queue.remove(request)
        if request.error is not None:
            raise request.error
        self._make_durable(request)
        return request.result

    def _take_lead_left_behind(self, request: Request) -> None:
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
        with self.lock:
            holder = self.holder
            if holder is None or request.done or request.lead:
                return
            if holder is not request:
                if not (holder.done or holder.abandoned):
                    return
                holder.lead = False
            self.holder = request
            request.lead = request.woken = True

    def _commit_group(self, group: list[Request]) -> None:
        """Run every request of ``group`` in one write transaction and commit once."""
        if any(request.abandoned for request in group):  # callers interrupted before a group took them
            _fail(
                [r for r in group if r.abandoned],
                EventLogError(f"{self.target.path}: the write was abandoned before it was committed"),
            )
            group = [r for r in group if not r.abandoned]
            if not group:
                return
        if self.commits % READER_CHECK_EVERY == READER_CHECK_EVERY - 1:
            self.target.env.reader_check()
        while True:
            with self.target.slot():
                try:
                    txn = self.target.env.begin(write=True)
                except lmdb.MapResizedError:
                    txn = None
                except lmdb.Error as e:
                    _fail(group, translate(e, self.target.path))
                    return
                grow_to = 0
                if txn is not None:
                    self.tip.pending = None  # this transaction's own, for _landed()
                    try:
                        # Checked holding the writer lock: a data file swapped in under it (a
                        # compacting copy, see Store.vacuum) is seen here, never written through the old map.
                        self.target.check_identity()
                        if self.target.space is not None:
                            self.target.space.extend(self.target.env.info(), self.commits)
                        self._run_group(txn, group)
                        self.target.seal(txn)
                        txn.commit()
                        self._committed(group)  # in the try: an interrupt here is found by _landed()
                    except _BodyFailed:
                        txn.abort()
                        group[0].done = True
                        return
                    except lmdb.MapFullError:
                        txn.abort()
                        if self.target.env.reader_check():
                            continue  # dead readers pinned free pages; retry before growing
                        try:
                            grow_to = self.target.grown_size()
                        except StorageFullError as e:
                            culprit = self.map_filled_by
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
                        _fail(group, translate(e, self.target.path))
                        return
                    except BaseException as e:
                        txn.abort()  # nothing to undo if the commit itself went through
                        if self._landed():
                            # Interrupted (Ctrl-C) as LMDB's commit returned: every write of the
                            # group is stored, and its caller is told so; only this thread stops.
                            self._committed(group)
                        else:
                            _fail(group, e if isinstance(e, Exception) else _not_written(self.target.path, e))
                        raise
                    else:
                        return
            self.target.resize(grow_to)

    def _make_durable(self, request: Request) -> None:
        """Return once the commit that stored ``request`` survives an OS crash (durability
        ``full``); :class:`EventLogError` when the sync failed.

        LMDB syncs a commit's data pages, then writes its meta page (the root that makes the
        commit the log's state).  In ``full`` mode the meta page is synced here, by each
        caller after its commit, with LMDB's writer lock and this store's lead already
        released: other processes' commits, and the next group of this one, go ahead during
        the sync.  One sync covers every commit made before it began, so callers queued
        behind a sync that covers theirs return without one.  Nothing is lost by the order:
        LMDB writes a meta page only after the pages it names are synced, so an OS crash
        before this sync rolls the log back to the commit before (never to damage), and no
        caller was told that commit was stored.
        """
        if not self.target.sync_meta or request.commit <= self.synced:
            return
        with self.sync_lock:
            if request.commit <= self.synced:
                return
            covered = self.commits  # committed before the sync starts: all of them are in it
            seq = self.tip.committed[0]
            self._sync("the write")
            self.synced = max(self.synced, covered)
            self.durable_seq = max(self.durable_seq, seq)

    def durable_through(self, seq: int, last_seq: Callable[[], int]) -> None:
        """Return once the events up to ``seq`` survive an OS crash (durability ``full``).

        For a flush that finds its list stored already and writes nothing: the commit that
        stored it may be another process's (or another thread's) whose meta page is not synced
        yet, and an OS crash would undo it after this caller heard it is stored.  Events this
        process knows are synced need nothing; otherwise one sync covers every event committed
        before it began (``last_seq()``, read first).
        """
        if not self.target.sync_meta or seq <= self.durable_seq:
            return
        with self.sync_lock:
            if seq <= self.durable_seq:
                return
            covered = last_seq()
            self._sync("the list")
            self.durable_seq = max(self.durable_seq, covered)

    def _sync(self, what: str) -> None:
        try:
            self.target.sync()
        except (lmdb.Error, OSError) as e:
            raise EventLogError(
                f"{self.target.path}: {what} is stored, but syncing it to disk failed ({e}): "
                "it may not survive an OS crash or power loss"
            ) from e

    def _committed(self, group: list[Request]) -> None:
        """Mark ``group`` stored (run again by the interrupt path when an interrupt cut it short)."""
        number = self.commits + 1
        for request in group:
            request.commit = number
            request.done = True
        tip = self.tip
        if tip.pending is not None:
            tip.committed = tip.pending
        self.commits = number
        self.grouped_writes += len(group)
        self.last_group = len(group)

    def _landed(self) -> bool:
        """Whether the write transaction just cut short was committed all the same.

        Python raises an interrupt once the C call it arrived during returns, so it can follow
        a commit that went through.  The transaction's last event is then in the log: its
        hash names it and every event before it.  (Called inside the writer's slot.)
        """
        if self.tip.pending is None:
            return False  # the group wrote no event
        seq, digest = self.tip.pending
        txn = self.target.env.begin(write=False)
        try:
            raw = txn.get(SEQ.pack(seq), db=self.target.events)
            return raw is not None and event_hash(seq, raw) == digest
        finally:
            txn.abort()

    def _run_group(self, txn: lmdb.Transaction, group: list[Request]) -> None:
        self.tip.pending = None
        self.map_filled_by = None
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
            before = self.tip.pending
            child = self.target.env.begin(write=True, parent=txn)
            try:
                request.result = request.body(child)
                child.commit()
            except lmdb.MapFullError:
                child.abort()
                self.map_filled_by = request
                raise
            except lmdb.Error as e:
                child.abort()
                request.error = translate(e, self.target.path)
                self.tip.pending = before
            except Exception as e:
                child.abort()
                request.error = e
                self.tip.pending = before
