"""Commits shared across processes (``eventlog/relay.py``): one process carries the others' flushes.

Real processes throughout: a carrier is a process that opened the log and flushed first, the
others send it their flushes over its socket.  The protocol cases talk to a real carrier
through a raw socket, to send what the library itself never would (a moved base, a passed
deadline, a damaged frame, another user).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from crashkit import Child
from factories import user

from eventlog import EventLog
from eventlog import relay as relaying
from eventlog.codec import ZERO
from eventlog.relay import Answer, Ask, Part


def turns(name: str, n: int) -> list[dict[str, Any]]:
    return [user(f"{name} turn {i}") for i in range(n)]


def _writer(path: str, name: str, count: int, barrier: Any, out: Any) -> None:
    messages = turns(name, count)
    with EventLog.open(path) as log:
        barrier.wait()
        for i in range(1, count + 1):
            log.flush(name, messages[:i])
    relay = log._relay  # read once closed: a carrier carries until it closes
    assert relay is not None
    out.put((name, log._store.commits, relay.sent, relay.carried))


def test_processes_flushing_their_own_sessions_share_the_carriers_commits(tmp_path: Path) -> None:
    path, count, writers = str(tmp_path / "log"), 40, 4
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(writers), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(path, f"w{k}", count, barrier, out)) for k in range(writers)]
    for p in procs:
        p.start()
    stats = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    commits = sum(s[1] for s in stats)
    relayed = sum(s[2] for s in stats)
    carried = sum(s[3] for s in stats)
    assert relayed >= count  # at least one process's worth went through another process
    assert carried == relayed  # every relayed flush was committed by a carrier, and counted once
    assert commits < writers * count  # commits were shared
    with EventLog.open(path) as log:
        for k in range(writers):
            assert log.messages(f"w{k}") == turns(f"w{k}", count)
        assert len(list(log.events())) == writers * (count + 1)  # one open and one append per flush: nothing twice
        assert log.verify().ok


CARRIER = """
import sys, time
from eventlog import EventLog
log = EventLog.open(sys.argv[1], durability=sys.argv[2])
log.flush("carrier", [{"role": "user", "content": "first"}])
print("ready", flush=True)
time.sleep(600)
"""


def _connect(log: EventLog) -> socket.socket:
    assert log._relay is not None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(log._relay._address)
    conn.settimeout(10)
    return conn


def _ask(conn: socket.socket, ask: Ask) -> Answer | None:
    """Send ``ask``; the carrier's answer, or None when it closed the connection instead."""
    body = msgspec.msgpack.encode(ask)
    conn.sendall(struct.pack("<I", len(body)) + body)
    header = conn.recv(4, socket.MSG_WAITALL)
    if len(header) < 4:
        return None
    (size,) = struct.unpack("<I", header)
    return msgspec.msgpack.decode(conn.recv(size, socket.MSG_WAITALL), type=Answer)


def _part(log: EventLog, session: str, messages: list[dict[str, Any]], length: int, head: bytes) -> Part:
    """What a sender sends for ``messages[length:]`` on top of ``length`` stored messages ending in ``head``."""
    from eventlog.snapshot import prepare

    prepared = prepare(messages, None)
    return Part(
        session,
        length,
        head,
        [bytes(b) for b in prepared.bodies[length:]],
        b"".join(prepared.digests[length:]),
        b"".join(prepared.nodes[length:]),
        0,
    )


def test_the_carrier_writes_a_request_only_onto_the_transcript_it_was_prepared_on(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        first = turns("s", 2)
        log.flush("s", first[:1])  # this process is now the carrier
        assert log._relay is not None and log._relay._carrier is not None
        head = bytes.fromhex(log.head("s") or "")
        with _connect(log) as conn:
            stale = _ask(conn, Ask(time.monotonic() + 10, [_part(log, "s", first, 0, ZERO)]))
            assert stale is not None and stale.results is None  # the base moved: nothing written
            assert log.messages("s") == first[:1]
            late = _ask(conn, Ask(time.monotonic() - 0.001, [_part(log, "s", first, 1, head)]))
            assert late is not None and late.results is None  # past its deadline: never written
            assert log.messages("s") == first[:1]
            done = _ask(conn, Ask(time.monotonic() + 10, [_part(log, "s", first, 1, head)]))
            assert done is not None and done.results is not None
            appended, tombstoned, unchanged, new_head, seq = done.results[0]
            assert (appended, tombstoned, unchanged) == (1, 0, 1)
            assert new_head == log.head("s") and seq == log.last_seq
        assert log.messages("s") == first
        assert log.info()["carried"] == 1
        assert log.verify().ok


def test_a_request_with_a_damaged_session_leaves_the_others_of_the_commit_alone(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        log.flush("carrier", turns("c", 1))
        a, b = turns("a", 1), turns("b", 1)
        with _connect(log) as one, _connect(log) as two:
            good = _part(log, "a", a, 0, ZERO)
            bad = msgspec.structs.replace(_part(log, "b", b, 0, ZERO), nodes=b"\x00" * 31)  # not 32 bytes a node
            assert (_ask(two, Ask(time.monotonic() + 10, [good, bad])) or Answer(None)).results is None
            answer = _ask(one, Ask(time.monotonic() + 10, [good]))
            assert answer is not None and answer.results is not None
        assert log.messages("a") == a
        assert "b" not in log
        assert log.verify().ok


def test_a_damaged_frame_closes_its_connection_and_the_carrier_goes_on(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        log.flush("carrier", turns("c", 1))
        with _connect(log) as conn:
            conn.sendall(struct.pack("<I", 5) + b"\xc1\xc1\xc1\xc1\xc1")  # 0xc1: never used in msgpack
            assert conn.recv(4) == b""
        with _connect(log) as conn:
            conn.sendall(struct.pack("<I", 1 << 31))  # longer than any request may be
            assert conn.recv(4) == b""
        with _connect(log) as conn:
            messages = turns("s", 1)
            answer = _ask(conn, Ask(time.monotonic() + 10, [_part(log, "s", messages, 0, ZERO)]))
            assert answer is not None and answer.results is not None
        assert log.messages("s") == messages


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, to connect as another user")
def test_another_users_process_is_not_carried(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        log.flush("carrier", turns("c", 1))
        ask = msgspec.msgpack.encode(Ask(time.monotonic() + 10, [_part(log, "s", turns("s", 1), 0, ZERO)]))
        assert log._relay is not None
        address = log._relay._address
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                conn.connect(address)
                conn.settimeout(10)
                try:
                    conn.sendall(struct.pack("<I", len(ask)) + ask)
                    code = 0 if conn.recv(4) == b"" else 2  # closed unanswered
                except (BrokenPipeError, ConnectionResetError):
                    code = 0  # closed before it was read
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert "s" not in log


def test_a_flush_of_another_process_is_carried_and_its_projection_catches_up(tmp_path: Path) -> None:
    from projections.sqlite import SQLiteProjection

    path = tmp_path / "log"
    with Child(CARRIER, str(path), "full") as carrier:
        carrier.wait_ready()
        projection = SQLiteProjection(tmp_path / "p.db")
        with EventLog.open(path, projections=[projection]) as log:
            messages = turns("s", 3)
            for i in range(1, 4):
                log.flush("s", messages[:i])
            assert log.info()["relayed"] == 3
            assert [m["content"] for m in projection.messages("s")] == [m["content"] for m in messages]
        projection.close()


def test_a_carrier_of_another_durability_mode_is_not_used(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with Child(CARRIER, str(path), "process") as carrier:
        carrier.wait_ready()
        with EventLog.open(path) as log:
            log.flush("s", turns("s", 1))
            assert log.info()["relayed"] == 0
        with EventLog.open(path, durability="process") as log:
            log.flush("t", turns("t", 1))
            assert log.info()["relayed"] == 1


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, "the carrier did not stop"
        time.sleep(0.01)


def test_a_stopped_carrier_that_resumes_never_writes_what_its_sender_wrote_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender stops waiting only after its request's deadline and writes the flush itself;
    the carrier, resumed later, finds the request past its deadline, even though the session
    came back to the very transcript the request extends."""
    monkeypatch.setattr(relaying, "WAIT", 0.5)
    path = tmp_path / "log"
    messages = turns("s", 2)
    with Child(CARRIER, str(path), "full") as carrier:
        carrier.wait_ready()
        with EventLog.open(path) as log:
            log.flush("s", messages[:1])
            assert log.info()["relayed"] == 1
            os.kill(carrier.popen.pid, signal.SIGSTOP)
            _wait_stopped(carrier.popen.pid)
            try:
                began = time.monotonic()
                log.flush("s", messages)  # sent; no answer: written here after the deadline
                assert time.monotonic() - began >= 0.5
                assert log.info()["relayed"] == 1
                log.flush("s", messages[:1])  # a rewind: back to what the stale request extends
            finally:
                os.kill(carrier.popen.pid, signal.SIGCONT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and log.last_seq == 4:
                time.sleep(0.05)  # give the resumed carrier the time it would take to write it
            time.sleep(0.3)
            assert log.messages("s") == messages[:1]
            kinds = [type(record.event).__name__ for record in log.events()]
            assert kinds.count("MessagesAppended") == 3  # the carrier's first, then both of this process's
            assert log.verify().ok


KILLED_CARRIER = """
import sys, time
from eventlog import EventLog
log = EventLog.open(sys.argv[1])
log.flush("carrier", [{"role": "user", "content": "first"}])
print("ready", flush=True)
while True:
    time.sleep(1)
"""


def test_flushes_go_on_when_the_carrier_is_killed_and_another_process_carries(tmp_path: Path) -> None:
    path = tmp_path / "log"
    messages = turns("s", 60)
    with Child(KILLED_CARRIER, str(path)) as carrier:
        carrier.wait_ready()
        with EventLog.open(path) as log:
            for i in range(1, 31):
                log.flush("s", messages[:i])
            assert log.info()["relayed"] == 30
            carrier.kill()
            for i in range(31, 61):
                log.flush("s", messages[:i])
            assert log.info()["relayed"] == 30
            assert log._relay is not None and log._relay._carrier is not None  # it carries now
            assert log.messages("s") == messages
            assert log.verify().ok


def test_a_log_opened_without_the_relay_neither_sends_nor_carries(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with Child(CARRIER, str(path), "full") as carrier:
        carrier.wait_ready()
        with EventLog.open(path, relay=False) as log:
            log.flush("s", turns("s", 1))
            assert log.info()["relayed"] == 0
    with EventLog.open(path, relay=False) as log:
        log.flush("t", turns("t", 1))  # nobody carries now: it would become the carrier
        assert log._relay is None


def test_a_carrier_whose_thread_fails_stops_listening_and_another_carries(tmp_path: Path) -> None:
    """Nothing may be left listening with nobody reading: senders would wait out every deadline."""
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("mine", turns("c", 1))
        relay = log._relay
        assert relay is not None and relay._carrier is not None
        carrier = relay._carrier

        def broken(*args: object) -> None:
            raise RuntimeError("a carrier bug")

        carrier._round = broken  # type: ignore[method-assign]
        os.write(carrier.wake_w, b"x")  # wake the thread into the broken round
        carrier.thread.join(timeout=10)
        assert not carrier.thread.is_alive()
        with Child(KILLED_CARRIER, str(path)) as other:
            other.wait_ready()  # refused at once, so it carries now
            began = time.monotonic()
            log.flush("s", turns("s", 1))
            assert time.monotonic() - began < relaying.WAIT
            assert log.info()["relayed"] == 1
        assert log.messages("s") == turns("s", 1)


BUSY_CARRIER = """
import sys
from eventlog import EventLog
log = EventLog.open(sys.argv[1])
log.flush("carrier", [{"role": "user", "content": "first"}])
print("ready", flush=True)
x = 0
while True:  # the process's own Python keeps its GIL busy
    x = (x * 31 + 7) % 1000003
"""


def test_a_carrier_busy_with_its_own_python_leaves_carrying_to_others(tmp_path: Path) -> None:
    """Its threads would wait on its GIL for every step of every sender's flush: after two looks
    at how busy it is, it stops carrying, and the sender carries (here: commits its own)."""
    path = tmp_path / "log"
    messages = turns("s", 400)
    with Child(BUSY_CARRIER, str(path)) as carrier:
        carrier.wait_ready()
        with EventLog.open(path) as log:
            relay = log._relay
            assert relay is not None
            deadline = time.monotonic() + 20
            i = 0
            while relay._carrier is None:
                assert time.monotonic() < deadline, "the busy carrier kept carrying"
                i += 1
                log.flush("s", messages[:i])
                time.sleep(0.01)
            assert relay.sent > 0  # the busy process carried at first
            sent = relay.sent
            log.flush("s", messages[: i + 1])
            assert relay.sent == sent
            assert log.messages("s") == messages[: i + 1]


def test_a_relayed_flush_found_stored_again_needs_no_sync(tmp_path: Path) -> None:
    """The carrier answers once its commit is synced, so the sender knows those events are."""
    path = tmp_path / "log"
    with Child(CARRIER, str(path), "full") as carrier:
        carrier.wait_ready()
        with EventLog.open(path) as log:
            messages = turns("s", 2)
            log.flush("s", messages)
            assert log.info()["relayed"] == 1
            syncs: list[bool] = []
            store = log._store
            real = store.sync
            store.sync = lambda: syncs.append(True) or real()  # type: ignore[method-assign]
            assert log.flush("s", messages).appended == 0
            assert syncs == []


def test_the_carrier_does_not_write_a_request_whose_sender_has_gone(tmp_path: Path) -> None:
    """A sender killed while its request waits for the carrier's commit: the request is dropped,
    so a process taking over its sessions never sees it land after it looked."""
    with EventLog.open(tmp_path / "log") as log:
        log.flush("carrier", turns("c", 1))  # this process now carries
        messages = turns("s", 1)
        gone = _connect(log)
        held = log._store.env.begin(write=True)  # the carrier's commit waits for LMDB's writer lock
        try:
            body = msgspec.msgpack.encode(Ask(time.monotonic() + 30, [_part(log, "s", messages, 0, ZERO)]))
            gone.sendall(struct.pack("<I", len(body)) + body)
            time.sleep(0.5)  # the carrier has read the request and waits for the lock
            gone.close()  # the sender dies before its request is written
        finally:
            held.abort()
        time.sleep(0.5)  # the carrier's commit runs
        assert "s" not in log
        with _connect(log) as staying:  # the same request from a sender that waits is written
            answer = _ask(staying, Ask(time.monotonic() + 30, [_part(log, "s", messages, 0, ZERO)]))
            assert answer is not None and answer.results is not None
        assert log.messages("s") == messages
        assert log.verify().ok


OPENER = """
import sys, time
from eventlog import EventLog
print("ready", flush=True)
log = EventLog.open(sys.argv[1])
print(time.monotonic(), flush=True)
log.close()
"""


def test_opening_a_log_waits_for_a_write_in_flight(tmp_path: Path) -> None:
    """Opening takes LMDB's writer lock (the databases are opened in a write transaction): what a
    process reads first is final for any process that died before it opened."""
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", turns("s", 1))
        held = log._store.env.begin(write=True)  # another process's commit, in flight
        try:
            with Child(OPENER, str(path)) as opener:
                opener.wait_ready()
                time.sleep(1.0)  # the opener is inside EventLog.open by now
                released = time.monotonic()
                held.abort()
                held = None
                assert opener.popen.stdout is not None
                opened = float(opener.popen.stdout.readline())
                assert opener.popen.wait(timeout=60) == 0, opener.stderr()
        finally:
            if held is not None:
                held.abort()
        assert opened >= released
