"""The log as the session store of agent frameworks: one module per framework.

Each module imports its framework when it is itself imported, never at ``import eventlog``
time; a framework that is not installed gives one line naming the extra to install::

    ImportError: eventlog.integrations.openai_agents needs openai-agents: pip install 'agent-eventlog[openai-agents]'

The helpers here are shared by the adapters: :func:`require` (that import and its error) and
:func:`as_async` (one :class:`~eventlog.aio.AsyncEventLog` per :class:`~eventlog.EventLog`, so
an adapter handed either kind of log awaits its calls without blocking the event loop).
docs/integrations/ has the contract an adapter keeps and a page per framework.
"""

from __future__ import annotations

import importlib
import threading
import weakref
from types import ModuleType

from ..aio import AsyncEventLog
from ..log import EventLog

__all__ = ["EXTRAS", "AnyEventLog", "MissingFrameworkError", "as_async", "require"]

AnyEventLog = EventLog | AsyncEventLog
"""What an adapter accepts as its log."""

EXTRAS: dict[str, str] = {
    "openai_agents": "openai-agents",
    "hermes": "hermes",
    "pydantic_ai": "pydantic-ai",
    "adk": "adk",
}
"""The pip extra of each integration module (``agent-eventlog[<extra>]``); a module not listed
uses its own name with ``-`` for ``_``."""


class MissingFrameworkError(ImportError):
    """An integration was imported without its framework installed.

    The text is one line: what is missing and the ``pip install`` that brings it.  The
    framework's own ``ImportError`` is not chained, so the traceback ends at the import the
    user wrote.
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def require(integration: str, module: str, *, distribution: str | None = None) -> ModuleType:
    """Import ``module`` for ``eventlog.integrations.<integration>``, or raise a one-line error.

    ``distribution`` names the package to mention (default: the top-level module's name).
    Raises :class:`MissingFrameworkError` (an ``ImportError``) naming the extra of
    :data:`EXTRAS` when ``module`` cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name is not None and not (module == e.name or module.startswith(e.name + ".")):
            raise  # the framework is there but something it imports is broken: show that as it is
        extra = EXTRAS.get(integration, integration.replace("_", "-"))
        what = distribution or module.partition(".")[0]
        raise MissingFrameworkError(
            f"eventlog.integrations.{integration} needs {what}: pip install 'agent-eventlog[{extra}]'",
            name=module,
        ) from None


# Keyed by id(log): a wrapper holds its log, so the id is not reused while the entry lives, and
# the entry goes (and the wrapper's worker threads end) once no adapter holds the wrapper.
_wrappers: weakref.WeakValueDictionary[int, AsyncEventLog] = weakref.WeakValueDictionary()
_wrappers_guard = threading.Lock()


def as_async(log: AnyEventLog) -> AsyncEventLog:
    """``log`` itself when it is an :class:`AsyncEventLog`; else the one wrapper of this
    :class:`EventLog` (made on first use, shared by every adapter given that log, and
    leaving the log open: whoever opened the :class:`EventLog` closes it).

    Raises ``TypeError`` for anything else.
    """
    if isinstance(log, AsyncEventLog):
        return log
    if not isinstance(log, EventLog):
        raise TypeError(f"expected an EventLog or an AsyncEventLog, not {type(log).__name__}")
    with _wrappers_guard:
        wrapper = _wrappers.get(id(log))
        if wrapper is None or wrapper.closed or wrapper.sync is not log:
            wrapper = _wrappers[id(log)] = AsyncEventLog(log)
        return wrapper
