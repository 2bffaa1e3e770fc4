"""Crash safety: processes SIGKILLed at random moments lose nothing and duplicate nothing.

A short run of ``scripts/crash_harness.py`` per durability mode (the long run is
the same program with ``--kills 1000``), the projection killed mid catch-up, and a
writer killed while it holds LMDB's write lock or a reader slot.
"""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import lmdb
import pytest
from crashkit import Child, load_script, run_python

from eventlog import EventLog

harness = load_script("crash_harness")

try:
    from projections import SQLiteProjection
except ImportError:  # pragma: no cover - the projection is optional for these tests
    SQLiteProjection = None  # type: ignore[assignment,misc]

needs_projection = pytest.mark.skipif(SQLiteProjection is None, reason="projections package not importable")


@pytest.mark.parametrize("durability", ["full", "process", "none"])
def test_random_kills_lose_and_duplicate_nothing(tmp_path: Path, durability: str) -> None:
    result = harness.run(tmp_path, durability=durability, kills=24, seed=7 + len(durability), max_delay=0.08)
    assert result.ok, result.problems
    assert result.kills == 24
    # Kills that landed mid-write are what the run proves something with.
    assert result.mid_write_kills >= result.writer_kills // 2 > 0
    assert result.messages_acked > 100
    assert result.messages_checked > 0
    if SQLiteProjection is not None:
        assert result.projection.startswith("equals rebuild")


def test_harness_notices_a_lost_acknowledged_message(tmp_path: Path) -> None:
    """Mutation check of the checker: remove an acknowledged message behind its back."""
    result = harness.Result("full")
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        first = [harness.message_for("w0s0|1|1"), harness.message_for("w0s0|1|2")]
        done = log.flush("w0s0", first)
        log.rewind("w0s0", to=1)  # not acknowledged by anyone: the checker must object
    acked = [{"t": "ack", "s": "w0s0", "p": 0, "u": ["w0s0|1|1", "w0s0|1|2"], "h": done.head, "n": 2}]
    model = {"w0s0": ["w0s0|1|1", "w0s0|1|2"]}
    harness._check(path, "full", {0: ["w0s0"]}, model, acked, {"w0s0": done.head}, result)
    assert any("live transcript differs" in p for p in result.problems)
    assert any("head" in p for p in result.problems)


def test_harness_notices_a_message_written_twice(tmp_path: Path) -> None:
    result = harness.Result("full")
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        one = harness.message_for("w0s0|1|1")
        log.append("w0s0", [one])
        twice = log.append("w0s0", [one])  # a retry without expected_head duplicates
    acked = [{"t": "ack", "s": "w0s0", "p": 0, "u": ["w0s0|1|1"], "h": None, "n": 1}]
    harness._check(path, "full", {0: ["w0s0"]}, {"w0s0": ["w0s0|1|1", "w0s0|1|1"]}, acked, {"w0s0": twice.head}, result)
    assert any("written 2 times" in p for p in result.problems)


# -- the projection killed mid catch-up -----------------------------------------

PROJECTOR = """
import sys
from eventlog import EventLog
from projections import SQLiteProjection
with EventLog.open(sys.argv[1]) as log, SQLiteProjection(sys.argv[2], batch=int(sys.argv[3]), search_lag=0) as p:
    print("ready", flush=True)
    p.catch_up(log)
"""


def _checkpoint(db: Path) -> int:
    if not db.exists():
        return 0
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT last_seq FROM checkpoint").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


@needs_projection
def test_projection_killed_mid_catch_up_applies_each_event_once(tmp_path: Path) -> None:
    path, db, rebuilt = tmp_path / "log", tmp_path / "p.db", tmp_path / "rebuilt.db"
    rng = random.Random(3)
    with EventLog.open(path, durability="none") as log:
        for s in range(6):
            transcript: list[dict[str, object]] = []
            for turn in range(400):
                transcript.append(harness.message_for(f"s{s}|0|{turn}"))
                if turn % 40 == 39:
                    transcript = transcript[: rng.randint(1, len(transcript))]
                log.flush(f"s{s}", transcript)
        last = log.last_seq
    seen_between = set()
    for _ in range(20):
        with Child(PROJECTOR, str(path), str(db), "8") as child:
            child.wait_ready()
            time.sleep(rng.uniform(0.0, 0.08))
            child.kill()
        checkpoint = _checkpoint(db)
        if 0 < checkpoint < last:
            seen_between.add(checkpoint)
        if checkpoint == last:
            break
    assert seen_between, "no kill landed in the middle of a catch-up; the test proves nothing"
    with EventLog.open(path) as log, SQLiteProjection(db) as incremental, SQLiteProjection(rebuilt) as fresh:
        incremental.catch_up(log)
        fresh.rebuild(log)
        assert incremental.last_seq == fresh.last_seq == last
    assert harness._tables(db) == harness._tables(rebuilt)


REBUILDER = """
import sys, time
from eventlog import EventLog
from projections import SQLiteProjection

class Slow:  # the log's events, at a pace that leaves time to kill the rebuild midway
    def __init__(self, log):
        self.log, self.id = log, log.id
    def events(self, after=0):
        for record in self.log.events(after=after):
            time.sleep(0.001)
            yield record

with EventLog.open(sys.argv[1]) as log:
    p = SQLiteProjection(sys.argv[2])
    p._db.execute("PRAGMA cache_size = 50")  # a small cache: pages spill into the file early
    print("ready", flush=True)
    p.rebuild(Slow(log), exclusive=True)
    print("done", flush=True)
"""


@needs_projection
def test_an_exclusive_rebuild_killed_midway_leaves_the_old_projection(tmp_path: Path) -> None:
    path, db = tmp_path / "log", tmp_path / "p.db"
    with EventLog.open(path, durability="none") as log:
        for s in range(100):  # an event per message: about 2 s of rebuild at the child's pace
            transcript: list[dict[str, object]] = []
            for i in range(20):
                transcript.append(harness.message_for(f"s{s}|0|{i}"))
                log.flush(f"s{s}", transcript)
        with SQLiteProjection(db) as projection:
            projection.catch_up(log)
        last = log.last_seq
    before = harness._tables(db)

    def left_wal() -> bool:  # bytes 18-19 of the header: 2 in WAL mode, 1 with a rollback journal
        return db.read_bytes()[18:20] == b"\x01\x01"

    with Child(REBUILDER, str(path), str(db)) as child:
        child.wait_ready()
        deadline = time.monotonic() + 20
        while not left_wal() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert left_wal(), "the rebuild never left WAL mode"
        time.sleep(0.3)  # well into the rebuild: pages of the new projection are in the file
        assert child.popen.poll() is None, "the rebuild finished before the kill; the test proves nothing"
        child.kill()
    with EventLog.open(path) as log, SQLiteProjection(db) as projection:  # rolls the hot journal back
        assert projection._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        projection._db.execute("INSERT INTO messages_fts (messages_fts, rank) VALUES ('integrity-check', 1)")
        assert projection._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert harness._tables(db) == before
        assert projection.last_seq == last
        assert projection.rebuild(log, exclusive=True) == last
    assert harness._tables(db) == before


# -- locks and reader slots left by dead processes -------------------------------

HOLD_WRITE = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], subdir=True, max_dbs=8, max_readers=512)
txn = env.begin(write=True)
txn.put(b"half", b"written", db=env.open_db(b"meta", txn=txn))
print("ready", flush=True)
time.sleep(600)
"""

HOLD_READ = """
import sys, time, lmdb
env = lmdb.open(sys.argv[1], subdir=True, max_dbs=8, max_readers=512)
txn = env.begin()
txn.get(b"x")
print("ready", flush=True)
time.sleep(600)
"""

WRITE_ONE = """
import sys
from eventlog import EventLog
with EventLog.open(sys.argv[1]) as log:
    r = log.flush("s", [{"role": "user", "content": "before"}, {"role": "user", "content": "after"}])
    assert r.appended == 1, r
    assert log.verify().ok
print("ok")
"""


def test_writer_killed_holding_the_write_lock_does_not_block_the_next(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [{"role": "user", "content": "before"}])
        before = log.last_seq
    with Child(HOLD_WRITE, str(path)) as child:
        child.wait_ready()
        child.kill()
    # A subprocess with a timeout: a lock that is never released must fail the test, not hang it.
    done = run_python(WRITE_ONE, str(path), timeout=30)
    assert done.returncode == 0, done.stderr
    with EventLog.open(path) as log:
        assert log.last_seq == before + 1
        assert len(log.messages("s")) == 2


def test_reader_slot_of_a_dead_process_is_cleared_on_open(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [{"role": "user", "content": "x"}])
    with Child(HOLD_READ, str(path)) as child:
        child.wait_ready()
        dead = child.popen.pid
        child.kill()
    with EventLog.open(path):
        pass
    env = lmdb.open(str(path), subdir=True, max_dbs=8, max_readers=512, readonly=True)
    try:
        table = env.readers()
    finally:
        env.close()
    assert f"{dead} " not in table.replace("\t", " ")


STALE_READER_WORKLOAD = 1500


def _growth(path: Path, stale: bool) -> int:
    """Bytes the map grows by while a long-lived writer makes many small commits."""
    with EventLog.open(path) as log:
        log.flush("s", [{"role": "user", "content": "seed"}])
        if stale:
            with Child(HOLD_READ, str(path)) as child:
                child.wait_ready()
                child.kill()
        start = log.info()["used_bytes"]
        transcript = [{"role": "user", "content": "seed"}]
        for i in range(STALE_READER_WORKLOAD):
            transcript.append({"role": "assistant", "content": f"turn {i}"})
            log.flush("s", transcript)
        return log.info()["used_bytes"] - start


def test_stale_reader_slot_does_not_make_a_running_writer_grow(tmp_path: Path) -> None:
    control = _growth(tmp_path / "control", stale=False)
    stale = _growth(tmp_path / "stale", stale=True)
    assert stale <= 2 * control + (1 << 20), f"grew {stale} bytes with a stale reader, {control} without"


def test_the_harness_attacks_beyond_kills_pass(tmp_path: Path) -> None:
    """The harness's other attacks (full tmpfs, spilled rewrites, forked children, planted links);
    the page damage sweep is the storage test that zeroes and scrambles every page."""
    names = ("attack_full_disk", "attack_spilled_rewrites", "attack_forked_children", "attack_planted_links")
    found = harness.run_attacks(tmp_path, seed=1, rounds=1, only=names)
    assert [a.failures for a in found] == [[]] * len(names), found
    assert all(a.trials > 0 for a in found), found


def test_the_harness_attacks_notice_a_followed_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The planted-link attack itself can fail: with the lock file opened through links, it says so."""
    import eventlog.files

    monkeypatch.setattr(eventlog.files.os, "O_NOFOLLOW", 0)
    found = harness.run_attacks(tmp_path, seed=1, rounds=1, only=("attack_planted_links",))
    assert found[0].failures
