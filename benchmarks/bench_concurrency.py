"""Concurrent writers: 1, 2, 4, 8 threads and 2, 4, 8 processes flushing different sessions of one log.

What it measures: each writer owns one session and grows it by 10 messages per
turn for a fixed number of turns, flushing the whole list each turn (default
mode, ``durability="full"``).  Threads share one ``EventLog``; processes each open
the same log directory (started with ``spawn``, never ``fork``).  All writers start
together at a barrier.  Every case runs five times (``--quick``: twice), round by
round in a shuffled order.  Reported: aggregate messages/s (messages written /
wall time from the barrier to the last writer's end) of the median run and the
range of the runs, the per-flush latency percentiles over all runs, and the
aggregate rate as a multiple of the single writer's, with its range run against
run.
Without group commit every flush pays its own fsyncs and the writers queue on
LMDB's writer lock; the target for group commit is 8 threads >= 2x one writer.
Beside them, one writer with ``durability="none"`` in each mode: its rate is the
CPU bound of the threads (they share one GIL), so the ratio of that rate to one
durable writer's is about the most any number of threads can reach (a little of
a write's CPU, LMDB's copying and hashing of large buffers, runs without the GIL).
Processes share commits through the relay (eventlog/relay.py: one of them commits the
others' flushes with its own); beside them, the same 8 processes with ``relay=False``, each
committing its own writes on LMDB's writer lock.  The target is 8 processes >= 1x one
writer with p99 <= 4x p50.  Beside them, one thread flushing the 8 processes' sessions
together, one ``flush_many`` per turn: the rate 8 processes reach at most if every turn of
theirs shared one commit.

Run it::

    python -m benchmarks.bench_concurrency          # 100 turns per writer
    python -m benchmarks.bench_concurrency --quick
"""

from __future__ import annotations

import multiprocessing
import random
import shutil
import statistics
import threading
from pathlib import Path
from typing import Any

import lmdb

from benchmarks.harness import now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import MESSAGES_PER_TURN, Workload
from eventlog import EventLog

THREADS = (1, 2, 4, 8)
PROCESSES = (2, 4, 8)


def _turns(writer: int, turns: int) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    # Materialise each writer's list states up front: the workload generator is not timed.
    out = []
    for messages, new in Workload(salt=f"writer-{writer}").session(turns * MESSAGES_PER_TURN):
        out.append((messages[:], new))
    return out


def _write(
    log: EventLog, writer: int, plan: list[tuple[list[dict[str, Any]], list[dict[str, Any]]]], barrier: Any
) -> tuple[int, int, list[int]]:
    samples: list[int] = []
    barrier.wait()
    began = now_ns()
    for messages, _ in plan:
        start = now_ns()
        log.flush(f"writer-{writer}", messages)
        samples.append(now_ns() - start)
    return began, now_ns(), samples


def _process_writer(path: str, writer: int, turns: int, barrier: Any, out: Any, relay: bool = True) -> None:
    plan = _turns(writer, turns)
    with EventLog.open(path, relay=relay) as log:
        out.put((writer, _write(log, writer, plan, barrier)))


def _batched(path: Path, count: int, turns: int) -> tuple[int, list[int]]:
    """One thread writing the turns of ``count`` sessions, one turn of each per ``flush_many``
    call: every turn of theirs in one commit, the most the relay's sharing of commits can reach."""
    plans = [_turns(w, turns) for w in range(count)]
    samples: list[int] = []
    with EventLog.open(path) as log, quiet_gc():
        began = now_ns()
        for turn in range(turns):
            start = now_ns()
            log.flush_many({f"writer-{w}": plans[w][turn][0] for w in range(count)})
            samples.append(now_ns() - start)
    return _combine([(began, now_ns(), samples)])


def _threads(
    path: Path, count: int, turns: int, trust: bool = False, durability: str = "full"
) -> tuple[int, list[int]]:
    plans = [_turns(w, turns) for w in range(count)]
    barrier = threading.Barrier(count)
    results: list[tuple[int, int, list[int]] | None] = [None] * count
    errors: list[BaseException] = []
    with EventLog.open(path, trust_identity=trust, durability=durability) as log, quiet_gc():

        def body(w: int) -> None:
            try:
                results[w] = _write(log, w, plans[w], barrier)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
                barrier.abort()

        threads = [threading.Thread(target=body, args=(w,)) for w in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    return _combine([r for r in results if r is not None])


def _processes(path: Path, count: int, turns: int, relay: bool = True) -> tuple[int, list[int]]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(count)
    out = context.Queue()
    procs = [
        context.Process(target=_process_writer, args=(str(path), w, turns, barrier, out, relay)) for w in range(count)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=600)[1] for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a writer process exited with {p.exitcode}")
    return _combine(results)


def _transactions(path: Path) -> int:
    """Write transactions committed on the log so far, by every process (LMDB's transaction id)."""
    env = lmdb.open(str(path), subdir=True, readonly=True, lock=False, max_dbs=8)
    try:
        return int(env.info()["last_txnid"])
    finally:
        env.close()


def _opening_cost(path: Path) -> tuple[int, int]:
    """Create the log at ``path``; the transactions made so far, and those one more open makes."""
    EventLog.open(path).close()
    before = _transactions(path)
    EventLog.open(path).close()
    return _transactions(path), _transactions(path) - before


def _combine(results: list[tuple[int, int, list[int]]]) -> tuple[int, list[int]]:
    # perf_counter_ns is CLOCK_MONOTONIC on Linux: comparable across processes.
    wall = max(end for _, end, _ in results) - min(began for began, _, _ in results)
    return wall, [s for _, _, samples in results for s in samples]


SAMPLES = 5
"""Runs of each case: the machines are shared, and one run of a case says little."""


def run(
    *,
    quick: bool = False,
    scratch_dir: Path | None = None,
    turns: int | None = None,
    threads: tuple[int, ...] = THREADS,
    processes: tuple[int, ...] = PROCESSES,
    samples: int | None = None,
) -> dict[str, Any]:
    """Each case run ``samples`` times, round by round (every case once per round, in a shuffled
    order), so that a burst of load from a neighbour lands on all of them alike; each row reports
    the median run and the spread of the runs."""
    turns = turns or (10 if quick else 100)
    samples = samples or (2 if quick else SAMPLES)
    cases = [("threads", n, False, "full") for n in threads] + [("processes", n, False, "full") for n in processes]
    cases += [("threads", n, True, "full") for n in threads if n in (1, max(threads))]
    cases += (
        [("batched", max(processes), False, "full"), ("unrelayed", max(processes), False, "full")] if processes else []
    )
    # The CPU bound: one writer with no sync to wait for.  Threads share one GIL, so however
    # well their syncs are grouped, together they write hardly faster than this.
    cases += [("threads", 1, trust, "none") for trust in (False, True)]
    runs: dict[tuple[str, int, bool, str], list[tuple[float, list[int], int]]] = {case: [] for case in cases}
    order = random.Random(7)
    with scratch(scratch_dir, "concurrency-") as root:
        for round_ in range(samples):
            for kind, n, trust, durability in order.sample(cases, len(cases)):
                path = root / f"{kind}-{n}{'-trust' if trust else ''}-{durability}-{round_}"
                made, per_open = _opening_cost(path)
                if kind == "threads":
                    wall, latencies = _threads(path, n, turns, trust, durability)
                elif kind == "batched":
                    wall, latencies = _batched(path, n, turns)
                else:
                    wall, latencies = _processes(path, n, turns, relay=kind == "processes")
                opens = n if kind in ("processes", "unrelayed") else 1
                commits = _transactions(path) - made - opens * per_open
                with EventLog.open(path) as log:
                    stored = sum(len(log.messages(f"writer-{w}")) for w in range(n))
                assert stored == n * turns * MESSAGES_PER_TURN, f"{kind}={n}: {stored} messages stored"
                runs[(kind, n, trust, durability)].append((stored / (wall / 1e9), latencies, commits))
                shutil.rmtree(path)
    rows: list[dict[str, Any]] = []
    for (kind, n, trust, durability), done in runs.items():
        name = f"{n} {kind[:-1] if n == 1 else kind}" + (", trust mode" if trust else "")
        if kind == "batched":
            name = f"1 thread, {n} sessions per flush_many (one commit: the bound of grouping {n} processes)"
        elif kind == "unrelayed":
            name = f"{n} processes, relay=False (each commits its own writes)"
        if durability != "full":
            name += f", durability {durability} (CPU bound)"
        rates = sorted(rate for rate, _, _ in done)
        row = {"system": name, "writers": n, "kind": kind, "trust": trust, "durability": durability}
        row.update(summary([s for _, latencies, _ in done for s in latencies], MESSAGES_PER_TURN))
        row["aggregate_msgs_per_s"] = statistics.median(rates)
        row["rates"] = [rate for rate, _, _ in done]
        # Flushes per LMDB commit over every run: how far writes shared commits (the clock plays no part).
        flushes = len(done) * (n if kind != "batched" else 1) * turns
        row["flushes_per_commit"] = flushes / max(1, sum(commits for _, _, commits in done))
        row["spread"] = f"{rates[0]:,.0f}-{rates[-1]:,.0f}"
        row["p99_over_p50"] = row["p99_ms"] / row["median_ms"] if row["median_ms"] else None
        rows.append(row)
    for row in rows:
        single = next(
            (r for r in rows if r["writers"] == 1 and r["trust"] == row["trust"] and r["durability"] == "full"), None
        )
        if single is None:
            row["x_single"] = row["x_single_range"] = None
            continue
        # Run i of a case against run i of the single writer (same round): the ratio's spread.
        paired = sorted(a / b for a, b in zip(row["rates"], single["rates"]))
        row["x_single"] = row["aggregate_msgs_per_s"] / single["aggregate_msgs_per_s"]
        row["x_single_range"] = f"{paired[0]:.2f}-{paired[-1]:.2f}"
    return {"scenario": "concurrent writers", "turns_per_writer": turns, "samples": samples, "rows": rows}


COLUMNS = [
    ("system", "writers"),
    ("median_ms", "flush median ms"),
    ("p90_ms", "p90 ms"),
    ("p99_ms", "p99 ms"),
    ("aggregate_msgs_per_s", "aggregate msgs/s (median run)"),
    ("spread", "runs' range"),
    ("x_single", "x 1 writer"),
    ("x_single_range", "x range (same round)"),
    ("p99_over_p50", "p99/p50"),
    ("flushes_per_commit", "flushes per commit"),
]


def render(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"Writers flushing their own sessions, {result['turns_per_writer']} turns of 10 messages each, durability full "
            f"unless stated; each case run {result['samples']} times, round by round (ratio: median run to one "
            "durable writer's median run in the same mode; range: run against run of the same round)",
            "",
            table(result["rows"], COLUMNS),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
