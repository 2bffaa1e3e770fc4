"""The SQLite target's row store: the SQL behind :class:`projections.core.Store`.

Rows go in with ``executemany``, one statement per shape of row (:func:`insert_rows`);
the FTS5 index (an external-content index over the live rows) is kept current here:
rows above ``indexed_upto`` wait to be indexed in bulk by :func:`index_pending`, rows
at or below it leave the index when they are tombstoned or re-displayed.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from operator import is_, itemgetter
from typing import Any, Final

from .core import ROW_COLUMNS, SESSION_COLUMNS
from .rows import DERIVED

try:
    from . import _rows
except ImportError:  # built without a C compiler: group_rows_python gives the same answers
    _rows = None  # type: ignore[assignment, unused-ignore]
if os.environ.get("EVENTLOG_PURE_PYTHON"):
    _rows = None  # type: ignore[assignment, unused-ignore]

INSERT_ROW: Final = f"INSERT INTO messages ({', '.join(ROW_COLUMNS)}) VALUES ({', '.join('?' * len(ROW_COLUMNS))})"
NODE, DIGEST = ROW_COLUMNS.index("node"), ROW_COLUMNS.index("digest")
SAVE_SESSION: Final = (
    f"INSERT OR REPLACE INTO sessions ({', '.join(SESSION_COLUMNS)}) VALUES ({', '.join('?' * len(SESSION_COLUMNS))})"
)
LOAD_SESSION: Final = f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions WHERE id = ?"

# Moving copies of a session's live rows into a fork: same digests, bodies and display.
_COPIED = [c for c in ROW_COLUMNS if c not in ("session_id", "seq", "idx", "created_ns")]
FORK_ROWS: Final = (
    f"INSERT INTO messages (session_id, seq, idx, created_ns, {', '.join(_COPIED)}) "
    f"SELECT ?, ?, position, ?, {', '.join(_COPIED)} FROM messages "
    "WHERE session_id = ? AND tombstone_seq IS NULL AND position < ? ORDER BY position"
)
UNINDEX_SUFFIX: Final = (
    "INSERT INTO messages_fts (messages_fts, rowid, content, tool_text) "
    "SELECT 'delete', id, content, tool_text FROM messages "
    "WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ? AND id <= ?"
)
INDEX_PENDING: Final = (
    "INSERT INTO messages_fts (rowid, content, tool_text) "
    "SELECT id, content, tool_text FROM messages WHERE id > ? AND tombstone_seq IS NULL ORDER BY id"
)
PENDING_TEXT: Final = (
    "SELECT id, content, tool_text FROM messages WHERE id > ? AND tombstone_seq IS NULL ORDER BY id LIMIT ?"
)
INDEX_ROW: Final = "INSERT INTO messages_fts (rowid, content, tool_text) VALUES (?, ?, ?)"
INDEX_CHUNK: Final = 5000
"""Rows read for the search index at a time, in the caller's thread (see :func:`index_pending`)."""
UPDATE_DERIVED: Final = f"UPDATE messages SET {', '.join(f'{c} = ?' for c in DERIVED)} WHERE id = ?"
REDACT_ROW: Final = f"UPDATE messages SET {', '.join(f'{c} = ?' for c in DERIVED)}, redacted_seq = ? WHERE id = ?"
CONTENT, TOOL_TEXT = DERIVED.index("content"), DERIVED.index("tool_text")


class Connection:
    """The applier's connection: statements run one at a time, in order, and
    :meth:`later` runs one on a helper thread while the caller goes on.

    A rebuild indexes one bulk of rows for search (a single long statement, run by
    SQLite without the GIL) while it derives the next bulk in Python; every other
    statement first waits for the helper, and so does :meth:`settle`.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        self._helper: threading.Thread | None = None
        self._error: BaseException | None = None

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.wait()
        return self.db.execute(sql, params)

    def executemany(self, sql: str, rows: Any) -> sqlite3.Cursor:
        self.wait()
        return self.db.executemany(sql, rows)

    def later(self, sql: str, params: Any = ()) -> None:
        self.wait()

        def run() -> None:
            try:
                self.db.execute(sql, params)
            except BaseException as e:  # handed to the caller by wait()
                self._error = e

        self._helper = threading.Thread(target=run, name="projection-index", daemon=True)
        self._helper.start()

    def wait(self) -> None:
        """Wait for the helper's statement; raise its error, if any."""
        if self._helper is not None:
            self._helper.join()
            self._helper = None
        error, self._error = self._error, None
        if error is not None:
            raise error

    def settle(self) -> None:
        """Wait for the helper, keeping quiet about its error (the caller is failing already).

        An interrupt while waiting is raised once the helper is done (its statement ends
        within a bulk's time): the connection must be free before the caller rolls back.
        """
        interrupted: BaseException | None = None
        while self._helper is not None:
            try:
                self._helper.join()
            except BaseException as e:
                interrupted = e
            else:
                self._helper = None
        self._error = None
        if interrupted is not None:
            raise interrupted


_plans: dict[int, str] = {}
PLANS: Final = 256
"""Row shapes whose statements are kept (a transcript has a handful)."""
BLOBS: Final = 1 << NODE | 1 << DIGEST
"""The columns bound as ``bytearray``: see :func:`insert_rows`."""
_IDENTITY: Final = (1 << DIGEST + 1) - 1


def _plan(nulls: int) -> str:
    """The statement for rows whose ``NULL`` columns are the bits of ``nulls``."""
    if nulls & _IDENTITY:
        missing = [c for i, c in enumerate(ROW_COLUMNS[: DIGEST + 1]) if nulls >> i & 1]
        raise ValueError(f"a row leaves a column of its identity NULL: {missing}")
    filled = [c for i, c in enumerate(ROW_COLUMNS) if not nulls >> i & 1]
    if len(_plans) >= PLANS:
        _plans.clear()
    sql = _plans[nulls] = f"INSERT INTO messages (id, {', '.join(filled)}) VALUES (?{', ?' * len(filled)})"
    return sql


def insert_rows(db: Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (in :data:`~projections.core.ROW_COLUMNS` order) with the ids an insertion
    in order gives them, one statement per shape (which columns are ``NULL``).

    The sqlite3 module binds ``None`` and ``bytes`` through its adapter lookup, several times
    the cost of a ``str`` or an ``int``, and a row leaves most of its columns ``NULL``: each
    row is bound with the columns it fills alone (the others take their default, ``NULL``),
    and its digests as ``bytearray`` (stored as the same BLOB).  :func:`group_rows` shapes them.
    """
    top = db.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()[0]
    groups = group_rows(rows, top + 1, len(ROW_COLUMNS), BLOBS)
    statements = [(_plans.get(nulls) or _plan(nulls), group) for nulls, group in groups.items()]
    for sql, group in statements:  # every row's shape checked before the first is inserted
        db.executemany(sql, group)


def group_rows(rows: list[tuple[Any, ...]], first_id: int, width: int, blobs: int) -> dict[int, list[tuple[Any, ...]]]:
    """``rows`` grouped by shape, for one ``executemany`` a shape.

    Row ``i`` (a tuple of ``width`` values) gets the id ``first_id + i``.  Its group's key has
    bit ``j`` set when its column ``j`` is ``None``; its entry is its id followed by the columns
    that are not ``None``, in order, those whose bit is set in ``blobs`` as a ``bytearray``.
    Groups come in the order of their first rows.  One loop in C when the extension
    ``projections._rows`` is built (and ``EVENTLOG_PURE_PYTHON`` is not set), else
    :func:`group_rows_python`, which gives the same answers.
    """
    if _rows is not None:
        return _rows.group_rows(rows, first_id, width, blobs)
    return group_rows_python(rows, first_id, width, blobs)


_Shape = tuple[int, Callable[[tuple[Any, ...]], Any], tuple[int, ...]]
_shapes: dict[tuple[tuple[bool, ...], int], _Shape] = {}


def _shape(nulls: tuple[bool, ...], blobs: int) -> _Shape:
    """A shape's key, the picker of its values and where its blobs are among them."""
    filled = [j for j, null in enumerate(nulls) if not null]
    pick: Callable[[tuple[Any, ...]], Any]
    if len(filled) > 1:
        pick = itemgetter(*filled)
    else:  # itemgetter of one index gives the value itself, of none is an error
        pick = lambda row: tuple(row[j] for j in filled)  # noqa: E731
    at = tuple(k for k, j in enumerate(filled) if blobs >> j & 1)
    if len(_shapes) >= PLANS:
        _shapes.clear()
    shape = _shapes[nulls, blobs] = sum(1 << j for j, null in enumerate(nulls) if null), pick, at
    return shape


def group_rows_python(
    rows: list[tuple[Any, ...]], first_id: int, width: int, blobs: int
) -> dict[int, list[tuple[Any, ...]]]:
    """:func:`group_rows` in Python."""
    nones = (None,) * width
    groups: dict[int, list[tuple[Any, ...]]] = {}
    for i, row in enumerate(rows):
        if type(row) is not tuple or len(row) != width:
            raise ValueError(f"group_rows: row {i} is not a tuple of {width} values")
        nulls = tuple(map(is_, row, nones))
        mask, pick, at = _shapes.get((nulls, blobs)) or _shape(nulls, blobs)
        values = pick(row)
        if at:
            values = list(values)
            for k in at:
                values[k] = bytearray(values[k])
        group = groups.get(mask)
        if group is None:
            group = groups[mask] = []
        group.append((first_id + i, *values))
    return groups


class SQLiteStore:
    """A :class:`projections.core.Store` over one SQLite connection, inside its open transaction.

    ``indexed_upto`` is the ``messages.id`` up to which the search index is current.
    ``background``: bulks of rows are indexed on a helper thread while the next bulk
    is derived (see :class:`Connection`); :meth:`finish` waits for it, and a caller
    that fails before must :meth:`settle` before it rolls back.
    """

    def __init__(self, db: sqlite3.Connection, indexed_upto: int, *, background: bool = False) -> None:
        self.db = Connection(db)
        self.background = background
        self.indexed_upto = indexed_upto

    def finish(self) -> None:
        """Wait for the helper thread; the connection is free when it returns."""
        self.db.wait()

    def settle(self) -> None:
        """Wait for the helper thread without raising (before rolling back after an error)."""
        self.db.settle()

    def session(self, session_id: str) -> list[Any] | None:
        found = self.db.execute(LOAD_SESSION, (session_id,)).fetchone()
        return None if found is None else list(found)

    def write_rows(self, rows: list[tuple[Any, ...]], *, bulk: bool) -> None:
        # A bulk of rows is indexed right after it is written, while its pages are in
        # the cache (FTS5 buffers terms in memory).
        insert_rows(self.db, rows)
        if bulk:
            self.indexed_upto = index_pending(self.db, self.indexed_upto, self.db.later if self.background else None)

    def live_nodes(self, session_id: str, position: int) -> list[bytes]:
        found = self.db.execute(
            "SELECT node FROM messages WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ? "
            "ORDER BY position",
            (session_id, position),
        ).fetchall()
        return [row[0] for row in found]

    def node_at(self, session_id: str, position: int) -> bytes | None:
        found = self.db.execute(
            "SELECT node FROM messages WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (session_id, position),
        ).fetchone()
        return None if found is None else found[0]

    def tombstone(self, session_id: str, position: int, seq: int, reason: str, time_ns: int) -> None:
        # A live row at position p came after the live rows before it, so its id is > p:
        # when position >= indexed_upto no row of the suffix is in the index yet.
        if position < self.indexed_upto:
            self.db.execute(UNINDEX_SUFFIX, (session_id, position, self.indexed_upto))
        self.db.execute(
            "UPDATE messages SET tombstone_seq = ?, tombstone_reason = ?, tombstoned_ns = ? "
            "WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ?",
            (seq, reason, time_ns, session_id, position),
        )

    def copy_fork(self, session_id: str, seq: int, time_ns: int, source: str, at: int) -> None:
        self.db.execute(FORK_ROWS, (session_id, seq, time_ns, source, at))

    def live_message(self, session_id: str, position: int) -> tuple[bytes, str] | None:
        found = self.db.execute(
            "SELECT node, message FROM messages WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (session_id, position),
        ).fetchone()
        return None if found is None else (found[0], found[1])

    def redisplay(self, session_id: str, position: int, derived: tuple[Any, ...]) -> None:
        row_id, content, tool_text = self.db.execute(
            "SELECT id, content, tool_text FROM messages WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (session_id, position),
        ).fetchone()
        indexed = row_id <= self.indexed_upto
        if indexed:
            self.db.execute(
                "INSERT INTO messages_fts (messages_fts, rowid, content, tool_text) VALUES ('delete', ?, ?, ?)",
                (row_id, content, tool_text),
            )
        self.db.execute(UPDATE_DERIVED, (*derived, row_id))
        if indexed:
            self.db.execute(INDEX_ROW, (row_id, derived[CONTENT], derived[TOOL_TEXT]))

    def stored_message(self, seq: int, idx: int) -> tuple[str, bytes, int | None] | None:
        found = self.db.execute(
            "SELECT message, digest, redacted_seq FROM messages WHERE seq = ? AND idx = ?", (seq, idx)
        ).fetchone()
        return None if found is None else (found[0], found[1], found[2])

    def redact(self, body_seq: int, body_idx: int, seq: int, derived: tuple[Any, ...]) -> None:
        found = self.db.execute(
            "SELECT id, content, tool_text, tombstone_seq FROM messages WHERE body_seq = ? AND body_idx = ?",
            (body_seq, body_idx),
        ).fetchall()
        for row_id, content, tool_text, tombstone_seq in found:
            indexed = tombstone_seq is None and row_id <= self.indexed_upto
            if indexed:
                self.db.execute(
                    "INSERT INTO messages_fts (messages_fts, rowid, content, tool_text) VALUES ('delete', ?, ?, ?)",
                    (row_id, content, tool_text),
                )
            self.db.execute(REDACT_ROW, (*derived, seq, row_id))
            if indexed:
                self.db.execute(INDEX_ROW, (row_id, derived[CONTENT], derived[TOOL_TEXT]))

    def save_sessions(self, sessions: list[list[Any]]) -> None:
        self.db.executemany(SAVE_SESSION, sessions)


def index_pending(
    db: sqlite3.Connection | Connection, indexed_upto: int, run: Callable[[str, Any], object] | None = None
) -> int:
    """Add the live rows above ``indexed_upto`` to the search index; return the new mark.

    Runs inside the caller's transaction, which also records the returned mark.  Given
    ``run`` (a helper thread's executor), the rows are indexed by one ``INSERT ... SELECT``
    that SQLite runs without the GIL, beside the caller's Python.  Without it they are read
    in chunks and handed to FTS5 one ``INSERT ... VALUES`` each: measured twice as fast for
    a turn's ten rows as the single statement, and a quarter faster for a bulk, but it binds
    each row under the GIL.
    """
    top = db.execute("SELECT max(id) FROM messages").fetchone()[0] or 0
    if run is not None:
        if top > indexed_upto:
            run(INDEX_PENDING, (indexed_upto,))
        return max(top, indexed_upto)
    after = indexed_upto
    while after < top:
        rows = db.execute(PENDING_TEXT, (after, INDEX_CHUNK)).fetchall()
        db.executemany(INDEX_ROW, rows)
        if len(rows) < INDEX_CHUNK:
            break
        after = rows[-1][0]
    return max(top, indexed_upto)
