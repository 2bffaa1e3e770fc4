"""The integrations package: frameworks imported only with their module, one-line errors, as_async."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
from pathlib import Path

import pytest

from eventlog import EventLog
from eventlog.aio import AsyncEventLog
from eventlog.integrations import EXTRAS, MissingFrameworkError, as_async, require

FRAMEWORK_MODULES = ["agents", "hermes_cli", "run_agent", "pydantic_ai", "google.adk", "langgraph"]


def test_importing_eventlog_imports_no_framework() -> None:
    code = (
        "import sys, eventlog, eventlog.aio, eventlog.integrations, eventlog.cli\n"
        f"loaded = [m for m in {FRAMEWORK_MODULES!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_missing_framework_is_one_line_naming_the_extra() -> None:
    with pytest.raises(MissingFrameworkError) as caught:
        require("openai_agents", "no_such_framework_for_eventlog.sub")
    text = str(caught.value)
    assert text == (
        "eventlog.integrations.openai_agents needs no_such_framework_for_eventlog: "
        "pip install 'agent-eventlog[openai-agents]'"
    )
    assert "\n" not in text and isinstance(caught.value, ImportError)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_broken_dependency_of_an_installed_framework_is_not_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The framework is installed but something it imports is missing: that error surfaces as
    # itself, not as "install the extra" (which would not fix it).
    (tmp_path / "installed_framework_for_eventlog").mkdir()
    (tmp_path / "installed_framework_for_eventlog" / "__init__.py").write_text(
        "import missing_dependency_for_eventlog\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as caught:
        require("openai_agents", "installed_framework_for_eventlog")
    assert not isinstance(caught.value, MissingFrameworkError)
    assert caught.value.name == "missing_dependency_for_eventlog"


@pytest.mark.parametrize("integration", sorted(EXTRAS))
def test_every_extra_is_declared_in_pyproject(integration: str) -> None:
    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    name = EXTRAS[integration]
    assert name in extras
    assert f"agent-eventlog[{name}]" in extras["integrations"]


def test_as_async_wraps_each_log_once_and_leaves_it_open(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as sync:
        wrapper = as_async(sync)
        assert as_async(sync) is wrapper and wrapper.sync is sync
        assert as_async(wrapper) is wrapper

        async def main(log: AsyncEventLog) -> None:
            await log.flush("s", [{"role": "user", "content": "hi"}])
            await log.close()

        asyncio.run(main(wrapper))
        assert sync.messages("s") == [{"role": "user", "content": "hi"}]  # the log itself stays open
        again = as_async(sync)
        assert again is not wrapper and not again.closed  # a closed wrapper is replaced
        del wrapper, again
        gc.collect()
        assert isinstance(as_async(sync), AsyncEventLog)
    with pytest.raises(TypeError, match="EventLog or an AsyncEventLog"):
        as_async("log")  # type: ignore[arg-type]
