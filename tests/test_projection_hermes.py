"""The hermes target read back by hermes' own readers (hermes-agent 0.19, a test dependency).

hermes' ``SessionDB`` (read-only and read-write), its ``get_messages_as_conversation``,
its search, and the ``hermes sessions list/export/stats`` commands, run as subprocesses
with ``HERMES_HOME`` in the test's temporary folder, all read the projected ``state.db``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eventlog import EventLog
from projections import ProjectionError, SchemaVersionError
from projections.hermes import HERMES_SCHEMA, HermesProjection

hermes_state = pytest.importorskip("hermes_state", reason="hermes-agent is not installed")

T0 = 1_700_000_000.0


def turn(i: int) -> list[dict[str, Any]]:
    """Messages shaped as hermes keeps them: role, content, timestamp, tool calls and results."""
    return [
        {"role": "user", "content": f"question {i} about lighthouses", "timestamp": T0 + 4 * i},
        {
            "role": "assistant",
            "content": "",
            "timestamp": T0 + 4 * i + 1,
            "tool_calls": [
                {"id": f"call{i}", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "beacon"}'}}
            ],
            "finish_reason": "tool_calls",
        },
        {
            "role": "tool",
            "content": f"result {i}",
            "tool_call_id": f"call{i}",
            "tool_name": "lookup",
            "timestamp": T0 + 4 * i + 2,
        },
        {
            "role": "assistant",
            "content": f"answer {i} with fresnel lenses",
            "timestamp": T0 + 4 * i + 3,
            "finish_reason": "stop",
            "reasoning": "thinking it over",
        },
    ]


def conversation(n: int) -> list[dict[str, Any]]:
    return [m for i in range(n) for m in turn(i)]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "hermes-home"
    folder.mkdir()
    return folder


@pytest.fixture
def projected(home: Path, log: EventLog) -> HermesProjection:
    log.flush("s1", conversation(3))
    log.update_session("s1", title="Lighthouse research", model="gpt-test", source="cli", input_tokens=120)
    log.flush("s2", conversation(1))
    log.rewind("s2", to=2)
    log.compact("s1", start=0, end=4, summary=[{"role": "user", "content": "summary of turn zero", "timestamp": T0}])
    log.close_session("s2", reason="user_exit")
    proj = HermesProjection(home / "state.db")
    proj.catch_up(log)
    return proj


@pytest.mark.parametrize("read_only", [True, False], ids=["read-only", "read-write"])
def test_hermes_session_db_reads_the_log_transcripts(
    projected: HermesProjection, log: EventLog, home: Path, read_only: bool
) -> None:
    projected.close()
    db = hermes_state.SessionDB(db_path=home / "state.db", read_only=read_only)
    try:
        for sid in ("s1", "s2"):
            assert db.get_messages_as_conversation(sid) == log.messages(sid)
        session = db.get_session("s1")
        assert session is not None
        assert session["title"] == "Lighthouse research"
        assert session["model"] == "gpt-test"
        assert session["source"] == "cli"
        assert session["input_tokens"] == 120
        assert session["message_count"] == len(log.messages("s1"))
        assert db.get_session("s2")["end_reason"] == "user_exit"
        if not read_only:  # hermes searches only through a read-write open
            hits = db.search_messages("fresnel")
            # s1's answers: live, and compacted (hermes finds those too: the compaction tombstoned
            # turns 1 and 2 and carried them after the summary); s2's was rewound, and is not found.
            found = sorted((h["session_id"], h["snippet"].replace(">>>", "").replace("<<<", "").strip()) for h in hits)
            answers = [("s1", f"answer {i} with fresnel lenses") for i in range(3)]
            assert found == sorted([*answers, *answers[1:]])
    finally:
        db.close()
    # A read-write open by hermes leaves the projection usable.
    proj = HermesProjection(home / "state.db")
    log.flush("s1", [*log.messages("s1"), {"role": "user", "content": "one more", "timestamp": T0 + 99}])
    assert proj.catch_up(log) == 1
    assert [json.loads(r["message"]) for r in proj.messages("s1")] == log.messages("s1")
    proj.close()


def test_tombstones_become_hermes_soft_deletes(projected: HermesProjection, home: Path) -> None:
    projected.close()
    db = sqlite3.connect(home / "state.db")
    rows = db.execute(
        "SELECT r.session_id, r.tombstone_reason, m.active, m.compacted FROM messages AS m "
        "JOIN eventlog_rows AS r ON r.message_id = m.id ORDER BY m.id"
    ).fetchall()
    db.close()
    assert ("s1", "compaction", 0, 1) in rows
    assert ("s2", "rewind", 0, 0) in rows
    assert all((active == 1) == (reason is None) for _, reason, active, _ in rows)
    assert all(compacted == (reason == "compaction") for _, reason, _, compacted in rows)


def test_a_display_override_is_hermes_content_with_the_wire_copy_in_api_content(home: Path, log: EventLog) -> None:
    wire = {"role": "user", "content": "<memory>injected</memory> hello", "timestamp": T0}
    log.flush("s", [wire], overrides={0: {"content": "hello"}})
    with HermesProjection(home / "state.db") as proj:
        proj.catch_up(log)
    db = hermes_state.SessionDB(db_path=home / "state.db", read_only=True)
    try:
        assert db.get_messages_as_conversation("s") == [
            {"role": "user", "content": "hello", "api_content": wire["content"], "timestamp": T0}
        ]
    finally:
        db.close()


def hermes_cli(home: Path, *args: str) -> str:
    env = {**os.environ, "HERMES_HOME": str(home), "NO_COLOR": "1"}
    hermes = Path(sys.executable).with_name("hermes")
    done = subprocess.run(
        [str(hermes), *args], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_hermes_sessions_list_export_and_stats(projected: HermesProjection, log: EventLog, home: Path) -> None:
    projected.close()
    listed = hermes_cli(home, "sessions", "list")
    assert "Lighthouse research" in listed
    assert "s2" in listed
    exported = home / "out.jsonl"
    hermes_cli(home, "sessions", "export", str(exported), "--session-id", "s1")
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(records) == 1
    assert records[0]["id"] == "s1"
    contents = [m["content"] for m in records[0]["messages"]]
    assert contents == [m["content"] for m in log.messages("s1")]
    stats = hermes_cli(home, "sessions", "stats")
    db = sqlite3.connect(home / "state.db")
    rows = db.execute("SELECT count(*) FROM eventlog_rows").fetchone()[0]  # hermes counts soft-deleted rows too
    db.close()
    assert "Total sessions: 2" in stats, stats
    assert f"Total messages: {rows}" in stats, stats


def test_a_newer_hermes_schema_is_refused(projected: HermesProjection, home: Path) -> None:
    projected.close()
    db = sqlite3.connect(home / "state.db")
    db.execute("UPDATE schema_version SET version = ?", (HERMES_SCHEMA + 1,))
    db.commit()
    db.close()
    with pytest.raises(SchemaVersionError, match=f"schema version {HERMES_SCHEMA + 1}"):
        HermesProjection(home / "state.db")


def test_hermes_own_state_db_is_refused_and_left_alone(home: Path) -> None:
    hermes_state.SessionDB(db_path=home / "state.db").close()
    before = (home / "state.db").read_bytes()
    with pytest.raises(ProjectionError, match=r"hermes' own state\.db"):
        HermesProjection(home / "state.db")
    assert (home / "state.db").read_bytes() == before


def test_session_titles_hermes_keeps_unique_are_told_apart(home: Path, log: EventLog) -> None:
    for sid in ("a", "b", "c"):
        log.flush(sid, [{"role": "user", "content": sid, "timestamp": T0}])
    log.update_session("a", title="Same")
    log.update_session("b", title="Same")
    log.update_session("c", title="Other")
    with HermesProjection(home / "inc.db") as inc:
        inc.catch_up(log)
        assert {s["id"]: s["title"] for s in inc.sessions()} == {"a": "Same (a)", "b": "Same (b)", "c": "Other"}
        log.update_session("b", title="Renamed")
        inc.catch_up(log)
        assert {s["id"]: s["title"] for s in inc.sessions()} == {"a": "Same", "b": "Renamed", "c": "Other"}


def test_a_file_written_before_redactions_gains_the_redacted_column(tmp_path: Path, log: EventLog) -> None:
    log.flush("s", [{"role": "user", "content": "kept"}])
    with HermesProjection(tmp_path / "state.db") as state:
        state.catch_up(log)
    db = sqlite3.connect(tmp_path / "state.db")  # as the projection wrote it before
    db.execute("DROP INDEX eventlog_rows_body")
    db.execute("ALTER TABLE eventlog_rows DROP COLUMN redacted_seq")
    db.commit()
    db.close()
    with HermesProjection(tmp_path / "state.db") as state:
        assert [r["redacted_seq"] for r in state.messages("s")] == [None]
        log.flush("s", [{"role": "user", "content": "kept"}, {"role": "assistant", "content": "more"}])
        assert state.catch_up(log) == 1
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'eventlog_rows_body'").fetchone() == (1,)
    db.close()
