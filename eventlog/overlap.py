"""The SHA-256 of a large buffer, computed on a second thread while the caller goes on.

An event's hash covers all of its bytes: for a bulk flush, a megabyte of message bodies,
about a sixth of the flush's time.  ``hashlib`` releases the GIL while it hashes a
buffer of more than a few kilobytes, so a second thread can hash the event while the
writer computes what does not need the hash (the event's leaf for the Merkle tree, its
chain entries).  :func:`sha256_during` runs both and returns when both are done; the
digest is the one ``hashlib`` would give on the calling thread.

One worker thread per process, started on first use (again in a child after ``fork()``);
it waits without the GIL between jobs.  On a machine with one CPU for this process, and
for small buffers, where handing the job over costs more than it saves, the hash is
computed on the calling thread, before ``work``.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from hashlib import sha256
from typing import TypeVar

T = TypeVar("T")

OVERLAP_FROM = 256 * 1024
"""Buffers from this size are hashed on the worker thread (handing a job over costs
tens of microseconds; hashing 256 KiB, about two hundred)."""


class _Job:
    __slots__ = ("data", "digest", "done", "error", "ready", "started")

    def __init__(self) -> None:
        self.digest = sha256()
        self.data: bytes | bytearray | memoryview | None = None
        self.error: BaseException | None = None
        self.ready, self.started, self.done = threading.Lock(), threading.Lock(), threading.Lock()
        self.ready.acquire()
        self.started.acquire()
        self.done.acquire()

    def run(self) -> None:
        try:
            self.ready.acquire()  # the caller hands over the buffer (or None: nothing to hash)
            if self.data is not None:
                self.started.release()  # the caller goes on once this thread gives up the GIL, in update()
                self.digest.update(self.data)
        except BaseException as e:  # handed to the caller, which raises it
            self.error = e
        finally:
            self.data = None
            self.done.release()


def _serve(jobs: queue.SimpleQueue[_Job]) -> None:
    while True:
        jobs.get().run()


class _Worker:
    """The process's worker thread and its queue (``None`` until first use, or in a new process)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = 0
        self.jobs: queue.SimpleQueue[_Job] | None = None
        self.cpus: int | None = None

    def queue(self) -> queue.SimpleQueue[_Job] | None:
        """The worker's queue, the worker started if need be; None when it cannot help."""
        pid = os.getpid()
        if self.pid == pid:
            return self.jobs
        with self.lock:
            if self.pid != pid:  # first use, or the first in a child after fork(): no worker here yet
                jobs: queue.SimpleQueue[_Job] | None = None
                if _cpus() > 1:
                    jobs = queue.SimpleQueue()
                    try:
                        threading.Thread(target=_serve, args=(jobs,), name="eventlog-sha256", daemon=True).start()
                    except RuntimeError:  # interpreter shutdown: hash on the calling thread
                        jobs = None
                self.jobs, self.pid = jobs, pid
            return self.jobs


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


_WORKER = _Worker()


class Sha256:
    """SHA-256(prefix || data) of a buffer about ``size`` bytes long that the caller is still
    writing, to be computed on the worker thread while the caller goes on (see :meth:`during`).

    Made before the buffer is written, so that the worker is awake by the time it is
    handed the buffer: waking a thread that has slept for a while takes a good part of a
    millisecond on some machines, about what hashing the buffer saves.  Use it as a
    context manager: on leaving, a worker that was never handed a buffer is let go.
    ``overlap_from``: the size from which the worker hashes (default :data:`OVERLAP_FROM`).
    """

    __slots__ = ("_job",)

    def __init__(self, size: int, *, overlap_from: int | None = None) -> None:
        self._job: _Job | None = None
        threshold = OVERLAP_FROM if overlap_from is None else overlap_from
        jobs = _WORKER.queue() if size >= threshold else None
        if jobs is not None:
            job = _Job()
            jobs.put(job)  # the worker wakes up and waits for the buffer
            self._job = job

    def __enter__(self) -> Sha256:
        return self

    def __exit__(self, *exc: object) -> None:
        job, self._job = self._job, None
        if job is not None:
            job.ready.release()  # no buffer: the worker goes back to waiting for jobs
            _wait(job.done)

    def during(self, prefix: bytes, data: bytes | bytearray | memoryview, work: Callable[[], T]) -> tuple[bytes, T]:
        """``(SHA-256(prefix || data), work())``, the hash computed while ``work`` runs (on
        this thread, before ``work``, when the worker was not woken).  Once only.

        ``data`` must not change until this returns, which it does only once the worker is
        done with it, even when ``work`` raises (the error is raised then) or an interrupt
        arrives.
        """
        job, self._job = self._job, None
        if job is None:
            digest = sha256(prefix)
            digest.update(data)
            return digest.digest(), work()
        job.digest.update(prefix)
        job.data = data
        job.ready.release()
        _wait(job.started)
        try:
            result = work()
        finally:
            _wait(job.done)  # never leave the worker reading a buffer the caller may reuse
        if job.error is not None:
            raise job.error
        return job.digest.digest(), result


def sha256_during(
    prefix: bytes, data: bytes | bytearray | memoryview, work: Callable[[], T], *, overlap_from: int | None = None
) -> tuple[bytes, T]:
    """``(SHA-256(prefix || data), work())`` for a buffer written already (see :class:`Sha256`)."""
    with Sha256(len(data), overlap_from=overlap_from) as hashing:
        return hashing.during(prefix, data, work)


def _wait(lock: threading.Lock) -> None:
    """Acquire ``lock``, which the worker releases soon; an interrupt meanwhile is raised after it."""
    try:
        lock.acquire()
    except BaseException:
        lock.acquire()
        raise
