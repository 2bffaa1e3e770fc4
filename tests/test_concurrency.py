"""Several threads and processes flushing the same session write each message once."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

from eventlog import EventLog, events


def conversation(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(n)]


def stored_bodies(log: EventLog) -> int:
    return sum(
        len(r.event) - len(r.event.carried) for r in log.events() if isinstance(r.event, events.MessagesAppended)
    )


def test_threads_flushing_one_session(tmp_path):
    messages = conversation(60)
    with EventLog.open(tmp_path / "l") as log:
        barrier = threading.Barrier(6)
        errors: list[BaseException] = []

        def exit_path(k: int) -> None:
            try:
                barrier.wait()
                for n in range(k, len(messages) + 1, 7):
                    log.flush("s", messages[:n] if n else messages[:1])
                log.flush("s", messages)
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=exit_path, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert log.messages("s") == messages
        assert log.verify().ok


def test_two_threads_flushing_one_growing_list_never_record_a_rewind(tmp_path):
    read, resume = threading.Event(), threading.Event()

    def rule(message):  # scaffolding rule, used to hold thread "older" just after it read the list
        if message.get("content") == "turn 1" and threading.current_thread().name == "older" and not read.is_set():
            read.set()
            resume.wait(10)
        return False

    messages = conversation(1)
    with EventLog.open(tmp_path / "l", ephemeral=rule) as log:
        log.flush("s", messages)
        messages.append({"role": "assistant", "content": "turn 1"})
        older = threading.Thread(target=log.flush, args=("s", messages), name="older")
        older.start()
        assert read.wait(10)
        messages.append({"role": "user", "content": "turn 2"})  # the loop goes on while "older" is held
        newer = threading.Thread(target=log.flush, args=("s", messages), name="newer")
        newer.start()
        newer.join(0.3)
        assert newer.is_alive()  # it waits for the flush that read the list before it
        resume.set()
        older.join(10)
        newer.join(10)
        assert log.messages("s") == messages
        assert [o.tombstone for o in log.history("s")] == [None] * 3  # no rewind of turn 2, no repeat


def _flush_from_process(path: str, rounds: int, barrier) -> None:
    messages = conversation(40)
    with EventLog.open(path) as log:
        barrier.wait()
        for _ in range(rounds):
            log.flush("shared", messages)


def test_processes_flushing_one_session_write_each_message_once(tmp_path: Path):
    path = str(tmp_path / "l")
    EventLog.open(path).close()
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [ctx.Process(target=_flush_from_process, args=(path, 5, barrier)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with EventLog.open(path) as log:
        assert log.messages("shared") == conversation(40)
        assert stored_bodies(log) == 40
        assert log.verify().ok


def _grow_map(path: str, n: int) -> None:
    with EventLog.open(path, map_size=1 << 20) as log:
        for i in range(n):
            log.flush(f"p{i % 3}", [{"role": "user", "content": "x" * 4000, "i": j} for j in range(i % 20 + 1)])


def test_map_grows_in_one_process_while_another_writes(tmp_path: Path):
    path = str(tmp_path / "l")
    EventLog.open(path, map_size=1 << 20).close()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_grow_map, args=(path, 120)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with EventLog.open(path) as log:
        assert log.verify().ok
        assert log.info()["map_size"] > 1 << 20


def _flush_list(path: str, n: int) -> None:
    with EventLog.open(path) as log:
        log.flush("s", conversation(n))


def test_a_grown_list_another_process_already_stored_writes_nothing(tmp_path: Path):
    path = str(tmp_path / "l")
    ctx = multiprocessing.get_context("spawn")
    with EventLog.open(path) as log:
        log.flush("s", conversation(2))  # this process now knows the session at 2 messages
        other = ctx.Process(target=_flush_list, args=(path, 5))
        other.start()
        other.join(60)
        assert other.exitcode == 0
        seq, commits = log.last_seq, log._store.commits
        result = log.flush("s", conversation(5))  # grew since this process's last flush
        assert (result.appended, result.tombstoned, result.unchanged) == (0, 0, 5)
        assert log.last_seq == seq and log._store.commits == commits  # nothing new: no write transaction
        result = log.flush("s", conversation(6))
        assert (result.appended, result.unchanged) == (1, 5)
        assert log._store.commits == commits + 1
        assert log.messages("s") == conversation(6)
        assert stored_bodies(log) == 6
        assert log.verify().ok


def test_the_turn_locks_of_sessions_nobody_flushes_are_forgotten(tmp_path, monkeypatch):
    import eventlog.log

    monkeypatch.setattr(eventlog.log, "TURNS_KEPT", 8)
    with EventLog.open(tmp_path / "l") as log:
        for i in range(50):
            log.flush(f"s{i}", conversation(1))
        assert len(log._turns) <= 8
        assert all(turn.users == 0 for turn in log._turns.values())
