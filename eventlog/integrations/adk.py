"""The log as Google ADK's session service.

Two lines switch an app over::

    from eventlog.integrations.adk import EventLogSessionService
    runner = Runner(agent=agent, app_name="app", session_service=EventLogSessionService(log))

:class:`EventLogSessionService` implements ADK's ``BaseSessionService``: create, get, list
and delete sessions, ``append_event``, ``get_user_state``, the ``app:``/``user:``/``temp:``
state scopes and the ``GetSessionConfig`` filters, returning what ADK's
``DatabaseSessionService`` returns for the same calls.  An ADK session lives in the log as:

- ``<namespace>:<app>/<user>/<session>#events``: every event ADK appended, in order, as
  ADK serializes it (what ``get_session`` returns);
- ``<namespace>:<app>/<user>/<session>``: the **transcript**, the events the model sees
  next (rewound invocations left out, compacted ranges replaced by their summary, events
  without content skipped), so a ``Runner.rewind_async`` or a compaction becomes a
  ``rewind`` or ``compaction`` tombstone there and ``eventlog show`` shows the conversation
  the model will get;
- ``...#session``: the session's own state and times (one message, replaced per append);
- ``<namespace>:<app>#app-state`` and ``<namespace>:<app>/<user>#user-state``: the shared
  scopes.

Each append is one :meth:`~eventlog.EventLog.flush_many` of those sessions, with the head of
``#session`` that the caller's ``Session`` was loaded at as its compare-and-set: a writer
holding an older copy gets ADK's own ``StaleSessionError``, in this process or another.  An
event delivered again (same id) is recognised and not written twice.  Nothing is deleted: a
delete tombstones the session's messages (``clear``).  docs/integrations/adk.md has the whole
mapping.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import urllib.parse
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

from ..aio import AsyncEventLog
from ..errors import ConflictError
from ..log import EventLog
from ..writer import EMPTY_HEAD
from . import AnyEventLog, as_async, require

require("adk", "google.adk.sessions", distribution="google-adk")

from google.adk.errors import StaleSessionError  # noqa: E402  (after the framework check)
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events._rewind_events import _apply_rewinds  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.flows.llm_flows.contents import _process_compaction_events  # noqa: E402
from google.adk.platform import time as platform_time  # noqa: E402
from google.adk.platform import uuid as platform_uuid  # noqa: E402
from google.adk.sessions import _session_util  # noqa: E402
from google.adk.sessions.base_session_service import (  # noqa: E402
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session  # noqa: E402
from google.adk.sessions.state import State  # noqa: E402

__all__ = ["EventLogSessionService"]

STALE_MESSAGE: Final = (
    "The session has been modified in storage since it was loaded. "
    "Please reload the session before appending more events."
)
"""The text of ADK's own stale-session error, as its database service words it."""

WRITE_ATTEMPTS: Final = 8
"""Times a write reads again after a concurrent commit to a shared scope (app or user state)."""

CACHED_SESSIONS: Final = 256
"""Sessions whose stored events and transcript the service keeps in memory between appends
(checked against the log's head before each use, so another process's writes are seen)."""


def _quote(part: str, what: str) -> str:
    if not isinstance(part, str):
        raise TypeError(f"{what} must be a str, not {type(part).__name__}")
    return urllib.parse.quote(part, safe="")


def _event_row(event: Event) -> dict[str, Any]:
    row: dict[str, Any] = event.model_dump(exclude_none=True, mode="json")
    return row


def _text(parts: list[Any]) -> str:
    return "\n".join(part.text for part in parts if getattr(part, "text", None))


def _view_rows(events: list[Event]) -> tuple[list[dict[str, Any]], float]:
    """The transcript of ``events`` (what the model is sent next), and the newest end of a
    compacted range in them (an event older than it may land inside that range)."""
    by_actions = {id(event.actions): event for event in events if event.actions and event.actions.compaction}
    raw = {id(event) for event in events}
    rows: list[dict[str, Any]] = []
    newest_end = float("-inf")
    for event in _process_compaction_events(_apply_rewinds(events)):
        if id(event) in raw:
            row = _view_row(event)
            if row is not None:
                rows.append(row)
            continue
        # A summary ADK built for a compaction event: named after that event, so building
        # it again gives the same message.
        source = by_actions[id(event.actions)]
        compaction = source.actions.compaction
        assert compaction is not None
        newest_end = max(newest_end, compaction.end_timestamp)
        parts = compaction.compacted_content.parts or []
        rows.append(
            {
                "role": "assistant",
                "content": _text(parts),
                "author": event.author,
                "event_id": source.id,
                "invocation_id": source.invocation_id,
                "timestamp": compaction.end_timestamp,
                "compaction": {
                    "start_timestamp": compaction.start_timestamp,
                    "end_timestamp": compaction.end_timestamp,
                },
                "parts": [part.model_dump(exclude_none=True, mode="json") for part in parts],
                "_compressed_summary": True,
            }
        )
    return rows, newest_end


def _view_row(event: Event) -> dict[str, Any] | None:
    content = event.content
    if content is None or not content.parts:
        return None
    parts = content.parts
    if any(part.function_response for part in parts):
        role = "tool"
    elif content.role == "user":
        role = "user"
    else:
        role = "assistant"
    return {
        "role": role,
        "content": _text(parts),
        "author": event.author,
        "event_id": event.id,
        "invocation_id": event.invocation_id,
        "timestamp": event.timestamp,
        "parts": [part.model_dump(exclude_none=True, mode="json") for part in parts],
    }


@dataclass
class _Loaded:
    """A session's stored events and transcript as of the ``#session`` head ``head``."""

    head: str | None
    events: list[dict[str, Any]]
    ids: set[str]
    transcript: list[dict[str, Any]]
    compacted_until: float
    timestamps: list[float] = field(default_factory=list)


class EventLogSessionService(BaseSessionService):
    """An ADK session service that keeps sessions in an event log.

    ``log`` is an :class:`~eventlog.EventLog` or an :class:`~eventlog.aio.AsyncEventLog`;
    every call runs its reads and its one write on a worker thread, so the event loop is
    never blocked, and the service never closes the log.  ``namespace`` prefixes the log
    sessions it uses, so several services (or other integrations) can share one log.
    """

    def __init__(self, log: AnyEventLog, *, namespace: str = "adk") -> None:
        if not isinstance(log, (EventLog, AsyncEventLog)):
            raise TypeError(f"log must be an EventLog or an AsyncEventLog, not {type(log).__name__}")
        if not isinstance(namespace, str) or not namespace or any(c in namespace for c in ":#/"):
            raise ValueError(f"namespace must be a non-empty str without ':', '#' or '/', not {namespace!r}")
        self._async = as_async(log)
        self._log = self._async.sync
        self._namespace = namespace
        self._cache: OrderedDict[str, _Loaded] = OrderedDict()
        self._cache_guard = threading.Lock()
        # Appends to one session from this process take turns, as in ADK's database
        # service, so two tasks sharing one Session object do not make each other stale.
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    # -- where things live in the log -----------------------------------------

    def transcript_session(self, app_name: str, user_id: str, session_id: str) -> str:
        """The log session holding what the model sees of this ADK session (for ``eventlog show``)."""
        return (
            f"{self._namespace}:{_quote(app_name, 'app_name')}/{_quote(user_id, 'user_id')}/"
            f"{_quote(session_id, 'session_id')}"
        )

    def _app_session(self, app_name: str) -> str:
        return f"{self._namespace}:{_quote(app_name, 'app_name')}#app-state"

    def _user_session(self, app_name: str, user_id: str) -> str:
        return f"{self._namespace}:{_quote(app_name, 'app_name')}/{_quote(user_id, 'user_id')}#user-state"

    # -- BaseSessionService -----------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        if session_id is None:
            session_id = platform_uuid.new_uuid()
        base = self.transcript_session(app_name, user_id, session_id)
        return await self._async.run(self._create, app_name, user_id, state or {}, session_id, sessions=(base,))

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        return await self._async.run(self._get, app_name, user_id, session_id, config)

    async def list_sessions(self, *, app_name: str, user_id: str | None = None) -> ListSessionsResponse:
        return await self._async.run(self._list, app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        base = self.transcript_session(app_name, user_id, session_id)
        await self._async.run(self._delete, app_name, user_id, session_id, sessions=(base,))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return await self._async.run(self._state_of, self._user_session(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append ``event`` to ``session`` in the log, then to the ``Session`` object.

        Raises ADK's ``StaleSessionError`` when the session was written since ``session``
        was loaded (by this process or another), ``SessionNotFoundError`` when it was
        deleted.  An event whose id is already stored is not written again.
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        base = self.transcript_session(session.app_name, session.user_id, session.id)
        lock = self._locks.get(base)
        if lock is None:
            lock = self._locks[base] = asyncio.Lock()
        async with lock:
            outcome = await self._async.run(self._append, session, event, sessions=(base,))
        if outcome is None:
            if not any(existing.id == event.id for existing in session.events):
                session.events.append(event)  # a lost acknowledgement: it is stored, show it
            return event
        session.last_update_time, session._storage_update_marker = outcome
        return self._commit_event_to_session(session, event)

    # -- on the worker thread -----------------------------------------------------

    def _row(self, session_id: str) -> dict[str, Any] | None:
        rows = self._log.messages(session_id, last=1)
        return rows[-1] if rows else None

    def _state_of(self, session_id: str) -> dict[str, Any]:
        row = self._row(session_id)
        return dict(row["state"]) if row else {}

    def _create(self, app_name: str, user_id: str, state: dict[str, Any], session_id: str) -> Session:
        log = self._log
        base = self.transcript_session(app_name, user_id, session_id)
        record_session = base + "#session"
        deltas = _session_util.extract_json_safe_state_delta(state)
        now = platform_time.get_time()
        record = {
            "kind": "adk.session",
            "state": deltas["session"],
            "create_time": now,
            "update_time": now,
            "events": 0,
            "last_event_id": None,
        }
        for _ in range(WRITE_ATTEMPTS):
            if log.head(record_session) is not None or self._row(record_session) is not None:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            transcripts: dict[str, list[dict[str, Any]]] = {record_session: [record]}
            expected = {record_session: EMPTY_HEAD}
            shared = self._shared_scopes(app_name, user_id, deltas, transcripts, expected)
            try:
                results = log.flush_many(transcripts, expected_heads=expected, replace=True)
            except ConflictError:
                continue
            head = results[record_session].head
            session = Session(
                id=session_id,
                app_name=app_name,
                user_id=user_id,
                state=_merged(shared["app"], shared["user"], deltas["session"]),
                last_update_time=now,
            )
            session._storage_update_marker = head
            return session
        raise AlreadyExistsError(f"Session with id {session_id} could not be created: its scopes kept changing.")

    def _shared_scopes(
        self,
        app_name: str,
        user_id: str,
        deltas: dict[str, dict[str, Any]],
        transcripts: dict[str, list[dict[str, Any]]],
        expected: dict[str, str],
    ) -> dict[str, dict[str, Any]]:
        """The app and user state, with ``deltas`` applied and their writes added to ``transcripts``."""
        out = {}
        for scope, session_id in (
            ("app", self._app_session(app_name)),
            ("user", self._user_session(app_name, user_id)),
        ):
            head = self._log.head(session_id)
            state = self._state_of(session_id)
            if deltas[scope]:
                state.update(deltas[scope])
                transcripts[session_id] = [{"kind": f"adk.{scope}-state", "state": state}]
                expected[session_id] = head or EMPTY_HEAD
            out[scope] = state
        return out

    def _load(self, base: str, head: str | None) -> _Loaded:
        """The stored events and transcript of ``base`` at ``#session`` head ``head``."""
        with self._cache_guard:
            loaded = self._cache.get(base)
            if loaded is not None and loaded.head == head:
                self._cache.move_to_end(base)
                return loaded
        log = self._log
        events = log.messages(base + "#events")
        transcript = log.messages(base)
        compacted_until = float("-inf")
        for row in events:
            compaction = (row.get("actions") or {}).get("compaction")
            if compaction:
                compacted_until = max(compacted_until, compaction.get("end_timestamp", compaction.get("endTimestamp")))
        return _Loaded(
            head,
            events,
            {row["id"] for row in events},
            transcript,
            compacted_until,
            [row.get("timestamp", 0.0) for row in events],
        )

    def _keep(self, base: str, loaded: _Loaded) -> None:
        with self._cache_guard:
            self._cache[base] = loaded
            self._cache.move_to_end(base)
            while len(self._cache) > CACHED_SESSIONS:
                self._cache.popitem(last=False)

    def _append(self, session: Session, event: Event) -> tuple[float, str] | None:
        """Write ``event``; its new ``last_update_time`` and marker, or None when it was stored already."""
        log = self._log
        base = self.transcript_session(session.app_name, session.user_id, session.id)
        record_session = base + "#session"
        deltas = _session_util.extract_json_safe_state_delta(event.actions.state_delta or {})
        row = _event_row(event)
        for _ in range(WRITE_ATTEMPTS):
            head = log.head(record_session)
            record = self._row(record_session)
            if record is None:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            loaded = self._load(base, head)
            if event.id in loaded.ids:
                return None  # delivered again: stored once
            marker = session._storage_update_marker
            if marker is not None:
                if marker != head:
                    raise StaleSessionError(STALE_MESSAGE)
            elif record["update_time"] > session.last_update_time and record["last_event_id"] != (
                session.events[-1].id if session.events else None
            ):
                raise StaleSessionError(STALE_MESSAGE)  # a Session built by hand: judged by its events
            events = loaded.events + [row]
            actions = event.actions
            if actions.rewind_before_invocation_id or actions.compaction or event.timestamp < loaded.compacted_until:
                transcript, compacted_until = _view_rows([Event.model_validate(stored) for stored in events])
            else:
                view = _view_row(event)
                transcript = loaded.transcript + [view] if view is not None else loaded.transcript
                compacted_until = loaded.compacted_until
            state = dict(record["state"])
            state.update(deltas["session"])
            new_record = {
                **record,
                "state": state,
                "update_time": event.timestamp,
                "events": record["events"] + 1,
                "last_event_id": event.id,
            }
            transcripts = {record_session: [new_record], base + "#events": events, base: transcript}
            expected = {record_session: head or EMPTY_HEAD}
            self._shared_scopes(session.app_name, session.user_id, deltas, transcripts, expected)
            try:
                results = log.flush_many(transcripts, expected_heads=expected, replace=True)
            except ConflictError:
                continue  # another writer: stale (checked above on the next pass) or a shared scope moved
            new_head = results[record_session].head
            self._keep(
                base,
                _Loaded(
                    new_head,
                    events,
                    loaded.ids | {event.id},
                    transcript,
                    compacted_until,
                    loaded.timestamps + [event.timestamp],
                ),
            )
            assert new_head is not None
            return event.timestamp, new_head
        raise StaleSessionError(STALE_MESSAGE)

    def _get(self, app_name: str, user_id: str, session_id: str, config: GetSessionConfig | None) -> Session | None:
        base = self.transcript_session(app_name, user_id, session_id)
        head = self._log.head(base + "#session")
        record = self._row(base + "#session")
        if record is None:
            return None
        rows: list[dict[str, Any]] = []
        if not (config and config.num_recent_events == 0):
            loaded = self._load(base, head)
            self._keep(base, loaded)
            rows = loaded.events
            # ADK's database service returns events by time (ties by id), whatever the order
            # they were appended in; so does this one.
            order = sorted(range(len(rows)), key=lambda i: (loaded.timestamps[i], rows[i]["id"]))
            rows = [rows[i] for i in order]
            if config and config.after_timestamp:
                rows = [row for row in rows if row.get("timestamp", 0.0) >= config.after_timestamp]
            if config and config.num_recent_events is not None:
                rows = rows[max(0, len(rows) - config.num_recent_events) :]
        session = Session(
            id=session_id,
            app_name=app_name,
            user_id=user_id,
            state=_merged(
                self._state_of(self._app_session(app_name)),
                self._state_of(self._user_session(app_name, user_id)),
                record["state"],
            ),
            events=[Event.model_validate(copy.deepcopy(row)) for row in rows],
            last_update_time=record["update_time"],
        )
        session._storage_update_marker = head
        return session

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        prefix = f"{self._namespace}:{_quote(app_name, 'app_name')}/"
        if user_id is not None:
            prefix += _quote(user_id, "user_id") + "/"
        app_state = self._state_of(self._app_session(app_name))
        user_states: dict[str, dict[str, Any]] = {}
        found = []
        for name in self._log.sessions():
            if not (name.startswith(prefix) and name.endswith("#session")):
                continue
            record = self._row(name)
            if record is None:
                continue  # deleted
            user_part, _, session_part = name[len(f"{self._namespace}:{_quote(app_name, 'app_name')}/") :].partition(
                "/"
            )
            user = urllib.parse.unquote(user_part)
            if user not in user_states:
                user_states[user] = self._state_of(self._user_session(app_name, user))
            found.append(
                Session(
                    id=urllib.parse.unquote(session_part.removesuffix("#session")),
                    app_name=app_name,
                    user_id=user,
                    state=_merged(app_state, user_states[user], record["state"]),
                    last_update_time=record["update_time"],
                )
            )
        found.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=found)

    def _delete(self, app_name: str, user_id: str, session_id: str) -> None:
        base = self.transcript_session(app_name, user_id, session_id)
        log = self._log
        log.flush_many({base + "#session": [], base + "#events": [], base: []}, replace=True)
        info = log.session(base)
        if info is not None and not info.closed:  # the transcript ends here; its events stay
            log.close_session(base, reason="deleted")
        with self._cache_guard:
            self._cache.pop(base, None)


def _merged(app_state: dict[str, Any], user_state: dict[str, Any], session_state: dict[str, Any]) -> dict[str, Any]:
    """One state dict with the scopes' prefixes, as ADK's services return it."""
    merged = copy.deepcopy(session_state)
    for key, value in app_state.items():
        merged[State.APP_PREFIX + key] = value
    for key, value in user_state.items():
        merged[State.USER_PREFIX + key] = value
    return merged
