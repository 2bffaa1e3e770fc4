from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
"""Under CI every test must run: a skipped test (a framework not installed, a server that did
not start) fails the run instead of passing it quietly."""


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "log") as opened:
        yield opened


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    if IN_CI and skipped:
        terminalreporter.write_line(f"CI: {len(skipped)} tests were skipped; every test must run in CI", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if IN_CI and skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
