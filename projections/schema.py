"""The SQLite schema of the transcript projection, its version and its migrations.

The schema version lives in ``PRAGMA user_version``.  Opening a database runs the
migrations from its version up to :data:`VERSION` in one transaction.  A
migration is either SQL that transforms the tables in place, or :data:`REPROJECT`:
drop everything and create the new schema with an empty checkpoint, so that the
next ``catch_up`` re-projects the whole log.  The projection is derived data, so
re-projecting is always a correct migration; SQL is only a faster one.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from .errors import NotAProjectionError, SchemaVersionError

VERSION: Final = 3

REPROJECT: Final = "reproject"
"""A migration that rebuilds the schema and resets the checkpoint to re-project the log."""

# Code of schema version 1 still running in another process moves ``last_seq`` without
# ``last_hash``: the hash then no longer names event ``last_seq``, and is forgotten.
_FORGET_STALE_HASH: Final = """
CREATE TRIGGER checkpoint_stale_hash AFTER UPDATE OF last_seq ON checkpoint
WHEN NEW.last_seq != OLD.last_seq AND NEW.last_hash IS OLD.last_hash
BEGIN
    UPDATE checkpoint SET last_hash = NULL;
END;
"""

MIGRATIONS: dict[int, str] = {
    2: "ALTER TABLE checkpoint ADD COLUMN last_hash BLOB;\n" + _FORGET_STALE_HASH,
    3: "ALTER TABLE messages ADD COLUMN redacted_seq INTEGER;\n"
    "CREATE INDEX messages_body ON messages (body_seq, body_idx);",
}
"""Target version -> SQL script or :data:`REPROJECT`, to go from ``version - 1`` to ``version``.

A new file is created at :data:`VERSION` from :data:`SCHEMA` directly.
"""

SCHEMA: Final = (
    """
CREATE TABLE checkpoint (
    id            INTEGER PRIMARY KEY CHECK (id = 1),
    log_id        TEXT,                       -- hex id of the projected log (NULL until first catch-up)
    last_seq      INTEGER NOT NULL DEFAULT 0, -- last event applied, in the same transaction as its rows
    indexed_upto  INTEGER NOT NULL DEFAULT 0, -- messages.id up to which the search index is current
    last_hash     BLOB                        -- hash of event last_seq: the next one must chain to it
);
INSERT INTO checkpoint (id) VALUES (1);
"""
    + _FORGET_STALE_HASH
    + """
CREATE TABLE sessions (
    id                 TEXT PRIMARY KEY,
    parent_id          TEXT,              -- the session this one was forked from
    fork_position      INTEGER,           -- how many of the parent's messages it shares
    created_seq        INTEGER NOT NULL,
    created_ns         INTEGER NOT NULL,  -- event time (log clock), nanoseconds since the epoch
    closed_seq         INTEGER,
    closed_ns          INTEGER,
    close_reason       TEXT,
    message_count      INTEGER NOT NULL DEFAULT 0,  -- live messages
    head_node          BLOB,              -- node digest of the last live message
    last_seq           INTEGER NOT NULL,  -- last event of this session
    title              TEXT,
    model              TEXT,
    source             TEXT,              -- where the session runs (cli, a chat platform, ...)
    metadata           TEXT NOT NULL DEFAULT '{}',  -- every metadata field, merged (JSON object)
    counters           TEXT NOT NULL DEFAULT '{}',  -- every counter, summed (JSON object)
    input_tokens       INTEGER NOT NULL DEFAULT 0,
    output_tokens      INTEGER NOT NULL DEFAULT 0,
    cache_read_tokens  INTEGER NOT NULL DEFAULT 0,
    cache_write_tokens INTEGER NOT NULL DEFAULT 0,
    reasoning_tokens   INTEGER NOT NULL DEFAULT 0,
    api_calls          INTEGER NOT NULL DEFAULT 0,
    tool_calls         INTEGER NOT NULL DEFAULT 0,
    cost_usd           REAL NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE messages (
    id                  INTEGER PRIMARY KEY,  -- insertion order: (seq, idx) order
    session_id          TEXT NOT NULL,
    position            INTEGER NOT NULL,     -- 0-based place in the session's transcript
    seq                 INTEGER NOT NULL,     -- event that made this row live
    idx                 INTEGER NOT NULL,     -- index in that event's batch (position for fork rows)
    node                BLOB NOT NULL,        -- node digest: the message and its whole prefix
    digest              BLOB NOT NULL,        -- content digest: SHA-256 of the canonical bytes
    body_seq            INTEGER NOT NULL,     -- event and index that hold the stored body
    body_idx            INTEGER NOT NULL,
    summary             INTEGER NOT NULL DEFAULT 0,  -- 1 for a compaction summary
    created_ns          INTEGER NOT NULL,     -- event time (log clock)
    role                TEXT,
    content             TEXT,                 -- text projection (display override applied)
    api_content         TEXT,                 -- wire content when an override replaced it
    tool_calls          TEXT,                 -- JSON
    tool_call_id        TEXT,
    tool_name           TEXT,
    name                TEXT,
    finish_reason       TEXT,
    reasoning           TEXT,                 -- assistant rows only
    reasoning_content   TEXT,                 -- assistant rows only
    reasoning_details   TEXT,                 -- assistant rows only (JSON unless a string)
    timestamp,                                -- as the message gives it (number or text)
    display_kind        TEXT,
    display_metadata    TEXT,
    display_override    TEXT,                 -- the display override recorded in the log (JSON)
    platform_message_id,
    tool_text           TEXT,                 -- tool names and arguments (searchable)
    message             TEXT NOT NULL,        -- the full wire message (JSON)
    tombstone_seq       INTEGER,              -- NULL while live
    tombstone_reason    TEXT,                 -- rewind, compaction, edit, clear
    tombstoned_ns       INTEGER,
    redacted_seq        INTEGER,              -- the MessageRedacted event that erased the body (NULL: not redacted)
    UNIQUE (seq, idx)
);
-- One live row per position; "the live transcript of a session in order".
CREATE UNIQUE INDEX messages_live ON messages (session_id, position) WHERE tombstone_seq IS NULL;
CREATE INDEX messages_session ON messages (session_id, id);
CREATE INDEX messages_platform ON messages (platform_message_id) WHERE platform_message_id IS NOT NULL;
-- Every row of a stored body (the original, fork copies, carried rows): what a redaction marks.
CREATE INDEX messages_body ON messages (body_seq, body_idx);

CREATE VIEW live_messages AS SELECT * FROM messages WHERE tombstone_seq IS NULL;

-- External-content index over the live rows: the text lives once, in messages.
CREATE VIRTUAL TABLE messages_fts USING fts5 (
    content, tool_text,
    content = 'live_messages', content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
-- FTS5 flushes its in-memory term hash to a new segment whenever it exceeds
-- 'hashsize' (1 MiB by default); in a bulk transaction a larger hash means
-- fewer, larger segments and far less merging (about 3x faster indexing).
-- Small transactions are unaffected: the hash is flushed at every commit.
INSERT INTO messages_fts (messages_fts, rank) VALUES ('hashsize', 67108864);
"""
)

OBJECTS: Final = ("messages_fts", "live_messages", "messages", "sessions", "checkpoint")


def version(db: sqlite3.Connection) -> int:
    return int(db.execute("PRAGMA user_version").fetchone()[0])


def create(db: sqlite3.Connection) -> None:
    """Create the current schema (inside the caller's transaction)."""
    for statement in _statements(SCHEMA):
        db.execute(statement)
    db.execute(f"PRAGMA user_version = {VERSION}")


def drop(db: sqlite3.Connection) -> None:
    """Drop every object of the projection (inside the caller's transaction)."""
    for name in OBJECTS:
        kind = db.execute("SELECT type FROM sqlite_master WHERE name = ?", (name,)).fetchone()
        if kind is not None:
            db.execute(f"DROP {kind[0].upper()} {name}")


def refuse_foreign(db: sqlite3.Connection, path: str) -> None:
    """Raise :class:`ProjectionError` for a database that holds tables but no projection
    schema version: another application's file, which must be left as it is."""
    # One statement, so one snapshot: a process creating the schema meanwhile is seen whole.
    current, objects = db.execute(
        "SELECT (SELECT user_version FROM pragma_user_version), (SELECT count(*) FROM sqlite_master)"
    ).fetchone()
    if current == 0 and objects:
        raise NotAProjectionError(
            path, "not a transcript projection (another program's database: it holds tables but no projection schema)"
        )


def migrate(db: sqlite3.Connection, path: str) -> None:
    """Bring the schema to :data:`VERSION` in one ``BEGIN IMMEDIATE`` transaction.

    Raises :class:`SchemaVersionError` when the file was written by a newer version, and
    :class:`ProjectionError` when it is not a projection at all (see :func:`refuse_foreign`).
    """
    if version(db) == VERSION:
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        current = version(db)  # another process may have migrated meanwhile
        if current > VERSION:
            raise SchemaVersionError(f"{path}: projection schema version {current} is newer than this code's {VERSION}")
        if current == 0:
            refuse_foreign(db, path)
            create(db)
            current = VERSION
        while current < VERSION:
            current += 1
            step = MIGRATIONS.get(current, REPROJECT)
            if step == REPROJECT:
                owner = _log_id(db)
                drop(db)
                create(db)
                # Still this log's projection: another log stays refused.
                db.execute("UPDATE checkpoint SET log_id = ?", (owner,))
                break  # create() wrote the latest schema and version
            for statement in _statements(step):
                db.execute(statement)
            db.execute(f"PRAGMA user_version = {current}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _log_id(db: sqlite3.Connection) -> str | None:
    try:
        found = db.execute("SELECT log_id FROM checkpoint").fetchone()
    except sqlite3.OperationalError:  # no checkpoint table in this version
        return None
    return None if found is None else found[0]


def _statements(script: str) -> list[str]:
    """Split a script into statements (``sqlite3.complete_statement`` knows about quotes and triggers)."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        out.append(pending.strip())
    return out
