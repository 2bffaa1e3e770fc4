"""A head written down (``eventlog head``) and checked later (``eventlog verify --expect``)."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner
from factories import assistant, user

from eventlog import EventLog, LogHead
from eventlog.cli import cli


def run(log: Path, *args: str):
    return CliRunner().invoke(cli, ["--log", str(log), *args], catch_exceptions=False)


def test_head_names_the_newest_event_and_verify_expect_accepts_it(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        assert log.log_head() is None
        log.flush("chat", [user("hi"), assistant("hello")])
        head = log.log_head()
        assert head is not None and head.seq == log.last_seq == 2
        assert head.hash == next(r for r in log.events(1)).hash.hex()
    printed = run(path, "head")
    assert printed.exit_code == 0 and printed.stdout.strip() == str(head)
    assert LogHead.parse(printed.stdout) == head
    assert run(path, "verify", "--expect", str(head)).exit_code == 0


def test_verify_expect_catches_an_older_copy_restored(tmp_path):
    path, old = tmp_path / "log", tmp_path / "old"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi")])
    shutil.copytree(path, old)
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi"), assistant("hello")])
        head = log.log_head()
    assert head is not None
    assert run(path, "verify", "--expect", str(head)).exit_code == 0
    # The older copy is intact in itself: only the written-down head tells.
    assert run(old, "verify").exit_code == 0
    result = run(old, "verify", "--expect", str(head))
    assert result.exit_code == 1
    assert f"the log has no event {head.seq}, which was written down as its head" in result.stderr


def test_verify_expect_catches_another_history_at_that_seq(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    for path, text in ((first, "the truth"), (second, "a rewrite")):
        with EventLog.open(path) as log:
            log.flush("chat", [user(text)])
    head = EventLog.open(first, readonly=True)
    try:
        written = head.log_head()
    finally:
        head.close()
    assert written is not None
    result = run(second, "verify", "--expect", str(written), "--json")
    assert result.exit_code == 1
    assert "history was rewritten" in result.stdout


def test_a_malformed_expectation_is_a_usage_error(tmp_path):
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("chat", [user("hi")])
    result = CliRunner().invoke(cli, ["--log", str(path), "verify", "--expect", "2:abc"])
    assert result.exit_code == 2
    assert "is not SEQ:HASH" in result.output


def test_head_of_an_empty_log_says_so(tmp_path):
    path = tmp_path / "log"
    EventLog.open(path).close()
    result = CliRunner().invoke(cli, ["--log", str(path), "head"])
    assert result.exit_code == 1 and "no events yet" in result.output
