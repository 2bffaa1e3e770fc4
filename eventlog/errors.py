"""The exceptions a caller of the event log can act on.

One root, :class:`EventLogError`, and a child per situation a caller would handle
separately: a concurrency conflict, a snapshot that does not belong to the stored
history, bad input, a corrupt log, and a full store.
"""

from __future__ import annotations


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


class StorageFullError(EventLogError):
    """The log cannot grow: its configured maximum size or the disk is full.

    Nothing of the failed write was stored; the log is writable again once space
    is freed or the limit raised.
    """


class ReadOnlyError(EventLogError):
    """The log's files cannot be written (read-only file system or permissions)."""
