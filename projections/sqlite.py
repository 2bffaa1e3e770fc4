"""The SQLite transcript projection: :class:`SQLiteProjection`.

The projection reads the log's events in ``seq`` order and writes them into plain
SQLite tables (see :mod:`projections.schema`) that agent UIs, dashboards and
``sqlite3`` users read directly.  Each batch of events and the checkpoint (the last
applied ``seq`` and the log's id) commit in one transaction, so an event is applied
exactly once whatever crashes or concurrent catch-ups happen.

The log is the source of truth: the database runs in WAL mode with
``synchronous=NORMAL`` and never needs an fsync of its own.  A commit lost in a
crash only moves the checkpoint back, and the next catch-up replays those events.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

from eventlog import events as ev

from . import core, replace, schema
from .core import Applier, Checkpoint, Source
from .errors import InvalidQueryError, NotAProjectionError, ProjectionCorruptError, ProjectionError, RebuildNeeded
from .sqlite_store import SQLiteStore, index_pending

if TYPE_CHECKING:
    from eventlog.store import Record

logger = logging.getLogger("eventlog")

BUSY_TIMEOUT = 60
"""Seconds a connection waits for another one's lock before failing."""

PAGE_SIZE = 16384
"""The page size of a new file (an existing file keeps its own)."""

TRUNCATE_WAIT = 5
"""Seconds the WAL truncation after a replacement waits for readers inside a transaction."""

REPLACE_TRIES = 3
"""Fresh-file rebuilds tried when the log is redacted again while one runs."""

SNIPPET_MARKS = ("**", "**")
"""What :meth:`SQLiteProjection.search` puts around matched words in snippets."""

CHECKPOINT = "SELECT log_id, last_seq, last_hash, indexed_upto FROM checkpoint"

PASSES = 3
"""How many times a catch-up takes, in the same transaction, the writes made while it applied."""


class SQLiteProjection:
    """A SQLite transcript of an event log: sessions, message rows, full-text search.

    ``SQLiteProjection(path)`` opens or creates the database and brings its schema
    to the current version.  Attach it to a log with
    ``EventLog.open(..., projections=[proj])`` to have it caught up after every
    write, or call :meth:`catch_up` yourself.

    ``search_lag``: the search index is fed in bulk, when at least this many rows
    are waiting (0: in every catch-up).  Rows and sessions are always current after
    :meth:`catch_up`; :meth:`search` first indexes whatever is waiting, so only
    readers that query ``messages_fts`` directly may see up to ``search_lag`` of
    the newest rows missing.  :meth:`sync_search` waits for the index.

    ``batch``: roughly how many messages each catch-up transaction applies.

    Raises :class:`~projections.errors.SchemaVersionError` when the file was
    written by a newer version, :class:`~projections.errors.ProjectionError` for
    other SQLite failures.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        search_lag: int = 1000,
        batch: int = 20_000,
        page_size: int = PAGE_SIZE,
    ) -> None:
        if search_lag < 0 or batch < 1:
            raise ValueError("search_lag must be >= 0 and batch >= 1")
        self.path = os.fspath(path)
        self._absolute = os.path.abspath(self.path)  # the file meant, whatever the working directory becomes
        self.search_lag = search_lag
        self.batch = batch
        self.page_size = page_size
        self._erase_pending = False  # the WAL of a replaced projection is still to be truncated
        self._refuse_redactions = False  # a rebuild in place stops at a redaction (see _rebuild)
        self._lock = threading.RLock()
        self._wait: Callable[[float | None], bool] | None = None
        self._wal_pending = False  # a rebuild could not return to WAL mode yet
        wal_left = replace.wal_left(self.path)
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT)
        except sqlite3.Error as e:
            raise ProjectionError(f"{self.path}: cannot open the projection ({e})") from e
        try:
            # Processes opening a new file together can each hold a lock the other needs to
            # switch it to WAL mode or create the schema; SQLite then answers "locked" at once
            # rather than wait.  Every step is idempotent: try again until the busy timeout.
            deadline = time.monotonic() + BUSY_TIMEOUT
            pause = 0.005
            while True:
                try:
                    with self._translate():
                        self._set_up()
                    break
                except ProjectionError as e:
                    if not _busy(e) or time.monotonic() + pause > deadline:
                        raise
                time.sleep(pause)
                pause = min(2 * pause, 0.1)
            if wal_left:  # what a stopped replacement may have left in the file: checkpoint it (once)
                with self._translate():
                    replace.truncate_wal(self._db, wait=0, busy_timeout=BUSY_TIMEOUT)
        except BaseException:
            self._db.close()
            raise

    def _set_up(self) -> None:
        try:
            schema.refuse_foreign(self._db, self.path)  # before a pragma changes the file
        except sqlite3.DatabaseError as e:
            if e.sqlite_errorcode != sqlite3.SQLITE_NOTADB:
                raise
            raise NotAProjectionError(self.path, "not a SQLite database") from e
        # Rows hold the message twice (text projection and JSON), about 2 KB: with 16 KiB
        # pages they pack six to a page instead of one to a 4 KiB page, and bulk writes and
        # commits cost a third less.  Only a new file takes it.
        self._db.execute(f"PRAGMA page_size = {int(self.page_size)}")
        self._db.execute("PRAGMA journal_mode = WAL")
        # The log is the source of truth: losing the last commits in a power cut only moves
        # the checkpoint back, and catch-up replays them.
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("PRAGMA cache_size = -65536")
        self._db.execute("PRAGMA temp_store = MEMORY")
        schema.migrate(self._db, self.path)

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Index what the search index still lacks, then close the database.

        A projection attached to a log is first brought up to date with the log's writes so
        far; writes made after it is closed are logged as failed catch-ups (close the log first).
        """
        if self._wait is not None:
            self._wait(None)  # outside the lock: the projector takes it to catch up
        with self._lock:
            if self._db is None:
                return
            try:
                self._sync_search()
                if self._erase_pending:  # the last connection to close removes the WAL anyway
                    with self._translate():
                        self._truncate_wal(wait=0)
            finally:
                self._db.close()
                self._db = None  # type: ignore[assignment]

    def __enter__(self) -> SQLiteProjection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SQLiteProjection({self.path!r})"

    def opener(self) -> Callable[[], SQLiteProjection]:
        """A picklable callable that opens this projection again (same file and settings):
        how ``EventLog.open(..., projection_process=True)`` opens it in its own process."""
        return partial(
            SQLiteProjection, self._absolute, search_lag=self.search_lag, batch=self.batch, page_size=self.page_size
        )

    def bind(self, wait: Callable[[float | None], bool]) -> None:
        """Called by :meth:`EventLog.open` when the log projects on a background thread:
        every read method first waits with ``wait`` until the log's writes so far are
        applied, so a reader always sees its own writes."""
        self._wait = wait

    # -- writing ---------------------------------------------------------------

    def catch_up(self, log: Source) -> int:
        """Apply the log's events after the checkpoint; return how many were applied.

        Uses only ``log.id``, ``log.last_seq`` and ``log.events(after=...)``.  Events are applied in
        transactions of about ``batch`` messages, each recording the checkpoint with
        the rows, under ``BEGIN IMMEDIATE``; the checkpoint is read again inside the
        transaction, so processes catching up the same file never apply an event
        twice.  Writes that land while the log's last events are applied join their
        transaction (:data:`PASSES`).  Returns 0 when the projection is already current.

        After a redaction of a message this projection already applied (the log
        rewrote the events it holds), the projection is rebuilt into a fresh file that
        replaces this one's content (see :meth:`rebuild`); the count is then the
        rebuild's.

        Raises :class:`~projections.errors.LogMismatchError` when the database
        projects another log, is ahead of this one or holds another history,
        :class:`~projections.errors.ProjectionCorruptError` when the tables disagree
        with the events (``rebuild`` repairs that).
        """
        with self._lock, self._translate():
            if self._erase_pending:
                self._truncate_wal(wait=0)
            try:
                return self._catch_up(log)
            except RebuildNeeded as e:
                logger.info("%s", e)
                return self._replace(log)

    def _catch_up(self, log: Source) -> int:
        log_id = log.id
        checkpoint = self._read_checkpoint()
        if checkpoint.log_id is not None and checkpoint.log_id != log_id:
            raise core.mismatch(self.path, checkpoint.log_id, log_id)
        if checkpoint.log_id is None:
            with self._write():  # the projection belongs to this log from now on
                self._claim(log_id)
        applied = 0
        found = False
        for chunk in core.chunks(log.events(after=checkpoint.last_seq), self.batch):
            found = True
            with self._write():
                # The checkpoint again, inside the transaction: another process may have moved it.
                owner, last, last_hash, indexed = self._db.execute(CHECKPOINT).fetchone()
                self._claim(log_id, owner)
                checkpoint = Checkpoint(owner, last, last_hash)
                store = SQLiteStore(self._db, indexed)
                applier = Applier(store, log=log)
                applied += self._apply_chunk(store, applier, checkpoint, chunk)
                used = core.size(chunk)
                if used < self.batch:  # the log's last events: take the writes made meanwhile too
                    applied += self._apply_meanwhile(store, applier, self.batch - used)
                self._index(force=False)
        if not found:
            # Nothing after the checkpoint: the log may end before it (an older copy).  When
            # events follow it, the log goes on past it, and their chain is checked instead.
            core.check_source(self.path, checkpoint, log)
        return applied

    def _apply_meanwhile(self, store: SQLiteStore, applier: Applier, room: int) -> int:
        """Apply, in the open transaction, the writes that landed while it applied the events before.

        Up to :data:`PASSES` times, each taking what arrived during the last, within ``room``
        messages (the transaction stays within about ``batch``): under sustained writes a round
        then ends holding them, in one commit, and the round a reader waits for next has less
        left to apply.
        """
        log = applier.log
        assert log is not None
        applied = 0
        for _ in range(PASSES):
            owner, last, last_hash, _ = self._db.execute(CHECKPOINT).fetchone()
            if log.last_seq <= last:
                break  # nothing landed meanwhile (the cheap question first)
            chunk = next(core.chunks(log.events(after=last), room), None)
            if chunk is None:
                break
            applied += self._apply_chunk(store, applier, Checkpoint(owner, last, last_hash), chunk)
            room -= core.size(chunk)
            if room <= 0:
                break
        return applied

    def rebuild(self, log: Source, *, exclusive: bool | None = None) -> int:
        """Drop every table and project ``log`` from its first event; return the events applied.

        All of it is one transaction: readers see the old projection until the new one
        is complete.  The database adopts ``log``'s id, whichever log it projected before.

        ``exclusive``: whether the rebuild may take the file for itself when no other
        connection has it open.  It then runs in rollback-journal mode, and the new pages
        are written once, into the database, instead of into the WAL and again by the
        checkpoint after the commit (a sixth of the time); but connections that open the
        file meanwhile cannot read from its first large write until it commits (they wait
        up to their busy timeout, 60 s for a projection).  By default only a projection
        with nothing applied yet is taken so: readers have nothing to see meanwhile.  The
        file is back in WAL mode when it returns.

        When the log holds a redaction and the file held rows before, the rebuild erases:
        it goes into a fresh file beside this one, which is then copied over this one in
        one transaction (SQLite's backup), and the WAL is truncated; the old rows, their
        search index, free pages and WAL frames go with it (``exclusive`` is then moot).
        """
        with self._lock, self._translate():
            if exclusive is None:
                exclusive = self._checkpoint()[1] == 0
            self._refuse_redactions = self._checkpoint()[1] > 0
            alone = exclusive and self._journal_alone()
            try:
                with self._write():
                    return self._rebuild(log)
            except RebuildNeeded:
                pass
            finally:
                self._refuse_redactions = False
                if alone:
                    self._back_to_wal()
            return self._replace(log)

    def _rebuild(self, log: Source) -> int:
        """The body of :meth:`rebuild`, inside its transaction.

        While ``_refuse_redactions`` (the file held rows), raises :class:`RebuildNeeded` at the
        first redaction event: a fresh file then replaces this one (its old pages would keep
        the erased content).
        """
        refuse_redactions = self._refuse_redactions
        schema.drop(self._db)
        schema.create(self._db)
        self._db.execute("UPDATE checkpoint SET log_id = ?", (log.id,))
        # One applier for the whole transaction: sessions stay in memory, and each bulk
        # of rows is indexed on a helper thread while the next one is derived.
        store = SQLiteStore(self._db, 0, background=True)
        applier = Applier(store, fresh=True, log=log)
        checkpoint = Checkpoint(log.id)
        applied = 0
        try:
            for chunk in core.chunks(log.events(after=0), self.batch):
                if refuse_redactions and any(type(r.event) is ev.MessageRedacted for r in chunk):
                    raise RebuildNeeded(f"{self.path}: the log holds a redaction")
                applied += self._apply_chunk(store, applier, checkpoint, chunk)
                checkpoint = self._read_checkpoint()
        except BaseException:
            store.settle()  # the connection must be free before the rollback
            raise
        self._index(force=True)
        return applied

    def _replace(self, log: Source) -> int:
        """Rebuild into a fresh file beside this one and copy it over this one; return the events applied.

        See :mod:`projections.replace`: readers see the old projection until the copy
        commits, the file's pages are overwritten and it shrinks to the new size, then the
        WAL is truncated.
        """
        page_size = int(self._db.execute("PRAGMA page_size").fetchone()[0])
        for attempt in range(REPLACE_TRIES):
            with replace.scratch(self.path) as where:
                fresh = SQLiteProjection(where, search_lag=self.search_lag, batch=self.batch, page_size=page_size)
                try:
                    with fresh._translate():
                        fresh._journal_alone()  # nobody else knows the file: written once
                        try:
                            with fresh._write():
                                applied = fresh._rebuild(log)
                        except RebuildNeeded:
                            if attempt + 1 == REPLACE_TRIES:
                                raise
                            continue  # redacted again meanwhile
                    replace.copy_over(fresh._db, self._db)  # errors name this projection
                finally:
                    fresh._db.close()
                    fresh._db = None  # type: ignore[assignment]
            self._truncate_wal(wait=TRUNCATE_WAIT)
            return applied
        raise AssertionError("unreachable")

    def _truncate_wal(self, *, wait: float) -> None:
        """Truncate the WAL after a replacement; while a reader holds on, tried again at the next catch-up."""
        done = replace.truncate_wal(self._db, wait=wait, busy_timeout=BUSY_TIMEOUT)
        if not done and not self._erase_pending:
            logger.warning(
                "%s: a reader holds a transaction open: the WAL keeps the replaced pages until it "
                "ends (truncated at the next catch-up)",
                self.path,
            )
        self._erase_pending = not done

    def sync_search(self) -> int:
        """Bring the search index up to date with the rows; return how many rows it was behind."""
        self._caught_up()
        return self._sync_search()

    def _sync_search(self) -> int:
        with self._lock, self._translate():
            if self._pending() == 0:
                return 0
            with self._write():
                return self._index(force=True)

    # -- reading ---------------------------------------------------------------

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The live rows of the session in transcript order, as dicts keyed by column name.

        ``message`` holds the wire message as JSON; ``content`` its text projection
        with the display override applied.  Empty for an unknown session.
        """
        return self._rows(
            "SELECT * FROM messages WHERE session_id = ? AND tombstone_seq IS NULL ORDER BY position",
            (session_id,),
        )

    def history(self, session_id: str) -> list[dict[str, Any]]:
        """Every row the session ever had, tombstoned ones included, in the order they were appended.

        ``seq`` is the event that made a row live; ``tombstone_seq`` and
        ``tombstone_reason`` (``rewind``, ``compaction``, ``edit``, ``clear``) are
        ``None`` while it is live.
        """
        return self._rows("SELECT * FROM messages WHERE session_id = ? ORDER BY id", (session_id,))

    def search(self, query: str, *, session_id: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        """Live rows matching an FTS5 ``query``, best first, with a highlighted ``snippet``.

        Searches the text content and the tool names and arguments.  The search index
        is brought up to date first.  Each result has the row's ``id``,
        ``session_id``, ``position``, ``seq``, ``role``, ``content``, ``snippet`` and
        ``rank`` (BM25, lower is better).

        Raises :class:`~projections.errors.InvalidQueryError` (a ``ValueError``) for
        a query that is not FTS5 syntax, or not text (a ``str`` with a lone surrogate).
        """
        if type(query) is not str:
            raise InvalidQueryError(f"search query must be a str, not {type(query).__name__}")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InvalidQueryError(f"search query {query!r}: not valid text ({e.reason})") from None
        self.sync_search()
        sql = (
            "SELECT m.id, m.session_id, m.position, m.seq, m.role, m.content, "
            "snippet(messages_fts, -1, ?, ?, '…', 16) AS snippet, bm25(messages_fts) AS rank "
            "FROM messages_fts JOIN messages AS m ON m.id = messages_fts.rowid "
            "WHERE messages_fts MATCH ? AND m.tombstone_seq IS NULL"
        )
        params: list[Any] = [*SNIPPET_MARKS, query]
        if session_id is not None:
            sql += " AND m.session_id = ?"
            params.append(session_id)
        sql += " ORDER BY rank, m.id LIMIT ?"
        params.append(limit)
        try:
            return self._rows(sql, params)
        except ProjectionError as e:
            cause = e.__cause__
            # A malformed MATCH expression is a plain SQLITE_ERROR; busy, locked or I/O
            # errors have codes of their own and stay ProjectionErrors.
            if isinstance(cause, sqlite3.OperationalError) and getattr(cause, "sqlite_errorcode", None) == 1:
                raise InvalidQueryError(f"search query {query!r}: {cause}") from cause
            raise

    def sessions(self) -> list[dict[str, Any]]:
        """Every session in creation order, as dicts keyed by column name.

        ``metadata`` and ``counters`` are JSON objects: the merged metadata fields
        and the summed usage counters (the common counters also have columns).
        """
        return self._rows("SELECT * FROM sessions ORDER BY created_seq, id", ())

    @property
    def last_seq(self) -> int:
        """The seq of the last event applied (0 for an empty projection)."""
        self._caught_up()
        with self._lock, self._translate():
            return self._checkpoint()[1]

    # -- internals -------------------------------------------------------------

    def _apply_chunk(self, store: SQLiteStore, applier: Applier, checkpoint: Checkpoint, chunk: list[Record]) -> int:
        """Apply the events of ``chunk`` after ``checkpoint`` inside the open transaction.

        Records the checkpoint (and how far the search index got) with the rows;
        returns how many events were new (another process may have applied some).
        """
        if checkpoint.last_hash is None and checkpoint.last_seq:
            # No hash to chain to (moved by code that knows nothing of it, or by hand): every
            # applied event records its seq on its session's row, so the newest of those must
            # be the checkpoint, or events were skipped.
            newest = self._db.execute("SELECT coalesce(max(last_seq), 0) FROM sessions").fetchone()[0]
            if newest != checkpoint.last_seq:
                raise ProjectionCorruptError(
                    f"{self.path}: the checkpoint says events up to {checkpoint.last_seq} were applied, but "
                    f"the newest event the projection holds is {newest}: the checkpoint was moved without "
                    "its rows; rebuild(log) to project the log again"
                )
        last = core.apply_chunk(self.path, applier, checkpoint, chunk, (sqlite3.Error,))
        store.finish()
        if last is None:
            return 0
        self._db.execute(
            "UPDATE checkpoint SET last_seq = ?, last_hash = ?, indexed_upto = ?",
            (last.seq, last.hash, store.indexed_upto),
        )
        return last.seq - checkpoint.last_seq

    def _journal_alone(self) -> bool:
        """Switch to rollback-journal mode if no other connection has the file open.

        Leaving WAL mode needs the file to itself: SQLite refuses at once (busy) otherwise.
        """
        self._db.execute("PRAGMA busy_timeout = 0")
        try:
            mode = self._db.execute("PRAGMA journal_mode = DELETE").fetchone()[0]
        except sqlite3.OperationalError as e:
            if e.sqlite_errorcode != sqlite3.SQLITE_BUSY:
                raise
            return False
        finally:
            self._db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT * 1000}")
        if mode != "delete":  # an in-memory database has no WAL to leave
            return False
        self._db.execute("PRAGMA synchronous = FULL")  # NORMAL is only safe with the WAL
        self._wal_pending = False  # the caller returns to WAL mode itself
        return True

    def _back_to_wal(self) -> None:
        """Return to WAL mode after :meth:`_journal_alone`; while a reader's lock prevents it,
        the next write tries again."""
        try:
            mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError:
            mode = None
        self._wal_pending = mode != "wal"
        if not self._wal_pending:
            self._db.execute("PRAGMA synchronous = NORMAL")

    def _claim(self, log_id: str, owner: str | None = None) -> None:
        """Record ``log_id`` as the projected log, or refuse another one (inside the open transaction).

        ``owner``: the checkpoint's log id as just read in this transaction (read here if not given).
        """
        if owner is None:
            owner = self._checkpoint()[0]
        if owner is None:
            self._db.execute("UPDATE checkpoint SET log_id = ?", (log_id,))
        elif owner != log_id:
            raise core.mismatch(self.path, owner, log_id)

    def _index(self, *, force: bool) -> int:
        """Feed the search index (inside the open transaction) when enough rows wait."""
        behind = self._pending()
        if behind == 0 or (not force and behind < self.search_lag):
            return 0
        _, _, indexed = self._checkpoint()
        self._db.execute("UPDATE checkpoint SET indexed_upto = ?", (index_pending(self._db, indexed),))
        return behind

    def _pending(self) -> int:
        top, indexed = self._db.execute(
            "SELECT (SELECT coalesce(max(id), 0) FROM messages), indexed_upto FROM checkpoint"
        ).fetchone()
        return max(0, top - indexed)

    def _checkpoint(self) -> tuple[str | None, int, int]:
        owner, last, indexed = self._db.execute("SELECT log_id, last_seq, indexed_upto FROM checkpoint").fetchone()
        return owner, last, indexed

    def _read_checkpoint(self) -> Checkpoint:
        owner, last, last_hash = self._db.execute("SELECT log_id, last_seq, last_hash FROM checkpoint").fetchone()
        return Checkpoint(owner, last, last_hash)

    def _caught_up(self) -> None:
        """Before a read: wait until the log's writes so far are applied (when attached).

        Raises :class:`ProjectionError` when they cannot be: a reader never silently gets
        a transcript older than its own writes.
        """
        if self._wait is not None and not self._wait(None):
            raise ProjectionError(
                f"{self.path}: behind its log: catching up with the latest writes failed "
                "(the 'eventlog' logger has the error)"
            )

    def _rows(self, sql: str, params: Any) -> list[dict[str, Any]]:
        self._caught_up()
        with self._lock, self._translate():
            cursor = self._db.execute(sql, params)
            names = [d[0] for d in cursor.description]
            return [dict(zip(names, row)) for row in cursor.fetchall()]

    @contextmanager
    def _write(self) -> Iterator[None]:
        """A ``BEGIN IMMEDIATE`` transaction: commits on success, rolls back on any error
        (a commit that fails too: a rollback-journal commit waits for readers, and may time out)."""
        if self._wal_pending:
            self._back_to_wal()
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise

    @contextmanager
    def _translate(self) -> Iterator[None]:
        if self._db is None:
            raise ProjectionError(f"{self.path}: the projection is closed")
        try:
            yield
        except sqlite3.Error as e:
            raise ProjectionError(f"{self.path}: {type(e).__name__}: {e}") from e


def _busy(error: ProjectionError) -> bool:
    """Whether ``error`` is SQLite's "busy" or "locked": another connection's lock, for now."""
    cause = error.__cause__
    code = getattr(cause, "sqlite_errorcode", None)
    return isinstance(cause, sqlite3.OperationalError) and code is not None and code & 0xFF in (5, 6)


__all__ = ["SNIPPET_MARKS", "SQLiteProjection"]
