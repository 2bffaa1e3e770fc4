"""Projections caught up in a process of their own (``projection_process=True``, eventlog/offload.py)."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from factories import assistant, user

from eventlog import EventLog
from eventlog.projector import OFFLOADED_WRITES
from eventlog.source import EventSource

projections = pytest.importorskip("projections")
SQLiteProjection = projections.SQLiteProjection


def runner_pid(log: EventLog, index: int = 0) -> int | None:
    projector = log._projector
    assert projector is not None
    return projector._runners[index].pid  # type: ignore[attr-defined]


def not_here(log: EventSource) -> int:
    raise AssertionError("caught up in the writing process")


def raw_rows(path: Path) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT position, content FROM live_messages ORDER BY position").fetchall()
    finally:
        db.close()


class Counted:
    """A projection that records, in a file, each catch-up and the process that ran it."""

    def __init__(self, path: str, fail: bool = False, chatty: bool = False, die: str = "") -> None:
        self.path, self.fail, self.chatty, self.die = path, fail, chatty, die

    def catch_up(self, log: EventSource) -> int:
        after = Path(self.die + ".after") if self.die else None
        if after is not None and after.exists() and log.last_seq > int(after.read_text()):
            after.unlink()
            os._exit(3)  # the process dies in the middle of a round, once
        if self.chatty:
            print("a projection that prints: its output must not reach the answers")
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()} {log.last_seq}\n")
        if self.fail and log.last_seq > 2:  # after a session's first flush (its opening and its append)
            raise RuntimeError("the projection failed in its process")
        return 0

    def close(self) -> None:
        pass

    def opener(self) -> partial[Counted]:
        return partial(Counted, self.path, self.fail, self.chatty, self.die)


@contextmanager
def started(tmp_path: Path) -> Iterator[tuple[EventLog, Any, int]]:
    """A log whose projection's process is running: the log, the projection, the process id."""
    proj = SQLiteProjection(tmp_path / "p.db")
    try:
        with EventLog.open(tmp_path / "log", projections=[proj], projection_process=True) as log:
            log.flush("s", [user("q0")])
            assert log.sync_projections(timeout=30)
            pid = runner_pid(log)
            assert pid is not None
            yield log, proj, pid
    finally:
        proj.close()


def seen(path: Path) -> list[tuple[int, int]]:
    return [(int(pid), int(seq)) for pid, seq in (line.split() for line in path.read_text().splitlines())]


def test_rows_are_written_by_another_process_and_read_here(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", projections=[proj], projection_process=True) as log:
        first_map = log.info()["map_size"]
        proj.catch_up = not_here  # type: ignore[method-assign]  # every round after open runs elsewhere
        messages: list[dict[str, Any]] = []
        for n in range(40):
            # Large enough that the map grows under the child's read-only handle.
            messages += [user(f"question {n} " + "x" * 600_000), assistant(f"answer {n} zebra")]
            log.flush("s", messages)
            assert len(proj.messages("s")) == len(messages)  # a read waits for its own writes
        pid = runner_pid(log)
        assert pid is not None and pid != os.getpid()
        assert len(proj.search("zebra", limit=100)) == 40
        log.rewind("s", to=4)
        assert [r["position"] for r in proj.messages("s")] == [0, 1, 2, 3]
        assert log.info()["map_size"] > first_map
    assert len(raw_rows(tmp_path / "p.db")) == 4
    proj.close()


def test_a_projections_relative_path_names_the_same_file_after_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    proj = SQLiteProjection("p.db")
    with EventLog.open(tmp_path / "log", projections=[proj], projection_process=True) as log:
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")  # before the first round starts the child
        log.flush("s", [user("q")])
        assert log.sync_projections(timeout=30)
        assert runner_pid(log) is not None
    assert raw_rows(tmp_path / "p.db") == [(0, "q")]
    assert not (tmp_path / "elsewhere" / "p.db").exists()
    proj.close()


def test_closing_the_log_applies_what_waits_and_stops_the_child(tmp_path: Path) -> None:
    with started(tmp_path) as (log, _, pid):
        for n in range(2, 30):
            log.flush("s", [user(f"q{i}") for i in range(n)])
    assert len(raw_rows(tmp_path / "p.db")) == 29
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # exited, and reaped


def test_a_child_killed_between_rounds_is_replaced(tmp_path: Path) -> None:
    with started(tmp_path) as (log, proj, first):
        os.kill(first, signal.SIGKILL)
        while runner_pid(log) is not None:
            time.sleep(0.01)
        log.flush("s", [user("q0"), assistant("a0")])
        assert log.sync_projections(timeout=30)  # found dead before the round: no round fails
        second = runner_pid(log)
        assert second is not None and second != first
        assert [r["content"] for r in proj.messages("s")] == ["q0", "a0"]


def test_a_child_dying_in_a_round_fails_it_and_the_retry_starts_another(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = tmp_path / "seen"
    dying = Counted(str(record), die=str(tmp_path / "die"))
    with caplog.at_level(logging.WARNING, logger="eventlog"):
        with EventLog.open(tmp_path / "log", projections=[dying], projection_process=True) as log:
            log.flush("s", [user("q")])
            assert log.sync_projections(timeout=30)
            first = runner_pid(log)
            (tmp_path / "die.after").write_text(str(log.last_seq))
            log.flush("s", [user("q"), assistant("a")])
            assert not log.sync_projections(timeout=30)  # the round its process died in
            assert "its process exited (code 3) during a catch-up" in caplog.text
            assert log.sync_projections(timeout=30)  # asks for another round: a new process
            assert runner_pid(log) not in (None, first)
            last = log.last_seq
    assert seen(record)[-1][1] == last


def test_an_error_in_the_child_is_logged_here_and_the_write_stands(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    record = tmp_path / "seen"
    failing = Counted(str(record), fail=True)
    with caplog.at_level(logging.WARNING, logger="eventlog"):
        with EventLog.open(tmp_path / "log", projections=[failing], projection_process=True) as log:
            log.flush("s", [user("q")])
            assert log.sync_projections(timeout=30) and log.last_seq == 2
            assert log.flush("s", [user("q"), assistant("a")]).appended == 1
            assert not log.sync_projections(timeout=30)
            assert "the projection failed in its process" in caplog.text
            assert log.messages("s") == [user("q"), assistant("a")]
    pids = {pid for pid, _ in seen(record)}
    assert len(pids) == 2 and os.getpid() in pids  # the catch-up at open here, the rounds there


def test_what_a_projection_prints_in_its_process_does_not_break_the_exchange(tmp_path: Path) -> None:
    record = tmp_path / "seen"
    with EventLog.open(
        tmp_path / "log", projections=[Counted(str(record), chatty=True)], projection_process=True
    ) as log:
        for n in range(1, 6):
            log.flush("s", [user(f"q{i}") for i in range(n)])
            assert log.sync_projections(timeout=30)
        child, last = runner_pid(log), log.last_seq
    assert seen(record)[-1] == (child, last)


def test_a_projection_that_cannot_be_opened_elsewhere_stays_on_the_thread(tmp_path: Path) -> None:
    class Here:
        def __init__(self) -> None:
            self.pids: list[int] = []

        def catch_up(self, log: EventSource) -> int:
            self.pids.append(os.getpid())
            return 0

    here = Here()
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", projections=[here, proj], projection_process=True) as log:
        log.flush("s", [user("q")])
        assert log.sync_projections(timeout=30)
        assert runner_pid(log, 1) not in (None, os.getpid())
    assert len(here.pids) >= 2 and set(here.pids) == {os.getpid()}
    proj.close()


def test_where_no_process_can_start_the_rounds_run_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-python"))
    proj = SQLiteProjection(tmp_path / "p.db")
    with caplog.at_level(logging.WARNING, logger="eventlog"):
        with EventLog.open(tmp_path / "log", projections=[proj], projection_process=True) as log:
            for n in range(1, 4):
                log.flush("s", [user(f"q{i}") for i in range(n)])
                assert len(proj.messages("s")) == n
            assert runner_pid(log) is None
    assert caplog.text.count("catching it up in this process instead") == 1
    proj.close()


def test_ctrl_c_in_the_terminal_does_not_stop_the_child(tmp_path: Path) -> None:
    with started(tmp_path) as (log, _, child):
        os.kill(child, signal.SIGINT)  # what a terminal sends the whole process group
        log.flush("s", [user("q0"), assistant("a")])
        assert log.sync_projections(timeout=30)
        assert runner_pid(log) == child


@pytest.mark.parametrize("process", [True, False], ids=["in its process", "on the log's thread"])
def test_a_round_starts_after_fewer_writes_when_it_runs_in_a_process_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process: bool
) -> None:
    monkeypatch.setattr("eventlog.projector.COALESCE_LAG", 60.0)  # only the count of writes starts a round
    monkeypatch.setattr("eventlog.projector.COALESCE_MAX_LAG", 60.0)
    proj = SQLiteProjection(tmp_path / "p.db")
    messages: list[dict[str, Any]] = []
    try:
        with EventLog.open(tmp_path / "log", projections=[proj], projection_process=process) as log:
            log.flush("s", [user("q0")])
            assert log.sync_projections(timeout=30)  # the child is up; the rounds gathered so far are done
            messages.append(user("q0"))
            for i in range(1, 1 + OFFLOADED_WRITES):
                messages.append(assistant(f"a{i}"))
                log.flush("s", messages)
            deadline = time.monotonic() + (20 if process else 1)
            while len(raw_rows(tmp_path / "p.db")) < len(messages) and time.monotonic() < deadline:
                time.sleep(0.02)  # nobody waits for the rows: the projector starts the round by itself
            # In a child, that many writes start a round; on the thread, rounds gather more (or wait a minute).
            assert (len(raw_rows(tmp_path / "p.db")) == len(messages)) is process
    finally:
        proj.close()
