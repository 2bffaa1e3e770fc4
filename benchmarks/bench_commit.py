"""A durable 10-message write against the bare storage engine it sits on.

What it measures, for each durability mode (``full``, ``process``, ``none``): a
session grows by 10 messages per write up to 5,000, and each round, in a
shuffled order, times

- ``eventlog append``: ``EventLog.append(sid, ten_messages)``;
- ``eventlog flush``: ``EventLog.flush(sid, whole_list)`` (default mode);
- ``bare py-lmdb``: a plain LMDB environment in the same folder, opened with the
  matching ``sync``/``metasync`` flags, putting the same 10 messages already
  encoded (canonical msgpack) under (session, position) keys and committing;
- ``bare py-lmdb + digests``: the same commit after the least a content-addressed
  log computes for each message: its canonical encoding, its content digest and
  its node digest (SHA-256), stored beside the body; no validation, no event, no
  hash chain of events;
- ``raw fdatasync``: a 700-byte overwrite of one file + ``fdatasync``.

Reported: medians (and p90/p99) and two ratios: to the bare LMDB commit of the
same mode (the target is <= 1.5x for ``append``) and to the raw fdatasync.  With
no sync to wait for (``none``), ``bare py-lmdb + digests`` shows how much of that
1.5x content addressing alone uses up.

Run it::

    python -m benchmarks.bench_commit           # 500 rounds per mode
    python -m benchmarks.bench_commit --quick
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from benchmarks import systems as sy
from benchmarks.harness import now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import Workload
from eventlog import EventLog
from eventlog.events import MessagesAppended

MODES = ("full", "process", "none")
ADDRESSED = "bare py-lmdb + digests"
WRITES = ("eventlog append", "eventlog flush", "bare py-lmdb", ADDRESSED, "raw fdatasync")


def run(
    *, quick: bool = False, scratch_dir: Path | None = None, messages: int | None = None, modes: tuple[str, ...] = MODES
) -> dict[str, Any]:
    total = messages or (300 if quick else 5000)
    rows: list[dict[str, Any]] = []
    order = random.Random(11)
    # Each turn's list as the agent holds it then (the generator grows one list in place).
    workload_turns = [(messages[:], new) for messages, new in Workload(salt="commit").session(total)]
    for mode in modes:
        with scratch(scratch_dir, f"commit-{mode}-") as root:
            samples: dict[str, list[int]] = {name: [] for name in WRITES}
            bare = sy.BareLMDBSystem(mode)
            bare.open(root)
            hashed = sy.BareLMDBSystem(mode)
            (root / "addressed").mkdir()
            hashed.open(root / "addressed")
            raw = sy.RawFsyncSystem()
            raw.open(root)
            try:
                with (
                    EventLog.open(root / "append", durability=mode) as appender,
                    EventLog.open(root / "flush", durability=mode) as flusher,
                ):
                    steps = {
                        "eventlog append": lambda msgs, new, bodies: appender.append("s", new),
                        "eventlog flush": lambda msgs, new, bodies: flusher.flush("s", msgs),
                        "bare py-lmdb": lambda msgs, new, bodies: bare.write("s", bodies),
                        ADDRESSED: lambda msgs, new, bodies: hashed.write_addressed("s", new),
                        "raw fdatasync": lambda msgs, new, bodies: raw.turn("s", msgs, new),
                    }
                    names = list(steps)
                    with quiet_gc():
                        for msgs, new in workload_turns:
                            bodies = [bare.encode(m) for m in new]  # the bare engine is handed encoded bytes
                            order.shuffle(names)
                            for name in names:
                                start = now_ns()
                                steps[name](msgs, new, bodies)
                                samples[name].append(now_ns() - start)
                    # Every timed write stored its turn: none of them timed a write of nothing.
                    for name, log in (("eventlog append", appender), ("eventlog flush", flusher)):
                        stored = len(log.messages("s"))
                        if stored != total:
                            raise AssertionError(f"{name} stored {stored} of the {total} messages written")
                        appends = sum(isinstance(record.event, MessagesAppended) for record in log.events())
                        if appends != len(workload_turns):
                            raise AssertionError(f"{name} made {appends} appends for {len(workload_turns)} turns")
            finally:
                bare.close()
                hashed.close()
                raw.close()
        bare_median = summary(samples["bare py-lmdb"])["median_ms"]
        raw_median = summary(samples["raw fdatasync"])["median_ms"]
        for name, values in samples.items():
            row = {
                "mode": mode,
                "system": name,
                "durability": sy.DURABILITY_TEXT[mode] if name != "raw fdatasync" else "fdatasync",
            }
            row.update(summary(values, 10))
            row["x_bare"] = row["median_ms"] / bare_median
            row["x_fsync"] = row["median_ms"] / raw_median
            rows.append(row)
    return {"scenario": "durable 10-message write vs bare LMDB", "messages": total, "rows": rows}


COLUMNS = [
    ("mode", "mode"),
    ("system", "write"),
    ("median_ms", "median ms"),
    ("p90_ms", "p90 ms"),
    ("p99_ms", "p99 ms"),
    ("msgs_per_s", "msgs/s"),
    ("x_bare", "x bare LMDB"),
    ("x_fsync", "x raw fdatasync"),
]


def render(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"10-message writes onto a session growing to {result['messages']:,}, interleaved "
            "(ratios: median / the same mode's bare LMDB median, / raw fdatasync median)",
            "",
            table(result["rows"], COLUMNS),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
