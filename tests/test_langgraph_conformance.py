"""LangGraph's own checkpointer conformance suite, run against EventLogSaver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("langgraph.checkpoint.conformance", reason="needs agent-eventlog[langgraph]")

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

from eventlog import EventLog
from eventlog.integrations.langgraph import EventLogSaver


def test_conformance_every_capability(tmp_path: Path) -> None:
    count = 0

    @checkpointer_test(name="EventLogSaver")
    async def factory() -> AsyncIterator[EventLogSaver]:
        nonlocal count
        count += 1
        with EventLog.open(tmp_path / f"log{count}", durability="none") as log:
            yield EventLogSaver(log)

    report = asyncio.run(validate(factory))
    results = report.results
    failures = {name: result.failures for name, result in results.items() if not result.passed}
    assert not failures, failures
    assert set(results) == {capability.value for capability in ALL_CAPABILITIES}
    assert all(result.detected and result.passed for result in results.values())
    base = sum(results[name].tests_passed for name in ("put", "put_writes", "get_tuple", "list", "delete_thread"))
    assert base >= 58
    assert all(results[name].tests_passed > 0 for name in ("copy_thread", "prune", "delete_for_runs"))
