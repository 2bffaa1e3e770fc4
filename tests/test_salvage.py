"""Salvage: every provably intact event of a damaged log copied into a new one, the losses named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli import cli
from eventlog.pages import check_pages
from eventlog.salvage import salvage


def _busy_log(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Sessions with appends, a rewind, an edit, a compaction, a clear, a fork, overrides,
    metadata and closes; many events, so the events table spans many pages."""
    with EventLog.open(path) as log:
        for s in range(4):
            transcript: list[dict[str, Any]] = []
            for i in range(30):
                transcript.append({"role": "user" if i % 2 else "assistant", "content": f"s{s} m{i} " + "x" * 200})
                log.flush(f"s{s}", transcript)
            log.flush(f"s{s}", transcript[:-2])  # rewind
            transcript = transcript[:-2]
            transcript[-1] = {"role": "assistant", "content": f"s{s} edited"}
            log.flush(f"s{s}", transcript, overrides={0: {"display": "shown"}})  # edit
            summary = {"role": "user", "content": f"s{s} summary", "_compressed_summary": True}
            log.flush(f"s{s}", [summary, *transcript[-3:]])  # compaction
            log.update_session(f"s{s}", title=f"t{s}", input_tokens=10 + s)
        log.fork("s1", "fork", at=2)
        log.flush("fork", [*log.messages("fork"), {"role": "user", "content": "in the fork"}])
        log.flush("s2", [], replace=True)  # clear
        log.flush("s2", [{"role": "user", "content": "after the clear"}])
        log.close_session("s3", reason="done")
        log.flush("big", [{"role": "tool", "content": "large " + "y" * 30_000}])  # an overflow value
        return {s: log.messages(s) for s in log.sessions()}


def _summary(path: Path) -> dict[str, Any]:
    with EventLog.open(path, readonly=True) as log:
        return {
            s: (
                log.messages(s),
                [(o.message, o.tombstone.reason if o.tombstone else None, o.override) for o in log.history(s)],
                (info := log.session(s)) and (info.metadata, info.counters, info.closed),
            )
            for s in log.sessions()
        }


def test_an_intact_log_is_copied_whole(tmp_path: Path) -> None:
    _busy_log(tmp_path / "log")
    report = salvage(tmp_path / "log", tmp_path / "new")
    assert report.complete and report.verified, report
    assert report.events_copied == report.known_end == report.events_proven
    assert _summary(tmp_path / "new") == _summary(tmp_path / "log")


def test_a_zeroed_events_page_loses_only_its_events_and_their_sessions_tails(tmp_path: Path) -> None:
    original = _busy_log(tmp_path / "log")
    before = _summary(tmp_path / "log")
    data = tmp_path / "log" / "data.mdb"
    # Find a leaf page of the events table in the middle of the log, and zero it.
    for page in range(2, data.stat().st_size // 4096):
        shutil.copyfile(data, tmp_path / "probe.mdb")
        with open(tmp_path / "probe.mdb", "r+b") as f:
            f.seek(page * 4096)
            f.write(bytes(4096))
        damaged = check_pages(str(tmp_path / "probe.mdb")).damaged
        if damaged and damaged[0].seqs and damaged[0].seqs[0] > 20 and damaged[0].seqs[1] is not None:
            break
    else:
        raise AssertionError("no leaf page of the events table found")
    first, last = damaged[0].seqs
    shutil.copyfile(tmp_path / "probe.mdb", data)
    result = CliRunner().invoke(cli, ["salvage", str(tmp_path / "log"), str(tmp_path / "new"), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["verified"] and not report["complete"]
    assert set(range(first, last + 1)) <= set(report["lost_seqs"])
    # What was lost is named; every session not named is copied exactly.
    after = _summary(tmp_path / "new")
    for session in original:
        if session in report["sessions"]:
            assert session not in after or len(after[session][1]) <= len(before[session][1])
        else:
            assert after[session] == before[session], session
    assert report["sessions"], "a page of events was lost, yet no session lost anything"
    # Every event the new log holds is one the damaged log proved: nothing is invented.
    assert report["events_copied"] + len(report["lost_seqs"]) == report["known_end"]


def test_salvage_refuses_to_write_into_an_existing_log(tmp_path: Path) -> None:
    _busy_log(tmp_path / "log")
    with EventLog.open(tmp_path / "new") as log:
        log.flush("x", [{"role": "user", "content": "keep me"}])
    result = CliRunner().invoke(cli, ["salvage", str(tmp_path / "log"), str(tmp_path / "new")])
    assert result.exit_code != 0 and "already holds a log" in result.output
