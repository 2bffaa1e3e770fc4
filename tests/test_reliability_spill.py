"""The spill fallback: a turn the log cannot take goes to a JSONL file and comes back exactly once."""

from __future__ import annotations

import doctest
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import eventlog.spill
from eventlog import EventLog, EventLogError, InvalidMessageError, StorageFullError
from eventlog.spill import SpillingWriter, read_spill, recover, spill_name

valid_ids = st.text(min_size=1, max_size=40).filter(
    lambda s: "\x00" not in s and s.encode("utf-8", "surrogatepass") and _utf8(s)
)


def _utf8(text: str) -> bool:
    try:
        return len(text.encode("utf-8")) <= 256
    except UnicodeEncodeError:
        return False


def test_module_examples() -> None:
    failures, tried = doctest.testmod(eventlog.spill)
    assert tried > 0 and failures == 0


@given(a=valid_ids, b=valid_ids)
def test_distinct_session_ids_never_share_a_spill_file(a: str, b: str) -> None:
    assert (spill_name(a) == spill_name(b)) == (a == b)


@pytest.mark.parametrize(
    "session_id", ["../../etc/passwd", "/abs", "..", ".hidden", "a/b\\c", "x" * 256, "ünï 会话", "'; DROP--"]
)
def test_spill_names_are_plain_file_names(tmp_path: Path, session_id: str) -> None:
    name = spill_name(session_id)
    assert "/" not in name and "\\" not in name and not name.startswith(".") and len(name) < 100
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()


def _turns(n: int, size: int = 20_000) -> list[dict[str, Any]]:
    return [{"role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "w" * size} for i in range(n)]


def _full_log(path: Path) -> tuple[EventLog, list[dict[str, Any]]]:
    """A log at its configured maximum size, and the transcript it holds."""
    log = EventLog.open(path, map_size=1 << 20, max_map_size=2 << 20)
    transcript: list[dict[str, Any]] = []
    while True:
        transcript.append({"role": "user", "content": f"filler {len(transcript)} " + "f" * 20_000})
        try:
            log.flush("filler", transcript)
        except StorageFullError:
            transcript.pop()
            return log, transcript


def test_a_healthy_log_is_written_and_nothing_is_spilled(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        writer = SpillingWriter(log, tmp_path / "spill")
        outcome = writer.flush("s", _turns(2, 10))
        assert not outcome.spilled and outcome.result is not None and outcome.result.appended == 2
    assert not (tmp_path / "spill").exists()


def test_a_turn_the_full_log_refuses_is_spilled_and_recovered_exactly_once(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    log, _ = _full_log(tmp_path / "log")
    with log:
        before = log.last_seq
        writer = SpillingWriter(log, spill)
        turn = [*_turns(3), {"role": "assistant", "content": "scaffold", "_thinking_prefill": True}]
        outcome = writer.flush("chat", turn)
        assert outcome.spilled and isinstance(outcome.error, StorageFullError)
        assert log.last_seq == before
        # The caller keeps going while the disk is full: the spill holds the newest list.
        turn.append({"role": "user", "content": "one more"})
        outcome = writer.flush("chat", turn)
        assert outcome.spilled
    assert outcome.path is not None and outcome.path.parent == spill
    header, *lines = [json.loads(line) for line in outcome.path.read_text().splitlines()]
    assert header["messages"] == 4 and header["replace"] is False and "message" not in header
    assert [line["index"] for line in lines] == [0, 1, 2, 3]  # scaffolding was not spilled
    assert all(line["session"] == "chat" for line in [header, *lines])
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        report = recover(log, spill)
        assert report.ok and report.recovered == ["chat"] and report.appended == 4
        assert [m["content"] for m in log.messages("chat")] == [
            m["content"] for m in turn if "_thinking_prefill" not in m
        ]
        assert not list(spill.glob("*.jsonl"))
        seq = log.last_seq
        assert recover(log, spill).recovered == []
        assert log.last_seq == seq
        assert log.verify().ok


def test_recovery_interrupted_after_the_write_does_not_write_twice(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    log, _ = _full_log(tmp_path / "log")
    with log:
        SpillingWriter(log, spill).flush("chat", _turns(2))
    saved = next(spill.glob("*.jsonl")).read_text()
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        assert recover(log, spill).recovered == ["chat"]
        seq = log.last_seq
        # As if the process died between the flush and removing the file.
        (spill / spill_name("chat")).write_text(saved)
        report = recover(log, spill)
        assert report.already_stored == ["chat"] and report.appended == 0
        assert log.last_seq == seq
        assert len(log.history("chat")) == 2


def test_a_spilled_edit_is_applied_while_the_log_has_not_moved_on(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    path = tmp_path / "log"
    with EventLog.open(path, map_size=1 << 20, max_map_size=2 << 20) as log:
        log.flush("chat", _turns(2, 10))
    log, _ = _full_log(path)
    with log:
        edited = [_turns(1, 10)[0], {"role": "user", "content": "edited " + "e" * 30_000}]
        assert SpillingWriter(log, spill).flush("chat", edited).spilled
    with EventLog.open(path, max_map_size=64 << 20) as log:
        report = recover(log, spill)
        assert report.recovered == ["chat"]
        assert log.messages("chat")[1]["content"] == edited[1]["content"]
        assert [o.tombstone.reason for o in log.history("chat") if o.tombstone] == ["edit"]


def test_a_spill_older_than_the_log_is_kept_not_applied_over_newer_history(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    path = tmp_path / "log"
    with EventLog.open(path, map_size=1 << 20, max_map_size=2 << 20) as log:
        log.flush("chat", _turns(2, 10))
    log, _ = _full_log(path)
    with log:
        assert (
            SpillingWriter(log, spill)
            .flush("chat", [_turns(1, 10)[0], {"role": "user", "content": "x" * 30_000}])
            .spilled
        )
    with EventLog.open(path, max_map_size=64 << 20) as log:
        newer = [*_turns(2, 10), {"role": "user", "content": "written later by another process"}]
        log.flush("chat", newer)
        report = recover(log, spill)
        assert not report.ok and spill_name("chat") in report.kept
        assert log.messages("chat") == newer
    assert (spill / spill_name("chat")).exists()


def test_caller_errors_are_raised_not_spilled(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        writer = SpillingWriter(log, tmp_path / "spill")
        with pytest.raises(InvalidMessageError):
            writer.flush("s", [{"role": "user", "content": b"bytes"}])
        writer.flush("s", _turns(2, 10))
        with pytest.raises(EventLogError):  # no shared prefix: HistoryMismatchError
            writer.flush("s", [{"role": "user", "content": "unrelated"}])
    assert not (tmp_path / "spill").exists()


def test_a_closed_log_spills_and_the_next_writer_recovers(tmp_path: Path) -> None:
    log = EventLog.open(tmp_path / "log")
    writer = SpillingWriter(log, tmp_path / "spill")
    log.close()
    outcome = writer.flush("s", _turns(2, 10))
    assert outcome.spilled
    session, messages, _, _, base = read_spill(outcome.path)
    assert session == "s" and len(messages) == 2 and base is None
    with EventLog.open(tmp_path / "log") as log:
        assert recover(log, tmp_path / "spill").recovered == ["s"]
        assert len(log.messages("s")) == 2


def test_summaries_overrides_and_unicode_survive_the_spill(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    log = EventLog.open(tmp_path / "log")
    log.close()  # unreachable: every flush spills
    turn = [
        {"role": "user", "content": "привет \x00 🧪", "_local": object(), "_compressed_summary": True},
        {"role": "assistant", "content": "ok"},
    ]
    outcome = SpillingWriter(log, spill).flush("s/../x", turn, overrides={0: {"display": "hi"}})
    assert outcome.spilled and outcome.path is not None
    _, messages, overrides, _, _ = read_spill(outcome.path)
    assert messages[0]["_compressed_summary"] is True and overrides == {0: {"display": "hi"}}
    with EventLog.open(tmp_path / "log") as log:
        assert recover(log, spill).recovered == ["s/../x"]
        assert log.messages("s/../x") == [
            {"role": "user", "content": "привет \x00 🧪"},
            {"role": "assistant", "content": "ok"},
        ]
        assert log.history("s/../x")[0].override == {"display": "hi"}


def _spill_against_a_full_log(path: Path, spill: Path, stored: list[dict[str, Any]], **flush: Any) -> Path:
    """Store ``stored`` in session "chat", then spill ``flush`` for "chat" into a log opened
    read-only (it refuses every write, however small, and still reads the head)."""
    with EventLog.open(path) as log:
        log.flush("chat", stored)
    with EventLog.open(path, readonly=True) as log:
        outcome = SpillingWriter(log, spill).flush("chat", **flush)
        assert outcome.spilled and outcome.path is not None
        return outcome.path


def test_a_spilled_rewind_is_applied_not_taken_for_already_stored(tmp_path: Path) -> None:
    stored = _turns(3, 10)
    _spill_against_a_full_log(tmp_path / "log", tmp_path / "spill", stored, messages=stored[:2])
    with EventLog.open(tmp_path / "log") as log:
        report = recover(log, tmp_path / "spill")
        assert report.ok and report.recovered == ["chat"] and report.already_stored == []
        assert log.messages("chat") == stored[:2]
        assert [o.tombstone.reason for o in log.history("chat") if o.tombstone] == ["rewind"]
        assert not list((tmp_path / "spill").glob("*.jsonl"))
        assert log.verify().ok


def test_a_spilled_compaction_is_applied_as_a_compaction(tmp_path: Path) -> None:
    stored = _turns(4, 10)
    summary = {"role": "user", "content": "summary of turns 0-2", "_compressed_summary": True}
    _spill_against_a_full_log(tmp_path / "log", tmp_path / "spill", stored, messages=[summary, stored[3]])
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        report = recover(log, tmp_path / "spill")
        assert report.ok and report.recovered == ["chat"]
        assert log.messages("chat") == [{"role": "user", "content": "summary of turns 0-2"}, stored[3]]
        reasons = {o.tombstone.reason for o in log.history("chat") if o.tombstone}
        assert reasons == {"compaction"}


@pytest.mark.parametrize("messages", [[], [{"role": "user", "content": "x", "_thinking_prefill": True}]])
def test_a_spilled_clear_is_recovered_and_the_cli_exits_0(tmp_path: Path, messages: list[dict[str, Any]]) -> None:
    from click.testing import CliRunner

    from eventlog.cli import cli

    spill = tmp_path / "spill"
    path = _spill_against_a_full_log(tmp_path / "log", spill, _turns(2, 10), messages=messages, replace=True)
    session, read, _, replace, base = read_spill(path)
    assert (session, read, replace) == ("chat", [], True) and base is not None
    result = CliRunner().invoke(cli, ["--log", str(tmp_path / "log"), "recover", str(spill)])
    assert result.exit_code == 0, result.output
    assert not list(spill.glob("*.jsonl"))
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        assert log.messages("chat") == []
        assert {o.tombstone.reason for o in log.history("chat") if o.tombstone} == {"clear"}
    # Run again: nothing left to do, still exit 0.
    assert CliRunner().invoke(cli, ["--log", str(tmp_path / "log"), "recover", str(spill)]).exit_code == 0


def test_a_spilled_empty_list_without_replace_is_kept_with_the_reason(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    _spill_against_a_full_log(tmp_path / "log", spill, _turns(2, 10), messages=[])
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        report = recover(log, spill)
        assert spill_name("chat") in report.kept and "replace" in report.kept[spill_name("chat")]
        assert len(log.messages("chat")) == 2


def test_a_spilled_rewind_is_kept_once_the_log_has_moved_on(tmp_path: Path) -> None:
    stored = _turns(3, 10)
    _spill_against_a_full_log(tmp_path / "log", tmp_path / "spill", stored, messages=stored[:2])
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        newer = [*stored, {"role": "user", "content": "written later"}]
        log.flush("chat", newer)
        report = recover(log, tmp_path / "spill")
        assert spill_name("chat") in report.kept
        assert log.messages("chat") == newer


def test_a_spilled_extension_the_log_later_took_in_full_is_already_stored(tmp_path: Path) -> None:
    stored = _turns(2, 10)
    spilled = [*stored, {"role": "user", "content": "spilled"}]
    _spill_against_a_full_log(tmp_path / "log", tmp_path / "spill", stored, messages=spilled)
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        newer = [*spilled, {"role": "assistant", "content": "and later"}]
        log.flush("chat", newer)
        report = recover(log, tmp_path / "spill")
        assert report.ok and report.already_stored == ["chat"]
        assert log.messages("chat") == newer


def test_a_spilled_extension_is_not_applied_over_a_later_rewind(tmp_path: Path) -> None:
    stored = _turns(3, 10)
    spilled = [*stored, {"role": "user", "content": "spilled"}]
    _spill_against_a_full_log(tmp_path / "log", tmp_path / "spill", stored, messages=spilled)
    with EventLog.open(tmp_path / "log", max_map_size=64 << 20) as log:
        log.flush("chat", stored[:1])  # rewound by another process after the spill
        report = recover(log, tmp_path / "spill")
        assert spill_name("chat") in report.kept
        assert log.messages("chat") == stored[:1]


def test_a_spill_file_cut_after_its_header_is_unreadable_not_an_empty_list(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    path = _spill_against_a_full_log(tmp_path / "log", spill, _turns(2, 10), messages=_turns(3, 10))
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    with pytest.raises(ValueError, match="announces 3 messages"):
        read_spill(path)
    with EventLog.open(tmp_path / "log") as log:
        assert spill_name("chat") in recover(log, spill).kept
        assert len(log.messages("chat")) == 2


def test_a_spill_file_without_a_header_is_still_recovered(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    lines = [{"session": "s", "index": i, "message": m} for i, m in enumerate(_turns(2, 10))]
    lines[0]["base"] = ""
    (spill / spill_name("s")).write_text("".join(json.dumps(line) + "\n" for line in lines))
    with EventLog.open(tmp_path / "log") as log:
        assert recover(log, spill).recovered == ["s"]
        assert log.messages("s") == _turns(2, 10)
