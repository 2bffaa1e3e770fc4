"""Three hosts, one PostgreSQL: logs written and projected at once, projectors killed and restarted.

Each "host" is a log in a folder of its own, a writer process making random turns
(appends, rewinds, edits, compactions, forks) and a projector process catching the log up
into one shared database in small transactions.  Meanwhile the test SIGKILLs projectors
at random moments (often mid-transaction) and starts them again.  At the end each log's
rows must equal a rebuild of that log, its live rows its live transcripts, searches must
find exactly the live rows, and nothing may be doubled.  The run is bounded: a fixed
number of turns per writer, and deadlines on every wait.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from eventlog import EventLog
from projections.postgres import PostgresProjection

WORDS = ["anchor", "buoy", "compass", "dune", "estuary", "fathom", "gale", "harbor"]
TURNS = 80
DEADLINE = 240.0
"""Seconds the whole run may take before the test fails instead of hanging."""

WRITER = f"""
import random, sys, time
from eventlog import EventLog
path, seed, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
words = {WORDS!r}
rng = random.Random(seed)
def msg(role):
    return {{"role": role, "content": " ".join(rng.choice(words) for _ in range(3))}}
with EventLog.open(path) as log:
    chats = {{}}
    for turn in range(turns):
        sid = f"s{{rng.randrange(3)}}"
        chat = chats.setdefault(sid, [])
        op = rng.random()
        if op < 0.15 and len(chat) > 2:
            del chat[rng.randrange(1, len(chat)):]  # a rewind
        elif op < 0.25 and chat:
            chat[-1] = msg("assistant")  # an edit
        elif op < 0.32 and len(chat) > 3:
            log.compact(sid, start=0, end=2, summary=[msg("user")])
            chat[:] = log.messages(sid)
            continue
        elif op < 0.36 and chat and f"f{{sid}}" not in chats:
            log.fork(sid, f"f{{sid}}", at=len(chat))
            chats[f"f{{sid}}"] = list(chat)
            continue
        chat += [msg("user"), msg("assistant")]
        log.flush(sid, chat)
        time.sleep(rng.random() * 0.02)
print("done", flush=True)
"""

PROJECTOR = """
import sys, time
from eventlog import EventLog
from projections.postgres import PostgresProjection
path, dsn, schema, name = sys.argv[1:5]
proj = PostgresProjection(dsn + "?application_name=" + name, schema=schema, batch=1)
with EventLog.open(path) as log:
    while True:
        proj.catch_up(log)
        time.sleep(0.001)
"""


ERRORS: list[Path] = []


def spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    """Start ``code`` in a new Python process; its stderr goes to a file of its own (see :func:`stderr_of`)."""
    errors = Path(args[0]).parent / f"stderr-{len(ERRORS)}.txt"
    ERRORS.append(errors)
    with errors.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", code, *args], stdout=subprocess.DEVNULL, stderr=sink, env=os.environ.copy()
        )
    process.errors = errors  # type: ignore[attr-defined]
    return process


def stderr_of(process: subprocess.Popen[bytes]) -> str:
    return process.errors.read_text(errors="replace")[-2000:]  # type: ignore[attr-defined]


def checkpoint(dsn: str, schema: str, log_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f'SELECT last_seq FROM "{schema}".checkpoints WHERE log_id = %s', (log_id,)).fetchone()
    return 0 if found is None else int(found[0])


def busy(dsn: str, name: str) -> bool:
    """Whether the projector called ``name`` is inside a statement or a transaction right now."""
    with psycopg.connect(dsn) as conn:
        states = conn.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s", (name,)).fetchall()
    return any(state in ("active", "idle in transaction") for (state,) in states)


def rows_of(proj: PostgresProjection, log_id: str) -> Any:
    messages = proj._rows(
        "SELECT *, search::text AS search FROM {s}.messages WHERE log_id = %s ORDER BY seq, idx", (log_id,)
    )
    sessions = proj._rows("SELECT * FROM {s}.sessions WHERE log_id = %s ORDER BY id", (log_id,))
    return [{k: v for k, v in r.items() if k != "log_id"} for r in messages], [
        {k: v for k, v in r.items() if k != "log_id"} for r in sessions
    ]


def test_three_hosts_project_into_one_database_through_kills(tmp_path: Path, postgres_dsn: str, pg_schema: str) -> None:
    started = time.monotonic()
    rng = random.Random(19)
    hosts = [tmp_path / f"host{i}" / "log" for i in range(3)]
    ids = []
    for path in hosts:
        path.parent.mkdir()
        with EventLog.open(path) as log:
            ids.append(log.id)
    PostgresProjection(postgres_dsn, schema=pg_schema).close()  # the schema, before the hosts race for it
    writers = [spawn(WRITER, str(path), str(i), str(TURNS)) for i, path in enumerate(hosts)]
    projectors = [spawn(PROJECTOR, str(path), postgres_dsn, pg_schema, f"projector{i}") for i, path in enumerate(hosts)]
    kills = behind_at_kill = mid_transaction = 0
    try:
        # Five kills at least, however fast the writers finish on this machine.
        while any(w.poll() is None for w in writers) or kills < 5:
            assert time.monotonic() - started < DEADLINE, "writers did not finish in time"
            time.sleep(rng.uniform(0.02, 0.2))
            i = rng.randrange(3)
            if projectors[i].poll() is not None:
                pytest.fail(f"projector {i} died by itself: {stderr_of(projectors[i])}")
            with EventLog.open(hosts[i]) as log:
                last = log.last_seq
            behind_at_kill += checkpoint(postgres_dsn, pg_schema, ids[i]) < last
            # Aim at a moment the projector is working: within a statement or a transaction (on a
            # loaded machine a restarted projector may take seconds to start working again).
            aim = time.monotonic() + 3.0
            while not (working := busy(postgres_dsn, f"projector{i}")) and time.monotonic() < aim:
                pass
            mid_transaction += working
            projectors[i].send_signal(signal.SIGKILL)
            projectors[i].wait()
            kills += 1
            projectors[i] = spawn(PROJECTOR, str(hosts[i]), postgres_dsn, pg_schema, f"projector{i}")
        for w in writers:
            assert w.returncode == 0, stderr_of(w)
        # The projectors catch up with the finished logs.
        lasts = []
        for path in hosts:
            with EventLog.open(path) as log:
                lasts.append(log.last_seq)
        while any(checkpoint(postgres_dsn, pg_schema, ids[i]) < lasts[i] for i in range(3)):
            assert time.monotonic() - started < DEADLINE, "projectors did not catch up in time"
            for i, p in enumerate(projectors):
                if p.poll() is not None:
                    pytest.fail(f"projector {i} died by itself: {stderr_of(p)}")
            time.sleep(0.1)
    finally:
        for p in [*projectors, *writers]:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
    assert kills >= 5 and behind_at_kill > 0 and mid_transaction > 0, (kills, behind_at_kill, mid_transaction)

    shared = PostgresProjection(postgres_dsn, schema=pg_schema)
    reference = PostgresProjection(postgres_dsn, schema=pg_schema + "_ref")
    try:
        assert shared.logs() == dict(zip(ids, lasts))
        for path, log_id in zip(hosts, ids):
            with EventLog.open(path) as log:
                assert reference.rebuild(log) == log.last_seq
                assert rows_of(shared, log_id) == rows_of(reference, log_id)
                live = {}
                for sid in log.sessions():
                    messages = log.messages(sid)
                    rows = shared.messages(sid, log_id=log_id)
                    assert [json.loads(r["message"]) for r in rows] == messages
                    live.update({(sid, p): m for p, m in enumerate(messages)})
                for word in WORDS:
                    hits = shared.search(word, log_id=log_id, limit=100_000)
                    found = [(h["session_id"], h["position"]) for h in hits]
                    assert len(found) == len(set(found)), word  # nothing doubled
                    expected = {key for key, m in live.items() if word in m["content"].split()}
                    assert set(found) == expected, word
        with psycopg.connect(postgres_dsn) as conn:
            doubled = conn.execute(
                f'SELECT log_id, session_id, position FROM "{pg_schema}".messages WHERE tombstone_seq IS NULL '
                "GROUP BY 1, 2, 3 HAVING count(*) > 1"
            ).fetchall()
        assert doubled == []
    finally:
        shared.close()
        reference.close()
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{pg_schema}_ref" CASCADE')
