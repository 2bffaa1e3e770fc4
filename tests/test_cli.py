"""The ``eventlog`` command, through click's runner and as a real subprocess."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import lmdb
import pytest
from click.testing import CliRunner, Result
from factories import assistant, tool, user

from eventlog import EventLog
from eventlog.cli import cli

CALL = {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "lmdb"}'}}


def build(path: Path) -> None:
    """A small log: chat (rewound, then edited), its fork, and a compacted session."""
    with EventLog.open(path) as log:
        chat = [
            {"role": "system", "content": "be brief"},
            user("what is lmdb?"),
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            tool("call_1", "a memory-mapped key-value store"),
            assistant("LMDB is a memory-mapped B+tree store."),
            user("and sqlite?"),
            assistant("An embedded SQL database."),
        ]
        log.flush("chat", chat)
        log.flush("chat", chat[:5])  # rewind of 2
        chat = chat[:5]
        chat[4] = assistant("LMDB is a memory-mapped B+tree key-value store.")
        log.flush("chat", chat)  # edit of 1
        log.update_session("chat", title="Storage questions", input_tokens=10)
        log.fork("chat", "branch", at=3)
        log.flush("branch", [*chat[:3], tool("call_1", "no result"), assistant("Sorry.")])
        log.close_session("branch", reason="user_exit")
        long = [user(f"q{i}") if i % 2 == 0 else assistant(f"a{i}") for i in range(10)]
        log.flush("long", long)
        log.compact("long", start=0, end=6, summary=[user("summary of q0..a5")])


@pytest.fixture
def logdir(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    build(path)
    return path


def run(*args: str, log: Path | None = None, env: dict[str, str] | None = None, input: str | None = None) -> Result:
    argv = (["--log", str(log)] if log is not None else []) + list(args)
    return CliRunner().invoke(cli, argv, env=env, input=input, catch_exceptions=False)


def run_json(*args: str, log: Path) -> object:
    result = run(*args, "--json", log=log)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_one_line_error(result: Result, *fragments: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


# -- reading --------------------------------------------------------------------


def test_sessions_json_counts_live_messages_tombstones_and_forks(logdir):
    rows = {row["session"]: row for row in run_json("sessions", log=logdir)}
    assert sorted(rows) == ["branch", "chat", "long"]
    assert rows["chat"]["live_messages"] == 5
    assert rows["chat"]["tombstoned"] == {"rewind": 2, "edit": 1}
    assert rows["chat"]["metadata"] == {"title": "Storage questions"}
    assert rows["chat"]["counters"] == {"input_tokens": 10}
    assert rows["branch"]["forked_from"] == "chat" and rows["branch"]["fork_at"] == 3
    assert rows["branch"]["closed"] is True and rows["branch"]["live_messages"] == 5
    assert rows["long"]["live_messages"] == 5 and rows["long"]["tombstoned"] == {"compaction": 10}


def test_sessions_table_names_each_session(logdir):
    result = run("sessions", log=logdir)
    assert result.exit_code == 0
    for fragment in ("branch", "chat", "long", "Storage questions", "fork of chat@3", "closed"):
        assert fragment in result.stdout


def test_show_prints_live_transcript_with_tool_calls_and_tombstone_markers(logdir):
    result = run("show", "chat", log=logdir)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "[0] system: be brief"
    assert "→ lookup(" in lines[2] and "[call_1]" in lines[2]
    assert lines[3].startswith("[3] tool (call_1): a memory-mapped")
    # Each marker stands where the tombstoned messages stood, naming event, count and reason.
    assert lines[4] == "  ✂ event 4: 1 message from position 4 tombstoned (edit)"
    assert lines[5].startswith("[4] assistant: LMDB is a memory-mapped B+tree key-value store.")
    assert lines[6] == "  ✂ event 3: 2 messages from position 5 tombstoned (rewind)"
    assert len(lines) == 7
    assert "An embedded SQL database" not in result.stdout  # tombstoned text is not shown as live


def test_show_json_is_the_live_transcript(logdir):
    with EventLog.open(logdir, readonly=True) as log:
        expected = log.messages("long")
    assert run_json("show", "long", log=logdir) == expected


def test_show_repair_and_as_of(logdir):
    with EventLog.open(logdir, readonly=True) as log:
        first_seq = next(iter(log.events())).seq
        appended = [r.seq for r in log.events() if r.event.session == "chat"][1]
    result = run("show", "chat", "--as-of", str(appended), log=logdir)
    assert "An embedded SQL database" in result.stdout  # before the rewind
    assert first_seq == 1
    branch = run_json("show", "branch", "--repair", log=logdir)
    assert [m["role"] for m in branch] == ["system", "user", "assistant", "tool", "assistant"]


def test_history_lists_every_occurrence_with_reason(logdir):
    rows = run_json("history", "chat", log=logdir)
    reasons = [row["tombstone_reason"] for row in rows]
    assert reasons.count("rewind") == 2 and reasons.count("edit") == 1
    assert sum(row["live"] for row in rows) == 5
    text = run("history", "chat", log=logdir).stdout
    assert "✗ rewind@" in text and "✗ edit@" in text
    assert text.strip().splitlines()[-1] == "8 occurrences, 5 live, 3 tombstoned"


def test_stats_counts_tombstones_by_reason(logdir):
    numbers = run_json("stats", log=logdir)
    assert numbers["sessions"] == 3
    assert numbers["tombstoned_messages"] == {"compaction": 10, "edit": 1, "rewind": 2}
    assert numbers["tombstone_events"] == {"compaction": 1, "edit": 1, "rewind": 1}
    assert numbers["live_messages"] == 15
    assert numbers["file_bytes"] > 0 and numbers["map_size"] >= numbers["used_bytes"] > 0
    text = run("stats", log=logdir).stdout
    assert "compaction 10" in text and "map size" in text


# -- errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["sessions"],
        ["show", "x"],
        ["history", "x"],
        ["verify"],
        ["stats"],
        ["export", "x"],
        ["tail", "--once"],
        ["project"],
        ["search", "x"],
    ],
)
def test_read_only_commands_do_not_create_a_missing_log(tmp_path, args):
    missing = tmp_path / "nothing-here"
    result = run(*args, log=missing)
    assert_one_line_error(result, "no event log at", str(missing))
    assert not missing.exists()
    assert not Path(str(missing) + ".sqlite").exists()


def test_log_path_comes_from_env_then_default(logdir, tmp_path, monkeypatch):
    result = run("sessions", "--json", env={"EVENTLOG_PATH": str(logdir)})
    assert [row["session"] for row in json.loads(result.stdout)] == ["branch", "chat", "long"]
    monkeypatch.chdir(tmp_path)
    result = run("sessions", env={"EVENTLOG_PATH": ""})  # empty counts as unset: the default
    assert_one_line_error(result, "no event log at eventlog-data")
    other = tmp_path / "other"
    EventLog.open(other).close()
    result = run("sessions", "--json", log=other, env={"EVENTLOG_PATH": str(logdir)})
    assert json.loads(result.stdout) == []  # --log wins over the environment


@pytest.mark.parametrize("command", ["show", "history", "export"])
def test_unknown_session_is_one_line(logdir, command):
    assert_one_line_error(run(command, "nope", log=logdir), "no session 'nope'", "sessions: branch, chat, long")


def test_unreadable_log_files_are_one_line(tmp_path):
    path = tmp_path / "log"
    path.mkdir()
    (path / "data.mdb").write_bytes(b"this is not an LMDB file" * 200)
    for args in (["sessions"], ["verify"], ["stats"]):
        result = run(*args, log=path)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert str(path) in result.stderr and len(result.stderr.strip().splitlines()) == 1


# -- verify ---------------------------------------------------------------------


def tamper_event(path: Path, seq: int, old: bytes, new: bytes) -> None:
    env = lmdb.open(str(path), max_dbs=8)
    try:
        with env.begin(write=True) as txn:
            events = env.open_db(b"events", txn=txn)
            key = seq.to_bytes(8, "big")
            value = txn.get(key, db=events)
            assert old in value
            txn.put(key, value.replace(old, new), db=events)
    finally:
        env.close()


def test_verify_exits_zero_only_when_intact(logdir):
    result = run("verify", log=logdir)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("ok: ")
    assert result.stderr == ""  # no progress bar when stderr is not a terminal
    shown = run("verify", log=logdir, env={"TTY_COMPATIBLE": "1"})
    assert "verify" in shown.stderr and "13/13" in shown.stderr  # the bar counts the events
    report = run_json("verify", log=logdir)
    assert report["ok"] is True and report["problems"] == []
    tamper_event(logdir, 2, b"what is lmdb?", b"what is LMDB?")
    result = run("verify", log=logdir)
    assert result.exit_code == 1
    assert "NOT INTACT" in result.stderr
    assert "event 2: message 1 (position 1): body does not match its content digest" in result.stderr
    assert "event 3: previous-event hash does not match" in result.stderr
    result = run("verify", "--json", log=logdir)
    assert result.exit_code == 1
    assert json.loads(result.stdout)["problems"][0]["seq"] == 2


# -- import and export ----------------------------------------------------------


def test_import_message_lines_is_idempotent(tmp_path):
    log = tmp_path / "log"
    source = tmp_path / "chat.jsonl"
    lines = [json.dumps(user("hi")), "", json.dumps(assistant("hello"))]
    source.write_text("\n".join(lines) + "\n")
    result = run("import", str(source), log=log)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "chat: 2 messages read, 2 written"
    assert run("import", str(source), log=log).stdout.strip() == "chat: 2 messages read, 0 written"
    source.write_text("\n".join(lines + [json.dumps(user("more"))]) + "\n")
    assert run("import", str(source), log=log).stdout.strip() == "chat: 3 messages read, 1 written"
    with EventLog.open(log, readonly=True) as opened:
        assert opened.messages("chat") == [user("hi"), assistant("hello"), user("more")]


def test_import_openai_lines_and_split(tmp_path):
    log = tmp_path / "log"
    source = tmp_path / "ft.jsonl"
    source.write_text(
        json.dumps({"messages": [user("a"), assistant("b")]}) + "\n" + json.dumps({"messages": [user("c")]}) + "\n"
    )
    rows = json.loads(run("import", str(source), "--session", "one", "--json", log=log).stdout)
    assert rows == [{"session": "one", "messages": 3, "appended": 3, "tombstoned": 0, "head": rows[0]["head"]}]
    rows = json.loads(run("import", str(source), "--session", "ft", "--split", "--json", log=log).stdout)
    assert [(r["session"], r["appended"]) for r in rows] == [("ft-1", 2), ("ft-2", 1)]


def test_import_split_keeps_its_session_names_as_the_file_grows(tmp_path):
    log = tmp_path / "log"
    source = tmp_path / "chats.jsonl"
    first = json.dumps({"messages": [user("hi"), assistant("hello")]}) + "\n"
    source.write_text(first)
    assert run("import", str(source), "--split", log=log).stdout.strip() == "chats-1: 2 messages read, 2 written"
    source.write_text(first + json.dumps({"messages": [user("bye")]}) + "\n")
    assert run("import", str(source), "--split", log=log).stdout.splitlines() == [
        "chats-1: 2 messages read, 0 written",
        "chats-2: 1 message read, 1 written",
    ]
    with EventLog.open(log, readonly=True) as opened:
        assert sorted(opened.sessions()) == ["chats-1", "chats-2"]  # conversation 1 stored once


def test_an_import_a_session_refuses_writes_none_of_the_file(tmp_path):
    log = tmp_path / "log"
    with EventLog.open(log) as opened:
        opened.flush("chats-2", [user("something else")])
    source = tmp_path / "chats.jsonl"
    source.write_text(json.dumps({"messages": [user("a")]}) + "\n" + json.dumps({"messages": [user("b")]}) + "\n")
    result = run("import", str(source), "--split", log=log)
    assert_one_line_error(result, "session 'chats-2'", "chats.jsonl:2 differs", "nothing was imported")
    with EventLog.open(log, readonly=True) as opened:
        assert list(opened.sessions()) == ["chats-2"]  # chats-1, the first target, was not written either
        assert opened.messages("chats-2") == [user("something else")]


@pytest.mark.parametrize(
    "message",
    [
        {"type": "handoff", "messages": [assistant("inner")]},  # a role-less item with a messages key
        {"role": "user", "content": "lines\u2028and\u2029paragraphs\u0085next"},  # str.splitlines() splits these
    ],
    ids=["messages-key", "line-separators"],
)
def test_every_exported_message_reads_back_as_itself(tmp_path, message):
    log, copy, out = tmp_path / "log", tmp_path / "copy", tmp_path / "s.jsonl"
    with EventLog.open(log) as opened:
        opened.flush("s", [user("hi"), message])
    assert run("export", "s", "-o", str(out), log=log).exit_code == 0
    result = run("import", str(out), "--session", "s", log=copy)
    assert result.stdout.strip() == "s: 2 messages read, 2 written", result.output
    with EventLog.open(log, readonly=True) as a, EventLog.open(copy, readonly=True) as b:
        assert b.messages("s") == [user("hi"), message]
        assert a.head("s") == b.head("s")


def test_a_fine_tuning_line_with_tools_is_a_conversation(tmp_path):
    log, source = tmp_path / "log", tmp_path / "ft.jsonl"
    source.write_text(json.dumps({"messages": [user("a"), assistant("b")], "tools": [{"type": "function"}]}) + "\n")
    assert run("import", str(source), log=log).stdout.strip() == "ft: 2 messages read, 2 written"


def test_a_conversation_line_with_a_dataset_id_is_a_conversation(tmp_path):
    log, source = tmp_path / "log", tmp_path / "ds.jsonl"
    source.write_text(json.dumps({"id": "conv-1", "messages": [user("a"), assistant("b")]}) + "\n")
    assert run("import", str(source), log=log).stdout.strip() == "ds: 2 messages read, 2 written"


def test_a_line_nested_too_deeply_is_a_one_line_error(tmp_path):
    source = tmp_path / "deep.jsonl"
    source.write_text(json.dumps(user("fine")) + "\n" + '{"a":' * 5000 + "1" + "}" * 5000 + "\n")
    assert_one_line_error(
        run("import", str(source), "--session", "s", log=tmp_path / "log"), f"{source}:2:", "nested too deeply"
    )


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ('{"role": "user", "content": ', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"messages": {"role": "user"}}', '"messages" must be a list'),
        ('{"messages": [{"role": "user"}, 3]}', "messages[1] must be a JSON object"),
        ('{"role": "user", "content": NaN}', "not a JSON-like number"),
        ('{"role": "user", "n": 123456789012345678901234567890}', 'message["n"]: int does not fit in 64 bits'),
    ],
)
def test_bad_import_line_names_the_line_and_imports_nothing(tmp_path, line, fragment):
    log = tmp_path / "log"
    source = tmp_path / "bad.jsonl"
    source.write_text(json.dumps(user("fine")) + "\n" + json.dumps(assistant("fine too")) + "\n" + line + "\n")
    result = run("import", str(source), "--session", "s", log=log)
    assert_one_line_error(result, f"{source}:3:", fragment)
    assert not (log / "data.mdb").exists()  # the file was refused before the log was opened


def test_import_refuses_to_overwrite_a_different_transcript_unless_replace(tmp_path):
    log = tmp_path / "log"
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text(json.dumps(user("one")) + "\n")
    second.write_text(json.dumps(user("two")) + "\n")
    run("import", str(first), "--session", "s", log=log)
    result = run("import", str(second), "--session", "s", log=log)
    assert_one_line_error(result, "second.jsonl:1 differs", "--replace")
    result = run("import", str(second), "--session", "s", "--replace", log=log)
    assert result.stdout.strip() == "s: 1 message read, 1 written, 1 tombstoned"


def test_import_from_stdin_needs_a_session(tmp_path):
    log = tmp_path / "log"
    assert_one_line_error(run("import", "-", log=log, input="{}\n"), "--session")
    result = run("import", "-", "--session", "piped", log=log, input=json.dumps(user("x")) + "\n")
    assert result.stdout.strip() == "piped: 1 message read, 1 written"


def test_export_jsonl_round_trips_to_the_same_head(logdir, tmp_path):
    out = tmp_path / "chat.jsonl"
    assert run("export", "chat", "-o", str(out), log=logdir).exit_code == 0
    copy = tmp_path / "copy"
    run("import", str(out), "--session", "chat", log=copy)
    with EventLog.open(logdir, readonly=True) as a, EventLog.open(copy, readonly=True) as b:
        assert a.head("chat") == b.head("chat") is not None


def test_export_openai_and_sharegpt(logdir):
    openai = json.loads(run("export", "branch", "--format", "openai", log=logdir).stdout)
    assert [m["role"] for m in openai["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    sharegpt = json.loads(run("export", "chat", "--format", "sharegpt", log=logdir).stdout)
    turns = sharegpt["conversations"]
    assert [t["from"] for t in turns] == ["system", "human", "function_call", "observation", "gpt"]
    assert json.loads(turns[2]["value"]) == {"name": "lookup", "arguments": {"q": "lmdb"}}
    assert turns[3]["value"] == "a memory-mapped key-value store"


@pytest.mark.parametrize(
    "calls",
    [[{"id": "c", "function": None}], ["not a call"], {"id": "c", "function": {"name": "f"}}, "text"],
    ids=["function-null", "call-is-text", "calls-is-an-object", "calls-is-text"],
)
def test_odd_tool_calls_are_shown_and_exported_not_a_crash(tmp_path, calls):
    log = tmp_path / "log"
    with EventLog.open(log) as opened:
        opened.flush("s", [user("go"), {"role": "assistant", "content": "ok", "tool_calls": calls}])
    for args in (("show", "s"), ("show", "s", "--repair"), ("export", "s", "--format", "sharegpt")):
        result = run(*args, log=log)
        assert result.exit_code == 0, (args, result.output)
    turns = json.loads(run("export", "s", "--format", "sharegpt", log=log).stdout)["conversations"]
    assert turns[0] == {"from": "human", "value": "go"} and turns[1]["value"] in (
        "ok",
        json.dumps({"name": "", "arguments": ""}, separators=(",", ":")),
    )


def test_export_writes_through_a_symlink_and_into_a_pipe_and_keeps_permissions(logdir, tmp_path):
    import stat
    import threading

    real, link = tmp_path / "real.jsonl", tmp_path / "link.jsonl"
    real.write_text("old\n")
    real.chmod(0o640)
    link.symlink_to(real)
    assert run("export", "chat", "-o", str(link), log=logdir).exit_code == 0
    assert link.is_symlink() and real.read_text().count("\n") == 5  # the file it names was replaced
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    assert run("export", "chat", "-o", str(fifo), log=logdir).exit_code == 0
    reader.join(10)
    assert got and got[0].count("\n") == 5 and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_failed_export_leaves_the_previous_file_as_it_was(logdir, tmp_path, monkeypatch):
    import errno

    import eventlog.cli

    out = tmp_path / "chat.jsonl"
    out.write_text("previous export\n")

    def full_disk(messages, fmt):
        yield "{}"
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(eventlog.cli, "export_lines", full_disk)
    result = run("export", "chat", "-o", str(out), log=logdir)
    assert_one_line_error(result, str(out), "No space left on device")
    assert out.read_text() == "previous export\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl", "log"]  # no temporary file left


# -- tail -----------------------------------------------------------------------


def test_tail_once_prints_recent_events_of_a_session(logdir):
    result = run("tail", "chat", "-n", "3", "--once", log=logdir)
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all(" chat " in line for line in lines)
    assert "updated input_tokens, title" in lines[-1]
    events = [json.loads(line) for line in run("tail", "-n", "2", "--once", "--json", log=logdir).stdout.splitlines()]
    assert [e["kind"] for e in events] == ["tombstoned", "appended"]
    assert events[0]["reason"] == "compaction"


def test_tail_follows_events_written_by_another_process(logdir):
    writer = (
        "import sys, time\n"
        "from eventlog import EventLog\n"
        "time.sleep(0.5)\n"
        "with EventLog.open(sys.argv[1]) as log:\n"
        "    log.flush('fresh', [{'role': 'user', 'content': 'from another process'}])\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", writer, str(logdir)])
    try:
        result = run("tail", "-n", "0", "--timeout", "4", "--interval", "0.05", log=logdir)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == 0
    lines = result.stdout.splitlines()
    assert [line.split()[2:] for line in lines] == [
        ["fresh", "opened"],
        ["fresh", "appended", "1", "at", "0:", "user:", "from", "another", "process"],
    ]


# -- projection -----------------------------------------------------------------


def test_project_then_search_then_rebuild(logdir, tmp_path):
    db = tmp_path / "t.sqlite"
    result = run("project", str(db), log=logdir)
    assert result.exit_code == 0, result.output
    with EventLog.open(logdir, readonly=True) as log:
        total = log.last_seq
    assert result.stdout.startswith(f"projected {total} events into {db}")
    assert "events/s" in result.stdout
    again = json.loads(run("project", str(db), "--json", log=logdir).stdout)
    assert again["applied"] == 0 and again["last_seq"] == total
    hits = json.loads(run("search", "memory-mapped", "--db", str(db), "--json", log=logdir).stdout)
    assert {(h["session_id"], h["position"]) for h in hits} == {("chat", 3), ("chat", 4)}
    hits = json.loads(
        run("search", "memory-mapped", "--db", str(db), "--session", "branch", "--json", log=logdir).stdout
    )
    assert hits == []  # the branch shares positions 0..2 only
    rebuilt = json.loads(run("rebuild", str(db), "--json", log=logdir).stdout)
    assert rebuilt["applied"] == total


def test_rebuild_takes_the_db_for_itself_only_when_told(logdir, tmp_path, monkeypatch):
    from projections import SQLiteProjection

    db = tmp_path / "t.sqlite"
    assert run("project", str(db), log=logdir).exit_code == 0
    asked = []
    rebuild = SQLiteProjection.rebuild

    def spy(self, log, *, exclusive=None):
        asked.append(exclusive)
        return rebuild(self, log, exclusive=exclusive)

    monkeypatch.setattr(SQLiteProjection, "rebuild", spy)
    assert run("rebuild", str(db), log=logdir).exit_code == 0
    assert run("rebuild", str(db), "--exclusive", log=logdir).exit_code == 0
    assert asked == [None, True]  # None: the projection decides (only a new one is taken)
    hits = json.loads(run("search", "memory-mapped", "--db", str(db), "--json", log=logdir).stdout)
    assert {(h["session_id"], h["position"]) for h in hits} == {("chat", 3), ("chat", 4)}
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_search_uses_the_default_db_next_to_the_log(logdir):
    result = run("search", "sqlite", log=logdir)
    assert result.exit_code == 0, result.output
    assert "no live message matches" in result.stdout  # that answer was rewound
    assert Path(str(logdir) + ".sqlite").exists()
    assert "chat [3] tool" in run("search", 'key-value "store', log=logdir).stdout  # plain words, any punctuation
    assert "chat [4] assistant" in run("search", "B+tree OR nothing", "--fts", log=logdir).stdout
    result = run("search", '"unbalanced', "--fts", log=logdir)
    assert_one_line_error(result, "unterminated string")


def test_projection_of_another_log_is_refused(logdir, tmp_path):
    other = tmp_path / "other"
    with EventLog.open(other) as log:
        log.flush("x", [user("other log")])
    db = tmp_path / "t.sqlite"
    assert run("project", str(db), log=other).exit_code == 0
    for args in (["project", str(db)], ["search", "lmdb", "--db", str(db)]):
        assert_one_line_error(run(*args, log=logdir), "belongs to log", "eventlog rebuild")
    assert run("rebuild", str(db), log=logdir).exit_code == 0
    assert run("project", str(db), log=logdir).exit_code == 0


# -- as a real process --------------------------------------------------------------


def test_every_command_runs_as_a_subprocess(logdir, tmp_path):
    env = {**os.environ, "EVENTLOG_PATH": str(logdir)}

    def cmd(*args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "eventlog.cli", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=60,
        )
        assert done.returncode == code, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        return done

    assert "chat" in cmd("sessions").stdout
    assert "[0] system: be brief" in cmd("show", "chat").stdout
    assert "occurrences" in cmd("history", "chat").stdout
    assert cmd("verify").stdout.startswith("ok:")
    assert cmd("stats", "--json").stdout.startswith("{")
    assert "projected" in cmd("project", str(tmp_path / "p.sqlite")).stdout
    assert "rebuilt" in cmd("rebuild", str(tmp_path / "p.sqlite")).stdout
    assert "chat [3]" in cmd("search", "memory", "--db", str(tmp_path / "p.sqlite")).stdout
    exported = cmd("export", "chat", "--format", "openai").stdout
    (tmp_path / "in.jsonl").write_text(exported)
    assert "copy: 5 messages read, 5 written" in cmd("import", str(tmp_path / "in.jsonl"), "--session", "copy").stdout
    assert " copy " in cmd("tail", "--once", "-n", "1").stdout
    started = time.monotonic()
    cmd("tail", "--timeout", "0.3")
    assert time.monotonic() - started < 30
    missing = cmd("--log", str(tmp_path / "none"), "show", "chat", code=1)
    assert missing.stderr.startswith("Error: no event log at")
    assert cmd("--help").stdout.startswith("Usage: eventlog")


def test_installed_console_script_runs(tmp_path):
    script = Path(sys.executable).with_name("eventlog")
    if not script.exists():
        pytest.skip("the eventlog console script is not installed next to this interpreter")
    done = subprocess.run(
        [str(script), "--log", str(tmp_path / "none"), "sessions"], capture_output=True, text=True, timeout=60
    )
    assert (
        done.returncode == 1
        and done.stderr.strip() == f"Error: no event log at {tmp_path / 'none'} (give --log PATH or set EVENTLOG_PATH)"
    )


def test_recover_folds_spill_files_back(tmp_path):
    from click.testing import CliRunner

    from eventlog import EventLog, SpillingWriter
    from eventlog.cli import cli
    from eventlog.spill import write_spill

    log_path = tmp_path / "log"
    spill = tmp_path / "spill"
    with EventLog.open(log_path) as log:
        SpillingWriter(log, spill)  # the directory a writer would spill into
        log.flush("s", [{"role": "user", "content": "stored"}])
    write_spill(
        spill,
        "s",
        [
            {"session": "s", "index": 0, "message": {"role": "user", "content": "stored"}},
            {"session": "s", "index": 1, "message": {"role": "assistant", "content": "spilled"}},
        ],
    )
    runner = CliRunner()
    first = runner.invoke(cli, ["--log", str(log_path), "recover", str(spill)])
    assert first.exit_code == 0, first.output
    assert "1 session(s) recovered (1 messages written)" in first.output
    again = runner.invoke(cli, ["--log", str(log_path), "recover", str(spill)])
    assert again.exit_code == 0 and "0 session(s) recovered" in again.output
    with EventLog.open(log_path) as log:
        assert [m["content"] for m in log.messages("s")] == ["stored", "spilled"]
    missing = runner.invoke(cli, ["--log", str(log_path), "recover", str(tmp_path / "nope")])
    assert missing.exit_code == 1 and "no spill directory" in missing.output
