"""The OpenAI Agents SDK and hermes adapters' per-turn cost against each framework's own default store, in one run.

What it measures: one session grows by one agent turn (10 messages: a user message, four
tool calls with their results, the answer) at a time, and after each turn every store
persists it the way the framework's loop does (ours in the log's ``full`` durability, two
fsyncs per commit, and ``process``, one, the same count as the SQLite stores' WAL commits):

- OpenAI Agents SDK: the ``Runner``'s store calls for a turn, ``get_items()`` (the whole
  history, read before the model call) then ``add_items(turn)``, awaited on one event loop,
  through our ``EventLogSession`` (on an ``EventLog`` in full durability) and through the
  SDK's own ``SQLiteSession`` (a file database, the SDK's settings: WAL, synchronous FULL,
  one transaction per ``add_items``).
- hermes-agent: the plugin's flush of the whole conversation (``HermesRecorder``, the log in
  full durability and in process durability) against hermes' own ``SessionDB`` written per turn the way the agent does
  (``benchmarks/systems.py``: one transaction per turn, FTS5 triggers).

The stores run in lockstep, in a shuffled order each turn, each in its own directory of one
scratch folder, so noise from a shared machine hits all of them alike.  Reported per store:
median, p90, p99 latency of a turn and the ratio of the framework's default store's median to
the adapter's (``x faster``: above 1, the adapter is faster).

Run it (from the repository root)::

    python -m benchmarks.bench_adapters            # 200 turns (2,000 messages)
    python -m benchmarks.bench_adapters --quick    # 30 turns
    python -m benchmarks.bench_adapters --json out.json
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import systems as sy
from benchmarks.harness import LATENCY_COLUMNS, now_ns, quiet_gc, run_main, scratch, summary, table
from benchmarks.workload import MESSAGES_PER_TURN, Workload
from eventlog import EventLog

SESSION = "bench"

DURABILITY = {
    "full": "LMDB full: data and meta page synced per commit (two fsyncs)",
    "process": "LMDB process: one fsync per commit",
}


class Store:
    """One store under test: ``turn(messages, new)`` persists a turn; ``close()`` ends it."""

    name = "?"
    framework = "?"
    durability = "?"
    default = False  # the framework's own default store (the reference of its ratio)

    def turn(self, messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class OpenAIStore(Store):
    """The Runner's per-turn store calls on one of the SDK's sessions, awaited on one loop."""

    framework = "OpenAI Agents SDK"

    def __init__(
        self, directory: Path, *, ours: bool, loop: asyncio.AbstractEventLoop, durability: str = "full"
    ) -> None:
        from agents import SQLiteSession

        from eventlog.integrations.openai_agents import EventLogSession

        self.loop = loop
        self.default = not ours
        if ours:
            self.log: EventLog | None = EventLog.open(directory / "log", durability=durability)
            self.session: Any = EventLogSession(SESSION, self.log)
            self.name = f"EventLogSession [{durability}]"
            self.durability = DURABILITY[durability]
        else:
            self.log = None
            self.session = SQLiteSession(SESSION, directory / "sdk.db")
            self.name = "SQLiteSession (the SDK's default store)"
            self.durability = sy.sqlite_synchronous(self.session._get_connection())

    def turn(self, messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        self.loop.run_until_complete(self._turn(new))

    async def _turn(self, new: list[dict[str, Any]]) -> None:
        await self.session.get_items()
        await self.session.add_items(new)

    def close(self) -> None:
        if self.log is not None:
            self.loop.run_until_complete(self.session.log.close())
            self.log.close()
        else:
            self.session.close()


class HermesPluginStore(Store):
    """The hermes plugin's work for a completed turn: one flush of the whole conversation."""

    framework = "hermes-agent"

    def __init__(self, directory: Path, durability: str = "full") -> None:
        from eventlog.integrations.hermes import HermesRecorder

        self.recorder = HermesRecorder(directory / "log", durability=durability)
        self.name = f"eventlog hermes plugin [{durability}]"
        self.durability = DURABILITY[durability]

    def turn(self, messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        self.recorder.flush(SESSION, messages, model="bench", platform="cli")

    def close(self) -> None:
        self.recorder.close()


class HermesSessionDBStore(Store):
    """hermes' own SessionDB, written per turn the way the agent's flush does."""

    framework = "hermes-agent"
    default = True

    def __init__(self, directory: Path) -> None:
        self.system = sy.HermesSystem(batch=True)
        self.system.open(directory)
        self.name = "hermes SessionDB (hermes' own store)"
        self.durability = self.system.durability

    def turn(self, messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        self.system.turn(SESSION, messages, new)

    def prepare(self, messages: list[dict[str, Any]], new: list[dict[str, Any]]) -> None:
        self.system.prepare(SESSION, messages, new)

    def close(self) -> None:
        self.system.close()


def stores(root: Path, loop: asyncio.AbstractEventLoop) -> list[Store]:
    makers: list[tuple[str, Callable[[Path], Store]]] = [
        ("openai-ours-full", lambda d: OpenAIStore(d, ours=True, loop=loop)),
        ("openai-ours-process", lambda d: OpenAIStore(d, ours=True, loop=loop, durability="process")),
        ("openai-sqlite", lambda d: OpenAIStore(d, ours=False, loop=loop)),
        ("hermes-ours-full", HermesPluginStore),
        ("hermes-ours-process", lambda d: HermesPluginStore(d, "process")),
        ("hermes-sessiondb", HermesSessionDBStore),
    ]
    out = []
    for name, make in makers:
        directory = root / name
        directory.mkdir()
        try:
            out.append(make(directory))
        except ImportError as e:  # a framework that is not installed is left out, with the reason
            print(f"skipped {name}: {e}")
    return out


def run(quick: bool = False, scratch_dir: Path | None = None, *, turns: int | None = None) -> dict[str, Any]:
    turns = turns or (30 if quick else 200)
    order = random.Random(19)
    loop = asyncio.new_event_loop()
    samples: dict[str, list[int]] = {}
    try:
        with scratch(scratch_dir, "adapters-") as root:
            active = stores(root, loop)
            try:
                with quiet_gc():
                    for messages, new in Workload(salt="integrations").session(turns * MESSAGES_PER_TURN):
                        for store in order.sample(active, len(active)):
                            if isinstance(store, HermesSessionDBStore):
                                store.prepare(messages, new)  # the agent's own copy: not the store's cost
                            start = now_ns()
                            store.turn(messages, new)
                            samples.setdefault(store.name, []).append(now_ns() - start)
            finally:
                for store in active:
                    store.close()
    finally:
        loop.close()
    rows: list[dict[str, Any]] = []
    for store in active:
        row = {
            "framework": store.framework,
            "system": store.name,
            "durability": store.durability,
            "default": store.default,
        }
        row.update(summary(samples[store.name], MESSAGES_PER_TURN))
        rows.append(row)
    for row in rows:
        reference = next((r for r in rows if r["framework"] == row["framework"] and r["default"]), None)
        row["x_faster"] = reference["median_ms"] / row["median_ms"] if reference and row["median_ms"] else None
        row["ratio_to"] = reference["system"] if reference else None
    return {
        "scenario": "OpenAI Agents SDK and hermes adapters against the frameworks' default stores",
        "turns": turns,
        "rows": rows,
    }


COLUMNS = [("framework", "framework"), *LATENCY_COLUMNS[:5], ("x_faster", "x faster than the default store")]


def render(result: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"Per-turn store cost, one session grown to {result['turns']} turns of 10 messages, the stores in "
            "lockstep (x faster: the framework's default store's median turn / this store's)",
            "",
            table(result["rows"], COLUMNS),
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    return run_main(__doc__, run, render, argv)


if __name__ == "__main__":
    main()
