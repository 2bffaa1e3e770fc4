"""What every benchmark shares: the machine description, statistics, scratch space, tables, CLI.

Latencies are collected in nanoseconds (``time.perf_counter_ns``) and summarised
as median, p90 and p99 (nearest rank) plus messages per second (messages written
divided by the summed latency of the writes that wrote them).

Durable measurements need a real disk: scratch directories are made under
``benchmarks/results/tmp/`` (git-ignored), on the same filesystem as the
repository, never under a tmpfs ``/tmp``.  :func:`machine` records which
filesystem that was.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCRATCH = RESULTS / "tmp"

DISTRIBUTIONS = ("agent-eventlog", "lmdb", "msgspec", "hermes-agent", "eventsourcing", "openai-agents", "matplotlib")

now_ns = time.perf_counter_ns


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _filesystem(path: Path) -> str:
    """``device type options`` of the mount holding ``path`` (Linux), else ``unknown``."""
    try:
        best = ("", "unknown")
        target = str(path.resolve())
        with open("/proc/mounts") as f:
            for line in f:
                device, mount, kind, options, *_ = line.split()
                if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[0]):
                    best = (mount, f"{kind} on {device} ({options.split(',')[0]}) at {mount}")
        return best[1]
    except OSError:
        return "unknown"


def product_commit() -> str:
    """The commit of the measured ``eventlog``/``projections`` code (``BENCH_COMMIT`` overrides), ``+dirty`` if edited."""
    import subprocess

    import eventlog

    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    where = Path(eventlog.__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "eventlog", "projections"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def machine(scratch: Path = SCRATCH) -> dict[str, Any]:
    """Cores, CPU, OS, Python, SQLite, library versions and the scratch filesystem."""
    import sqlite3

    import lmdb

    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "sqlite": sqlite3.sqlite_version,
        "lmdb_c": ".".join(map(str, lmdb.version())),
        "versions": {name: version(name) for name in DISTRIBUTIONS},
        "filesystem": _filesystem(scratch if scratch.exists() else scratch.parent),
        "product_commit": product_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


def machine_line(info: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    return (
        f"{info['cores']} cores ({info['cpu']}), {info['os']}, {info['python']}, SQLite {info['sqlite']}, "
        f"LMDB {info['lmdb_c']}; {versions} (commit {info.get('product_commit', 'unknown')}); scratch: {info['filesystem']}"
    )


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted sequence."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(samples_ns: Sequence[int], messages: int | Sequence[int] = 0) -> dict[str, Any]:
    """Median/p90/p99/mean in milliseconds and messages per second.

    ``messages``: messages per sample (an int) or per sample (a sequence).
    """
    ordered = sorted(samples_ns)
    total_ns = sum(ordered)
    count = messages * len(ordered) if isinstance(messages, int) else sum(messages)
    return {
        "n": len(ordered),
        "median_ms": percentile(ordered, 50) / 1e6,
        "p90_ms": percentile(ordered, 90) / 1e6,
        "p99_ms": percentile(ordered, 99) / 1e6,
        "mean_ms": total_ns / len(ordered) / 1e6 if ordered else math.nan,
        "msgs_per_s": count / (total_ns / 1e9) if total_ns else math.nan,
    }


@contextlib.contextmanager
def scratch(base: Path | None = None, prefix: str = "bench-") -> Iterator[Path]:
    """A fresh directory under ``base`` (default ``benchmarks/results/tmp``), removed afterwards."""
    base = Path(base) if base is not None else SCRATCH
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def quiet_gc() -> Iterator[None]:
    """Collect before a measured phase so an old phase's garbage is not charged to it."""
    gc.collect()
    yield


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        return f"{value:.{digits}g}"
    return str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """A markdown table of ``rows`` with ``columns`` as (key, header) pairs."""
    head = "| " + " | ".join(h for _, h in columns) + " |"
    rule = "|" + "|".join("---" for _ in columns) + "|"
    body = ["| " + " | ".join(fmt(row.get(k)) for k, _ in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body])


LATENCY_COLUMNS = [
    ("system", "system"),
    ("durability", "durability"),
    ("median_ms", "median ms"),
    ("p90_ms", "p90 ms"),
    ("p99_ms", "p99 ms"),
    ("msgs_per_s", "msgs/s"),
    ("ratio", "x ours (median)"),
]


def add_ratios(rows: list[dict[str, Any]], reference: str, key: str = "median_ms") -> None:
    """``ratio`` = row's ``key`` / the reference row's: how many times our time theirs is."""
    ref = next((r for r in rows if r["system"] == reference and r.get(key)), None)
    for row in rows:
        row["ratio"] = row[key] / ref[key] if ref and row.get(key) else None
        row["ratio_to"] = reference if ref else None


def parser(doc: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=(doc or "").split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes: a minute, not a reference run")
    p.add_argument("--json", type=Path, help="also write the result as JSON to this file")
    p.add_argument("--scratch", type=Path, default=SCRATCH, help="where to create databases (a real disk, not tmpfs)")
    return p


def run_main(
    doc: str | None,
    run: Callable[..., dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The shared ``main()``: parse arguments, run, print the table, optionally write JSON."""
    args = parser(doc).parse_args(argv)
    result = run(quick=args.quick, scratch_dir=args.scratch)
    result["machine"] = machine(args.scratch)
    print(machine_line(result["machine"]))
    print(render(result))
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}", file=sys.stderr)
    return result


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=1, default=_jsonable)
        f.write("\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
