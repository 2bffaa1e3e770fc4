"""pydantic-ai's ConversationStore on the log: agent runs with TestModel, the same scenario
against InMemoryConversationStore, conflicts within and across processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed (pip install -e '.[test]')")

from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.messages import ModelRequest, UserPromptPart
from pydantic_ai.models.test import TestModel

from eventlog import EventLog
from eventlog.aio import AsyncEventLog
from eventlog.integrations.pydantic_ai import EventLogConversationStore


def make_agent() -> Agent[None, str]:
    agent: Agent[None, str] = Agent(TestModel())

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    return agent


async def turn(store: ConversationStore, agent: Agent[None, str], conversation_id: str, prompt: str, **kw: Any) -> Any:
    """One turn as pydantic-ai documents it: load (or start), run, save."""
    conversation = await store.load(conversation_id, scope=kw.get("scope")) or Conversation(
        conversation_id=conversation_id
    )
    result = await agent.run(prompt, conversation=conversation)
    return await store.save(result, **kw)


def shape(messages: list[Any]) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    """Messages without what differs from run to run (times, run ids)."""
    out = []
    for message in messages:
        parts = []
        for part in message.parts:
            content = getattr(part, "content", None)
            if content is None:
                content = getattr(part, "args", None)
            parts.append((part.part_kind, str(content)))
        out.append((message.kind, tuple(parts)))
    return out


async def scenario(store: ConversationStore) -> list[Any]:
    """Save, load, branch, switch back, fork, conflicts, scopes, listing, delete: what a user sees."""
    agent = make_agent()
    seen: list[Any] = []

    async def look(conversation_id: str, **kw: Any) -> None:
        loaded = await store.load(conversation_id, **kw)
        if loaded is None:
            seen.append((conversation_id, None))
            return
        record = await store.read_record(conversation_id)
        assert record is not None
        entries = await store.load_entries(conversation_id, **kw)
        assert entries is not None
        # Entries chain through their parents, and the history is the record's head's.
        assert [e.parent_id for e in entries[1:]] == [e.id for e in entries[:-1]]
        assert (entries[-1].id if entries else None) == record.head_id
        assert [e.message for e in entries] == loaded.messages
        seen.append(
            (
                conversation_id,
                shape(loaded.messages),
                len(record.branches),
                record.scope,
                record.forked_from,
                record.usage.requests,
            )
        )

    saved = await turn(store, agent, "c1", "hello")
    seen.append(("saved", len(saved)))
    await look("c1")
    saved = await turn(store, agent, "c1", "second turn")
    seen.append(("saved", len(saved)))
    await look("c1")
    await look("c1", limit=3)

    # Branch after the first turn, continue there, then switch back.
    record = await store.read_record("c1")
    assert record is not None
    branched = await store.branch("c1", at=4, expected_revision=record.revision)
    result = await make_agent().run("alternative", conversation=branched)
    await store.save(result)
    await look("c1")
    record = await store.read_record("c1")
    assert record is not None and record.branches
    back = await store.branch("c1", from_entry=record.branches[-1], expected_revision=record.revision)
    seen.append(("back", shape(back.messages)))
    await look("c1")

    # A fork shares the first turn and goes its own way.
    forked = await store.fork("c1", at=4, new_conversation_id="f1")
    result = await make_agent().run("fork turn", conversation=forked)
    await store.save(result)
    await look("f1")
    await look("c1")

    # Two writers of one conversation: the second save conflicts.
    first = await store.load("c1")
    second = await store.load("c1")
    assert first is not None and second is not None
    await store.save(await make_agent().run("writer one", conversation=first))
    try:
        await store.save(await make_agent().run("writer two", conversation=second))
        seen.append(("second writer", "saved"))
    except ConversationConflict as e:
        seen.append(("second writer", "conflict", e.conversation_id))
    # A conversation started fresh under a stored id conflicts too.
    try:
        await store.save(await make_agent().run("fresh", conversation=Conversation(conversation_id="c1")))
        seen.append(("fresh over stored", "saved"))
    except ConversationConflict:
        seen.append(("fresh over stored", "conflict"))

    # Scopes.
    await turn(store, agent, "s1", "alice's", scope="alice")
    await turn(store, agent, "s2", "bob's", scope="bob")
    await look("s1", scope="bob")
    await look("s1", scope="alice")
    seen.append(("alice lists", [r.conversation_id for r in await store.list_conversations(scope="alice")]))
    try:
        await turn(store, agent, "s1", "bob writes alice's", scope="bob")
        seen.append(("wrong scope save", "saved"))
    except ConversationConflict:
        seen.append(("wrong scope save", "conflict"))
    await store.delete("s1", scope="bob")
    await look("s1")

    # Listing: most recently saved first, limited.
    seen.append(("listing", [r.conversation_id for r in await store.list_conversations()]))
    seen.append(("listing 2", [r.conversation_id for r in await store.list_conversations(limit=2)]))

    # Delete the source: the fork survives with the history it shares.
    await store.delete("c1")
    await look("c1")
    await look("f1")
    seen.append(("listing after delete", [r.conversation_id for r in await store.list_conversations()]))
    # The id can be used again, from scratch.
    saved = await turn(store, agent, "c1", "reborn")
    seen.append(("saved", len(saved)))
    await look("c1")
    return seen


def test_the_same_scenario_gives_what_the_in_memory_store_gives(tmp_path: Path) -> None:
    expected = asyncio.run(scenario(InMemoryConversationStore()))
    with EventLog.open(tmp_path / "log") as log:
        got = asyncio.run(scenario(EventLogConversationStore(log)))
    assert got == expected
    assert ("second writer", "conflict", "c1") in got  # the scenario exercises what it claims
    assert ("c1", None) in got


def test_agent_turns_resume_from_the_log_and_the_log_shows_the_conversation(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            store = EventLogConversationStore(log)
            agent = make_agent()
            for prompt in ["first", "second", "third"]:
                conversation = await store.load("chat") or Conversation(conversation_id="chat")
                result = await agent.run(prompt, conversation=conversation)
                await store.save(result)
            loaded = await store.load("chat")
            assert loaded is not None
            # What the last run ended with, message for message (times, ids, tool calls).
            assert loaded.messages == result.all_messages()
            assert len(loaded.messages) > 6
            prompts = [
                part.content
                for message in loaded.messages
                if isinstance(message, ModelRequest)
                for part in message.parts
                if isinstance(part, UserPromptPart)
            ]
            assert prompts == ["first", "second", "third"]
            rows = log.sync.messages(store.transcript_session("chat"))
            assert [row["role"] for row in rows[:4]] == ["user", "assistant", "tool", "assistant"]
            assert rows[0]["content"] == "first"
            assert [row["entry_id"] for row in rows] == [e.id for e in await store.load_entries("chat") or []]

    asyncio.run(main())


def test_a_run_sees_the_history_it_resumed(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            store = EventLogConversationStore(log)
            await turn(store, make_agent(), "chat", "remember this")
        with EventLog.open(tmp_path / "log") as log:  # a new process would open it again
            store = EventLogConversationStore(log)
            conversation = await store.load("chat")
            assert conversation is not None
            result = await make_agent().run("and now?", conversation=conversation)
            sent = result.all_messages()
            assert shape(sent[:4]) == shape(conversation.messages)
            assert len(await store.save(result)) == len(sent) - 4  # only the new turn is stored

    asyncio.run(main())


def test_branch_and_delete_are_tombstones_and_forks_share_the_stored_messages(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            store = EventLogConversationStore(log)
            agent = make_agent()
            await turn(store, agent, "c", "one")
            await turn(store, agent, "c", "two")
            record = await store.read_record("c")
            before = await store.load_entries("c")
            assert record is not None and before is not None and len(before) > 4
            branched = await store.branch("c", at=4, expected_revision=record.revision)
            await store.save(await agent.run("other two", conversation=branched))
            transcript = store.transcript_session("c")
            reasons = [o.tombstone.reason for o in log.history(transcript) if o.tombstone is not None]
            assert reasons == ["rewind"] * (len(before) - 4)
            # The branch it left replays from the log.
            record = await store.read_record("c")
            assert record is not None and len(record.branches) == 1
            assert await store.read_history(record.branches[0]) == before

            forked = await store.fork("c", new_conversation_id="f")
            info = log.session(store.transcript_session("f"))
            assert info is not None and info.forked_from == transcript  # shares, copies nothing
            await store.delete("c")
            assert log.messages(transcript) == []
            reasons = [o.tombstone.reason for o in log.history(transcript) if o.tombstone is not None]
            assert reasons[-1] == "clear"
            again = await store.load("f")
            assert again is not None and again.messages == forked.messages
            # Entries of the deleted conversation stay readable: the log keeps them.
            assert (await store.read_entry(record.branches[0])).id == record.branches[0]

    asyncio.run(main())


def test_write_record_is_compare_and_set_over_the_record_and_its_entries(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            store = EventLogConversationStore(log)
            message = ModelRequest(parts=[UserPromptPart(content="hi")])
            entry = ConversationEntry(parent_id=None, message=message)
            record = ConversationRecord(conversation_id="c", head_id=entry.id)
            await store.write_record(record, new_entries=[entry], expected_revision=None)
            # Neither a stale revision nor a create over an existing record writes anything.
            before = log.last_seq
            other = ConversationEntry(parent_id=entry.id, message=message)
            for expected in [None, "not-the-revision"]:
                with pytest.raises(ConversationConflict):
                    await store.write_record(
                        ConversationRecord(conversation_id="c", head_id=other.id),
                        new_entries=[other],
                        expected_revision=expected,
                    )
            assert log.last_seq == before
            with pytest.raises(KeyError):
                await store.read_entry(other.id)
            # A head that names an entry nobody stored is a conflict too.
            with pytest.raises(ConversationConflict):
                await store.write_record(
                    ConversationRecord(conversation_id="d", head_id="no-such-entry"), expected_revision=None
                )
            assert log.last_seq == before
            assert await store.read_record("d") is None
            with pytest.raises(ConversationConflict):
                await store.delete_record("c", expected_revision="not-the-revision")
            assert await store.read_record("c") == record

    asyncio.run(main())


def test_each_message_is_stored_once(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            store = EventLogConversationStore(log)
            agent = make_agent()
            words = "every word of this prompt is stored once " * 20
            await turn(store, agent, "c", words)
            entries = await store.load_entries("c")
            assert entries is not None
            stored = [json.dumps(log.messages(sid)) for sid in log.sessions()]
            assert sum(text.count(words) for text in stored) == 1  # in the transcript's content, only
            # An entry's session says where the entry is; read_entry reads it from there.
            found = log.messages(f"pydantic-ai#entry:{entries[0].id}")
            assert found == [{"entry_id": entries[0].id, "parent_id": None, "conversation": "c", "position": 0}]
            assert [await store.read_entry(entry.id) for entry in entries] == entries

    asyncio.run(main())


def test_read_entry_reads_one_session_of_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            store = EventLogConversationStore(log)
            agent = make_agent()
            for i in range(20):
                await turn(store, agent, f"c{i}", f"prompt {i}")
            entries = await store.load_entries("c7")
            assert entries is not None
            read: list[str] = []
            real = log.messages

            def counting(session_id: str, **kw: Any) -> list[dict[str, Any]]:
                read.append(session_id)
                return real(session_id, **kw)

            looked_up: list[tuple[str, int]] = []
            at = log.message

            def counting_one(session_id: str, position: int) -> dict[str, Any] | None:
                looked_up.append((session_id, position))
                return at(session_id, position)

            monkeypatch.setattr(log, "messages", counting)
            monkeypatch.setattr(log, "message", counting_one)
            assert await store.read_entry(entries[2].id) == entries[2]
            # The entry's session, then one position of its conversation's transcript: no scan.
            assert read == [f"pydantic-ai#entry:{entries[2].id}"]
            assert looked_up == [(store.transcript_session("c7"), 2)]
            read.clear()
            # The history of a conversation's head: the entry, then one slice of its transcript.
            assert await store.read_history(entries[-1].id, limit=2) == entries[-2:]
            assert len(read) == 2

    asyncio.run(main())


WRITER = r"""
import asyncio, os, sys, time
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel
from eventlog import EventLog
from eventlog.integrations.pydantic_ai import EventLogConversationStore
from pydantic_ai.conversation_store import ConversationConflict

path, me, go = sys.argv[1], sys.argv[2], sys.argv[3]

async def main():
    with EventLog.open(path) as log:
        store = EventLogConversationStore(log)
        conversation = await store.load("shared")
        result = await Agent(TestModel()).run(f"writer {me}", conversation=conversation)
        open(f"{go}.{me}", "w").close()
        while not os.path.exists(go):
            time.sleep(0.005)
        try:
            await store.save(result)
            print("saved")
        except ConversationConflict:
            print("conflict")

asyncio.run(main())
"""


def test_writers_in_other_processes_conflict_instead_of_overwriting(tmp_path: Path) -> None:
    path = tmp_path / "log"

    async def seed() -> None:
        with EventLog.open(path) as log:
            await turn(EventLogConversationStore(log), make_agent(), "shared", "start")

    asyncio.run(seed())
    go = str(tmp_path / "go")
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(i), go], stdout=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(f"{go}.{i}") for i in range(3)):
        assert time.monotonic() < deadline, "the writers did not start"
        assert all(w.poll() is None for w in writers), [w.communicate() for w in writers]
        time.sleep(0.01)
    Path(go).touch()
    outcomes = sorted(w.communicate(timeout=60)[0].strip() for w in writers)
    assert outcomes == ["conflict", "conflict", "saved"]

    async def check() -> None:
        with EventLog.open(path) as log:
            loaded = await EventLogConversationStore(log).load("shared")
            assert loaded is not None and len(loaded.messages) == 4 + 2  # the start and one writer's turn

    asyncio.run(check())


def test_bad_arguments_are_refused_with_what_was_wrong(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(TypeError, match="EventLog or an AsyncEventLog"):
            EventLogConversationStore("not a log")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="namespace"):
            EventLogConversationStore(log, namespace="a:b")
        store = EventLogConversationStore(log)
        with pytest.raises(TypeError, match="conversation_id must be a str"):
            asyncio.run(store.read_record(3))  # type: ignore[arg-type]


FORK_THEN_DIE = r"""
import asyncio, os, signal, sys
from eventlog import EventLog
from eventlog.integrations.pydantic_ai import EventLogConversationStore

class Dying(EventLogConversationStore):
    def _fork_into(self, transcript, history):
        super()._fork_into(transcript, history)
        os.kill(os.getpid(), signal.SIGKILL)  # the fork is stored, its record is not

async def main():
    with EventLog.open(sys.argv[1]) as log:
        await Dying(log).fork("c", new_conversation_id="f")

asyncio.run(main())
"""


def test_a_crash_between_a_fork_and_its_record_leaves_no_conversation(tmp_path: Path) -> None:
    path = tmp_path / "log"

    async def seed() -> None:
        with EventLog.open(path) as log:
            await turn(EventLogConversationStore(log), make_agent(), "c", "hello")

    asyncio.run(seed())
    died = subprocess.run([sys.executable, "-c", FORK_THEN_DIE, str(path)], check=False)
    assert died.returncode == -9

    async def after() -> None:
        with EventLog.open(path) as log:
            store = EventLogConversationStore(log)
            assert log.messages(store.transcript_session("f"))  # the half-made fork's transcript
            assert await store.read_record("f") is None
            assert await store.load("f") is None
            assert "f" not in [r.conversation_id for r in await store.list_conversations()]
            forked = await store.fork("c", new_conversation_id="f")  # the id is free to use
            source = await store.load("c")
            assert source is not None and forked.messages == source.messages
            loaded = await store.load("f")
            assert loaded is not None and loaded.messages == source.messages
            tombstones = [o for o in log.history(store.transcript_session("f")) if o.tombstone is not None]
            assert tombstones == []

    asyncio.run(after())
