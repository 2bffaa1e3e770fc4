"""The snapshot cache: what a re-flush costs, counted in hashing work rather than time."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

import eventlog.snapshot
from eventlog import EventLog


class _Counter:
    """Counts the SHA-256 computations ``eventlog.snapshot`` makes (each one hashes a message
    body or chains a node digest): the work a flush does to tell what changed."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, data: bytes = b"") -> Any:
        self.calls += 1
        return hashlib.sha256(data)


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> _Counter:
    counter = _Counter()
    monkeypatch.setattr(eventlog.snapshot, "sha256", counter)
    return counter


def _transcript(n: int) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"message {i}"} for i in range(n)]


@pytest.mark.parametrize("trust", [False, True])
def test_a_session_within_the_cache_is_not_hashed_again(tmp_path: Path, hashes: _Counter, trust: bool) -> None:
    with EventLog.open(tmp_path / "log", cache_messages=1_000, trust_identity=trust) as log:
        messages = _transcript(500)
        log.flush("s", messages)
        log.flush("s", messages)  # the second flush takes the copies a default-mode check compares
        hashes.calls = 0
        log.flush("s", messages)
        assert hashes.calls == 0
        messages.append({"role": "user", "content": "one more"})
        log.flush("s", messages)
        assert hashes.calls == 2  # its content digest and its node digest


@pytest.mark.parametrize("trust", [False, True])
def test_a_session_longer_than_the_cache_is_hashed_only_beyond_the_cache(
    tmp_path: Path, hashes: _Counter, trust: bool
) -> None:
    limit, length = 1_000, 1_500
    with EventLog.open(tmp_path / "log", cache_messages=limit, trust_identity=trust) as log:
        messages = _transcript(length)
        log.flush("s", messages)
        log.flush("s", messages)  # the second flush takes the copies a default-mode check compares
        hashes.calls = 0
        result = log.flush("s", messages)
        assert result.appended == 0
        # Trust mode holds no copies: nothing to hash.  The default mode keeps copies of the
        # session's last `limit` positions and checks the others by hashing their bodies once.
        assert hashes.calls == (0 if trust else length - limit)
        hashes.calls = 0
        messages.append({"role": "user", "content": "one more"})
        assert log.flush("s", messages).appended == 1
        assert hashes.calls == (2 if trust else length - limit + 2)


def test_an_in_place_edit_beyond_the_cache_is_still_recorded(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log", cache_messages=100) as log:
        messages = _transcript(250)
        log.flush("s", messages)
        log.flush("s", messages)
        for position in (3, 120, 240):  # before, at and inside the cached tail
            messages[position]["content"] = f"edited {position}"
            result = log.flush("s", messages)
            assert result.tombstoned == 250 - position and result.unchanged == position
            assert log.messages("s")[position]["content"] == f"edited {position}"
        assert [o.tombstone.reason for o in log.history("s") if o.tombstone][:1] == ["edit"]
        assert log.verify().ok


def test_the_cache_bound_is_kept_with_a_session_longer_than_it(tmp_path: Path) -> None:
    cache = eventlog.snapshot.SnapshotCache(100)
    with EventLog.open(tmp_path / "log", cache_messages=100) as log:
        log._cache = cache
        log.flush("short", _transcript(10))
        messages = _transcript(250)
        log.flush("long", messages)
        log.flush("long", messages)
        entry = cache.get("long")
        assert entry is not None
        copied = [c for c in entry.copies if c is not eventlog.snapshot.DROPPED]
        assert len(copied) == 100 and entry.copies[-1] is not eventlog.snapshot.DROPPED
        assert cache.get("short") is None  # the long session's tail uses the whole budget
