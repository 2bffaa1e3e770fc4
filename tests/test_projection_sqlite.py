"""The SQLite projection: schema, exactly-once catch-up, rows, overrides, sessions and search."""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog, EventLogError
from projections import (
    InvalidQueryError,
    LogMismatchError,
    ProjectionCorruptError,
    ProjectionError,
    SchemaVersionError,
    SQLiteProjection,
    schema,
)

DOCS = Path(__file__).resolve().parent.parent / "docs" / "projection.md"


def dump(path: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows in key order, and the search index's logical content."""
    db = sqlite3.connect(path)
    try:
        out = {
            "checkpoint": db.execute("SELECT * FROM checkpoint").fetchall(),
            "sessions": db.execute("SELECT * FROM sessions ORDER BY id").fetchall(),
            "messages": db.execute("SELECT * FROM messages ORDER BY id").fetchall(),
            "user_version": db.execute("PRAGMA user_version").fetchall(),
        }
        db.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, messages_fts, instance)")
        out["fts"] = db.execute("SELECT * FROM temp.vocab ORDER BY term, doc, col, offset").fetchall()
        return out
    finally:
        db.close()


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def assistant(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


@pytest.fixture
def log(tmp_path: Path):
    with EventLog.open(tmp_path / "log", durability="none") as opened:
        yield opened


@pytest.fixture
def proj(tmp_path: Path):
    projection = SQLiteProjection(tmp_path / "transcript.db", search_lag=0)
    yield projection
    projection.close()


def wire(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(row["message"]) for row in rows]


# -- schema ---------------------------------------------------------------------


def test_new_database_has_current_schema_in_wal_mode(tmp_path: Path) -> None:
    SQLiteProjection(tmp_path / "p.db").close()
    db = sqlite3.connect(tmp_path / "p.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    names = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
    assert {"checkpoint", "sessions", "messages", "live_messages", "messages_fts", "messages_live"} <= names
    assert db.execute("SELECT log_id, last_seq, indexed_upto FROM checkpoint").fetchall() == [(None, 0, 0)]


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    SQLiteProjection(tmp_path / "p.db").close()
    db = sqlite3.connect(tmp_path / "p.db")
    db.execute(f"PRAGMA user_version = {schema.VERSION + 1}")
    db.close()
    with pytest.raises(SchemaVersionError, match="newer"):
        SQLiteProjection(tmp_path / "p.db")


def test_another_applications_database_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    db = sqlite3.connect(path)
    db.executescript(
        "CREATE TABLE sessions (id TEXT PRIMARY KEY);"
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, content TEXT);"
        "INSERT INTO messages (content) VALUES ('the app''s own data');"
    )
    db.commit()
    db.close()
    before = path.read_bytes()
    with pytest.raises(ProjectionError, match="not a transcript projection"):
        SQLiteProjection(path)
    assert path.read_bytes() == before  # not even switched to WAL mode
    db = sqlite3.connect(path)
    assert db.execute("SELECT content FROM messages").fetchall() == [("the app's own data",)]
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    db.close()


def test_processes_opening_a_new_projection_together_all_succeed(tmp_path: Path) -> None:
    """Two processes creating the same projection file at the same moment: each may hold a lock
    the other needs (to switch to WAL mode, to create the schema), and SQLite answers "locked"
    at once instead of waiting.  Both opens must succeed all the same."""
    import subprocess

    from crashkit import child_env

    opener = (
        "import sys, time\n"
        "from projections import SQLiteProjection\n"
        "start = float(sys.argv[2])\n"
        "time.sleep(max(0.0, start - time.time()))\n"
        "SQLiteProjection(sys.argv[1]).close()\n"
    )
    failures = []
    for round_ in range(6):
        start = time.time() + 0.6  # after both interpreters have started
        path = str(tmp_path / f"p{round_}.db")
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", opener, path, repr(start)], env=child_env(), stderr=subprocess.PIPE, text=True
            )
            for _ in range(2)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            if proc.returncode:
                failures.append(err.strip().splitlines()[-1])
        with SQLiteProjection(path) as proj:
            assert proj.sessions() == []
    assert not failures, failures


def test_an_empty_database_file_becomes_a_projection(tmp_path: Path) -> None:
    sqlite3.connect(tmp_path / "empty.db").close()
    SQLiteProjection(tmp_path / "empty.db").close()
    assert schema.version(sqlite3.connect(tmp_path / "empty.db")) == schema.VERSION


def test_sql_migration_runs_once_and_keeps_rows(tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch) -> None:
    log.flush("s", [user("hello")])
    with SQLiteProjection(tmp_path / "p.db") as first:
        first.catch_up(log)
    monkeypatch.setattr(schema, "VERSION", schema.VERSION + 1)
    monkeypatch.setitem(schema.MIGRATIONS, schema.VERSION, "ALTER TABLE sessions ADD COLUMN note TEXT;")
    with SQLiteProjection(tmp_path / "p.db") as migrated:
        assert migrated.catch_up(log) == 0  # the rows and checkpoint survived
        assert migrated.sessions()[0]["note"] is None
        assert [r["content"] for r in migrated.messages("s")] == ["hello"]
    with SQLiteProjection(tmp_path / "p.db") as again:  # already at the new version: nothing runs twice
        assert again.sessions()[0]["note"] is None
    assert sqlite3.connect(tmp_path / "p.db").execute("PRAGMA user_version").fetchone()[0] == schema.VERSION


def test_reproject_migration_resets_and_catch_up_rebuilds(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.flush("s", [user("hello"), assistant("hi")])
    with SQLiteProjection(tmp_path / "p.db") as first:
        first.catch_up(log)
    before = dump(tmp_path / "p.db")
    monkeypatch.setattr(schema, "VERSION", schema.VERSION + 1)
    monkeypatch.setitem(schema.MIGRATIONS, schema.VERSION, schema.REPROJECT)
    with SQLiteProjection(tmp_path / "p.db") as migrated:
        assert migrated.messages("s") == []
        with EventLog.open(tmp_path / "other") as other, pytest.raises(LogMismatchError):
            migrated.catch_up(other)  # still this log's projection
        assert migrated.catch_up(log) == log.last_seq
    after = dump(tmp_path / "p.db")
    assert after.pop("user_version") != before.pop("user_version")
    assert after == before


# -- exactly-once catch-up ----------------------------------------------------------


def test_catch_up_counts_events_and_is_idempotent(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("a"), assistant("b")])
    assert proj.catch_up(log) == log.last_seq
    assert proj.catch_up(log) == 0
    log.flush("s", [user("a"), assistant("b"), user("c")])
    assert proj.catch_up(log) == 1
    assert proj.last_seq == log.last_seq
    assert len(proj.messages("s")) == 3


def test_attached_projection_reads_its_writes(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", projections=[proj]) as log:
        log.flush("s", [user("one")])
        assert [r["content"] for r in proj.messages("s")] == ["one"]
        log.flush("s", [user("one"), assistant("two")])
        assert [r["content"] for r in proj.messages("s")] == ["one", "two"]
        assert [h["content"] for h in proj.search("two")] == ["two"]
    proj.close()


def test_projection_of_another_log_is_refused(tmp_path: Path, log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("a")])
    proj.catch_up(log)
    with EventLog.open(tmp_path / "other") as other:
        other.flush("s", [user("b")])
        with pytest.raises(LogMismatchError, match=other.id) as info:
            proj.catch_up(other)
        assert isinstance(info.value, EventLogError)
        assert [r["content"] for r in proj.messages("s")] == ["a"]
        assert proj.rebuild(other) == other.last_seq  # on purpose: adopt the other log
        assert [r["content"] for r in proj.messages("s")] == ["b"]
        with pytest.raises(LogMismatchError):
            proj.catch_up(log)


def test_an_empty_other_log_is_refused_too(tmp_path: Path, log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("a")])
    proj.catch_up(log)
    with EventLog.open(tmp_path / "other") as other, pytest.raises(LogMismatchError):
        proj.catch_up(other)


def test_a_log_restored_from_an_older_copy_is_refused_once_written_past_the_checkpoint(tmp_path: Path) -> None:
    """Events after the checkpoint must chain to the event the projection applied last: a log
    restored from a backup and written again has other events at those numbers."""
    import shutil

    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("a", [user("hello")])
    shutil.copytree(tmp_path / "log", tmp_path / "backup")
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("b", [user("lost with the restore")])
        proj.catch_up(log)
    shutil.rmtree(tmp_path / "log")
    shutil.copytree(tmp_path / "backup", tmp_path / "log")
    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("c", [user("new")])
        log.flush("d", [user("more")])
        with pytest.raises(LogMismatchError, match="history differs"):
            proj.catch_up(log)
        assert proj.rebuild(log) == log.last_seq
        assert sorted(s["id"] for s in proj.sessions()) == sorted(log.sessions())
    proj.close()


def test_the_checkpoint_gains_the_last_events_hash_by_migration(tmp_path: Path, log: EventLog) -> None:
    """A projection written before the checkpoint held the last event's hash is migrated in
    place, keeps its rows, and checks the chain from its next catch-up on."""
    log.flush("s", [user("a")])
    with SQLiteProjection(tmp_path / "p.db") as proj:
        proj.catch_up(log)
    db = sqlite3.connect(tmp_path / "p.db")  # back to what version 1 wrote
    db.execute("DROP TRIGGER checkpoint_stale_hash")
    db.execute("ALTER TABLE checkpoint DROP COLUMN last_hash")
    db.execute("DROP INDEX messages_body")
    db.execute("ALTER TABLE messages DROP COLUMN redacted_seq")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    log.flush("s", [user("a"), assistant("b")])
    with SQLiteProjection(tmp_path / "p.db") as proj:
        assert proj.catch_up(log) == 1
        assert [r["content"] for r in proj.messages("s")] == ["a", "b"]
    db = sqlite3.connect(tmp_path / "p.db")
    assert db.execute("PRAGMA user_version").fetchone()[0] == schema.VERSION
    assert db.execute("SELECT last_hash FROM checkpoint").fetchone()[0] == list(log.events())[-1].hash
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'checkpoint_stale_hash'").fetchone()[0] == 1
    db.close()


def test_a_checkpoint_moved_without_its_hash_forgets_the_hash(tmp_path: Path, log: EventLog) -> None:
    """Code of schema version 1, still running in another process, moves ``last_seq`` and knows
    nothing of ``last_hash``: the hash no longer names the last event and must not be checked."""
    log.flush("s", [user("a")])
    proj = SQLiteProjection(tmp_path / "p.db")
    proj.catch_up(log)
    log.flush("s", [user("a"), assistant("b")])
    other = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    other.execute("UPDATE checkpoint SET last_seq = last_seq + 1")  # as the older code records one more event
    assert other.execute("SELECT last_hash FROM checkpoint").fetchone()[0] is None
    other.execute("UPDATE checkpoint SET last_seq = last_seq - 1")  # (undone, so this process applies it)
    other.close()
    log.flush("s", [user("a"), assistant("b"), user("c")])
    assert proj.catch_up(log) == 2  # no stale hash to refuse it with
    assert [r["content"] for r in proj.messages("s")] == ["a", "b", "c"]
    db = sqlite3.connect(tmp_path / "p.db")
    assert db.execute("SELECT last_hash FROM checkpoint").fetchone()[0] == list(log.events())[-1].hash
    db.close()
    proj.close()


@pytest.mark.parametrize("ahead", [1, 2])
def test_a_checkpoint_moved_forward_without_its_hash_is_refused(tmp_path: Path, log: EventLog, ahead: int) -> None:
    """A checkpoint moved past events whose rows were never written (by hand, a tool, or the
    schema-version-1 trigger clearing the hash) must not make catch-up skip those events."""
    log.flush("s", [user("a")])
    proj = SQLiteProjection(tmp_path / "p.db")
    proj.catch_up(log)
    log.flush("s", [user("a"), assistant("b")])
    log.flush("t", [user("c")])
    other = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    other.execute("UPDATE checkpoint SET last_seq = last_seq + ?", (ahead,))
    assert other.execute("SELECT last_hash FROM checkpoint").fetchone()[0] is None
    other.close()
    with pytest.raises(ProjectionCorruptError, match="checkpoint"):
        proj.catch_up(log)
    assert [r["content"] for r in proj.messages("s")] == ["a"]  # nothing applied on top of it
    assert proj.rebuild(log) == log.last_seq
    assert [r["content"] for r in proj.messages("s")] == ["a", "b"]
    proj.close()


class Interleaved:
    """A log whose event stream lets another projection catch up after the first event read."""

    def __init__(self, log: EventLog, other: SQLiteProjection) -> None:
        self.log = log
        self.other = other
        self.id = log.id
        self.last_seq = log.last_seq

    def events(self, after: int = 0):
        for i, record in enumerate(self.log.events(after)):
            if i == 1:
                self.other.catch_up(self.log)  # another process applies everything meanwhile
            yield record


def test_concurrent_catch_up_applies_each_event_once(tmp_path: Path, log: EventLog) -> None:
    for turn in range(5):
        log.flush("s", [user(f"m{i}") for i in range(turn + 1)])
    a = SQLiteProjection(tmp_path / "p.db", batch=2)
    b = SQLiteProjection(tmp_path / "p.db")
    applied = a.catch_up(Interleaved(log, b))
    assert applied < log.last_seq  # a skipped what b had applied
    assert a.catch_up(log) == 0 and b.catch_up(log) == 0
    a.close(), b.close()
    with SQLiteProjection(tmp_path / "rebuilt.db") as fresh:
        fresh.rebuild(log)
    assert dump(tmp_path / "p.db") == dump(tmp_path / "rebuilt.db")


def test_threads_catching_up_one_file(tmp_path: Path, log: EventLog) -> None:
    for turn in range(30):
        log.flush(f"s{turn % 3}", [user(f"m{i}") for i in range(turn // 3 + 1)])
    projections = [SQLiteProjection(tmp_path / "p.db", batch=3) for _ in range(4)]
    counts: list[int] = []
    threads = [threading.Thread(target=lambda p=p: counts.append(p.catch_up(log))) for p in projections]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counts) == log.last_seq
    for p in projections:
        p.close()
    with SQLiteProjection(tmp_path / "rebuilt.db") as fresh:
        fresh.rebuild(log)
    assert dump(tmp_path / "p.db") == dump(tmp_path / "rebuilt.db")


def test_one_attached_projection_under_concurrent_writers(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db", search_lag=7)
    with EventLog.open(tmp_path / "log", durability="none", projections=[proj]) as log:

        def writer(n: int) -> None:
            msgs: list[dict[str, Any]] = []
            for turn in range(15):
                msgs += [user(f"w{n} turn {turn}"), assistant(f"reply {turn}")]
                log.flush(f"s{n}", msgs)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert proj.last_seq == log.last_seq
        for sid in log.sessions():
            assert wire(proj.messages(sid)) == log.messages(sid)
        proj.close()
        with SQLiteProjection(tmp_path / "full.db") as full:
            full.rebuild(log)
    assert dump(tmp_path / "p.db") == dump(tmp_path / "full.db")


class Failing:
    """A log whose event stream breaks after ``n`` events (a crash in the middle of a batch)."""

    def __init__(self, log: EventLog, n: int) -> None:
        self.log, self.n, self.id, self.last_seq = log, n, log.id, log.last_seq

    def events(self, after: int = 0):
        for i, record in enumerate(self.log.events(after)):
            if i == self.n:
                raise OSError("simulated crash")
            yield record


def _counts_seen_by_a_reader(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch, query: str
) -> list[int]:
    """Catch ``proj`` up and return what a reader of the file counted with ``query`` after
    each transaction of the catch-up."""
    reader = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    seen: list[int] = []
    write = proj._write

    @contextlib.contextmanager
    def watched():
        with write():
            yield
        seen.append(reader.execute(query).fetchone()[0])

    monkeypatch.setattr(proj, "_write", watched)
    proj.catch_up(log)
    monkeypatch.undo()
    reader.close()
    proj.close()
    return seen


def test_catch_up_never_shows_readers_part_of_a_write(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catch-up commits in chunks of about ``batch`` messages, but never inside one write of
    the log: a compaction's tombstones and its summary become visible together."""
    log.flush("s", [user(f"m{i}") for i in range(30)])
    proj = SQLiteProjection(tmp_path / "p.db", batch=50)
    proj.catch_up(log)
    log.flush(
        "big", [user(f"b{i}") for i in range(48)]
    )  # with its opening, the chunk is full right after the tombstones
    log.compact("s", start=0, end=29, summary=[user("summary")])
    seen = _counts_seen_by_a_reader(
        tmp_path, log, proj, monkeypatch, "SELECT count(*) FROM live_messages WHERE session_id = 's'"
    )
    assert seen and set(seen) <= {30, 2}, f"a reader saw session s with {seen} live rows (the log: 30, then 2)"


def test_catch_up_shows_readers_all_of_a_flush_many_or_none(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sessions of one flush_many are one write: a reader sees all of them or none."""
    proj = SQLiteProjection(tmp_path / "p.db", batch=5)
    log.flush_many({f"agent-{i}": [user(f"q{i}"), assistant(f"a{i}")] for i in range(6)})
    seen = _counts_seen_by_a_reader(tmp_path, log, proj, monkeypatch, "SELECT count(*) FROM live_messages")
    assert seen and set(seen) <= {0, 12}, f"a reader saw {seen} live rows of the 12 one flush_many wrote"


def test_catch_up_chunks_stay_bounded_when_the_clock_stands_still(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writes are told apart by their time; a clock frozen by a test framework must not turn a
    catch-up into one transaction of everything."""
    import eventlog.store

    monkeypatch.setattr(eventlog.store.time, "time_ns", lambda: 1_700_000_000_000_000_000)
    with EventLog.open(tmp_path / "log", durability="none") as log:
        for i in range(200):
            log.flush(f"s{i % 7}", [user(f"m{j}") for j in range(i // 7 + 1)])
        proj = SQLiteProjection(tmp_path / "p.db", batch=10)
        sizes: list[int] = []
        apply_chunk = proj._apply_chunk
        monkeypatch.setattr(
            proj,
            "_apply_chunk",
            lambda store, applier, last, chunk: sizes.append(len(chunk)) or apply_chunk(store, applier, last, chunk),
        )
        assert proj.catch_up(log) == log.last_seq
        proj.close()
        assert sum(sizes) == log.last_seq and max(sizes) <= 80, sizes


def test_failed_batch_rolls_back_with_its_checkpoint(tmp_path: Path, log: EventLog) -> None:
    for turn in range(6):
        log.flush("s", [user(f"m{i}") for i in range(turn + 1)])
    proj = SQLiteProjection(tmp_path / "p.db", batch=4)
    with pytest.raises(OSError):
        proj.catch_up(Failing(log, 6))
    # Whole batches committed, the broken one left nothing behind.
    assert proj.last_seq == 4  # the session was opened, then three flushes
    assert len(proj.messages("s")) == 3
    proj.catch_up(log)
    proj.close()
    with SQLiteProjection(tmp_path / "rebuilt.db") as fresh:
        fresh.rebuild(log)
    assert dump(tmp_path / "p.db") == dump(tmp_path / "rebuilt.db")


def test_rows_disagreeing_with_events_are_reported_and_rebuild_repairs(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection
) -> None:
    log.flush("s", [user("a"), assistant("b")])
    proj.catch_up(log)
    db = sqlite3.connect(tmp_path / "transcript.db")
    db.execute("DELETE FROM messages WHERE position = 1")
    db.commit()
    db.close()
    log.rewind("s", to=1)
    with pytest.raises(ProjectionCorruptError):
        proj.catch_up(log)
    proj.rebuild(log)
    assert wire(proj.messages("s")) == log.messages("s")


def test_rebuild_equals_incremental(tmp_path: Path, log: EventLog) -> None:
    inc = SQLiteProjection(tmp_path / "inc.db", search_lag=3)
    msgs = [user("alpha"), assistant("beta")]
    log.flush("s", msgs)
    inc.catch_up(log)
    log.flush("s", msgs + [user("gamma")], overrides={2: {"content": "GAMMA"}})
    inc.catch_up(log)
    log.fork("s", "t", at=2)
    log.compact("s", start=0, end=2, summary=[user("summary")])
    inc.catch_up(log)
    log.update_session("t", title="fork", cost_usd=0.25)
    log.close_session("t", reason="done")
    inc.catch_up(log)
    inc.close()
    with SQLiteProjection(tmp_path / "full.db") as full:
        full.rebuild(log)
    assert dump(tmp_path / "inc.db") == dump(tmp_path / "full.db")


def test_rebuild_is_one_transaction(tmp_path: Path, log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("old")])
    proj.catch_up(log)
    with pytest.raises(OSError):
        proj.rebuild(Failing(log, 1))
    assert [r["content"] for r in proj.messages("s")] == ["old"]  # the old projection is intact


def _journal_during_rebuild(proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    inner = proj._rebuild

    def spy(log: Any) -> int:
        seen.append(proj._db.execute("PRAGMA journal_mode").fetchone()[0])
        return inner(log)

    monkeypatch.setattr(proj, "_rebuild", spy)
    return seen


def test_rebuild_alone_writes_past_the_wal_and_returns_to_it(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.flush("s", [user("one"), assistant("two")])
    seen = _journal_during_rebuild(proj, monkeypatch)
    proj.rebuild(log)
    assert seen == ["delete"]
    assert proj._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert proj._db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL again
    assert [r["content"] for r in proj.search("two")] == ["two"]


def test_rebuild_of_a_projection_in_use_keeps_the_wal_unless_told(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.flush("s", [user("one")])
    proj.catch_up(log)  # something for readers to see: by default a rebuild keeps them reading
    seen = _journal_during_rebuild(proj, monkeypatch)
    proj.rebuild(log)
    proj.rebuild(log, exclusive=True)
    assert seen == ["wal", "delete"]
    assert proj._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_an_exclusive_rebuild_whose_commit_a_reader_blocks_rolls_back(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    from projections import sqlite as module

    monkeypatch.setattr(module, "BUSY_TIMEOUT", 0.2)
    proj = SQLiteProjection(tmp_path / "p.db")
    log.flush("s", [user("old")])
    proj.catch_up(log)
    log.flush("s", [user("old"), assistant("new")])
    reader = sqlite3.connect(proj.path, isolation_level=None)
    inner = proj._rebuild

    def rebuild_read_meanwhile(log: Any) -> int:
        reader.execute("BEGIN")  # a reader arriving after the switch: it holds the file's shared lock
        assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
        return inner(log)

    monkeypatch.setattr(proj, "_rebuild", rebuild_read_meanwhile)
    with pytest.raises(ProjectionError, match="locked"):
        proj.rebuild(log, exclusive=True)  # the commit waits for the reader, then gives up
    assert not proj._db.in_transaction
    assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    reader.execute("COMMIT")
    reader.close()
    proj.catch_up(log)  # the file returns to WAL mode first, then the projection goes on
    assert proj._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert [r["content"] for r in proj.messages("s")] == ["old", "new"]
    proj.close()


def test_rebuild_beside_a_reader_keeps_the_wal_and_its_snapshot(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.flush("s", [user("old")])
    proj.catch_up(log)
    log.flush("s", [user("old"), assistant("new")])
    reader = sqlite3.connect(proj.path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
    seen = _journal_during_rebuild(proj, monkeypatch)
    proj.rebuild(log)  # does not wait for the reader
    assert seen == ["wal"]
    assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 1  # its snapshot
    reader.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    reader.close()


class _LateThread(threading.Thread):
    """A helper thread that starts its work late: whoever does not wait for it races it."""

    def run(self) -> None:
        time.sleep(0.05)
        super().run()


def _late_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    from projections import core, sqlite_store

    monkeypatch.setattr(core, "ROWS_PER_WRITE", 1)  # a bulk, and a helper, per event
    monkeypatch.setattr(sqlite_store, "threading", types.SimpleNamespace(Thread=_LateThread))


def _index_is_sound(proj: SQLiteProjection) -> None:
    for thread in threading.enumerate():
        if thread.name == "projection-index":
            thread.join()  # one left behind would write after us
    proj._db.execute("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")


def test_a_rebuild_waits_for_its_index_helper(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    for turn in range(1, 8):
        log.flush("s", [user(f"m{i}") for i in range(turn)])
    _late_helpers(monkeypatch)
    proj.rebuild(log)
    _index_is_sound(proj)
    assert [r["position"] for r in proj.search("m3")] == [3]
    with SQLiteProjection(tmp_path / "inc.db") as inc:
        inc.catch_up(log)
    assert dump(proj.path) == dump(tmp_path / "inc.db")


@pytest.mark.parametrize("exclusive", [False, True], ids=["wal", "journal"])
@pytest.mark.parametrize("where", ["index", "rows"])
def test_a_rebuild_failing_beside_its_index_helper_leaves_the_old_projection(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection, monkeypatch: pytest.MonkeyPatch, where: str, exclusive: bool
) -> None:
    from projections import core, sqlite_store

    for turn in range(1, 8):
        log.flush("s", [user(f"m{i}") for i in range(turn)])
    proj.catch_up(log)
    before = dump(proj.path)
    _late_helpers(monkeypatch)
    if where == "index":
        monkeypatch.setattr(
            sqlite_store, "INDEX_PENDING", sqlite_store.INDEX_PENDING.replace("tool_text FROM", "no_such_column FROM")
        )
        with pytest.raises(ProjectionError, match="no_such_column"):
            proj.rebuild(log, exclusive=exclusive)
    else:  # the rows of the last event cannot be derived, while the previous event's are indexed
        derive = core.derive

        def failing(message: dict[str, Any], override: Any) -> Any:
            if message["content"] == "m6":
                raise ValueError("underivable")
            return derive(message, override)

        monkeypatch.setattr(core, "derive", failing)
        with pytest.raises(
            ProjectionError, match=r"event \d+ \(MessagesAppended\) could not be applied: ValueError: underivable"
        ):
            proj.rebuild(log, exclusive=exclusive)
    assert not [t for t in threading.enumerate() if t.name == "projection-index"]
    _index_is_sound(proj)
    assert proj._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert dump(proj.path) == before
    monkeypatch.undo()
    proj.rebuild(log)
    assert [r["content"] for r in proj.messages("s")] == [f"m{i}" for i in range(7)]


def test_closed_projection_raises(tmp_path: Path, log: EventLog) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    proj.close()
    proj.close()  # twice is fine
    with pytest.raises(ProjectionError, match="closed"):
        proj.catch_up(log)


# -- rows -----------------------------------------------------------------------


def test_live_rows_match_the_log_after_rewind_edit_and_compaction(log: EventLog, proj: SQLiteProjection) -> None:
    msgs = [user("q1"), assistant("a1"), user("q2"), assistant("a2")]
    log.flush("s", msgs)
    log.flush("s", msgs[:2] + [user("q2 edited"), assistant("a2")])  # edit: a2 is carried
    log.rewind("s", to=3)
    log.compact("s", start=0, end=2, summary=[user("summary of q1/a1")])
    proj.catch_up(log)
    rows = proj.messages("s")
    assert wire(rows) == log.messages("s")
    assert [r["position"] for r in rows] == list(range(len(rows)))
    assert rows[0]["summary"] == 1 and rows[1]["summary"] == 0
    history = proj.history("s")
    reasons = [(h["content"], h["tombstone_reason"]) for h in history]
    assert reasons[:4] == [("q1", "compaction"), ("a1", "compaction"), ("q2", "edit"), ("a2", "edit")]
    assert ("a2", "rewind") in reasons
    assert all(h["tombstone_seq"] is None for h in history if h["tombstone_reason"] is None)
    assert all(h["tombstone_seq"] > h["seq"] for h in history if h["tombstone_reason"])


def test_carried_rows_point_at_the_stored_body(log: EventLog, proj: SQLiteProjection) -> None:
    msgs = [user("q1"), assistant("a1"), user("q2"), assistant("a2")]
    log.flush("s", msgs)
    log.flush("s", [msgs[0], user("q1b"), *msgs[2:]])  # edit at 1: q2 and a2 are carried
    proj.catch_up(log)
    rows = proj.messages("s")
    first = {r["content"]: r for r in proj.history("s") if r["tombstone_seq"] is not None}
    for carried in rows[2:]:
        assert (carried["body_seq"], carried["body_idx"]) == (
            first[carried["content"]]["seq"],
            first[carried["content"]]["idx"],
        )
        assert carried["seq"] != carried["body_seq"]
        assert carried["digest"] == first[carried["content"]]["digest"]
        assert carried["node"] != first[carried["content"]]["node"]  # its parent changed


def test_fork_rows_share_the_source_prefix(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("src", [user("a"), assistant("b"), user("c")], overrides={0: {"content": "A (clean)"}})
    log.fork("src", "dst", at=2)
    log.flush("dst", [user("a"), assistant("b"), user("d")])
    log.rewind("src", to=1)
    proj.catch_up(log)
    src, dst = proj.messages("src"), proj.messages("dst")
    assert wire(dst) == log.messages("dst") and wire(src) == log.messages("src")
    assert [r["node"] for r in dst[:1]] == [r["node"] for r in src]
    assert dst[0]["content"] == "A (clean)"  # the fork shares the display too
    sessions = {s["id"]: s for s in proj.sessions()}
    assert (sessions["dst"]["parent_id"], sessions["dst"]["fork_position"]) == ("src", 2)
    assert sessions["dst"]["message_count"] == 3 and sessions["src"]["message_count"] == 1
    assert sessions["dst"]["head_node"] == dst[-1]["node"]


def test_columns_of_a_tool_round_trip(log: EventLog, proj: SQLiteProjection) -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "web_search", "arguments": '{"q": "zebra facts"}'}}
    msgs = [
        user("look it up", timestamp=1700000000.5, platform_message_id="tg-42"),
        assistant(None, tool_calls=[call], finish_reason="tool_calls", reasoning="think", reasoning_content="deep"),
        {"role": "tool", "tool_call_id": "call_1", "name": "web_search", "content": "zebras are striped"},
        user("thanks", reasoning="users do not reason", reasoning_content="no", reasoning_details=[{"x": 1}]),
    ]
    log.flush("s", msgs)
    proj.catch_up(log)
    u, a, t, u2 = proj.messages("s")
    assert (u["timestamp"], u["platform_message_id"]) == (1700000000.5, "tg-42")
    assert json.loads(a["tool_calls"]) == [call]
    assert (a["finish_reason"], a["reasoning"], a["reasoning_content"], a["content"]) == (
        "tool_calls",
        "think",
        "deep",
        None,
    )
    assert (t["tool_call_id"], t["tool_name"], t["name"], t["role"]) == ("call_1", "web_search", "web_search", "tool")
    assert (u2["reasoning"], u2["reasoning_content"], u2["reasoning_details"]) == (
        None,
        None,
        None,
    )  # assistant rows only
    assert json.loads(u2["message"])["reasoning"] == "users do not reason"
    assert {h["position"] for h in proj.search("zebra*")} == {1, 2}  # arguments and the result
    assert {h["position"] for h in proj.search("web_search", session_id="s")} == {1, 2}  # call and result
    db = sqlite3.connect(proj.path)
    assert db.execute("SELECT position FROM messages WHERE platform_message_id = 'tg-42'").fetchall() == [(0,)]
    plan = " ".join(
        r[-1] for r in db.execute("EXPLAIN QUERY PLAN SELECT * FROM messages WHERE platform_message_id = 'x'")
    )
    assert "messages_platform" in plan


def test_multimodal_content_is_projected_to_text_with_placeholders(log: EventLog, proj: SQLiteProjection) -> None:
    parts = [
        {"type": "text", "text": "what is in"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "input_audio", "input_audio": {"data": "BBBB", "format": "wav"}},
        {"type": "file", "file": {"file_id": "f1"}},
        {"type": "text", "text": "these?"},
    ]
    anthropic = [
        {"type": "text", "text": "I will look"},
        {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "quokka"}},
        {"type": "image", "source": {"type": "base64", "data": "CCCC"}},
    ]
    log.flush("s", [user(parts), assistant(anthropic)])
    proj.catch_up(log)
    u, a = proj.messages("s")
    assert u["content"] == "what is in\n[image]\n[audio]\n[file]\nthese?"
    assert json.loads(u["message"])["content"] == parts
    assert a["content"] == "I will look\n[image]"
    assert "lookup" in a["tool_text"] and "quokka" in a["tool_text"]
    assert [h["position"] for h in proj.search("quokka")] == [1]
    assert proj.search("AAAA") == []  # image data is not text


# -- display overrides ----------------------------------------------------------------


def test_text_override_replaces_text_content_and_keeps_the_wire_copy(log: EventLog, proj: SQLiteProjection) -> None:
    wire_text = "<context>injected memory</context> hello there"
    log.flush(
        "s",
        [user(wire_text), assistant("hi")],
        overrides={
            0: {"content": "hello there", "display_kind": "user_turn", "platform_message_id": 7, "ignored_key": 1}
        },
    )
    proj.catch_up(log)
    row = proj.messages("s")[0]
    assert row["content"] == "hello there"
    assert row["api_content"] == wire_text
    assert (row["display_kind"], row["platform_message_id"]) == ("user_turn", 7)
    assert json.loads(row["display_override"])["ignored_key"] == 1
    assert json.loads(row["message"])["content"] == wire_text
    assert log.messages("s")[0]["content"] == wire_text
    assert proj.search("injected") == []  # the display text is what is searched
    assert [h["position"] for h in proj.search("hello")] == [0]


def test_equal_override_leaves_api_content_empty(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("same")], overrides={0: {"content": "same", "timestamp": "2024-01-01T00:00:00Z"}})
    proj.catch_up(log)
    row = proj.messages("s")[0]
    assert (row["content"], row["api_content"], row["timestamp"]) == ("same", None, "2024-01-01T00:00:00Z")


def test_text_override_never_replaces_multimodal_content(log: EventLog, proj: SQLiteProjection) -> None:
    parts = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "u"}}]
    log.flush("s", [user(parts)], overrides={0: {"content": "see (clean)", "display_kind": "photo"}})
    proj.catch_up(log)
    row = proj.messages("s")[0]
    assert (row["content"], row["api_content"], row["display_kind"]) == ("see\n[image]", None, "photo")


def test_list_override_replaces_multimodal_content(log: EventLog, proj: SQLiteProjection) -> None:
    parts = [{"type": "text", "text": "raw"}, {"type": "image_url", "image_url": {"url": "u"}}]
    clean = [{"type": "text", "text": "clean"}, {"type": "image_url", "image_url": {"url": "u"}}]
    log.flush("s", [user(parts)], overrides={0: {"content": clean}})
    proj.catch_up(log)
    row = proj.messages("s")[0]
    assert row["content"] == "clean\n[image]"
    assert json.loads(row["api_content"]) == parts


@pytest.mark.parametrize("lag", [0, 1000])
def test_new_override_for_a_stored_message_updates_row_and_search(tmp_path: Path, log: EventLog, lag: int) -> None:
    proj = SQLiteProjection(tmp_path / "p.db", search_lag=lag)
    msgs = [user("draft wording"), assistant("ok")]
    log.flush("s", msgs)
    proj.catch_up(log)
    proj.sync_search()
    log.flush("s", msgs, overrides={0: {"content": "final wording"}})
    proj.catch_up(log)
    row = proj.messages("s")[0]
    assert (row["content"], row["api_content"]) == ("final wording", "draft wording")
    assert proj.search("draft") == []
    assert [h["position"] for h in proj.search("final")] == [0]
    log.flush("s", msgs, overrides={0: {"display_kind": "hidden"}})  # replaces the previous override
    proj.catch_up(log)
    row = proj.messages("s")[0]
    assert (row["content"], row["api_content"], row["display_kind"]) == ("draft wording", None, "hidden")
    assert [h["position"] for h in proj.search("draft")] == [0]
    proj.close()
    with SQLiteProjection(tmp_path / "full.db") as full:
        full.rebuild(log)
    assert dump(tmp_path / "p.db") == dump(tmp_path / "full.db")


def test_carried_message_keeps_its_display_override(log: EventLog, proj: SQLiteProjection) -> None:
    msgs = [
        user(
            "wire q",
        ),
        assistant("a1"),
        user("q2"),
        assistant("a2"),
    ]
    log.flush("s", msgs, overrides={2: {"content": "clean q2"}})
    log.compact("s", start=0, end=2, summary=[user("summary")])
    proj.catch_up(log)
    rows = proj.messages("s")
    assert [r["content"] for r in rows] == ["summary", "clean q2", "a2"]
    assert rows[1]["api_content"] == "q2"


# -- sessions -------------------------------------------------------------------


def test_session_metadata_merges_and_counters_add_up(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("a")])
    log.update_session("s", title="First", model="m1", source="cli", topic="x", input_tokens=100, cost_usd=0.25)
    log.update_session("s", title="Renamed", owner="me", input_tokens=50, output_tokens=7, cost_usd=0.5, api_calls=2)
    log.close_session("s", reason="user_exit")
    proj.catch_up(log)
    (session,) = proj.sessions()
    assert (session["title"], session["model"], session["source"]) == ("Renamed", "m1", "cli")
    assert json.loads(session["metadata"]) == {
        "title": "Renamed",
        "model": "m1",
        "source": "cli",
        "topic": "x",
        "owner": "me",
    }
    assert (session["input_tokens"], session["output_tokens"], session["api_calls"]) == (150, 7, 2)
    assert session["cost_usd"] == pytest.approx(0.75)
    assert json.loads(session["counters"]) == {
        "input_tokens": 150,
        "cost_usd": 0.75,
        "output_tokens": 7,
        "api_calls": 2,
    }
    assert session["close_reason"] == "user_exit"
    assert session["closed_seq"] == log.last_seq
    records = list(log.events())
    assert session["closed_ns"] == records[-1].time_ns
    assert session["created_ns"] == records[0].time_ns and session["created_seq"] == 1
    assert (session["message_count"], session["last_seq"]) == (1, log.last_seq)


@pytest.mark.parametrize("how", ["catch_up", "rebuild"])
def test_numbers_past_sqlites_range_are_projected_not_stuck(tmp_path: Path, log: EventLog, how: str) -> None:
    """The log takes integers up to 2**64 - 1 and sums counters without bound; SQLite holds
    integers up to 2**63 - 1 and JSON no infinity.  Neither may stop the projection."""
    big = 2**64 - 1
    log.flush("s", [user("a", timestamp=big, platform_message_id=2**63)], overrides={0: {"content": "shown"}})
    log.flush("t", [user("b")], overrides={0: {"timestamp": 2**63 + 7}})
    log.update_session("s", input_tokens=2**62, cost_usd=1e308)
    log.update_session("s", input_tokens=2**62, cost_usd=1e308)
    log.flush("later", [user("after")])
    proj = SQLiteProjection(tmp_path / f"{how}.db")
    try:
        getattr(proj, how)(log)
        (row,) = proj.messages("s")
        assert (row["timestamp"], row["platform_message_id"]) == (str(big), str(2**63))
        assert json.loads(row["message"])["timestamp"] == big  # the number itself, in the wire JSON
        assert proj.messages("t")[0]["timestamp"] == str(2**63 + 7)
        session = {s["id"]: s for s in proj.sessions()}["s"]
        assert session["input_tokens"] == float(2**63)
        assert session["cost_usd"] == sys.float_info.max
        assert json.loads(session["counters"]) == {"input_tokens": float(2**63), "cost_usd": sys.float_info.max}
        assert [m["content"] for m in proj.messages("later")] == ["after"]
    finally:
        proj.close()


def test_new_messages_reopen_a_closed_session(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("a")])
    log.close_session("s", reason="idle")
    log.flush("s", [user("a"), assistant("back")])
    proj.catch_up(log)
    (session,) = proj.sessions()
    assert (session["closed_seq"], session["closed_ns"], session["close_reason"]) == (None, None, None)


# -- search -----------------------------------------------------------------------


def test_search_finds_live_words_and_not_tombstoned_ones(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("s", [user("the capybara question"), assistant("capybaras are rodents")])
    proj.catch_up(log)
    assert {h["position"] for h in proj.search("capybara*")} == {0, 1}
    log.flush("s", [user("the capybara question"), assistant("actually, a wombat")])  # edit
    proj.catch_up(log)
    assert [h["position"] for h in proj.search("rodents")] == []
    assert [h["content"] for h in proj.search("wombat")] == ["actually, a wombat"]
    log.rewind("s", to=0)
    proj.catch_up(log)
    assert proj.search("capybara") == [] and proj.search("wombat") == []
    # And the raw index agrees: tombstoned rows are gone from it, not filtered.
    db = sqlite3.connect(proj.path)
    assert db.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'capybara OR wombat'").fetchone() == (
        0,
    )


def test_search_ranks_filters_limits_and_snippets(log: EventLog, proj: SQLiteProjection) -> None:
    log.flush("a", [user("apple apple apple pie"), assistant("an apple")])
    log.flush("b", [user("apple tart")])
    proj.catch_up(log)
    hits = proj.search("apple")
    assert len(hits) == 3
    assert hits[0]["content"] == "apple apple apple pie"  # most occurrences ranks first
    assert [h["rank"] for h in hits] == sorted(h["rank"] for h in hits)
    assert hits[0]["snippet"] == "**apple** **apple** **apple** pie"
    assert {h["session_id"] for h in proj.search("apple", session_id="b")} == {"b"}
    assert len(proj.search("apple", limit=2)) == 2
    assert [h["content"] for h in proj.search('"apple tart"')] == ["apple tart"]


@pytest.mark.parametrize(
    "query", ['"unbalanced', "", "\ud800", b"bytes"], ids=["syntax", "empty", "surrogate", "bytes"]
)
def test_invalid_search_query_is_a_value_error(proj: SQLiteProjection, query: Any) -> None:
    with pytest.raises(InvalidQueryError) as info:
        proj.search(query)
    assert isinstance(info.value, ValueError)


def test_search_index_trails_by_at_most_search_lag(tmp_path: Path, log: EventLog) -> None:
    proj = SQLiteProjection(tmp_path / "p.db", search_lag=5)
    raw = sqlite3.connect(tmp_path / "p.db")

    def raw_hits() -> int:
        return raw.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'needle'").fetchone()[0]

    msgs: list[dict[str, Any]] = []
    for i in range(4):
        msgs.append(user(f"needle {i}"))
        log.flush("s", msgs)
        proj.catch_up(log)
        assert len(proj.messages("s")) == i + 1  # rows are always current
        assert raw_hits() == 0  # fewer than search_lag rows wait
    msgs.append(user("needle 4"))
    log.flush("s", msgs)
    proj.catch_up(log)
    assert raw_hits() == 5  # the lag reached search_lag: indexed in the same transaction
    msgs.append(user("needle 5"))
    log.flush("s", msgs)
    proj.catch_up(log)
    assert raw_hits() == 5
    assert len(proj.search("needle")) == 6  # search() indexes what waits first
    assert raw_hits() == 6
    msgs.append(user("needle 6"))
    log.flush("s", msgs)
    proj.catch_up(log)
    proj.close()  # close() indexes what waits
    assert raw_hits() == 7


@pytest.mark.parametrize("chunk", [1, 2, 3, 5000])
def test_waiting_rows_are_indexed_in_chunks_past_tombstoned_ones(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    from projections import sqlite_store

    monkeypatch.setattr(sqlite_store, "INDEX_CHUNK", chunk)
    proj = SQLiteProjection(tmp_path / "p.db", search_lag=100)
    words = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape"]
    msgs = [user(w) for w in words]
    log.flush("s", msgs)
    log.rewind("s", to=2)  # cherry .. grape tombstoned before the index saw them
    log.flush("s", [*msgs[:2], user("lime"), user("mango")])
    log.flush("t", [user("nectarine")])
    proj.catch_up(log)
    assert proj.sync_search() == 10  # rows above the index's mark, tombstoned ones included
    db = sqlite3.connect(proj.path)
    db.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, messages_fts, row)")
    assert sorted(t for (t,) in db.execute("SELECT term FROM temp.v")) == [
        "apple",
        "banana",
        "lime",
        "mango",
        "nectarine",
    ]
    assert proj.sync_search() == 0
    _index_is_sound(proj)
    proj.close()


def test_tombstone_of_the_last_indexed_row_leaves_the_index(
    tmp_path: Path, log: EventLog, proj: SQLiteProjection
) -> None:
    # One session: row ids are positions + 1, so the tombstoned row is exactly the index's mark.
    log.flush("s", [user("keep"), assistant("kiwi")])
    proj.catch_up(log)
    log.rewind("s", to=1)
    proj.catch_up(log)
    db = sqlite3.connect(proj.path)
    db.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, messages_fts, instance)")
    assert db.execute("SELECT DISTINCT doc FROM temp.v").fetchall() == [(1,)]


def test_tombstone_of_rows_not_yet_indexed(tmp_path: Path, log: EventLog) -> None:
    proj = SQLiteProjection(tmp_path / "p.db", search_lag=100)
    log.flush("s", [user("keep"), assistant("kiwi")])
    proj.catch_up(log)
    log.rewind("s", to=1)
    proj.catch_up(log)
    assert proj.search("kiwi") == []
    assert [h["content"] for h in proj.search("keep")] == ["keep"]
    proj.close()


# -- docs -------------------------------------------------------------------------


def test_docs_examples_run(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOCS.read_text(encoding="utf-8"), flags=re.S)
    assert len(blocks) >= 2
    namespace: dict[str, Any] = {"tmp": str(tmp_path)}
    for block in blocks:
        exec(compile(block, str(DOCS), "exec"), namespace)


def test_a_projection_ahead_of_its_log_is_refused(tmp_path):
    import shutil

    from eventlog import EventLog
    from projections import SQLiteProjection
    from projections.errors import LogMismatchError

    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [{"role": "user", "content": "one"}])
    shutil.copytree(path, tmp_path / "backup")
    proj = SQLiteProjection(tmp_path / "p.db")
    try:
        with EventLog.open(path) as log:
            log.flush("s", [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
            proj.catch_up(log)
        shutil.rmtree(path)
        shutil.copytree(tmp_path / "backup", path)  # the log restored from an older copy
        with EventLog.open(path) as log:
            with pytest.raises(LogMismatchError, match=r"ahead|ends at"):
                proj.catch_up(log)
            proj.rebuild(log)
            assert [m["content"] for m in proj.messages("s")] == ["one"]
    finally:
        proj.close()


# -- redaction ----------------------------------------------------------------------

SECRET = "quokka9secret"


def _redactable(log: EventLog) -> None:
    if not hasattr(EventLog, "redact"):
        pytest.skip("EventLog.redact is not built yet")
    log.flush("s", [user("hi"), assistant(f"the password is {SECRET}"), user("ok")])
    log.flush("s", [*log.messages("s"), assistant("noted")])


def _holding(folder: Path, secret: str = SECRET) -> list[str]:
    return sorted(f.name for f in folder.iterdir() if f.is_file() and secret.encode() in f.read_bytes())


def test_project_and_rebuild_commands_erase_after_a_redaction(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eventlog.cli import cli

    def run(*args: str) -> str:
        result = CliRunner().invoke(cli, ["--log", str(tmp_path / "log"), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.stdout

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with EventLog.open(tmp_path / "log") as log:
        _redactable(log)
    run("project", str(tmp_path / "a" / "p.db"))
    run("project", str(tmp_path / "b" / "p.db"))
    assert _holding(tmp_path / "a") and _holding(tmp_path / "b")
    with EventLog.open(tmp_path / "log") as log:
        log.redact("s", 1, reason="a password")
        total = log.last_seq
    assert json.loads(run("project", str(tmp_path / "a" / "p.db"), "--json"))["applied"] == total  # rebuilt
    assert json.loads(run("rebuild", str(tmp_path / "b" / "p.db"), "--json"))["applied"] == total
    assert _holding(tmp_path / "a") == [] and _holding(tmp_path / "b") == []
    assert "no live message matches" in run("search", SECRET, "--db", str(tmp_path / "a" / "p.db"))


def test_a_reader_inside_a_transaction_keeps_its_snapshot_until_it_ends_then_the_wal_goes(
    tmp_path: Path, log: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy over the projection is one transaction: a reader in a transaction begun before
    keeps reading the old rows (its snapshot) and keeps the WAL from being truncated; once it
    ends it reads the new rows on the same connection, and the next catch-up truncates the WAL."""
    import projections.sqlite as sqlite_target

    monkeypatch.setattr(sqlite_target, "TRUNCATE_WAIT", 0.05)
    _redactable(log)
    (tmp_path / "p").mkdir()
    proj = SQLiteProjection(tmp_path / "p" / "t.db")
    proj.catch_up(log)
    reader = sqlite3.connect(tmp_path / "p" / "t.db", isolation_level=None)
    reader.execute("BEGIN")
    assert SECRET in reader.execute("SELECT content FROM messages WHERE position = 1").fetchone()[0]
    log.redact("s", 1, reason="a password")
    proj.catch_up(log)
    assert proj._erase_pending
    assert SECRET in reader.execute("SELECT content FROM messages WHERE position = 1").fetchone()[0]
    assert _holding(tmp_path / "p") == ["t.db-wal"]  # the reader's snapshot holds it
    reader.execute("COMMIT")
    assert reader.execute("SELECT content FROM messages WHERE position = 1").fetchone()[0] == "[redacted]"
    log.flush("s", [*log.messages("s"), user("more")])
    assert proj.catch_up(log) == 1
    assert not proj._erase_pending
    assert _holding(tmp_path / "p") == []
    reader.close()
    proj.close()


def test_a_projection_of_another_page_size_is_replaced_in_its_own(tmp_path: Path, log: EventLog) -> None:
    """The copy into a WAL database needs the same page size: an older file's 4 KiB is kept."""
    _redactable(log)
    (tmp_path / "p").mkdir()
    proj = SQLiteProjection(tmp_path / "p" / "t.db", page_size=4096)
    proj.catch_up(log)
    log.redact("s", 1, reason="a password")
    assert proj.catch_up(log) == log.last_seq
    assert proj._db.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert [m["content"] for m in proj.messages("s")][1] == "[redacted]"
    assert _holding(tmp_path / "p") == []
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["t.db", "t.db-shm", "t.db-wal"]  # no scratch left
    proj.close()


class _ForgedRedaction:
    """A log with one more event: a redaction naming ``body`` as its body, which no rewrite backs."""

    def __init__(self, log: EventLog, body: tuple[int, int]) -> None:
        self.log, self.body = log, body

    @property
    def id(self) -> str:
        return self.log.id

    @property
    def last_seq(self) -> int:
        return self.log.last_seq + 1

    def events(self, after: int = 0) -> Any:
        from eventlog import events as ev
        from eventlog.keys import Record

        last = None
        for last in self.log.events(after=0):
            if last.seq > after:
                yield last
        assert last is not None
        if after <= last.seq:
            event = ev.MessageRedacted(
                session="s", position=0, body_seq=self.body[0], body_index=self.body[1], reason="forged"
            )
            yield Record(last.seq + 1, last.time_ns, ev.KIND[ev.MessageRedacted], last.hash, b"\x01" * 32, event)


def test_a_redaction_of_a_body_the_log_does_not_hold_is_refused_as_corrupt(log: EventLog, tmp_path: Path) -> None:
    log.flush("s", [user("one")])
    log.update_session("s", title="t")  # event 3 holds no message (1 opens the session, 2 appends)
    with SQLiteProjection(tmp_path / "p.db") as proj:
        with pytest.raises(ProjectionCorruptError, match=r"redacted body \(3, 0\) is not in the projection"):
            proj.catch_up(_ForgedRedaction(log, (3, 0)))
        proj.catch_up(log)
    db = sqlite3.connect(tmp_path / "p.db")  # a row claiming event 3 as its body: the log has no such message
    db.execute("UPDATE messages SET seq = 3, idx = 0")
    db.commit()
    db.close()
    with SQLiteProjection(tmp_path / "p.db") as proj:
        with pytest.raises(ProjectionCorruptError, match=r"redacted body \(3, 0\) is not a message the log holds"):
            proj.catch_up(_ForgedRedaction(log, (3, 0)))


class WritesMeanwhile:
    """The log as a projection reads it, with another write landing each time its events run out
    (``writes`` times): as a writer does while a catch-up applies what it read."""

    def __init__(self, log: EventLog, writes: int) -> None:
        self.log = log
        self.writes = writes
        self.id = log.id

    @property
    def last_seq(self) -> int:
        return self.log.last_seq

    def events(self, after: int = 0) -> Any:
        yield from self.log.events(after=after)
        if self.writes:
            self.writes -= 1
            self.log.append("s", [{"role": "user", "content": f"meanwhile {self.writes}"}])


def test_writes_landing_during_a_catch_up_join_its_transaction(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", durability="none") as log, SQLiteProjection(tmp_path / "p.db") as proj:
        log.append("s", [{"role": "user", "content": "first"}])
        source = WritesMeanwhile(log, writes=2)
        commits = []
        proj._db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        assert proj.catch_up(source) == log.last_seq  # the first write, and the two made while it was applied
        assert len(commits) == 2  # claiming the log, then one transaction for the three writes
        assert [m["content"] for m in proj.messages("s")] == ["first", "meanwhile 1", "meanwhile 0"]
        assert proj.last_seq == log.last_seq
        assert proj.catch_up(log) == 0
