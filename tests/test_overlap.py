"""An event's hash computed on the worker thread is the hash ``hashlib`` gives on the calling
thread, whatever the size, whether the work beside it succeeds or raises; the caller's buffer
is never left in the worker's hands; and a log whose large events were hashed there verifies."""

from __future__ import annotations

import os
import threading
from hashlib import sha256

import pytest

from eventlog import EventLog, overlap
from eventlog.overlap import Sha256, sha256_during

SIZES = [0, 1, 4095, 4096, 300_000, 1_500_000]


def expected(prefix: bytes, data: bytes | bytearray) -> bytes:
    return sha256(prefix + bytes(data)).digest()


def finishes(run, timeout: float = 30.0):
    """``run()``'s result, failing the test if it does not return (a worker left waiting)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(run()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "the call did not return"
    return out[0]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("overlap_from", [0, overlap.OVERLAP_FROM, 1 << 62])
def test_the_digest_is_hashlib_s_and_the_work_s_result_comes_back(size, overlap_from):
    data = bytearray(os.urandom(size))
    ran: list[int] = []

    def work() -> str:
        ran.append(len(data))
        return "done"

    digest, result = sha256_during(b"prefix", data, work, overlap_from=overlap_from)
    assert digest == expected(b"prefix", data)
    assert (result, ran) == ("done", [size])


def test_the_worker_hashes_large_buffers_and_leaves_small_ones_to_the_caller(monkeypatch):
    if overlap._cpus() < 2:
        pytest.skip("one CPU: every buffer is hashed on the calling thread")
    seen: list[str] = []
    real = overlap._Job.run

    def run(job: overlap._Job) -> None:
        seen.append(threading.current_thread().name)
        real(job)

    monkeypatch.setattr(overlap._Job, "run", run)
    sha256_during(b"", bytes(overlap.OVERLAP_FROM - 1), lambda: None)
    assert seen == []
    sha256_during(b"", bytes(overlap.OVERLAP_FROM), lambda: None)
    assert seen == ["eventlog-sha256"]


def test_work_that_raises_is_raised_after_the_worker_let_go_of_the_buffer():
    data = bytearray(os.urandom(2_000_000))

    def work() -> None:
        raise ValueError("the work failed")

    with pytest.raises(ValueError, match="the work failed"):
        sha256_during(b"k", data, work, overlap_from=0)
    data += b"x"  # a buffer still exported to the worker could not be resized (BufferError)
    assert sha256_during(b"k", data, lambda: 1, overlap_from=0)[0] == expected(b"k", data)


def test_a_worker_woken_but_never_handed_a_buffer_is_let_go():
    for _ in range(3):
        with pytest.raises(RuntimeError):
            with Sha256(10_000_000, overlap_from=0):
                raise RuntimeError("the event could not be encoded")
    data = os.urandom(500_000)
    digest, _ = finishes(lambda: sha256_during(b"", data, lambda: None, overlap_from=0))
    assert digest == expected(b"", data)


def test_threads_hashing_at_once_each_get_their_own_digest():
    buffers = [os.urandom(400_000 + i) for i in range(8)]
    found: dict[int, bytes] = {}

    def hash_one(i: int) -> None:
        for _ in range(5):
            found[i] = sha256_during(bytes([i]), buffers[i], lambda: None, overlap_from=0)[0]

    threads = [threading.Thread(target=hash_one, args=(i,)) for i in range(len(buffers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert found == {i: expected(bytes([i]), data) for i, data in enumerate(buffers)}


def test_with_one_cpu_the_calling_thread_hashes(monkeypatch):
    monkeypatch.setattr(overlap, "_WORKER", overlap._Worker())
    monkeypatch.setattr(overlap, "_cpus", lambda: 1)
    assert overlap._WORKER.queue() is None
    data = os.urandom(1_000_000)
    assert sha256_during(b"p", data, lambda: None, overlap_from=0)[0] == expected(b"p", data)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_a_child_after_fork_starts_its_own_worker():
    data = os.urandom(1_000_000)
    sha256_during(b"", data, lambda: None, overlap_from=0)  # the parent's worker is running
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker thread does not exist here
        code = 1
        try:
            done = threading.Event()
            out: list[bytes] = []
            threading.Thread(
                target=lambda: (out.append(sha256_during(b"", data, lambda: None, overlap_from=0)[0]), done.set()),
                daemon=True,
            ).start()
            code = 0 if done.wait(30) and out == [expected(b"", data)] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("overlap_from", [0, 1 << 62])
def test_a_log_whose_events_were_hashed_either_way_verifies(tmp_path, monkeypatch, overlap_from):
    monkeypatch.setattr(overlap, "OVERLAP_FROM", overlap_from)
    messages = [{"role": "user", "content": f"message {i} " + "x" * 900} for i in range(2500)]
    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("bulk", messages)  # three events of up to 1,024 messages
        log.flush("turn", messages[:3])
        log.flush("bulk", messages + [{"role": "user", "content": "one more"}])
        report = log.verify()
        assert report.ok, report
    with EventLog.open(tmp_path / "log", readonly=True) as log:
        assert log.messages("bulk")[:2500] == messages
        assert log.verify().ok
