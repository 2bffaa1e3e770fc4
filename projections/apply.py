"""Applying events to the projection's tables, inside the caller's SQLite transaction.

An :class:`Applier` lives for one transaction.  Appended rows are buffered and
written with ``executemany`` in large batches; every other event that reads or
changes existing rows (tombstones, forks, annotations, carried bodies) first
writes the buffer out, so it always sees the rows in their order.  Session rows
are kept in memory and written once at the end.

Nothing applied here reads a clock: every value comes from the events (their
``seq`` and ``time_ns`` included), which is why any split into transactions
gives the same tables as a rebuild.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any, Final, assert_never

from eventlog import codec
from eventlog import events as ev
from eventlog.store import Record

from .errors import ProjectionCorruptError
from .rows import DERIVED, add_counter, derive, from_json, to_json

ROW_COLUMNS: Final = (
    "session_id",
    "position",
    "seq",
    "idx",
    "node",
    "digest",
    "body_seq",
    "body_idx",
    "summary",
    "created_ns",
    *DERIVED,
)
INSERT_ROW: Final = f"INSERT INTO messages ({', '.join(ROW_COLUMNS)}) VALUES ({', '.join('?' * len(ROW_COLUMNS))})"

SESSION_COLUMNS: Final = (
    "id",
    "parent_id",
    "fork_position",
    "created_seq",
    "created_ns",
    "closed_seq",
    "closed_ns",
    "close_reason",
    "message_count",
    "head_node",
    "last_seq",
    "title",
    "model",
    "source",
    "metadata",
    "counters",
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "api_calls",
    "tool_calls",
    "cost_usd",
)
SAVE_SESSION: Final = (
    f"INSERT OR REPLACE INTO sessions ({', '.join(SESSION_COLUMNS)}) VALUES ({', '.join('?' * len(SESSION_COLUMNS))})"
)
# Where a session row (a list in SESSION_COLUMNS order) keeps each field.
PARENT, FORK_AT, CLOSED_SEQ, CLOSED_NS, CLOSE_REASON, COUNT, HEAD, LAST_SEQ, METADATA, COUNTERS = (
    SESSION_COLUMNS.index(name)
    for name in (
        "parent_id",
        "fork_position",
        "closed_seq",
        "closed_ns",
        "close_reason",
        "message_count",
        "head_node",
        "last_seq",
        "metadata",
        "counters",
    )
)
COUNTER_COLUMNS: Final = frozenset(SESSION_COLUMNS[16:])
"""Usage counters that also have a column of their own (every counter is in ``counters``)."""
FIELD_COLUMNS: Final = frozenset({"title", "model", "source"})
NEW_SESSION: Final[dict[str, Any]] = {
    "message_count": 0,
    "metadata": "{}",
    "counters": "{}",
    **{name: 0 for name in COUNTER_COLUMNS},
    "cost_usd": 0.0,
}
"""Column values of a session that no event has touched yet (the rest are NULL)."""

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

ROWS_PER_WRITE: Final = 5000
"""Appended rows are written with one ``executemany`` per this many rows."""


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


class Applier:
    """Applies records to the tables through ``db``, inside one open transaction.

    ``indexed_upto`` is the ``messages.id`` up to which the search index is current:
    rows above it are indexed later, in bulk, by :func:`index_pending`; rows at or
    below it are removed from the index when they are tombstoned or re-displayed.

    ``fresh``: the tables were empty when the transaction began (a rebuild), so a
    session not seen yet does not exist and is not looked up.  ``background``: bulks
    of rows are indexed on a helper thread while the next bulk is derived (see
    :class:`Connection`); :meth:`finish` waits for it, and a caller that fails
    before must :meth:`settle` before it rolls back.
    """

    def __init__(
        self, db: sqlite3.Connection, indexed_upto: int, *, fresh: bool = False, background: bool = False
    ) -> None:
        self.db = Connection(db)
        self.background = background
        self.indexed_upto = indexed_upto
        self.fresh = fresh
        self.rows: list[tuple[Any, ...]] = []
        self.sessions: dict[str, list[Any]] = {}
        self.touched: set[str] = set()
        self.messages = 0

    # -- public ----------------------------------------------------------------

    def apply(self, record: Record) -> None:
        event = record.event
        session = self._session(event.session, record)
        session[LAST_SEQ] = record.seq
        match event:
            case ev.MessagesAppended():
                self._append(record, event, session)
            case ev.MessagesTombstoned():
                self._tombstone(record, event, session)
            case ev.SessionOpened():
                self._open(record, event, session)
            case ev.SessionUpdated():
                self._update(event, session)
            case ev.SessionClosed():
                session[CLOSED_SEQ], session[CLOSED_NS], session[CLOSE_REASON] = (
                    record.seq,
                    record.time_ns,
                    event.reason,
                )
            case ev.MessageAnnotated():
                self._annotate(event)
            case _:
                assert_never(event)

    def finish(self) -> None:
        """Write buffered rows and the touched sessions; the connection is free when it returns."""
        self._write_rows()
        if self.touched:
            self.db.executemany(SAVE_SESSION, [self.sessions[sid] for sid in sorted(self.touched)])
            self.touched.clear()
        self.db.wait()

    def settle(self) -> None:
        """Wait for the helper thread without raising (before rolling back after an error)."""
        self.db.settle()

    # -- events ----------------------------------------------------------------

    def _append(self, record: Record, event: ev.MessagesAppended, session: list[Any]) -> None:
        sid, seq, now = event.session, record.seq, record.time_ns
        position = event.position
        count = len(event.bodies)
        if position != session[COUNT]:
            raise ProjectionCorruptError(
                f"event {seq}: appends at position {position} of {sid!r}, which has {session[COUNT]} live rows"
            )
        if count == 0:
            return
        carried = event.carried
        if carried:
            self._write_rows()  # carried bodies are looked up in the table
        overrides = event.overrides
        summaries = event.summaries
        digests, nodes = event.digests, event.nodes
        decode = codec.decode
        rows = self.rows
        for i, body in enumerate(event.bodies):
            where = carried.get(i) if carried else None
            if where is None:
                message = decode(body)
                body_seq, body_idx = seq, i
            else:
                body_seq, body_idx = where
                message = self._stored_message(seq, body_seq, body_idx)
            o = 32 * i
            rows.append(
                (
                    sid,
                    position + i,
                    seq,
                    i,
                    nodes[o : o + 32],
                    digests[o : o + 32],
                    body_seq,
                    body_idx,
                    1 if i < summaries else 0,
                    now,
                    *derive(message, overrides.get(i)),
                )
            )
        self.messages += count
        # New messages reopen a closed session, as in the log.
        session[CLOSED_SEQ] = session[CLOSED_NS] = session[CLOSE_REASON] = None
        session[COUNT] = position + count
        session[HEAD] = nodes[-32:]
        if len(rows) >= ROWS_PER_WRITE:
            self._write_rows(index=True)

    def _tombstone(self, record: Record, event: ev.MessagesTombstoned, session: list[Any]) -> None:
        self._write_rows()
        sid, position = event.session, event.position
        found = self.db.execute(
            "SELECT node FROM messages WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ? "
            "ORDER BY position",
            (sid, position),
        ).fetchall()
        if b"".join(row[0] for row in found) != event.nodes or position + len(found) != session[COUNT]:
            raise ProjectionCorruptError(
                f"event {record.seq}: the live rows of {sid!r} from position {position} are not the tombstoned ones"
            )
        # A live row at position p came after the live rows before it, so its id is > p:
        # when position >= indexed_upto no row of the suffix is in the index yet.
        if position < self.indexed_upto:
            self.db.execute(UNINDEX_SUFFIX, (sid, position, self.indexed_upto))
        self.db.execute(
            "UPDATE messages SET tombstone_seq = ?, tombstone_reason = ?, tombstoned_ns = ? "
            "WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ?",
            (record.seq, event.reason, record.time_ns, sid, position),
        )
        session[COUNT] = position
        session[HEAD] = self._node_at(sid, position - 1) if position else None

    def _open(self, record: Record, event: ev.SessionOpened, session: list[Any]) -> None:
        if event.source is None:
            return
        self._write_rows()
        source = self._session(event.source, record)
        at = event.at
        session[PARENT], session[FORK_AT] = event.source, at
        if at == 0:
            return
        if at > source[COUNT] or self._node_at(event.source, at - 1) != event.source_head:
            raise ProjectionCorruptError(
                f"event {record.seq}: {event.source!r} has no live message {at - 1} with the fork's head"
            )
        self.db.execute(FORK_ROWS, (event.session, record.seq, record.time_ns, event.source, at))
        self.messages += at
        session[COUNT] = at
        session[HEAD] = event.source_head

    def _update(self, event: ev.SessionUpdated, session: list[Any]) -> None:
        if event.fields:
            metadata = from_json(session[METADATA])
            metadata.update(event.fields)
            session[METADATA] = to_json(metadata)
            for key in FIELD_COLUMNS.intersection(event.fields):
                value = event.fields[key]
                session[SESSION_COLUMNS.index(key)] = value if value is None or type(value) is str else to_json(value)
        if event.counters:
            counters = from_json(session[COUNTERS])
            for key, value in event.counters.items():
                counters[key] = add_counter(counters.get(key), value)
                if key in COUNTER_COLUMNS:
                    session[SESSION_COLUMNS.index(key)] = counters[key]
            session[COUNTERS] = to_json(counters)

    def _annotate(self, event: ev.MessageAnnotated) -> None:
        self._write_rows()
        found = self.db.execute(
            "SELECT id, node, message, content, tool_text FROM messages "
            "WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (event.session, event.position),
        ).fetchone()
        if found is None or found[1] != event.node:
            raise ProjectionCorruptError(
                f"annotation of {event.session!r} position {event.position}: no live row with that node"
            )
        row_id, _, message, content, tool_text = found
        indexed = row_id <= self.indexed_upto
        if indexed:
            self.db.execute(
                "INSERT INTO messages_fts (messages_fts, rowid, content, tool_text) VALUES ('delete', ?, ?, ?)",
                (row_id, content, tool_text),
            )
        derived = derive(from_json(message), event.override)
        self.db.execute(UPDATE_DERIVED, (*derived, row_id))
        if indexed:
            self.db.execute(
                "INSERT INTO messages_fts (rowid, content, tool_text) VALUES (?, ?, ?)",
                (row_id, derived[DERIVED.index("content")], derived[DERIVED.index("tool_text")]),
            )

    # -- helpers ---------------------------------------------------------------

    def _session(self, sid: str, record: Record) -> list[Any]:
        session = self.sessions.get(sid)
        if session is None:
            found = None
            if not self.fresh:
                found = self.db.execute(
                    f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions WHERE id = ?", (sid,)
                ).fetchone()
            if found is not None:
                session = list(found)
            else:
                # The first event of a session opens it; be lenient if it is anything else.
                fields = {
                    **NEW_SESSION,
                    "id": sid,
                    "created_seq": record.seq,
                    "created_ns": record.time_ns,
                    "last_seq": record.seq,
                }
                session = [fields.get(name) for name in SESSION_COLUMNS]
            self.sessions[sid] = session
        self.touched.add(sid)
        return session

    def _node_at(self, sid: str, position: int) -> bytes | None:
        found = self.db.execute(
            "SELECT node FROM messages WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (sid, position),
        ).fetchone()
        return None if found is None else found[0]

    def _stored_message(self, seq: int, body_seq: int, body_idx: int) -> dict[str, Any]:
        found = self.db.execute(
            "SELECT message FROM messages WHERE seq = ? AND idx = ?", (body_seq, body_idx)
        ).fetchone()
        if found is None:
            raise ProjectionCorruptError(f"event {seq}: carried body ({body_seq}, {body_idx}) is not in the projection")
        message: dict[str, Any] = from_json(found[0])
        return message

    def _write_rows(self, *, index: bool = False) -> None:
        """Write the buffered rows; with ``index``, also add them to the search index.

        A bulk of rows is indexed right after it is written, while its pages are in
        the cache (FTS5 buffers terms in memory).
        """
        if not self.rows:
            return
        self.db.executemany(INSERT_ROW, self.rows)
        self.rows.clear()
        if index:
            self.indexed_upto = index_pending(self.db, self.indexed_upto, self.db.later if self.background else None)


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
