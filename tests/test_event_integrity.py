"""Every event ``log.events()`` yields is checked against its hash and the chain, so a
projection never materialises a damaged event; a projection file that is not one is refused."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from factories import assistant, user

from eventlog import CorruptLogError, EventLog
from eventlog.cli import cli
from projections import SQLiteProjection


def _build(path: Path) -> int:
    """A log whose event holding "the quick brown fox" is neither the first nor the last; its seq."""
    with EventLog.open(path) as log:
        log.flush("a", [user("hello"), assistant("hi")])
        log.flush("b", [user("the quick brown fox jumps over the lazy dog")])
        seq = log.last_seq
        log.flush("a", [user("hello"), assistant("hi"), user("more")])
        log.update_session("b", title="fox")
    return seq


def _flip(path: Path, old: bytes, new: bytes) -> None:
    data = path / "data.mdb"
    raw = data.read_bytes()
    assert old in raw  # also in pages LMDB no longer uses: changing those too does no harm
    data.write_bytes(raw.replace(old, new))


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "log"
    seq = _build(path)
    _flip(path, b"quick", b"quack")
    return path, seq


def test_events_stops_before_a_damaged_event(damaged):
    path, seq = damaged
    with EventLog.open(path) as log:
        seen = []
        with pytest.raises(CorruptLogError, match=rf"event {seq}\b") as caught:
            for record in log.events():
                seen.append(record.seq)
        assert seen == list(range(1, seq))  # everything before it, nothing from it on
        assert "verify" in str(caught.value)
        with pytest.raises(CorruptLogError, match=rf"event {seq}\b"):
            list(log.events(after=seq - 1))
        assert [r.seq for r in log.events(after=seq)] == list(range(seq + 1, log.last_seq + 1))


def test_events_checks_the_newest_event_against_its_session(tmp_path: Path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("a", [user("first")])
        log.flush("a", [user("first"), user("the newest zebra")])
        last = log.last_seq
    _flip(path, b"zebra", b"zebrA")
    with EventLog.open(path) as log, pytest.raises(CorruptLogError, match=rf"event {last}\b"):
        list(log.events())


def test_events_checks_the_chain_link_of_an_envelope(tmp_path: Path):
    """A damaged previous-hash field is caught too (the event's own hash changes with it)."""
    path = tmp_path / "log"
    _build(path)
    with EventLog.open(path) as log:
        records = list(log.events())
    link = records[2].prev_hash  # the envelope of event 3 names event 2's hash
    _flip(path, link, bytes([link[0] ^ 1]) + link[1:])
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError, match=r"events 2 and 3 do not match|event [23]\b"):
            list(log.events())
        assert [r.seq for r in log.events(after=3)] == list(range(4, len(records) + 1))


def test_a_projection_never_applies_a_damaged_event(damaged, tmp_path: Path):
    path, seq = damaged
    db = tmp_path / "proj.sqlite"
    with EventLog.open(path) as log, SQLiteProjection(db) as projection:
        with pytest.raises(CorruptLogError, match=rf"event {seq}\b"):
            projection.catch_up(log)
        assert projection.search("quack") == [] and projection.search("quick") == []
        with pytest.raises(CorruptLogError, match=rf"event {seq}\b"):
            projection.rebuild(log)
        assert projection.search("quack") == []
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT last_seq FROM checkpoint").fetchone()[0] < seq


@pytest.mark.parametrize("command", [["rebuild"], ["project"], ["search", "fox"], ["sessions"], ["stats"]])
def test_the_cli_names_the_damaged_event_and_suggests_verify(damaged, tmp_path: Path, command):
    path, seq = damaged
    db = tmp_path / "cli.sqlite"
    argv = ["--log", str(path), *command]
    if command[0] in ("rebuild", "project"):
        argv.append(str(db))
    elif command[0] == "search":
        argv += ["--db", str(db)]
    result = CliRunner().invoke(cli, argv, catch_exceptions=False)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"event {seq}" in lines[0] and "eventlog verify" in lines[0], lines[0]
    assert "quack" not in result.stdout


@pytest.mark.parametrize("content", [b"not a database, just notes\n" * 40, b"\x00" * 5000])
def test_a_projection_file_that_is_not_sqlite_is_a_one_line_error(tmp_path: Path, content: bytes):
    path = tmp_path / "log"
    _build(path)
    db = tmp_path / "notes.sqlite"
    db.write_bytes(content)
    for command in (["project", str(db)], ["rebuild", str(db)], ["search", "fox", "--db", str(db)]):
        result = CliRunner().invoke(cli, ["--log", str(path), *command], catch_exceptions=False)
        assert result.exit_code == 1, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert str(db) in lines[0] and "not a SQLite database" in lines[0] and "--force" in lines[0], lines[0]
    assert db.read_bytes() == content  # left as it was
    result = CliRunner().invoke(cli, ["--log", str(path), "rebuild", "--force", str(db)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with SQLiteProjection(db) as projection:
        assert projection.search("fox")


def test_another_programs_sqlite_file_is_refused_until_forced(tmp_path: Path):
    path = tmp_path / "log"
    _build(path)
    db = tmp_path / "app.db"
    with sqlite3.connect(db) as other:
        other.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        other.execute("INSERT INTO invoices (total) VALUES (9.5)")
    result = CliRunner().invoke(cli, ["--log", str(path), "rebuild", str(db)], catch_exceptions=False)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert "\n" not in line and str(db) in line and "--force" in line, line
    with sqlite3.connect(db) as other:
        assert other.execute("SELECT total FROM invoices").fetchall() == [(9.5,)]
    result = CliRunner().invoke(cli, ["--log", str(path), "rebuild", "--force", str(db)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    with SQLiteProjection(db) as projection:
        assert projection.search("fox")


@pytest.mark.parametrize("batch", [1, 2, 3, 5])
def test_the_checks_hold_across_read_batches(damaged, tmp_path: Path, batch: int):
    from eventlog.store import iter_events

    path, seq = damaged
    intact = tmp_path / "intact"
    _build(intact)
    with EventLog.open(intact) as log:
        assert [r.seq for r in iter_events(log._store, 0, batch=batch)] == list(range(1, log.last_seq + 1))
        assert [r.seq for r in iter_events(log._store, 2, batch=batch)] == list(range(3, log.last_seq + 1))
    with EventLog.open(path) as log:
        seen = []
        with pytest.raises(CorruptLogError, match=rf"event {seq}\b"):
            for record in iter_events(log._store, 0, batch=batch):
                seen.append(record.seq)
        assert seen == list(range(1, seq))


def _flip_in_place(path: Path, old: bytes, new: bytes) -> None:
    """``_flip`` on a log that is open: the bytes change under its map, the file is not replaced."""
    with open(path / "data.mdb", "r+b") as data:
        raw = data.read()
        assert old in raw and len(old) == len(new)
        at = raw.find(old)
        while at != -1:
            data.seek(at)
            data.write(new)
            at = raw.find(old, at + 1)


def test_the_log_that_wrote_an_event_still_catches_its_damage(tmp_path: Path):
    """The writer's own hash of an event is reused only for the very bytes it hashed."""
    path = tmp_path / "log"
    projection = SQLiteProjection(tmp_path / "proj.sqlite")
    with EventLog.open(path, projections=[projection], project_in_background=False) as log, projection:
        log.flush("a", [user("hello"), assistant("hi")])
        log.flush("b", [user("the quick brown fox jumps over the lazy dog")])
        seq = log.last_seq
        log.flush("a", [user("hello"), assistant("hi"), user("more")])
        assert [r.seq for r in log.events()] == list(range(1, log.last_seq + 1))
        _flip_in_place(path, b"quick", b"quack")
        with pytest.raises(CorruptLogError, match=rf"event {seq}\b"):
            list(log.events())
        with SQLiteProjection(tmp_path / "other.sqlite") as other:
            with pytest.raises(CorruptLogError, match=rf"event {seq}\b"):
                other.catch_up(log)
            assert other.search("quack") == []


def test_reading_back_a_write_does_not_hash_its_events_again(tmp_path: Path, monkeypatch):
    """What a projection reads right after a write was hashed by the write; a large event,
    or any event read by a log with no projection of its own, is hashed as it is read."""
    from eventlog import store

    hashed: list[int] = []
    real = store.event_hash
    monkeypatch.setattr(store, "event_hash", lambda seq, raw: hashed.append(seq) or real(seq, raw))
    path = tmp_path / "log"
    projection = SQLiteProjection(tmp_path / "proj.sqlite")
    with EventLog.open(path, projections=[projection], project_in_background=False) as log, projection:
        log.flush("a", [user("hello"), assistant("hi")])
        log.flush("a", [user("hello"), assistant("hi"), user("x" * store.HASHED_EVENT_MAX)])
        large = log.last_seq
        log.flush("a", [user("hello"), assistant("hi"), user("x" * store.HASHED_EVENT_MAX), user("more")])
        assert len(projection.messages("a")) == 4
        hashed.clear()
        records = list(log.events())
        assert hashed == [large]
    with EventLog.open(path) as log:
        log.flush("b", [user("hello")])
        hashed.clear()
        assert list(log.events())[: len(records)] == records
        assert hashed == list(range(1, log.last_seq + 1))


def test_a_log_whose_projections_run_in_other_processes_keeps_no_hashes(tmp_path: Path, monkeypatch):
    """Projections caught up in processes of their own read the log there: the writer keeps nothing for them."""
    from eventlog import store

    hashed: list[int] = []
    real = store.event_hash
    monkeypatch.setattr(store, "event_hash", lambda seq, raw: hashed.append(seq) or real(seq, raw))
    projection = SQLiteProjection(tmp_path / "proj.sqlite")
    with EventLog.open(tmp_path / "log", projections=[projection], projection_process=True) as log, projection:
        log.flush("a", [user("hello"), assistant("hi")])
        log.flush("a", [user("hello"), assistant("hi"), user("more")])
        assert len(projection.messages("a")) == 3
        hashed.clear()
        list(log.events())
        assert hashed == list(range(1, log.last_seq + 1))
