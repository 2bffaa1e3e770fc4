"""A hermes-agent plugin that flushes every hermes turn to the log.

hermes has no pluggable session store, but its plugins get a ``post_llm_call`` hook after
each completed turn, with the whole conversation as hermes holds it.  The plugin flushes that
list: whatever it already stored is recognised by content, so only the turn's new messages
are written; hermes' process-local keys (``_db_persisted`` and every other top-level ``_``
key) are not stored, and its recovery scaffolding (``_empty_recovery_synthetic``,
``_thinking_prefill``, ...) is dropped by the log's default scaffolding rule.  hermes'
context compression marks its summary with ``_compressed_summary``, which the log records
as a ``compaction``.

``eventlog hermes install [--home DIR]`` (:func:`install`) writes the plugin into hermes'
home (``$HERMES_HOME``, default ``~/.hermes``) and enables it in hermes' ``config.yaml``.
docs/integrations/hermes.md says what the hook does not see and how the log catches up.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import EventLog, HistoryMismatchError
from ..files import write_atomic
from . import require

require("hermes", "hermes_cli.plugins", distribution="hermes-agent")

import hermes_constants  # noqa: E402

__all__ = ["DEFAULT_LOG", "PLUGIN_NAME", "SETTINGS", "HermesRecorder", "Installed", "install", "plugin"]

logger = logging.getLogger("eventlog.hermes")

PLUGIN_NAME = "eventlog"
"""The plugin's name in hermes (its directory under ``<home>/plugins`` and its ``plugins.enabled`` entry)."""

SETTINGS = "settings.json"
"""The plugin's settings file, in its directory: ``{"log": path, "durability": mode}``."""

DEFAULT_LOG = "eventlog"
"""Where the log goes by default: this directory under hermes' home."""

_MANIFEST = """\
name: eventlog
version: "1"
description: Flush every turn to an agent-eventlog transcript log (written by `eventlog hermes install`).
author: agent-eventlog
kind: standalone
provides_hooks:
  - post_llm_call
"""

# The plugin module hermes loads: everything it does lives in this package.
_SHIM = '''\
"""agent-eventlog's hermes plugin (written by `eventlog hermes install`; the code is in eventlog.integrations.hermes)."""

from pathlib import Path

from eventlog.integrations.hermes import plugin

register = plugin(Path(__file__).resolve().parent)
'''


class HermesRecorder:
    """What the plugin does with hermes' hooks: flush each turn's conversation to the log.

    The log (``log_path``, ``durability``) is opened at the first turn and stays open for the
    life of the process.  Nothing here ever raises into hermes: a failure is logged and the
    next turn's flush writes whatever is missing.
    """

    def __init__(self, log_path: str | os.PathLike[str], *, durability: str = "full") -> None:
        self.log_path = os.fspath(log_path)
        self.durability = durability
        self._log: EventLog | None = None
        self._guard = threading.Lock()
        self._described: set[str] = set()

    def log(self) -> EventLog:
        """The log, opened on first use."""
        with self._guard:
            if self._log is None:
                self._log = EventLog.open(self.log_path, durability=self.durability)
            return self._log

    def close(self) -> None:
        with self._guard:
            if self._log is not None:
                self._log.close()
                self._log = None

    def on_post_llm_call(
        self,
        *,
        session_id: str | None = None,
        conversation_history: list[Any] | None = None,
        model: str | None = None,
        platform: str | None = None,
        **_: Any,
    ) -> None:
        """hermes' ``post_llm_call`` hook: flush ``conversation_history`` as session ``session_id``."""
        if not session_id or not isinstance(conversation_history, list) or not conversation_history:
            return
        try:
            self.flush(session_id, conversation_history, model=model, platform=platform)
        except Exception:
            logger.exception("eventlog: could not flush hermes session %r to %s", session_id, self.log_path)

    def flush(
        self, session_id: str, messages: list[Any], *, model: str | None = None, platform: str | None = None
    ) -> None:
        """Flush ``messages``; a list that no longer continues the stored one replaces it.

        hermes' list is the conversation the model sees, so it is the truth: when it shares
        no prefix with what was stored (hermes rewrote its history without a summary marker),
        it replaces the stored transcript (a ``clear`` tombstone) rather than being refused.
        """
        log = self.log()
        try:
            log.flush(session_id, messages)
        except HistoryMismatchError:
            log.flush(session_id, messages, replace=True)
        if session_id not in self._described:
            fields = {key: value for key, value in (("model", model), ("source", platform or "cli")) if value}
            log.update_session(session_id, **fields)
            self._described.add(session_id)


def plugin(directory: str | os.PathLike[str]) -> Callable[[Any], None]:
    """The ``register(ctx)`` of the plugin installed in ``directory`` (it reads its settings there)."""
    folder = Path(directory)
    settings = _read_settings(folder)
    recorder = HermesRecorder(settings["log"], durability=settings["durability"])

    atexit.register(recorder.close)  # hermes has no plugin unload; the log closes with the process

    def register(ctx: Any) -> None:
        ctx.register_hook("post_llm_call", recorder.on_post_llm_call)

    return register


def _read_settings(folder: Path) -> dict[str, str]:
    path = folder / SETTINGS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        data = {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a JSON object")
    log = data.get("log") or str(folder.parent.parent / DEFAULT_LOG)
    return {"log": os.path.expanduser(str(log)), "durability": str(data.get("durability") or "full")}


@dataclass(frozen=True)
class Installed:
    """What :func:`install` did: the plugin's directory, the log it writes, the config it enabled it in."""

    plugin_dir: Path
    log: Path
    durability: str
    config: Path
    already_enabled: bool


def default_home() -> Path:
    """hermes' home: ``$HERMES_HOME``, else its platform default (``~/.hermes``)."""
    return Path(hermes_constants.get_hermes_home())


def install(
    home: str | os.PathLike[str] | None = None, *, log: str | os.PathLike[str] | None = None, durability: str = "full"
) -> Installed:
    """Install the plugin into hermes' ``home`` and enable it.

    Writes ``<home>/plugins/eventlog/`` (``plugin.yaml``, ``__init__.py``, ``settings.json``,
    each whole or not at all) and adds ``eventlog`` to ``plugins.enabled`` in
    ``<home>/config.yaml`` through hermes' own config functions, as ``hermes plugins enable``
    does.  ``log`` defaults to ``<home>/eventlog``.  Installing again updates the settings.
    hermes must run in a Python environment where agent-eventlog is installed.
    """
    if durability not in ("full", "process", "none"):
        raise ValueError(f"durability must be 'full', 'process' or 'none', not {durability!r}")
    root = Path(home).expanduser() if home is not None else default_home()
    root = root.resolve()
    target = Path(log).expanduser().resolve() if log is not None else root / DEFAULT_LOG
    folder = root / "plugins" / PLUGIN_NAME
    folder.mkdir(parents=True, exist_ok=True)
    settings = json.dumps({"log": str(target), "durability": durability}, indent=2) + "\n"
    for name, text in (("plugin.yaml", _MANIFEST), ("__init__.py", _SHIM), (SETTINGS, settings)):
        write_atomic(folder / name, [text.encode("utf-8")])
    with _hermes_home(root):
        from hermes_cli.config import get_config_path, load_config, save_config

        config = load_config()
        plugins = config.get("plugins")
        if not isinstance(plugins, dict):
            plugins = config["plugins"] = {}
        enabled = plugins.get("enabled")
        enabled = list(enabled) if isinstance(enabled, list) else []
        disabled = plugins.get("disabled")
        already = PLUGIN_NAME in enabled and not (isinstance(disabled, list) and PLUGIN_NAME in disabled)
        if PLUGIN_NAME not in enabled:
            enabled.append(PLUGIN_NAME)
        plugins["enabled"] = sorted(enabled)
        if isinstance(disabled, list) and PLUGIN_NAME in disabled:
            plugins["disabled"] = [name for name in disabled if name != PLUGIN_NAME]
        save_config(config)
        config_path = Path(get_config_path())
    return Installed(folder, target, durability, config_path, already)


@contextlib.contextmanager
def _hermes_home(root: Path) -> Iterator[None]:
    """hermes' config functions read and write ``root`` (a context-local override: no environment change)."""
    token = hermes_constants.set_hermes_home_override(root)
    try:
        yield
    finally:
        hermes_constants.reset_hermes_home_override(token)
