"""The command line's sharp edges: hostile text, imports that would rewind, read-only logs,
and the small things a new user hits first."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from factories import assistant, user

from eventlog import EventLog
from eventlog.cli import cli

CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
"""Characters a terminal acts on (C0 but newline, DEL, C1, bidi overrides)."""

ERASE = "\x1b[1A\x1b[2K"
TITLE = "\x1b]0;pwned\x07"
EVIL_SESSION = "evil\x1b[2Ksession"
CALL = {"id": "call_x", "type": "function", "function": {"name": "delete_all_files", "arguments": "{}"}}


def run(*args: str, log: Path | None = None, input: str | None = None) -> Result:
    argv = (["--log", str(log)] if log is not None else []) + list(args)
    return CliRunner().invoke(cli, argv, input=input, catch_exceptions=False)


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        messages = [
            user(f"list files{TITLE}"),
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_x", "content": f"done{ERASE}all good\x9b2J\u202eevil"},
            assistant("line one\nline two\r\x08x"),
        ]
        log.flush(EVIL_SESSION, messages)
        log.update_session(EVIL_SESSION, title=f"t{ERASE}")
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["show", EVIL_SESSION],
        ["show", EVIL_SESSION, "--full"],
        ["show", EVIL_SESSION, "--repair"],
        ["history", EVIL_SESSION],
        ["sessions"],
        ["tail", "--once"],
        ["search", "files"],
        ["search", "good"],
    ],
)
def test_control_characters_are_shown_not_obeyed(hostile: Path, command: list[str]):
    result = run(*command, log=hostile)
    assert result.exit_code == 0, result.output
    assert not CONTROL.search(result.stdout), repr(result.stdout)
    assert "\\x1b" in result.stdout or "\\u202e" in result.stdout, result.stdout


def test_show_keeps_the_tool_call_visible_and_marks_newlines(hostile: Path):
    out = run("show", EVIL_SESSION, "--full", log=hostile).stdout
    assert "delete_all_files" in out
    assert "\\x1b[1A\\x1b[2K" in out and "\\x9b" in out and "\\r\\x08" in out
    lines = out.splitlines()
    second = next(i for i, line in enumerate(lines) if "line one" in line)
    assert lines[second + 1].startswith(" ") and "line two" in lines[second + 1]  # a continuation
    one_line = run("show", EVIL_SESSION, log=hostile).stdout
    assert len(one_line.splitlines()) == 4


def test_json_output_stays_exact(hostile: Path):
    shown = json.loads(run("show", EVIL_SESSION, "--json", log=hostile).stdout)
    assert shown[2]["content"] == f"done{ERASE}all good\x9b2J\u202eevil"
    sessions = json.loads(run("sessions", "--json", log=hostile).stdout)
    assert sessions[0]["session"] == EVIL_SESSION


def test_import_summary_shows_the_session_visibly(tmp_path: Path):
    source = tmp_path / "in.jsonl"
    source.write_text(json.dumps(user("hi")) + "\n", encoding="utf-8")
    result = run("import", str(source), "--session", EVIL_SESSION, log=tmp_path / "log")
    assert result.exit_code == 0, result.output
    assert not CONTROL.search(result.stdout) and "evil\\x1b[2Ksession" in result.stdout


# -- import never silently rewinds ------------------------------------------------


def _jsonl(path: Path, messages: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(m) + "\n" for m in messages), encoding="utf-8")
    return path


def _one_line_error(result: Result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_import_refuses_a_file_that_only_shares_a_prefix(tmp_path: Path):
    log = tmp_path / "log"
    system = {"role": "system", "content": "be brief"}
    first = _jsonl(tmp_path / "a.jsonl", [system, user("q1"), assistant("a1")])
    assert run("import", str(first), "--session", "s", log=log).exit_code == 0
    other = _jsonl(tmp_path / "b.jsonl", [system, user("something else"), assistant("a2")])
    _one_line_error(run("import", str(other), "--session", "s", log=log), "'s'", f"{other}:2", "--replace")
    with EventLog.open(log, readonly=True) as opened:
        assert [m["content"] for m in opened.messages("s")] == ["be brief", "q1", "a1"]
        seq = opened.last_seq
    older = _jsonl(tmp_path / "old.jsonl", [system, user("q1")])  # an older, shorter copy
    _one_line_error(run("import", str(older), "--session", "s", log=log), "'s'", "older", "--replace")
    longer = _jsonl(tmp_path / "new.jsonl", [system, user("q1"), assistant("a1"), user("q2")])
    assert run("import", str(longer), "--session", "s", log=log).exit_code == 0  # extends: fine
    with EventLog.open(log, readonly=True) as opened:
        assert len(opened.messages("s")) == 4 and opened.last_seq == seq + 1
    replaced = run("import", str(other), "--session", "s", "--replace", log=log)
    assert replaced.exit_code == 0, replaced.output
    with EventLog.open(log, readonly=True) as opened:
        assert [m["content"] for m in opened.messages("s")] == ["be brief", "something else", "a2"]


def test_same_file_name_in_two_folders_does_not_collide_silently(tmp_path: Path):
    log = tmp_path / "log"
    one = _jsonl(tmp_path / "alice" / "chat.jsonl", [user("alice's question")])
    two = _jsonl(tmp_path / "bob" / "chat.jsonl", [user("alice's question"), assistant("an answer for bob")])
    assert run("import", str(one), log=log).exit_code == 0
    assert run("import", str(one), log=log).exit_code == 0  # the same file again: fine, writes nothing
    _one_line_error(run("import", str(two), log=log), "'chat'", str(one), "--session")
    with EventLog.open(log, readonly=True) as opened:
        assert opened.messages("chat") == [user("alice's question")]


def test_import_accepts_a_utf8_bom(tmp_path: Path):
    source = tmp_path / "bom.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + json.dumps(user("hi")).encode() + b"\n")
    result = run("import", str(source), "--session", "s", log=tmp_path / "log")
    assert result.exit_code == 0, result.output
    with EventLog.open(tmp_path / "log", readonly=True) as opened:
        assert opened.messages("s") == [user("hi")]


# -- read-only directories ------------------------------------------------------


@pytest.fixture
def immutable_log(tmp_path: Path) -> Iterator[Path]:
    """A log whose directory and files cannot be written, even by root (chattr +i)."""
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [user("hello"), assistant("hi")])
    files = [path, *path.iterdir()]
    done = subprocess.run(["chattr", "+i", *map(str, files)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make files immutable here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["chattr", "-i", *map(str, files)], check=True)


def test_a_log_that_cannot_be_written_opens_readonly(immutable_log: Path):
    with EventLog.open(immutable_log, readonly=True) as log:
        assert log.messages("s") == [user("hello"), assistant("hi")]
        assert log.session("s").length == 2 and log.verify().ok


@pytest.mark.parametrize(
    "command",
    [
        ["show", "s"],
        ["history", "s"],
        ["sessions"],
        ["stats"],
        ["export", "s"],
        ["tail", "--once"],
        ["verify"],
        ["head"],
    ],
)
def test_every_read_only_command_reads_a_log_it_cannot_write(immutable_log: Path, command: list[str]):
    result = run(*command, log=immutable_log)
    assert result.exit_code == 0, result.output
    assert "cannot write" not in result.output


def test_search_reads_a_log_it_cannot_write(immutable_log: Path, tmp_path: Path):
    result = run("search", "hello", "--db", str(tmp_path / "elsewhere.sqlite"), log=immutable_log)
    assert result.exit_code == 0, result.output
    assert "hello" in result.stdout


# -- small things -----------------------------------------------------------------


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [user("the quick brown fox"), assistant("jumps over\nthe lazy dog")])
    return path


def test_search_takes_unquoted_words(small: Path, tmp_path: Path):
    db = str(tmp_path / "p.sqlite")
    result = run("search", "fox", "lazy", "--db", db, log=small)
    assert result.exit_code == 0, result.output
    assert "no live message matches" in result.stdout  # no single message holds both words
    result = run("search", "quick", "fox", "--db", db, log=small)
    assert result.exit_code == 0 and "1 result" in result.stdout and "results" not in result.stdout, result.stdout


def test_bare_eventlog_prints_help_and_succeeds():
    result = run()
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout and "Commands:" in result.stdout


def test_plurals(small: Path, tmp_path: Path):
    source = _jsonl(tmp_path / "one.jsonl", [user("single")])
    out = run("import", str(source), "--session", "one", log=small).stdout
    assert "1 message read, 1 written" in out, out
    hist = run("history", "one", log=small).stdout
    assert "1 occurrence, 1 live, 0 tombstoned" in hist, hist


def test_history_prints_a_header(small: Path):
    lines = run("history", "s", log=small).stdout.splitlines()
    assert lines[0].split() == ["seq", "pos", "origin", "status", "node", "message"], lines[0]


def test_tail_shows_role_and_first_line(small: Path):
    out = run("tail", "--once", log=small).stdout
    line = next(line for line in out.splitlines() if "appended" in line)
    assert "assistant: jumps over" in line and "lazy" not in line, line


def test_show_fits_the_terminal_width(tmp_path: Path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("wide", [user("word " * 200)])
    out = CliRunner().invoke(cli, ["--log", str(path), "show", "wide"], env={"COLUMNS": "60"}).stdout
    assert out.strip() and all(len(line) <= 60 for line in out.splitlines()), out
    full = CliRunner().invoke(cli, ["--log", str(path), "show", "wide", "--full"], env={"COLUMNS": "60"}).stdout
    assert full.count("word") == 200  # --full still shows all of it


def test_demo_numbers_agree_with_themselves(tmp_path: Path):
    result = CliRunner().invoke(cli, ["demo", "--path", str(tmp_path / "demo"), "--turns", "12"])
    assert result.exit_code == 0, result.output
    out = result.output
    said = re.search(r"1\. (\d+) agent turns with tool calls \(12 played first, and (\d+) more after", out)
    assert "playing 12 turns" in out and said, out
    assert int(said.group(1)) == 12 + int(said.group(2)), out
    suggested = re.search(r"eventlog --log (\S+) search (.+)$", out, re.M)
    counted = re.search(r"full-text search for '(\w+)' found (\d+) messages?", out)
    assert suggested and counted, out
    words = suggested.group(2).replace("'", "").split()
    assert words == [counted.group(1)]
    searched = run("search", *words, "--limit", "1000", log=Path(suggested.group(1)))
    assert searched.exit_code == 0, searched.output
    summary = searched.stdout.strip().splitlines()[-1]
    assert summary.split()[0] == counted.group(2), (out, searched.stdout)


def _interrupt(*args: object, **kwargs: object) -> None:
    raise KeyboardInterrupt


def test_aborted_says_whether_anything_was_written(small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    source = _jsonl(tmp_path / "new.jsonl", [user("x")])
    with monkeypatch.context() as patched:
        patched.setattr(EventLog, "flush_many", _interrupt)
        result = run("import", str(source), log=small)
    assert result.exit_code == 130 and "Aborted: nothing was imported." in result.stderr, result.output
    with monkeypatch.context() as patched:  # interrupted after the commit, while recording the file's path
        patched.setattr(EventLog, "update_session", _interrupt)
        result = run("import", str(source), log=small)
    assert result.exit_code == 130 and "Aborted: the import was written whole." in result.stderr, result.output
    with monkeypatch.context() as patched:
        patched.setattr(EventLog, "history", _interrupt)
        result = run("show", "s", log=small)
    assert result.exit_code == 130 and "nothing was written (this command only reads)" in result.stderr


def test_long_work_shows_progress_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import io

    from rich.console import Console

    from eventlog import cli as cli_module

    screen = io.StringIO()
    monkeypatch.setattr(cli_module, "_stderr", lambda: Console(file=screen, force_terminal=True, width=100))
    source = _jsonl(tmp_path / "big.jsonl", [user(f"m{i}") for i in range(2000)])
    result = run("import", str(source), log=tmp_path / "log")
    assert result.exit_code == 0, result.output
    shown = screen.getvalue()
    assert "reading" in shown and "writing 2000 messages to 1 session" in shown, shown


def test_a_service_log_owned_by_another_user_reads_readonly(tmp_path: Path):
    import os

    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [user("hello")])
    for entry in [path, *path.iterdir()]:
        os.chown(entry, 54321, 54321)
    lock = (path / "lock.mdb").read_bytes()
    with EventLog.open(path, readonly=True) as log:
        assert log.messages("s") == [user("hello")]
    assert (path / "lock.mdb").read_bytes() == lock  # opened for reading only
    result = run("show", "s", log=path)
    assert result.exit_code == 0 and "hello" in result.stdout, result.output


def test_import_split_into_ten_thousand_sessions(tmp_path: Path):
    source = tmp_path / "many.jsonl"
    source.write_text("".join(json.dumps({"messages": [user(f"q{i}")]}) + "\n" for i in range(10_000)))
    log = tmp_path / "log"
    result = run("import", str(source), "--split", "--durability", "none", "--json", log=log)
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)) == 10_000
    with EventLog.open(log, readonly=True) as opened:
        assert len(opened.sessions()) == 10_000 and opened.messages("many-10000") == [user("q9999")]
        assert opened.session("many-1").metadata == {"imported_from": str(source.resolve())}
    again = run("import", str(source), "--split", "--durability", "none", log=log)
    assert again.exit_code == 0 and "many-10000: 1 message read, 0 written" in again.stdout
