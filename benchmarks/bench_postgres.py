"""PostgreSQL projection: rebuild and bulk catch-up of 100,000 messages, against COPY alone.

What it measures:

- rebuild: ``PostgresProjection(dsn).rebuild(log)`` of a log of 100,000 messages (100
  sessions of 1,000, the agent-turn workload), into a fresh schema: rows with their
  stored ``tsvector`` and GIN index, sessions and the checkpoint, in one transaction;
  rows/s, repeated;
- bulk catch-up: ``catch_up(log)`` of the same log into a fresh schema (transactions of
  20,000 messages, each recording the checkpoint); rows/s;
- the floor: PostgreSQL's own ``COPY ... FROM STDIN`` of the very rows a rebuild wrote,
  prebuilt (taken out with ``COPY ... TO STDOUT``), into the same table in a fresh schema
  (the same generated ``tsvector``, GIN and b-tree indexes), in one transaction: the cost
  of the rows in the database with no Python, no log reading and no derivation;
- beside it, the same COPY into a bare copy of the table (no search column, no index): what
  the rows alone cost the server, so what search and the indexes add.

Target: rebuild >= 50k rows/s with search; the ratio to the floor says how much of the
time is the projection's own.  The server is the one ``EVENTLOG_BENCH_POSTGRES`` (or
``EVENTLOG_TEST_POSTGRES``) names, else a throwaway cluster started with
``scripts/pg_cluster.sh`` (fsync off: a projection needs no durability of its own, the
log is the source of truth).

Run it::

    python -m benchmarks.bench_postgres            # 100,000 messages
    python -m benchmarks.bench_postgres --quick    # 10,000
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import add_ratios, now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import Workload
from eventlog import EventLog

PER_SESSION = 1_000
FLOOR = "floor: PostgreSQL's COPY of the same rows, prebuilt (rows + tsvector + GIN)"
BARE = "PostgreSQL's COPY of the same rows into a bare table (no search column, no index)"
CLUSTER = Path(__file__).resolve().parent.parent / "scripts" / "pg_cluster.sh"


@contextmanager
def server() -> Iterator[str]:
    """A PostgreSQL DSN: the one the environment names, else a throwaway cluster."""
    given = os.environ.get("EVENTLOG_BENCH_POSTGRES") or os.environ.get("EVENTLOG_TEST_POSTGRES")
    if given:
        yield given
        return
    folder = Path(tempfile.mkdtemp(prefix="eventlog-bench-pg-")) / "cluster"
    started = subprocess.run(["bash", str(CLUSTER), "start", str(folder)], capture_output=True, text=True, check=True)
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run(["bash", str(CLUSTER), "stop", str(folder)], capture_output=True)
        folder.parent.rmdir()


def run(
    *, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None, repeats: int | None = None
) -> dict[str, Any]:
    import psycopg

    from projections.postgres import PostgresProjection

    total = messages or (10_000 if quick else 100_000)
    repeats = repeats or (1 if quick else 3)
    per_session = min(PER_SESSION, total)
    rows: list[dict[str, Any]] = []
    schemas: list[str] = []

    def fresh() -> str:
        name = f"bench_{uuid.uuid4().hex[:10]}"
        schemas.append(name)
        return name

    with scratch(scratch_dir, "postgres-") as root, server() as dsn:
        with EventLog.open(root / "log", durability="none") as log:
            for i in range(max(1, total // per_session)):
                log.flush(f"session-{i}", Workload(salt=f"pg-{i}").messages(per_session))
            count = sum(len(log.messages(sid)) for sid in log.sessions())
            try:
                for kind in ("rebuild", "catch-up"):
                    samples = []
                    for _ in range(repeats):
                        with PostgresProjection(dsn, schema=fresh()) as proj, quiet_gc():
                            start = now_ns()
                            proj.rebuild(log) if kind == "rebuild" else proj.catch_up(log)
                            samples.append(now_ns() - start)
                            assert len(proj.messages("session-0")) == per_session
                    name = (
                        f"rebuild of {count:,} messages (rows + tsvector + GIN)"
                        if kind == "rebuild"
                        else f"bulk catch-up of {count:,} messages (20,000 per transaction)"
                    )
                    row = {"system": name, "messages": count}
                    row.update(summary(samples, count))
                    rows.append(row)
                rows.append(_floor(dsn, schemas[0], fresh, repeats, count, psycopg))
                rows.append(_floor(dsn, schemas[0], fresh, repeats, count, psycopg, bare=True))
            finally:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    for name in schemas:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    for row in rows:
        row["unit"] = "rows/s"
    add_ratios(rows, FLOOR)
    return {"scenario": "PostgreSQL projection", "messages": count, "rows": rows, "skipped": {}}


def _floor(
    dsn: str, rebuilt: str, fresh: Any, repeats: int, count: int, psycopg: Any, bare: bool = False
) -> dict[str, Any]:
    """COPY of the rows a rebuild wrote into a fresh schema's ``messages``; ``bare``: into a
    copy of the table without its generated search column and without any index, to show
    what search and the indexes cost."""
    from projections.core import ROW_COLUMNS
    from projections.postgres import PostgresProjection

    columns = ", ".join(("log_id", *ROW_COLUMNS))
    with psycopg.connect(dsn) as conn:
        prebuilt = bytearray()
        with conn.cursor().copy(
            f'COPY (SELECT {columns} FROM "{rebuilt}".messages ORDER BY seq, idx) TO STDOUT'
        ) as out:
            for block in out:
                prebuilt += block
    samples = []
    for _ in range(repeats):
        schema = fresh()
        PostgresProjection(dsn, schema=schema).close()  # the same tables and indexes
        if bare:
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP TABLE "{schema}".messages')
                conn.execute(f'CREATE TABLE "{schema}".messages (LIKE "{rebuilt}".messages INCLUDING DEFAULTS)')
                conn.execute(f'ALTER TABLE "{schema}".messages DROP COLUMN search')
        with psycopg.connect(dsn) as conn, quiet_gc():
            start = now_ns()
            with conn.cursor().copy(f'COPY "{schema}".messages ({columns}) FROM STDIN') as into:
                view = memoryview(prebuilt)
                for at in range(0, len(view), 1 << 20):
                    into.write(view[at : at + (1 << 20)])
            conn.commit()
            samples.append(now_ns() - start)
            copied = conn.execute(f'SELECT count(*) FROM "{schema}".messages').fetchone()[0]
        assert copied == count, (copied, count)
    row = {"system": BARE if bare else FLOOR, "messages": count}
    row.update(summary(samples, count))
    return row


COLUMNS = [
    ("system", "operation"),
    ("n", "runs"),
    ("median_ms", "median ms"),
    ("msgs_per_s", "rows/s"),
    ("ratio", "x floor"),
]


def render(result: dict[str, Any]) -> str:
    return "\n".join([f"PostgreSQL projection at {result['messages']:,} messages", "", table(result["rows"], COLUMNS)])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
