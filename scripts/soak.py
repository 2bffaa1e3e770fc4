"""Soak test: many processes flushing for a while; memory stays flat, the log stays consistent.

Each of ``--procs`` processes owns ``--sessions`` sessions and, for ``--seconds``,
grows a random one by a turn and flushes the whole list (re-flushing the same
list now and then, as several exit paths of an agent loop do, and rewinding long
sessions).  It records each flush's latency and its RSS after warm-up and at the
end.  The parent then verifies the log, checks every session holds what its
writer last flushed, catches a SQLite projection up and compares it with a
rebuild, and prints flushes/s, p50/p99 latency and RSS growth.

    python scripts/soak.py --procs 8 --sessions 4 --seconds 60
    python scripts/soak.py --procs 8 --seconds 600 --durability process --json soak.json

Exit status 0 when the log and projection are consistent and RSS grew less
than ``--max-rss-growth-mb`` in every process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# Run from a checkout: the packages next to this script, and the crash harness beside it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0  # pragma: no cover - not Linux


def worker(path: str, durability: str, proc: int, sessions: int, seconds: float, seed: int, out: Any) -> None:
    from eventlog import EventLog

    rng = random.Random(seed)
    names = [f"p{proc}s{j}" for j in range(sessions)]
    lists: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
    latencies: list[float] = []
    written = 0
    rss_warm = None
    with EventLog.open(path, durability=durability) as log:
        start = time.monotonic()
        while (now := time.monotonic()) - start < seconds:
            if rss_warm is None and now - start > min(2.0, seconds / 4):
                rss_warm = _rss_mb()
            s = rng.choice(names)
            current = lists[s]
            roll = rng.random()
            if len(current) > 200:
                current = lists[s] = current[: rng.randint(1, 50)]
            elif roll < 0.8:
                current.append(
                    {
                        "role": "user" if len(current) % 2 else "assistant",
                        "content": f"{s} turn {len(current)} " + "x" * rng.randint(50, 1500),
                    }
                )
            t0 = time.perf_counter()
            result = log.flush(s, current)
            latencies.append(time.perf_counter() - t0)
            written += result.appended
        final = {s: len(v) for s, v in lists.items()}
    out.put(
        {
            "proc": proc,
            "latencies": latencies,
            "written": written,
            "rss_warm": rss_warm or _rss_mb(),
            "rss_end": _rss_mb(),
            "final": final,
        }
    )


def run(
    workdir: str | os.PathLike[str],
    *,
    procs: int = 8,
    sessions: int = 4,
    seconds: float = 10.0,
    durability: str = "full",
    seed: int = 0,
) -> dict[str, Any]:
    """Run the soak in ``workdir`` and return the figures and the problems found."""
    from eventlog import EventLog

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    path = str(workdir / "log")
    with EventLog.open(path, durability=durability):
        pass  # create it once, so the writers do not race to initialise it
    ctx = mp.get_context("spawn")  # never use an open log across fork()
    queue = ctx.Queue()
    started = time.monotonic()
    children = [
        ctx.Process(target=worker, args=(path, durability, p, sessions, seconds, seed + p, queue)) for p in range(procs)
    ]
    for child in children:
        child.start()
    results = [queue.get(timeout=seconds + 120) for _ in children]
    for child in children:
        child.join(timeout=60)
    queue.close()
    queue.join_thread()
    elapsed = time.monotonic() - started
    problems = [f"process {c.pid} exited with {c.exitcode}" for c in children if c.exitcode != 0]
    latencies = sorted(x for r in results for x in r["latencies"])
    with EventLog.open(path) as log:
        report = log.verify()
        if not report.ok:
            problems.append(f"verify: {report}")
        for r in results:
            for s, n in r["final"].items():
                got = len(log.messages(s)) if s in log else 0
                if got != n:
                    problems.append(f"{s}: {got} messages stored, {n} last flushed")
        events = log.last_seq
        projection = "not available"
        try:
            from projections import SQLiteProjection
        except ImportError:
            SQLiteProjection = None  # type: ignore[assignment,misc]
        if SQLiteProjection is not None:
            from crash_harness import _tables  # type: ignore[import-not-found]

            with SQLiteProjection(workdir / "p.db") as a, SQLiteProjection(workdir / "rebuilt.db") as b:
                a.catch_up(log)
                b.rebuild(log)
            same = _tables(workdir / "p.db") == _tables(workdir / "rebuilt.db")
            projection = "equals rebuild" if same else "DIFFERS from rebuild"
            if not same:
                problems.append("projection caught up differs from a rebuild")
    growth = [r["rss_end"] - r["rss_warm"] for r in results]
    return {
        "procs": procs,
        "sessions": procs * sessions,
        "seconds": round(elapsed, 1),
        "durability": durability,
        "flushes": len(latencies),
        "flushes_per_s": round(len(latencies) / seconds, 1),
        "messages_written": sum(r["written"] for r in results),
        "events": events,
        "p50_ms": round(1000 * statistics.median(latencies), 3) if latencies else None,
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 3) if latencies else None,
        "rss_warm_mb": round(max(r["rss_warm"] for r in results), 1),
        "rss_end_mb": round(max(r["rss_end"] for r in results), 1),
        "rss_growth_mb_max": round(max(growth), 1),
        "projection": projection,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--procs", type=int, default=8)
    parser.add_argument("--sessions", type=int, default=4, help="sessions per process")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--durability", default="full", choices=["full", "process", "none"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-rss-growth-mb", type=float, default=32.0)
    parser.add_argument("--workdir")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="soak-"))
    figures = run(
        base, procs=args.procs, sessions=args.sessions, seconds=args.seconds, durability=args.durability, seed=args.seed
    )
    if figures["rss_growth_mb_max"] > args.max_rss_growth_mb:
        figures["problems"].append(f"RSS grew by {figures['rss_growth_mb_max']} MB in a process")
    for key, value in figures.items():
        print(f"{key:20} {value}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    ok = not figures["problems"]
    if ok and not args.workdir:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
