"""LangGraph checkpointers: bytes on disk and per-turn latency of a MessagesState agent.

A real ``StateGraph(MessagesState)`` (agent -> tools -> agent, LangChain's fake chat model
answering from a script, a real ``ToolNode``) runs with ``durability="sync"`` (every
checkpoint committed before the next step) against each checkpointer, interleaved turn by turn
in shuffled order in one process:

- ``EventLogSaver`` on a log in ``durability="full"`` (fsync of data and meta page per commit),
  and in ``durability="process"`` (one fsync per commit);
- LangGraph's ``SqliteSaver`` (its own setup: WAL, SQLite's default ``synchronous=FULL``);
- ``PostgresSaver`` when ``langgraph-checkpoint-postgres`` is installed and
  ``EVENTLOG_BENCH_POSTGRES`` (or ``EVENTLOG_TEST_POSTGRES``) names a server (a DSN), else
  reported as not measured.

Messages are about 1 KB (user questions, tool results and answers of 900-1,100 characters);
every other turn calls the tool (user, call, result, answer), the others are user and answer.

Measured:

1. **storage**: a 500-turn conversation; bytes on disk every 25 turns against the raw bytes of
   the messages (each message's ``model_dump()`` as JSON), and at the end;
2. **turn**: per-turn latency with 100, 1,000 and 5,000 messages already in the thread (put
   there by one ``update_state``), each timed turn a tool-calling turn (five checkpoints, four
   writes); beside it the same graph with no checkpointer (LangGraph's own cost) and the time
   spent inside each saver's methods;
3. **get_tuple**: the latest checkpoint of those threads, from the saver that wrote it (warm)
   and from a new saver on the same storage (cold: everything read from disk).

Run it::

    python -m benchmarks.bench_langgraph            # 500 turns; 100 / 1,000 / 5,000 messages
    python -m benchmarks.bench_langgraph --quick    # 40 turns; 100 / 500 messages
    python -m benchmarks.bench_langgraph --json benchmarks/results/langgraph.json --plot benchmarks/results
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.harness import machine, machine_line, now_ns, parser, quiet_gc, scratch, summary, table, write_json
from eventlog import EventLog

TURNS = 500
QUICK_TURNS = 40
SIZES = (100, 1_000, 5_000)
QUICK_SIZES = (100, 500)
SAMPLE_EVERY = 25
TURN_ROUNDS = 7
QUICK_TURN_ROUNDS = 3
TUPLE_ROUNDS = 20

WORDS = "agent tool call result message state graph node edge stream token model answer question".split()


def text(rng: random.Random, size: int) -> str:
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(WORDS)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


class Script:
    """The conversation: user texts and the model's replies, by turn (seeded, identical for every saver)."""

    def __init__(self, turns: int, seed: int = 7) -> None:
        from langchain_core.messages import AIMessage

        rng = random.Random(seed)
        self.users = [text(rng, rng.randint(900, 1100)) for _ in range(turns)]
        self.replies: list[Any] = []
        for turn in range(turns):
            if turn % 2 == 0:
                self.replies.append(
                    AIMessage(
                        content=text(rng, 200),
                        id=f"ai-{turn}-call",
                        tool_calls=[{"name": "lookup", "args": {"query": text(rng, 80)}, "id": f"call-{turn}"}],
                    )
                )
            self.replies.append(AIMessage(content=text(rng, rng.randint(900, 1100)), id=f"ai-{turn}"))
        self.result = text(rng, 1000)


def build(script: Script, checkpointer: Any, *, always_tools: bool = False) -> Any:
    """START -> agent -> (tools -> agent)* -> END; the agent's reply is the script's next one.

    ``always_tools``: every user message gets a tool call, then an answer (a turn of five
    checkpoints and four writes, whatever the thread held before).
    """
    from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode, tools_condition

    result = script.result

    @tool
    def lookup(query: str) -> str:
        """Look something up."""
        return result

    def agent(state: MessagesState) -> dict[str, Any]:
        messages = state["messages"]
        if always_tools:
            n = len(messages)
            if isinstance(messages[-1], HumanMessage):
                call = script.replies[0]
                calls = [{**call.tool_calls[0], "id": f"call-{n}"}]
                reply = call.model_copy(update={"id": f"ai-{n}-call", "tool_calls": calls})
            else:
                reply = script.replies[1].model_copy(update={"id": f"ai-{n}"})
        else:
            reply = script.replies[sum(isinstance(m, AIMessage) for m in messages) % len(script.replies)]
        model = FakeMessagesListChatModel(responses=[reply])
        return {"messages": [model.invoke(messages)]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([lookup]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=checkpointer)


def timed(cls: type) -> type:
    """``cls`` with the time spent in put, put_writes and get_tuple added up in ``spent_ns``."""

    class Timed(cls):  # type: ignore[misc, valid-type]
        spent_ns = 0
        calls = 0
        """put and put_writes calls: one transaction each for LangGraph's savers."""

        def put(self, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            start = now_ns()
            try:
                return super().put(*args, **kwargs)
            finally:
                self.spent_ns += now_ns() - start

        def put_writes(self, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            start = now_ns()
            try:
                return super().put_writes(*args, **kwargs)
            finally:
                self.spent_ns += now_ns() - start

        def get_tuple(self, *args: Any, **kwargs: Any) -> Any:
            start = now_ns()
            try:
                return super().get_tuple(*args, **kwargs)
            finally:
                self.spent_ns += now_ns() - start

    Timed.__name__ = cls.__name__
    return Timed


def _commits(saver: Any) -> int:
    """Transactions a saver committed: the log's own count for ours, a call count for LangGraph's."""
    from eventlog.integrations.langgraph import EventLogSaver

    return int(saver.log.info()["commits"]) if isinstance(saver, EventLogSaver) else int(saver.calls)


def breakdown(saver: Any, thread: str) -> list[dict[str, Any]]:
    """Where an EventLogSaver's rows are: per session of the thread, rows and their bytes (JSON)."""
    from eventlog.integrations.langgraph import SEP

    out = []
    for sid in saver.log.sessions():
        if sid != thread and not sid.startswith(thread + SEP):
            continue
        rows = saver.log.messages(sid)
        kinds: dict[str, int] = {}
        for row in rows:
            kind = {"c": "checkpoint", "w": "writes"}.get(row.get("k"), "message") if SEP in sid else "message"
            kinds[kind] = kinds.get(kind, 0) + 1
        size = sum(len(json.dumps(row, separators=(",", ":")).encode()) for row in rows)
        name = sid.replace(SEP, "␟")
        out.append(
            {"session": name, "rows": len(rows), "kinds": kinds, "mb": size / 1e6, "per_row": size / max(1, len(rows))}
        )
    return out


def postgres_dsn() -> str | None:
    return os.environ.get("EVENTLOG_BENCH_POSTGRES") or os.environ.get("EVENTLOG_TEST_POSTGRES")


def postgres_available() -> tuple[bool, str]:
    dsn = postgres_dsn()
    if not dsn:
        return False, "no server: set EVENTLOG_BENCH_POSTGRES to a DSN"
    try:
        import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError:
        return False, "langgraph-checkpoint-postgres is not installed"
    return True, dsn


class System:
    """One checkpointer under test: how to open it on fresh storage, and its bytes on disk."""

    def __init__(self, name: str, durability: str, open_: Callable[[Path], Any], size: Callable[[Any], int]) -> None:
        self.name, self.durability, self.open, self.size = name, durability, open_, size


def _sqlite_bytes(saver: Any) -> int:
    path = saver.bench_path
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))


def systems(stack: ExitStack) -> tuple[list[System], str]:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from eventlog.integrations.langgraph import EventLogSaver

    ours_cls, sqlite_cls = timed(EventLogSaver), timed(SqliteSaver)

    def ours(path: Path) -> Any:
        log = stack.enter_context(EventLog.open(path / "log"))
        return ours_cls(log)

    def ours_process(path: Path) -> Any:
        log = stack.enter_context(EventLog.open(path / "log", durability="process"))
        return ours_cls(log)

    def ours_bytes(saver: Any) -> int:
        return int(saver.log.info()["used_bytes"])

    def sqlite(path: Path) -> Any:
        file = path / "checkpoints.sqlite"
        conn = sqlite3.connect(file, check_same_thread=False)
        stack.callback(conn.close)
        saver = sqlite_cls(conn)
        saver.setup()
        saver.bench_path = str(file)
        return saver

    found = [
        System("eventlog EventLogSaver", "LMDB sync+metasync (power-loss safe)", ours, ours_bytes),
        System(
            "eventlog EventLogSaver [process]",
            "LMDB sync, no metasync (process-crash safe; an OS crash may undo the last commit)",
            ours_process,
            ours_bytes,
        ),
        System("langgraph SqliteSaver", "SQLite WAL synchronous=FULL", sqlite, _sqlite_bytes),
    ]
    ok, detail = postgres_available()
    if ok:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        postgres_cls = timed(PostgresSaver)
        counter = iter(range(1_000_000))

        def postgres(path: Path) -> Any:
            schema_dsn = detail
            conn = psycopg.connect(schema_dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
            stack.callback(conn.close)
            name = f"bench_{os.getpid()}_{next(counter)}"
            conn.execute(f"CREATE SCHEMA {name}")
            conn.execute(f"SET search_path TO {name}")
            saver = postgres_cls(conn)
            saver.setup()
            saver.bench_schema = name
            return saver

        def postgres_bytes(saver: Any) -> int:
            row = saver.conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind = 'r'",
                (saver.bench_schema,),
            ).fetchone()
            return int(next(iter(row.values())))

        found.append(
            System("langgraph PostgresSaver", "PostgreSQL (as the server is configured)", postgres, postgres_bytes)
        )
        return found, "measured"
    return found, f"not measured: {detail}"


def raw_bytes(message: Any) -> int:
    return len(json.dumps(message.model_dump(), ensure_ascii=False, separators=(",", ":")).encode())


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def user(script: Script, turn: int) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage

    return {"messages": [HumanMessage(content=script.users[turn % len(script.users)], id=f"user-{turn}")]}


def storage(found: list[System], root: Path, turns: int, rng: random.Random) -> dict[str, Any]:
    script = Script(turns)
    graphs = {}
    savers = {}
    for system in found:
        path = root / f"storage-{len(savers)}"
        path.mkdir()
        savers[system.name] = system.open(path)
        graphs[system.name] = build(script, savers[system.name])
    samples: list[dict[str, Any]] = []
    for turn in range(turns):
        order = list(found)
        rng.shuffle(order)
        for system in order:
            graphs[system.name].invoke(user(script, turn), config("t"), durability="sync")
        if (turn + 1) % SAMPLE_EVERY == 0 or turn + 1 == turns:
            messages = graphs[found[0].name].get_state(config("t")).values["messages"]
            raw = sum(map(raw_bytes, messages))
            point = {"turns": turn + 1, "messages": len(messages), "raw_bytes": raw}
            for system in found:
                point[system.name] = system.size(savers[system.name])
            samples.append(point)
    final = samples[-1]
    ours = found[0]
    parts = breakdown(savers[ours.name], "t")
    parts.append({"session": "(LMDB: whole log)", "rows": "", "kinds": "", "mb": final[ours.name] / 1e6, "per_row": ""})
    rows = [
        {
            "system": system.name,
            "durability": system.durability,
            "turns": final["turns"],
            "messages": final["messages"],
            "raw_mb": final["raw_bytes"] / 1e6,
            "disk_mb": final[system.name] / 1e6,
            "x_raw": final[system.name] / final["raw_bytes"],
        }
        for system in found
    ]
    return {"rows": rows, "samples": samples, "breakdown": parts}


def prefill(script: Script, count: int) -> list[Any]:
    from langchain_core.messages import HumanMessage, ToolMessage

    out: list[Any] = []
    turn = 0
    while len(out) < count:
        out.append(HumanMessage(content=script.users[turn % len(script.users)], id=f"pre-user-{turn}"))
        reply = script.replies[(2 * turn) % len(script.replies)]
        if reply.tool_calls:
            calls = [{**reply.tool_calls[0], "id": f"pre-call-{turn}"}]
            out.append(reply.model_copy(update={"id": f"pre-{turn}-call", "tool_calls": calls}))
            out.append(ToolMessage(content=script.result, tool_call_id=f"pre-call-{turn}", id=f"pre-tool-{turn}"))
        out.append(script.replies[(2 * turn + 1) % len(script.replies)].model_copy(update={"id": f"pre-ai-{turn}"}))
        turn += 1
    return out[:count]


def turn_latency(
    found: list[System], root: Path, sizes: tuple[int, ...], rounds: int, rng: random.Random
) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    tuples: list[dict[str, Any]] = []
    script = Script(64)
    for size in sizes:
        history = prefill(script, size)
        graphs, savers = {}, {}
        for index, system in enumerate(found):
            path = root / f"turn-{size}-{index}"
            path.mkdir()
            savers[system.name] = system.open(path)
            graphs[system.name] = build(script, savers[system.name], always_tools=True)
            graphs[system.name].update_state(config("t"), {"messages": history})
        bare = build(script, None, always_tools=True)
        bare_messages = list(history)
        samples: dict[str, list[int]] = {system.name: [] for system in found}
        inside: dict[str, list[int]] = {system.name: [] for system in found}
        commits: dict[str, list[int]] = {system.name: [] for system in found}
        samples["no checkpointer (LangGraph alone)"] = []
        names = [*(s.name for s in found), "no checkpointer (LangGraph alone)"]
        with quiet_gc():
            for turn in range(rounds + 1):  # the first round warms up
                rng.shuffle(names)
                for name in names:
                    message = user(script, 2 * turn)  # even turns call the tool: five checkpoints
                    if name == "no checkpointer (LangGraph alone)":
                        start = now_ns()
                        out = bare.invoke({"messages": bare_messages + message["messages"]})
                        elapsed = now_ns() - start
                        bare_messages = out["messages"]
                    else:
                        saver = savers[name]
                        before, written = saver.spent_ns, _commits(saver)
                        start = now_ns()
                        graphs[name].invoke(message, config("t"), durability="sync")
                        elapsed = now_ns() - start
                        if turn:
                            inside[name].append(saver.spent_ns - before)
                            commits[name].append(_commits(saver) - written)
                    if turn:
                        samples[name].append(elapsed)
        for name, values in samples.items():
            row = {"system": name, "messages": size, **summary(values)}
            if name in inside:
                row["saver_ms"] = summary(inside[name])["median_ms"]
                row["commits"] = sorted(commits[name])[len(commits[name]) // 2]
            rows.append(row)
        ours = next(r for r in rows if r["messages"] == size and r["system"] == found[0].name)
        for row in rows:
            if row["messages"] == size:
                row["x_ours"] = row["median_ms"] / ours["median_ms"]
        for system in found:
            saver = savers[system.name]
            cold = type(saver).__mro__[1]  # the saver class itself, untimed
            fresh = cold(saver.log) if system.name.startswith("eventlog") else saver
            for kind, target in (("warm", saver), ("cold", fresh)):
                values = []
                for _ in range(TUPLE_ROUNDS):
                    if kind == "cold" and system.name.startswith("eventlog"):
                        target = cold(saver.log)  # a new saver each time: nothing cached
                    start = now_ns()
                    found_tuple = target.get_tuple(config("t"))
                    values.append(now_ns() - start)
                    assert found_tuple is not None and len(found_tuple.checkpoint["channel_values"]["messages"]) >= size
                tuples.append({"system": system.name, "messages": size, "kind": kind, **summary(values)})
    return {"rows": rows, "get_tuple": tuples}


def run(
    *,
    quick: bool = False,
    scratch_dir: Path | None = None,
    turns: int | None = None,
    sizes: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    turns = turns or (QUICK_TURNS if quick else TURNS)
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    rounds = QUICK_TURN_ROUNDS if quick else TURN_ROUNDS
    rng = random.Random(11)
    with scratch(scratch_dir, "langgraph-") as root, ExitStack() as stack:
        found, postgres = systems(stack)
        result: dict[str, Any] = {"scenario": "langgraph checkpointers", "postgres": postgres}
        result["storage"] = storage(found, root, turns, rng)
        result["turn"] = turn_latency(found, root, sizes, rounds, rng)
    result["targets"] = targets(result)
    return result


def targets(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    ours = result["storage"]["rows"][0]
    out.append(
        {
            "target": f"bytes on disk after {ours['turns']} turns <= 1.5x the raw message bytes",
            "measured": f"{ours['x_raw']:.2f}x",
            "status": "met" if ours["x_raw"] <= 1.5 else "missed",
        }
    )
    at = [r for r in result["turn"]["rows"] if r["messages"] == 1_000]
    sqlite = next((r for r in at if r["system"] == "langgraph SqliteSaver"), None)
    if sqlite is not None:
        out.append(
            {
                "target": ">= 20x faster per turn than SqliteSaver at 1,000 messages (durability='sync')",
                "measured": f"{sqlite['x_ours']:.1f}x",
                "status": "met" if sqlite["x_ours"] >= 20 else "missed",
            }
        )
    return out


def render(result: dict[str, Any]) -> str:
    lines = ["Storage: one MessagesState conversation, bytes on disk at the end (x raw: / the messages' own JSON)", ""]
    lines.append(
        table(
            result["storage"]["rows"],
            [
                ("system", "system"),
                ("durability", "durability"),
                ("turns", "turns"),
                ("messages", "messages"),
                ("raw_mb", "raw MB"),
                ("disk_mb", "on disk MB"),
                ("x_raw", "x raw"),
            ],
        )
    )
    lines += ["", f"Where {result['storage']['rows'][0]['system']}'s bytes are (live rows, as JSON)", ""]
    lines.append(
        table(
            result["storage"]["breakdown"],
            [("session", "session"), ("rows", "rows"), ("kinds", "kinds"), ("mb", "MB"), ("per_row", "bytes/row")],
        )
    )
    lines += ["", "Per turn (a tool-calling turn: 5 checkpoints, 4 writes), durability='sync'", ""]
    lines.append(
        table(
            result["turn"]["rows"],
            [
                ("messages", "messages"),
                ("system", "system"),
                ("median_ms", "median ms"),
                ("p90_ms", "p90 ms"),
                ("saver_ms", "in saver ms"),
                ("commits", "commits"),
                ("x_ours", "x ours"),
            ],
        )
    )
    lines += ["", "get_tuple of the latest checkpoint (cold: a new saver, nothing cached)", ""]
    lines.append(
        table(
            result["turn"]["get_tuple"],
            [
                ("messages", "messages"),
                ("system", "system"),
                ("kind", "kind"),
                ("median_ms", "median ms"),
                ("p90_ms", "p90 ms"),
            ],
        )
    )
    lines += ["", f"PostgresSaver: {result['postgres']}", ""]
    lines.append(table(result["targets"], [("target", "target"), ("measured", "measured"), ("status", "status")]))
    return "\n".join(lines)


def plot(result: dict[str, Any], directory: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    samples = result["storage"]["samples"]
    names = [r["system"] for r in result["storage"]["rows"]]
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = [s["messages"] for s in samples]
    ax.plot(xs, [s["raw_bytes"] / 1e6 for s in samples], "k--", label="raw message bytes")
    for name in names:
        ax.plot(xs, [s[name] / 1e6 for s in samples], marker="o", label=name)
    ax.set_xlabel("messages in the conversation")
    ax.set_ylabel("MB on disk")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("LangGraph checkpointers: bytes on disk vs conversation length")
    storage_png = directory / "langgraph_storage.png"
    fig.tight_layout()
    fig.savefig(storage_png, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    rows = result["turn"]["rows"]
    for name in sorted({r["system"] for r in rows}):
        mine = [r for r in rows if r["system"] == name]
        ax.plot([r["messages"] for r in mine], [r["median_ms"] for r in mine], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("messages in the thread")
    ax.set_ylabel("median ms per turn (durability='sync')")
    ax.legend()
    ax.set_title("LangGraph checkpointers: per-turn latency vs conversation length")
    latency_png = directory / "langgraph_latency.png"
    fig.tight_layout()
    fig.savefig(latency_png, dpi=100)
    plt.close(fig)
    return [storage_png, latency_png]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = parser(__doc__)
    p.add_argument("--plot", type=Path, help="write langgraph_storage.png and langgraph_latency.png here")
    args = p.parse_args(argv)
    result = run(quick=args.quick, scratch_dir=args.scratch)
    result["machine"] = machine(args.scratch)
    print(machine_line(result["machine"]))
    print(render(result))
    if args.json:
        write_json(args.json, result)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        for path in plot(result, args.plot):
            print(f"wrote {path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
