"""AsyncEventLog under many asyncio tasks: shared commits and the event loop's lag.

What it measures: 64 asyncio tasks on one event loop, each owning one session that it grows
by one agent turn (10 messages) at a time, awaiting ``AsyncEventLog.flush`` of its whole list
after every turn, durability ``full`` (and once ``process``).  All tasks start together.
Against it, in the same run: one task doing the same turns alone (the serial rate).
Reported for each case: total turns/s (turns flushed / wall time), the multiple of the
serial rate (goal: 64 tasks >= 2.5x), flush latency percentiles, flushes per commit (the
tasks' flushes a commit carried: batches and group commit) and writes per commit (a batch of
flushes is one write; more writes than commits: group commit merged them), the CPU time the
event loop's thread spent per flush (the loop's share of the handoffs to workers and back; the
monitor's ticks, as the idle loop costs them, left out),
and the event loop's lag while the tasks
ran: a monitor task asks to wake every millisecond and records how late each wake-up comes;
the worst and the 99th percentile are reported (goal: worst <= 5 ms).  Every case runs
five times (``--quick``: once), round by round in a shuffled order; the median run is shown,
and the ratios of the runs paired round by round.

Run it (from the repository root)::

    python -m benchmarks.bench_aio            # 64 tasks x 20 turns, about a minute
    python -m benchmarks.bench_aio --quick
    python -m benchmarks.bench_aio --json out.json
"""

from __future__ import annotations

import asyncio
import random
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import lmdb

from benchmarks.harness import now_ns, percentile, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import MESSAGES_PER_TURN, Workload
from eventlog.aio import DEFAULT_WORKERS, AsyncEventLog

TASKS = 64
TICK_S = 0.001


def plan(task: int, turns: int) -> list[list[dict[str, Any]]]:
    """Each turn's whole list for one task (the workload generator is not timed)."""
    return [messages[:] for messages, _ in Workload(salt=f"task-{task}").session(turns * MESSAGES_PER_TURN)]


async def _monitor(stop: asyncio.Event, lags: list[float]) -> None:
    """Wake every TICK_S and record how late each wake-up came (ms): the loop's lag."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + TICK_S
        await asyncio.sleep(TICK_S)
        lags.append(max(0.0, (loop.time() - due) * 1000))


async def _case(path: Path, plans: list[list[list[dict[str, Any]]]], durability: str, workers: int) -> dict[str, Any]:
    log = await AsyncEventLog.open(path, durability=durability, max_workers=workers)
    latencies: list[int] = []
    lags: list[float] = []
    try:

        async def agent(task: int, lists: list[list[dict[str, Any]]]) -> None:
            for messages in lists:
                start = now_ns()
                await log.flush(f"task-{task}", messages)
                latencies.append(now_ns() - start)

        before = await log.info()
        stop = asyncio.Event()
        monitor = asyncio.create_task(_monitor(stop, lags))
        await asyncio.sleep(TICK_S * 3)  # the monitor is ticking before the tasks start
        began, loop_cpu = now_ns(), time.thread_time()
        await asyncio.gather(*(agent(task, lists) for task, lists in enumerate(plans)))
        wall, loop_cpu = now_ns() - began, time.thread_time() - loop_cpu
        stop.set()
        await monitor
        after = await log.info()
        stored = 0
        for task in range(len(plans)):
            stored += len(await log.messages(f"task-{task}"))
    finally:
        await log.close()
    turns = sum(map(len, plans))
    assert stored == turns * MESSAGES_PER_TURN, f"{stored} messages stored of {turns * MESSAGES_PER_TURN}"
    ordered = sorted(lags)
    return {
        "turns_per_s": turns / (wall / 1e9),
        "latencies": latencies,
        "commits": after["commits"] - before["commits"],
        "writes": after["writes"] - before["writes"],
        "lag_max_ms": ordered[-1] if ordered else 0.0,
        "lag_p99_ms": percentile(ordered, 99) if ordered else 0.0,
        "lag_p999_ms": percentile(ordered, 99.9) if ordered else 0.0,
        "ticks": len(ordered),
        "wall_s": wall / 1e9,
        "loop_cpu_s": loop_cpu,
        "turns": turns,
    }


async def _idle(seconds: float) -> dict[str, Any]:
    """The monitor alone for ``seconds``: the lag this machine gives a loop that does nothing else."""
    lags: list[float] = []
    stop = asyncio.Event()
    monitor = asyncio.create_task(_monitor(stop, lags))
    cpu = time.thread_time()
    await asyncio.sleep(seconds)
    stop.set()
    await monitor
    cpu = time.thread_time() - cpu
    ordered = sorted(lags)
    return {
        "tick_cpu_s": cpu / max(1, len(ordered)),
        "lag_max_ms": ordered[-1],
        "lag_p99_ms": percentile(ordered, 99),
        "lag_p999_ms": percentile(ordered, 99.9),
        "ticks": len(ordered),
    }


def commit_releases_gil(path: Path, commits: int = 200) -> float:
    """How much of its own rate a thread counting in a Python loop keeps beside LMDB commits
    (synced as ``full`` syncs), against beside ``time.sleep`` of the same length: near 1 when
    the commit releases the GIL (a worker then prepares a batch while another one syncs)."""
    env = lmdb.open(str(path), map_size=1 << 26, sync=True, metasync=True)
    stop = threading.Event()
    count = [0]

    def spin() -> None:
        while not stop.is_set():
            count[0] += 1

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        time.sleep(0.05)
        before, began = count[0], time.perf_counter()
        for i in range(commits):
            with env.begin(write=True) as txn:
                txn.put(b"%08d" % i, bytes(2000))
        beside_commits = (count[0] - before) / (time.perf_counter() - began)
        before, began = count[0], time.perf_counter()
        time.sleep(time.perf_counter() - began + 0.2)
        beside_sleep = (count[0] - before) / (time.perf_counter() - began)
    finally:
        stop.set()
        spinner.join()
        env.close()
    return beside_commits / beside_sleep


def run(
    quick: bool = False,
    scratch_dir: Path | None = None,
    *,
    tasks: int = TASKS,
    turns: int | None = None,
    samples: int | None = None,
    workers: int = DEFAULT_WORKERS,
) -> dict[str, Any]:
    turns = turns or (8 if quick else 20)
    samples = samples or (1 if quick else 5)
    plans = [plan(task, turns) for task in range(tasks)]
    cases = [("serial", 1, "full"), ("tasks", tasks, "full"), ("serial", 1, "process"), ("tasks", tasks, "process")]
    runs: dict[tuple[str, int, str], list[dict[str, Any]]] = {case: [] for case in cases}
    order = random.Random(17)
    idle: list[dict[str, Any]] = []
    with scratch(scratch_dir, "aio-") as root, quiet_gc():
        for round_ in range(samples):
            for kind, n, durability in order.sample(cases, len(cases)):
                path = root / f"{kind}-{durability}-{round_}"
                runs[(kind, n, durability)].append(asyncio.run(_case(path, plans[:n], durability, workers)))
                shutil.rmtree(path)
            # Beside the cases, the loop with nothing to do for as long as the 64 tasks took.
            longest = max(r["wall_s"] for r in runs[("tasks", tasks, "full")][-1:])
            idle.append(asyncio.run(_idle(max(longest, 0.2))))
        gil = commit_releases_gil(root / "gil")
    rows: list[dict[str, Any]] = []
    for (_, n, durability), done in runs.items():
        middle = sorted(done, key=lambda r: r["turns_per_s"])[len(done) // 2]
        row: dict[str, Any] = {
            "system": f"{n} task{'s' if n > 1 else ''}, durability {durability}",
            "tasks": n,
            "durability": durability,
        }
        row.update(summary([s for r in done for s in r["latencies"]], MESSAGES_PER_TURN))
        row["turns_per_s"] = middle["turns_per_s"]
        row["rates"] = [r["turns_per_s"] for r in done]
        row["flushes"] = n * turns
        row["flushes_per_commit"] = n * turns / middle["commits"] if middle["commits"] else None
        row["writes_per_commit"] = middle["writes"] / middle["commits"] if middle["commits"] else None
        # The loop's CPU per flush, less what the monitor's ticks cost it (as in the idle loop).
        tick = statistics.median(r["tick_cpu_s"] for r in idle)
        row["loop_cpu_us"] = statistics.median(
            max(0.0, r["loop_cpu_s"] - r["ticks"] * tick) / r["turns"] * 1e6 for r in done
        )
        row["commits"], row["writes"] = middle["commits"], middle["writes"]
        row["lag_max_ms"] = max(r["lag_max_ms"] for r in done)
        row["lag_p99_ms"] = statistics.median(r["lag_p99_ms"] for r in done)
        row["lag_p999_ms"] = statistics.median(r["lag_p999_ms"] for r in done)
        rows.append(row)
    for row in rows:
        serial = next(r for r in rows if r["tasks"] == 1 and r["durability"] == row["durability"])
        row["x_serial"] = row["turns_per_s"] / serial["turns_per_s"]
        paired = sorted(a / b for a, b in zip(row["rates"], serial["rates"]))
        row["x_serial_range"] = f"{paired[0]:.2f}-{paired[-1]:.2f}"
    rows.append(
        {
            "system": "idle loop, no log (this machine's own lag)",
            "tasks": 0,
            "durability": "-",
            "lag_max_ms": max(r["lag_max_ms"] for r in idle),
            "lag_p99_ms": statistics.median(r["lag_p99_ms"] for r in idle),
            "lag_p999_ms": statistics.median(r["lag_p999_ms"] for r in idle),
        }
    )
    return {
        "scenario": "asyncio tasks flushing their own sessions",
        "tasks": tasks,
        "turns_per_task": turns,
        "workers": workers,
        "samples": samples,
        "goals": {"x_serial": 2.5, "lag_max_ms": 5.0},
        "spinner_rate_beside_commits": gil,
        "rows": rows,
    }


COLUMNS = [
    ("system", "case"),
    ("turns_per_s", "turns/s (median run)"),
    ("x_serial", "x 1 task"),
    ("x_serial_range", "x range (same round)"),
    ("median_ms", "flush median ms"),
    ("p99_ms", "p99 ms"),
    ("flushes_per_commit", "flushes/commit"),
    ("writes_per_commit", "writes/commit"),
    ("loop_cpu_us", "loop CPU us/flush"),
    ("lag_p99_ms", "loop lag p99 ms"),
    ("lag_p999_ms", "p99.9 ms"),
    ("lag_max_ms", "loop lag worst ms"),
]


def render(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"{result['tasks']} asyncio tasks x {result['turns_per_task']} turns of 10 messages, each task its own "
            f"session, AsyncEventLog with {result['workers']} workers; each case run {result['samples']} times "
            "(x 1 task: median run to one task's median run at the same durability; loop lag: how late a 1 ms "
            "timer fired while the case ran, worst over all runs; goals: 64 tasks >= 2.5x one task, worst lag <= 5 ms)",
            "",
            table(result["rows"], COLUMNS),
            "",
            "A thread counting in a Python loop beside LMDB commits (synced as in durability full) ran at "
            f"{result['spinner_rate_beside_commits']:.2f}x its rate beside a sleep as long (about 1: the commit "
            "releases the GIL; near 0: it holds it).",
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
