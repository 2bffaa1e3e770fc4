"""Bulk import, replay and projection rebuild at 100,000 messages.

What it measures:

- bulk import: 100,000 messages as 100 sessions of 1,000, one ``flush`` per
  session, into a fresh log with ``durability="none"`` and then with ``"full"``;
  messages/s over the whole import and the latency of each 1,000-message flush;
- replay: ``log.messages(sid)`` of one 100,000-message session (built with
  ``append`` in chunks of 10,000), repeated; messages/s;
- projection rebuild: ``SQLiteProjection(path).rebuild(log)`` of the 100,000
  imported messages (rows, sessions and the FTS5 index), repeated; rows/s.
  Skipped with a message while ``projections`` cannot be imported.  Beside it, its
  floor: SQLite alone writing the same rows, prebuilt, with the same statements;
- the import's floor on this machine: the canonical encoding and the two SHA-256
  digests of every message, with nothing validated or stored.

Targets: import >= 250k msg/s (durability none), replay >= 500k msg/s,
rebuild >= 50k rows/s.

Run it::

    python -m benchmarks.bench_bulk             # 100,000 messages
    python -m benchmarks.bench_bulk --quick     # 10,000
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.bench_reflush import rehash_all
from benchmarks.harness import now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.systems import projection_available
from benchmarks.workload import Workload
from eventlog import EventLog

PER_SESSION = 1_000


def run(
    *, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None, repeats: int | None = None
) -> dict[str, Any]:
    total = messages or (10_000 if quick else 100_000)
    repeats = repeats or (1 if quick else 3)
    per_session = min(PER_SESSION, total)
    sessions = [Workload(salt=f"bulk-{i}").messages(per_session) for i in range(max(1, total // per_session))]
    count = sum(map(len, sessions))
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with scratch(scratch_dir, "bulk-") as root:
        for mode in ("none", "full"):
            samples: list[int] = []
            with EventLog.open(root / f"import-{mode}", durability=mode) as log, quiet_gc():
                for i, messages in enumerate(sessions):
                    start = now_ns()
                    log.flush(f"session-{i}", messages)
                    samples.append(now_ns() - start)
            row = {
                "system": f"bulk import ({len(sessions)} flushes of {per_session:,})",
                "durability": mode,
                "messages": count,
            }
            row.update(summary(samples, per_session))
            row["unit"] = "msgs/s"
            rows.append(row)

        # One long session for replay.
        with EventLog.open(root / "replay", durability="none") as log:
            chunk: list[dict[str, Any]] = []
            for messages in sessions:
                chunk.extend(messages)
                if len(chunk) >= 10_000:
                    log.append("long", chunk)
                    chunk = []
            if chunk:
                log.append("long", chunk)
            samples = []
            with quiet_gc():
                for _ in range(repeats):
                    start = now_ns()
                    replayed = log.messages("long")
                    samples.append(now_ns() - start)
            assert len(replayed) == count
            del replayed
            row = {"system": f"replay of one {count:,}-message session", "durability": "-", "messages": count}
            row.update(summary(samples, count))
            row["unit"] = "msgs/s"
            rows.append(row)
        rows.append(_import_floor(sessions, repeats, count))

        reason = projection_available()
        name = f"projection rebuild of {count:,} messages"
        if reason:
            skipped[name] = reason
        else:
            from projections import SQLiteProjection

            with EventLog.open(root / "import-none", durability="none") as log:
                samples = []
                for i in range(repeats):
                    projection = SQLiteProjection(root / f"rebuild-{i}.db")
                    try:
                        os.sync()  # untimed: the imports' writeback is not the rebuild's to wait for
                        with quiet_gc():
                            start = now_ns()
                            projection.rebuild(log)
                            samples.append(now_ns() - start)
                        found = len(projection.messages("session-0"))
                        assert found == per_session, f"the projection holds {found} rows of session-0"
                    finally:
                        projection.close()
            row = {"system": name + " (rows + FTS5)", "durability": "-", "messages": count}
            row.update(summary(samples, count))
            row["unit"] = "rows/s"
            rows.append(row)
            rows.append(_sqlite_floor(root, root / "rebuild-0.db", repeats, count))
    return {"scenario": "bulk import, replay, rebuild", "messages": count, "rows": rows, "skipped": skipped}


def _import_floor(sessions: list[list[dict[str, Any]]], repeats: int, count: int) -> dict[str, Any]:
    """What an import costs at least in a content-addressed log, with nothing validated or
    stored: per message its canonical encoding, its content digest and its node digest
    (:func:`~benchmarks.bench_reflush.rehash_all`)."""
    samples = []
    with quiet_gc():
        for _ in range(repeats):
            start = now_ns()
            for messages in sessions:
                rehash_all(messages)
            samples.append(now_ns() - start)
    row = {"system": "floor: import's encoding and two digests per message alone", "durability": "-", "messages": count}
    row.update(summary(samples, count))
    row["unit"] = "msgs/s"
    return row


def _sqlite_floor(root: Path, rebuilt: Path, repeats: int, count: int) -> dict[str, Any]:
    """SQLite alone writing the rows a rebuild wrote, prebuilt: the same schema, settings,
    statements and bulks (rows, then their FTS5 index), in one transaction in rollback-journal
    mode, as a rebuild with the file to itself.  No Python derivation and no reading of the log,
    so each bulk is indexed the way that is fastest with nothing running beside it (rows read,
    then one ``INSERT ... VALUES`` each; the rebuild runs one ``INSERT ... SELECT`` on a helper
    thread, beside its derivation of the next bulk)."""
    import sqlite3

    from projections import SQLiteProjection
    from projections.core import ROW_COLUMNS, ROWS_PER_WRITE
    from projections.sqlite_store import INSERT_ROW, index_pending

    source = sqlite3.connect(rebuilt)
    prebuilt = source.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM messages ORDER BY id").fetchall()
    source.close()
    samples = []
    for i in range(repeats):
        target = SQLiteProjection(root / f"floor-{i}.db")  # the projection's schema and settings
        db = target._db
        db.execute("PRAGMA journal_mode = DELETE")
        db.execute("PRAGMA synchronous = FULL")
        os.sync()
        with quiet_gc():
            start = now_ns()
            db.execute("BEGIN IMMEDIATE")
            for at in range(0, len(prebuilt), ROWS_PER_WRITE):
                db.executemany(INSERT_ROW, prebuilt[at : at + ROWS_PER_WRITE])
                index_pending(db, at)
            db.execute("COMMIT")
            samples.append(now_ns() - start)
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == len(prebuilt)
        target.close()
    row = {"system": "floor: SQLite alone, the same rows prebuilt (rows + FTS5)", "durability": "-", "messages": count}
    row.update(summary(samples, count))
    row["unit"] = "rows/s"
    return row


COLUMNS = [
    ("system", "operation"),
    ("durability", "durability"),
    ("n", "runs"),
    ("median_ms", "median ms (per flush / per run)"),
    ("p99_ms", "p99 ms"),
    ("msgs_per_s", "messages (rows)/s"),
]


def render(result: dict[str, Any]) -> str:
    lines = [f"Bulk operations at {result['messages']:,} messages", "", table(result["rows"], COLUMNS)]
    for name, why in result["skipped"].items():
        lines.append(f"\nskipped {name}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
