"""Attached projections are kept current on a background thread, after the write returns."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import assistant, user

from eventlog import EventLog

projections = pytest.importorskip("projections")
SQLiteProjection = projections.SQLiteProjection


class Gate:
    """A projection whose catch-up blocks until released, recording what it saw."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.seen: list[int] = []

    def catch_up(self, log: EventLog) -> int:
        if self.seen:  # the first call is the one at open
            self.entered.set()
            assert self.release.wait(30)
        self.seen.append(log.last_seq)
        return 0


def raw_count(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("SELECT count(*) FROM live_messages").fetchone()[0]
    finally:
        db.close()


def test_a_write_returns_without_waiting_for_the_projection(tmp_path: Path) -> None:
    gate = Gate()
    with EventLog.open(tmp_path / "log", projections=[gate]) as log:
        log.flush("s", [user("q"), assistant("a")])  # returns although the projection is blocked
        assert gate.entered.wait(30)
        assert not log.sync_projections(timeout=0.05)
        gate.release.set()
        assert log.sync_projections(timeout=30)
        assert gate.seen[-1] == log.last_seq


def test_inline_projection_is_current_when_the_write_returns(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", projections=[proj], project_in_background=False) as log:
        for n in range(5):
            log.flush("s", [user(f"q{i}") for i in range(n + 1)])
            assert raw_count(tmp_path / "p.db") == n + 1
    proj.close()


def test_reads_through_the_projection_see_the_writes_before_them(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", projections=[proj]) as log:
        messages = []
        for n in range(30):
            messages += [user(f"question {n}"), assistant(f"answer {n} zebra")]
            log.flush("s", messages)
            assert len(proj.messages("s")) == len(messages)
            assert proj.last_seq == log.last_seq
        assert len(proj.search("zebra", limit=100)) == 30
        log.rewind("s", to=4)
        assert [r["position"] for r in proj.messages("s")] == [0, 1, 2, 3]
    proj.close()


def test_sync_projections_then_raw_sqlite_and_close_drains(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    with EventLog.open(tmp_path / "log", projections=[proj]) as log:
        log.flush("s", [user("q0"), user("q1")])
        assert log.sync_projections(timeout=30)
        assert raw_count(tmp_path / "p.db") == 2
        for n in range(3, 50):
            log.flush("s", [user(f"q{i}") for i in range(n)])
    # close() applied everything still waiting
    assert raw_count(tmp_path / "p.db") == 49
    proj.close()


def test_a_failing_projection_never_fails_the_write_and_catches_up_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    blocker = sqlite3.connect(tmp_path / "p.db", timeout=0)
    with EventLog.open(tmp_path / "log", projections=[proj]) as log:
        proj._db.execute("PRAGMA busy_timeout = 0")
        blocker.execute("BEGIN EXCLUSIVE")  # the projection cannot write
        result = log.flush("s", [user("q")])
        assert result.appended == 1
        assert not log.sync_projections(timeout=30)  # applied nothing: says so
        assert "failed to catch up" in caplog.text
        blocker.rollback()
        log.flush("s", [user("q"), assistant("a")])
        assert log.sync_projections(timeout=30)
        assert [r["content"] for r in proj.messages("s")] == ["q", "a"]
    blocker.close()
    proj.close()


def test_closing_the_projection_before_the_log_does_not_hang(tmp_path: Path) -> None:
    proj = SQLiteProjection(tmp_path / "p.db")
    gate = Gate()
    with EventLog.open(tmp_path / "log", projections=[gate, proj]) as log:
        log.flush("s", [user("q"), assistant("a")])
        assert gate.entered.wait(30)  # the projector is busy; the write waits to be projected
        closer = threading.Thread(target=proj.close)
        closer.start()
        gate.release.set()
        closer.join(30)
        assert not closer.is_alive()
    assert raw_count(tmp_path / "p.db") == 2


def long_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    """No retry comes by itself within a test: what a test sees is what it asked for."""
    from eventlog import projector

    monkeypatch.setattr(projector, "RETRY_MIN", 600.0)
    monkeypatch.setattr(projector, "RETRY_MAX", 600.0)


@contextlib.contextmanager
def failed_catch_up(
    tmp_path: Path, messages: list[dict]
) -> Iterator[tuple[EventLog, SQLiteProjection, sqlite3.Connection]]:
    """An attached projection whose catch-up of a flush of ``messages`` failed: another
    connection holds the projection's write lock (the test lets it go)."""
    proj = SQLiteProjection(tmp_path / "p.db")
    blocker = sqlite3.connect(tmp_path / "p.db", timeout=0)
    try:
        with EventLog.open(tmp_path / "log", projections=[proj]) as log:
            proj._db.execute("PRAGMA busy_timeout = 0")
            blocker.execute("BEGIN EXCLUSIVE")
            log.flush("s", messages)
            assert not log.sync_projections(timeout=30)
            yield log, proj, blocker
    finally:
        blocker.close()
        proj.close()


def test_a_read_after_a_failed_catch_up_asks_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A lock held a moment too long must not leave the projection behind until some later write,
    nor answer a reader from rows older than its own writes."""
    long_pauses(monkeypatch)
    with failed_catch_up(tmp_path, [user("q")]) as (log, proj, blocker):
        with pytest.raises(projections.ProjectionError, match="behind its log"):
            proj.messages("s")
        blocker.rollback()
        assert [r["content"] for r in proj.messages("s")] == ["q"]  # this read asked for a new try
        assert log.sync_projections(timeout=30)
    assert "failed to catch up" in caplog.text


def test_a_failed_catch_up_is_tried_again_by_itself(tmp_path: Path) -> None:
    with failed_catch_up(tmp_path, [user("q")]) as (_, _, blocker):
        blocker.rollback()
        pause = threading.Event()
        for _ in range(200):  # the first pause after a failure is 0.05 s
            if raw_count(tmp_path / "p.db") == 1:
                break
            pause.wait(0.05)
        assert raw_count(tmp_path / "p.db") == 1  # no read, no write: it caught up by itself


def test_closing_the_log_tries_a_failed_catch_up_once_more(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    long_pauses(monkeypatch)
    with failed_catch_up(tmp_path, [user("q"), assistant("a")]) as (_, _, blocker):
        blocker.rollback()
        assert raw_count(tmp_path / "p.db") == 0
    assert raw_count(tmp_path / "p.db") == 2  # closing the log applied it


class Broken:
    """A projection that applies the catch-up at open and fails every one after it."""

    def __init__(self) -> None:
        self.calls = 0

    def catch_up(self, log: EventLog) -> int:
        self.calls += 1
        if self.calls > 1:
            raise RuntimeError("this projection is broken")
        return 0


def test_one_failing_projection_does_not_fail_the_reads_of_another(tmp_path: Path) -> None:
    good = SQLiteProjection(tmp_path / "good.db")
    closed_first = SQLiteProjection(tmp_path / "closed.db")
    with EventLog.open(tmp_path / "log", projections=[good, Broken(), closed_first]) as log:
        closed_first.close()  # done with it before the log: its catch-ups fail from now on
        log.flush("s", [user("q")])
        assert not log.sync_projections(timeout=30)  # the log as a whole is behind: says so
        assert [r["content"] for r in good.messages("s")] == ["q"]  # this projection is not
    good.close()


def test_the_projector_rests_after_a_retry_a_reader_asked_for(tmp_path: Path) -> None:
    """A reader asking for another round while one runs, and that round succeeding, must leave
    the projector idle, not spinning on a request nobody needs any more."""

    class Flaky:
        def __init__(self) -> None:
            self.calls = 0
            self.retrying = threading.Event()

        def catch_up(self, log: EventLog) -> int:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("transient")
            if self.calls == 3:  # the retry after the pause: a reader asks for one meanwhile
                self.retrying.set()
                for _ in range(500):
                    if log._projector._retry:
                        break
                    threading.Event().wait(0.01)
            return 0

    flaky = Flaky()
    with EventLog.open(tmp_path / "log", projections=[flaky]) as log:
        log.flush("s", [user("q")])
        assert flaky.retrying.wait(30)
        assert log.sync_projections(timeout=30)
        projector = log._projector
        wakes = [0]
        due = projector._due

        def counted() -> bool:
            wakes[0] += 1
            return due()

        projector._due = counted
        threading.Event().wait(0.3)
        assert wakes[0] < 5, f"{wakes[0]} wake-ups in 0.3 s with nothing to do"


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork()")
def test_waiting_in_a_forked_child_never_hangs(tmp_path: Path) -> None:
    """The projector thread does not exist in a child made by fork(): waiting for it there
    returns at once instead of waiting for a round that will never run."""
    import os

    log = EventLog.open(tmp_path / "log", projections=[Broken()])
    try:
        log.flush("s", [user("q")])
        assert not log.sync_projections(timeout=30)  # the last round failed
        pid = os.fork()
        if pid == 0:
            import signal

            signal.alarm(10)  # a hang ends the child with SIGALRM
            os._exit(0 if log._projector.wait(None) is False else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        log.close()


class Counting:
    """The SQLite projection, counting its catch-up rounds."""

    def __init__(self, path: Path) -> None:
        self.projection = SQLiteProjection(path)
        self.rounds = 0

    def catch_up(self, log: EventLog) -> int:
        self.rounds += 1
        return self.projection.catch_up(log)

    def bind(self, wait: object) -> None:
        self.projection.bind(wait)  # type: ignore[arg-type]


def test_writes_faster_than_the_projection_are_applied_in_rounds_of_many(tmp_path: Path) -> None:
    counting = Counting(tmp_path / "t.db")
    try:
        with EventLog.open(tmp_path / "log", durability="none", projections=[counting]) as log:
            opened = counting.rounds
            pause = threading.Event()
            for i in range(100):  # slower than a round: without gathering, one round per write
                log.append("s", [user(f"m{i}")])
                pause.wait(0.001)
            assert log.sync_projections(timeout=30)
            assert raw_count(tmp_path / "t.db") == 100
            assert counting.rounds - opened <= 60, counting.rounds - opened
    finally:
        counting.projection.close()


def test_a_reader_never_waits_for_more_writes_to_gather(tmp_path: Path) -> None:
    """Read-your-writes: each read through the projection sees the write just before it, and a
    raw reader of the database sees a lone write soon after without anyone asking."""
    proj = SQLiteProjection(tmp_path / "t.db")
    try:
        with EventLog.open(tmp_path / "log", durability="none", projections=[proj]) as log:
            for i in range(20):
                log.append("s", [user(f"m{i}")])
                assert [m["content"] for m in proj.messages("s")][-1] == f"m{i}"
            log.append("s", [assistant("lone")])
            for _ in range(300):  # a liveness check with room to spare, not a timing figure
                if raw_count(tmp_path / "t.db") == 21:
                    break
                threading.Event().wait(0.01)
            assert raw_count(tmp_path / "t.db") == 21
    finally:
        proj.close()


class Where:
    """A projection that records the thread and start (``time.monotonic``) of each catch-up,
    and raises ``fail`` once."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.started: list[float] = []
        self.fail: BaseException | None = None

    def catch_up(self, log: EventLog) -> int:
        self.threads.append(threading.current_thread())
        self.started.append(time.monotonic())
        if self.fail is not None:
            fail, self.fail = self.fail, None
            raise fail
        return 0


def test_a_reader_applies_the_writes_itself_while_the_projector_is_idle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("eventlog.projector.COALESCE_LAG", 60.0)  # the projector would gather for a minute
    monkeypatch.setattr("eventlog.projector.COALESCE_MAX_LAG", 60.0)
    where = Where()
    with EventLog.open(tmp_path / "log", projections=[where]) as log:
        log.flush("s", [user("q")])
        assert log.sync_projections()  # no timeout: the round runs on this thread, at once
        assert where.threads[-1] is threading.current_thread()
        log.flush("s", [user("q"), assistant("a")])
        assert log.sync_projections(timeout=30)  # a timeout: the projector's thread runs it
        assert where.threads[-1] is not threading.current_thread()


def test_an_interrupted_round_of_a_reader_leaves_the_writes_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("eventlog.projector.COALESCE_LAG", 60.0)
    monkeypatch.setattr("eventlog.projector.COALESCE_MAX_LAG", 60.0)
    where = Where()
    with EventLog.open(tmp_path / "log", projections=[where]) as log:
        log.flush("s", [user("q")])
        where.fail = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt):
            log.sync_projections()
        rounds = len(where.threads)
        assert log.sync_projections(timeout=30)  # neither waiter nor projector is stuck
        assert len(where.threads) == rounds + 1


def test_a_round_on_the_logs_thread_waits_for_the_writes_to_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a run of writes a round would take turns with them for the GIL: it waits for a pause."""
    monkeypatch.setattr("eventlog.projector.COALESCE_LAG", 0.6)  # a write is never that late here
    monkeypatch.setattr("eventlog.projector.COALESCE_MAX_LAG", 60.0)
    monkeypatch.setattr("eventlog.projector.COALESCE_WRITES", 10**6)
    rounds = Where()
    with EventLog.open(tmp_path / "log", durability="none", projections=[rounds]) as log:
        opened = len(rounds.started)
        first = time.monotonic()
        while time.monotonic() - first < 1.5:  # long past the pause: a timer from the first write fires
            log.append("s", [user("m")])
            time.sleep(0.01)
        last = time.monotonic()
        deadline = last + 30
        while len(rounds.started) == opened and time.monotonic() < deadline:
            time.sleep(0.01)  # nobody waits for the rows: the projector starts the round by itself
        assert len(rounds.started) > opened
        assert rounds.started[opened] >= last, "a round started while the writes went on"


def test_writes_that_never_pause_are_applied_within_the_longest_lag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("eventlog.projector.COALESCE_LAG", 60.0)
    monkeypatch.setattr("eventlog.projector.COALESCE_MAX_LAG", 0.2)
    monkeypatch.setattr("eventlog.projector.COALESCE_WRITES", 10**6)
    rounds = Where()
    with EventLog.open(tmp_path / "log", durability="none", projections=[rounds]) as log:
        opened = len(rounds.started)
        first = time.monotonic()
        while len(rounds.started) == opened and time.monotonic() - first < 30:
            log.append("s", [user("m")])
            time.sleep(0.01)
        assert len(rounds.started) > opened, "no round while the writes went on"
        assert rounds.started[opened] - first >= 0.2
