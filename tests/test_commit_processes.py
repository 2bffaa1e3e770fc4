"""Commits from many processes: when a ``full`` commit is synced, and SIGKILLs of many writers.

In ``full`` mode LMDB syncs a commit's data pages under its writer lock and the log syncs the
meta page once the lock is released (``GroupCommit._sync_meta``), so that other processes'
commits need not wait for it.  A write must still be acknowledged only after that sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from crashkit import load_script
from factories import user

from eventlog import EventLog

harness = load_script("crash_harness")


class _Recorded:
    """A transaction whose commit is written down in ``calls`` (everything else goes through)."""

    def __init__(self, txn: Any, calls: list[str]) -> None:
        self._txn = txn
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._txn, name)

    def commit(self) -> None:
        self._txn.commit()
        self._calls.append("commit")


class _RecordingEnvironment:
    """The store's real LMDB environment, with its write commits and syncs written down in order."""

    def __init__(self, env: Any) -> None:
        self._env = env
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def begin(self, write: bool = False, **kwargs: Any) -> Any:
        txn = self._env.begin(write=write, **kwargs)
        return _Recorded(txn, self.calls) if write and "parent" not in kwargs else txn

    def sync(self, force: bool = False) -> None:
        self._env.sync(force)
        self.calls.append("sync")


@pytest.mark.parametrize(("durability", "expected"), [("full", ["commit", "sync"]), ("process", ["commit"])])
def test_a_full_commit_is_synced_after_the_writer_lock_and_before_it_is_acknowledged(
    tmp_path: Path, durability: str, expected: list[str]
) -> None:
    with EventLog.open(tmp_path / "log", durability=durability) as log:
        store: Any = log._store
        # LMDB syncs only the data pages itself: the meta page is the log's to sync.
        assert not store.env.flags()["metasync"]
        recording = _RecordingEnvironment(store.env)
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
