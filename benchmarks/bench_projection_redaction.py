"""What a redaction costs a SQLite projection that had applied the erased message.

What it measures: a log of ``messages`` messages (sessions of 100 seeded agent messages) and a
copy of it in which one early message was redacted (``EventLog.redact``).  A projection of the
log, caught up, is copied before each timed run, so every run starts from the same file:

- **rebuild in place (WAL)**: ``rebuild(log)`` of the unredacted log into the copy, the
  default for a projection that holds rows: one transaction through the WAL;
- **rebuild in place, exclusive**: ``rebuild(log, exclusive=True)``: the same in
  rollback-journal mode, pages written once;
- **catch-up after the redaction**: ``catch_up(redacted)`` of the copy, which finds its
  checkpoint rewritten and rebuilds into a fresh file copied over the projection (SQLite's
  backup), then truncates the WAL: the path that erases.

Runs take turns in a shuffled order each round; reported: the median of each and its ratio to
the rebuild in place (WAL).  The projection is SQLite WAL ``synchronous=NORMAL``; the logs
are written with ``durability="none"`` (they are only read here).

Run it (from the repository root)::

    python -m benchmarks.bench_projection_redaction            # 20,000 messages, 5 rounds
    python -m benchmarks.bench_projection_redaction --quick
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from benchmarks.harness import add_ratios, now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import Workload
from eventlog import EventLog
from projections import SQLiteProjection

IN_PLACE = "rebuild in place (WAL)"
EXCLUSIVE = "rebuild in place, exclusive"
ERASING = "catch-up after the redaction (fresh file, copy, WAL truncated)"
SESSION = 100
"""Messages per session."""


def _write(path: Path, messages: int) -> None:
    stream = Workload(salt="redaction").messages(messages)
    with EventLog.open(path, durability="none") as log:
        for start in range(0, messages, SESSION):
            log.flush(f"s{start // SESSION}", stream[start : start + SESSION])


def run(
    *, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None, rounds: int | None = None
) -> dict[str, Any]:
    total = messages or (2000 if quick else 20_000)
    repeats = rounds or (2 if quick else 5)
    samples: dict[str, list[int]] = {IN_PLACE: [], EXCLUSIVE: [], ERASING: []}
    with scratch(scratch_dir, "projection-redaction-") as root:
        _write(root / "log", total)
        shutil.copytree(root / "log", root / "redacted")
        with SQLiteProjection(root / "base.db") as base, EventLog.open(root / "log") as log:
            base.catch_up(log)
        with EventLog.open(root / "log") as log, EventLog.open(root / "redacted") as redacted:
            redacted.redact("s0", 1, reason="benchmark")
            order = random.Random(11)
            db = root / "run.db"
            for _ in range(repeats):
                names = list(samples)
                order.shuffle(names)
                for name in names:
                    shutil.copy(root / "base.db", db)
                    with SQLiteProjection(db) as proj, quiet_gc():
                        start = now_ns()
                        if name == IN_PLACE:
                            proj.rebuild(log)
                        elif name == EXCLUSIVE:
                            proj.rebuild(log, exclusive=True)
                        else:
                            proj.catch_up(redacted)
                        samples[name].append(now_ns() - start)
                    for suffix in ("", "-wal", "-shm"):
                        Path(f"{db}{suffix}").unlink(missing_ok=True)
    rows = [{"system": name, "runs": len(times), **summary(times)} for name, times in samples.items()]
    add_ratios(rows, IN_PLACE)
    return {"scenario": "SQLite projection after a redaction", "messages": total, "rows": rows}


COLUMNS = [
    ("system", "run"),
    ("runs", "runs"),
    ("median_ms", "median ms"),
    ("ratio", "x rebuild in place (WAL)"),
]


def render(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"A SQLite projection of {result['messages']:,} messages that had applied a message now redacted",
            "",
            table(result["rows"], COLUMNS),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
