"""An event's hash computed on the worker thread (``eventlog._digest``) is the hash ``hashlib``
gives on the calling thread, whatever the sizes, whoever ends up hashing (the worker, or the
caller taking a job back); the caller's buffer is never left in the worker's hands, even when
the work beside it raises; and a log written either way verifies."""

from __future__ import annotations

import os
import threading
from hashlib import sha256

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import EventLog, codec, overlap, snapshot
from eventlog.overlap import sha256_during

needs_c = pytest.mark.skipif(overlap._digest is None, reason="eventlog._digest was not built")


def expected(prefix: bytes, data: bytes | bytearray) -> bytes:
    return sha256(prefix + bytes(data)).digest()


@pytest.fixture(params=["worker thread", "calling thread"])
def offload(request: pytest.FixtureRequest) -> bool:
    if request.param == "worker thread" and overlap._digest is None:
        pytest.skip("eventlog._digest was not built")
    return request.param == "worker thread"


@pytest.mark.parametrize("size", [0, 1, 63, 64, 65, 4096, 300_000, 1_500_000])
def test_the_digest_is_hashlib_s_and_the_work_s_result_comes_back(offload, size):
    data = bytearray(os.urandom(size))
    ran: list[int] = []

    def work() -> str:
        ran.append(len(data))
        return "done"

    digest, result = sha256_during(b"prefix", data, work, offload=offload)
    assert digest == expected(b"prefix", data)
    assert (result, ran) == ("done", [size])


@needs_c
@settings(max_examples=200, deadline=None)
@given(prefix=st.binary(max_size=100), data=st.binary(max_size=5000), offload=st.booleans())
def test_the_c_job_agrees_with_hashlib_exactly(prefix, data, offload):
    assert overlap._digest.start(prefix, data, offload).finish() == expected(prefix, data)


@needs_c
def test_jobs_the_worker_has_not_taken_yet_are_taken_back_by_their_callers():
    # The worker takes one job at a time: most of these are still queued when finished,
    # last first, so their callers hash them; the first ones the worker hashes.
    data = [os.urandom(600_000 + i) for i in range(24)]
    jobs = [overlap._digest.start(bytes([i]), item, True) for i, item in enumerate(data)]
    found = {i: jobs[i].finish() for i in reversed(range(len(jobs)))}
    assert found == {i: expected(bytes([i]), item) for i, item in enumerate(data)}


@needs_c
def test_a_job_finishes_once():
    job = overlap._digest.start(b"", b"data", True)
    assert job.finish() == expected(b"", b"data")
    with pytest.raises(RuntimeError, match="finished already"):
        job.finish()


@needs_c
def test_a_buffer_is_held_until_its_job_is_finished_or_dropped():
    data = bytearray(os.urandom(2_000_000))
    job = overlap._digest.start(b"", data, True)
    with pytest.raises(BufferError):
        data += b"x"  # exported to the job: the worker may be reading it
    job.finish()
    data += b"x"
    job = overlap._digest.start(b"", data, True)
    del job  # dropped unfinished: it waits for the worker, then lets go of the buffer
    data += b"y"
    assert len(data) == 2_000_002


def test_work_that_raises_is_raised_after_the_worker_let_go_of_the_buffer(offload):
    data = bytearray(os.urandom(2_000_000))

    def work() -> None:
        raise ValueError("the work failed")

    with pytest.raises(ValueError, match="the work failed"):
        sha256_during(b"k", data, work, offload=offload)
    data += b"x"  # a buffer still exported to the worker could not be resized (BufferError)
    assert sha256_during(b"k", data, lambda: 1, offload=offload)[0] == expected(b"k", data)


def test_threads_hashing_at_once_each_get_their_own_digest(offload):
    buffers = [os.urandom(400_000 + i) for i in range(8)]
    found: dict[int, bytes] = {}

    def hash_one(i: int) -> None:
        for _ in range(5):
            found[i] = sha256_during(bytes([i]), buffers[i], lambda: None, offload=offload)[0]

    threads = [threading.Thread(target=hash_one, args=(i,)) for i in range(len(buffers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert found == {i: expected(bytes([i]), data) for i, data in enumerate(buffers)}


@needs_c
@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork()")
def test_a_child_after_fork_starts_its_own_worker():
    data = os.urandom(1_000_000)
    assert sha256_during(b"", data, lambda: None, offload=True)[0] == expected(b"", data)  # the parent's worker runs
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker thread does not exist here
        code = 1
        try:
            jobs = [overlap._digest.start(bytes([i]), data, True) for i in range(3)]
            code = 0 if [job.finish() for job in jobs] == [expected(bytes([i]), data) for i in range(3)] else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_large_buffers_go_to_the_worker_and_small_ones_stay(monkeypatch):
    started: list[bool] = []

    class Recorder:
        @staticmethod
        def start(prefix: bytes, data: bytes, offload: bool) -> object:
            started.append(offload)
            return type("Job", (), {"finish": lambda self: expected(prefix, data)})()

    monkeypatch.setattr(overlap, "_digest", Recorder)
    monkeypatch.setattr(overlap, "OFFLOAD", True)
    sha256_during(b"", bytes(overlap.OVERLAP_FROM - 1), lambda: None)
    assert started == []
    sha256_during(b"", bytes(overlap.OVERLAP_FROM), lambda: None)
    assert started == [True]
    monkeypatch.setattr(overlap, "OFFLOAD", False)  # one CPU, or no extension
    sha256_during(b"", bytes(overlap.OVERLAP_FROM), lambda: None)
    assert started == [True]


def test_a_log_whose_events_were_hashed_either_way_verifies(tmp_path, monkeypatch, offload):
    monkeypatch.setattr(overlap, "OFFLOAD", offload)
    monkeypatch.setattr(overlap, "OVERLAP_FROM", 0)  # every event, small ones too
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


def hashlib_nodes(parent: bytes, digests: list[bytes]) -> list[bytes]:
    nodes = []
    for digest in digests:
        parent = sha256(parent + digest).digest()
        nodes.append(parent)
    return nodes


@needs_c
@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(st.binary(max_size=3000), max_size=40),
    offload=st.booleans(),
    parent=st.binary(min_size=32, max_size=32),
)
def test_each_and_chain_agree_with_hashlib_exactly(items, offload, parent):
    digests = overlap._digest.each(items, offload).finish()
    assert digests == [sha256(item).digest() for item in items]
    assert overlap._digest.chain(parent, digests) == hashlib_nodes(parent, digests)


@needs_c
def test_each_hashes_its_own_copy_of_the_list_the_caller_goes_on_changing():
    items = [os.urandom(20_000 + i) for i in range(200)]
    wanted = [sha256(item).digest() for item in items]
    jobs = [overlap._digest.each(items, True) for _ in range(4)]
    items.clear()  # the jobs hold their items: none is freed under the worker
    assert [job.finish() for job in jobs] == [wanted] * 4
    with pytest.raises(RuntimeError, match="finished already"):
        jobs[0].finish()
    dropped = overlap._digest.each([os.urandom(1_000_000)] * 8, True)
    del dropped  # dropped unfinished: it waits for the worker before its items go


@needs_c
def test_each_and_chain_refuse_what_they_cannot_hash():
    with pytest.raises(TypeError, match="item 1 is bytearray, not bytes"):
        overlap._digest.each([b"a", bytearray(b"b")], True)
    with pytest.raises(TypeError, match="digest 0 is not 32 bytes"):
        overlap._digest.chain(bytes(32), [b"short"])
    with pytest.raises(TypeError, match="parent: 32 bytes"):
        overlap._digest.chain(b"", [])


@pytest.mark.parametrize("hashing", ["C loops", "hashlib"])
def test_a_bulk_flush_hashes_its_bodies_either_way_to_the_same_transcript(tmp_path, monkeypatch, hashing):
    if hashing == "C loops" and overlap._digest is None:
        pytest.skip("eventlog._digest was not built")
    if hashing == "hashlib":
        monkeypatch.setattr(overlap, "_digest", None)
    messages = [{"role": "user", "content": f"message {i}"} for i in range(3 * snapshot.EACH_PART + 5)]
    expected_nodes = hashlib_nodes(bytes(32), [sha256(codec.encode(m)).digest() for m in messages])
    with EventLog.open(tmp_path / "log", durability="none") as log:
        result = log.flush("bulk", messages)
        assert result.head == expected_nodes[-1].hex()
        assert log.flush("bulk", messages + messages[:100]).appended == 100  # the session grows by a bulk again
        assert log.messages("bulk") == messages + messages[:100]
        assert log.verify().ok
