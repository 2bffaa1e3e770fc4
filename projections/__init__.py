"""Projections of the event log: read models rebuilt from its events.

:class:`SQLiteProjection` materialises the log into a SQLite transcript (sessions,
message rows, the tombstoned rows for audit, and FTS5 search) that agent UIs and
plain ``sqlite3`` read directly.  See ``docs/projection.md``.
"""

from __future__ import annotations

from .errors import (
    InvalidQueryError,
    LogMismatchError,
    NotAProjectionError,
    ProjectionCorruptError,
    ProjectionError,
    RebuildNeeded,
    SchemaVersionError,
)
from .sqlite import SQLiteProjection

__all__ = [
    "InvalidQueryError",
    "LogMismatchError",
    "NotAProjectionError",
    "ProjectionCorruptError",
    "ProjectionError",
    "RebuildNeeded",
    "SQLiteProjection",
    "SchemaVersionError",
]
