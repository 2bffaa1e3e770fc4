"""Google ADK's session service on the log: the same calls as ADK's DatabaseSessionService give
the same sessions; a Runner with a scripted model; rewinds and compactions as tombstones."""

from __future__ import annotations

import asyncio
import copy
import os
import subprocess
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="google-adk is not installed (pip install -e '.[test]')")
pytest.importorskip("sqlalchemy", reason="google-adk[db] is not installed (pip install -e '.[test]')")

from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.apps.app import EventsCompactionConfig
from google.adk.apps.llm_event_summarizer import LlmEventSummarizer
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events import Event, EventActions
from google.adk.events.event_actions import EventCompaction
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import DatabaseSessionService
from google.adk.sessions.base_session_service import BaseSessionService, GetSessionConfig
from google.adk.sessions.session import Session
from google.genai import types
from pydantic import Field

from eventlog import EventLog
from eventlog.aio import AsyncEventLog
from eventlog.integrations.adk import EventLogSessionService


class ScriptedModel(BaseLlm):
    """A model that answers from a script, as ADK's own tests' MockModel does."""

    model: str = "scripted"
    responses: list[LlmResponse] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    @classmethod
    def supported_models(cls) -> list[str]:
        return ["scripted"]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        yield self.responses[len(self.requests) - 1]


def says(text: str) -> LlmResponse:
    return LlmResponse(content=types.Content(role="model", parts=[types.Part(text=text)]))


def calls(name: str, **args: Any) -> LlmResponse:
    return LlmResponse(
        content=types.Content(role="model", parts=[types.Part(function_call=types.FunctionCall(name=name, args=args))])
    )


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def view(session: Session | None) -> Any:
    """What a caller sees of a session, in a form two services can be compared by."""
    if session is None:
        return None
    return (
        session.id,
        session.app_name,
        session.user_id,
        session.state,
        [event.model_dump(mode="json", exclude_none=True) for event in session.events],
        round(session.last_update_time, 3),
    )


def scripted_events() -> list[Event]:
    t = 1_800_000_000.0
    return [
        Event(
            id="e1",
            invocation_id="i1",
            author="user",
            timestamp=t + 1,
            content=user("hello"),
            actions=EventActions(state_delta={"turns": 1, "app:mode": "fast", "user:lang": "en", "temp:scratch": 1}),
        ),
        Event(
            id="e2",
            invocation_id="i1",
            author="helper",
            timestamp=t + 2,
            content=types.Content(
                role="model", parts=[types.Part(function_call=types.FunctionCall(name="add", args={"a": 1}))]
            ),
        ),
        Event(
            id="e3",
            invocation_id="i1",
            author="helper",
            timestamp=t + 3,
            content=types.Content(
                role="user",
                parts=[types.Part(function_response=types.FunctionResponse(name="add", response={"result": 2}))],
            ),
            actions=EventActions(state_delta={"turns": 2, "user:lang": "fr"}),
        ),
        Event(id="e4", invocation_id="i2", author="helper", timestamp=t + 4, content=says("two").content),
        Event(
            id="e5",
            invocation_id="i2",
            author="helper",
            timestamp=t + 5,
            actions=EventActions(state_delta={"gone": None, "app:mode": "slow"}),
        ),
    ]


async def differential(service: BaseSessionService) -> list[Any]:
    """Create, append, state deltas, filters, listing, re-delivery, a stale writer, delete."""
    seen: list[Any] = []

    async def attempt(what: str, call: Any) -> Any:
        try:
            out = await call
        except (StaleSessionError, AlreadyExistsError, SessionNotFoundError) as e:
            seen.append((what, type(e).__name__))
            return None
        return out

    created = await service.create_session(
        app_name="app", user_id="ann", session_id="s1", state={"k": 1, "app:a": 1, "user:u": 1, "temp:t": 1}
    )
    seen.append(("created", view(created)))
    other = await service.create_session(app_name="app", user_id="bob", session_id="s2", state={"user:u": 9})
    seen.append(("other", view(other)))
    await attempt("duplicate", service.create_session(app_name="app", user_id="ann", session_id="s1"))

    session = created
    for event in scripted_events():
        await service.append_event(session, copy.deepcopy(event))
        seen.append(("appended", view(session)))
        stored = await service.get_session(app_name="app", user_id="ann", session_id="s1")
        seen.append(("stored", view(stored)))
    # The first event delivered again: stored once by both (the database service raises
    # SQLAlchemy's IntegrityError on the way; this service recognises the event and writes nothing).
    try:
        await service.append_event(session, copy.deepcopy(scripted_events()[0]))
    except Exception as e:
        assert type(service).__name__ == "DatabaseSessionService" and type(e).__name__ == "IntegrityError", e
    seen.append(("after redelivery", view(await service.get_session(app_name="app", user_id="ann", session_id="s1"))))
    for config in [
        GetSessionConfig(num_recent_events=2),
        GetSessionConfig(num_recent_events=0),
        GetSessionConfig(after_timestamp=1_800_000_003.0),
        GetSessionConfig(num_recent_events=1, after_timestamp=1_800_000_002.0),
        GetSessionConfig(num_recent_events=3, after_timestamp=1_800_000_004.0),
        GetSessionConfig(num_recent_events=50),
    ]:
        seen.append(
            ("filtered", view(await service.get_session(app_name="app", user_id="ann", session_id="s1", config=config)))
        )
    seen.append(("user state", await service.get_user_state(app_name="app", user_id="ann")))
    seen.append(("no user state", await service.get_user_state(app_name="app", user_id="nobody")))
    seen.append(("list ann", [view(s) for s in (await service.list_sessions(app_name="app", user_id="ann")).sessions]))
    seen.append(("list all", [view(s) for s in (await service.list_sessions(app_name="app")).sessions]))
    seen.append(("list other app", [view(s) for s in (await service.list_sessions(app_name="nope")).sessions]))

    # A stale writer: two copies loaded, both append.
    first = await service.get_session(app_name="app", user_id="ann", session_id="s1")
    second = await service.get_session(app_name="app", user_id="ann", session_id="s1")
    assert first is not None and second is not None
    await service.append_event(first, Event(id="e6", invocation_id="i3", author="user", timestamp=1_800_000_006.0))
    await attempt(
        "stale",
        service.append_event(second, Event(id="e7", invocation_id="i3", author="user", timestamp=1_800_000_007.0)),
    )
    seen.append(("after stale", view(await service.get_session(app_name="app", user_id="ann", session_id="s1"))))

    await service.delete_session(app_name="app", user_id="ann", session_id="s1")
    seen.append(("deleted", view(await service.get_session(app_name="app", user_id="ann", session_id="s1"))))
    await service.delete_session(app_name="app", user_id="ann", session_id="never")
    await attempt(
        "append to deleted",
        service.append_event(first, Event(id="e8", invocation_id="i4", author="user", timestamp=1_800_000_008.0)),
    )
    seen.append(("list after delete", [s.id for s in (await service.list_sessions(app_name="app")).sessions]))
    again = await service.create_session(app_name="app", user_id="ann", session_id="s1")
    seen.append(("created again", view(again)))
    return seen


def normalised(seen: list[Any]) -> list[Any]:
    """The database service stamps creations with the clock: compare those times as present."""

    def fix(item: Any) -> Any:
        if isinstance(item, tuple) and len(item) == 6 and isinstance(item[5], float) and item[5] < 1_800_000_000:
            return (*item[:5], "now")
        if isinstance(item, (list, tuple)):
            return type(item)(fix(x) for x in item)
        return item

    return fix(seen)


def test_get_session_returns_what_the_database_service_returns(tmp_path: Path) -> None:
    async def run_database() -> list[Any]:
        service = DatabaseSessionService(f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")
        try:
            return await differential(service)
        finally:
            await service.close()

    expected = asyncio.run(run_database())
    with EventLog.open(tmp_path / "log") as log:
        got = asyncio.run(differential(EventLogSessionService(log)))
    assert normalised(got) == normalised(expected)
    assert ("stale", "StaleSessionError") in got and ("duplicate", "AlreadyExistsError") in got
    assert ("append to deleted", "SessionNotFoundError") in got


def test_an_event_delivered_again_is_stored_once(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            service = EventLogSessionService(log)
            session = await service.create_session(app_name="app", user_id="u", session_id="s")
            event = Event(id="e1", invocation_id="i1", author="user", content=user("hi"))
            await service.append_event(session, event)
            seq = log.last_seq
            await service.append_event(session, copy.deepcopy(event))  # the same object's retry
            # A retry from a copy loaded before the first append landed (its acknowledgement lost).
            stale_copy = Session(id="s", app_name="app", user_id="u")
            await service.append_event(stale_copy, copy.deepcopy(event))
            assert log.last_seq == seq
            assert [e.id for e in session.events] == ["e1"] and [e.id for e in stale_copy.events] == ["e1"]
            stored = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert stored is not None and [e.id for e in stored.events] == ["e1"]

    asyncio.run(main())


STALE_WRITER = r"""
import asyncio, os, sys, time
from google.adk.errors import StaleSessionError
from google.adk.events import Event
from eventlog import EventLog
from eventlog.integrations.adk import EventLogSessionService

path, me, go = sys.argv[1], sys.argv[2], sys.argv[3]

async def main():
    with EventLog.open(path) as log:
        service = EventLogSessionService(log)
        session = await service.get_session(app_name="app", user_id="u", session_id="s")
        open(f"{go}.{me}", "w").close()
        while not os.path.exists(go):
            time.sleep(0.005)
        try:
            await service.append_event(session, Event(id=f"from-{me}", invocation_id="i", author="user"))
            print("appended", flush=True)
        except StaleSessionError:
            print("stale", flush=True)

asyncio.run(main())
"""


def test_writers_in_other_processes_holding_one_copy_get_adks_stale_error(tmp_path: Path) -> None:
    path = tmp_path / "log"

    async def create() -> None:
        with EventLog.open(path) as log:
            await EventLogSessionService(log).create_session(app_name="app", user_id="u", session_id="s")

    asyncio.run(create())
    go = str(tmp_path / "go")
    writers = [
        subprocess.Popen([sys.executable, "-c", STALE_WRITER, str(path), str(i), go], stdout=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    deadline = time.monotonic() + 60
    while not all(os.path.exists(f"{go}.{i}") for i in range(3)):
        assert time.monotonic() < deadline, "the writers did not start"
        assert all(w.poll() is None for w in writers), [w.communicate() for w in writers]
        time.sleep(0.01)
    Path(go).touch()  # all three append at once, each from the copy it loaded
    outcomes = sorted(w.communicate(timeout=60)[0].strip() for w in writers)
    assert outcomes == ["appended", "stale", "stale"]

    async def check() -> None:
        with EventLog.open(path) as log:
            session = await EventLogSessionService(log).get_session(app_name="app", user_id="u", session_id="s")
            assert session is not None and len(session.events) == 1

    asyncio.run(check())


class Turns:
    """A Runner over a session service, with a scripted model that records what it was sent."""

    def __init__(self, service: BaseSessionService, responses: list[LlmResponse], **app: Any) -> None:
        self.model = ScriptedModel(responses=responses)
        agent = LlmAgent(name="helper", model=self.model, tools=[add])
        self.runner = Runner(app=App(name="app", root_agent=agent, **app), session_service=service)
        self.service = service

    async def say(self, text: str) -> str:
        invocation = ""
        async for event in self.runner.run_async(user_id="u", session_id="s", new_message=user(text)):
            invocation = event.invocation_id
        return invocation

    def sent(self, request: int = -1) -> list[tuple[str, str]]:
        """What the model was sent: (role, text or call or result name) per content."""
        out = []
        for content in self.model.requests[request].contents:
            for part in content.parts or []:
                what = part.text or (part.function_call and part.function_call.name)
                what = what or (part.function_response and part.function_response.name) or ""
                out.append((content.role or "", what))
        return out


def shown(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The log's transcript in the same form as Turns.sent."""
    out = []
    for row in rows:
        role = "user" if row["role"] in ("user", "tool") else "model"
        for part in row["parts"]:
            what = part.get("text") or (part.get("function_call") or {}).get("name")
            what = what or (part.get("function_response") or {}).get("name") or ""
            out.append((role, what))
    return out


def test_runner_turns_rewind_and_the_log_shows_what_the_model_is_sent(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            service = EventLogSessionService(log)
            await service.create_session(app_name="app", user_id="u", session_id="s")
            turns = Turns(service, [calls("add", a=2, b=3), says("five"), says("ok two"), says("three"), says("four")])
            first = await turns.say("hi")
            second = await turns.say("two")
            await turns.say("three")
            transcript = service.transcript_session("app", "u", "s")
            session = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert session is not None and len(session.events) == 8
            assert [e.author for e in session.events] == ["user", "helper", "helper", "helper"] + [
                "user",
                "helper",
            ] * 2
            rows = log.sync.messages(transcript)
            assert [row["role"] for row in rows] == ["user", "assistant", "tool", "assistant"] + [
                "user",
                "assistant",
            ] * 2
            assert first != second

            await turns.runner.rewind_async(user_id="u", session_id="s", rewind_before_invocation_id=second)
            history = log.sync.history(transcript)
            assert [o.tombstone.reason for o in history if o.tombstone is not None] == ["rewind"] * 4
            # Every event stays in the session, as ADK's own services keep them.
            session = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert session is not None and len(session.events) == 9
            await turns.say("four")
            assert shown(log.sync.messages(transcript))[:-1] == turns.sent()
            assert turns.sent() == [
                ("user", "hi"),
                ("model", "add"),
                ("user", "add"),
                ("model", "five"),
                ("user", "four"),
            ]

    asyncio.run(main())


@pytest.mark.filterwarnings(r"ignore:\[EXPERIMENTAL\] EventsCompactionConfig:UserWarning")
def test_a_compaction_is_a_compaction_tombstone_and_the_summary_is_what_the_model_reads(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            service = EventLogSessionService(log)
            await service.create_session(app_name="app", user_id="u", session_id="s")
            summarizer = LlmEventSummarizer(llm=ScriptedModel(responses=[says("SUMMARY")] * 4))
            turns = Turns(
                service,
                [says("one"), says("two"), says("three")],
                events_compaction_config=EventsCompactionConfig(
                    compaction_interval=2, overlap_size=0, summarizer=summarizer
                ),
            )
            for text in ["a", "b", "c"]:
                await turns.say(text)
            transcript = service.transcript_session("app", "u", "s")
            reasons = [o.tombstone.reason for o in log.history(transcript) if o.tombstone is not None]
            assert reasons and set(reasons) == {"compaction"}
            rows = log.messages(transcript)
            assert rows[0]["content"] == "SUMMARY" and "compaction" in rows[0]
            assert shown(rows)[:-1] == turns.sent()
            # The events themselves are all kept, the compaction event among them.
            session = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert session is not None and any(e.actions.compaction for e in session.events)

    asyncio.run(main())


def test_a_compaction_event_appended_by_hand_tombstones_the_range(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            service = EventLogSessionService(log)
            session = await service.create_session(app_name="app", user_id="u", session_id="s")
            for event in scripted_events()[:4]:
                await service.append_event(session, event)
            compaction = EventCompaction(
                start_timestamp=1_800_000_001.0,
                end_timestamp=1_800_000_003.0,
                compacted_content=types.Content(role="model", parts=[types.Part(text="they added")]),
            )
            await service.append_event(
                session, Event(author="user", invocation_id="c", actions=EventActions(compaction=compaction))
            )
            transcript = service.transcript_session("app", "u", "s")
            assert [row["content"] for row in log.messages(transcript)] == ["they added", "two"]
            history = log.history(transcript)
            assert [o.tombstone.reason for o in history if o.tombstone is not None] == ["compaction"] * 4
            # Building the view again (another process, a restart) gives the same transcript.
            again = EventLogSessionService(log)
            session = await again.get_session(app_name="app", user_id="u", session_id="s")
            assert session is not None
            await again.append_event(
                session, Event(author="user", invocation_id="z", timestamp=1_800_000_010.0, content=user("more"))
            )
            assert [row["content"] for row in log.messages(transcript)] == ["they added", "two", "more"]
            assert len([o for o in log.history(transcript) if o.tombstone is not None]) == 4

    asyncio.run(main())


def test_any_app_user_and_session_ids_round_trip_through_the_log(tmp_path: Path) -> None:
    async def main() -> None:
        with EventLog.open(tmp_path / "log") as log:
            service = EventLogSessionService(log)
            ids = [("a/b", "u/1", "s#1"), ("a/b", "u%2F1", "s/2"), ("a", "u", "s:3"), ("a/b", "u/1", " padded ")]
            for app, user, session_id in ids:
                await service.create_session(app_name=app, user_id=user, session_id=session_id, state={"k": session_id})
            listed = (await service.list_sessions(app_name="a/b")).sessions
            assert sorted((s.user_id, s.id, s.state["k"]) for s in listed) == sorted(
                (user, session_id, session_id) for app, user, session_id in ids if app == "a/b"
            )
            only = (await service.list_sessions(app_name="a/b", user_id="u/1")).sessions
            assert sorted(s.id for s in only) == [" padded ", "s#1"]
            got = await service.get_session(app_name="a/b", user_id="u%2F1", session_id="s/2")
            assert got is not None and got.state == {"k": "s/2"}
            assert await service.get_session(app_name="a", user_id="b/u", session_id="s") is None

    asyncio.run(main())


def test_bad_arguments_are_refused_with_what_was_wrong(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log:
        with pytest.raises(TypeError, match="EventLog or an AsyncEventLog"):
            EventLogSessionService(object())  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="namespace"):
            EventLogSessionService(log, namespace="a/b")
        service = EventLogSessionService(log)
        with pytest.raises(TypeError, match="app_name must be a str"):
            asyncio.run(service.get_session(app_name=None, user_id="u", session_id="s"))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("module", "framework", "line"),
    [
        (
            "eventlog.integrations.adk",
            "google.adk.sessions",
            "eventlog.integrations.adk needs google-adk: pip install 'agent-eventlog[adk]'",
        ),
        (
            "eventlog.integrations.pydantic_ai",
            "pydantic_ai.conversation_store",
            "eventlog.integrations.pydantic_ai needs pydantic-ai: pip install 'agent-eventlog[pydantic-ai]'",
        ),
    ],
)
def test_without_its_framework_the_module_says_which_extra_to_install(module: str, framework: str, line: str) -> None:
    code = (
        "import sys\n"
        f"sys.modules[{framework!r}] = None  # as if the framework were not installed\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"MissingFrameworkError {line}"
