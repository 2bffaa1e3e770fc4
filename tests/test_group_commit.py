"""Group commit: concurrent writes share one LMDB transaction, each keeps its contract."""

from __future__ import annotations

import threading
import time

import pytest
from factories import assistant, user

from eventlog import EMPTY_HEAD, ConflictError, EventLog, EventLogError, HistoryMismatchError, events
from eventlog.commit import WAKE_POLL, GroupCommit, Request
from eventlog.space import ZeroedSpace
from eventlog.store import Store
from eventlog.writer import Writer


def end_commit_in_flight(store) -> None:
    """What a leader's last step does (``GroupCommit._write``): the next caller in line leads."""
    with store.group.lock:
        if store.group.queue:
            store.group.holder = store.group.queue[0]
            store.group.queue[0].lead = store.group.queue[0].woken = True
            store.group.queue[0].wake.release()
        else:
            store.group.leading = False


def run_grouped(log: EventLog, calls):
    """Start every call in its own thread while a commit is (as if) in flight, so they merge in order."""
    store = log._store
    results: dict[int, object] = {}

    def run(i, call):
        try:
            results[i] = call()
        except BaseException as e:  # an interrupt too: it is what the test looks at
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    commits = store.commits
    with store.group.lock:
        store.group.leading = True  # another thread's commit is in flight
    try:
        for n, t in enumerate(threads, 1):
            t.start()  # one at a time, so the queue order is the call order
            deadline = time.monotonic() + 10
            while len(store.group.queue) < n and time.monotonic() < deadline:
                time.sleep(0.001)
            assert len(store.group.queue) == n, "writer did not queue up"
    finally:
        end_commit_in_flight(store)  # the commit in flight ends: hand the lead to the first in line
    for t in threads:
        t.join(10)
    return [results[i] for i in range(len(calls))], store.commits - commits


def test_concurrent_writes_merge_into_one_commit(log):
    calls = [lambda i=i: log.flush(f"s{i}", [user(f"q{i}"), assistant(f"a{i}")]) for i in range(8)]
    results, commits = run_grouped(log, calls)
    assert commits == 1
    assert all(r.appended == 2 for r in results)
    for i in range(8):
        assert log.messages(f"s{i}") == [user(f"q{i}"), assistant(f"a{i}")]
    assert log.verify().ok


def test_a_failing_write_fails_its_caller_alone(log):
    log.flush("taken", [user("q"), assistant("a")])
    log.flush("also taken", [user("q"), assistant("a")])
    seq = log.last_seq
    calls = [
        lambda: log.flush("ok1", [user("1")]),
        lambda: log.flush("taken", [user("different")]),  # no common prefix
        lambda: log.flush("ok2", [user("2")], expected_head=EMPTY_HEAD),
        lambda: log.flush("also taken", [user("q"), assistant("a"), user("more")], expected_head=EMPTY_HEAD),
        lambda: log.flush("ok3", [user("3")]),
    ]
    results, commits = run_grouped(log, calls)
    assert commits == 1
    assert isinstance(results[1], HistoryMismatchError)
    assert isinstance(results[3], ConflictError)
    assert [r.appended for i, r in enumerate(results) if i in (0, 2, 4)] == [1, 1, 1]
    assert log.messages("taken") == log.messages("also taken") == [user("q"), assistant("a")]
    # each successful flush is whole and contiguous: open + append per new session
    new = [r for r in log.events(after=seq)]
    assert [r.seq for r in new] == list(range(seq + 1, seq + 7))
    assert [type(r.event).__name__ for r in new] == ["SessionOpened", "MessagesAppended"] * 3
    assert log.verify().ok


def test_expected_head_and_dedup_inside_one_group(log):
    # Flushes of one session take turns (each commits what it read before the next reads);
    # appends, and flushes of other sessions, share a group with them.
    base = log.flush("s", [user("q")])
    longer = [user("q"), assistant("a")]
    calls = [
        lambda: log.flush("s", longer, expected_head=base.head),
        lambda: log.append("s", [assistant("a")], expected_head=base.head),  # the same write, retried: already stored
        lambda: log.append("s", [assistant("other")], expected_head=base.head),  # stale head, not a retry
        lambda: log.flush("t", [user("q")], expected_head=EMPTY_HEAD),
    ]
    results, commits = run_grouped(log, calls)
    assert commits == 1
    assert results[0].appended == 1
    assert results[1].appended == 0 and results[1].head == results[0].head
    assert isinstance(results[2], ConflictError)
    assert results[3].appended == 1
    assert log.messages("s") == longer
    appended = [
        r.event for r in log.events() if isinstance(r.event, events.MessagesAppended) and r.event.session == "s"
    ]
    assert sum(len(e) for e in appended) == 2


def test_map_growth_during_a_group_retries_every_write(tmp_path):
    with EventLog.open(tmp_path / "l", map_size=1 << 20) as log:
        big = "x" * 50_000
        calls = [lambda i=i: log.flush(f"s{i}", [user(big + str(j)) for j in range(10)]) for i in range(6)]
        results, _ = run_grouped(log, calls)
        assert all(r.appended == 10 for r in results)
        assert log.info()["map_size"] > 1 << 20
        assert log.verify().ok


def test_a_bulk_flush_grows_a_small_map_ahead_and_runs_its_write_once(tmp_path, monkeypatch):
    runs: list[str] = []
    real = Writer.flush

    def counted(self: Writer, txn, snapshot, now=None):
        runs.append(snapshot.session_id)
        return real(self, txn, snapshot, now)

    monkeypatch.setattr(Writer, "flush", counted)
    with EventLog.open(tmp_path / "l", durability="none", map_size=1 << 20) as log:
        messages = [user("x" * 2_000 + str(i)) for i in range(1000)]  # about 2 MB: twice the map
        assert log.flush("bulk", messages).appended == 1000
        assert runs == ["bulk"]  # not run once into a full map, then again
        assert log.info()["map_size"] > 2 << 20
        assert log.verify().ok


@pytest.mark.parametrize("threads", [8])
def test_many_threads_many_flushes(tmp_path, threads):
    with EventLog.open(tmp_path / "l", durability="process") as log:
        before = log.info()

        def worker(k):
            messages = []
            for turn in range(20):
                messages += [user(f"{k}:{turn}"), assistant(f"{k}:{turn}")]
                log.flush(f"s{k}", messages)

        pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        info = log.info()
        assert info["writes"] - before["writes"] == threads * 20
        assert info["commits"] - before["commits"] <= threads * 20
        for k in range(threads):
            assert len(log.messages(f"s{k}")) == 40
        assert log.verify().ok


def test_a_body_that_fails_after_writing_leaves_nothing(log):
    store = log._store

    def writes(key: bytes, fail: bool):
        def body(txn):
            txn.put(key, b"v", db=store.meta)
            if fail:
                raise ValueError("bad batch")
            return key

        return lambda: store.write(body)

    results, commits = run_grouped(log, [writes(b"t1", False), writes(b"t2", True), writes(b"t3", False)])
    assert commits == 1
    assert results[0] == b"t1" and results[2] == b"t3"
    assert isinstance(results[1], ValueError)
    with store.read() as txn:
        assert txn.get(b"t1", db=store.meta) == b"v"
        assert txn.get(b"t2", db=store.meta) is None
        assert txn.get(b"t3", db=store.meta) == b"v"


def test_a_group_that_cannot_be_committed_fails_every_caller_in_it_and_nothing_hangs(log, monkeypatch):
    store = log._store
    real = GroupCommit._commit_group
    fired = []

    def failing_once(self, group):
        if len(group) >= 2 and not fired:
            fired.append(len(group))
            raise OSError(5, "simulated I/O error before the transaction")
        return real(self, group)

    monkeypatch.setattr(GroupCommit, "_commit_group", failing_once)
    calls = [lambda i=i: log.flush(f"s{i}", [user(f"q{i}")]) for i in range(5)]
    results, _ = run_grouped(log, calls)
    assert fired == [5]
    assert all(isinstance(r, OSError) for r in results)
    assert log.last_seq == 0  # nothing of the failed group landed
    assert log.flush("after", [user("q")]).appended == 1  # and the log still takes writes
    assert not store.group.queue and not store.group.leading


def _start_interrupted_flush(log: EventLog, monkeypatch, wake) -> tuple[threading.Thread, list]:
    """Start a flush in a thread whose wait for its turn uses ``wake()`` (where Ctrl-C lands)."""
    real_init = Request.__init__

    def init(self, body):
        real_init(self, body)
        if threading.current_thread().name == "interrupted":
            self.wake = wake()

    monkeypatch.setattr(Request, "__init__", init)
    outcome: list = []
    return _start_until_interrupted("interrupted", lambda: log.flush("gone", [user("never")]), outcome), outcome


def _start_until_interrupted(name: str, call, outcome: list) -> threading.Thread:
    """Start ``call()`` in a thread named ``name``; a KeyboardInterrupt it raises adds "interrupted" to ``outcome``."""

    def run():
        try:
            call()
        except KeyboardInterrupt:
            outcome.append("interrupted")

    t = threading.Thread(target=run, name=name)
    t.start()
    return t


def test_a_caller_interrupted_while_waiting_leaves_the_queue_working(log, monkeypatch):
    store = log._store

    class Interrupted:
        def acquire(self, blocking=True, timeout=-1):
            if blocking:
                raise KeyboardInterrupt
            return False

        def release(self):
            pass

    release = threading.Event()
    leader = threading.Thread(target=lambda: store.write(lambda txn: release.wait(10)))
    leader.start()  # a commit in flight
    deadline = time.monotonic() + 10
    while not store.group.leading and time.monotonic() < deadline:
        time.sleep(0.001)
    t, outcome = _start_interrupted_flush(log, monkeypatch, Interrupted)
    t.join(10)
    assert outcome == ["interrupted"] and not store.group.queue  # the abandoned write left the queue
    release.set()
    leader.join(10)
    later = threading.Thread(target=lambda: outcome.append(log.flush("later", [user("q")]).appended))
    later.start()
    later.join(10)
    assert outcome == ["interrupted", 1], "a write after the interrupted one never ran"
    assert "gone" not in log.sessions()


def test_a_caller_interrupted_just_as_the_lead_is_handed_to_it_passes_it_on(log, monkeypatch):
    store = log._store

    class HandedThenInterrupted:
        """The lead is handed over, and Ctrl-C arrives as the caller wakes, before it sees it."""

        def __init__(self):
            self.lock = threading.Lock()
            self.lock.acquire()

        def acquire(self, blocking=True, timeout=-1):
            self.lock.acquire()
            raise KeyboardInterrupt

        def release(self):
            self.lock.release()

    with store.group.lock:
        store.group.leading = True  # another thread's commit is in flight
    t, outcome = _start_interrupted_flush(log, monkeypatch, HandedThenInterrupted)
    deadline = time.monotonic() + 10
    while not store.group.queue and time.monotonic() < deadline:
        time.sleep(0.001)
    end_commit_in_flight(store)  # the commit in flight ends: the lead goes to the waiting caller ...
    t.join(10)  # ... who was interrupted as it woke
    assert outcome == ["interrupted"]
    assert not store.group.queue and not store.group.leading  # the lead was passed on, to nobody
    assert _within(10, lambda: log.flush("s", [user("q")]))
    assert "gone" not in log.sessions()


class _InterruptedCommits:
    """Stands in for the store's LMDB environment: the commit of a group's transaction is
    interrupted (KeyboardInterrupt, as Ctrl-C would be raised), before or after LMDB commits."""

    def __init__(self, env, *, after: bool) -> None:
        self._env, self.after, self.fired = env, after, 0

    def __getattr__(self, name):
        return getattr(self._env, name)

    def begin(self, write=False, parent=None, **kw):
        if parent is not None:
            return self._env.begin(write=write, parent=parent._txn if isinstance(parent, _Committing) else parent, **kw)
        txn = self._env.begin(write=write, **kw)
        return _Committing(txn, self) if write and not self.fired else txn


class _Committing:
    def __init__(self, txn, owner: _InterruptedCommits) -> None:
        self._txn, self._owner = txn, owner

    def __getattr__(self, name):
        return getattr(self._txn, name)

    def commit(self):
        self._owner.fired += 1
        if self._owner.after:
            self._txn.commit()
        raise KeyboardInterrupt


@pytest.mark.parametrize("after", [True, False], ids=["after-the-commit", "before-the-commit"])
def test_an_interrupt_of_the_committing_thread_is_its_own(log, monkeypatch, after):
    """Ctrl-C in the thread that commits a group stops that thread alone.  Raised as LMDB's
    commit returns, it follows writes that are stored: their callers get their results.
    Raised before, nothing was stored: the others hear so, and may retry."""
    store = log._store
    monkeypatch.setattr(store, "env", _InterruptedCommits(store.env, after=after))
    calls = [lambda i=i: log.flush(f"s{i}", [user(f"q{i}")]) for i in range(4)]
    results, _ = run_grouped(log, calls)
    monkeypatch.undo()
    assert isinstance(results[0], KeyboardInterrupt)  # the thread that led the group
    if after:
        assert [r.appended for r in results[1:]] == [1, 1, 1]
        assert [log.messages(f"s{i}") for i in range(4)] == [[user(f"q{i}")] for i in range(4)]
    else:
        for r in results[1:]:
            assert isinstance(r, EventLogError) and "nothing of it was stored" in str(r)
        assert log.last_seq == 0
        assert all(log.flush(f"s{i}", [user(f"q{i}")]).appended == 1 for i in range(4))  # retried
    assert log.flush("next", [user("q")]).appended == 1  # the chain of events goes on
    assert log.verify().ok
    assert not store.group.queue and not store.group.leading


def test_a_write_too_big_for_the_largest_map_fails_alone(tmp_path):
    """At ``max_map_size``, the write that cannot fit fails with StorageFullError; the writes
    grouped with it, which fit, are committed."""
    from eventlog import StorageFullError

    with EventLog.open(tmp_path / "l", durability="none", map_size=1 << 20, max_map_size=2 << 20) as log:
        log.flush("warm", [user("x")])
        big = [user("y" * 4000 + str(i)) for i in range(1000)]  # about 4 MB
        calls = [lambda i=i: log.flush(f"small{i}", [user(f"hello {i}")]) for i in range(3)]
        calls.insert(1, lambda: log.flush("big", big))
        results, _ = run_grouped(log, calls)
        assert isinstance(results[1], StorageFullError)
        assert [r.appended for i, r in enumerate(results) if i != 1] == [1, 1, 1]
        assert [log.messages(f"small{i}") for i in range(3)] == [[user(f"hello {i}")] for i in range(3)]
        assert "big" not in log.sessions()
        assert log.verify().ok


def test_an_interrupt_before_any_event_of_a_group_acknowledges_nothing(tmp_path, monkeypatch):
    """Ctrl-C while the committing thread zeroes space ahead (a long sync, before any event of
    the group is written) must not pass the previous group's commit off as this one's."""
    with EventLog.open(tmp_path / "synced", durability="full") as synced:
        synced.flush("before", [user("q")])  # a committed group: the store remembers its tail
        real = ZeroedSpace.extend
        fired = []

        def interrupted(self, info, commits):
            if not fired:
                fired.append(True)
                raise KeyboardInterrupt
            return real(self, info, commits)

        monkeypatch.setattr(ZeroedSpace, "extend", interrupted)
        results, _ = run_grouped(synced, [lambda i=i: synced.flush(f"s{i}", [user(f"q{i}")]) for i in range(3)])
        monkeypatch.undo()
        assert fired and isinstance(results[0], KeyboardInterrupt)
        for r in results[1:]:
            assert isinstance(r, EventLogError) and "nothing of it was stored" in str(r)
        assert synced.sessions() == ["before"]
        assert synced.verify().ok


def _interrupt_at(code, n: int, call) -> bool:
    """Run ``call()`` with a KeyboardInterrupt raised at the ``n``-th point of ``code``'s frames where
    CPython may run a signal handler (as the function starts, and as each call it makes returns);
    return whether there was an ``n``-th point."""
    import sys

    seen = [0]

    def profile(frame, event, arg):
        here = frame.f_code is code and event in ("call", "c_return")
        returning = event == "return" and frame.f_back is not None and frame.f_back.f_code is code
        if here or returning:
            seen[0] += 1
            if seen[0] == n:
                sys.setprofile(None)
                raise KeyboardInterrupt

    sys.setprofile(profile)
    try:
        call()
    except KeyboardInterrupt:
        pass
    finally:
        sys.setprofile(None)
    return seen[0] >= n


def _within(seconds: float, call) -> bool:
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(seconds)


@pytest.mark.parametrize(
    ("owner", "where"),
    [
        (GroupCommit, "write"),
        (GroupCommit, "_write"),
        (Store, "slot"),
        (GroupCommit, "_commit_group"),
    ],
)
def test_an_interrupt_anywhere_in_taking_a_turn_to_write_leaves_the_log_working(tmp_path, owner, where):
    function = getattr(owner, where)
    code = getattr(function, "__wrapped__", function).__code__  # _slot is a context manager
    n = 0
    while True:
        n += 1
        with EventLog.open(tmp_path / f"{owner.__name__}-{where}-{n}") as log:
            first = log.append("s", [user("q")])
            landed = _interrupt_at(code, n, lambda: log.append("s", [assistant("a")], expected_head=first.head))
            after_interrupt = log.messages("s")
            assert after_interrupt in ([user("q")], [user("q"), assistant("a")]), n
            # Writes, reads and close go on (nothing waits for a slot or a lead the interrupt
            # left behind), and an interrupted write is never applied later by another one.
            assert _within(10, lambda: log.append("other", [user("x")])), f"a write after interrupt point {n} hangs"
            assert log.messages("s") == after_interrupt, f"interrupt point {n}: the write was applied later"
            assert log.append("s", [assistant("a")], expected_head=first.head).head == log.head("s")
            assert log.messages("s") == [user("q"), assistant("a")]
            assert _within(10, log._store.close), f"close() after interrupt point {n} hangs"
        if not landed:
            break
    assert n > 3  # the interrupts did land


@pytest.mark.parametrize("where", ["_write", "_commit_group", "_committed"])
def test_callers_behind_an_interrupted_leader_return_and_are_told_the_truth(tmp_path, where):
    """The first caller in line leads a group of three and is interrupted at one point after
    another; the two behind it always return, told "stored" exactly when their write is."""
    code = getattr(GroupCommit, where).__code__
    n = 0
    while True:
        n += 1
        with EventLog.open(tmp_path / f"{where}-{n}", durability="none") as log:
            store = log._store
            outcome: dict[str, object] = {}
            fired = []

            def write(name, interrupt_at=None):
                import sys

                points = [0]

                def profile(frame, event, arg):
                    here = frame.f_code is code and event in ("call", "c_return")
                    if here or (event == "return" and frame.f_back is not None and frame.f_back.f_code is code):
                        points[0] += 1
                        if points[0] == interrupt_at:
                            sys.setprofile(None)
                            fired.append(True)
                            raise KeyboardInterrupt

                if interrupt_at:
                    sys.setprofile(profile)
                try:
                    outcome[name] = log.append(name, [user(name)])
                except BaseException as e:
                    outcome[name] = e
                finally:
                    sys.setprofile(None)

            with store.group.lock:
                store.group.leading = True  # a commit in flight: the three queue up in order
            threads = [threading.Thread(target=write, args=("leader", n))]
            threads += [threading.Thread(target=write, args=(name,)) for name in ("f1", "f2")]
            for t in threads:
                queued = len(store.group.queue)
                t.start()
                deadline = time.monotonic() + 10
                while len(store.group.queue) == queued and t.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.001)  # until it waits in line (or, interrupted first, has left)
            end_commit_in_flight(store)
            for t in threads:
                t.join(10)
            assert not any(t.is_alive() for t in threads), f"a caller never returned after interrupt point {n}"
            stored = set(log.sessions())
            for name in ("f1", "f2"):
                told_stored = not isinstance(outcome[name], BaseException)
                assert told_stored == (name in stored), f"interrupt point {n}: {name} told {outcome[name]!r}"
            assert _within(10, lambda: log.append("after", [user("x")]))
            # An interrupt as a transaction slot is entered leaves it counted until the
            # exception, whose traceback holds the slot's frame, is let go (the next test).
            outcome.clear()
        if not fired:
            break
    assert n > 3


def test_close_in_the_except_block_of_an_interrupt_never_waits_for_itself(tmp_path):
    import sys

    read = Store.read.__wrapped__.__code__
    outcome = []

    def agent():
        log = EventLog.open(tmp_path / "l")
        log.flush("s", [user("q")])

        def profile(frame, event, arg):  # Ctrl-C as the slot of a read is entered
            if (
                event == "return"
                and frame.f_code.co_name == "__enter__"
                and frame.f_back
                and frame.f_back.f_code is read
            ):
                sys.setprofile(None)
                raise KeyboardInterrupt

        sys.setprofile(profile)
        try:
            log.messages("s")
        except KeyboardInterrupt:
            outcome.append(log._store._active)  # the slot stays counted while the exception lives
            log.close()
            outcome.append("closed")
        finally:
            sys.setprofile(None)

    t = threading.Thread(target=agent, daemon=True)
    t.start()
    t.join(10)
    assert outcome == [1, "closed"]


def test_a_write_from_inside_a_write_on_the_same_thread_is_refused_at_once(log):
    """A signal handler that writes runs on the thread it interrupted: if that thread is inside a
    write, waiting for the write to finish would be waiting for itself."""
    log.flush("s", [user("q")])
    seen = []

    def body(txn):
        try:
            log.flush("handler", [user("from the handler")])
        except EventLogError as e:
            seen.append(str(e))
        return None

    assert _within(10, lambda: log._store.write(body)), "the nested write waited for itself"
    assert seen and "inside another write" in seen[0] and "finally" in seen[0]
    assert "handler" not in log.sessions()
    assert log.flush("handler", [user("later")]).appended == 1  # and the thread writes again afterwards


def _hold_commits_of(thread: str, store, monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the commits led by the thread named ``thread`` wait, once their transaction is
    open, until the second event is set; the first is set when one starts waiting."""
    committing, proceed = threading.Event(), threading.Event()
    run_group = store.group._run_group

    def slow_run_group(txn, group):
        if threading.current_thread().name == thread:
            committing.set()
            proceed.wait(10)
        return run_group(txn, group)

    monkeypatch.setattr(store.group, "_run_group", slow_run_group)
    return committing, proceed


def test_a_leader_interrupted_as_it_hands_over_never_leaves_the_lead_to_nobody(log, monkeypatch):
    """A commits its own write while B waits; Ctrl-C lands in A's ``finally`` as it looks for
    the caller to hand the lead to.  B, polling, leads in its place."""
    store = log._store
    committing, proceed = _hold_commits_of("A", store, monkeypatch)

    class Queue(list):
        def __getitem__(self, key):
            if key == 0 and threading.current_thread().name == "A":
                raise KeyboardInterrupt  # the hand-over: `following = queue[0]`
            return super().__getitem__(key)

    store.group.queue = Queue()
    outcome: list[str] = []
    ta = _start_until_interrupted("A", lambda: log.append("a", [user("first")]), outcome)
    assert committing.wait(10)
    tb = threading.Thread(target=log.append, args=("b", [user("second")]), name="B")
    tb.start()
    deadline = time.monotonic() + 10
    while not store.group.queue and time.monotonic() < deadline:
        time.sleep(0.001)  # B is in line
    proceed.set()
    ta.join(10)
    assert outcome == ["interrupted"] and store.group.leading  # A's write is stored, the lead left with it
    tb.join(10)
    assert not tb.is_alive(), "B waits for a lead nobody holds"
    assert (log.messages("a"), log.messages("b")) == ([user("first")], [user("second")])
    assert not store.group.queue and not store.group.leading and store.group.holder is None


def test_a_caller_interrupted_twice_while_waiting_never_leaves_the_lead_to_nobody(log, monkeypatch):
    """B waits behind A's commit; a first Ctrl-C takes B away from its wait, a second one
    lands as B leaves the queue.  A then hands the lead to B's request, which nobody waits
    for: C, writing next, must still be stored (B's write never is)."""
    store = log._store
    committing, proceed = _hold_commits_of("A", store, monkeypatch)
    outcome: list[str] = []

    class Interrupted:  # B's wake: Ctrl-C arrives while B waits
        def acquire(self, blocking=True, timeout=-1):
            outcome.append("waiting")
            raise KeyboardInterrupt

        def release(self):
            outcome.append("handed the lead")

    class Queue(list):  # the second Ctrl-C arrives as B leaves the queue
        def remove(self, item):
            if threading.current_thread().name == "B":
                outcome.append("leaving")
                raise KeyboardInterrupt
            super().remove(item)

    store.group.queue = Queue()
    b_request: list[Request] = []
    real_init = Request.__init__

    def init(self, body):
        real_init(self, body)
        if threading.current_thread().name == "B":
            self.wake = Interrupted()
            b_request.append(self)

    monkeypatch.setattr(Request, "__init__", init)

    a = threading.Thread(target=log.append, args=("a", [user("first")]), name="A")
    a.start()
    assert committing.wait(10)
    _start_until_interrupted("B", lambda: log.append("b", [user("never")]), outcome).join(10)
    assert outcome == ["waiting", "leaving", "interrupted"]
    assert b_request[0] in store.group.queue and b_request[0].abandoned  # left behind by the second interrupt
    proceed.set()
    a.join(10)
    assert not a.is_alive()
    assert outcome[-1] == "handed the lead"  # to a request nobody waits for
    assert _within(10, lambda: log.append("c", [user("next")])), "a write after the two interrupts hangs"
    assert (log.messages("a"), log.messages("c")) == ([user("first")], [user("next")])
    assert "b" not in log and log.messages("b") == []
    assert not store.group.queue and not store.group.leading


def _hand_over_cut_short(log: EventLog, monkeypatch, cut) -> int:
    """A leads and commits its own write while B and C wait behind it, one write per commit;
    ``cut(store, requests)`` makes the interrupt land in A's hand-over.  B and C each hold
    their commit for longer than a waiter's poll, so that a waiter taking over from a live
    leader would be seen.  Returns the most commits led at once."""
    store = log._store
    store.group.max_group = 1
    committing, proceed = _hold_commits_of("A", store, monkeypatch)
    requests: dict[str, Request] = {}
    real_init = Request.__init__

    def init(self, body):
        real_init(self, body)
        requests[threading.current_thread().name] = self

    monkeypatch.setattr(Request, "__init__", init)
    cut(store, requests)
    leading, most, count = [0], [0], threading.Lock()
    commit_group = store.group._commit_group

    def counted(group):
        with count:
            leading[0] += 1
            most[0] = max(most[0], leading[0])
        try:
            if threading.current_thread().name != "A":
                time.sleep(3 * WAKE_POLL)
            return commit_group(group)
        finally:
            with count:
                leading[0] -= 1

    monkeypatch.setattr(store.group, "_commit_group", counted)
    outcome: dict[str, object] = {}

    def write(name):
        try:
            outcome[name] = log.append(name, [user(name)])
        except BaseException as e:
            outcome[name] = e

    threads = {name: threading.Thread(target=write, args=(name,), name=name, daemon=True) for name in "ABC"}
    threads["A"].start()
    assert committing.wait(10)
    for name in "BC":
        threads[name].start()
        deadline = time.monotonic() + 10
        while name not in requests or requests[name] not in store.group.queue:
            assert time.monotonic() < deadline, f"{name} never queued"
            time.sleep(0.001)
    proceed.set()
    for name, t in threads.items():
        t.join(10)
        assert not t.is_alive(), f"{name} waits for a lead nobody holds"
    assert isinstance(outcome["A"], KeyboardInterrupt)  # the interrupt is A's own; its write is stored
    assert [log.messages(name) for name in "ABC"] == [[user(name)] for name in "ABC"]
    assert not store.group.queue and not store.group.leading and store.group.holder is None
    return most[0]


def test_a_leader_interrupted_as_it_names_the_next_leader_leaves_one_leader(log, monkeypatch):
    """The interrupt lands as A names B the holder of the lead: B and C both look, one leads,
    and the other waits for it (it does not take over from a live leader)."""

    def cut(store, requests):
        def get(self):
            return self.__dict__["holder"]

        def put(self, value):
            if threading.current_thread().name == "A" and value is not None and value is not requests["A"]:
                raise KeyboardInterrupt  # the hand-over: `self.holder = following`
            self.__dict__["holder"] = value

        monkeypatch.setattr(GroupCommit, "holder", property(get, put), raising=False)

    assert _hand_over_cut_short(log, monkeypatch, cut) == 1, "two callers led at once"


def test_a_caller_named_leader_whose_lead_was_never_set_takes_it(log, monkeypatch):
    """The interrupt lands after A names B the holder, as it sets B's lead: B, polling, finds
    itself named and leads; C does not take over from it."""

    class LeadCutShort(Request):
        __slots__ = ()

        @property
        def lead(self):
            return Request.lead.__get__(self, Request)

        @lead.setter
        def lead(self, value):
            if value and threading.current_thread().name == "A":
                raise KeyboardInterrupt  # the hand-over: `following.lead = True`
            Request.lead.__set__(self, value)

    def cut(store, requests):
        real_init = Request.__init__

        def init(self, body):
            real_init(self, body)
            if threading.current_thread().name == "B":
                self.__class__ = LeadCutShort

        monkeypatch.setattr(Request, "__init__", init)

    assert _hand_over_cut_short(log, monkeypatch, cut) == 1, "two callers led at once"


def test_a_request_is_named_holder_before_its_lead_is_set(log, monkeypatch):
    """The hand-over names the next holder before it sets that caller's lead: an interrupt
    between the two leaves the lead with nobody (a waiter takes it over) rather than with a
    caller that is not named holder (a waiter would take over from the holder that is done,
    and lead beside it).  Looked at directly, before any waiter can move the lead."""
    store = log._store
    committing, proceed = _hold_commits_of("A", store, monkeypatch)
    requests: dict[str, Request] = {}
    gate = threading.Event()  # B looks at nothing until the test has looked

    class Gated:
        def __init__(self):
            self.real = threading.Lock()
            self.real.acquire()

        def acquire(self, blocking=True, timeout=-1):
            gate.wait(10)
            return self.real.acquire(blocking, timeout)

        def release(self):
            self.real.release()

    real_init = Request.__init__

    def init(self, body):
        real_init(self, body)
        requests[threading.current_thread().name] = self
        if threading.current_thread().name == "B":
            self.wake = Gated()

    monkeypatch.setattr(Request, "__init__", init)

    def get(self):
        return self.__dict__["holder"]

    def put(self, value):
        if threading.current_thread().name == "A" and value is not None and value is requests.get("B"):
            raise KeyboardInterrupt  # the hand-over: `self.holder = following`
        self.__dict__["holder"] = value

    monkeypatch.setattr(GroupCommit, "holder", property(get, put), raising=False)
    outcome: list[str] = []
    a = _start_until_interrupted("A", lambda: log.append("a", [user("first")]), outcome)
    assert committing.wait(10)
    b = threading.Thread(target=log.append, args=("b", [user("second")]), name="B")
    b.start()
    deadline = time.monotonic() + 10
    while "B" not in requests or requests["B"] not in store.group.queue:
        assert time.monotonic() < deadline, "B never queued"
        time.sleep(0.001)
    proceed.set()
    a.join(10)
    assert outcome == ["interrupted"]
    assert store.group.holder is requests["A"] and requests["A"].done
    assert not requests["B"].lead, "B leads while the holder named is A, which is done: a waiter would lead too"
    gate.set()
    b.join(10)
    assert not b.is_alive(), "B waits for a lead nobody holds"
    assert (log.messages("a"), log.messages("b")) == ([user("first")], [user("second")])
    assert not store.group.queue and not store.group.leading and store.group.holder is None
