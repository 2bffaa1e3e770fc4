"""Bulk import, replay and projection rebuild at 100,000 messages.

What it measures:

- bulk import: 100,000 messages as 100 sessions of 1,000, one ``flush`` per
  session, into a fresh log with ``durability="none"`` and then with ``"full"``;
  messages/s over the whole import and the latency of each 1,000-message flush;
- the import's floor on this machine: the least work that gives what an import
  guarantees, with nothing validated or stored (:func:`import_floor`): per message
  its canonical encoding, content digest, node digest, 16 bytes of salt (one
  ``os.urandom`` call per flush) and its salted commitment; per flush the event's
  payload commitment, its leaf and the leaf's step into the Merkle tree.  Not
  counted: the check that every value is JSON-like, the event's bytes and their
  hash (the log's event chain), the index entries and LMDB's commit;
- ``eventlog import`` of the same messages written as one JSON Lines file (one session,
  ``--durability none``), each round, beside its floor: the file read and each line parsed
  by msgspec, then the import's floor of each event's 1,024 messages;
- import against its floor, round by round: each round imports the 100,000 messages
  into a fresh log (``durability="none"``) and runs the floor over the same messages, the
  two taking turns flush by flush (which goes first rotates), each over its own copy of
  the messages, so that neither finds the other's in the CPU's caches and both see the
  machine in the same state; the ratio is the floor's time over the import's, reported as
  the median over the rounds and their spread, by the clock and by the process's CPU time
  (which other work on a shared machine sways less);
- the rounds against the floors run back to back, before the other imports: on a virtual
  machine whose host takes back the memory its guest leaves free for a while (a balloon with
  free page reporting, as here), a round that follows other work pays for faulting in again
  the page cache its writes go to, which the floors computing in memory never do (measured
  here: the stored floor below took 1.16-1.20x the floor's time in rounds back to back,
  1.48-1.57x in rounds after other work, and the import took about as much longer);
- in the same turns, the floor with the messages stored (``STORED_FLOOR``, a third copy):
  each flush's bodies and salts joined into one value, put into a bare LMDB environment
  (no sync, as the import's durability none) and committed.  The floor's time over this
  one's is the best ratio an import that stores its messages can reach: below 0.6x, the
  target is out of reach on the machine;
- replay: ``log.messages(sid)`` of one 100,000-message session (built with
  ``append`` in chunks of 10,000), repeated, each read's messages freed before the next read
  is timed; messages/s;
- projection rebuild: ``SQLiteProjection(path).rebuild(log)`` of the 100,000
  imported messages (rows, sessions and the FTS5 index), repeated; rows/s.
  Skipped with a message while ``projections`` cannot be imported.  Beside it, its
  floor: SQLite alone writing the same rows, prebuilt, with the same statements.

Targets: import >= 0.6x its floor (durability none, median of the rounds),
replay >= 500k msg/s, rebuild >= 50k rows/s.

Run it::

    python -m benchmarks.bench_bulk             # 100,000 messages, 5 rounds
    python -m benchmarks.bench_bulk --quick     # 10,000, 3 rounds
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from hashlib import sha256
from pathlib import Path
from typing import Any

import lmdb
import msgspec
from click.testing import CliRunner

from benchmarks.harness import now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.systems import projection_available
from benchmarks.workload import Workload
from eventlog import EventLog
from eventlog.cli import cli
from eventlog.merkle import Frontier
from eventlog.overlap import _digest
from eventlog.verifier import appended_commitment, event_leaf, leaf_hash
from eventlog.writer import EVENT_MESSAGES

PER_SESSION = 1_000
FLOOR = "floor: import's encoding, two digests, salt and commitment per message, tree step per flush"
STORED_FLOOR = "floor: the same, each flush's bodies and salts then put into bare LMDB and committed (no sync)"

_encode = msgspec.msgpack.Encoder(order="deterministic").encode
_DIGEST = type(sha256()).digest
_ZERO = bytes(32)


def import_floor(
    messages: list[dict[str, Any]], frontier: Frontier, seq: int, env: lmdb.Environment | None = None
) -> bytes:
    """The least work a content-addressed, salted, Merkle-sealed log does to import ``messages``
    as one event ``seq``: canonical bytes, content digest and node digest per message, its salt
    and salted commitment (SHA-256 of "M", salt, digest and the empty override), then the event's
    payload commitment, its leaf and the leaf's step into the tree.  Returns the last node digest.
    The digests are computed as the import computes them, by the C loops of ``eventlog._digest``
    (when built), here all on the calling thread: the import hashes each part of its bodies on
    the worker thread while it encodes the next, which saves time, not work.

    With ``env`` (a bare LMDB environment), the messages are also stored, as little as an import
    stores them: the bodies and salts joined into one value (one copy, as the import encodes its
    event once into its buffer), put under ``seq`` and committed."""
    bodies = list(map(_encode, messages))
    if _digest is not None:  # the C loops the import hashes with, here on the calling thread
        digests = _digest.each(bodies, False).finish()
        parent = _digest.chain(_ZERO, digests)[-1] if digests else _ZERO
    else:
        digests = list(map(_DIGEST, map(sha256, bodies)))
        parent = _ZERO
        for digest in digests:
            parent = sha256(parent + digest).digest()
    salts = os.urandom(16 * len(digests))
    commitments = [
        sha256(b"M" + salts[16 * i : 16 * i + 16] + digest + _ZERO).digest() for i, digest in enumerate(digests)
    ]
    payload = appended_commitment(0, 0, commitments)
    frontier.append(leaf_hash(event_leaf(seq, 0, 2, seq, 0, "session", payload)))
    if env is not None:
        with env.begin(write=True) as txn:
            txn.put(seq.to_bytes(8, "big"), b"".join([*bodies, salts]), append=True)
    return parent


def bare_env(path: Path) -> lmdb.Environment:
    """A bare LMDB environment for :data:`STORED_FLOOR`: the log's settings in durability none
    (no sync, no meta sync), its map large enough from the start (sparse: no cost)."""
    return lmdb.open(str(path), map_size=4 << 30, sync=False, metasync=False, max_dbs=0)


FILE_FLOOR = "floor: the same, each event's 1,024 messages, after parsing each line (msgspec)"


def file_floor(source: Path) -> None:
    """The least an import of a JSON Lines file does: the file read and each line parsed, then
    :func:`import_floor` of every event's messages (the log writes 1,024 messages per event)."""
    decode = msgspec.json.decode
    messages = [decode(line) for line in source.read_text(encoding="utf-8").split("\n") if line]
    frontier = Frontier()
    for seq, at in enumerate(range(0, len(messages), EVENT_MESSAGES), start=1):
        import_floor(messages[at : at + EVENT_MESSAGES], frontier, seq)


def run(
    *,
    quick: bool = False,
    scratch_dir: Path | None = None,
    messages: int | None = None,
    repeats: int | None = None,
    rounds: int | None = None,
) -> dict[str, Any]:
    total = messages or (10_000 if quick else 100_000)
    repeats = repeats or (1 if quick else 3)
    rounds = rounds or (3 if quick else 5)
    per_session = min(PER_SESSION, total)
    sessions = [Workload(salt=f"bulk-{i}").messages(per_session) for i in range(max(1, total // per_session))]
    # The floors' own copies of the same messages (see the module's docstring).
    copies = {
        step: [Workload(salt=f"bulk-{i}").messages(per_session) for i in range(len(sessions))]
        for step in ("floor", "stored floor")
    }
    count = sum(map(len, sessions))
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    with scratch(scratch_dir, "bulk-") as root:
        timed: dict[str, list[int]] = {
            "none": [],
            "full": [],
            "floor": [],
            "stored floor": [],
            "file": [],
            "file floor": [],
        }
        ratios: list[float] = []
        stored_ratios: list[float] = []  # the floor's time over the stored floor's: the best an import can reach
        cpu_ratios: list[float] = []  # the same by the process's CPU time: less swayed by a busy machine
        file_ratios: list[float] = []
        source = root / "transcripts.jsonl"
        with open(source, "w", encoding="utf-8") as out:
            for batch in sessions:
                out.writelines(json.dumps(message, ensure_ascii=False) + "\n" for message in batch)
        for r in range(rounds):
            # Round by round, back to back: the import in mode none taking turns with the two
            # floors (see the module's docstring).  The first round's log is kept for the rebuild.
            spent = {"none": 0, "floor": 0, "stored floor": 0}
            cpu = {"none": 0, "floor": 0}
            path = root / f"import-none-{r}"
            stored = bare_env(root / f"stored-floor-{r}")
            frontiers = {"floor": Frontier(), "stored floor": Frontier()}
            steps = ("none", "floor", "stored floor")
            try:
                with EventLog.open(path, durability="none") as log, quiet_gc():
                    for i, batch in enumerate(sessions):
                        for step in steps[i % 3 :] + steps[: i % 3]:
                            cpu_start = time.process_time_ns()
                            start = now_ns()
                            if step == "none":
                                log.flush(f"session-{i}", batch)
                            else:
                                env = stored if step == "stored floor" else None
                                import_floor(copies[step][i], frontiers[step], i + 1, env)
                            took = now_ns() - start
                            spent[step] += took
                            if step in cpu:
                                cpu[step] += time.process_time_ns() - cpu_start
                            if step == "none":
                                timed["none"].append(took)
            finally:
                stored.close()
                shutil.rmtree(root / f"stored-floor-{r}", ignore_errors=True)
            if r:
                shutil.rmtree(path, ignore_errors=True)
            timed["floor"].append(spent["floor"])
            timed["stored floor"].append(spent["stored floor"])
            ratios.append(spent["floor"] / spent["none"])
            cpu_ratios.append(cpu["floor"] / cpu["none"])
            stored_ratios.append(spent["floor"] / spent["stored floor"])
        for r in range(rounds):
            # Then the import in mode full and the command line's import.
            path = root / f"import-full-{r}"
            with EventLog.open(path, durability="full") as log, quiet_gc():
                for i, batch in enumerate(sessions):
                    start = now_ns()
                    log.flush(f"session-{i}", batch)
                    timed["full"].append(now_ns() - start)
            shutil.rmtree(path, ignore_errors=True)
            # The command line's import of the same messages as one JSON Lines file, and its floor.
            path = root / f"file-{r}"
            with quiet_gc():
                start = now_ns()
                result = CliRunner().invoke(
                    cli, ["--log", str(path), "import", str(source), "--session", "s", "--durability", "none"]
                )
                timed["file"].append(now_ns() - start)
            assert result.exit_code == 0, result.output
            shutil.rmtree(path, ignore_errors=True)
            with quiet_gc():
                start = now_ns()
                file_floor(source)
                timed["file floor"].append(now_ns() - start)
            file_ratios.append(timed["file floor"][-1] / timed["file"][-1])
        for mode in ("none", "full"):
            row = {
                "system": f"bulk import ({len(sessions)} flushes of {per_session:,})",
                "durability": mode,
                "messages": count,
            }
            row.update(summary(timed[mode], per_session))
            row["unit"] = "msgs/s"
            rows.append(row)
        file_row = {
            "system": f"eventlog import of one {count:,}-message JSONL file",
            "durability": "none",
            "messages": count,
        }
        file_row.update(summary(timed["file"], count))
        file_row["unit"] = "msgs/s"
        rows.append(file_row)
        file_floor_row = {"system": FILE_FLOOR, "durability": "-", "messages": count}
        file_floor_row.update(summary(timed["file floor"], count))
        file_floor_row["unit"] = "msgs/s"
        floor_row = {"system": FLOOR, "durability": "-", "messages": count}
        floor_row.update(summary(timed["floor"], count))
        floor_row["unit"] = "msgs/s"
        stored_floor_row = {"system": STORED_FLOOR, "durability": "none", "messages": count}
        stored_floor_row.update(summary(timed["stored floor"], count))
        stored_floor_row["unit"] = "msgs/s"
        vs_floor = {
            "rounds": ratios,
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "cpu_rounds": cpu_ratios,
            "cpu_median": statistics.median(cpu_ratios),
            "cpu_min": min(cpu_ratios),
            "cpu_max": max(cpu_ratios),
            "stored_rounds": stored_ratios,
            "stored_median": statistics.median(stored_ratios),
        }
        file_vs_floor = {
            "rounds": file_ratios,
            "median": statistics.median(file_ratios),
            "min": min(file_ratios),
            "max": max(file_ratios),
        }

        # One long session for replay.
        with EventLog.open(root / "replay", durability="none") as log:
            chunk: list[dict[str, Any]] = []
            for messages in sessions:
                chunk.extend(messages)
                if len(chunk) >= 10_000:
                    log.append("long", chunk)
                    chunk = []
            if chunk:
                log.append("long", chunk)
            samples = []
            replayed: list[dict[str, Any]] = []
            with quiet_gc():
                for _ in range(repeats):
                    del replayed  # the last read's messages are freed before the clock starts, not in it
                    start = now_ns()
                    replayed = log.messages("long")
                    samples.append(now_ns() - start)
            assert len(replayed) == count
            del replayed
            row = {"system": f"replay of one {count:,}-message session", "durability": "-", "messages": count}
            row.update(summary(samples, count))
            row["unit"] = "msgs/s"
            rows.append(row)
        rows.append(floor_row)
        rows.append(stored_floor_row)
        rows.append(file_floor_row)

        reason = projection_available()
        name = f"projection rebuild of {count:,} messages"
        if reason:
            skipped[name] = reason
        else:
            from projections import SQLiteProjection

            with EventLog.open(root / "import-none-0", durability="none") as log:
                samples = []
                for i in range(repeats):
                    projection = SQLiteProjection(root / f"rebuild-{i}.db")
                    try:
                        os.sync()  # untimed: the imports' writeback is not the rebuild's to wait for
                        with quiet_gc():
                            start = now_ns()
                            projection.rebuild(log)
                            samples.append(now_ns() - start)
                        found = len(projection.messages("session-0"))
                        assert found == per_session, f"the projection holds {found} rows of session-0"
                    finally:
                        projection.close()
            row = {"system": name + " (rows + FTS5)", "durability": "-", "messages": count}
            row.update(summary(samples, count))
            row["unit"] = "rows/s"
            rows.append(row)
            rows.append(_sqlite_floor(root, root / "rebuild-0.db", repeats, count))
    return {
        "scenario": "bulk import, replay, rebuild",
        "messages": count,
        "rows": rows,
        "import_vs_floor": vs_floor,
        "file_vs_floor": file_vs_floor,
        "skipped": skipped,
    }


def _sqlite_floor(root: Path, rebuilt: Path, repeats: int, count: int) -> dict[str, Any]:
    """SQLite alone writing the rows a rebuild wrote, prebuilt: the same schema, settings,
    statements and bulks (rows, then their FTS5 index), in one transaction in rollback-journal
    mode, as a rebuild with the file to itself.  No Python derivation and no reading of the log,
    so each bulk is indexed the way that is fastest with nothing running beside it (rows read,
    then one ``INSERT ... VALUES`` each; the rebuild runs one ``INSERT ... SELECT`` on a helper
    thread, beside its derivation of the next bulk)."""
    import sqlite3

    from projections import SQLiteProjection
    from projections.core import ROW_COLUMNS, ROWS_PER_WRITE
    from projections.sqlite_store import INSERT_ROW, index_pending

    source = sqlite3.connect(rebuilt)
    prebuilt = source.execute(f"SELECT {', '.join(ROW_COLUMNS)} FROM messages ORDER BY id").fetchall()
    source.close()
    samples = []
    for i in range(repeats):
        target = SQLiteProjection(root / f"floor-{i}.db")  # the projection's schema and settings
        db = target._db
        db.execute("PRAGMA journal_mode = DELETE")
        db.execute("PRAGMA synchronous = FULL")
        os.sync()
        with quiet_gc():
            start = now_ns()
            db.execute("BEGIN IMMEDIATE")
            for at in range(0, len(prebuilt), ROWS_PER_WRITE):
                db.executemany(INSERT_ROW, prebuilt[at : at + ROWS_PER_WRITE])
                index_pending(db, at)
            db.execute("COMMIT")
            samples.append(now_ns() - start)
        assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == len(prebuilt)
        target.close()
    row = {"system": "floor: SQLite alone, the same rows prebuilt (rows + FTS5)", "durability": "-", "messages": count}
    row.update(summary(samples, count))
    row["unit"] = "rows/s"
    return row


COLUMNS = [
    ("system", "operation"),
    ("durability", "durability"),
    ("n", "runs"),
    ("median_ms", "median ms (per flush / per run)"),
    ("p99_ms", "p99 ms"),
    ("msgs_per_s", "messages (rows)/s"),
]


def render(result: dict[str, Any]) -> str:
    lines = [f"Bulk operations at {result['messages']:,} messages", "", table(result["rows"], COLUMNS)]
    vs = result["import_vs_floor"]
    file = result["file_vs_floor"]
    lines.append(
        f"\neventlog import of the file against its floor, round by round: {file['median']:.2f}x "
        f"(median of {len(file['rounds'])} rounds; {file['min']:.2f}-{file['max']:.2f}x)"
    )
    lines.append(
        f"\nbulk import [none] against its floor, round by round: {vs['median']:.2f}x "
        f"(median of {len(vs['rounds'])} rounds; {vs['min']:.2f}-{vs['max']:.2f}x); by CPU time "
        f"{vs['cpu_median']:.2f}x ({vs['cpu_min']:.2f}-{vs['cpu_max']:.2f}x); the floor over the floor that "
        f"also stores the messages: {vs['stored_median']:.2f}x"
    )
    for name, why in result["skipped"].items():
        lines.append(f"\nskipped {name}: {why}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
