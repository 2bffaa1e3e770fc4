"""The exceptions of the projections, children of :class:`eventlog.errors.EventLogError`."""

from __future__ import annotations

from eventlog.errors import EventLogError


class ProjectionError(EventLogError):
    """Root of the errors raised by a projection (``sqlite3.Error`` is translated to it)."""


class LogMismatchError(ProjectionError):
    """The projection was built from another log (a different log id).

    Open a fresh database file for this log, or call ``rebuild(log)`` to replace
    the projection with one of this log on purpose.
    """


class NotAProjectionError(ProjectionError):
    """The file is not a transcript projection: not a SQLite database at all, or another
    program's database.  It is left as it is; give the projection a file of its own.

    ``path`` is the file, ``what`` says what it is instead.
    """

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}; give the projection a file of its own")
        self.path = path
        self.what = what


class SchemaVersionError(ProjectionError):
    """The database was written by a newer version of the projection than this one."""


class ProjectionCorruptError(ProjectionError):
    """The projection's tables disagree with the events being applied.

    The log is the source of truth: ``rebuild(log)`` re-projects it from scratch.
    """


class RebuildNeeded(ProjectionError):
    """The projection applied events that a redaction has since rewritten: it holds erased content.

    ``catch_up`` of every target handles it by rebuilding (into a fresh file for SQLite and
    hermes); it reaches the caller only from a target that does not.
    """


class InvalidQueryError(ProjectionError, ValueError):
    """A full-text query is not valid FTS5 syntax."""
