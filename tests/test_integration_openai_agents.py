"""EventLogSession: the OpenAI Agents SDK's Session protocol on the log, run through the SDK's Runner offline."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (pip install -e '.[test]')")

import httpx
from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled
from agents.extensions.memory import AdvancedSQLiteSession
from agents.memory import OpenAIResponsesCompactionSession
from agents.usage import Usage
from openai import AsyncOpenAI
from openai_agents_sdk.fake_model import FakeModel
from openai_agents_sdk.test_responses import get_function_tool_call, get_text_message
from test_aio import Gate, wait_for

from eventlog import EventLog
from eventlog.aio import AsyncEventLog
from eventlog.integrations.openai_agents import DELETED, EventLogSession


@pytest.fixture(autouse=True)
def _offline() -> Any:
    set_tracing_disabled(True)  # the SDK would export traces to its backend
    yield
    set_tracing_disabled(False)


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def tool_turns() -> list[list[Any]]:
    """What the scripted model answers, turn by turn: tool calls, then text."""
    return [
        [get_function_tool_call("get_weather", json.dumps({"city": "Paris"}), call_id="call-1")],
        [get_text_message("It is sunny in Paris.")],
        [get_text_message("Hello again.")],
        [get_function_tool_call("get_weather", json.dumps({"city": "Oslo"}), call_id="call-2")],
        [get_text_message("Oslo is sunny too.")],
    ]


async def run_conversation(session: Any, *, streamed: bool) -> list[list[Any]]:
    """Three user turns (two with a tool call) through the SDK's Runner; the items after each."""
    model = FakeModel()
    model.add_multiple_turn_outputs(tool_turns())
    agent = Agent(name="assistant", model=model, tools=[get_weather])
    after: list[list[Any]] = []
    for text in ["weather in Paris?", "hi", "and Oslo?"]:
        if streamed:
            result = Runner.run_streamed(agent, text, session=session)
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(agent, text, session=session)
        after.append(await session.get_items())
    return after


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_runner_gives_the_items_sqlite_session_gives(tmp_path: Path, streamed: bool) -> None:
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            ours = await run_conversation(EventLogSession("chat", log), streamed=streamed)
            reference = SQLiteSession("chat", tmp_path / "sdk.db")
            theirs = await run_conversation(reference, streamed=streamed)
            reference.close()
            assert ours == theirs  # after every turn
            final = ours[-1]
            types = [item.get("type", item.get("role")) for item in final]
            assert types.count("function_call") == 2 and types.count("function_call_output") == 2
            assert [m for m in await log.messages("chat")] == final
            # resumed by another session object (a restarted process): the same history
            assert await EventLogSession("chat", log).get_items() == final
            assert await EventLogSession("chat", log).get_items(limit=3) == final[-3:]

    asyncio.run(main())


def test_the_same_calls_give_the_same_items_as_sqlite_session(tmp_path: Path) -> None:
    # The protocol calls directly, step by step, against SQLiteSession (a differential test).
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            ours, theirs = EventLogSession("s", log), SQLiteSession("s", tmp_path / "sdk.db")
            user = {"role": "user", "content": "hi"}
            steps: list[tuple[str, Any]] = [
                ("get_items", None),
                ("pop_item", None),
                ("add_items", [user, {"role": "assistant", "content": "hello"}]),
                ("add_items", [user]),  # the same item again is a new item
                ("get_items", 2),
                ("pop_item", None),
                (
                    "add_items",
                    [
                        {"role": "user", "content": "ü 😊"},
                        {"type": "function_call_output", "call_id": "c", "output": "x"},
                    ],
                ),
                ("get_items", 0),
                ("clear_session", None),
                ("get_items", None),
                ("add_items", [user]),
                ("pop_item", None),
                ("pop_item", None),
            ]
            for name, argument in steps:
                args = () if argument is None else (argument,)
                assert await getattr(ours, name)(*args) == await getattr(theirs, name)(*args), name
                assert await ours.get_items() == await theirs.get_items(), name
            theirs.close()
            reasons = [o.tombstone.reason for o in log.history("s") if o.tombstone is not None]
            assert reasons == ["clear", "clear", "rewind", "clear", "clear", "rewind"]  # in the order stored
            assert len(log.history("s")) == 6  # nothing was deleted

    asyncio.run(main())


def test_a_retried_add_after_a_lost_acknowledgement_writes_nothing_twice(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            session = EventLogSession("s", log)
            # Cancelled while the write was under way: the write lands; the retry writes nothing.
            gate = Gate("question")
            first = asyncio.create_task(session.add_items([gate]))
            await wait_for(gate.reading)
            first.cancel()
            await asyncio.sleep(0.02)
            gate.open()
            with pytest.raises(asyncio.CancelledError):
                await first
            await session.add_items([gate])
            assert await session.get_items() == [{"role": "user", "content": "question"}]

            # Cancelled before any worker took it: nothing landed, so the retry writes it.
            blocker = Gate("held")
            busy = asyncio.create_task(log.flush("other", [blocker]))
            await wait_for(blocker.reading)
            narrow = AsyncEventLog(log.sync, max_workers=1)
            single = EventLogSession("t", narrow)
            occupy = Gate("occupies")
            holding = asyncio.create_task(narrow.flush("x", [occupy]))
            await wait_for(occupy.reading)
            queued = asyncio.create_task(single.add_items([{"role": "user", "content": "once"}]))
            await asyncio.sleep(0.02)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            occupy.open()
            blocker.open()
            await holding, await busy
            await single.add_items([{"role": "user", "content": "once"}])
            assert await single.get_items() == [{"role": "user", "content": "once"}]

            # Acknowledged, then the same items again: a new turn, written again.
            await single.add_items([{"role": "user", "content": "once"}])
            assert len(await single.get_items()) == 2
            await narrow.close()

    asyncio.run(main())


def test_branches_are_forks_and_match_advanced_sqlite_session(tmp_path: Path) -> None:
    async def scenario(session: Any) -> list[Any]:
        out: list[Any] = []
        for n in range(1, 4):
            await session.add_items([{"role": "user", "content": f"question {n}"}])
            await session.add_items([{"role": "assistant", "content": f"answer {n}"}])
        out.append(await session.create_branch_from_turn(2, "retry-2"))
        out.append(await session.get_items())
        await session.add_items([{"role": "user", "content": "question 2, asked differently"}])
        out.append(await session.get_items())
        out.append(
            [
                (b["branch_id"], b["message_count"], b["user_turns"], b["is_current"])
                for b in await session.list_branches()
            ]
        )
        await session.switch_to_branch("main")
        out.append(await session.get_items())
        out.append([t["turn"] for t in await session.get_conversation_turns()])
        out.append(await session.create_branch_from_content("question 3", "from-3"))
        out.append(await session.get_items())
        await session.switch_to_branch("retry-2")
        with pytest.raises(ValueError, match="current branch"):
            await session.delete_branch("retry-2")
        await session.delete_branch("from-3")
        out.append([b["branch_id"] for b in await session.list_branches()])
        with pytest.raises(ValueError, match="does not exist"):
            await session.switch_to_branch("from-3")
        with pytest.raises(ValueError, match="does not contain a user message"):
            await session.create_branch_from_turn(9)
        await session.delete_branch("retry-2", force=True)
        out.append(session._current_branch_id if hasattr(session, "_current_branch_id") else session.current_branch_id)
        out.append(await session.get_items())
        return out

    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            ours = await scenario(EventLogSession("conv", log))
            reference = AdvancedSQLiteSession(session_id="conv", db_path=tmp_path / "adv.db", create_tables=True)
            theirs = await scenario(reference)
            reference.close()
            assert ours == theirs
            # The branches are forks of the log: they share the prefix instead of copying it.
            branch = log.session("conv::branch::retry-2")
            assert branch is not None and branch.forked_from == "conv" and branch.fork_position == 2
            origins = [o.origin for o in log.history("conv::branch::retry-2")]
            assert origins[:2] == ["fork", "fork"]
            # Deleting closed the branch's session; nothing was deleted.
            deleted = log.session("conv::branch::from-3")
            assert deleted is not None and deleted.closed and deleted.close_reason == DELETED and deleted.length == 4

    asyncio.run(main())


def test_usage_per_turn_matches_advanced_sqlite_session(tmp_path: Path) -> None:
    async def scenario(session: Any) -> list[Any]:
        model = FakeModel()
        agent = Agent(name="assistant", model=model)
        out: list[Any] = []
        for n, tokens in enumerate([(10, 5), (20, 7)], start=1):
            model.set_hardcoded_usage(
                Usage(requests=1, input_tokens=tokens[0], output_tokens=tokens[1], total_tokens=sum(tokens))
            )
            model.set_next_output([get_text_message(f"answer {n}")])
            result = await Runner.run(agent, f"question {n}", session=session)
            await session.store_run_usage(result)
        await session.store_run_usage(result)  # stored again: replaces the turn, does not add
        out.append(await session.get_turn_usage(1))
        out.append(
            [(u["user_turn_number"], u["input_tokens"], u["output_tokens"]) for u in await session.get_turn_usage()]
        )
        out.append(await session.get_session_usage())
        out.append(await session.get_turn_usage(7))
        return out

    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            ours = await scenario(EventLogSession("u", log))
            reference = AdvancedSQLiteSession(session_id="u", db_path=tmp_path / "adv.db", create_tables=True)
            theirs = await scenario(reference)
            reference.close()
            assert ours[1:] == theirs[1:]
            for key in ("requests", "input_tokens", "output_tokens", "total_tokens"):
                assert ours[0][key] == theirs[0][key]
            info = log.session("u")
            assert info is not None and info.counters["input_tokens"] == 30 and info.counters["api_calls"] == 2

    asyncio.run(main())


def compaction_client(output: list[dict[str, Any]]) -> tuple[AsyncOpenAI, list[Any]]:
    """A real AsyncOpenAI client whose HTTP transport answers /responses/compact locally."""
    requests: list[Any] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path.endswith("/responses/compact"), request.url
        requests.append(json.loads(request.content))
        usage = {
            "input_tokens": 50,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 55,
        }
        body = {"id": "cmp_1", "created_at": 0, "object": "response.compaction", "output": output, "usage": usage}
        return httpx.Response(200, json=body)

    client = AsyncOpenAI(api_key="test", http_client=httpx.AsyncClient(transport=httpx.MockTransport(answer)))
    return client, requests


def test_the_sdk_compaction_session_writes_one_compaction_tombstone(tmp_path: Path) -> None:
    compacted = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather in Paris?"}]},
        {"type": "compaction", "id": "cmp_item_1", "encrypted_content": "opaque"},
    ]

    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            client, requests = compaction_client(compacted)
            session = OpenAIResponsesCompactionSession(
                "chat", underlying_session=EventLogSession("chat", log), client=client, compaction_mode="input"
            )
            await run_conversation(session, streamed=False)
            before = log.messages("chat")
            await session.run_compaction({"force": True})
            assert requests and requests[0]["input"] == before  # the SDK sent the stored history
            assert log.messages("chat") == compacted
            history = log.history("chat")
            reasons = {o.tombstone.reason for o in history if o.tombstone is not None}
            assert reasons == {"compaction"}  # not a clear followed by an append
            assert sum(o.tombstone is not None for o in history) == len(before)
            # The user's own clear through the compaction session is a clear.
            await session.clear_session()
            assert log.messages("chat") == []
            assert "clear" in {o.tombstone.reason for o in log.history("chat") if o.tombstone is not None}
            await client.close()

    asyncio.run(main())


def test_a_plain_clear_then_add_stays_a_clear(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            session = EventLogSession("s", log)
            await session.add_items([{"role": "user", "content": "a"}])
            await session.clear_session()
            await session.add_items([{"role": "user", "content": "b"}])
            reasons = [o.tombstone.reason for o in log.history("s") if o.tombstone is not None]
            assert reasons == ["clear"] and log.messages("s") == [{"role": "user", "content": "b"}]

    asyncio.run(main())


def test_without_the_sdk_the_import_error_is_one_line_naming_the_extra() -> None:
    code = "import sys\nsys.modules['agents'] = None\nimport eventlog.integrations.openai_agents\n"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last == (
        "eventlog.integrations.MissingFrameworkError: eventlog.integrations.openai_agents needs "
        "openai-agents: pip install 'agent-eventlog[openai-agents]'"
    )


def test_bad_session_ids_are_refused(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(ValueError, match="must not contain"):
            EventLogSession("a::branch::b", log)
        with pytest.raises(ValueError, match="empty"):
            EventLogSession("", log)
        with pytest.raises(TypeError, match="EventLog or an AsyncEventLog"):
            EventLogSession("s", str(tmp_path))  # type: ignore[arg-type]
