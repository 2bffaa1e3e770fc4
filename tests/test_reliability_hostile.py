"""Hostile neighbours: directories other users can write, planted symlinks and files.

Whoever can write a log's directory could plant a link where the log creates a file, and
make a process (often root) write through it.  The log refuses such a directory unless the
caller trusts it, creates its files without following links, and never writes a file it
did not create itself.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.errors import UnsafeDirectoryError
from eventlog.spill import SpillingWriter, recover, spill_name, write_spill

VICTIM = b"precious contents of a file the attacker wants overwritten\n"


def _shared(path: Path, mode: int = 0o777) -> Path:
    path.mkdir()
    os.chmod(path, mode)
    return path


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o1777])
def test_a_log_directory_other_users_can_write_is_refused_unless_trusted(tmp_path: Path, mode: int) -> None:
    path = _shared(tmp_path / "log", mode)
    with pytest.raises(UnsafeDirectoryError, match="other users can write"):
        EventLog.open(path)
    with pytest.raises(UnsafeDirectoryError):
        EventLog.open(path, readonly=True)
    assert sorted(os.listdir(path)) == []  # nothing was created before the refusal
    with EventLog.open(path, allow_shared_directory=True) as log:
        log.flush("s", [{"role": "user", "content": "hi"}])
    assert isinstance(UnsafeDirectoryError("x"), PermissionError)


def test_a_log_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("changing a directory's owner needs root")
    path = tmp_path / "log"
    path.mkdir(mode=0o755)
    os.chown(path, 54321, 54321)
    with pytest.raises(UnsafeDirectoryError, match="belongs to user 54321"):
        EventLog.open(path)


@pytest.mark.parametrize("name", ["lock.mdb", "data.mdb"])
def test_a_planted_symlink_for_a_log_file_is_refused_and_its_target_untouched(tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    path = _shared(tmp_path / "log")
    (path / name).symlink_to(victim)
    with pytest.raises(UnsafeDirectoryError, match="symbolic link"):
        EventLog.open(path, allow_shared_directory=True)
    assert victim.read_bytes() == VICTIM


def test_a_planted_symlink_for_the_lock_of_an_existing_log_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    path = _shared(tmp_path / "log")
    with EventLog.open(path, allow_shared_directory=True) as log:
        log.flush("s", [{"role": "user", "content": "hi"}])
    (path / "lock.mdb").unlink()
    (path / "lock.mdb").symlink_to(victim)
    for readonly in (False, True):
        with pytest.raises(UnsafeDirectoryError):
            EventLog.open(path, allow_shared_directory=True, readonly=readonly)
    assert victim.read_bytes() == VICTIM


def test_a_planted_hard_link_or_foreign_file_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    path = _shared(tmp_path / "log")
    os.link(victim, path / "lock.mdb")
    with pytest.raises(UnsafeDirectoryError, match="not a plain file"):
        EventLog.open(path, allow_shared_directory=True)
    assert victim.read_bytes() == VICTIM


def test_a_planted_link_at_the_marker_or_its_temporary_names_is_never_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    path = _shared(tmp_path / "log")
    (path / "eventlog.id").symlink_to(victim)
    with pytest.raises(UnsafeDirectoryError, match="symbolic link"):
        EventLog.open(path, allow_shared_directory=True)
    (path / "eventlog.id").unlink()
    # Every temporary name an attacker could guess, built from pids.
    for pid in range(os.getpid() - 50, os.getpid() + 50):
        (path / f"eventlog.id.{pid}.tmp").symlink_to(victim)
        (path / f".eventlog.id.{pid}.tmp").symlink_to(victim)
    with EventLog.open(path, allow_shared_directory=True) as log:
        log.flush("s", [{"role": "user", "content": "hi"}])
        log_id = log.id
    assert victim.read_bytes() == VICTIM
    assert not (path / "eventlog.id").is_symlink() and (path / "eventlog.id").read_text().strip() == log_id


def test_a_spill_directory_other_users_can_write_is_refused_for_spilling_and_recovery(tmp_path: Path) -> None:
    spill = _shared(tmp_path / "spill")
    log = EventLog.open(tmp_path / "log")
    log.close()  # unreachable: every flush spills
    with pytest.raises(UnsafeDirectoryError):
        SpillingWriter(log, spill).flush("s", [{"role": "user", "content": "hi"}])
    assert (
        SpillingWriter(log, spill, allow_shared_directory=True).flush("s", [{"role": "user", "content": "hi"}]).spilled
    )
    # A spill file another user planted would be written into the log by recover().
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(UnsafeDirectoryError):
            recover(log, spill)
        assert "s" not in log.sessions()
        assert recover(log, spill, allow_shared_directory=True).recovered == ["s"]


def test_a_planted_link_in_a_trusted_spill_directory_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    spill = _shared(tmp_path / "spill")
    (spill / spill_name("s")).symlink_to(victim)
    header = {"session": "s", "messages": 0, "replace": True}
    write_spill(spill, "s", [header], allow_shared_directory=True)
    assert victim.read_bytes() == VICTIM
    assert not (spill / spill_name("s")).is_symlink()


def test_a_new_spill_directory_is_private(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "log")
    log.close()
    outcome = SpillingWriter(log, tmp_path / "spill").flush("s", [{"role": "user", "content": "hi"}])
    assert outcome.spilled
    assert (tmp_path / "spill").stat().st_mode & 0o077 == 0
