"""EventLogSaver under real LangGraph graphs: turns with tool calls, interrupts, time travel, removals, subgraphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langgraph", reason="needs agent-eventlog[langgraph]")

from crashkit import run_python
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, interrupt
from langgraph_graphs import agent_graph, scripted, without_ids

from eventlog import EventLog
from eventlog.integrations.langgraph import EventLogSaver, records_session


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def run_turns(graph: Any, thread: str, turns: int) -> None:
    for turn in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"question {turn}", id=f"user-{turn}")]}, config(thread))


def history_values(graph: Any, thread: str) -> list[tuple[str, list[Any]]]:
    return [
        (snapshot.config["configurable"]["checkpoint_id"], snapshot.values.get("messages", []))
        for snapshot in graph.get_state_history(config(thread))
    ]


def test_turns_with_tool_calls_match_the_in_memory_saver(tmp_path: Path) -> None:
    responses = scripted(4)
    with EventLog.open(tmp_path / "log") as log:
        ours = agent_graph(responses, EventLogSaver(log))
        theirs = agent_graph(responses, InMemorySaver())
        run_turns(ours, "t", 4)
        run_turns(theirs, "t", 4)
        state = ours.get_state(config("t")).values["messages"]
        assert without_ids(state) == without_ids(theirs.get_state(config("t")).values["messages"])
        assert len(state) == 4 * 2 + 2 * 2  # a user message and an answer per turn, a call and a result every other
        history = list(ours.get_state_history(config("t")))
        assert len(history) == len(list(theirs.get_state_history(config("t"))))
        # The conversation is the thread's session, as the log's own readers see it.
        rows = log.messages("t")
        with_tools = ["user", "assistant", "tool", "assistant"]
        assert [row["role"] for row in rows] == (with_tools + ["user", "assistant"]) * 2
        assert rows[2]["tool_call_id"] == "call-0" and rows[1]["tool_calls"][0]["name"] == "lookup"


def test_every_checkpoint_reads_back_the_same_from_a_fresh_process(tmp_path: Path) -> None:
    """The history a cached saver serves equals what a saver opened afresh reads from disk."""
    with EventLog.open(tmp_path / "log") as log:
        saver = EventLogSaver(log)
        graph = agent_graph(scripted(3), saver)
        run_turns(graph, "t", 3)
        seen = history_values(graph, "t")
        # Everything LangGraph put, as the saver that was handed it holds it, and as stored.
        held = [(c.config, c.checkpoint, c.metadata, c.parent_config, c.pending_writes) for c in saver.list(None)]
    with EventLog.open(tmp_path / "log") as log:
        fresh = agent_graph([], EventLogSaver(log))
        assert history_values(fresh, "t") == seen
        stored = [
            (c.config, c.checkpoint, c.metadata, c.parent_config, c.pending_writes)
            for c in fresh.checkpointer.list(None)
        ]
        assert stored == held and len(held) == len(seen)
    lengths = [len(messages) for _, messages in seen]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] == 3 * 2 + 2 * 2


def test_storage_grows_with_the_messages_not_their_square(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        graph = agent_graph(scripted(12, tools_every=0), EventLogSaver(log))
        run_turns(graph, "t", 12)
        history = log.history("t")
        assert len(history) == 24 and all(
            o.origin == "append" and o.tombstone is None for o in history
        )  # every message stored once, though every checkpoint holds the whole list
        assert len(log.messages("t")) == 24


def test_interrupt_and_resume(tmp_path: Path) -> None:
    def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt({"question": "approve?"})
        return {"messages": [AIMessage(content=f"approved: {answer}", id="approval")]}

    builder = StateGraph(MessagesState)
    builder.add_node("ask", ask)
    builder.add_edge(START, "ask")
    with EventLog.open(tmp_path / "log") as log:
        graph = builder.compile(checkpointer=EventLogSaver(log))
        out = graph.invoke({"messages": [HumanMessage(content="go", id="u")]}, config("t"))
        assert out["__interrupt__"][0].value == {"question": "approve?"}
        assert graph.get_state(config("t")).next == ("ask",)
    with EventLog.open(tmp_path / "log") as log:  # resumed by a new process
        graph = builder.compile(checkpointer=EventLogSaver(log))
        out = graph.invoke(Command(resume="yes"), config("t"))
        assert [m.content for m in out["messages"]] == ["go", "approved: yes"]
        assert graph.get_state(config("t")).next == ()


def test_time_travel_fork_keeps_every_checkpoint_exact(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        graph = agent_graph(scripted(4, tools_every=0), EventLogSaver(log))
        run_turns(graph, "t", 3)
        before = history_values(graph, "t")
        # Go back to the checkpoint after the first turn and continue from there.
        past = next(
            s for s in graph.get_state_history(config("t")) if len(s.values.get("messages", [])) == 2 and not s.next
        )
        graph.invoke({"messages": [HumanMessage(content="another path", id="fork-user")]}, past.config)
        now = graph.get_state(config("t")).values["messages"]
        assert [m.content for m in now[:3]] == ["question 0", now[1].content, "another path"]
        assert len(now) == 4
        # The old branch reads back exactly, though its messages left the live transcript.
        after = dict(history_values(graph, "t"))
        for checkpoint_id, messages in before:
            assert after[checkpoint_id] == messages
        assert [o.tombstone.reason for o in log.history("t") if o.tombstone] == ["rewind"] * 4
        assert [row["content"] for row in log.messages("t")] == [m.content for m in now]


def test_update_state_with_remove_message_tombstones(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        graph = agent_graph(scripted(3, tools_every=0), EventLogSaver(log))
        run_turns(graph, "t", 2)
        before = graph.get_state(config("t"))
        graph.update_state(config("t"), {"messages": [RemoveMessage(id="user-0")]})
        after = graph.get_state(config("t")).values["messages"]
        assert [m.id for m in after] == ["ai-0", "user-1", "ai-1"]
        assert [row["id"] for row in log.messages("t")] == ["ai-0", "user-1", "ai-1"]
        stones = [o for o in log.history("t") if o.tombstone]
        assert [o.tombstone.reason for o in stones] == ["clear"] * 4  # the first message went: no prefix is kept
        assert graph.get_state(before.config).values["messages"] == before.values["messages"]
        # Removing the last message is a rewind of the transcript.
        graph.update_state(config("t"), {"messages": [RemoveMessage(id="ai-1")]})
        assert [row["id"] for row in log.messages("t")] == ["ai-0", "user-1"]
        assert log.history("t")[-1].tombstone.reason == "rewind"  # type: ignore[union-attr]


def test_subgraph_namespaces_are_their_own_transcripts(tmp_path: Path) -> None:
    def inner_node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="from the subgraph", id="inner")]}

    inner = StateGraph(MessagesState)
    inner.add_node("inner_node", inner_node)
    inner.add_edge(START, "inner_node")
    sub = inner.compile()

    def ask_inside(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("inside?")
        return {"messages": [AIMessage(content=f"inner got {answer}", id="inner-answer")]}

    interrupting = StateGraph(MessagesState)
    interrupting.add_node("ask_inside", ask_inside)
    interrupting.add_edge(START, "ask_inside")

    outer = StateGraph(MessagesState)
    outer.add_node("child", sub)
    outer.add_node("asker", interrupting.compile())
    outer.add_edge(START, "child")
    outer.add_edge("child", "asker")
    with EventLog.open(tmp_path / "log") as log:
        saver = EventLogSaver(log)
        graph = outer.compile(checkpointer=saver)
        graph.invoke({"messages": [HumanMessage(content="hi", id="u")]}, config("t"))
        state = graph.get_state(config("t"), subgraphs=True)
        assert state.tasks[0].state is not None  # the interrupted subgraph's own checkpoint
        namespaces = {c.config["configurable"]["checkpoint_ns"] for c in saver.list(None)}
        assert "" in namespaces and any(ns.startswith("asker:") for ns in namespaces)
        out = graph.invoke(Command(resume="yes"), config("t"))
        assert [m.content for m in out["messages"]] == ["hi", "from the subgraph", "inner got yes"]
        assert [row["content"] for row in log.messages("t")] == ["hi", "from the subgraph", "inner got yes"]
        assert records_session("t") in log


def test_delete_thread_tombstones_and_keeps_history(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        saver = EventLogSaver(log)
        graph = agent_graph(scripted(2, tools_every=0), saver)
        run_turns(graph, "t", 2)
        saver.delete_thread("t")
        assert saver.get_tuple(config("t")) is None
        assert graph.get_state(config("t")).values == {}
        assert log.messages("t") == []
        assert len(log.history("t")) == 4 and all(
            o.tombstone and o.tombstone.reason == "clear" for o in log.history("t")
        )
        # The thread starts again from nothing.
        graph = agent_graph(scripted(1, tools_every=0), saver)
        run_turns(graph, "t", 1)
        assert graph.get_state(config("t")).values["messages"][0].content == "question 0"


KILLED_BETWEEN_PUT_AND_PUT_WRITES = """
import os, signal, sys, time
sys.path.insert(0, sys.argv[3])
from langchain_core.messages import HumanMessage
from eventlog import EventLog
from eventlog.integrations.langgraph import EventLogSaver
from langgraph_graphs import agent_graph, scripted

kill_at = int(sys.argv[2])

class Dying(EventLogSaver):
    calls = 0

    def put_writes(self, config, writes, task_id, task_path=""):
        Dying.calls += 1
        if Dying.calls == kill_at:
            # LangGraph saves a checkpoint and its tasks' writes on worker threads: wait until the
            # checkpoint these writes belong to is stored, then die before they are.
            while self.get_tuple(config) is None:
                time.sleep(0.001)
            os.kill(os.getpid(), signal.SIGKILL)
        return super().put_writes(config, writes, task_id, task_path)

with EventLog.open(sys.argv[1]) as log:
    graph = agent_graph(scripted(2), Dying(log))
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({"messages": [HumanMessage(content="question 0", id="user-0")]}, config, durability="sync")
"""


@pytest.mark.parametrize("kill_at", [1, 3])
def test_a_process_killed_between_put_and_put_writes_resumes(tmp_path: Path, kill_at: int) -> None:
    path = str(tmp_path / "log")
    done = run_python(KILLED_BETWEEN_PUT_AND_PUT_WRITES, path, str(kill_at), str(Path(__file__).parent))
    assert done.returncode == -9, done.stderr
    with EventLog.open(path) as log:
        saver = EventLogSaver(log)
        graph = agent_graph(scripted(2), saver)
        stopped = graph.get_state(config("t"))
        assert stopped.next  # the run stopped half way
        assert len(list(graph.get_state_history(config("t")))) >= kill_at  # a checkpoint per step begun, at least
        out = graph.invoke(None, config("t"), durability="sync")  # resume
        expected = agent_graph(scripted(2), InMemorySaver())
        want = expected.invoke({"messages": [HumanMessage(content="question 0", id="user-0")]}, config("t"))
        assert without_ids(out["messages"]) == without_ids(want["messages"])
        assert [row.get("content") for row in log.messages("t")] == [m.content for m in out["messages"]]
        assert graph.get_state(config("t")).next == ()
        assert log.verify().ok


def test_a_message_edited_in_place_is_noticed(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        saver = EventLogSaver(log)
        graph = agent_graph(scripted(3, tools_every=0), saver)
        run_turns(graph, "t", 1)
        first = graph.get_state(config("t"))
        kept = first.values["messages"]
        # The saver hands back the objects it stored; someone edits one in place.
        kept[0].content = "edited in place"
        again = saver.get_tuple(config("t"))
        assert again is not None
        assert again.checkpoint["channel_values"]["messages"][0].content == "question 0"
        run_turns(graph, "t", 1)
        assert log.messages("t")[0]["content"] == "question 0"


def test_written_messages_are_stored_once_in_the_transcript(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        graph = agent_graph(scripted(3), EventLogSaver(log))
        for turn in range(3):
            message = HumanMessage(content=f"question {turn}", id=f"user-{turn}")
            graph.invoke({"messages": [message]}, config("t"), durability="sync")
        assert "t\x1fblobs" not in log  # every value was small or a message list
        records = log.messages("t\x1fcheckpoints")
        writes = [row for row in records if row["k"] == "w" and not row["p"].endswith("__start__")]
        refs = [ref for row in writes for _, channel, ref in row["w"] if channel == "messages"]
        # A task's new messages are appended to the conversation; its write refers to them there.
        # (A message without an id, a tool's result here, gets one from add_messages when the step
        # ends, maybe while its write is stored: that write may keep its own copy, without the id.)
        copies = [ref["r"] for ref in refs if "r" in ref]
        assert len(refs) == 7 and all(len(rows) == 1 and "id" not in rows[0] for rows in copies)
        assert len(copies) <= 2 and all(set(ref) == {"a", "n", "h"} for ref in refs if "r" not in ref)
        history = log.history("t")
        assert len(history) == 10 and all(o.origin == "append" and o.tombstone is None for o in history)
        # Every checkpoint is stored as what changed since its parent: a few hundred bytes, not the state.
        checkpoints = [row for row in records if row["k"] == "c"]
        assert sum(1 for row in checkpoints if row.get("d")) == len(checkpoints) - 1
        assert all(len(str(row)) < 700 for row in checkpoints[1:])
        # The writes read back as the messages they wrote, from a saver that did not write them.
        ours = [(c.checkpoint["id"], c.pending_writes) for c in EventLogSaver(log).list(config("t"))]
        assert ours == [(c.checkpoint["id"], c.pending_writes) for c in graph.checkpointer.list(config("t"))]
        written = [value for _, writes in ours for _, channel, value in writes if channel == "messages"]
        contents = sorted(m.content for values in written for m in values)
        assert contents == sorted(row["content"] for row in log.messages("t"))


def test_checkpoints_stored_in_the_background_leave_no_tombstones(tmp_path: Path) -> None:
    """LangGraph's default durability stores a checkpoint while the next step runs, so a task's
    writes may come before the checkpoint they belong to; nothing is appended on a guess."""
    with EventLog.open(tmp_path / "log") as log:  # commits that take a while: the steps overlap them
        graph = agent_graph(scripted(1), EventLogSaver(log))
        for thread in range(40):
            message = HumanMessage(content="question 0", id="user-0")
            graph.invoke({"messages": [message]}, config(f"t{thread}"), durability="async")
        for thread in range(40):
            history = log.history(f"t{thread}")
            assert [o.tombstone for o in history] == [None] * 4, thread
            assert [row["role"] for row in log.messages(f"t{thread}")] == ["user", "assistant", "tool", "assistant"]


def test_an_interrupted_step_keeps_its_finished_tasks_messages_once(tmp_path: Path) -> None:
    def early(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(content="done early", id="early")]}

    def ask(state: MessagesState) -> dict[str, Any]:
        answer = interrupt("approve?")
        return {"messages": [AIMessage(content=f"approved: {answer}", id="approval")]}

    builder = StateGraph(MessagesState)
    builder.add_node("early", early)
    builder.add_node("ask", ask)
    builder.add_edge(START, "early")
    builder.add_edge(START, "ask")
    with EventLog.open(tmp_path / "log") as log:
        graph = builder.compile(checkpointer=EventLogSaver(log))
        graph.invoke({"messages": [HumanMessage(content="go", id="u")]}, config("t"), durability="sync")
        assert graph.get_state(config("t")).next == ("ask",)
        stored = graph.checkpointer.get_tuple(config("t"))
        assert [m.id for m in stored.checkpoint["channel_values"]["messages"]] == ["u"]
        assert [m.id for _, channel, values in stored.pending_writes if channel == "messages" for m in values] == [
            "early"
        ]
        # The finished task's message is in the conversation already, pending for the stopped step.
        assert [row["id"] for row in log.messages("t")] == ["u", "early"]
    with EventLog.open(tmp_path / "log") as log:  # resumed by a new process
        graph = builder.compile(checkpointer=EventLogSaver(log))
        out = graph.invoke(Command(resume="yes"), config("t"), durability="sync")
        theirs = builder.compile(checkpointer=InMemorySaver())
        theirs.invoke({"messages": [HumanMessage(content="go", id="u")]}, config("t"))
        want = theirs.invoke(Command(resume="yes"), config("t"))
        assert out["messages"] == want["messages"]
        assert [row["id"] for row in log.messages("t")] == [m.id for m in out["messages"]]
        # LangGraph applies the step's writes in task order ("ask" first), not in the order the tasks
        # finished: the early message moves after the approval, its body carried, not stored again.
        history = [(o.message["id"], o.origin, o.tombstone.reason if o.tombstone else None) for o in log.history("t")]
        assert history == [
            ("u", "append", None),
            ("early", "append", "rewind"),
            ("approval", "append", None),
            ("early", "carry", None),
        ]
        assert log.verify().ok


def test_writes_for_a_checkpoint_of_another_branch_stay_out_of_the_conversation(tmp_path: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    def put(saver: EventLogSaver, parent: str | None, messages: list[Any], version: int) -> dict[str, Any]:
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": messages}
        checkpoint["channel_versions"] = {"messages": version}
        conf: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": "", "checkpoint_id": parent}}
        return saver.put(conf, checkpoint, {"source": "loop", "step": version, "parents": {}}, {"messages": version})

    a, b, x = (HumanMessage(content=text, id=text) for text in ("a", "b", "x"))
    with EventLog.open(tmp_path / "log") as log:
        saver = EventLogSaver(log)
        first = put(saver, None, [a, b], 1)
        put(saver, None, [a, x], 1)  # another branch of the same length: b is tombstoned
        late = AIMessage(content="late", id="late")
        saver.put_writes(first, [("messages", [late])], "task")
        assert [row["id"] for row in log.messages("t")] == ["a", "x"]
        found = EventLogSaver(log).get_tuple(first)
        assert found is not None and found.pending_writes == [("task", "messages", [late])]
        assert found.checkpoint["channel_values"]["messages"] == [a, b]


def test_delete_for_runs_keeps_the_rows_before_the_first_it_removes(tmp_path: Path) -> None:
    import uuid

    with EventLog.open(tmp_path / "log") as log:
        saver = EventLogSaver(log)
        graph = agent_graph(scripted(3), saver)
        runs = [uuid.uuid4() for _ in range(3)]
        for turn, run in enumerate(runs):
            message = HumanMessage(content=f"question {turn}", id=f"user-{turn}")
            graph.invoke({"messages": [message]}, {**config("t"), "metadata": {"run_id": str(run)}}, durability="sync")
        kept = [c for c in saver.list(config("t")) if c.metadata.get("run_id") != str(runs[1])]
        before = log.history(records_session("t"))
        saver.delete_for_runs([str(runs[1])])
        after = log.history(records_session("t"))
        first_gone = next(i for i, o in enumerate(after) if o.tombstone is not None)
        assert [o.node for o in after[:first_gone]] == [o.node for o in before[:first_gone]]
        assert first_gone > 0 and all(o.tombstone is None for o in after[len(before) :])
        # What is left reads back as it was, from the saver and from one that never saw it.
        for reader in (saver, EventLogSaver(log)):
            left = list(reader.list(config("t")))
            assert [(c.checkpoint, c.metadata, c.parent_config) for c in left] == [
                (c.checkpoint, c.metadata, c.parent_config) for c in kept
            ]


def test_eventlog_show_prints_the_conversation(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from eventlog.cli import cli

    with EventLog.open(tmp_path / "log") as log:
        graph = agent_graph(scripted(1), EventLogSaver(log))
        run_turns(graph, "t", 1)
    shown = CliRunner().invoke(cli, ["--log", str(tmp_path / "log"), "show", "t"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].startswith("[0] user: question 0")
    assert lines[1].startswith("[1] assistant: → lookup(") and "[call-0]" in lines[1]
    assert lines[2].startswith("[2] tool lookup (call-0): result for q0")
    assert lines[3].startswith("[3] assistant: answer 0")


def test_the_sqlite_projection_indexes_the_conversation(tmp_path: Path) -> None:
    from projections import SQLiteProjection

    projection = SQLiteProjection(tmp_path / "transcript.db", search_lag=0)
    try:
        with EventLog.open(tmp_path / "log", projections=[projection]) as log:
            graph = agent_graph(scripted(2), EventLogSaver(log))
            run_turns(graph, "t", 2)
            rows = projection.messages("t")
            assert [(row["role"], row["tool_call_id"]) for row in rows][:3] == [
                ("user", None),
                ("assistant", None),
                ("tool", "call-0"),
            ]
            hits = projection.search("question", session_id="t")
            assert sorted(hit["content"] for hit in hits) == ["question 0", "question 1"]
    finally:
        projection.close()


def test_values_that_are_not_json_like_round_trip_exactly(tmp_path: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    odd = HumanMessage(content="a tuple inside", id="odd", additional_kwargs={"pair": (1, 2)})
    plain = HumanMessage(content="plain", id="plain")
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"messages": [plain, odd], "raw": b"\x00\x01", "big": "x" * 5000}
    checkpoint["channel_versions"] = {"messages": 1, "raw": 1, "big": 1}
    metadata: Any = {"source": "loop", "step": 1, "parents": {}, "pair": (3, 4)}
    with EventLog.open(tmp_path / "log") as log:
        stored = EventLogSaver(log).put(config("t"), checkpoint, metadata, checkpoint["channel_versions"])
    with EventLog.open(tmp_path / "log") as log:
        found = EventLogSaver(log).get_tuple(stored)
        assert found is not None
        values = found.checkpoint["channel_values"]
        # What LangGraph's own serializer gives back, as its own savers do (it keeps no tuple in a message).
        serde = JsonPlusSerializer()
        assert values["messages"] == [plain, serde.loads_typed(serde.dumps_typed(odd))]
        assert values["raw"] == b"\x00\x01" and values["big"] == "x" * 5000
        assert found.metadata["pair"] == serde.loads_typed(serde.dumps_typed(metadata))["pair"]
        rows = log.messages("t")
        assert rows[0] == {"role": "user", "content": "plain", "id": "plain"}  # the compact row
        assert rows[1]["role"] == "user" and "langgraph_serde" in rows[1]  # kept in the serializer's form
        assert len(log.messages("t\x1fblobs")) == 1  # the large value, once


def test_an_async_graph_on_an_async_event_log(tmp_path: Path) -> None:
    import asyncio

    from eventlog.aio import AsyncEventLog

    async def main() -> list[Any]:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            graph = agent_graph(scripted(2), EventLogSaver(log))
            for turn in range(2):
                message = HumanMessage(content=f"question {turn}", id=f"user-{turn}")
                await graph.ainvoke({"messages": [message]}, config("t"))
            history = [s async for s in graph.aget_state_history(config("t"))]
            assert len(history) > 4
            return await log.messages("t")

    rows = asyncio.run(main())
    assert [row["role"] for row in rows] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
