"""Smoke test of the benchmark suite: every scenario runs at tiny sizes, so none of them rots.

No timing assertions: only that each scenario runs, reports what it says it
reports, and that the peers which are not installed are skipped with a reason.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pytest run from elsewhere than the repository root
    sys.path.insert(0, str(ROOT))

from benchmarks import bench_bulk, bench_commit, bench_concurrency, bench_flush, bench_reflush, run as runner  # noqa: E402
from benchmarks.harness import summary  # noqa: E402
from benchmarks.workload import MESSAGES_PER_TURN, Workload  # noqa: E402

STATS = {"median_ms", "p90_ms", "p99_ms", "msgs_per_s"}


def test_workload_is_deterministic_and_shaped_like_an_agent_turn() -> None:
    first, again = Workload().messages(30), Workload().messages(30)
    assert first == again
    assert Workload(salt="other").messages(30) != first
    turn = Workload().turn(3)
    assert len(turn) == MESSAGES_PER_TURN
    assert [m["role"] for m in turn] == ["user"] + ["assistant", "tool"] * 4 + ["assistant"]
    for message in turn:
        assert isinstance(message["timestamp"], float)
        for call in message.get("tool_calls") or ():
            json.loads(call["function"]["arguments"])  # arguments are JSON strings
    grown = [len(messages) for messages, _ in Workload().session(25)]
    assert grown == [10, 20, 25]


def test_summary_percentiles() -> None:
    stats = summary([i * 1_000_000 for i in range(1, 101)], 10)
    assert (stats["median_ms"], stats["p90_ms"], stats["p99_ms"]) == (50.0, 90.0, 99.0)
    assert stats["msgs_per_s"] == pytest.approx(1000 / 5.05)


def _check_rows(rows: list[dict]) -> None:
    assert rows
    for row in rows:
        assert STATS <= row.keys(), row


def test_flush_scenario_runs_every_available_system(tmp_path: Path) -> None:
    result = bench_flush.run(scratch_dir=tmp_path, messages=20)
    _check_rows(result["rows"])
    names = {row["system"] for row in result["rows"]} | set(result["skipped"])
    assert names == {system.name for system in bench_flush.all_systems()}
    for name, why in result["skipped"].items():
        assert why, name
    peers = {"hermes_state": "hermes SessionDB (one txn per turn)", "eventsourcing": "eventsourcing (SQLite)", "agents": "openai-agents SQLiteSession"}
    for module, name in peers.items():
        assert (name in result["skipped"]) == (importlib.util.find_spec(module) is None), name
    assert all(len(series) == 2 for series in result["series_ns"].values())
    assert result["lengths"] == [10, 20]
    print(bench_flush.render(result))


def test_reflush_scenario(tmp_path: Path) -> None:
    result = bench_reflush.run(scratch_dir=tmp_path, sizes=(10, 30), rounds=2)
    _check_rows(result["rows"])
    assert {row["system"] for row in result["rows"]} == {"reflush", "reflush trust", "reflush fresh copies", "rehash all"}
    assert bench_reflush.rehash_all(Workload().messages(3)) != bench_reflush.rehash_all(Workload().messages(4))
    print(bench_reflush.render(result))


def test_commit_scenario(tmp_path: Path) -> None:
    result = bench_commit.run(scratch_dir=tmp_path, messages=20)
    _check_rows(result["rows"])
    assert {row["mode"] for row in result["rows"]} == {"full", "process", "none"}
    print(bench_commit.render(result))


def test_bulk_scenario(tmp_path: Path) -> None:
    result = bench_bulk.run(scratch_dir=tmp_path, messages=200, repeats=1)
    _check_rows(result["rows"])
    names = [row["system"] for row in result["rows"]]
    assert [name.split(" ")[0] for name in names[:3]] == ["bulk", "bulk", "replay"]
    if result["skipped"]:
        assert len(names) == 3
    else:  # the rebuild, and its floor: SQLite alone with the same rows
        assert names[3].startswith("projection rebuild") and names[4].startswith("floor: SQLite alone")
    print(bench_bulk.render(result))


def test_concurrency_scenario(tmp_path: Path) -> None:
    result = bench_concurrency.run(scratch_dir=tmp_path, turns=2, threads=(1, 2), processes=(2,))
    _check_rows(result["rows"])
    assert [row["system"] for row in result["rows"]] == [
        "1 thread", "2 threads", "2 processes", "1 thread, trust mode", "2 threads, trust mode"
    ]
    print(bench_concurrency.render(result))


def test_runner_writes_report_json_and_plots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flush, reflush, commit, bulk, concurrency = (
        bench_flush.run, bench_reflush.run, bench_commit.run, bench_bulk.run, bench_concurrency.run
    )
    tiny = {
        "flush": lambda **kw: flush(messages=20, **kw),
        "reflush": lambda **kw: reflush(sizes=(10, 1000), rounds=1, **kw),
        "commit": lambda **kw: commit(messages=10, modes=("none",), **kw),
        "bulk": lambda **kw: bulk(messages=100, repeats=1, **kw),
        "concurrency": lambda **kw: concurrency(turns=1, threads=(1,), processes=(), **kw),
    }
    for name, module in runner.SCENARIOS.items():
        monkeypatch.setattr(module, "run", tiny[name])
    out = tmp_path / "out"
    results = runner.main(["--quick", "--out", str(out), "--scratch", str(tmp_path / "scratch")])
    assert {t["status"] for t in results["targets"]} <= {"met", "missed", "not measured"}
    assert json.loads((out / "results.json").read_text())["machine"]["cores"]
    text = (out / "report.md").read_text()
    assert "## Targets" in text and "Machine:" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert {p.name for p in out.glob("*.png")} == {"latency.png", "flush_vs_length.png", "reflush.png", "concurrency.png"}
