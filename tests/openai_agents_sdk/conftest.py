"""Run the OpenAI Agents SDK's own session tests (copied here, see README.md) against EventLogSession.

Each test module's ``SQLiteSession`` (and the compaction tests' ``SimpleListSession``) is
replaced by a stand-in that takes the same constructor arguments and is an
:class:`~eventlog.integrations.openai_agents.EventLogSession`: sessions built with the same
``db_path`` share one log (in a temporary directory), as they would share one SQLite file.
"""

from __future__ import annotations

import asyncio
import inspect
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (pip install -e '.[test]')")

from agents import set_tracing_disabled

from eventlog import EventLog
from eventlog.integrations.openai_agents import EventLogSession

# None of the copied tests is left out: none is about SQLite's internals (their files use a
# db_path only to share one store between sessions, which the stand-in maps to one log).


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "asyncio: run the coroutine test on a fresh event loop")
    config.addinivalue_line("markers", "allow_call_model_methods: the SDK's marker (no test here calls a real model)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    arguments = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    asyncio.run(pyfuncitem.obj(**arguments))
    return True


class _Logs:
    """One EventLog per ``db_path`` (":memory:" gets a log of its own each time)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.open: dict[str, EventLog] = {}

    def for_path(self, db_path: Any) -> EventLog:
        key = str(db_path)
        if key == ":memory:":
            key = f":memory:{len(self.open)}"
        log = self.open.get(key)
        if log is None:
            log = self.open[key] = EventLog.open(self.root / f"log-{len(self.open)}")
        return log

    def close(self) -> None:
        for log in self.open.values():
            log.close()


@pytest.fixture(autouse=True)
def _sessions_on_the_event_log(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[None]:
    set_tracing_disabled(True)  # the SDK would export traces to its backend
    monkeypatch.setenv("OPENAI_API_KEY", "test_key")  # as the SDK's conftest: clients are built, never called
    with tempfile.TemporaryDirectory() as tmp:
        logs = _Logs(Path(tmp))

        class SQLiteSession(EventLogSession):
            """EventLogSession built with SQLiteSession's arguments."""

            def __init__(
                self,
                session_id: str,
                db_path: Any = ":memory:",
                sessions_table: str = "agent_sessions",
                messages_table: str = "agent_messages",
                session_settings: Any = None,
            ) -> None:
                super().__init__(session_id, logs.for_path(db_path), session_settings=session_settings)

            def close(self) -> None:
                """SQLiteSession.close closes its connection; the logs close with the test."""

        class SimpleListSession(EventLogSession):
            """EventLogSession built with SimpleListSession's arguments."""

            def __init__(self, session_id: str = "test", history: list[Any] | None = None) -> None:
                super().__init__(session_id, logs.for_path(":memory:"))
                if history:
                    self.log.sync.append(self.log_session_id(), list(history))
                self._ignore_ids_for_matching = False

        module = request.module
        if hasattr(module, "SQLiteSession"):
            monkeypatch.setattr(module, "SQLiteSession", SQLiteSession)
        if hasattr(module, "SimpleListSession"):
            monkeypatch.setattr(module, "SimpleListSession", SimpleListSession)
        try:
            yield
        finally:
            logs.close()
            set_tracing_disabled(False)
