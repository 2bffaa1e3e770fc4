"""The hermes target: :class:`HermesProjection` writes hermes' own ``state.db``.

hermes-agent 0.19 reads its sessions from a SQLite file of schema version 22
(``sessions``, ``messages`` with ``active``/``compacted``, the ``messages_fts`` and
``messages_fts_trigram`` indexes kept by triggers).  This target creates that file with
the installed hermes package itself (``hermes_state.SessionDB``), then projects the log
into it, so hermes' CLI, dashboard and ``SessionDB`` readers show the log's transcripts:
a tombstone by rewind, edit or clear becomes ``active = 0``, a compaction
``active = 0, compacted = 1``; a display override becomes hermes' ``content`` with the
wire content in ``api_content``, as hermes itself stores them.

Beside hermes' tables the file holds the projection's own (``eventlog_checkpoint``,
``eventlog_rows``: each message row's place in the log, ``eventlog_sessions``).  The
projection owns the file: hermes itself must not write to it (a hermes session writing
there would be overwritten or break the next catch-up; ``rebuild`` repairs it).

Needs the ``hermes`` extra (``pip install 'agent-eventlog[hermes]'``).
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from eventlog import events as ev

from . import core, replace
from .core import COUNT, HEAD, ROW_COLUMNS, SESSION_COLUMNS, Applier, Checkpoint, Source
from .errors import InvalidQueryError, NotAProjectionError, ProjectionError, RebuildNeeded, SchemaVersionError
from .rows import DERIVED, OVERRIDABLE, from_json
from .sqlite import REPLACE_TRIES, TRUNCATE_WAIT

if TYPE_CHECKING:
    from eventlog.store import Record

HERMES_SCHEMA: Final = 22
"""The ``state.db`` schema version this target writes (hermes-agent 0.19)."""

BUSY_TIMEOUT: Final = 60

logger = logging.getLogger("eventlog")

OWN_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS eventlog_checkpoint (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    log_id    TEXT,
    last_seq  INTEGER NOT NULL DEFAULT 0,
    last_hash BLOB
);
INSERT OR IGNORE INTO eventlog_checkpoint (id) VALUES (1);
CREATE TABLE IF NOT EXISTS eventlog_rows (
    message_id       INTEGER PRIMARY KEY,  -- messages.id
    session_id       TEXT NOT NULL,
    position         INTEGER NOT NULL,
    seq              INTEGER NOT NULL,
    idx              INTEGER NOT NULL,
    node             BLOB NOT NULL,
    digest           BLOB NOT NULL,
    body_seq         INTEGER NOT NULL,
    body_idx         INTEGER NOT NULL,
    summary          INTEGER NOT NULL,
    created_ns       INTEGER NOT NULL,
    message          TEXT NOT NULL,        -- the wire message (JSON)
    display_override TEXT,
    tombstone_seq    INTEGER,
    tombstone_reason TEXT,
    redacted_seq     INTEGER,              -- the MessageRedacted event that erased the body
    UNIQUE (seq, idx)
);
CREATE UNIQUE INDEX IF NOT EXISTS eventlog_rows_live ON eventlog_rows (session_id, position) WHERE tombstone_seq IS NULL;
CREATE INDEX IF NOT EXISTS eventlog_rows_body ON eventlog_rows (body_seq, body_idx);
CREATE TABLE IF NOT EXISTS eventlog_sessions (
    id     TEXT PRIMARY KEY,
    fields TEXT NOT NULL,  -- the projection's session row (JSON list)
    title  TEXT            -- the title the log gives (hermes' titles are unique)
);
CREATE INDEX IF NOT EXISTS eventlog_sessions_title ON eventlog_sessions (title);
"""

MESSAGE_COLUMNS: Final = (
    "role",
    "content",
    "tool_call_id",
    "tool_calls",
    "tool_name",
    "effect_disposition",
    "timestamp",
    "token_count",
    "finish_reason",
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "codex_reasoning_items",
    "codex_message_items",
    "platform_message_id",
    "observed",
    "api_content",
)
"""The hermes ``messages`` columns a row is written with (besides ``id``, ``session_id``, ``active``)."""

_MANAGED_SESSION: Final = frozenset(
    {
        "id",
        "source",
        "model",
        "title",
        "parent_session_id",
        "started_at",
        "ended_at",
        "end_reason",
        "message_count",
        "tool_call_count",
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
        "api_call_count",
        "estimated_cost_usd",
    }
)
_ROW = {name: i for i, name in enumerate(ROW_COLUMNS)}
_MESSAGE, _OVERRIDE, _API, _REDACTED = (_ROW[c] for c in ("message", "display_override", "api_content", "redacted_seq"))
_API_DERIVED = DERIVED.index("api_content")
_S = {name: i for i, name in enumerate(SESSION_COLUMNS)}


def _hermes_state() -> Any:
    try:
        import hermes_state  # type: ignore[import-untyped]
    except ImportError as e:
        raise ProjectionError(
            "the hermes projection needs hermes-agent 0.19: pip install 'agent-eventlog[hermes]'"
        ) from e
    if hermes_state.SCHEMA_VERSION != HERMES_SCHEMA:
        raise SchemaVersionError(
            f"the installed hermes-agent writes state.db schema {hermes_state.SCHEMA_VERSION}; "
            f"this projection writes schema {HERMES_SCHEMA} (hermes-agent 0.19)"
        )
    return hermes_state


def _dumps(value: Any) -> str | None:
    return json.dumps(value) if value else None


def message_columns(
    message: dict[str, Any], override: dict[str, Any] | None, api_content: Any, time_ns: int
) -> tuple[Any, ...]:
    """The :data:`MESSAGE_COLUMNS` of a hermes row for ``message`` shown with ``override``.

    As hermes' own ``append_message`` writes them: structured content and tool calls as
    JSON, the timestamp in seconds (the event's time when the message has none), the
    displayed content in ``content`` and the wire content in ``api_content`` when an
    override replaced it.
    """
    encode = _hermes_state().SessionDB._encode_content
    view = message
    content = message.get("content")
    if override:
        view = dict(message)
        for key, value in override.items():
            if key in OVERRIDABLE and key != "content":
                view[key] = value
        if "content" in override:
            replacement = override["content"]
            if type(content) is not list or type(replacement) is list:
                content = replacement
    role = view.get("role")
    if role is None:
        role = view.get("type") if type(view.get("type")) is str else "unknown"
    if content is None and "content" not in message and "output" in message:
        content = message["output"]
    tool_name = view.get("tool_name")
    if tool_name is None and role in ("tool", "function") and type(view.get("name")) is str:
        tool_name = view["name"]
    stamp = view.get("timestamp")
    try:
        timestamp = float(stamp) if stamp is not None and type(stamp) is not bool else time_ns / 1e9
    except (TypeError, ValueError):
        timestamp = time_ns / 1e9
    tokens = view.get("token_count")
    platform_id = view.get("platform_message_id", view.get("message_id"))
    return (
        str(role),
        encode(content),
        _text(view.get("tool_call_id", view.get("call_id"))),
        _dumps(view.get("tool_calls")),
        _text(tool_name),
        _text(view.get("effect_disposition")),
        timestamp,
        tokens if type(tokens) is int else None,
        _text(view.get("finish_reason")),
        _text(view.get("reasoning")),
        _text(view.get("reasoning_content")),
        _dumps(view.get("reasoning_details")),
        _dumps(view.get("codex_reasoning_items")),
        _dumps(view.get("codex_message_items")),
        None if platform_id is None else str(platform_id),
        1 if view.get("observed") else 0,
        api_content if api_content is None or type(api_content) is str else json.dumps(api_content),
    )


def _text(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    return json.dumps(value)


class HermesProjection:
    """hermes' ``state.db`` (schema version 22) as a projection of one event log.

    ``HermesProjection(path)`` creates the file with hermes' own schema when it does not
    exist, or opens one this target created.  Reads mirror :class:`~projections.SQLiteProjection`:
    :meth:`messages`, :meth:`history`, :meth:`sessions`, :meth:`search`.

    Raises :class:`~projections.errors.SchemaVersionError` when the file's hermes schema
    is not version 22 (a newer hermes migrated it), :class:`~projections.errors.ProjectionError`
    when the file is hermes' own ``state.db`` or another application's.
    """

    def __init__(self, path: str | os.PathLike[str], *, batch: int = 20_000) -> None:
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.path = os.fspath(path)
        self.batch = batch
        self._lock = threading.RLock()
        self._wait: Callable[[float | None], bool] | None = None
        self._erase_pending = False  # the WAL of a replaced file is still to be truncated
        hermes_state = _hermes_state()
        wal_left = replace.wal_left(self.path)
        try:
            existed = Path(self.path).exists() and Path(self.path).stat().st_size > 0
            if existed:
                self._check_existing()
            else:
                hermes_state.SessionDB(db_path=Path(self.path)).close()
            self._db: sqlite3.Connection | None = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT
            )
        except sqlite3.Error as e:
            raise ProjectionError(f"{self.path}: cannot open the hermes projection ({e})") from e
        try:
            with self._translate():
                self._check_hermes_version()
                if not existed or not self._owned():
                    with self._write():
                        for statement in OWN_SCHEMA.split(";\n"):
                            if statement.strip():
                                self._db.execute(statement)
                self._add_redacted_column()
                self._session_columns = {
                    row[1]: (row[3], row[4]) for row in self._db.execute("PRAGMA table_info(sessions)")
                }
                if wal_left:  # what a stopped replacement may have left in the file: checkpoint it (once)
                    replace.truncate_wal(self._db, wait=0, busy_timeout=BUSY_TIMEOUT)
        except BaseException:
            self._db.close()
            raise

    def _check_existing(self) -> None:
        db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as e:
            raise NotAProjectionError(self.path, f"not a SQLite database ({e})") from e
        finally:
            db.close()
        if tables and "eventlog_checkpoint" not in tables:
            what = (
                "hermes' own state.db"
                if "schema_version" in tables and "sessions" in tables
                else "another application's database"
            )
            raise NotAProjectionError(self.path, f"{what}, not a projection of an event log")

    def _check_hermes_version(self) -> None:
        assert self._db is not None
        row = self._db.execute("SELECT max(version) FROM schema_version").fetchone()
        version = None if row is None else row[0]
        if version != HERMES_SCHEMA:
            raise SchemaVersionError(
                f"{self.path}: hermes state.db schema version {version}; this projection writes version "
                f"{HERMES_SCHEMA} (hermes-agent 0.19) and refuses another"
            )

    def _add_redacted_column(self) -> None:
        """A file written before redactions existed gains ``eventlog_rows.redacted_seq`` and its index."""
        db = self._db_open()
        if not any(row[1] == "redacted_seq" for row in db.execute("PRAGMA table_info(eventlog_rows)")):
            with self._write():
                if not any(row[1] == "redacted_seq" for row in db.execute("PRAGMA table_info(eventlog_rows)")):
                    db.execute("ALTER TABLE eventlog_rows ADD COLUMN redacted_seq INTEGER")
                    db.execute("CREATE INDEX IF NOT EXISTS eventlog_rows_body ON eventlog_rows (body_seq, body_idx)")

    def _owned(self) -> bool:
        assert self._db is not None
        return self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'eventlog_checkpoint'").fetchone() is not None

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        if self._wait is not None:
            self._wait(None)
        with self._lock:
            if self._db is not None:
                try:
                    if self._erase_pending:
                        with self._translate():
                            self._truncate_wal(wait=0)
                finally:
                    self._db.close()
                    self._db = None

    def __enter__(self) -> HermesProjection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HermesProjection({self.path!r})"

    def bind(self, wait: Callable[[float | None], bool]) -> None:
        """Called by :meth:`EventLog.open` when the log projects on a background thread."""
        self._wait = wait

    # -- writing ---------------------------------------------------------------

    def catch_up(self, log: Source) -> int:
        """Apply the log's events after the checkpoint; return how many were applied.

        Same contract as :meth:`SQLiteProjection.catch_up`: transactions of about
        ``batch`` messages under ``BEGIN IMMEDIATE``, each recording the checkpoint; after
        a redaction of a message the file already holds, a rebuild into a fresh file
        replaces its content.
        """
        with self._lock, self._translate():
            if self._erase_pending:
                self._truncate_wal(wait=0)
            try:
                return self._catch_up(log)
            except RebuildNeeded:
                return self._replace(log)

    def _catch_up(self, log: Source) -> int:
        checkpoint = self._checkpoint()
        core.check_source(self.path, checkpoint, log)
        if checkpoint.log_id is None:
            with self._write():  # the file belongs to this log from now on
                self._claim(log.id)
        applied = 0
        for chunk in core.chunks(log.events(after=checkpoint.last_seq), self.batch):
            with self._write():
                self._claim(log.id)
                store = HermesStore(self._db_open(), self._session_columns)
                applied += self._apply_chunk(Applier(store, log=log), self._checkpoint(), chunk)
        return applied

    def _claim(self, log_id: str) -> None:
        """Record ``log_id`` as the projected log, or refuse another one (inside the open transaction)."""
        owner = self._checkpoint().log_id
        if owner is None:
            self._db_open().execute("UPDATE eventlog_checkpoint SET log_id = ?", (log_id,))
        elif owner != log_id:
            raise core.mismatch(self.path, owner, log_id)

    def rebuild(self, log: Source) -> int:
        """Empty the file's sessions and messages and project ``log`` from its first event, in one transaction.

        When the log holds a redaction and the file held rows, the rebuild goes into a fresh
        file copied over this one instead (as :meth:`SQLiteProjection.rebuild`), so that
        neither the rows, hermes' search indexes, free pages nor the WAL keep the erased content.
        """
        with self._lock, self._translate():
            held = self._checkpoint().last_seq > 0
            try:
                with self._write():
                    return self._rebuild(log, refuse_redactions=held)
            except RebuildNeeded:
                pass
            return self._replace(log)

    def _rebuild(self, log: Source, *, refuse_redactions: bool = False) -> int:
        db = self._db_open()
        for table in ("eventlog_rows", "eventlog_sessions", "messages", "session_model_usage", "sessions"):
            db.execute(f"DELETE FROM {table}")
        db.execute("DELETE FROM sqlite_sequence WHERE name = 'messages'")
        db.execute("UPDATE eventlog_checkpoint SET log_id = ?, last_seq = 0, last_hash = NULL", (log.id,))
        applier = Applier(HermesStore(db, self._session_columns), fresh=True, log=log)
        checkpoint = Checkpoint(log.id)
        applied = 0
        for chunk in core.chunks(log.events(after=0), self.batch):
            if refuse_redactions and any(type(r.event) is ev.MessageRedacted for r in chunk):
                raise RebuildNeeded(f"{self.path}: the log holds a redaction")
            applied += self._apply_chunk(applier, checkpoint, chunk)
            checkpoint = self._checkpoint()
        return applied

    def _replace(self, log: Source) -> int:
        """Rebuild into a fresh ``state.db`` beside this one and copy it over this one (see
        :mod:`projections.replace`); return the events applied."""
        for attempt in range(REPLACE_TRIES):
            with replace.scratch(self.path) as where:
                fresh = HermesProjection(where, batch=self.batch)
                try:
                    try:
                        with fresh._translate(), fresh._write():
                            applied = fresh._rebuild(log)
                    except RebuildNeeded:
                        if attempt + 1 == REPLACE_TRIES:
                            raise
                        continue  # redacted again meanwhile
                    replace.copy_over(fresh._db_open(), self._db_open())
                finally:
                    fresh.close()
            self._truncate_wal(wait=TRUNCATE_WAIT)
            return applied
        raise AssertionError("unreachable")

    def _truncate_wal(self, *, wait: float) -> None:
        done = replace.truncate_wal(self._db_open(), wait=wait, busy_timeout=BUSY_TIMEOUT)
        if not done and not self._erase_pending:
            logger.warning(
                "%s: a reader holds a transaction open: the WAL keeps the replaced pages until it ends", self.path
            )
        self._erase_pending = not done

    # -- reading ---------------------------------------------------------------

    _ROW_SELECT: Final = (
        "SELECT m.*, r.position, r.seq, r.idx, r.node, r.digest, r.body_seq, r.body_idx, r.summary, "
        "r.created_ns, r.message, r.display_override, r.tombstone_seq, r.tombstone_reason, r.redacted_seq "
        "FROM eventlog_rows AS r JOIN messages AS m ON m.id = r.message_id "
    )

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The live rows of the session in transcript order: hermes' columns and the log's (``message``, ``node``, ``seq``...)."""
        return self._rows(
            self._ROW_SELECT + "WHERE r.session_id = ? AND r.tombstone_seq IS NULL ORDER BY r.position", (session_id,)
        )

    def history(self, session_id: str) -> list[dict[str, Any]]:
        """Every row the session ever had, tombstoned ones included (``active = 0``), in the order they were appended."""
        return self._rows(self._ROW_SELECT + "WHERE r.session_id = ? ORDER BY m.id", (session_id,))

    def sessions(self) -> list[dict[str, Any]]:
        """hermes' session rows, oldest first."""
        return self._rows("SELECT * FROM sessions ORDER BY started_at, id", ())

    def search(self, query: str, *, session_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Live rows matching an FTS5 ``query`` in hermes' ``messages_fts``, best first, with a ``snippet``."""
        if type(query) is not str:
            raise InvalidQueryError(f"search query must be a str, not {type(query).__name__}")
        statement = (
            "SELECT m.id, r.session_id, r.position, r.seq, m.role, m.content, "
            "snippet(messages_fts, 0, '**', '**', '…', 16) AS snippet, bm25(messages_fts) AS rank "
            "FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid "
            "JOIN eventlog_rows AS r ON r.message_id = m.id "
            "WHERE messages_fts MATCH ? AND m.active = 1"
        )
        params: list[Any] = [query]
        if session_id is not None:
            statement += " AND r.session_id = ?"
            params.append(session_id)
        statement += " ORDER BY rank, m.id LIMIT ?"
        params.append(limit)
        try:
            return self._rows(statement, params)
        except ProjectionError as e:
            cause = e.__cause__
            if isinstance(cause, sqlite3.OperationalError) and getattr(cause, "sqlite_errorcode", None) == 1:
                raise InvalidQueryError(f"search query {query!r}: {cause}") from cause
            raise

    @property
    def last_seq(self) -> int:
        self._caught_up()
        with self._lock, self._translate():
            return self._checkpoint().last_seq

    # -- internals -------------------------------------------------------------

    def _db_open(self) -> sqlite3.Connection:
        if self._db is None:
            raise ProjectionError(f"{self.path}: the projection is closed")
        return self._db

    def _apply_chunk(self, applier: Applier, checkpoint: Checkpoint, chunk: list[Record]) -> int:
        last = core.apply_chunk(self.path, applier, checkpoint, chunk, (sqlite3.Error,))
        if last is None:
            return 0
        self._db_open().execute(
            "UPDATE eventlog_checkpoint SET log_id = ?, last_seq = ?, last_hash = ?",
            (checkpoint.log_id, last.seq, last.hash),
        )
        return last.seq - checkpoint.last_seq

    def _checkpoint(self) -> Checkpoint:
        owner, last, last_hash = (
            self._db_open().execute("SELECT log_id, last_seq, last_hash FROM eventlog_checkpoint").fetchone()
        )
        return Checkpoint(owner, last, last_hash)

    def _caught_up(self) -> None:
        if self._wait is not None and not self._wait(None):
            raise ProjectionError(f"{self.path}: behind its log: catching up with the latest writes failed")

    def _rows(self, statement: str, params: Any) -> list[dict[str, Any]]:
        self._caught_up()
        with self._lock, self._translate():
            cursor = self._db_open().execute(statement, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    @contextmanager
    def _write(self) -> Iterator[None]:
        db = self._db_open()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def _translate(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as e:
            raise ProjectionError(f"{self.path}: {type(e).__name__}: {e}") from e


class HermesStore:
    """A :class:`projections.core.Store` over hermes' tables and the projection's own, in one transaction."""

    def __init__(self, db: sqlite3.Connection, session_columns: dict[str, tuple[int, Any]]) -> None:
        self.db = db
        self.session_columns = session_columns
        top = db.execute(
            "SELECT max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'messages'), 0), "
            "coalesce((SELECT max(id) FROM messages), 0))"
        ).fetchone()[0]
        self.next_id = int(top) + 1
        self._insert_message = (
            f"INSERT INTO messages (id, session_id, active, compacted, {', '.join(MESSAGE_COLUMNS)}) "
            f"VALUES ({', '.join('?' * (len(MESSAGE_COLUMNS) + 4))})"
        )
        self._insert_row = (
            "INSERT INTO eventlog_rows (message_id, session_id, position, seq, idx, node, digest, body_seq, "
            "body_idx, summary, created_ns, message, display_override, redacted_seq) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )

    def session(self, session_id: str) -> list[Any] | None:
        found = self.db.execute("SELECT fields FROM eventlog_sessions WHERE id = ?", (session_id,)).fetchone()
        if found is None:
            return None
        fields: list[Any] = json.loads(found[0])
        head = fields[HEAD]
        fields[HEAD] = None if head is None else bytes.fromhex(head)
        return fields

    def write_rows(self, rows: list[tuple[Any, ...]], *, bulk: bool) -> None:
        messages = []
        ours = []
        for row in rows:
            message_id = self.next_id
            self.next_id += 1
            message = from_json(row[_MESSAGE])
            override = None if row[_OVERRIDE] is None else from_json(row[_OVERRIDE])
            columns = message_columns(message, override, row[_API], row[_ROW["created_ns"]])
            messages.append((message_id, row[0], 1, 0, *columns))
            ours.append(
                (
                    message_id,
                    *row[:10],
                    row[_MESSAGE],
                    row[_OVERRIDE],
                    row[_REDACTED],
                )
            )
        self.db.executemany(self._insert_message, messages)
        self.db.executemany(self._insert_row, ours)

    def live_nodes(self, session_id: str, position: int) -> list[bytes]:
        found = self.db.execute(
            "SELECT node FROM eventlog_rows WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ? "
            "ORDER BY position",
            (session_id, position),
        ).fetchall()
        return [r[0] for r in found]

    def node_at(self, session_id: str, position: int) -> bytes | None:
        found = self.db.execute(
            "SELECT node FROM eventlog_rows WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (session_id, position),
        ).fetchone()
        return None if found is None else found[0]

    def tombstone(self, session_id: str, position: int, seq: int, reason: str, time_ns: int) -> None:
        self.db.execute(
            "UPDATE messages SET active = 0, compacted = ? WHERE id IN (SELECT message_id FROM eventlog_rows "
            "WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ?)",
            (1 if reason == "compaction" else 0, session_id, position),
        )
        self.db.execute(
            "UPDATE eventlog_rows SET tombstone_seq = ?, tombstone_reason = ? "
            "WHERE session_id = ? AND tombstone_seq IS NULL AND position >= ?",
            (seq, reason, session_id, position),
        )

    def copy_fork(self, session_id: str, seq: int, time_ns: int, source: str, at: int) -> None:
        found = self.db.execute(
            "SELECT message_id, position, node, digest, body_seq, body_idx, summary, message, display_override, "
            "redacted_seq FROM eventlog_rows WHERE session_id = ? AND tombstone_seq IS NULL AND position < ? "
            "ORDER BY position",
            (source, at),
        ).fetchall()
        columns = ", ".join(MESSAGE_COLUMNS)
        for message_id, position, node, digest, body_seq, body_idx, summary, message, override, redacted in found:
            new_id = self.next_id
            self.next_id += 1
            self.db.execute(
                f"INSERT INTO messages (id, session_id, active, compacted, {columns}) "
                f"SELECT ?, ?, 1, 0, {columns} FROM messages WHERE id = ?",
                (new_id, session_id, message_id),
            )
            self.db.execute(
                self._insert_row,
                (
                    new_id,
                    session_id,
                    position,
                    seq,
                    position,
                    node,
                    digest,
                    body_seq,
                    body_idx,
                    summary,
                    time_ns,
                    message,
                    override,
                    redacted,
                ),
            )

    def live_message(self, session_id: str, position: int) -> tuple[bytes, str] | None:
        found = self.db.execute(
            "SELECT node, message FROM eventlog_rows WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (session_id, position),
        ).fetchone()
        return None if found is None else (found[0], found[1])

    def redisplay(self, session_id: str, position: int, derived: tuple[Any, ...]) -> None:
        message_id, message, created_ns = self.db.execute(
            "SELECT message_id, message, created_ns FROM eventlog_rows "
            "WHERE session_id = ? AND position = ? AND tombstone_seq IS NULL",
            (session_id, position),
        ).fetchone()
        override_json = derived[DERIVED.index("display_override")]
        override = None if override_json is None else from_json(override_json)
        columns = message_columns(from_json(message), override, derived[_API_DERIVED], created_ns)
        self.db.execute(
            f"UPDATE messages SET {', '.join(f'{c} = ?' for c in MESSAGE_COLUMNS)} WHERE id = ?", (*columns, message_id)
        )
        self.db.execute(
            "UPDATE eventlog_rows SET display_override = ? WHERE message_id = ?", (override_json, message_id)
        )

    def stored_message(self, seq: int, idx: int) -> tuple[str, bytes, int | None] | None:
        found = self.db.execute(
            "SELECT message, digest, redacted_seq FROM eventlog_rows WHERE seq = ? AND idx = ?", (seq, idx)
        ).fetchone()
        return None if found is None else (found[0], found[1], found[2])

    def redact(self, body_seq: int, body_idx: int, seq: int, derived: tuple[Any, ...]) -> None:
        # hermes' own triggers re-index each updated row in both of its search tables.
        found = self.db.execute(
            "SELECT message_id, message, created_ns FROM eventlog_rows WHERE body_seq = ? AND body_idx = ?",
            (body_seq, body_idx),
        ).fetchall()
        assignments = ", ".join(f"{c} = ?" for c in MESSAGE_COLUMNS)
        for message_id, message, created_ns in found:
            columns = message_columns(from_json(message), None, None, created_ns)
            self.db.execute(f"UPDATE messages SET {assignments} WHERE id = ?", (*columns, message_id))
            self.db.execute(
                "UPDATE eventlog_rows SET display_override = NULL, redacted_seq = ? WHERE message_id = ?",
                (seq, message_id),
            )

    def save_sessions(self, sessions: list[list[Any]]) -> None:
        retitle: set[str] = set()
        for fields in sessions:
            sid = fields[_S["id"]]
            before = self.db.execute("SELECT title FROM eventlog_sessions WHERE id = ?", (sid,)).fetchone()
            if before is not None and before[0] is not None:
                retitle.add(before[0])
            title = fields[_S["title"]]
            if title is not None:
                retitle.add(title)
            stored = list(fields)
            stored[HEAD] = None if fields[HEAD] is None else fields[HEAD].hex()
            self.db.execute(
                "INSERT INTO eventlog_sessions (id, fields, title) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET fields = excluded.fields, title = excluded.title",
                (sid, json.dumps(stored), title),
            )
            self._save_hermes_session(fields)  # the title is set below, once the batch is saved
            if title is None:
                self.db.execute("UPDATE sessions SET title = NULL WHERE id = ?", (sid,))
        # hermes' titles are unique: a title two sessions share is told apart by the session id.
        for title in sorted(retitle):
            holders = [
                r[0] for r in self.db.execute("SELECT id FROM eventlog_sessions WHERE title = ? ORDER BY id", (title,))
            ]
            marks = ",".join("?" * len(holders))
            self.db.execute(f"UPDATE sessions SET title = NULL WHERE id IN ({marks})", holders)
            for sid in holders:
                self.db.execute(
                    "UPDATE sessions SET title = ? WHERE id = ?",
                    (title if len(holders) == 1 else f"{title} ({sid})", sid),
                )

    def _save_hermes_session(self, fields: list[Any]) -> None:
        metadata = from_json(fields[_S["metadata"]])
        counters = from_json(fields[_S["counters"]])
        source = metadata.get("source")
        closed_ns = fields[_S["closed_ns"]]
        cost = fields[_S["cost_usd"]]
        values: dict[str, Any] = {
            "id": fields[_S["id"]],
            "source": source if type(source) is str else "eventlog",
            "model": fields[_S["model"]],
            "parent_session_id": fields[_S["parent_id"]],
            "started_at": fields[_S["created_ns"]] / 1e9,
            "ended_at": None if closed_ns is None else closed_ns / 1e9,
            "end_reason": fields[_S["close_reason"]],
            "message_count": fields[COUNT],
            "tool_call_count": counters.get("tool_calls", 0),
            "input_tokens": fields[_S["input_tokens"]],
            "output_tokens": fields[_S["output_tokens"]],
            "cache_read_tokens": fields[_S["cache_read_tokens"]],
            "cache_write_tokens": fields[_S["cache_write_tokens"]],
            "reasoning_tokens": fields[_S["reasoning_tokens"]],
            "api_call_count": fields[_S["api_calls"]],
            "estimated_cost_usd": cost if cost else None,
        }
        for key, value in metadata.items():
            if key in self.session_columns and key not in _MANAGED_SESSION:
                if value is None and self.session_columns[key][0]:
                    continue  # NOT NULL in hermes: its default stands
                values[key] = value if value is None or type(value) in (str, int, float) else json.dumps(value)
        names = list(values)
        self.db.execute(
            f"INSERT INTO sessions ({', '.join(names)}) VALUES ({', '.join('?' * len(names))}) "
            f"ON CONFLICT (id) DO UPDATE SET {', '.join(f'{n} = excluded.{n}' for n in names[1:])}",
            [values[n] for n in names],
        )


__all__ = ["HERMES_SCHEMA", "HermesProjection", "HermesStore", "message_columns"]
