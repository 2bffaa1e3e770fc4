"""The systems under test, behind one small interface, each writing one agent turn at a time.

Every system gets ``open(directory)``, ``turn(session_id, messages, new)`` (the
agent's whole list after the turn, and the turn's new messages) and ``close()``,
and says which durability it gives.  Each writes a turn the way its users do:

- ``eventlog flush``: ``EventLog.flush(sid, messages)``, the whole list each turn;
- ``eventlog append``: ``EventLog.append(sid, new)``;
- ``hermes SessionDB``: hermes-agent's own store (``hermes_state.SessionDB``, FTS5
  triggers, WAL, ``BEGIN IMMEDIATE``).  The agent's current flush collects the
  turn's unmarked messages and writes them in one transaction
  (``append_messages_batch``); the released 0.19 package does not have that method
  yet, so "batch" runs the same statements in one ``SessionDB._execute_write``
  with ``SessionDB._insert_message_rows`` plus the counter update; "per message"
  is what ``run_agent.py`` 0.19 does (one ``append_message`` transaction each);
- ``eventsourcing``: one aggregate per session, one ``MessageAdded`` event per
  message, one ``Application.save`` per turn, SQLite recorder (WAL);
- ``openai-agents SQLiteSession``: ``await session.add_items(new)`` per turn;
- ``plain SQLite``: WAL, ``synchronous=FULL``, one transaction per turn, ``executemany``;
- floors: a 700-byte overwrite + ``fdatasync`` of one file; a bare py-lmdb
  put of the turn's encoded messages + commit; the same with each message's
  content and node digests (the least a content-addressed log computes); and that,
  after the cheapest look at every held message that an in-place edit cannot slip
  past (what the default mode's check costs at least).

SQLite's compiled default here is ``synchronous=FULL`` (checked in :func:`sqlite_synchronous`),
so every SQLite peer syncs its WAL at each commit.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sqlite3
import struct
from collections.abc import Callable
from hashlib import sha256
from pathlib import Path
from typing import Any

import lmdb
import msgspec

from eventlog import EventLog, snapshot

Message = dict[str, Any]
PAIR = struct.Struct(">QQ")
ZERO = bytes(32)


class Skip(Exception):
    """The system cannot run here (a peer is not installed); the message says why."""


class System:
    name = "?"
    durability = "?"
    kind = "ours"  # ours | peer | floor

    def open(self, directory: Path) -> None:
        raise NotImplementedError

    def prepare(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        """Untimed work before a turn that stands for the agent, not the store."""

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Untimed work after a turn: background work the turn started finishes here, so it
        never runs during another system's timed turn (an agent waits for its model then)."""

    def close(self) -> None:
        pass


# -- ours ----------------------------------------------------------------------

DURABILITY_TEXT = {
    "full": "LMDB sync+metasync (power-loss safe)",
    "process": "LMDB sync, no metasync (process-crash safe; an OS crash may undo the last commit)",
    "none": "no fsync (process-crash safe)",
}


def projection_available() -> str | None:
    """None when ``projections.SQLiteProjection`` imports, else why not."""
    try:
        from projections import SQLiteProjection  # noqa: F401
    except ImportError as e:
        return f"the SQLite projection is not available yet ({e})"
    return None


class EventLogSystem(System):
    """Our log: ``flush`` (snapshot) or ``append`` (delta), optional projection.

    ``projection``: None; ``"attached"`` (the call alone: the projection catches up on the
    log's own thread, and that catch-up finishes untimed, before the next turn);
    ``"rows"`` (attached, and each turn is timed until the projection's rows are current);
    ``"search"`` (attached, and each turn waits until the search index is current too: end
    to end).
    """

    def __init__(
        self,
        *,
        durability: str = "full",
        mode: str = "flush",
        trust: bool = False,
        projection: str | None = None,
        pure_python: bool = False,
    ) -> None:
        self.mode = mode
        self.pure_python = pure_python  # the default mode's edit check without its C accelerator
        self.trust = trust
        self.projection_mode = projection
        self.durability = DURABILITY_TEXT[durability] + (
            ", projection: SQLite WAL synchronous=NORMAL" if projection else ""
        )
        self.log_durability = durability
        label = "append" if mode == "append" else ("flush trust" if trust else "flush")
        suffix = {
            None: "",
            "attached": " +projection (call only)",
            "rows": " +projection rows current",
            "search": " +projection+search current",
        }[projection]
        self.name = f"eventlog {label} [{durability}]{suffix}" + (", pure-Python check" if pure_python else "")
        self.log: EventLog | None = None
        self.projection: Any = None

    def open(self, directory: Path) -> None:
        projections = []
        if self.projection_mode:
            reason = projection_available()
            if reason:
                raise Skip(reason)
            from projections import SQLiteProjection

            self.projection = SQLiteProjection(directory / "transcript.db")
            projections.append(self.projection)
        self.log = EventLog.open(
            directory / "log", durability=self.log_durability, trust_identity=self.trust, projections=projections
        )

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        assert self.log is not None
        if self.pure_python:
            accelerated, snapshot.ACCELERATED = snapshot.ACCELERATED, False
            try:
                self._turn(session_id, messages, new)
            finally:
                snapshot.ACCELERATED = accelerated
        else:
            self._turn(session_id, messages, new)

    def _turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        assert self.log is not None
        if self.mode == "append":
            self.log.append(session_id, new)
        else:
            self.log.flush(session_id, messages)
        if self.projection_mode == "rows":
            self.log.sync_projections()
        elif self.projection_mode == "search":
            self.projection.sync_search()

    def settle(self) -> None:
        if self.log is not None:
            self.log.sync_projections()

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self.projection is not None:
            self.projection.close()


# -- peers ---------------------------------------------------------------------


def sqlite_synchronous(conn: sqlite3.Connection) -> str:
    level = conn.execute("PRAGMA synchronous").fetchone()[0]
    mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return f"SQLite {mode.upper()} synchronous={['OFF', 'NORMAL', 'FULL', 'EXTRA'][level]}"


HERMES_MARKER = "_db_persisted"
_HERMES_REASONING = (
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "codex_reasoning_items",
    "codex_message_items",
)


class HermesSystem(System):
    """hermes-agent's ``SessionDB``, written per turn the way the agent's flush does.

    The agent scans its list, skips dicts stamped with its "persisted" marker,
    builds a row per new message, writes the rows, then stamps the marker on each
    dict.  It gets its own deep copy of the workload, so its marker never touches
    the dicts that other systems see.
    """

    kind = "peer"

    def __init__(self, *, batch: bool = True) -> None:
        self.batch = batch
        self.name = "hermes SessionDB " + ("(one txn per turn)" if batch else "(one txn per message, as released)")
        self.durability = "?"
        self._copies: dict[int, Message] = {}
        self._created: set[str] = set()

    def open(self, directory: Path) -> None:
        try:
            from hermes_state import SessionDB
        except ImportError as e:
            raise Skip(f"hermes-agent is not installed ({e}); pip install -e '.[bench]'") from None
        self.db = SessionDB(db_path=directory / "state.db")
        self.durability = sqlite_synchronous(self.db._conn) + " + FTS5 triggers"
        self._list: dict[str, list[Message]] = {}

    def _own(self, session_id: str, messages: list[Message]) -> list[Message]:
        own = self._list.setdefault(session_id, [])
        for message in messages[len(own) :]:
            own.append(copy.deepcopy(message))
        return own

    def prepare(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        # The copy stands for the agent's own list; making it is not the store's cost.
        self._own(session_id, messages)

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        self._flush(session_id, self._own(session_id, messages))

    def _flush(self, session_id: str, messages: list[Message]) -> None:
        db = self.db
        if session_id not in self._created:
            db.create_session(session_id, source="cli")
            self._created.add(session_id)
        rows: list[Message] = []
        written: list[Message] = []
        for message in messages:
            if message.get(HERMES_MARKER):
                continue
            role = message.get("role", "unknown")
            rows.append(
                {
                    "role": role,
                    "content": message.get("content"),
                    "tool_name": message.get("tool_name"),
                    "tool_calls": message["tool_calls"] if isinstance(message.get("tool_calls"), list) else None,
                    "tool_call_id": message.get("tool_call_id"),
                    "finish_reason": message.get("finish_reason"),
                    **{k: message.get(k) for k in _HERMES_REASONING},
                    "timestamp": message.get("timestamp"),
                    "api_content": None,
                    "platform_message_id": message.get("platform_message_id"),
                }
            )
            written.append(message)
        if not rows:
            return
        if self.batch:

            def write(conn: sqlite3.Connection) -> None:
                count, calls = db._insert_message_rows(conn, session_id, rows)
                conn.execute(
                    "UPDATE sessions SET message_count = message_count + ?, tool_call_count = tool_call_count + ? WHERE id = ?",
                    (count, calls, session_id),
                )

            db._execute_write(write)
        else:
            for row in rows:
                db.append_message(
                    session_id=session_id,
                    role=row["role"],
                    content=row["content"],
                    tool_name=row["tool_name"],
                    tool_calls=row["tool_calls"],
                    tool_call_id=row["tool_call_id"],
                    finish_reason=row["finish_reason"],
                    reasoning=row["reasoning"] if row["role"] == "assistant" else None,
                    reasoning_content=row["reasoning_content"] if row["role"] == "assistant" else None,
                    reasoning_details=row["reasoning_details"] if row["role"] == "assistant" else None,
                    timestamp=row["timestamp"],
                )
        for message in written:
            message[HERMES_MARKER] = True

    def close(self) -> None:
        self.db.close()


_TRANSCRIPT: Any = None


def _transcript_aggregate() -> Any:
    """The aggregate class, defined once: eventsourcing registers each class under its topic."""
    global _TRANSCRIPT
    if _TRANSCRIPT is None:
        from eventsourcing.domain import Aggregate, event

        class Transcript(Aggregate):
            def __init__(self, session_id: str) -> None:
                self.session_id = session_id
                self.length = 0

            @event("MessageAdded")
            def add_message(self, message: dict) -> None:
                self.length += 1

        _TRANSCRIPT = Transcript
    return _TRANSCRIPT


class EventSourcingSystem(System):
    """``eventsourcing``: an aggregate per session, a ``MessageAdded`` event per message, one save per turn."""

    kind = "peer"
    name = "eventsourcing (SQLite)"

    def open(self, directory: Path) -> None:
        try:
            from eventsourcing.application import Application
        except ImportError as e:
            raise Skip(f"eventsourcing is not installed ({e}); pip install -e '.[bench]'") from None
        self._transcript = _transcript_aggregate()
        self.app = Application(
            env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": str(directory / "es.db")}
        )
        self.aggregates: dict[str, Any] = {}
        conn = sqlite3.connect(directory / "es.db")
        try:
            self.durability = sqlite_synchronous(conn)
        finally:
            conn.close()

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        aggregate = self.aggregates.get(session_id)
        if aggregate is None:
            aggregate = self.aggregates[session_id] = self._transcript(session_id)
        for message in new:
            aggregate.add_message(message)
        self.app.save(aggregate)

    def close(self) -> None:
        self.app.close()


class OpenAISessionSystem(System):
    """OpenAI Agents SDK ``SQLiteSession.add_items`` per turn, driven by one event loop."""

    kind = "peer"
    name = "openai-agents SQLiteSession"

    def open(self, directory: Path) -> None:
        try:
            from agents.memory import SQLiteSession
        except ImportError as e:
            raise Skip(f"openai-agents is not installed ({e}); pip install -e '.[bench]'") from None
        self._cls = SQLiteSession
        self.path = directory / "openai.db"
        self.sessions: dict[str, Any] = {}
        self.loop = asyncio.new_event_loop()
        probe = SQLiteSession("probe", self.path)
        probe.close()
        conn = sqlite3.connect(self.path)
        try:
            self.durability = sqlite_synchronous(conn)
        finally:
            conn.close()

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        session = self.sessions.get(session_id)
        if session is None:
            session = self.sessions[session_id] = self._cls(session_id, self.path)
        self.loop.run_until_complete(session.add_items(new))

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.loop.close()


class PlainSQLiteSystem(System):
    """The baseline anyone would write: WAL, synchronous=FULL, executemany of JSON rows per turn."""

    kind = "peer"
    name = "plain SQLite"

    def open(self, directory: Path) -> None:
        self.db = sqlite3.connect(directory / "plain.db", isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute(
            "CREATE TABLE messages (session_id TEXT NOT NULL, position INTEGER NOT NULL, role TEXT, body TEXT NOT NULL, "
            "PRIMARY KEY (session_id, position))"
        )
        self.durability = sqlite_synchronous(self.db)
        self.lengths: dict[str, int] = {}

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        start = self.lengths.get(session_id, 0)
        rows = [(session_id, start + i, m.get("role"), json.dumps(m)) for i, m in enumerate(new)]
        self.db.execute("BEGIN")
        self.db.executemany("INSERT INTO messages VALUES (?, ?, ?, ?)", rows)
        self.db.execute("COMMIT")
        self.lengths[session_id] = start + len(new)

    def close(self) -> None:
        self.db.close()


# -- physical floors -------------------------------------------------------------


class RawFsyncSystem(System):
    """One 700-byte overwrite of a file and ``fdatasync``: what one durable write costs at least."""

    kind = "floor"
    name = "floor: 700 B overwrite + fdatasync"
    durability = "fdatasync"

    def open(self, directory: Path) -> None:
        self.fd = os.open(directory / "raw.bin", os.O_RDWR | os.O_CREAT, 0o644)
        self.block = os.urandom(700)
        os.pwrite(self.fd, self.block, 0)
        os.fsync(self.fd)

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        os.pwrite(self.fd, self.block, 0)
        os.fdatasync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


LMDB_FLAGS = {"full": (True, True), "process": (True, False), "none": (False, False)}


class BareLMDBSystem(System):
    """A bare py-lmdb environment: the turn's messages, canonically encoded, put under (session, position) and committed.

    ``addressed``: each message is stored with its content and node digests, computed in the
    turn: the least a content-addressed log does before its commit.
    """

    kind = "floor"

    def __init__(self, durability: str = "full", *, addressed: bool = False) -> None:
        self.mode = durability
        self.addressed = addressed
        what = "content-addressed py-lmdb" if addressed else "bare py-lmdb"
        self.name = f"floor: {what} put+commit [{durability}]"
        self.durability = DURABILITY_TEXT[durability]
        self.encode: Callable[[Any], bytes] = msgspec.msgpack.Encoder(order="deterministic").encode

    def open(self, directory: Path) -> None:
        sync, metasync = LMDB_FLAGS[self.mode]
        self.env = lmdb.open(str(directory / "bare"), map_size=4 << 30, sync=sync, metasync=metasync, max_dbs=2)
        self.db = self.env.open_db(b"messages")
        self.zeroer = Preallocation(self.env, directory / "bare" / "data.mdb") if sync else None
        self.lengths: dict[str, int] = {}
        self.numbers: dict[str, int] = {}
        self.heads: dict[str, bytes] = {}

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        if self.addressed:
            self.write_addressed(session_id, new)
        else:
            self.write(session_id, [self.encode(m) for m in new])

    def write(self, session_id: str, bodies: list[bytes]) -> None:
        number = self.numbers.setdefault(session_id, len(self.numbers))
        start = self.lengths.get(session_id, 0)
        with self.env.begin(write=True, db=self.db) as txn:
            if self.zeroer is not None:
                self.zeroer.keep_ahead()
            for i, body in enumerate(bodies):
                txn.put(PAIR.pack(number, start + i), body, append=False)
        self.lengths[session_id] = start + len(bodies)

    def write_addressed(self, session_id: str, messages: list[Message]) -> None:
        """:meth:`write` of ``messages`` encoded here, each with its content and node digests."""
        parent = self.heads.get(session_id, ZERO)
        bodies = []
        for message in messages:
            body = self.encode(message)
            digest = sha256(body).digest()
            parent = sha256(parent + digest).digest()
            bodies.append(parent + digest + body)
        self.write(session_id, bodies)
        self.heads[session_id] = parent

    def close(self) -> None:
        if self.zeroer is not None:
            self.zeroer.close()
        self.env.close()


class Preallocation:
    """The product's zeroed space ahead of LMDB, for the floors: a synced commit that writes into
    blocks that already exist skips the file system's journal commit for new blocks and a new
    file size, so a floor without it would do more work than the product, not less.  Same policy
    as the log's: steps of half the file's size, 256 KiB to 8 MiB, topped up when less than a
    quarter of a step is left, written inside the write transaction."""

    MIN_STEP = 256 * 1024
    MAX_STEP = 8 << 20
    ZEROS = bytes(1 << 20)

    def __init__(self, env: lmdb.Environment, data: Path) -> None:
        self.env = env
        self.fd = os.open(data, os.O_WRONLY)
        self.page = env.stat()["psize"]
        self.zeroed = 0

    def keep_ahead(self) -> None:
        info = self.env.info()
        used = (info["last_pgno"] + 1) * self.page
        step = min(self.MAX_STEP, max(self.MIN_STEP, used // 2))
        if self.zeroed - used >= step // 4:
            return
        size = os.fstat(self.fd).st_size
        end = min(info["map_size"], max(size, used) + step)
        offset = size
        while offset < end:
            offset += os.pwrite(self.fd, self.ZEROS[: min(len(self.ZEROS), end - offset)], offset)
        os.fdatasync(self.fd)
        self.zeroed = end

    def close(self) -> None:
        os.close(self.fd)


class InPlaceCheckFloor(BareLMDBSystem):
    """What a snapshot flush that must notice in-place edits costs at least: every held message
    checked against what it was, then a content-addressed commit of the turn (as ``addressed``).

    The check is the product's own (:func:`eventlog.snapshot.remember` when a message first
    arrives, untimed, and :func:`~eventlog.snapshot.first_changed` over the caller's list, in C
    where it was built): it looks at every held message once (on CPython 3.11 a dict left alone
    is known by its version, unread), compares leaves by identity (no text is read) and numbers
    exactly, so it catches every edit the product catches (a plain ``==`` would take ``True``
    for ``1`` and ``-0.0`` for ``0.0``, whose canonical bytes differ) and does nothing else.  ``check=False`` leaves it out (for :class:`TranscriptFloor`).
    """

    def __init__(self, durability: str = "full", *, check: bool = True) -> None:
        super().__init__(durability, addressed=True)
        self.check = check
        self.name = f"floor: in-place check + content-addressed put+commit [{durability}]"
        self.copies: list[Message] = []

    def prepare(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        if self.check:
            self.copies.extend(map(snapshot.remember, new))

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        if self.check and snapshot.first_changed(self.copies, messages, 0, len(messages)) < len(messages):
            raise AssertionError("a held message changed under the benchmark")
        super().turn(session_id, messages, new)


class TranscriptFloor(InPlaceCheckFloor):
    """The least a turn costs until its transcript rows and their search index are current too:
    the turn of :class:`InPlaceCheckFloor` (with or without its ``check``), then SQLite alone
    writing the turn's rows, derived untimed beforehand, into the projection's own schema with
    its settings and statements, and indexing them for search, in one transaction.  With
    ``search=False``, the rows only: the least a turn costs until its rows are current."""

    def __init__(self, durability: str = "full", *, check: bool, search: bool = True) -> None:
        super().__init__(durability, check=check)
        self.search = search
        looked = "in-place check + " if check else ""
        written = "SQLite rows and FTS5" if search else "SQLite rows"
        self.name = f"floor: {looked}content-addressed put+commit + {written} [{durability}]"
        self.durability += ", projection: SQLite WAL synchronous=NORMAL"

    def open(self, directory: Path) -> None:
        reason = projection_available()
        if reason:
            raise Skip(reason)
        from projections import SQLiteProjection
        from projections.rows import derive
        from projections.sqlite_store import INSERT_ROW, index_pending

        super().open(directory)
        self.projection = SQLiteProjection(directory / "transcript.db")  # the projection's schema and settings
        self.insert, self.index, self.derive = INSERT_ROW, index_pending, derive
        self.rows: list[tuple[Any, ...]] = []
        self.indexed = 0
        self.seq = 0

    def prepare(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        super().prepare(session_id, messages, new)
        self.seq += 1
        start = len(messages) - len(new)
        self.rows = [
            (session_id, start + i, self.seq, i, ZERO, ZERO, self.seq, i, 0, self.seq, None, *self.derive(m, None))
            for i, m in enumerate(new)
        ]

    def turn(self, session_id: str, messages: list[Message], new: list[Message]) -> None:
        super().turn(session_id, messages, new)
        db = self.projection._db
        db.execute("BEGIN IMMEDIATE")
        db.executemany(self.insert, self.rows)
        if self.search:
            self.indexed = self.index(db, self.indexed)
        db.execute("COMMIT")

    def close(self) -> None:
        super().close()
        self.projection.close()
