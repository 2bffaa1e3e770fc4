"""The SHA-256 of a large buffer, computed on a second thread while the caller goes on.

An event's hash covers all of its bytes: for a bulk flush, a megabyte of message bodies,
about a sixth of the flush's time.  The C extension ``eventlog._digest`` hands such a
buffer to a native worker thread, which hashes it with OpenSSL (the library ``hashlib``
uses) without the GIL, while the writer computes what does not need the hash: the
event's leaf for the Merkle tree and its messages' chain entries.  A job the worker has
not taken up by then (its CPU is busy with other work) is taken back and hashed by the
caller, so handing it over never costs more than a few microseconds.

The same worker hashes a bulk flush's message bodies (:func:`eventlog.snapshot.prepare`):
``_digest.each`` takes a part of them while the writer encodes the next part, and
``_digest.chain`` links the digests into node digests, each in one C loop rather than a
``hashlib`` object per digest.

Without the extension (built without a C compiler or OpenSSL's headers, or
``EVENTLOG_PURE_PYTHON`` set), on a machine with one CPU for this process, and for
buffers under :data:`OVERLAP_FROM`, the caller hashes the buffer itself, before the
work: the digest is the same either way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from hashlib import sha256
from typing import TypeVar

T = TypeVar("T")

OVERLAP_FROM = 256 * 1024
"""Buffers from this size are handed to the worker (hashing 256 KiB takes about two hundred
microseconds, waking the worker a few tens)."""

try:
    from . import _digest
except ImportError:  # built without a C compiler or OpenSSL: the caller hashes
    _digest = None  # type: ignore[assignment, unused-ignore]
if os.environ.get("EVENTLOG_PURE_PYTHON"):
    _digest = None  # type: ignore[assignment, unused-ignore]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


OFFLOAD = _digest is not None and _cpus() > 1
"""Whether large buffers are hashed on the worker thread."""


def sha256_during(
    prefix: bytes, data: bytes | bytearray | memoryview, work: Callable[[], T], *, offload: bool | None = None
) -> tuple[bytes, T]:
    """``(SHA-256(prefix || data), work())``, ``data`` hashed on the worker thread while ``work`` runs.

    ``data`` must not change until this returns; a ``bytearray`` cannot be resized until
    then.  When ``work`` raises, its error is raised once the worker is done with ``data``.
    ``offload``: hand ``data`` to the worker (default: when :data:`OFFLOAD` and ``data`` is
    at least :data:`OVERLAP_FROM` bytes long).
    """
    if offload is None:
        offload = OFFLOAD and len(data) >= OVERLAP_FROM
    if not offload or _digest is None:
        digest = sha256(prefix)
        digest.update(data)
        return digest.digest(), work()
    job = _digest.start(prefix, data, True)
    try:
        result = work()
    finally:
        found = job.finish()  # the worker's digest, or this thread's if it never took the job
    return found, result
