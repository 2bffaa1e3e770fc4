"""Storage faults: full map, full disk, read-only file system, damaged files, replaced directories.

Each fault must give a clear, distinct error (or be recovered from), leave no partial
event behind, and never turn into a silent wrong answer.  Disk-full and read-only
tests mount a small tmpfs and skip where mounting is not permitted.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import lmdb
import pytest
from crashkit import raw_env, raw_events, run_python

from eventlog import CorruptLogError, EventLog, EventLogError, ReadOnlyError, StorageFullError


def _big(i: int, size: int = 50_000) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": f"call{i}", "content": f"{i} " + "y" * size}


def _fill(log: EventLog, session: str, transcript: list[dict[str, object]], size: int = 50_000) -> EventLogError:
    """Flush ever longer transcripts until the log refuses; check the refused flush left nothing."""
    for i in range(10_000):
        transcript.append(_big(i, size))
        before = log.last_seq
        try:
            log.flush(session, transcript)
        except EventLogError as e:
            transcript.pop()
            assert log.last_seq == before, "a failed flush left an event behind"
            assert len(log.messages(session)) == len(transcript)
            return e
    raise AssertionError("the log never filled up")


# -- the map's configured maximum -------------------------------------------------


def test_max_map_size_reached_is_storage_full_and_the_log_stays_intact(tmp_path: Path) -> None:
    path = tmp_path / "log"
    transcript: list[dict[str, object]] = []
    with EventLog.open(path, map_size=1 << 20, max_map_size=2 << 20) as log:
        error = _fill(log, "s", transcript, size=20_000)
        assert isinstance(error, StorageFullError)
        assert "maximum size" in str(error)
        assert log.verify().ok
        stored = log.messages("s")
        # Still full for big writes with the same limit, reopened or not.
        with pytest.raises(StorageFullError):
            log.flush("s", [*transcript, _big(-1, 30_000)])
    with EventLog.open(path, max_map_size=2 << 20) as log:
        assert log.messages("s") == stored
        with pytest.raises(StorageFullError):
            log.flush("s", [*transcript, _big(-1, 30_000)])
    # Raising the limit makes it writable again.
    with EventLog.open(path, max_map_size=8 << 20) as log:
        assert log.flush("s", [*transcript, _big(-1, 30_000)]).appended == 1
        assert log.verify().ok


# -- a small file system: disk full, read-only ------------------------------------


@pytest.fixture
def tmpfs(mount_tmpfs: Callable[[str], Path]) -> Path:
    """A 3 MiB tmpfs mounted for this test, or a skip where mounting is not permitted."""
    return mount_tmpfs("3m")


def _remount(mountpoint: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mountpoint)], check=True, capture_output=True, timeout=20)


def test_disk_full_leaves_no_partial_event_and_the_next_write_after_freeing_space_succeeds(tmpfs: Path) -> None:
    filler = tmpfs / "filler"
    filler.write_bytes(b"x" * 1_000_000)
    transcript: list[dict[str, object]] = []
    with EventLog.open(tmpfs / "log") as log:
        error = _fill(log, "s", transcript)
        assert isinstance(error, EventLogError)
        assert log.verify().ok
        filler.unlink()
        transcript.append({"role": "user", "content": "after the disk had room again"})
        assert log.flush("s", transcript).appended == 1
        assert log.verify().ok
    with EventLog.open(tmpfs / "log") as log:
        assert [m["content"] for m in log.messages("s")] == [m["content"] for m in transcript]


def test_disk_full_is_a_storage_full_error(tmpfs: Path) -> None:
    (tmpfs / "filler").write_bytes(b"x" * 1_000_000)
    with EventLog.open(tmpfs / "log") as log:
        error = _fill(log, "s", [])
    assert isinstance(error, StorageFullError), f"{type(error).__name__}: {error}"


def test_read_only_file_system_is_a_read_only_error_and_reads_still_work(tmpfs: Path) -> None:
    path = tmpfs / "log"
    transcript = [{"role": "user", "content": "hello"}]
    with EventLog.open(path) as log:
        log.flush("s", transcript)
    _remount(tmpfs, "ro")
    try:
        with pytest.raises(ReadOnlyError):
            EventLog.open(path)
        with EventLog.open(path, readonly=True) as log:
            assert log.messages("s") == transcript
            assert log.verify().ok
    finally:
        _remount(tmpfs, "rw")
    with EventLog.open(path) as log:
        assert log.flush("s", [*transcript, {"role": "assistant", "content": "hi"}]).appended == 1
        assert log.verify().ok


# -- damaged files -----------------------------------------------------------------


def _small_log(path: Path) -> dict[str, list[dict[str, object]]]:
    """A few sessions with appends, a rewind, an edit, a fork and metadata; returns the live transcripts."""
    with EventLog.open(path) as log:
        a = [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]
        log.flush("a", a)
        log.flush("a", [*a, {"role": "user", "content": "more"}])
        log.flush("a", [a[0], {"role": "assistant", "content": "better answer"}])
        log.fork("a", "b", at=1)
        log.flush("b", [a[0], {"role": "assistant", "content": "in b", "tool_calls": [{"id": "c1"}]}])
        log.update_session("a", title="t", input_tokens=3)
        log.close_session("b", reason="done")
        return {s: log.messages(s) for s in log.sessions()}


def _put_event(path: Path, key: bytes, value: bytes, *, delete: bytes | None = None) -> None:
    env = raw_env(path)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"events", txn=txn)
            if delete is not None:
                txn.delete(delete, db=db)
            txn.put(key, value, db=db)
    finally:
        env.close()


def _undetected_changes(path: Path, events: list[tuple[bytes, bytes]]) -> tuple[int, list[tuple[int, int]]]:
    """Flip one bit at a time in ``events``; return how many changes were tried and the (seq, byte) verify missed."""
    rng = random.Random(0)
    missed: list[tuple[int, int]] = []
    checked = 0
    for key, value in events:
        # Every byte of small events; a sample of 64 positions of larger ones.
        positions = range(len(value)) if len(value) <= 160 else sorted(rng.sample(range(len(value)), 64))
        for i in positions:
            changed = bytearray(value)
            changed[i] ^= 1 << rng.randrange(8)
            _put_event(path, key, bytes(changed))
            try:
                with EventLog.open(path) as log:
                    if log.verify().ok:
                        missed.append((int.from_bytes(key, "big"), i))
            finally:
                _put_event(path, key, value)
            checked += 1
    with EventLog.open(path) as log:
        assert log.verify().ok
    return checked, missed


def test_verify_finds_any_changed_byte_in_an_event_before_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _small_log(path)
    events = raw_events(path)
    assert len(events) >= 8
    checked, missed = _undetected_changes(path, events[:-1])
    assert not missed, f"verify() missed changed bytes (seq, offset): {missed[:20]}"
    assert checked > 500


def test_verify_finds_any_changed_byte_in_the_newest_event(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _small_log(path)
    _, missed = _undetected_changes(path, raw_events(path)[-1:])
    assert not missed, f"verify() missed changed bytes (seq, offset): {missed[:20]}"


def test_verify_finds_the_newest_event_removed(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("a", [{"role": "user", "content": "q"}])
        log.update_session("a", title="the newest event")
    key, _ = raw_events(path)[-1]
    env = raw_env(path)
    with env.begin(write=True) as txn:
        txn.delete(key, db=env.open_db(b"events", txn=txn))
    env.close()
    with EventLog.open(path) as log:
        assert not log.verify().ok


def test_verify_finds_a_removed_or_reordered_event(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _small_log(path)
    events = raw_events(path)
    (k3, v3), (k4, v4) = events[2], events[3]
    _put_event(path, k3, v4)
    _put_event(path, k4, v3)
    with EventLog.open(path) as log:
        assert not log.verify().ok
    _put_event(path, k3, v3)
    _put_event(path, k4, v4)
    env = raw_env(path)
    with env.begin(write=True) as txn:
        txn.delete(k4, db=env.open_db(b"events", txn=txn))
    env.close()
    with EventLog.open(path) as log:
        assert not log.verify().ok


def test_verify_reports_a_malformed_event_key(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _small_log(path)
    (key, value) = raw_events(path)[-1]
    _put_event(path, key[:7], value, delete=key)
    with EventLog.open(path) as log:
        report = log.verify()
    assert not report.ok


def _body_event(path: Path, marker: bytes) -> tuple[bytes, bytes, int]:
    for key, value in raw_events(path):
        at = value.find(marker)
        if at >= 0:
            return key, value, at
    raise AssertionError(f"{marker!r} not found in any event")


def test_a_changed_body_is_never_returned_as_the_message(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _small_log(path)
    key, value, at = _body_event(path, b"better answer")
    _put_event(path, key, value[:at] + b"B" + value[at + 1 :])
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError):
            log.messages("a")


def test_a_body_that_no_longer_decodes_is_a_corrupt_log_error(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _small_log(path)
    key, value, at = _body_event(path, b"better answer")
    # 0xc1 is never valid MessagePack; put it where a str's first byte was.
    _put_event(path, key, value[:at] + b"\xff" + value[at + 1 :])
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError):
            log.messages("a")


PROBE = """
import json, sys
from eventlog import EventLog, EventLogError
try:
    with EventLog.open(sys.argv[1]) as log:
        report = log.verify()
        found = {s: log.messages(s) for s in log.sessions()}
        print(json.dumps({"verify": report.ok, "messages": found, "id": log.id}))
except EventLogError as e:
    print(json.dumps({"error": type(e).__name__, "text": str(e)}))
"""


def _probe(path: Path) -> tuple[int, dict[str, object]]:
    """Open, verify and read a damaged log in a child (LMDB may crash the process on some damage)."""
    done = run_python(PROBE, str(path), timeout=60)
    return done.returncode, (
        json.loads(done.stdout) if done.returncode == 0 and done.stdout else {"stderr": done.stderr[-500:]}
    )


def test_a_truncated_data_file_is_a_clear_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        for i in range(150):
            log.flush("s", [{"role": "user", "content": f"m{j}"} for j in range(i + 1)])
    data = path / "data.mdb"
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=8)
    in_use = (env.info()["last_pgno"] + 1) * env.stat()["psize"]  # the file may be longer: zeroed ahead
    env.close()
    os.truncate(data, in_use // 2)
    code, outcome = _probe(path)
    assert code == 0, f"the reading process died with {code}"
    assert outcome.get("error") == "CorruptLogError"


def test_a_data_file_truncated_to_nothing_is_not_silently_a_new_empty_log(tmp_path: Path) -> None:
    path = tmp_path / "log"
    before = _small_log(path)
    os.truncate(path / "data.mdb", 0)
    code, outcome = _probe(path)
    assert code == 0
    assert "error" in outcome or outcome.get("messages") == before


def test_random_damage_to_the_data_file_never_gives_a_silent_wrong_answer(tmp_path: Path) -> None:
    """Flip random bits in a copy of data.mdb: an error, a failed verify() or the true answer."""
    source = tmp_path / "source"
    expected = _small_log(source)
    with EventLog.open(source) as log:
        for i in range(60):
            log.flush("c", [{"role": "user", "content": f"filler {j} " + "z" * 100} for j in range(i + 1)])
        expected = {s: log.messages(s) for s in log.sessions()}
    size = (source / "data.mdb").stat().st_size
    rng = random.Random(1)
    outcomes: dict[str, int] = {}
    for trial in range(24):
        copy = tmp_path / f"t{trial}"
        shutil.copytree(source, copy)
        with open(copy / "data.mdb", "r+b") as f:
            for _ in range(rng.choice([1, 4, 16])):
                offset = rng.randrange(size)
                f.seek(offset)
                byte = f.read(1)[0]
                f.seek(offset)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        code, outcome = _probe(copy)
        if code != 0:
            kind = "crashed" if code < 0 else "raised a non-EventLogError"
        elif "error" in outcome:
            kind = "error"
        elif not outcome["verify"]:
            kind = "verify reports"
        else:
            assert outcome["messages"] == expected, f"trial {trial}: verify() ok but the transcripts changed"
            kind = "unchanged"
        outcomes[kind] = outcomes.get(kind, 0) + 1
        shutil.rmtree(copy)
    assert "crashed" not in outcomes, outcomes
    assert outcomes.get("verify reports", 0) + outcomes.get("error", 0) > 0, outcomes


def test_a_garbage_or_missing_lock_file_left_by_dead_processes_is_recovered(tmp_path: Path) -> None:
    path = tmp_path / "log"
    expected = _small_log(path)
    (path / "lock.mdb").write_bytes(os.urandom(8192))
    with EventLog.open(path) as log:
        assert {s: log.messages(s) for s in log.sessions()} == expected
        log.flush("a", [*expected["a"], {"role": "user", "content": "after"}])
        assert log.verify().ok
    (path / "lock.mdb").unlink()
    with EventLog.open(path) as log:
        assert len(log.messages("a")) == len(expected["a"]) + 1


def test_a_log_directory_replaced_under_a_running_process_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as running:
        running.flush("s", [{"role": "user", "content": "one"}])
        shutil.rmtree(path)
        with EventLog.open(path) as replacement:
            replacement.flush("other", [{"role": "user", "content": "new log"}])
        try:
            running.flush("s", [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}])
        except EventLogError:
            return  # detected: fine
        # Not detected: then the acknowledged message must be where every reader looks.
        with EventLog.open(path, readonly=True) as fresh:
            assert "s" in fresh and len(fresh.messages("s")) == 2


GROW = """
import sys
from eventlog import EventLog
with EventLog.open(sys.argv[1], durability="none") as log:
    log.flush("grow", [{"role": "tool", "content": "x" * (40 << 20)}])
"""


def test_open_while_another_process_grows_the_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        log.flush("s", [{"role": "user", "content": "before"}])
    real_open = lmdb.open

    def open_then_grow(*args: object, **kwargs: object) -> lmdb.Environment:
        env = real_open(*args, **kwargs)
        # Another process grows the map right after this one mapped it.
        done = run_python(GROW, str(path), timeout=120)
        assert done.returncode == 0, done.stderr
        return env

    monkeypatch.setattr(lmdb, "open", open_then_grow)
    with EventLog.open(path) as log:
        monkeypatch.setattr(lmdb, "open", real_open)
        assert "grow" in log and len(log.messages("s")) == 1


@pytest.mark.parametrize("durability", ["full", "process", "none"])
def test_synced_commits_write_into_space_zeroed_ahead(tmp_path: Path, durability: str) -> None:
    path = tmp_path / "log"
    with EventLog.open(path, durability=durability) as log:
        for i in range(300):
            log.append("s", [{"role": "user", "content": f"{i} " + "x" * 700}])
        info = log._store.env.info()
        in_use = (info["last_pgno"] + 1) * log._store.env.stat()["psize"]
    size = (path / "data.mdb").stat().st_size
    if durability == "none":
        assert size == in_use  # no syncs to save: nothing zeroed
    else:
        assert in_use < size <= info["map_size"]
        with open(path / "data.mdb", "rb") as f:
            f.seek(in_use)
            assert not any(f.read())  # only zeros past the pages in use
    with EventLog.open(path) as log:
        assert len(log.messages("s")) == 300
        assert log.verify().ok


def test_lmdb_errors_become_errors_a_caller_can_act_on(tmp_path: Path) -> None:
    """Damaged files are CorruptLogError; a panic of this process's environment is not damage
    (reopening is the remedy) and must not send a caller restoring backups."""
    from eventlog.store import translate

    damaged = translate(lmdb.CorruptedError("MDB_CORRUPTED"), str(tmp_path))
    assert isinstance(damaged, CorruptLogError) and "damaged" in str(damaged)
    panic = translate(lmdb.PanicError("MDB_PANIC"), str(tmp_path))
    assert type(panic) is EventLogError and "open it again" in str(panic)


def test_a_malformed_last_event_key_is_a_corrupt_log_error_naming_the_key(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eventlog.cli import cli

    path = tmp_path / "log"
    _small_log(path)
    key, value = raw_events(path)[-1]
    bad = key + b"\x00"  # nine bytes: sorts after every seq key, so it is the last key
    _put_event(path, bad, value, delete=key)
    with EventLog.open(path) as log:
        report = log.verify()
        assert not report.ok and bad.hex() in str(report.problems)
        for read in (lambda: log.last_seq, lambda: list(log.events()), lambda: log.flush("new", [{"role": "user"}])):
            with pytest.raises(CorruptLogError, match=bad.hex()):
                read()
    for command in (["verify"], ["sessions"]):
        result = CliRunner().invoke(cli, ["--log", str(path), *command])
        assert result.exit_code != 0 and "Traceback" not in result.output, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
        assert command == ["verify"] or len(errors) == 1, result.output


def _index_entries(path: Path, number: int) -> dict[bytes, bytes]:
    env = raw_env(path)
    try:
        with env.begin() as txn:
            cursor = txn.cursor(db=env.open_db(b"index", txn=txn))
            prefix = number.to_bytes(8, "big")
            return {bytes(k): bytes(v) for k, v in cursor if bytes(k).startswith(prefix)}
    finally:
        env.close()


def _put_index(path: Path, number: int, entries: dict[bytes, bytes]) -> None:
    """Replace session ``number``'s index entries with ``entries``: what a lost page write leaves."""
    env = raw_env(path)
    try:
        with env.begin(write=True) as txn:
            db = env.open_db(b"index", txn=txn)
            for key in _index_entries_in(txn, db, number):
                txn.delete(key, db=db)
            for key, value in entries.items():
                txn.put(key, value, db=db)
    finally:
        env.close()


def _index_entries_in(txn: lmdb.Transaction, db: object, number: int) -> list[bytes]:
    prefix = number.to_bytes(8, "big")
    return [bytes(k) for k in txn.cursor(db=db).iternext(values=False) if bytes(k).startswith(prefix)]


@pytest.mark.parametrize("shape", ["appended", "rewound"])
@pytest.mark.parametrize("stale", ["state and chain", "state", "chain"])
def test_a_stale_index_page_is_an_error_not_an_older_transcript(tmp_path: Path, shape: str, stale: str) -> None:
    path = tmp_path / "log"
    first = [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]
    with EventLog.open(path) as log:
        log.flush("s", first)
        if shape == "rewound":
            first = [first[0], {"role": "assistant", "content": "edited"}]
            log.flush("s", first)
    env = raw_env(path)
    with env.begin() as txn:
        number = int.from_bytes(txn.get(b"s", db=env.open_db(b"sessions", txn=txn)), "big")
    env.close()
    before = _index_entries(path, number)
    with EventLog.open(path) as log:
        log.flush("s", [*first, {"role": "user", "content": "acknowledged"}])
    after = _index_entries(path, number)
    state = number.to_bytes(8, "big") + b"h"
    if stale == "state and chain":
        _put_index(path, number, before)
    elif stale == "state":
        _put_index(path, number, {**after, state: before[state]})
    else:
        _put_index(path, number, {**before, state: after[state]})
    with EventLog.open(path) as log:
        with pytest.raises(CorruptLogError, match=r"session|chain"):
            log.messages("s")
        with pytest.raises(CorruptLogError):
            log.messages("s", last=1)
        assert not log.verify().ok


_SWEEP = r"""
import json, os, shutil, sys
from eventlog import EventLog, EventLogError
from eventlog.verify import verify_files

source, scratch, fill = sys.argv[1], sys.argv[2], sys.argv[3]
pages = os.path.getsize(os.path.join(source, "data.mdb")) // 4096
for page in range(2, pages):
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(source, scratch)
    with open(os.path.join(scratch, "data.mdb"), "r+b") as f:
        f.seek(page * 4096)
        f.write(bytes(4096) if fill == "zero" else os.urandom(4096))
    print(json.dumps({"page": page, "started": True}), flush=True)  # an abort shows which page
    try:
        log = EventLog.open(scratch, readonly=True)
    except EventLogError as e:  # damaged beyond opening
        report = verify_files(scratch, e)
    else:
        with log:
            report = log.verify()
    print(json.dumps({"page": page, "ok": report.ok, "damaged": [str(d) for d in report.damaged_pages]}), flush=True)
"""


@pytest.mark.parametrize("fill", ["zero", "random"])
def test_a_damaged_page_anywhere_gives_a_report_never_an_abort(tmp_path: Path, fill: str) -> None:
    """Every page of the data file in turn zeroed (or filled with noise): verify returns a report
    naming the page, and for a page of the events table the events it held, instead of LMDB
    aborting the process on an assertion."""
    path = tmp_path / "log"
    with EventLog.open(path) as log:
        for s in range(4):
            transcript: list[dict[str, object]] = []
            for i in range(40):
                transcript.append({"role": "user", "content": f"s{s} m{i} " + "x" * 300})
                log.flush(f"s{s}", transcript)
        transcript.append({"role": "tool", "content": "big " + "y" * 20_000})  # an overflow value
        log.flush("s3", transcript)
        assert log.verify().ok
        env = log._store.env
        with env.begin() as txn:  # pages holding something (the rest is LMDB's free list)
            names = [bytes(key) for key, _ in txn.cursor()]
            tables = [env.stat(), *(txn.stat(env.open_db(name, txn=txn, create=False)) for name in names)]
        in_use = 2 + sum(t["branch_pages"] + t["leaf_pages"] + t["overflow_pages"] for t in tables)
    result = run_python(_SWEEP, str(path), str(tmp_path / "scratch"), fill, timeout=600)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    done = [line for line in lines if "ok" in line]
    assert result.returncode == 0, f"aborted at page {lines[-1]['page'] if lines else '?'}: {result.stderr[-500:]}"
    assert len(done) == len([line for line in lines if "started" in line])
    damaged = [line for line in done if not line["ok"]]
    assert len(damaged) > in_use // 2  # free pages may be damaged harmlessly; most of those in use are named
    events = [d for line in damaged for d in line["damaged"] if "events table, events" in d]
    assert events, "no damaged page of the events table was named with its events"


_OPEN_ON_A_FULL_DISK = r"""
import os, sys
from eventlog import EventLog, StorageFullError
try:
    with EventLog.open(sys.argv[1]) as log:
        log.messages("s")
except StorageFullError as e:
    print("StorageFullError:", e)
"""


def _fill_up(mountpoint: Path) -> None:
    """Fill the file system to the last byte."""
    fd = os.open(mountpoint / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\xff" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


@pytest.mark.parametrize("case", ["new log", "lock file missing"])
def test_opening_a_log_on_a_full_disk_is_storage_full_not_sigbus(tmpfs: Path, case: str) -> None:
    path = tmpfs / "log"
    if case == "lock file missing":
        with EventLog.open(path) as log:
            log.flush("s", [{"role": "user", "content": "stored"}])
        (path / "lock.mdb").unlink()
    _fill_up(tmpfs)
    result = run_python(_OPEN_ON_A_FULL_DISK, str(path))
    assert result.returncode == 0, f"died with {result.returncode}: {result.stderr[-400:]}"
    assert "StorageFullError" in result.stdout, result.stdout + result.stderr
    if case == "lock file missing":
        (tmpfs / "filler").unlink()
        with EventLog.open(path) as log:
            assert log.messages("s") == [{"role": "user", "content": "stored"}]
            assert log.verify().ok


CARRIER = """
import sys, time
from eventlog import EventLog
log = EventLog.open(sys.argv[1])
log.flush("carrier", [{"role": "user", "content": "first"}])
print("ready", flush=True)
time.sleep(600)
"""


def test_a_full_disk_under_a_carrier_is_the_same_storage_full_error_and_the_spill_holds_the_flush(
    tmpfs: Path,
) -> None:
    """The carrier (another process, eventlog/relay.py) cannot write the flush either: its
    sender writes it itself and hears the error a log without a carrier gives, so spilling works."""
    from crashkit import Child

    from eventlog.spill import SpillingWriter, recover

    (tmpfs / "filler").write_bytes(b"x" * 1_000_000)
    path = tmpfs / "log"
    with Child(CARRIER, str(path)) as carrier:
        carrier.wait_ready()
        with EventLog.open(path) as log:
            transcript: list[dict[str, object]] = []
            error = _fill(log, "s", transcript)
            assert isinstance(error, StorageFullError), f"{type(error).__name__}: {error}"
            assert log.info()["relayed"] > 0  # the flushes before went through the carrier
            spilled = SpillingWriter(log, tmpfs.parent / "spill").flush("s", [*transcript, _big(99_999, 50_000)])
            assert spilled.spilled
            assert log.verify().ok
    (tmpfs / "filler").unlink()
    with EventLog.open(path) as log:
        recover(log, tmpfs.parent / "spill")
        assert len(log.messages("s")) == len(transcript) + 1
        assert log.verify().ok
