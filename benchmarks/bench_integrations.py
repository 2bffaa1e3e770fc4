"""A framework turn with the log as its store, against the framework's own default store.

What it measures, in one run, for each system, a conversation of ``turns`` turns:

- **pydantic-ai**: one turn is ``store.load`` + ``agent.run`` (pydantic-ai's ``TestModel``,
  offline, one tool) + ``store.save``.  Systems: ``InMemoryConversationStore`` (the only
  store pydantic-ai ships) and ``EventLogConversationStore`` on a log in each durability
  mode.
- **Google ADK**: one turn is ``Runner.run_async`` with a scripted model (one user event
  and one model event appended, the session read once).  Systems: ADK's
  ``DatabaseSessionService`` on a SQLite file (``sqlite+aiosqlite``, SQLite's defaults:
  rollback journal, ``synchronous=FULL``), ADK's ``InMemorySessionService``, and
  ``EventLogSessionService`` on a log in each durability mode.

Reported per system: the median and p90 of the whole turn, the median of the store's own
share of it (the time inside the store's calls), and ``ratio``: the turn's median over the
reference store's (``DatabaseSessionService`` for ADK, ``InMemoryConversationStore`` for
pydantic-ai, which never writes a disk).  Systems run turn by turn in a shuffled order, so
machine noise spreads over all of them.

Run it::

    python -m benchmarks.bench_integrations            # 60 turns per conversation
    python -m benchmarks.bench_integrations --quick    # 6
    python -m benchmarks.bench_integrations --json benchmarks/results/integrations.json
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import run_main, scratch, summary, table

PYDANTIC_REFERENCE = "pydantic-ai InMemoryConversationStore"
ADK_REFERENCE = "adk DatabaseSessionService (SQLite)"
MODES = ("full", "process")


class _Clock:
    """Time spent inside a store's calls."""

    def __init__(self) -> None:
        self.ns = 0

    def wrap(self, target: Any, *names: str) -> None:
        for name in names:
            method = getattr(target, name)

            async def timed(*args: Any, _method: Callable[..., Any] = method, **kwargs: Any) -> Any:
                start = time.perf_counter_ns()
                try:
                    return await _method(*args, **kwargs)
                finally:
                    self.ns += time.perf_counter_ns() - start

            object.__setattr__(target, name, timed)


def _pydantic_systems(root: Path, opened: list[Any]) -> dict[str, Any]:
    from pydantic_ai.conversation_store import InMemoryConversationStore

    from eventlog import EventLog
    from eventlog.integrations.pydantic_ai import EventLogConversationStore

    systems: dict[str, Any] = {PYDANTIC_REFERENCE: InMemoryConversationStore()}
    for mode in MODES:
        log = EventLog.open(root / f"pydantic-ai-{mode}", durability=mode)
        opened.append(log)
        systems[f"pydantic-ai EventLogConversationStore ({mode})"] = EventLogConversationStore(log)
    return systems


def _adk_systems(root: Path, opened: list[Any]) -> dict[str, Any]:
    from google.adk.sessions import DatabaseSessionService, InMemorySessionService

    from eventlog import EventLog
    from eventlog.integrations.adk import EventLogSessionService

    systems: dict[str, Any] = {
        ADK_REFERENCE: DatabaseSessionService(f"sqlite+aiosqlite:///{root / 'adk.db'}"),
        "adk InMemorySessionService": InMemorySessionService(),
    }
    for mode in MODES:
        log = EventLog.open(root / f"adk-{mode}", durability=mode)
        opened.append(log)
        systems[f"adk EventLogSessionService ({mode})"] = EventLogSessionService(log)
    return systems


async def _run(turns: int, root: Path) -> list[dict[str, Any]]:
    from google.adk.agents import LlmAgent
    from google.adk.apps import App
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.adk.runners import Runner
    from google.genai import types
    from pydantic_ai import Agent
    from pydantic_ai.conversation import Conversation
    from pydantic_ai.models.test import TestModel
    from pydantic_ai.usage import UsageLimits

    class Scripted(BaseLlm):
        model: str = "scripted"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text="An answer " * 20)]))

    agent: Agent[None, str] = Agent(TestModel())

    @agent.tool_plain
    def lookup(query: str) -> str:
        """Look something up."""
        return "found " * 30

    unlimited = UsageLimits(request_limit=None)
    opened: list[Any] = []
    samples: dict[str, list[int]] = {}
    shares: dict[str, list[int]] = {}
    try:
        pydantic_stores = _pydantic_systems(root, opened)
        adk_services = _adk_systems(root, opened)
        clocks: dict[str, _Clock] = {}
        for name, store in pydantic_stores.items():
            clocks[name] = _Clock()
            clocks[name].wrap(store, "load", "save")
        runners: dict[str, Any] = {}
        for name, service in adk_services.items():
            clocks[name] = _Clock()
            clocks[name].wrap(service, "get_session", "append_event", "create_session")
            await service.create_session(app_name="bench", user_id="u", session_id="s")
            agent_adk = LlmAgent(name="helper", model=Scripted())
            runners[name] = Runner(app=App(name="bench", root_agent=agent_adk), session_service=service)
        names = [*pydantic_stores, *adk_services]
        order = random.Random(17)
        for turn in range(turns):
            order.shuffle(names)
            for name in names:
                clock = clocks[name]
                clock.ns = 0
                prompt = f"Question number {turn}: " + "words " * 40
                start = time.perf_counter_ns()
                if name in pydantic_stores:
                    store = pydantic_stores[name]
                    conversation = await store.load("c") or Conversation(conversation_id="c")
                    # A long conversation adds up more model requests than the default limit allows.
                    result = await agent.run(prompt, conversation=conversation, usage_limits=unlimited)
                    await store.save(result)
                else:
                    message = types.Content(role="user", parts=[types.Part(text=prompt)])
                    async for _ in runners[name].run_async(user_id="u", session_id="s", new_message=message):
                        pass
                samples.setdefault(name, []).append(time.perf_counter_ns() - start)
                shares.setdefault(name, []).append(clock.ns)
    finally:
        for service in locals().get("adk_services", {}).values():
            close = getattr(service, "close", None)
            if close is not None:
                await close()
        for log in opened:
            log.close()
    rows = []
    for name in [*samples]:
        turn_summary = summary(samples[name])
        share = summary(shares[name])
        rows.append(
            {
                "framework": name.split()[0],
                "system": name,
                "turns": turns,
                "median_ms": turn_summary["median_ms"],
                "p90_ms": turn_summary["p90_ms"],
                "store_median_ms": share["median_ms"],
            }
        )
    for framework, reference in (("pydantic-ai", PYDANTIC_REFERENCE), ("adk", ADK_REFERENCE)):
        ref = next(row for row in rows if row["system"] == reference)
        for row in rows:
            if row["framework"] == framework:
                row["ratio"] = row["median_ms"] / ref["median_ms"]
                row["store_ratio"] = row["store_median_ms"] / ref["store_median_ms"]
    rows.sort(key=lambda row: (row["framework"], row["system"]))
    return rows


def run(*, quick: bool = False, scratch_dir: Path | None = None, turns: int | None = None) -> dict[str, Any]:
    count = turns or (6 if quick else 60)
    with scratch(scratch_dir, "integrations-") as root:
        rows = asyncio.run(_run(count, root))
    return {"turns": count, "rows": rows}


COLUMNS = [
    ("system", "system"),
    ("median_ms", "turn median ms"),
    ("p90_ms", "turn p90 ms"),
    ("ratio", "turn x reference"),
    ("store_median_ms", "store share median ms"),
    ("store_ratio", "store x reference"),
]


def render(result: dict[str, Any]) -> str:
    return (
        f"A turn over a conversation of {result['turns']} turns; reference: {ADK_REFERENCE} for ADK, "
        f"{PYDANTIC_REFERENCE} for pydantic-ai.\n\n" + table(result["rows"], COLUMNS)
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
