"""Concurrency: many threads and processes flushing the same lists write each message once;
other tools holding the projection database do not block the log; the soak runner works."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from crashkit import ROOT, child_env, run_python

from eventlog import EventLog

try:
    from projections import SQLiteProjection
except ImportError:  # pragma: no cover
    SQLiteProjection = None  # type: ignore[assignment,misc]

needs_projection = pytest.mark.skipif(SQLiteProjection is None, reason="projections package not importable")


def _turns(n: int) -> list[dict[str, object]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"turn {i}"} for i in range(n)]


def test_threads_flushing_the_same_growing_list_write_each_message_once(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", durability="none") as log:
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def exit_path() -> None:
            try:
                for n in range(1, 61):
                    barrier.wait()  # every exit path flushes the same list at the same moment
                    log.flush("s", _turns(n))
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=exit_path) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert log.messages("s") == _turns(60)
        assert len(log.history("s")) == 60  # nothing tombstoned, nothing written twice
        assert log.verify().ok


FLUSHER = """
import sys
from eventlog import EventLog
turns = [{"role": "user" if i % 2 else "assistant", "content": f"turn {i}"} for i in range(80)]
with EventLog.open(sys.argv[1], durability="process") as log:
    for _ in range(40):
        log.flush("shared", turns)
"""


def test_processes_flushing_the_same_list_write_each_message_once(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path):
        pass
    children = [
        subprocess.Popen([sys.executable, "-c", FLUSHER, str(path)], env=child_env(), stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for child in children:
        _, err = child.communicate(timeout=120)
        assert child.returncode == 0, err
    with EventLog.open(path) as log:
        assert log.messages("shared") == _turns(80)
        assert len(log.history("shared")) == 80
        assert log.verify().ok


@needs_projection
def test_a_reader_holding_a_long_transaction_on_the_projection_does_not_block_log_writes(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    with SQLiteProjection(db) as projection, EventLog.open(tmp_path / "log", projections=[projection]) as log:
        log.flush("s", _turns(1))
        assert log.sync_projections(timeout=30)  # a raw reader sees rows once the projector has applied them
        reader = sqlite3.connect(db)  # like Datasette or a UI: a read transaction left open
        try:
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
            started = time.monotonic()
            for n in range(2, 40):
                log.flush("s", _turns(n))
            assert time.monotonic() - started < 10
            # The reader keeps its snapshot; the projection moved on.
            assert reader.execute("SELECT count(*) FROM messages").fetchone()[0] == 1
        finally:
            reader.rollback()
            reader.close()
        assert len(projection.messages("s")) == 39
        assert log.verify().ok


HOLD_SQLITE_WRITE = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
"""


@needs_projection
def test_a_tool_holding_the_projection_write_lock_never_loses_a_log_write(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    with SQLiteProjection(db) as projection:
        projection_path = projection.path
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_SQLITE_WRITE, projection_path, "3"],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with EventLog.open(tmp_path / "log") as log:
            log.flush("s", _turns(3))  # the log does not wait for the projection at all
            with SQLiteProjection(db) as projection:
                # Catching up waits for the lock (bounded by SQLite's busy timeout), then applies.
                projection.catch_up(log)
                assert len(projection.messages("s")) == 3
    finally:
        holder.wait(timeout=30)
        assert holder.stdout is not None
        holder.stdout.close()


def test_soak_runner_smoke(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "soak.py"),
            "--procs",
            "2",
            "--sessions",
            "2",
            "--seconds",
            "1.5",
            "--durability",
            "none",
            "--workdir",
            str(tmp_path / "w"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(out.read_text())
    assert figures["flushes"] > 0 and figures["problems"] == []
    assert figures["p99_ms"] >= figures["p50_ms"] > 0


def test_crash_harness_command_line_smoke(tmp_path: Path) -> None:
    done = run_python(
        "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
        str(ROOT / "scripts" / "crash_harness.py"),
        "--kills",
        "3",
        "--durability",
        "none",
        "--seed",
        "1",
        "--workdir",
        str(tmp_path / "w"),
        "--json",
        str(tmp_path / "r.json"),
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "r.json").read_text())["results"]
    assert results[0]["ok"] and results[0]["kills"] == 3


_FORKED = r"""
import json, os, sys
from eventlog import EventLog, EventLogError

log = EventLog.open(sys.argv[1])
log.flush("s", [{"role": "user", "content": "before the fork"}])
store = log._store  # the parent's own open read snapshot, as a long reader holds one
with store.read() as txn:
    before = store.env.readers()
    pid = os.fork()
    if pid == 0:  # the child: every use is refused, close() touches nothing of the parent's
        outcome = {}
        for name, use in [("messages", lambda: log.messages("s")), ("flush", lambda: log.flush("s", []))]:
            try:
                use()
                outcome[name] = "no error"
            except EventLogError as e:
                outcome[name] = str(e)
        log.close()
        print(json.dumps(outcome), flush=True)
        sys.exit(0)  # a normal exit: the interpreter's cleanup must not touch the parent's slots either
    os.waitpid(pid, 0)
    after = store.env.readers()
    # The parent's snapshot still holds its pages while others write.
    for i in range(200):
        log.flush("s", [{"role": "user", "content": "before the fork"}] + [{"role": "user", "content": str(j)} for j in range(i)])
    cursor = txn.cursor(db=store.events)
    count = sum(1 for _ in cursor)
print(json.dumps({"same_readers": before == after, "before": before, "after": after, "count": count}))
log.close()
"""


def test_a_log_used_after_fork_is_refused_in_the_child_and_leaves_the_parent_alone(tmp_path: Path) -> None:
    result = run_python(_FORKED, str(tmp_path / "log"), timeout=120)
    assert result.returncode == 0, result.stderr
    child, parent = (json.loads(line) for line in result.stdout.splitlines())
    assert all("fork" in why for why in child.values()), child
    assert parent["same_readers"], (parent["before"], parent["after"])
    assert parent["count"] == 2  # the snapshot from before the fork: the open and the first append


def test_verify_while_another_process_writes_reports_no_damage(tmp_path: Path) -> None:
    """The page walk reads the data file while a writer commits: it must read the pages of its
    own snapshot (or of a newer meta page, whose freed pages the snapshot keeps from reuse)."""
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("w", [{"role": "user", "content": "start"}])
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom eventlog import EventLog\n"
            "with EventLog.open(sys.argv[1], durability='none') as log:\n"
            "    msgs = []\n"
            "    while True:\n"
            "        msgs.append({'role': 'user', 'content': str(len(msgs)) * 20})\n"
            "        msgs = msgs if len(msgs) < 50 else msgs[:1]\n"
            "        log.flush('w', msgs)\n",
            str(path),
        ],
        env=child_env(),
    )
    try:
        with EventLog.open(path) as log:
            reports = [log.verify() for _ in range(10)]
    finally:
        writer.kill()
        writer.wait()
    assert [str(r) for r in reports if not r.ok] == []
    assert reports[-1].events > 1
