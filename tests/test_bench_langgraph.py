"""The LangGraph checkpointer benchmark runs (tiny sizes) and reports what it measured."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.sqlite", reason="needs agent-eventlog[test]")

from benchmarks import bench_langgraph


def test_langgraph_benchmark_measures_both_savers(tmp_path: Path) -> None:
    result = bench_langgraph.run(scratch_dir=tmp_path, turns=4, sizes=(12,))
    storage = {row["system"]: row for row in result["storage"]["rows"]}
    ours, sqlite = storage["eventlog EventLogSaver"], storage["langgraph SqliteSaver"]
    assert ours["messages"] == sqlite["messages"] == 12  # two turns with a tool call, two without
    assert ours["disk_mb"] > 0 and sqlite["disk_mb"] > 0
    turns = [row for row in result["turn"]["rows"] if row["messages"] == 12]
    assert {row["system"] for row in turns} >= {"eventlog EventLogSaver", "langgraph SqliteSaver"}
    assert all(row["median_ms"] > 0 for row in turns)
    commits = {row["system"]: row["commits"] for row in turns if "commits" in row}
    # One transaction per checkpoint and per task's writes, as LangGraph's own saver: nine in the
    # tool-calling turn (five checkpoints, four writes).
    assert commits["eventlog EventLogSaver"] == commits["langgraph SqliteSaver"] == 9
    parts = {part["session"]: part for part in result["storage"]["breakdown"]}
    assert parts["t"]["rows"] == 12 and parts["t␟checkpoints"]["kinds"]["checkpoint"] > 0
    assert {(row["system"], row["kind"]) for row in result["turn"]["get_tuple"]} >= {
        ("eventlog EventLogSaver", "warm"),
        ("eventlog EventLogSaver", "cold"),
    }
    assert [target["status"] in ("met", "missed") for target in result["targets"]] == [True]  # no 1,000 size here
    assert result["postgres"].startswith(("measured", "not measured"))
    if importlib.util.find_spec("matplotlib") is not None:  # the bench extra draws the plots
        plots = bench_langgraph.plot(result, tmp_path / "plots")
        assert all(path.stat().st_size > 0 for path in plots)
    assert "x raw" in bench_langgraph.render(result)
