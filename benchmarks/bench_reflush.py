"""Unchanged re-flush: what it costs to flush a list that is already stored, by session length.

Several exit paths of an agent flush the same list, so "nothing new" must be
cheap.  For sessions of 100, 1,000, 5,000 and 10,000 messages (already stored),
this times, interleaved round by round:

- ``reflush``: ``flush(sid, same_list)`` in the default mode (same objects:
  re-encoded and compared, not re-hashed);
- ``reflush trust``: the same with ``trust_identity=True`` (unchanged objects are
  not even re-encoded: should be flat in session length);
- ``reflush fresh copies``: the same content as new dict objects (a reloaded
  list: everything must be encoded and hashed);
- ``rehash all`` (the yardstick): canonical msgpack of every message
  (``msgspec.msgpack.Encoder(order="deterministic")``) and the SHA-256 chain
  (content digest, then node digest) -- what a naive implementation does;
- ``reflush trust, short session beside`` (:data:`SHORT_BESIDE`): a trusting log's
  re-flush of a session of :data:`SHORT` messages (the first of the length's list), right
  beside the trusting re-flush of each length, the two taking turns at going first after the
  same default-mode flush: how much of the longer session's cost is its length, and how much
  the state of the caches it finds after the round's other flushes, which grows with the
  length too.  Its msgs/s counts its own messages; it has no ratio to re-hashing all;
- ``floor: pointer check`` (:data:`POINTER_FLOOR`): the least a trust-mode re-flush does to
  know the list is unchanged, one comparison of the list with a list of the same objects
  held since the last flush (list equality compares pointers first, in C), timed at the end
  of each round, right after a default-mode flush of the same list, as the trust-mode
  re-flushes come right after one.
  Its growth from the shortest session to the longest is what any trust-mode re-flush adds
  by session length, however lean the rest.

Reported: median/p90/p99 per re-flush, messages/s, and the ratio of each median to
``rehash all`` of the same length (the target: default re-flush below 0.6x).

Run it::

    python -m benchmarks.bench_reflush          # 100 .. 10,000 messages
    python -m benchmarks.bench_reflush --quick
"""

from __future__ import annotations

import copy
from hashlib import sha256
from pathlib import Path
from typing import Any

import msgspec

from benchmarks.harness import fmt, now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import Workload
from eventlog import EventLog

SIZES = (100, 1_000, 5_000, 10_000)
POINTER_FLOOR = "floor: pointer check"
SHORT = 100
SHORT_BESIDE = "reflush trust, short session beside"
QUICK_SIZES = (100, 1_000)

_encode = msgspec.msgpack.Encoder(order="deterministic").encode
ZERO = bytes(32)


def rehash_all(messages: list[dict[str, Any]]) -> bytes:
    """Canonical bytes of every message and the SHA-256 node chain: the naive re-flush."""
    parent = ZERO
    for message in messages:
        parent = sha256(parent + sha256(_encode(message)).digest()).digest()
    return parent


def _rounds(size: int, quick: bool) -> int:
    budget = 20_000 if quick else 400_000  # messages per variant
    return max(5, min(300, budget // size))


def run(
    *,
    quick: bool = False,
    scratch_dir: Path | None = None,
    sizes: tuple[int, ...] | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    rows: list[dict[str, Any]] = []
    workload = Workload()
    with scratch(scratch_dir, "reflush-") as root:
        for size in sizes:
            messages = workload.messages(size)
            copies = [copy.deepcopy(messages) for _ in range(2)]
            path = root / f"log-{size}"
            samples: dict[str, list[int]] = {
                "reflush": [],
                "reflush trust": [],
                "reflush fresh copies": [],
                "rehash all": [],
                POINTER_FLOOR: [],
                SHORT_BESIDE: [],
            }
            held = list(messages)  # the same objects, in a list of its own, as a trusting log holds them
            short = messages[:SHORT]
            # LMDB opens an environment once per process: the trusting log is its own copy.
            with (
                EventLog.open(path) as log,
                EventLog.open(root / f"trusted-{size}", trust_identity=True) as trusted,
                EventLog.open(root / f"short-{size}", trust_identity=True) as beside,
            ):
                beside.flush("s", short)
                beside.flush("s", short)
                log.flush("s", messages)
                head = log.head("s")
                trusted.flush("s", messages)
                trusted.flush("s", messages)
                log.flush("s", messages)
                assert rehash_all(messages).hex() == head, "the yardstick must compute what the log stores"
                n = rounds or _rounds(size, quick)
                with quiet_gc():
                    for i in range(n):
                        start = now_ns()
                        rehash_all(messages)
                        samples["rehash all"].append(now_ns() - start)
                        start = now_ns()
                        result = log.flush("s", messages)
                        samples["reflush"].append(now_ns() - start)
                        assert result.appended == 0
                        # The trusting re-flushes of this length and of the short session, right after
                        # the same flush, taking turns at going first.
                        for which in ("long", "short") if i % 2 else ("short", "long"):
                            start = now_ns()
                            if which == "long":
                                trusted.flush("s", messages)
                                samples["reflush trust"].append(now_ns() - start)
                            else:
                                result = beside.flush("s", short)
                                samples[SHORT_BESIDE].append(now_ns() - start)
                                assert result.appended == 0
                        # Alternate two copies so that neither is the cached snapshot.
                        fresh = copies[i % 2]
                        start = now_ns()
                        log.flush("s", fresh)
                        samples["reflush fresh copies"].append(now_ns() - start)
                        log.flush("s", messages)  # the cached snapshot is the agent's list again
                        start = now_ns()
                        unchanged = held == messages
                        samples[POINTER_FLOOR].append(now_ns() - start)
                        assert unchanged
            base = summary(samples["rehash all"], size)["median_ms"]
            for name, values in samples.items():
                row = {"system": name, "messages": size}
                if name == SHORT_BESIDE:  # its own messages, beside the round's length
                    row.update(summary(values, len(short)))
                    row["session"] = len(short)
                    row["ratio"] = None
                else:
                    row.update(summary(values, size))
                    row["ratio"] = row["median_ms"] / base
                rows.append(row)
    return {"scenario": "unchanged re-flush", "sizes": list(sizes), "rows": rows}


COLUMNS = [
    ("messages", "messages"),
    ("system", "variant"),
    ("median_ms", "median ms"),
    ("p90_ms", "p90 ms"),
    ("p99_ms", "p99 ms"),
    ("msgs_per_s", "msgs/s"),
    ("ratio", "x rehash all"),
]


def render(result: dict[str, Any]) -> str:
    lines = ["Unchanged re-flush vs re-encoding + re-hashing everything (ratio: median / rehash all's median)", ""]
    lines.append(table(result["rows"], COLUMNS))
    trust = [r for r in result["rows"] if r["system"] == "reflush trust"]
    if len(trust) > 1:
        lines.append(
            f"\ntrust mode, largest / smallest session: {fmt(trust[-1]['median_ms'] / trust[0]['median_ms'])}x "
            f"for {trust[-1]['messages'] // trust[0]['messages']}x the messages"
        )
        beside = [r for r in result["rows"] if r["system"] == SHORT_BESIDE]
        if beside:
            lines.append(
                f"trust mode, largest session / a {beside[-1]['session']}-message one re-flushed in the same rounds: "
                f"{fmt(trust[-1]['median_ms'] / beside[-1]['median_ms'])}x"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
