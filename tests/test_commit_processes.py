"""Commits from many processes: when a ``full`` commit is synced, and SIGKILLs of many writers.

In ``full`` mode LMDB syncs a commit's data pages under its writer lock and each caller syncs
the meta page once the lock is released (``GroupCommit._make_durable``), so that other
processes' commits need not wait for it.  A write must still be acknowledged only after a sync
begun after its commit.
"""

from __future__ import annotations

import itertools
import threading
from pathlib import Path
from typing import Any

import pytest
from crashkit import load_script
from factories import user

from eventlog import EventLog

harness = load_script("crash_harness")


class _Recorded:
    """A transaction whose commit is written down (everything else goes through)."""

    def __init__(self, txn: Any, env: _RecordingEnvironment) -> None:
        self._txn = txn
        self._env = env

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def commit(self) -> None:
        self._txn.commit()
        self._env.calls.append("commit")
        self._env.commits.append((next(self._env.clock), self._env.tip.pending[0]))


class _RecordingEnvironment:
    """The store's real LMDB environment, with its write commits and syncs written down in order.

    ``commits``: (time, seq of the commit's last event); ``syncs``: (time begun, time done), on
    ``clock``, which ticks at each record."""

    def __init__(self, store: Any) -> None:
        self._env = store.env
        self.tip = store.tip
        self.calls: list[str] = []
        self.clock = itertools.count()
        self.commits: list[tuple[int, int]] = []
        self.syncs: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def begin(self, write: bool = False, parent: Any = None, **kwargs: Any) -> Any:
        if parent is not None:  # a nested transaction of a group: not a commit of the log
            return self._env.begin(write=write, parent=parent._txn, **kwargs)
        txn = self._env.begin(write=write, **kwargs)
        return _Recorded(txn, self) if write else txn

    def sync(self, force: bool = False) -> None:
        began = next(self.clock)
        self._env.sync(force)
        self.syncs.append((began, next(self.clock)))
        self.calls.append("sync")


@pytest.mark.parametrize(("durability", "expected"), [("full", ["commit", "sync"]), ("process", ["commit"])])
def test_a_full_commit_is_synced_after_the_writer_lock_and_before_it_is_acknowledged(
    tmp_path: Path, durability: str, expected: list[str]
) -> None:
    with EventLog.open(tmp_path / "log", durability=durability) as log:
        store: Any = log._store
        # LMDB syncs only the data pages itself: the meta page is the log's to sync.
        assert not store.env.flags()["metasync"]
        recording = _RecordingEnvironment(store)
        store.env = recording
        try:
            log.flush("s", [user("one")])
            acknowledged = list(recording.calls)
            log.flush("s", [user("one"), user("two")])
        finally:
            store.env = recording._env
        assert acknowledged == expected
        assert recording.calls == expected * 2
    with EventLog.open(tmp_path / "log") as log:
        assert [m["content"] for m in log.messages("s")] == ["one", "two"]


def test_writes_of_many_threads_are_acknowledged_only_after_a_sync_begun_after_their_commit(tmp_path: Path) -> None:
    """Each caller syncs after its own commit, with the lead passed on, so the next group commits
    during the sync; one sync stands for every commit made before it began, and for no other."""
    with EventLog.open(tmp_path / "log") as log:
        store: Any = log._store
        recording = _RecordingEnvironment(store)
        acks: list[tuple[int, int, str]] = []
        barrier = threading.Barrier(8)

        def writer(w: int) -> None:
            messages: list[dict[str, object]] = []
            barrier.wait()
            for turn in range(15):
                messages.append(user(f"{w}/{turn}"))
                result = log.flush(f"s{w}", messages)
                acks.append((next(recording.clock), result.seq, f"s{w}"))

        store.env = recording
        try:
            threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        finally:
            store.env = recording._env
        assert len(acks) == 8 * 15
        for acked, seq, session in acks:
            committed = next(time for time, last in recording.commits if last >= seq)
            assert any(committed < began and done < acked for began, done in recording.syncs), (
                f"a write of {session} (event {seq}) was acknowledged before a sync that followed its commit"
            )
        assert store.grouped_writes > store.commits  # the threads did share commits
    with EventLog.open(tmp_path / "log") as log:
        assert all(len(log.messages(f"s{w}")) == 15 for w in range(8))


def test_many_writer_processes_killed_mid_commit_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Eight writer processes, one session each, contend for LMDB's writer lock while they are
    SIGKILLed at random: every acknowledged message is stored once, at its place."""
    result = harness.run(
        tmp_path, durability="full", kills=16, writers=8, sessions_per_writer=1, seed=21, max_delay=0.08
    )
    assert result.ok, result.problems
    assert result.kills == 16
    assert result.mid_write_kills >= result.writer_kills // 2 > 0
    assert result.messages_acked > 100


def test_carriers_killed_while_committing_other_processes_flushes_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    """Half the kills go to the writer committing the others' flushes (eventlog/relay.py): its
    senders hear nothing, or an answer cut short, and write their flushes themselves."""
    result = harness.run(
        tmp_path, durability="full", kills=16, writers=4, sessions_per_writer=2, seed=22, max_delay=0.1, carriers=0.5
    )
    assert result.ok, result.problems
    assert result.carrier_kills >= 3
    assert result.relayed_acks > 50


def test_a_list_found_stored_by_another_process_is_synced_before_the_flush_returns(tmp_path: Path) -> None:
    """The commit that stored it may be another process's whose meta page that process has not
    synced yet: a flush that writes nothing still returns only once those events are synced, and
    only the first time (events this process knows are synced need nothing)."""
    from crashkit import run_python

    path = tmp_path / "log"
    done = run_python(
        """
        import sys
        from eventlog import EventLog
        with EventLog.open(sys.argv[1], relay=False) as log:
            log.flush("s", [{"role": "user", "content": "from another process"}])
        """,
        str(path),
    )
    assert done.returncode == 0, done.stderr
    with EventLog.open(path, relay=False) as log:
        store = log._store
        recording = _RecordingEnvironment(store)
        store.env = recording
        listed = [user("from another process")]
        assert log.flush("s", listed).appended == 0
        assert recording.calls == ["sync"]  # nothing written, one sync
        assert log.flush("s", listed).appended == 0
        assert recording.calls == ["sync"]  # known synced now: none
        log.flush("s", [*listed, user("mine")])
        assert recording.calls[1:] == ["commit", "sync"]
        assert log.flush("s", [*listed, user("mine")]).appended == 0
        assert recording.calls[3:] == []  # its own commit was synced before it returned
