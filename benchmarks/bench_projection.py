"""Sustained turns with the SQLite projection: what the projection costs an agent per turn.

What it measures: one session grows by one agent turn (10 messages) at a time, flushed in
trust mode with ``durability="full"``.  Each system runs blocks of turns back to back
(``BLOCK`` turns, then it waits until the projection's rows are current), and the block is
timed from its first flush to rows current, so the projection's whole cost is counted: its
catch-up rounds on the log's thread (which contend for the GIL with the writer) and what is
left at the end.  Systems take blocks in turn, in a shuffled order each round, on one seeded
workload; each system's session is its own list, grown in place by each turn the way an
agent's is.  Reported per system: the median block's time per turn and the ratio to the
flush alone.  Systems: the flush with no projection; with the projection attached, caught up
on the log's thread, gathering writes into rounds (``eventlog.projector.COALESCE_WRITES``),
waited for with a timeout (``sync_projections(timeout=60)``: the projector's thread runs the
last round while the caller waits); the same waited for with no timeout, as the projection's
own read methods wait (the caller runs the last round on its own thread, one thread hand-over
sooner); the same with a round per write, as the projector did without gathering; and with the
projection caught up in a process of its own (``projection_process=True``,
``eventlog/offload.py``), where its work does not take turns with the writer for the GIL.

Run it (from the repository root)::

    python -m benchmarks.bench_projection            # 6,000 messages
    python -m benchmarks.bench_projection --quick
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.harness import now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.systems import projection_available
from benchmarks.workload import MESSAGES_PER_TURN, Workload
from eventlog import EventLog, projector

BLOCK = 10
"""Turns a system runs back to back before it waits for its rows."""

ALONE = "flush trust [full], no projection"
GATHERED = "flush trust [full] +projection, rounds gather writes"
HERE = "flush trust [full] +projection, rounds gather writes, waited for with no timeout"
PER_WRITE = "flush trust [full] +projection, a round per write"
IN_PROCESS = "flush trust [full] +projection in a process of its own"


@contextmanager
def gathering(enabled: bool) -> Iterator[None]:
    saved = projector.COALESCE_WRITES, projector.COALESCE_LAG
    if not enabled:
        projector.COALESCE_WRITES, projector.COALESCE_LAG = 1, 0.0
    try:
        yield
    finally:
        projector.COALESCE_WRITES, projector.COALESCE_LAG = saved


def run(*, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None) -> dict[str, Any]:
    total = messages or (600 if quick else 6000)
    turns = [new for _, new in Workload(salt="projection").session(total)]
    blocks = [turns[i : i + BLOCK] for i in range(0, len(turns), BLOCK)]
    skipped: dict[str, str] = {}
    names = [ALONE]
    reason = projection_available()
    if reason:
        skipped[GATHERED] = skipped[HERE] = skipped[PER_WRITE] = skipped[IN_PROCESS] = reason
    else:
        names += [GATHERED, HERE, PER_WRITE, IN_PROCESS]
    samples: dict[str, list[int]] = {name: [] for name in names}
    order = random.Random(11)
    with scratch(scratch_dir, "projection-") as root:
        logs: dict[str, EventLog] = {}
        owned: list[Any] = []
        try:
            for i, name in enumerate(names):
                attached = []
                if name != ALONE:
                    from projections import SQLiteProjection

                    attached.append(SQLiteProjection(root / f"{i}.db"))
                    owned.extend(attached)
                logs[name] = EventLog.open(
                    root / f"log{i}", trust_identity=True, projections=attached, projection_process=name == IN_PROCESS
                )
            sessions: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            with quiet_gc():
                for block in blocks:
                    for name in order.sample(names, len(names)):
                        log, session = logs[name], sessions[name]
                        with gathering(name != PER_WRITE):
                            start = now_ns()
                            for turn in block:
                                session += turn
                                log.flush("s", session)
                            assert log.sync_projections() if name == HERE else log.sync_projections(timeout=60)
                            samples[name].append((now_ns() - start) // len(block))
        finally:
            for log in logs.values():
                log.close()
            for projection in owned:
                projection.close()
    rows = []
    for name in names:
        row = {"system": name, "durability": "LMDB sync+metasync; projection: SQLite WAL synchronous=NORMAL"}
        row.update(summary(samples[name], MESSAGES_PER_TURN))
        rows.append(row)
    alone = rows[0]["median_ms"]
    for row in rows:
        row["x_alone"] = row["median_ms"] / alone if alone else None
    return {
        "scenario": "sustained turns with the projection",
        "messages": total,
        "block": BLOCK,
        "rows": rows,
        "skipped": skipped,
    }


def render(result: dict[str, Any]) -> str:
    out = [
        f"Turns of 10 messages to {result['messages']:,}, in blocks of {result['block']} timed until the projection's "
        "rows are current (per turn; ratio: to the flush alone)",
        "",
        table(
            result["rows"],
            [
                ("system", "system"),
                ("median_ms", "ms per turn (median block)"),
                ("p90_ms", "p90"),
                ("x_alone", "x flush alone"),
            ],
        ),
    ]
    for name, why in result["skipped"].items():
        out.append(f"\nskipped {name}: {why}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
