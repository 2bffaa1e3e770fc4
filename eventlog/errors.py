"""The exceptions a caller of the event log can act on.

One root, :class:`EventLogError`, and a child per situation a caller would handle
separately: a concurrency conflict, a snapshot that does not belong to the stored
history, bad input, a corrupt log, and a full store; and :func:`translate`, which turns
LMDB's errors into them at the boundary.
"""

from __future__ import annotations

import errno
import os

import lmdb


class EventLogError(Exception):
    """Root of every error raised by the event log and its projections."""


class ConflictError(EventLogError):
    """The session's head is not the one the caller expected (``expected_head``)."""


class HistoryMismatchError(EventLogError):
    """A snapshot shares no prefix with the non-empty stored transcript.

    Almost always a caller passing a window of the history or the wrong session;
    pass ``replace=True`` to replace the transcript on purpose.  ``session`` names the
    session whose stored transcript the list did not continue.
    """

    def __init__(self, message: str, *, session: str | None = None) -> None:
        super().__init__(message)
        self.session = session


class InvalidMessageError(EventLogError, ValueError):
    """A message is not a JSON-like mapping; the text names its index and the path inside it."""

    def __init__(self, message: str, *, index: int | None = None, path: str = "") -> None:
        super().__init__(message)
        self.index = index
        self.path = path


class UnknownSessionError(EventLogError, KeyError):
    """The session does not exist in this log."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class CorruptLogError(EventLogError):
    """The stored log is damaged: an event, an index or a file is not what was written."""


class RedactedError(EventLogError, ValueError):
    """The message was redacted already: its content is gone, there is nothing left to erase or prove."""


class LogInUseError(EventLogError):
    """Another process has the log open, so its data file cannot be replaced by a compacting copy now."""


class StorageFullError(EventLogError):
    """The log cannot grow: its configured maximum size or the disk is full.

    Nothing of the failed write was stored; the log is writable again once space
    is freed or the limit raised.
    """


class ReadOnlyError(EventLogError):
    """The log's files cannot be written (read-only file system or permissions)."""


class UnsafeDirectoryError(EventLogError, PermissionError):
    """A log or spill directory that other users can write, or a planted link or file in it.

    Refused unless the caller trusts the directory (``allow_shared_directory=True``).
    """


NEARLY_FULL = 4 << 20
"""Free bytes below which an I/O error from LMDB is reported as a full disk."""


def translate(e: lmdb.Error, path: str) -> EventLogError:
    """Turn an LMDB error into the event log error a caller can act on."""
    code = getattr(e, "errno", None)
    text = str(e)
    if isinstance(e, lmdb.MapFullError):
        return StorageFullError(f"{path}: the log reached its maximum size ({text})")
    if code == errno.ENOSPC or "No space left" in text:
        return StorageFullError(f"{path}: no space left on device ({text})")
    if (code == errno.EIO or "Input/output error" in text) and _nearly_full(path):
        # LMDB reports a failed write of its pages as EIO; on a full disk, say so.
        return StorageFullError(f"{path}: no space left on device ({text})")
    if isinstance(e, lmdb.ReadonlyError) or code in (errno.EROFS, errno.EACCES, errno.EPERM) or "Read-only" in text:
        return ReadOnlyError(f"{path}: cannot write the log ({text})")
    if isinstance(e, lmdb.PanicError):  # this process's environment, not the files
        return EventLogError(f"{path}: LMDB stopped this process's use of the log ({text}); close and open it again")
    if isinstance(
        e,
        (
            lmdb.CorruptedError,
            lmdb.PageNotFoundError,
            lmdb.InvalidError,
            lmdb.VersionMismatchError,
            lmdb.BadChecksumError,
        ),
    ):
        return CorruptLogError(f"{path}: the log's files are damaged ({type(e).__name__}: {text})")
    return EventLogError(f"{path}: {type(e).__name__}: {text}")


def _nearly_full(path: str) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < NEARLY_FULL
