"""The PostgreSQL target beyond the contract: many hosts, its schema, pools, the CLI, a server going away.

Runs against a real server (``EVENTLOG_TEST_POSTGRES``, started by .ci/run; locally a
throwaway cluster, or a skip when none can start).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner, Result
from factories import assistant, user

from eventlog import EventLog
from eventlog.cli import cli
from projections import ProjectionCorruptError, ProjectionError, SchemaVersionError, postgres_schema
from projections.postgres import AmbiguousSessionError, PostgresProjection


@pytest.fixture
def pg(postgres_dsn: str, pg_schema: str) -> Any:
    proj = PostgresProjection(postgres_dsn, schema=pg_schema)
    yield proj
    proj.close()


def two_hosts(tmp_path: Path) -> tuple[EventLog, EventLog]:
    one = EventLog.open(tmp_path / "host1")
    two = EventLog.open(tmp_path / "host2")
    one.flush("chat", [user("lighthouse keeper"), assistant("one beacon")])
    two.flush("chat", [user("harbour pilot"), assistant("two beacon")])
    two.flush("other", [user("tide tables")])
    return one, two


def test_two_hosts_share_one_database_and_reads_pick_a_log(tmp_path: Path, pg: PostgresProjection) -> None:
    one, two = two_hosts(tmp_path)
    with one, two:
        assert pg.catch_up(one) == one.last_seq
        assert pg.catch_up(two) == two.last_seq
        assert pg.logs() == {one.id: one.last_seq, two.id: two.last_seq}
        with pytest.raises(AmbiguousSessionError, match="several logs"):
            pg.messages("chat")
        assert [json.loads(r["message"]) for r in pg.messages("chat", log_id=two.id)] == two.messages("chat")
        assert [json.loads(r["message"]) for r in pg.messages("other")] == two.messages("other")
        assert {(s["log_id"], s["id"]) for s in pg.sessions()} == {
            (one.id, "chat"),
            (two.id, "chat"),
            (two.id, "other"),
        }
        assert [s["id"] for s in pg.sessions(log_id=one.id)] == ["chat"]
        hits = pg.search("beacon")
        assert {(h["log_id"], h["session_id"]) for h in hits} == {(one.id, "chat"), (two.id, "chat")}
        assert all("**" in h["snippet"] for h in hits)
        assert [h["log_id"] for h in pg.search("beacon", log_id=one.id)] == [one.id]


def test_search_ranks_and_takes_web_search_syntax(log: EventLog, pg: PostgresProjection) -> None:
    log.flush("s", [user("alpha"), user("alpha alpha alpha bravo"), user("bravo only"), user("alpha then bravo")])
    pg.catch_up(log)
    assert next(h["position"] for h in pg.search("alpha", limit=2)) == 1  # the densest match first
    assert {h["position"] for h in pg.search("alpha -bravo")} == {0}
    assert {h["position"] for h in pg.search('"then bravo"')} == {3}
    assert {h["position"] for h in pg.search("alpha or only")} == {0, 1, 2, 3}
    assert pg.search("((( unbalanced") == []  # web-search syntax never fails to parse


def test_catch_up_of_one_log_does_not_wait_for_another_logs_lock(
    tmp_path: Path, postgres_dsn: str, pg: PostgresProjection
) -> None:
    one, two = two_hosts(tmp_path)
    with one, two:
        pg.catch_up(one)
        pg.catch_up(two)
        one.flush("chat", [*one.messages("chat"), user("more from one")])
        two.flush("chat", [*two.messages("chat"), user("more from two")])
        with psycopg.connect(postgres_dsn) as holder:
            # Another host in the middle of catching up log one: its checkpoint row is locked.
            holder.execute(
                f'SELECT * FROM "{pg.schema}".checkpoints WHERE log_id = %s FOR UPDATE', (one.id,)
            ).fetchall()
            other = PostgresProjection(postgres_dsn, schema=pg.schema)
            done = threading.Event()
            threading.Thread(target=lambda: (other.catch_up(two), done.set()), daemon=True).start()
            assert done.wait(60), "catching up log two waited for log one's lock"
            holder.rollback()
            other.close()
        assert [json.loads(r["message"]) for r in pg.messages("chat", log_id=two.id)] == two.messages("chat")


def test_a_pool_serves_the_projection(log: EventLog, postgres_dsn: str, pg_schema: str) -> None:
    from psycopg_pool import ConnectionPool

    log.flush("s", [user("pooled words")])
    with ConnectionPool(postgres_dsn, min_size=1, max_size=2, open=True) as pool:
        proj = PostgresProjection(pool=pool, schema=pg_schema)
        assert proj.catch_up(log) == log.last_seq
        assert [h["session_id"] for h in proj.search("pooled")] == ["s"]
        proj.close()
        assert not pool.closed  # the caller's pool stays open


def test_newer_schema_is_refused(postgres_dsn: str, pg: PostgresProjection) -> None:
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{pg.schema}".schema_version SET version = %s', (postgres_schema.VERSION + 1,))
    with pytest.raises(SchemaVersionError, match="is newer than this code's"):
        PostgresProjection(postgres_dsn, schema=pg.schema)


def test_sql_migration_runs_once_and_keeps_rows(
    log: EventLog, postgres_dsn: str, pg: PostgresProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.flush("s", [user("kept")])
    pg.catch_up(log)
    monkeypatch.setattr(postgres_schema, "VERSION", postgres_schema.VERSION + 1)
    monkeypatch.setitem(
        postgres_schema.MIGRATIONS, postgres_schema.VERSION, "ALTER TABLE {schema}.sessions ADD COLUMN note text"
    )
    for _ in range(2):  # the second open finds the schema current
        with PostgresProjection(postgres_dsn, schema=pg.schema) as again:
            assert [r["content"] for r in again.messages("s")] == ["kept"]
            assert again.sessions()[0]["note"] is None
    with psycopg.connect(postgres_dsn) as conn:
        version = conn.execute(f'SELECT version FROM "{pg.schema}".schema_version').fetchone()
    assert version == (postgres_schema.VERSION,)


def test_reproject_migration_empties_the_tables_and_catch_up_projects_again(
    log: EventLog, postgres_dsn: str, pg: PostgresProjection, monkeypatch: pytest.MonkeyPatch
) -> None:
    log.flush("s", [user("first"), assistant("second")])
    pg.catch_up(log)
    monkeypatch.setattr(postgres_schema, "VERSION", postgres_schema.VERSION + 1)
    with PostgresProjection(postgres_dsn, schema=pg.schema) as again:
        assert again.messages("s") == []
        assert again.catch_up(log) == log.last_seq
        assert [r["content"] for r in again.messages("s")] == ["first", "second"]


def test_a_dropped_connection_fails_one_catch_up_and_the_next_one_reconnects(
    tmp_path: Path, postgres_dsn: str, pg_schema: str
) -> None:
    proj = PostgresProjection(postgres_dsn, schema=pg_schema)
    with EventLog.open(tmp_path / "log") as log:
        log.flush("s", [user("before")])
        proj.catch_up(log)
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:  # the server restarts, say
            assert proj._conn is not None
            admin.execute("SELECT pg_terminate_backend(%s)", (proj._conn.info.backend_pid,))
        log.flush("s", [user("before"), user("while it was down")])  # the log goes on by itself
        with pytest.raises(ProjectionError):
            proj.catch_up(log)
        assert proj.catch_up(log) == 1
        assert [r["content"] for r in proj.messages("s")] == ["before", "while it was down"]
    proj.close()


def cli_run(*args: str, log: Path | None = None) -> Result:
    argv = (["--log", str(log)] if log is not None else []) + list(args)
    return CliRunner().invoke(cli, argv, catch_exceptions=False)


def test_cli_projects_rebuilds_and_reads_postgresql(tmp_path: Path, pg_database: str) -> None:
    one, two = two_hosts(tmp_path)
    ids = one.id, two.id
    one.close()
    two.close()
    for host in ("host1", "host2"):
        done = cli_run("project", "--to", pg_database, log=tmp_path / host)
        assert done.exit_code == 0, done.output
        assert "projected" in done.output and "postgresql://" in done.output
    again = cli_run("rebuild", "--to", pg_database, "--json", log=tmp_path / "host1")
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["applied"] > 0
    listed = cli_run("sessions", "--from", pg_database, "--json")
    assert listed.exit_code == 0, listed.output
    assert {(s["log_id"], s["id"]) for s in json.loads(listed.stdout)} == {
        (ids[0], "chat"),
        (ids[1], "chat"),
        (ids[1], "other"),
    }
    table = cli_run("sessions", "--from", pg_database)
    assert "3 sessions in 2 logs" in table.output
    found = cli_run("search", "beacon", "--from", pg_database, "--json")
    assert found.exit_code == 0, found.output
    assert {r["log_id"] for r in json.loads(found.stdout)} == set(ids)
    shown = cli_run("show", "chat", "--from", pg_database, "--log-id", ids[1], "--json")
    assert shown.exit_code == 0, shown.output
    assert [m["content"] for m in json.loads(shown.stdout)] == ["harbour pilot", "two beacon"]
    ambiguous = cli_run("show", "chat", "--from", pg_database)
    assert ambiguous.exit_code == 1 and "several logs" in ambiguous.stderr and "Traceback" not in ambiguous.output
    missing = cli_run("show", "nope", "--from", pg_database)
    assert missing.exit_code == 1 and "no session 'nope'" in missing.stderr


def test_the_many_hosts_page_examples_run(tmp_path: Path, pg_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from test_docs import NEEDS_SERVER, ROOT, run_examples

    page = ROOT / "docs" / "postgres-hosts.md"
    assert NEEDS_SERVER in page.read_text(encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", pg_database)
    monkeypatch.chdir(tmp_path)
    run_examples(page, tmp_path)


def test_a_schema_of_version_1_gains_redacted_seq_in_place(
    tmp_path: Path, postgres_dsn: str, pg: PostgresProjection
) -> None:
    with EventLog.open(tmp_path / "log") as log:
        log.flush("s", [user("kept")])
        pg.catch_up(log)
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # back to what version 1 wrote
            conn.execute(f'DROP INDEX "{pg.schema}".messages_body')
            conn.execute(f'ALTER TABLE "{pg.schema}".messages DROP COLUMN redacted_seq')
            conn.execute(f'UPDATE "{pg.schema}".schema_version SET version = 1')
        with PostgresProjection(postgres_dsn, schema=pg.schema) as again:
            assert [r["content"] for r in again.messages("s")] == ["kept"]
            assert again.messages("s")[0]["redacted_seq"] is None
            log.flush("s", [user("kept"), user("more")])
            assert again.catch_up(log) == 1
        with psycopg.connect(postgres_dsn) as conn:
            assert conn.execute(f'SELECT version FROM "{pg.schema}".schema_version').fetchone() == (2,)
            assert conn.execute("SELECT to_regclass(%s)", (f'"{pg.schema}".messages_body',)).fetchone()[0] is not None


class _MidwayOther:
    """A log whose events, halfway through, let another host catch up (on its own connection)."""

    def __init__(self, log: EventLog, other: Any) -> None:
        self.log, self.other = log, other
        self.done = False

    @property
    def id(self) -> str:
        return self.log.id

    @property
    def last_seq(self) -> int:
        return self.log.last_seq

    def events(self, after: int = 0) -> Any:
        for record in self.log.events(after=after):
            yield record
            if not self.done and record.seq == 2:
                self.done = True
                self.other()


def test_a_redaction_rebuilds_one_logs_rows_while_another_host_catches_up(
    tmp_path: Path, postgres_dsn: str, pg: PostgresProjection
) -> None:
    """The rebuild of the redacted log's rows is one transaction holding that log's rows and
    checkpoint only: another host's catch-up meanwhile neither waits (its locks would time out)
    nor is touched."""
    if not hasattr(EventLog, "redact"):
        pytest.skip("EventLog.redact is not built yet")
    one, two = two_hosts(tmp_path)
    with one, two:
        one.flush("chat", [*one.messages("chat"), user("my pin is 80417secret")])
        pg.catch_up(one)
        pg.catch_up(two)
        one.redact("chat", 2, reason="a pin")
        two.flush("other", [user("tide tables"), assistant("high water at six")])
        waited = {"applied": -1}
        other = PostgresProjection(f"{postgres_dsn}?options=-c%20lock_timeout%3D5000", schema=pg.schema)

        def catch_up_two() -> None:
            waited["applied"] = other.catch_up(two)

        source = _MidwayOther(one, catch_up_two)
        assert pg.catch_up(source) == one.last_seq  # rebuilt
        other.close()
        assert source.done and waited["applied"] == 1
        assert [m["content"] for m in pg.messages("chat", log_id=one.id)][2] == "[redacted]"
        assert pg.messages("chat", log_id=one.id)[2]["redacted_seq"] == one.last_seq
        assert pg.search("80417secret") == []
        assert [m["content"] for m in pg.messages("other", log_id=two.id)] == ["tide tables", "high water at six"]


@pytest.mark.parametrize("ahead", [1, 2])
def test_a_checkpoint_moved_forward_without_its_hash_is_refused(
    log: EventLog, postgres_dsn: str, pg_schema: str, pg: PostgresProjection, ahead: int
) -> None:
    """A checkpoint moved past events whose rows were never written, its hash cleared (by hand or
    a tool), must not make catch-up skip those events."""
    log.flush("s", [user("a")])
    pg.catch_up(log)
    log.flush("s", [user("a"), assistant("b")])
    log.flush("t", [user("c")])
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{pg_schema}".checkpoints SET last_seq = last_seq + %s, last_hash = NULL WHERE log_id = %s',
            (ahead, log.id),
        )
    with pytest.raises(ProjectionCorruptError, match="checkpoint"):
        pg.catch_up(log)
    assert [r["content"] for r in pg.messages("s")] == ["a"]  # nothing applied on top of it
    assert pg.rebuild(log) == log.last_seq
    assert [r["content"] for r in pg.messages("s")] == ["a", "b"]


def test_a_checkpoint_without_its_hash_at_its_rows_catches_up(
    log: EventLog, postgres_dsn: str, pg_schema: str, pg: PostgresProjection
) -> None:
    """A hashless checkpoint that still names the newest event applied is caught up from there."""
    log.flush("s", [user("a")])
    pg.catch_up(log)
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'UPDATE "{pg_schema}".checkpoints SET last_hash = NULL WHERE log_id = %s', (log.id,))
    log.flush("s", [user("a"), assistant("b")])
    assert pg.catch_up(log) >= 1
    assert [r["content"] for r in pg.messages("s")] == ["a", "b"]
