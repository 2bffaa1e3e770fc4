"""Per-turn durable flush: our log against the stores agents use today, on one workload.

What it measures: one session grows by one agent turn (10 messages) at a time up to
5,000 messages; after each turn every system persists it the way its users do
(see ``benchmarks/systems.py``): our ``flush`` of the whole list (default and
trust-identity mode, full and process-crash-safe durability, and both modes without
syncs, where the default mode's edit check shows against trust mode with no disk in the
way), our ``append``,
both with and without the SQLite projection attached (timed until its rows are
current, and once as the call alone, whose catch-up on the log's thread finishes
untimed; once more waiting for its search index: end to end), hermes-agent's ``SessionDB``, ``eventsourcing``,
the OpenAI Agents SDK ``SQLiteSession``, a plain SQLite baseline and the floors
(a raw ``fdatasync``; a bare py-lmdb commit; that commit with each message's content
and node digests; that after the product's C check of every held message against
its record, the least that noticing in-place edits costs; either of the last two followed by
SQLite alone writing and indexing the turn's prebuilt rows: the end-to-end floors; and the
digested commit followed by SQLite alone writing the rows: the floor of rows current).

The systems run in lockstep, in a shuffled order each turn, each in its own
directory of one scratch folder on the repository's disk, so that noise from a
shared machine hits all of them alike.  Reported per system: median, p90, p99
latency of a turn's write, messages/s, and the ratio of its median to ours
(``eventlog flush [full] +projection rows current``: the agent's view), in the same run.

Run it (from the repository root)::

    python -m benchmarks.bench_flush            # 5,000 messages, about a minute
    python -m benchmarks.bench_flush --quick    # 300 messages
    python -m benchmarks.bench_flush --json out.json
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from benchmarks import systems as sy
from benchmarks.harness import LATENCY_COLUMNS, add_ratios, now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import Workload

REFERENCE = "eventlog flush [full] +projection rows current"
FALLBACK_REFERENCE = "eventlog flush [full]"


def all_systems() -> list[sy.System]:
    return [
        sy.EventLogSystem(projection="rows"),
        sy.EventLogSystem(durability="process", projection="rows"),
        sy.EventLogSystem(trust=True, projection="rows"),
        sy.EventLogSystem(durability="process", trust=True, projection="rows"),
        sy.EventLogSystem(projection="attached"),
        sy.EventLogSystem(trust=True, projection="attached"),
        sy.EventLogSystem(projection="search"),
        sy.EventLogSystem(trust=True, projection="search"),
        sy.EventLogSystem(),
        sy.EventLogSystem(pure_python=True),
        sy.EventLogSystem(trust=True),
        sy.EventLogSystem(durability="process", trust=True),
        sy.EventLogSystem(durability="process"),
        sy.EventLogSystem(durability="none"),  # the default mode's check against trust mode, no disk in the way
        sy.EventLogSystem(durability="none", trust=True),
        sy.EventLogSystem(mode="append"),
        sy.HermesSystem(batch=True),
        sy.HermesSystem(batch=False),
        sy.EventSourcingSystem(),
        sy.OpenAISessionSystem(),
        sy.PlainSQLiteSystem(),
        sy.RawFsyncSystem(),
        sy.BareLMDBSystem("full"),
        sy.BareLMDBSystem("process"),
        sy.BareLMDBSystem("full", addressed=True),
        sy.BareLMDBSystem("process", addressed=True),
        sy.InPlaceCheckFloor("full"),
        sy.InPlaceCheckFloor("process"),
        sy.TranscriptFloor("full", check=False, search=False),
        sy.TranscriptFloor("process", check=False, search=False),
        sy.TranscriptFloor("full", check=False),
        sy.TranscriptFloor("full", check=True),
    ]


def run(
    *, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None, only: list[str] | None = None
) -> dict[str, Any]:
    """Run every available system through one growing session; return rows, series and skips."""
    total = messages or (300 if quick else 5000)
    candidates = [s for s in all_systems() if only is None or s.name in only]
    skipped: dict[str, str] = {}
    series: dict[str, list[int]] = {}
    lengths: list[int] = []
    active: list[sy.System] = []
    order = random.Random(5)
    with scratch(scratch_dir, "flush-") as root:
        try:
            for i, system in enumerate(candidates):
                directory = root / f"s{i}"
                directory.mkdir()
                try:
                    system.open(directory)
                except sy.Skip as e:
                    skipped[system.name] = str(e)
                    continue
                active.append(system)
                series[system.name] = []
            with quiet_gc():
                for messages_so_far, new in Workload().session(total):
                    lengths.append(len(messages_so_far))
                    turn_order = active[:]
                    order.shuffle(turn_order)
                    for system in turn_order:
                        system.prepare("session-1", messages_so_far, new)
                        start = now_ns()
                        system.turn("session-1", messages_so_far, new)
                        series[system.name].append(now_ns() - start)
                        system.settle()
        finally:
            for system in active:
                system.close()
    turn_sizes = [b - a for a, b in zip([0, *lengths], lengths)]
    rows = []
    for system in active:
        row = {"system": system.name, "kind": system.kind, "durability": system.durability}
        row.update(summary(series[system.name], turn_sizes))
        rows.append(row)
    reference = REFERENCE if REFERENCE in series else FALLBACK_REFERENCE
    add_ratios(rows, reference)
    return {
        "scenario": "per-turn flush",
        "messages": total,
        "messages_per_turn": 10,
        "reference": reference,
        "rows": rows,
        "skipped": skipped,
        "lengths": lengths,
        "series_ns": series,
    }


def render(result: dict[str, Any]) -> str:
    out = [
        f"Per-turn write, one session growing by 10 messages/turn to {result['messages']:,} "
        f"(ratio: the system's median / {result['reference']}'s)",
        "",
        table(result["rows"], LATENCY_COLUMNS),
    ]
    for name, why in result["skipped"].items():
        out.append(f"\nskipped {name}: {why}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
