"""The hermes plugin: `eventlog hermes install` into a temporary home, then hermes' real agent loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.importorskip("hermes_cli.plugins", reason="hermes-agent is not installed (pip install -e '.[test]')")

from eventlog import EventLog, is_ephemeral
from eventlog.cli import cli
from eventlog.integrations.hermes import HermesRecorder

AGENT_RUN = Path(__file__).with_name("hermes_agent_run.py")


def stored_form(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the log keeps of hermes' list: no scaffolding, no process-local ``_`` keys."""
    return [{k: v for k, v in m.items() if not k.startswith("_")} for m in messages if not is_ephemeral(m)]


def hermes_env(home: Path) -> dict[str, str]:
    env = dict(os.environ, HERMES_HOME=str(home), HOME=str(home.parent))  # never the user's real home
    env.pop("OPENAI_API_KEY", None)
    return env


def install(home: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        cli, ["hermes", "install", "--home", str(home), "--json", *args], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_install_writes_the_plugin_and_enables_it(tmp_path: Path) -> None:
    home = tmp_path / "hermes-home"
    report = install(home)
    plugin = home / "plugins" / "eventlog"
    assert Path(report["plugin"]) == plugin and report["already_enabled"] is False
    assert {p.name for p in plugin.iterdir()} >= {"plugin.yaml", "__init__.py", "settings.json"}
    assert json.loads((plugin / "settings.json").read_text()) == {"log": str(home / "eventlog"), "durability": "full"}
    # hermes' own reading of its config and plugins: enabled, and found where hermes looks.
    code = (
        "from hermes_cli.plugins import PluginManager\n"
        "manager = PluginManager()\n"
        "manager.discover_and_load()\n"
        "entry = [p for p in manager.list_plugins() if p['key'] == 'eventlog'][0]\n"
        "assert entry['enabled'] and entry['error'] is None and entry['source'] == 'user', entry\n"
        "assert entry['hooks'] == 1, entry\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], env=hermes_env(home), capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
    # Installing again keeps it enabled once and updates the settings.
    again = install(home, "--durability", "process", "--log", str(tmp_path / "elsewhere"))
    assert again["already_enabled"] is True
    assert json.loads((plugin / "settings.json").read_text())["durability"] == "process"
    config = (home / "config.yaml").read_text()
    assert config.count("- eventlog") == 1


def test_every_hermes_turn_is_flushed_by_the_real_agent_loop(tmp_path: Path) -> None:
    home = tmp_path / "hermes-home"
    install(home)
    out = tmp_path / "lists.json"
    run = subprocess.run(
        [sys.executable, str(AGENT_RUN), str(out)], env=hermes_env(home), capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lists = json.loads(out.read_text())
    first, second, resumed = lists["first"], lists["second"], lists["resumed"]
    # hermes' own lists: its SessionDB stamped _db_persisted on what it wrote, and turn 1 called a tool.
    assert all(m.get("_db_persisted") for m in second)
    assert any(m.get("role") == "tool" for m in first) and len(second) > len(first)
    assert any(is_ephemeral(m) for m in lists["scaffolded"])
    with EventLog.open(home / "eventlog") as log:
        # The interrupted turn (no hook) was caught up by the next turn's flush.
        assert log.messages("hermes-session") == stored_form(resumed)
        # Each turn was written once: the markers and the scaffolding changed nothing stored.
        history = log.history("hermes-session")
        assert all(o.tombstone is None for o in history)
        assert len(history) == len(stored_form(resumed))
        info = log.session("hermes-session")
        assert info is not None and info.metadata["model"] == "gpt-4o-mini"


def test_the_recorder_replaces_a_rewritten_history_and_never_raises(tmp_path: Path) -> None:
    recorder = HermesRecorder(tmp_path / "log")
    try:
        turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        recorder.on_post_llm_call(session_id="s", conversation_history=turn, model="m", platform="telegram")
        rewritten = [{"role": "user", "content": "a different start"}]
        recorder.on_post_llm_call(session_id="s", conversation_history=rewritten)
        log = recorder.log()
        assert log.messages("s") == rewritten
        assert [o.tombstone.reason for o in log.history("s") if o.tombstone] == ["clear", "clear"]
        assert log.session("s").metadata == {"model": "m", "source": "telegram"}  # type: ignore[union-attr]
        # Bad input is logged, not raised into hermes; nothing of it is stored.
        recorder.on_post_llm_call(session_id="s", conversation_history=[{"role": "user", "content": b"bytes"}])
        recorder.on_post_llm_call(session_id="", conversation_history=turn)
        recorder.on_post_llm_call(session_id="s", conversation_history=None)
        assert log.messages("s") == rewritten
    finally:
        recorder.close()


def test_install_without_hermes_is_one_line(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['hermes_cli'] = None\n"
        "from eventlog.cli import main\n"
        f"main(['hermes', 'install', '--home', {str(tmp_path / 'h')!r}])\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1
    assert run.stderr.strip() == (
        "Error: eventlog.integrations.hermes needs hermes-agent: pip install 'agent-eventlog[hermes]'"
    )
    assert not (tmp_path / "h").exists()
