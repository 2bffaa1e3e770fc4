"""The PostgreSQL schema of the transcript projection, its version and its migrations.

Every table lives in one PostgreSQL schema (``eventlog`` unless told otherwise) and
every row carries its log's id, so many logs, one per host, share one database.  The
version is the one row of ``schema_version``.  Opening a projection creates the schema
or runs the migrations from its version up to :data:`VERSION`, in one transaction
under an advisory lock, so hosts starting together migrate once.  A migration is SQL
or :data:`REPROJECT`: drop the tables and create them anew with no checkpoint, so that
each host's next ``catch_up`` re-projects its log (the projection is derived data).
"""

from __future__ import annotations

from typing import Final

VERSION: Final = 2

REPROJECT: Final = "reproject"
"""A migration that recreates the tables empty: every log is projected again."""

MIGRATIONS: dict[int, str] = {
    2: "ALTER TABLE {schema}.messages ADD COLUMN redacted_seq bigint;\n"
    "CREATE INDEX messages_body ON {schema}.messages (log_id, body_seq, body_idx);\n",
}
"""Target version -> SQL (``{schema}`` stands for the schema's quoted name) or :data:`REPROJECT`."""

SEARCH_CONFIG: Final = "simple"
"""Text search configuration: lowercased words, no stemming and no stop words (as FTS5's
``unicode61``), since transcripts mix languages and code."""

SEARCH_CHARS: Final = 100_000
"""Characters of a row's text that go into its ``tsvector`` (PostgreSQL caps one at 1 MB)."""

SCHEMA: Final = f"""
CREATE TABLE {{schema}}.schema_version (
    version integer NOT NULL
);
INSERT INTO {{schema}}.schema_version VALUES ({VERSION});

-- One row per log: its checkpoint, written in the same transaction as its rows.
CREATE TABLE {{schema}}.checkpoints (
    log_id      text PRIMARY KEY,
    last_seq    bigint NOT NULL DEFAULT 0,  -- last event of this log applied
    last_hash   bytea,                      -- hash of event last_seq: the next one must chain to it
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {{schema}}.sessions (
    log_id             text NOT NULL,
    id                 text NOT NULL,
    parent_id          text,
    fork_position      bigint,
    created_seq        bigint NOT NULL,
    created_ns         bigint NOT NULL,     -- event time (the log's clock), ns since the epoch
    closed_seq         bigint,
    closed_ns          bigint,
    close_reason       text,
    message_count      bigint NOT NULL DEFAULT 0,
    head_node          bytea,
    last_seq           bigint NOT NULL,
    title              text,
    model              text,
    source             text,
    metadata           text NOT NULL DEFAULT '{{{{}}}}',  -- JSON object
    counters           text NOT NULL DEFAULT '{{{{}}}}',  -- JSON object
    input_tokens       numeric NOT NULL DEFAULT 0,
    output_tokens      numeric NOT NULL DEFAULT 0,
    cache_read_tokens  numeric NOT NULL DEFAULT 0,
    cache_write_tokens numeric NOT NULL DEFAULT 0,
    reasoning_tokens   numeric NOT NULL DEFAULT 0,
    api_calls          numeric NOT NULL DEFAULT 0,
    tool_calls         numeric NOT NULL DEFAULT 0,
    cost_usd           double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (log_id, id)
);
CREATE INDEX sessions_created ON {{schema}}.sessions (created_ns);

CREATE TABLE {{schema}}.messages (
    log_id              text NOT NULL,
    session_id          text NOT NULL,
    position            bigint NOT NULL,
    seq                 bigint NOT NULL,
    idx                 bigint NOT NULL,
    node                bytea NOT NULL,
    digest              bytea NOT NULL,
    body_seq            bigint NOT NULL,
    body_idx            bigint NOT NULL,
    summary             smallint NOT NULL DEFAULT 0,
    created_ns          bigint NOT NULL,
    role                text,
    content             text,
    api_content         text,
    tool_calls          text,
    tool_call_id        text,
    tool_name           text,
    name                text,
    finish_reason       text,
    reasoning           text,
    reasoning_content   text,
    reasoning_details   text,
    timestamp           text,             -- as text: the message gives a number or a string
    display_kind        text,
    display_metadata    text,
    display_override    text,
    platform_message_id text,
    tool_text           text,
    message             text NOT NULL,    -- the full wire message (JSON text; jsonb cannot hold \\u0000)
    tombstone_seq       bigint,
    tombstone_reason    text,
    tombstoned_ns       bigint,
    search              tsvector GENERATED ALWAYS AS (
        to_tsvector('{SEARCH_CONFIG}', left(coalesce(content, '') || ' ' || coalesce(tool_text, ''), {SEARCH_CHARS}))
    ) STORED,
    redacted_seq        bigint,           -- the MessageRedacted event that erased the body (NULL: not redacted)
    PRIMARY KEY (log_id, seq, idx)
);
CREATE UNIQUE INDEX messages_live ON {{schema}}.messages (log_id, session_id, position) WHERE tombstone_seq IS NULL;
CREATE INDEX messages_history ON {{schema}}.messages (log_id, session_id, seq, idx);
CREATE INDEX messages_search ON {{schema}}.messages USING gin (search) WHERE tombstone_seq IS NULL;
-- Every row of a stored body (the original, fork copies, carried rows): what a redaction marks.
CREATE INDEX messages_body ON {{schema}}.messages (log_id, body_seq, body_idx);
"""

TABLES: Final = ("messages", "sessions", "checkpoints", "schema_version")


def statements(script: str, schema: str) -> list[str]:
    """The statements of ``script`` for the (already quoted) ``schema``."""
    return [s.strip() for s in script.format(schema=schema).split(";\n") if s.strip()]
