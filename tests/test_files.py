"""The one atomic-file helper: whole or not at all, permissions kept, nothing left behind."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog.files import write_atomic


def test_a_write_that_fails_midway_leaves_the_previous_file_and_no_partial_one(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    write_atomic(target, [b"old\n"])

    def failing() -> Iterator[bytes]:
        yield b"new\n"
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(target, failing())
    assert target.read_bytes() == b"old\n"
    assert sorted(os.listdir(tmp_path)) == ["out.jsonl"]


def test_an_existing_file_keeps_its_permissions_and_a_new_one_gets_the_mode_asked(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.write_bytes(b"x")
    kept.chmod(0o640)
    write_atomic(kept, [b"y"])
    assert kept.read_bytes() == b"y" and stat.S_IMODE(kept.stat().st_mode) == 0o640
    private = tmp_path / "private"
    write_atomic(private, [b"z"], mode=0o600)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    write_atomic(private, [b"again"], mode=0o644)  # the file exists: its permissions win
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
