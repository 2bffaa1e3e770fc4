"""The PostgreSQL transcript projection: :class:`PostgresProjection`.

Many logs, one per host, project into one database: every row carries its log's id and
each log has its own checkpoint row, written in the same transaction as that log's
rows, so each event of each log is applied exactly once.  A catch-up locks only its
own log's checkpoint row (``SELECT ... FOR UPDATE``): hosts catching up different logs
never wait for each other, and processes catching up the same log take turns, each
skipping what the other applied.  Rows go in with ``COPY``; search is a stored,
generated ``tsvector`` with a GIN index over the live rows.

Needs the ``postgres`` extra: ``pip install 'agent-eventlog[postgres]'`` (psycopg 3).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

try:
    import psycopg
    from psycopg import sql
except ImportError as e:  # pragma: no cover - the extra is not installed
    raise ImportError("the PostgreSQL projection needs psycopg 3: pip install 'agent-eventlog[postgres]'") from e

from . import core, postgres_schema
from .core import ROW_COLUMNS, SESSION_COLUMNS, Applier, Checkpoint, Source
from .errors import InvalidQueryError, ProjectionCorruptError, ProjectionError, RebuildNeeded, SchemaVersionError
from .rows import DERIVED

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from eventlog.store import Record

SNIPPET_MARKS: Final = ("**", "**")
"""What :meth:`PostgresProjection.search` puts around matched words in snippets."""

REBUILD_TRIES: Final = 3
"""Rebuilds tried when the log is redacted again while one runs."""

_TEXT_SCALARS: Final = frozenset(ROW_COLUMNS.index(c) for c in ("timestamp", "platform_message_id"))
_DERIVED_SCALARS: Final = frozenset(DERIVED.index(c) for c in ("timestamp", "platform_message_id"))
_COPIED: Final = [c for c in ROW_COLUMNS if c not in ("session_id", "seq", "idx", "created_ns")]
_SEARCH_COLUMNS: Final = "log_id, session_id, position, seq, role, content"


def _text(value: Any) -> Any:
    """A value for a text column: PostgreSQL text cannot hold NUL, which becomes U+FFFD."""
    if type(value) is str:
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    return value


def _row(log_id: str, row: tuple[Any, ...]) -> list[Any]:
    out = [log_id]
    for i, value in enumerate(row):
        if value is not None and i in _TEXT_SCALARS and type(value) is not str:
            value = str(value)
        out.append(_text(value))
    return out


def _number(value: Any) -> Any:
    """A ``numeric`` counter read back as the int or float it was written as."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and "E" not in str(value) else float(value)
    return value


class PostgresProjection:
    """A PostgreSQL transcript of many event logs: sessions, message rows, full-text search.

    ``PostgresProjection(conninfo)`` connects (a ``postgresql://`` URL or a libpq
    connection string) and creates or migrates the schema; ``pool=`` takes a
    ``psycopg_pool.ConnectionPool`` instead, from which each call borrows a connection.
    ``schema``: the PostgreSQL schema holding the tables (created when missing).
    ``batch``: roughly how many messages each catch-up transaction applies.

    The write API is :class:`~projections.SQLiteProjection`'s (``catch_up(log)``,
    ``rebuild(log)``); every read takes an optional ``log_id=`` to pick one log, and
    needs it when two logs hold the same session id.  Search spans every log unless
    ``log_id`` is given.

    Raises :class:`~projections.errors.SchemaVersionError` when the database was
    written by a newer version, :class:`~projections.errors.ProjectionError` for any
    other database failure (``psycopg.Error`` is translated).
    """

    def __init__(
        self,
        conninfo: str | None = None,
        *,
        pool: ConnectionPool | None = None,
        schema: str = "eventlog",
        batch: int = 20_000,
    ) -> None:
        if (conninfo is None) == (pool is None):
            raise ValueError("give a connection string or a pool, not both or neither")
        if batch < 1:
            raise ValueError("batch must be >= 1")
        self.schema = schema
        self.batch = batch
        self._pool = pool
        self._lock = threading.RLock()
        self._wait: Callable[[float | None], bool] | None = None
        self._s = sql.Identifier(schema)
        self.where = _describe(conninfo, pool, schema)
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        if conninfo is not None:
            try:
                self._conn = psycopg.connect(conninfo, autocommit=True)
            except psycopg.Error as e:
                raise ProjectionError(f"{self.where}: cannot connect ({_first_line(e)})") from e
        try:
            with self._connection() as conn:
                self._migrate(conn)
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (a pool given by the caller stays open); later calls raise ProjectionError."""
        self._pool = None
        self._closed = True
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> PostgresProjection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PostgresProjection({self.where!r})"

    def bind(self, wait: Callable[[float | None], bool]) -> None:
        """Called by :meth:`EventLog.open` when the log projects on a background thread:
        every read first waits until the log's writes so far are applied."""
        self._wait = wait

    # -- writing ---------------------------------------------------------------

    def catch_up(self, log: Source) -> int:
        """Apply ``log``'s events after its checkpoint; return how many were applied.

        Transactions of about ``batch`` messages each record the log's checkpoint with
        its rows, under a lock on that log's checkpoint row alone.  Raises
        :class:`~projections.errors.LogMismatchError` when the log ends before its
        checkpoint or its history differs from the one applied (an older copy),
        :class:`~projections.errors.ProjectionCorruptError` when the rows disagree with
        the events (``rebuild`` repairs that).

        After a redaction of a message this log's rows already hold (the log rewrote the
        events they came from), the log's rows are rebuilt (:meth:`rebuild`); the count
        is then the rebuild's.
        """
        try:
            return self._catch_up(log)
        except RebuildNeeded:
            return self.rebuild(log)

    def _catch_up(self, log: Source) -> int:
        log_id = log.id
        with self._connection() as conn:
            with conn.transaction():
                conn.execute(
                    self._q("INSERT INTO {s}.checkpoints (log_id) VALUES (%s) ON CONFLICT DO NOTHING"), (log_id,)
                )
            checkpoint = self._checkpoint(conn, log_id)
            core.check_source(self._name(log_id), checkpoint, log)
            applied = 0
            for chunk in core.chunks(log.events(after=checkpoint.last_seq), self.batch):
                with conn.transaction():
                    checkpoint = self._checkpoint(conn, log_id, lock=True)
                    store = PostgresStore(conn, self._s, log_id)
                    applied += self._apply_chunk(conn, Applier(store, log=log), checkpoint, chunk)
            return applied

    def rebuild(self, log: Source) -> int:
        """Replace ``log``'s rows with a projection of it from its first event; return the events applied.

        One transaction: readers see the old rows until the new ones are complete.
        Only this log's rows and checkpoint are touched; other hosts keep catching up
        meanwhile.  The replaced rows stay in the table's files as dead tuples until
        :meth:`vacuum_full` (see docs/audit.md, "Redaction in projections").
        """
        for attempt in range(REBUILD_TRIES):
            try:
                return self._rebuild(log)
            except RebuildNeeded:
                if attempt + 1 == REBUILD_TRIES:
                    raise
        raise AssertionError("unreachable")

    def vacuum_full(self) -> None:
        """``VACUUM FULL`` the projection's tables: rewrite them, their indexes and TOAST into new files.

        The bytes of replaced and tombstoned-then-replaced rows (a redacted message's, after
        a rebuild) leave the tables' files only so: a plain ``VACUUM`` makes their space
        reusable but leaves them readable in the file until overwritten, and the search
        index keeps their words.  It takes an ``ACCESS EXCLUSIVE`` lock on each table for
        the time of its rewrite: every host's catch-up and every reader waits meanwhile.
        PostgreSQL's WAL, its archive and backups keep what they hold.
        """
        with self._connection() as conn:
            for table in ("messages", "sessions"):
                conn.execute(self._q(f"VACUUM FULL {{s}}.{table}"))

    def _rebuild(self, log: Source) -> int:
        log_id = log.id
        with self._connection() as conn, conn.transaction():
            conn.execute(self._q("INSERT INTO {s}.checkpoints (log_id) VALUES (%s) ON CONFLICT DO NOTHING"), (log_id,))
            self._checkpoint(conn, log_id, lock=True)
            conn.execute(self._q("DELETE FROM {s}.messages WHERE log_id = %s"), (log_id,))
            conn.execute(self._q("DELETE FROM {s}.sessions WHERE log_id = %s"), (log_id,))
            applier = Applier(PostgresStore(conn, self._s, log_id, fresh=True), fresh=True, log=log)
            checkpoint = Checkpoint(log_id)
            for chunk in core.chunks(log.events(after=0), self.batch):
                self._apply_chunk(conn, applier, checkpoint, chunk)
                checkpoint = self._checkpoint(conn, log_id)
            if checkpoint.last_seq == 0:
                conn.execute(
                    self._q("UPDATE {s}.checkpoints SET last_seq = 0, last_hash = NULL WHERE log_id = %s"), (log_id,)
                )
            return checkpoint.last_seq

    # -- reading ---------------------------------------------------------------

    def messages(self, session_id: str, *, log_id: str | None = None) -> list[dict[str, Any]]:
        """The live rows of the session in transcript order, as dicts keyed by column name."""
        log_id = self._log_of(session_id, log_id)
        if log_id is None:
            return []
        return self._rows(
            "SELECT * FROM {s}.messages WHERE log_id = %s AND session_id = %s AND tombstone_seq IS NULL "
            "ORDER BY position",
            (log_id, session_id),
        )

    def history(self, session_id: str, *, log_id: str | None = None) -> list[dict[str, Any]]:
        """Every row the session ever had, tombstoned ones included, in the order they were appended."""
        log_id = self._log_of(session_id, log_id)
        if log_id is None:
            return []
        return self._rows(
            "SELECT * FROM {s}.messages WHERE log_id = %s AND session_id = %s ORDER BY seq, idx",
            (log_id, session_id),
        )

    def sessions(self, *, log_id: str | None = None) -> list[dict[str, Any]]:
        """Every session (of one log, or of all) in creation order, as dicts keyed by column name."""
        if log_id is None:
            return self._rows("SELECT * FROM {s}.sessions ORDER BY created_ns, log_id, created_seq", ())
        return self._rows("SELECT * FROM {s}.sessions WHERE log_id = %s ORDER BY created_seq, id", (log_id,))

    def search(
        self, query: str, *, session_id: str | None = None, log_id: str | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Live rows matching ``query``, best first, with a highlighted ``snippet``.

        The query is web-search syntax (``websearch_to_tsquery``: words, ``"a phrase"``,
        ``or``, ``-word``), matched against the text content and the tool names and
        arguments.  Each result has the row's ``log_id``, ``session_id``, ``position``,
        ``seq``, ``role``, ``content``, ``snippet`` and ``rank`` (higher is better).

        Raises :class:`~projections.errors.InvalidQueryError` for a query that is not text.
        """
        if type(query) is not str:
            raise InvalidQueryError(f"search query must be a str, not {type(query).__name__}")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidQueryError(f"search query {query!r}: not valid text ({e.reason})") from None
        if "\x00" in query:
            raise InvalidQueryError(f"search query {query!r}: contains a NUL character")
        config = postgres_schema.SEARCH_CONFIG
        where = ["search @@ q", "tombstone_seq IS NULL"]
        params: list[Any] = [query]
        if log_id is not None:
            where.append("log_id = %s")
            params.append(log_id)
        if session_id is not None:
            where.append("session_id = %s")
            params.append(session_id)
        params.append(limit)
        options = f"StartSel={SNIPPET_MARKS[0]}, StopSel={SNIPPET_MARKS[1]}, MaxWords=16, MinWords=4, MaxFragments=1"
        text = "coalesce(content, '') || ' ' || coalesce(tool_text, '')"
        statement = (
            f"SELECT {_SEARCH_COLUMNS}, ts_headline('{config}', {text}, q, '{options}') AS snippet, rank "
            f"FROM (SELECT {_SEARCH_COLUMNS}, tool_text, q, ts_rank_cd(search, q) AS rank "
            f"FROM {{s}}.messages, websearch_to_tsquery('{config}', %s) AS q "
            f"WHERE {' AND '.join(where)} ORDER BY rank DESC, log_id, seq, idx LIMIT %s) AS hits "
            "ORDER BY rank DESC, log_id, seq"
        )
        return self._rows(statement, params)

    def logs(self) -> dict[str, int]:
        """Every log projected here and the last ``seq`` applied of each."""
        return {r["log_id"]: r["last_seq"] for r in self._rows("SELECT log_id, last_seq FROM {s}.checkpoints", ())}

    def last_seq_of(self, log_id: str) -> int:
        """The seq of the last event of ``log_id`` applied (0 when none)."""
        self._caught_up()
        with self._connection() as conn:
            return self._checkpoint(conn, log_id).last_seq

    # -- internals -------------------------------------------------------------

    def _apply_chunk(
        self, conn: psycopg.Connection[Any], applier: Applier, checkpoint: Checkpoint, chunk: list[Record]
    ) -> int:
        log_id = checkpoint.log_id
        assert log_id is not None
        if checkpoint.last_hash is None and checkpoint.last_seq:
            # No hash to chain to (cleared by hand or by a tool): every applied event records its
            # seq on its session's row, so the newest of those must be the checkpoint, or events
            # were skipped.
            found = conn.execute(
                self._q("SELECT coalesce(max(last_seq), 0) FROM {s}.sessions WHERE log_id = %s"), (log_id,)
            ).fetchone()
            newest = 0 if found is None else int(found[0])
            if newest != checkpoint.last_seq:
                raise ProjectionCorruptError(
                    f"{self._name(log_id)}: the checkpoint says events up to {checkpoint.last_seq} were applied, "
                    f"but the newest event the projection holds is {newest}: the checkpoint was moved without "
                    "its rows; rebuild(log) to project the log again"
                )
        last = core.apply_chunk(self._name(log_id), applier, checkpoint, chunk, (psycopg.Error,))
        if last is None:
            return 0
        conn.execute(
            self._q("UPDATE {s}.checkpoints SET last_seq = %s, last_hash = %s, updated_at = now() WHERE log_id = %s"),
            (last.seq, last.hash, log_id),
        )
        return last.seq - checkpoint.last_seq

    def _checkpoint(self, conn: psycopg.Connection[Any], log_id: str, *, lock: bool = False) -> Checkpoint:
        found = conn.execute(
            self._q(
                "SELECT last_seq, last_hash FROM {s}.checkpoints WHERE log_id = %s" + (" FOR UPDATE" if lock else "")
            ),
            (log_id,),
        ).fetchone()
        if found is None:
            return Checkpoint(None)
        return Checkpoint(log_id, found[0], None if found[1] is None else bytes(found[1]))

    def _log_of(self, session_id: str, log_id: str | None) -> str | None:
        if log_id is not None:
            return log_id
        found = self._rows("SELECT log_id FROM {s}.sessions WHERE id = %s ORDER BY log_id", (session_id,))
        if len(found) > 1:
            logs = ", ".join(r["log_id"] for r in found)
            raise AmbiguousSessionError(
                f"{self.where}: session {session_id!r} is in several logs ({logs}); give log_id="
            )
        return found[0]["log_id"] if found else None

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        with conn.transaction():
            # Hosts opening a new database together: one creates, the others then see it.
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"agent-eventlog schema {self.schema}",))
            conn.execute(self._q("CREATE SCHEMA IF NOT EXISTS {s}"))
            exists = conn.execute("SELECT to_regclass(%s)", (f'"{self.schema}".schema_version',)).fetchone()
            quoted = self._s.as_string(conn)
            if exists is None or exists[0] is None:
                for statement in postgres_schema.statements(postgres_schema.SCHEMA, quoted):
                    conn.execute(statement.encode())
                return
            row = conn.execute(self._q("SELECT version FROM {s}.schema_version")).fetchone()
            current = 0 if row is None else int(row[0])
            if current > postgres_schema.VERSION:
                raise SchemaVersionError(
                    f"{self.where}: projection schema version {current} is newer than this code's "
                    f"{postgres_schema.VERSION}"
                )
            while current < postgres_schema.VERSION:
                current += 1
                step = postgres_schema.MIGRATIONS.get(current, postgres_schema.REPROJECT)
                if step == postgres_schema.REPROJECT:
                    for table in postgres_schema.TABLES:
                        conn.execute(self._q(f"DROP TABLE IF EXISTS {{s}}.{table}"))
                    for statement in postgres_schema.statements(postgres_schema.SCHEMA, quoted):
                        conn.execute(statement.encode())
                    return
                for statement in postgres_schema.statements(step, quoted):
                    conn.execute(statement.encode())
                conn.execute(self._q("UPDATE {s}.schema_version SET version = %s"), (current,))

    def _name(self, log_id: str) -> str:
        return f"{self.where} (log {log_id})"

    def _q(self, statement: str) -> sql.Composed:
        return sql.SQL(statement).format(s=self._s)

    def _caught_up(self) -> None:
        if self._wait is not None and not self._wait(None):
            raise ProjectionError(
                f"{self.where}: behind its log: catching up with the latest writes failed "
                "(the 'eventlog' logger has the error)"
            )

    def _rows(self, statement: str, params: Any) -> list[dict[str, Any]]:
        self._caught_up()
        with self._connection() as conn:
            cursor = conn.execute(self._q(statement), params)
            names = [d.name for d in cursor.description or ()]
            out = []
            for row in cursor.fetchall():
                record = dict(zip(names, row))
                for key, value in record.items():
                    if isinstance(value, memoryview):
                        record[key] = bytes(value)
                    elif isinstance(value, Decimal):
                        record[key] = _number(value)
                out.append(record)
            return out

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one call (borrowed from the pool, or ours under the lock), errors translated."""
        pool = self._pool
        if self._closed:
            raise ProjectionError(f"{self.where}: the projection is closed")
        try:
            if pool is not None:  # calls on other threads borrow connections of their own
                with pool.connection() as conn:
                    yield conn
                return
            with self._lock:
                if self._conn is None:
                    raise ProjectionError(f"{self.where}: the projection is closed")
                if self._conn.broken:
                    self._reconnect()
                yield self._conn
        except psycopg.Error as e:
            raise ProjectionError(f"{self.where}: {type(e).__name__}: {_first_line(e)}") from e

    def _reconnect(self) -> None:
        """The server closed our connection (restarted, or was down): connect again for the next call."""
        assert self._conn is not None
        info = self._conn.info.dsn
        password = self._conn.info.password
        self._conn = (
            psycopg.connect(info, password=password, autocommit=True)
            if password
            else psycopg.connect(info, autocommit=True)
        )


class AmbiguousSessionError(ProjectionError, ValueError):
    """A read named a session id that several logs hold, without ``log_id=``."""


class PostgresStore:
    """A :class:`projections.core.Store` for one log, on a connection inside its open transaction."""

    def __init__(
        self, conn: psycopg.Connection[Any], schema: sql.Identifier, log_id: str, *, fresh: bool = False
    ) -> None:
        self.conn = conn
        self.log_id = log_id
        self.fresh = fresh
        q = lambda text: sql.SQL(text).format(s=schema)  # noqa: E731
        self._copy_rows = q(f"COPY {{s}}.messages (log_id, {', '.join(ROW_COLUMNS)}) FROM STDIN")
        self._copy_sessions = q(f"COPY {{s}}.sessions (log_id, {', '.join(SESSION_COLUMNS)}) FROM STDIN")
        self._save_session = q(
            f"INSERT INTO {{s}}.sessions (log_id, {', '.join(SESSION_COLUMNS)}) "
            f"VALUES ({', '.join(['%s'] * (len(SESSION_COLUMNS) + 1))}) ON CONFLICT (log_id, id) DO UPDATE SET "
            + ", ".join(f"{c} = EXCLUDED.{c}" for c in SESSION_COLUMNS[1:])
        )
        self._load_session = q(f"SELECT {', '.join(SESSION_COLUMNS)} FROM {{s}}.sessions WHERE log_id = %s AND id = %s")
        self._live_nodes = q(
            "SELECT node FROM {s}.messages WHERE log_id = %s AND session_id = %s AND tombstone_seq IS NULL "
            "AND position >= %s ORDER BY position"
        )
        self._node_at = q(
            "SELECT node FROM {s}.messages WHERE log_id = %s AND session_id = %s AND position = %s "
            "AND tombstone_seq IS NULL"
        )
        self._tombstone = q(
            "UPDATE {s}.messages SET tombstone_seq = %s, tombstone_reason = %s, tombstoned_ns = %s "
            "WHERE log_id = %s AND session_id = %s AND tombstone_seq IS NULL AND position >= %s"
        )
        self._fork = q(
            f"INSERT INTO {{s}}.messages (log_id, session_id, seq, idx, created_ns, {', '.join(_COPIED)}) "
            f"SELECT log_id, %s, %s, position, %s, {', '.join(_COPIED)} FROM {{s}}.messages "
            "WHERE log_id = %s AND session_id = %s AND tombstone_seq IS NULL AND position < %s"
        )
        self._live_message = q(
            "SELECT node, message FROM {s}.messages WHERE log_id = %s AND session_id = %s AND position = %s "
            "AND tombstone_seq IS NULL"
        )
        self._redisplay = q(
            f"UPDATE {{s}}.messages SET {', '.join(f'{c} = %s' for c in DERIVED)} "
            "WHERE log_id = %s AND session_id = %s AND position = %s AND tombstone_seq IS NULL"
        )
        self._stored = q(
            "SELECT message, digest, redacted_seq FROM {s}.messages WHERE log_id = %s AND seq = %s AND idx = %s"
        )
        self._redact = q(
            f"UPDATE {{s}}.messages SET {', '.join(f'{c} = %s' for c in DERIVED)}, redacted_seq = %s "
            "WHERE log_id = %s AND body_seq = %s AND body_idx = %s"
        )

    def session(self, session_id: str) -> list[Any] | None:
        found = self.conn.execute(self._load_session, (self.log_id, session_id)).fetchone()
        if found is None:
            return None
        return [bytes(v) if isinstance(v, memoryview) else _number(v) for v in found]

    def write_rows(self, rows: list[tuple[Any, ...]], *, bulk: bool) -> None:
        log_id = self.log_id
        with self.conn.cursor().copy(self._copy_rows) as copy:
            for row in rows:
                copy.write_row(_row(log_id, row))

    def live_nodes(self, session_id: str, position: int) -> list[bytes]:
        found = self.conn.execute(self._live_nodes, (self.log_id, session_id, position)).fetchall()
        return [bytes(r[0]) for r in found]

    def node_at(self, session_id: str, position: int) -> bytes | None:
        found = self.conn.execute(self._node_at, (self.log_id, session_id, position)).fetchone()
        return None if found is None else bytes(found[0])

    def tombstone(self, session_id: str, position: int, seq: int, reason: str, time_ns: int) -> None:
        self.conn.execute(self._tombstone, (seq, reason, time_ns, self.log_id, session_id, position))

    def copy_fork(self, session_id: str, seq: int, time_ns: int, source: str, at: int) -> None:
        self.conn.execute(self._fork, (session_id, seq, time_ns, self.log_id, source, at))

    def live_message(self, session_id: str, position: int) -> tuple[bytes, str] | None:
        found = self.conn.execute(self._live_message, (self.log_id, session_id, position)).fetchone()
        return None if found is None else (bytes(found[0]), found[1])

    def redisplay(self, session_id: str, position: int, derived: tuple[Any, ...]) -> None:
        self.conn.execute(self._redisplay, (*self._derived(derived), self.log_id, session_id, position))

    def stored_message(self, seq: int, idx: int) -> tuple[str, bytes, int | None] | None:
        found = self.conn.execute(self._stored, (self.log_id, seq, idx)).fetchone()
        return None if found is None else (found[0], bytes(found[1]), found[2])

    def redact(self, body_seq: int, body_idx: int, seq: int, derived: tuple[Any, ...]) -> None:
        self.conn.execute(self._redact, (*self._derived(derived), seq, self.log_id, body_seq, body_idx))

    @staticmethod
    def _derived(derived: tuple[Any, ...]) -> list[Any]:
        return [
            str(v) if v is not None and i in _DERIVED_SCALARS and type(v) is not str else _text(v)
            for i, v in enumerate(derived)
        ]

    def save_sessions(self, sessions: list[list[Any]]) -> None:
        log_id = self.log_id
        if self.fresh:
            with self.conn.cursor().copy(self._copy_sessions) as copy:
                for session in sessions:
                    copy.write_row([log_id, *map(_text, session)])
            self.fresh = False  # a later save of the same transaction may replace these rows
            return
        with self.conn.cursor() as cursor:
            cursor.executemany(self._save_session, [[log_id, *map(_text, session)] for session in sessions])


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _describe(conninfo: str | None, pool: ConnectionPool | None, schema: str) -> str:
    """Where the projection is, for messages: host, port, database and schema, never a password."""
    if conninfo is None:
        assert pool is not None
        conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
    try:
        params = psycopg.conninfo.conninfo_to_dict(conninfo)
    except psycopg.Error:
        return f"postgresql (schema {schema})"
    host = params.get("host") or "localhost"
    port = params.get("port") or "5432"
    dbname = params.get("dbname") or params.get("user") or ""
    return f"postgresql://{host}:{port}/{dbname} (schema {schema})"


__all__ = ["SNIPPET_MARKS", "AmbiguousSessionError", "PostgresProjection", "PostgresStore"]
