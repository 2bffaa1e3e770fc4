"""Memory the flush cache holds per message, by mode.

What it measures: one session of 5,000 messages (``--quick``: 500) flushed turn by turn, as
an agent loop does, with ``durability="none"`` (memory does not depend on syncs); Python's
allocations traced from after the first turn to after the last, divided by the messages
held.  The cache keeps, per held message, its digests and what the next flush's check
compares it with: in the default mode a record of the message (C accelerator) or a copy of
its containers (pure-Python check), in trust mode nothing more than a reference.

Run it::

    python -m benchmarks.bench_memory
    python -m benchmarks.bench_memory --quick
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

from benchmarks.harness import run_main, scratch, table
from benchmarks.workload import Workload
from eventlog import EventLog, snapshot

MODES = (("default", False, False), ("default, pure-Python check", False, True), ("trust", True, False))


def _held_bytes(path: Path, trust: bool, pure_python: bool, total: int) -> float:
    states = [messages[:] for messages, _ in Workload(salt="memory").session(total)]
    accelerated = snapshot.ACCELERATED
    snapshot.ACCELERATED = accelerated and not pure_python
    try:
        with EventLog.open(path, durability="none", trust_identity=trust) as log:
            log.flush("s", states[0])
            log.flush("s", states[0])  # the first turn's messages checked and remembered
            tracemalloc.start()
            try:
                before = tracemalloc.get_traced_memory()[0]
                for messages in states[1:]:
                    log.flush("s", messages)
                    log.flush("s", messages)  # a second exit path: the check runs, the cache is complete
                grown = tracemalloc.get_traced_memory()[0] - before
            finally:
                tracemalloc.stop()
    finally:
        snapshot.ACCELERATED = accelerated
    return grown / (len(states[-1]) - len(states[0]))


def run(*, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None) -> dict[str, Any]:
    total = messages or (500 if quick else 5000)
    rows = []
    with scratch(scratch_dir, "memory-") as root:
        for i, (name, trust, pure_python) in enumerate(MODES):
            if name == "default" and not snapshot.ACCELERATED:
                continue  # no C accelerator here: the pure-Python row stands for the default mode
            rows.append(
                {
                    "system": f"flush cache, {name} mode" if "," not in name else f"flush cache, {name}",
                    "trust": trust,
                    "pure_python": pure_python,
                    "bytes_per_message": _held_bytes(root / str(i), trust, pure_python, total),
                }
            )
    return {"scenario": "cache memory", "messages": total, "rows": rows}


def render(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"Bytes of Python allocations the flush cache holds per message, one session of {result['messages']:,}",
            "",
            table(result["rows"], [("system", "cache"), ("bytes_per_message", "bytes per held message")]),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
