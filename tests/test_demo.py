"""``eventlog demo``: the scripted session does what its report says, the same way every run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventlog import EventLog
from eventlog.cli import cli
from eventlog.demo import BRANCH, MAIN, SECRET, run_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("demo") / "eventlog-demo"
    return run_demo(path)


def test_every_message_is_written_exactly_once(demo):
    assert demo.turns == 62
    assert demo.appended == demo.distinct == 1 + 5 * demo.turns
    assert demo.offered > 10 * demo.appended  # the same messages were flushed again and again
    assert demo.noop_flushes > 0 and demo.scaffolding_dropped == demo.turns


def test_the_log_matches_the_report(demo):
    with EventLog.open(demo.log_path, readonly=True) as log:
        assert log.sessions() == [BRANCH, MAIN]
        history = log.history(MAIN)
        reasons = {o.tombstone.reason for o in history if o.tombstone}
        assert reasons == {"edit", "rewind", "compaction"}
        assert sum(1 for o in history if o.tombstone and o.tombstone.reason == "edit") == demo.edit["tombstoned"]
        assert (
            sum(1 for o in history if o.tombstone and o.tombstone.reason == "rewind") == demo.rewind["tombstoned"] == 10
        )
        live = log.messages(MAIN)
        assert not any(SECRET in json.dumps(m) for m in live)
        # The leaked key stayed in the tombstoned occurrence until the demo erased it.
        assert not any(SECRET in json.dumps(o.message) for o in history)
        redacted = [o for o in history if o.redaction is not None]
        assert [(o.position, o.seq, o.tombstone.reason if o.tombstone else None) for o in redacted] == [
            (demo.redaction["position"], demo.redaction["seq"], "edit")
        ]
        assert demo.redaction["files_holding"] == 0
        assert not [p for p in Path(demo.path).rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
        assert live[1]["content"].startswith("[Summary of the first")
        assert len(live) == demo.live_messages[MAIN]
        assert log.messages(BRANCH)[: demo.fork["at"]] == live[: demo.fork["at"]]
        assert live[-1]["tool_calls"][0]["function"]["name"] == "disk_usage"  # stored unrepaired
        assert log.head(MAIN) == demo.head
        assert log.verify().ok and demo.verify_ok
    assert demo.edit["carried"] == demo.edit["appended"] - 1  # only the redacted message is stored again
    assert demo.compaction["carried"] == 40
    assert demo.resume == {"stored": demo.live_messages[MAIN], "repaired": 1}


def test_projection_and_search(demo):
    from projections import SQLiteProjection

    assert demo.projection["available"] is True
    assert demo.projection["events"] == demo.events
    with SQLiteProjection(demo.db_path) as projection:
        assert projection.last_seq == demo.events
        assert len(projection.messages(MAIN)) == demo.live_messages[MAIN]
        assert len(projection.search("tombstone", limit=1000)) == demo.projection["hits"] > 0


def test_report_text(demo):
    text = str(demo)
    assert (
        f"{demo.distinct} distinct messages entered the list; {demo.distinct} were written, each exactly once." in text
    )
    assert "(reason 'edit')" in text and "'rewind' tombstone" in text and "'compaction' tombstone" in text
    assert f"Forked {BRANCH!r}" in text
    assert "verify: ok:" in text
    assert f"eventlog --log {demo.log_path} show {MAIN}" in text
    assert "Where to look next:" in text


def test_same_digests_on_every_run(demo, tmp_path):
    again = run_demo(tmp_path / "again")
    assert again.head == demo.head
    assert again.events == demo.events
    assert (again.appended, again.edit, again.rewind, again.compaction) == (
        demo.appended,
        demo.edit,
        demo.rewind,
        demo.compaction,
    )


def test_command_writes_to_the_default_directory_and_reruns(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    first = runner.invoke(cli, ["demo", "--turns", "12"], catch_exceptions=False)
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("eventlog demo: a scripted agent session in eventlog-demo (durability 'full')")
    assert "9. verify: ok:" in first.stdout
    assert (tmp_path / "eventlog-demo" / "log" / "data.mdb").exists()
    assert (tmp_path / "eventlog-demo" / "log.sqlite").exists()
    second = runner.invoke(cli, ["demo", "--turns", "12", "--json"], catch_exceptions=False)
    report = json.loads(second.stdout)
    assert report["verify_ok"] is True and report["turns"] == 14
    # The commands the report suggests work on what it wrote.
    shown = runner.invoke(cli, ["--log", "eventlog-demo/log", "show", MAIN], catch_exceptions=False)
    assert shown.exit_code == 0 and "(compaction)" in shown.stdout


def test_refuses_a_directory_it_did_not_make(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(cli, ["demo", "--path", str(target)])
    assert result.exit_code == 1
    assert "was not made by 'eventlog demo'" in result.stderr
    assert (target / "notes.txt").read_text() == "keep me"


def test_demo_is_fast(demo):
    # Not a benchmark: a guard that the two-command start stays a few seconds.
    assert demo.seconds < 20
    assert Path(demo.log_path).is_dir()
