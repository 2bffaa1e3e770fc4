"""What the audit trail costs: the Merkle tree in the commit, proofs at 1M events, signing.

What it measures:

- **tree in the commit**: two logs in the same folder, written in interleaved rounds
  with the same 10-message appends (a session growing to ``messages``), one keeping
  its Merkle tree (the product), one with the tree step of the commit switched off.
  Reported per durability mode (``full``: two fsyncs per commit, ``none``: no fsync):
  the median commit of each, the time spent in the tree step itself (timed inside the
  commit; median and mean), and its median as a share of the median commit (the goal: under 3% of a
  durable 10-message commit).  Single-message appends in mode ``none`` give the cost
  per appended message.
- **proofs at 1M events**: a tree of ``leaves`` leaves stored the way the log stores
  it; inclusion and consistency proof sizes, and the time to make and verify each.
- **signing**: signing a checkpoint (Ed25519, C2SP note) and verifying it.
- **redaction**: a log of ``events`` events (10-message appends into sessions of 200
  messages, mode ``full``); the redaction of one message of the first session (every
  event after it is rewritten) and of the last session (few are), each timed whole
  (the rewrite transaction, its commit and the compacting copy of the data file), and
  the compacting copy alone; beside them, a durable 10-message commit into the same log,
  the unit the redaction's cost is counted in.

Run it::

    python -m benchmarks.bench_audit            # 1M-leaf tree, 2,000 messages per mode
    python -m benchmarks.bench_audit --quick
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import lmdb

from benchmarks.harness import now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import Workload
from eventlog import EventLog, merkle, signing
from eventlog.tree import node_key
from eventlog.verifier import Checkpoint, open_checkpoint


def _timed_seal(log: EventLog, spent: list[int]) -> None:
    store = log._store
    original = store.seal

    def seal(txn: Any) -> None:
        start = now_ns()
        original(txn)
        spent.append(now_ns() - start)

    store.seal = seal  # type: ignore[method-assign]


def commit_cost(root: Path, mode: str, messages: int, batch: int) -> dict[str, Any]:
    turns = Workload(salt=f"audit-{batch}").messages(messages)
    spent: list[int] = []
    samples: dict[str, list[int]] = {"with tree": [], "without tree": []}
    with EventLog.open(root / "tree", durability=mode) as kept, EventLog.open(root / "bare", durability=mode) as bare:
        _timed_seal(kept, spent)
        bare._store.seal = lambda txn: None  # type: ignore[method-assign]
        order = random.Random(5)
        with quiet_gc():
            for start in range(0, messages - batch + 1, batch):
                chunk = turns[start : start + batch]
                pair = [("with tree", kept), ("without tree", bare)]
                order.shuffle(pair)
                for name, log in pair:
                    t = now_ns()
                    log.append("s", chunk)
                    samples[name].append(now_ns() - t)
    with_tree, without = summary(samples["with tree"]), summary(samples["without tree"])
    seal = summary(spent)
    return {
        "mode": mode,
        "batch": batch,
        "commits": len(samples["with tree"]),
        "with_tree_ms": with_tree["median_ms"],
        "without_tree_ms": without["median_ms"],
        "tree_step_us": seal["median_ms"] * 1000,
        "tree_step_mean_us": sum(spent) / len(spent) / 1000,
        "share": seal["median_ms"] / with_tree["median_ms"],
        "per_message_us": seal["median_ms"] * 1000 / batch,
    }


def stored_tree(root: Path, leaves: int) -> tuple[lmdb.Environment, Any]:
    env = lmdb.open(str(root / "tree"), map_size=1 << 31, max_dbs=2, sync=False, metasync=False)
    db = env.open_db(b"tree")
    frontier = merkle.Frontier()
    with env.begin(write=True) as txn:
        put = txn.put
        for i in range(leaves):
            for level, index, h in frontier.append(merkle.leaf_hash(i.to_bytes(8, "big"))):
                put(node_key(level, index), h, db=db, append=True)
    return env, db


def proofs(root: Path, leaves: int) -> list[dict[str, Any]]:
    env, db = stored_tree(root, leaves)
    rows = []
    rng = random.Random(3)
    with env.begin() as txn:

        def get(level: int, index: int) -> bytes:
            return txn.get(node_key(level, index), db=db)

        root_hash = merkle.subtree_hash(get, 0, leaves)
        old = leaves // 3 + 1
        old_root = merkle.subtree_hash(get, 0, old)
        make, check, sizes = [], [], []
        for _ in range(200):
            index = rng.randrange(leaves)
            t = now_ns()
            path = merkle.inclusion_proof(get, index, leaves)
            make.append(now_ns() - t)
            leaf = merkle.leaf_hash(index.to_bytes(8, "big"))
            t = now_ns()
            merkle.verify_inclusion(index, leaves, leaf, path, root_hash)
            check.append(now_ns() - t)
            sizes.append(len(path))
        rows.append(_proof_row("inclusion", leaves, sizes, make, check))
        make, check, sizes = [], [], []
        for _ in range(50):
            t = now_ns()
            path = merkle.consistency_proof(get, old, leaves)
            make.append(now_ns() - t)
            t = now_ns()
            merkle.verify_consistency(old, leaves, old_root, root_hash, path)
            check.append(now_ns() - t)
            sizes.append(len(path))
        rows.append(_proof_row(f"consistency from {old:,}", leaves, sizes, make, check))
    env.close()
    return rows


def _proof_row(kind: str, leaves: int, sizes: list[int], make: list[int], check: list[int]) -> dict[str, Any]:
    return {
        "proof": kind,
        "leaves": leaves,
        "hashes": max(sizes),
        "bytes": 32 * max(sizes),
        "make_us": summary(make)["median_ms"] * 1000,
        "verify_us": summary(check)["median_ms"] * 1000,
    }


def sign_cost(rounds: int) -> dict[str, Any]:
    key = signing.generate("example.com/bench")
    cp = Checkpoint("eventlog/bench", 1_000_000, bytes(range(32))).text()
    signs, checks = [], []
    for _ in range(rounds):
        t = now_ns()
        note = signing.sign_note(cp, [key])
        signs.append(now_ns() - t)
        t = now_ns()
        open_checkpoint(note, [key.verifier()])
        checks.append(now_ns() - t)
    return {"sign_us": summary(signs)["median_ms"] * 1000, "verify_us": summary(checks)["median_ms"] * 1000}


def redaction_cost(root: Path, events: int) -> dict[str, Any]:
    """Redact one message early and one late in a log of about ``events`` events."""
    per_session = 200
    sessions = max(2, -(-events // (per_session // 10 + 1)))  # at least ``events`` events
    stream = Workload(salt="audit-redact")
    with EventLog.open(root / "log", durability="none") as log:
        for number in range(sessions):
            held: list[dict[str, Any]] = []
            for turn in range(per_session // 10):
                held.extend(stream.turn(number * 100 + turn))
                log.flush(f"s{number}", held)
        total = log.last_seq
    with EventLog.open(root / "log", durability="full") as log:
        size = os.path.getsize(root / "log" / "data.mdb")
        commits = []
        extra: list[dict[str, Any]] = []
        for turn in range(20):
            extra.extend(stream.turn(10_000 + turn))
            t = now_ns()
            log.flush("commit", extra)
            commits.append(now_ns() - t)
        t = now_ns()
        log.redact("s0", 3, reason="bench")
        early = now_ns() - t
        t = now_ns()
        log.redact(f"s{sessions - 1}", 3, reason="bench")
        late = now_ns() - t
        t = now_ns()
        log.vacuum()
        copy = now_ns() - t
        assert log.verify().ok
    commit_ms = summary(commits)["median_ms"]
    return {
        "events": total,
        "file_mb": size / 1e6,
        "early_ms": early / 1e6,
        "late_ms": late / 1e6,
        "copy_ms": copy / 1e6,
        "commit_ms": commit_ms,
        "early_commits": early / 1e6 / commit_ms,
        "late_commits": late / 1e6 / commit_ms,
        "early_us_per_event": early / 1e3 / total,
    }


def run(
    *,
    quick: bool = False,
    scratch_dir: Path | None = None,
    messages: int | None = None,
    leaves: int | None = None,
    redaction_events: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    total = messages or (200 if quick else 2000)
    n = leaves or (10_000 if quick else 1_000_000)
    commits = []
    for mode, batch in (("full", 10), ("none", 10), ("none", 1)):
        with scratch(scratch_dir, f"audit-{mode}-{batch}-") as root:
            commits.append(commit_cost(root, mode, total if batch == 10 else total // 4, batch))
    with scratch(scratch_dir, "audit-proofs-") as root:
        started = time.perf_counter()
        proof_rows = proofs(root, n)
        build_s = time.perf_counter() - started
    redactions = []
    for size in redaction_events or ((1_000, 5_000) if quick else (1_000, 10_000, 100_000)):
        with scratch(scratch_dir, "audit-redact-") as root:
            redactions.append(redaction_cost(root, size))
    return {
        "commits": commits,
        "proofs": proof_rows,
        "tree_build_s": build_s,
        "signing": sign_cost(200),
        "redactions": redactions,
    }


COMMIT_COLUMNS = [
    ("mode", "mode"),
    ("batch", "msgs/commit"),
    ("commits", "commits"),
    ("with_tree_ms", "median ms (tree)"),
    ("without_tree_ms", "median ms (no tree)"),
    ("tree_step_us", "tree step µs (median)"),
    ("tree_step_mean_us", "(mean)"),
    ("per_message_us", "µs/message"),
    ("share", "share of commit"),
]
PROOF_COLUMNS = [
    ("proof", "proof"),
    ("leaves", "events"),
    ("hashes", "hashes"),
    ("bytes", "bytes"),
    ("make_us", "make µs"),
    ("verify_us", "verify µs"),
]


REDACTION_COLUMNS = [
    ("events", "events"),
    ("file_mb", "data file MB"),
    ("early_ms", "redact early ms"),
    ("early_commits", "(in commits)"),
    ("early_us_per_event", "µs/event"),
    ("late_ms", "redact late ms"),
    ("late_commits", "(in commits)"),
    ("copy_ms", "compacting copy ms"),
    ("commit_ms", "10-msg commit ms"),
]


def render(result: dict[str, Any]) -> str:
    rows = [dict(r, share=f"{100 * r['share']:.2f}%") for r in result["commits"]]
    signing_row = result["signing"]
    return "\n".join(
        [
            "The Merkle tree's step in the commit (timed inside the commit; share: its median / the median commit)",
            "",
            table(rows, COMMIT_COLUMNS),
            "",
            f"Proofs in a stored tree (built in {result['tree_build_s']:.1f} s)",
            "",
            table(result["proofs"], PROOF_COLUMNS),
            "",
            f"Checkpoint: sign {signing_row['sign_us']:.0f} µs, verify {signing_row['verify_us']:.0f} µs (Ed25519, C2SP note)",
            "",
            "Redaction of one message (mode full; in commits: as many durable 10-message commits into the same log)",
            "",
            table(result.get("redactions", []), REDACTION_COLUMNS),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
