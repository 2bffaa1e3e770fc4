"""The log as an OpenAI Agents SDK session store: :class:`EventLogSession`.

>>> from eventlog.integrations.openai_agents import EventLogSession   # doctest: +SKIP
>>> result = await Runner.run(agent, "hi", session=EventLogSession("user-42", log))  # doctest: +SKIP

:class:`EventLogSession` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``, ``session_settings``) and the branching and
usage calls of the SDK's ``AdvancedSQLiteSession``.  Each operation is one write of the log:
``add_items`` an append, ``pop_item`` a ``rewind`` tombstone of the last item,
``clear_session`` a ``clear`` tombstone of every item, a branch a ``fork`` that shares the
branch point's prefix (no row is copied), a deleted branch a closed session, and the SDK's
compaction session (``OpenAIResponsesCompactionSession``) replacing the history with its
compacted output one ``compaction`` tombstone.  Nothing is ever deleted from the log.
docs/integrations/openai-agents.md has the whole mapping.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Mapping
from typing import Any

from .. import EMPTY_HEAD, EventLog, check_session_id
from ..aio import AsyncEventLog
from . import AnyEventLog, as_async, require

require("openai_agents", "agents", distribution="openai-agents")

from agents.memory import OpenAIResponsesCompactionSession, SessionABC, SessionSettings  # noqa: E402
from agents.memory.session_settings import resolve_session_limit  # noqa: E402

__all__ = ["BRANCH_SEPARATOR", "DELETED", "MAIN_BRANCH", "EventLogSession"]

MAIN_BRANCH = "main"
"""The branch a session starts on; it is the log session named ``session_id`` itself."""

BRANCH_SEPARATOR = "::branch::"
"""Branch ``b`` of session ``s`` is the log session ``s + BRANCH_SEPARATOR + b``."""

DELETED = "openai-agents: branch deleted"
"""The close reason of a deleted branch (its session stays in the log, closed)."""

TURN_USAGE = "openai_agents.turn_usage."
"""Metadata key prefix of the usage stored for each user turn (``...turn_usage.<n>``)."""

# The SDK's compaction session replaces the history from these methods by clearing the
# underlying session and adding its compacted output; see EventLogSession.clear_session.
_REPLACING = frozenset({"run_compaction", "_replace_underlying_session_items"})


class _Add:
    """One ``add_items`` call: whether its write landed (set on the worker) and whether its
    caller heard so (set when the await returned)."""

    __slots__ = ("acknowledged", "items", "landed", "target")

    def __init__(self, target: str, items: list[Any]) -> None:
        self.target = target
        self.items = items
        self.landed = False
        self.acknowledged = False


def _is_user(item: Any) -> bool:
    return isinstance(item, Mapping) and item.get("role") == "user"


def _timestamp(ns: int) -> str:
    """An event time in the format of SQLite's CURRENT_TIMESTAMP (UTC), as the SDK's stores give it."""
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S")


class EventLogSession(SessionABC):
    """An OpenAI Agents SDK session stored in an :class:`~eventlog.EventLog`.

    ``session_id`` names the log session of the main branch; ``log`` is an
    :class:`~eventlog.EventLog` or an :class:`~eventlog.aio.AsyncEventLog` (the blocking
    work runs on the log's worker threads either way, never on the event loop).
    ``session_settings`` as in the SDK (``limit``: how many of the latest items
    :meth:`get_items` returns by default).

    Several ``EventLogSession`` objects, in any number of processes, may use the same
    session: every write is one transaction of the log, and :meth:`add_items` appends
    after whatever head it finds.  The current branch is a property of the object, as in
    ``AdvancedSQLiteSession``.
    """

    def __init__(self, session_id: str, log: AnyEventLog, *, session_settings: SessionSettings | None = None) -> None:
        check_session_id(session_id)
        if BRANCH_SEPARATOR in session_id:
            raise ValueError(f"session id {session_id!r} must not contain {BRANCH_SEPARATOR!r} (it names branches)")
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()
        self._log: AsyncEventLog = as_async(log)
        self._branch = MAIN_BRANCH
        # The latest add_items: a call with the same items after it did not return is a retry.
        self._last_add: _Add | None = None
        # The SDK's compaction session cleared this session and has not added its output yet.
        self._replacing: str | None = None

    # -- which log session -------------------------------------------------------------

    @property
    def log(self) -> AsyncEventLog:
        """The log this session is stored in."""
        return self._log

    @property
    def current_branch_id(self) -> str:
        """The branch that reads and writes go to (``"main"`` until a branch is made or switched to)."""
        return self._branch

    def log_session_id(self, branch_id: str | None = None) -> str:
        """The log session that holds ``branch_id`` (default: the current branch)."""
        branch = self._branch if branch_id is None else branch_id
        return self.session_id if branch == MAIN_BRANCH else f"{self.session_id}{BRANCH_SEPARATOR}{branch}"

    # -- the Session protocol ----------------------------------------------------------

    async def get_items(self, limit: int | None = None, branch_id: str | None = None) -> list[Any]:
        """The items of the current branch (or ``branch_id``), oldest first.

        ``limit`` (default: ``session_settings.limit``): only the latest ``limit`` items.
        An unknown session has no items.
        """
        await self._settle()
        target = self.log_session_id(branch_id)
        count = resolve_session_limit(limit, self.session_settings)
        if count is not None and count <= 0:
            return [] if count == 0 else await self._log.messages(target)  # as SQLite's LIMIT: negative is none
        return await self._log.messages(target, last=count)

    async def add_items(self, items: list[Any]) -> None:
        """Append ``items`` to the current branch, in one transaction.

        Called again with the same items after a call that did not return (cancelled, timed
        out, or raised), it writes them only if that first call did not land: a retry after
        a lost acknowledgement writes nothing twice.
        """
        if not items:
            return
        items = list(items)
        target = self.log_session_id()
        if self._replacing == target:
            self._replacing = None
            await self._log.run(self._replace, target, items, sessions=(target,))
            return
        await self._settle()
        previous = self._last_add
        retrying = (
            previous
            if previous is not None
            and not previous.acknowledged
            and previous.target == target
            and previous.items == items
            else None
        )
        attempt = self._last_add = _Add(target, items)
        await self._log.run(self._append, attempt, retrying, sessions=(target,))
        attempt.acknowledged = True

    async def pop_item(self) -> Any | None:
        """Remove the latest item of the current branch (a ``rewind`` tombstone) and return it;
        ``None`` when the branch is empty."""
        await self._settle()
        target = self.log_session_id()
        return await self._log.run(self._pop, target, sessions=(target,))

    async def clear_session(self) -> None:
        """Remove every item of the current branch (a ``clear`` tombstone; the log keeps them).

        When the SDK's compaction session calls this to replace the history with its
        compacted output, nothing is written yet: the ``add_items`` of that output that
        follows writes one ``compaction`` tombstone and the output in one transaction.
        (If the process stops in between, the history is as before the compaction.)
        """
        target = self.log_session_id()
        caller = sys._getframe(1)
        if caller.f_code.co_name in _REPLACING and isinstance(
            caller.f_locals.get("self"), OpenAIResponsesCompactionSession
        ):
            await self._settle()
            self._replacing = target
            return
        await self._settle()
        await self._log.run(self._clear, target, sessions=(target,))

    # -- AdvancedSQLiteSession's branching -----------------------------------------------

    async def create_branch_from_turn(self, turn_number: int, branch_name: str | None = None) -> str:
        """Start a branch just before user turn ``turn_number`` of the current branch, and switch to it.

        Turns are numbered from 1 by user message, as in ``AdvancedSQLiteSession``.  The
        branch is a fork of the log: it shares the items before that user message with the
        branch it came from.  Returns the branch id (``branch_name``, or
        ``branch_from_turn_<n>_<unix time>``).  Raises ``ValueError`` when the branch has no
        such turn or a live branch of that name exists.
        """
        await self._settle()
        if isinstance(turn_number, bool) or not isinstance(turn_number, int):
            raise TypeError(f"turn_number must be an int, not {type(turn_number).__name__}")
        if branch_name is None:
            branch_name = f"branch_from_turn_{turn_number}_{int(datetime.datetime.now().timestamp())}"
        self._check_branch_name(branch_name)
        source, target = self.log_session_id(), self.log_session_id(branch_name)
        await self._log.run(self._branch_at_turn, source, target, turn_number, branch_name, sessions=(source, target))
        self._branch = branch_name
        return branch_name

    async def create_branch_from_content(self, search_term: str, branch_name: str | None = None) -> str:
        """Branch from the first user turn whose text contains ``search_term`` (``ValueError`` if none)."""
        matches = await self.find_turns_by_content(search_term)
        if not matches:
            raise ValueError(f"No user turns found containing '{search_term}'")
        return await self.create_branch_from_turn(matches[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        """Read and write ``branch_id`` from now on (``ValueError`` when it does not exist)."""
        await self._settle()
        if branch_id != MAIN_BRANCH:
            info = await self._log.session(self.log_session_id(branch_id))
            if info is None or (info.closed and info.close_reason == DELETED):
                raise ValueError(f"Branch '{branch_id}' does not exist")
        self._branch = branch_id

    async def delete_branch(self, branch_id: str, force: bool = False) -> None:
        """Delete ``branch_id``: its log session is closed (its items stay in the log for audit).

        ``main`` cannot be deleted; the current branch only with ``force=True`` (this session
        then switches to ``main``).  Raises ``ValueError`` as ``AdvancedSQLiteSession`` does.
        """
        if not isinstance(branch_id, str) or not branch_id.strip():
            raise ValueError("Branch ID cannot be empty")
        branch_id = branch_id.strip()
        if branch_id == MAIN_BRANCH:
            raise ValueError("Cannot delete the 'main' branch")
        if branch_id == self._branch:
            if not force:
                raise ValueError(f"Cannot delete current branch '{branch_id}'. Use force=True or switch branches first")
            await self.switch_to_branch(MAIN_BRANCH)
        target = self.log_session_id(branch_id)
        info = await self._log.session(target)
        if info is None or (info.closed and info.close_reason == DELETED):
            raise ValueError(f"Branch '{branch_id}' does not exist")
        await self._log.close_session(target, reason=DELETED)

    async def list_branches(self) -> list[dict[str, Any]]:
        """Every live branch: ``branch_id``, ``message_count``, ``user_turns``, ``is_current``,
        ``created_at``, oldest first (``main`` only once it has items)."""
        await self._settle()
        return await self._log.run(self._list_branches)

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of a branch: ``turn``, ``content`` (cut at 100 characters),
        ``full_content``, ``timestamp``, ``can_branch``, as ``AdvancedSQLiteSession`` gives them."""
        turns = await self._turns(branch_id)
        for turn in turns:
            content = turn["full_content"]
            turn["content"] = content[:100] + "..." if len(content) > 100 else content
        return turns

    async def find_turns_by_content(self, search_term: str, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of a branch whose text contains ``search_term``."""
        return [turn for turn in await self._turns(branch_id) if search_term in turn["full_content"]]

    # -- usage per turn ------------------------------------------------------------------

    async def store_run_usage(self, result: Any) -> None:
        """Record the usage of ``result`` (a ``RunResult``) for the current user turn of the branch.

        Stored as session metadata (``openai_agents.turn_usage.<turn>``); storing a turn
        again replaces it.  The log's own counters (``input_tokens``, ``output_tokens``,
        ``api_calls``) are moved by the difference, so they add up to the stored turns.
        """
        usage = getattr(result.context_wrapper, "usage", None)
        if usage is None:
            return
        await self._settle()
        target = self.log_session_id()
        record = {
            "requests": usage.requests or 0,
            "input_tokens": usage.input_tokens or 0,
            "output_tokens": usage.output_tokens or 0,
            "total_tokens": usage.total_tokens or 0,
            "input_tokens_details": _details(usage.input_tokens_details),
            "output_tokens_details": _details(usage.output_tokens_details),
        }
        await self._log.run(self._store_usage, target, record, sessions=(target,))

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """The usage of one user turn (``{}`` when none was stored), or of every turn (a list,
        each with ``user_turn_number``), of the current branch or ``branch_id``."""
        info = await self._log.session(self.log_session_id(branch_id))
        stored = _turn_usage(info.metadata if info is not None else {})
        if user_turn_number is not None:
            return dict(stored.get(user_turn_number, {}))
        return [{"user_turn_number": turn, **usage} for turn, usage in sorted(stored.items())]

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """Usage summed over the turns of ``branch_id``, or of every branch: ``requests``,
        ``input_tokens``, ``output_tokens``, ``total_tokens``, ``total_turns``; ``None`` when
        no usage was stored."""
        targets = [self.log_session_id(branch_id)] if branch_id else await self._log.run(self._branch_sessions)
        totals = {"requests": 0, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "total_turns": 0}
        for target in targets:
            info = await self._log.session(target)
            for usage in _turn_usage(info.metadata if info is not None else {}).values():
                for key in ("requests", "input_tokens", "output_tokens", "total_tokens"):
                    totals[key] += int(usage.get(key) or 0)
                totals["total_turns"] += 1
        return totals if totals["total_turns"] else None

    # -- blocking work, run on the log's workers ---------------------------------------

    @property
    def _sync(self) -> EventLog:
        return self._log.sync

    def _append(self, attempt: _Add, retrying: _Add | None) -> None:
        # Runs after the call it retries (calls of a session run in order), so whether that
        # one landed is known here: its worker finished, whatever became of its caller.
        if retrying is not None and retrying.landed:
            attempt.landed = True
            return
        self._sync.append(attempt.target, attempt.items)
        attempt.landed = True

    def _pop(self, target: str) -> Any | None:
        log = self._sync
        info = log.session(target)
        if info is None or info.length == 0:
            return None
        last = log.messages(target, last=1)[0]
        log.rewind(target, to=info.length - 1)
        return last

    def _clear(self, target: str) -> None:
        log = self._sync
        if log.head(target) is not None:
            log.flush(target, [], replace=True)

    def _replace(self, target: str, items: list[Any]) -> None:
        """The compaction session's output replaces the whole history: one ``compaction`` tombstone."""
        log = self._sync
        info = log.session(target)
        if info is None or info.length == 0:
            log.append(target, items, expected_head=EMPTY_HEAD)
            return
        log.compact(target, start=0, end=info.length, summary=items, expected_head=info.head)

    async def _settle(self) -> None:
        """A compaction that cleared this session and added nothing leaves it empty (as a compaction)."""
        target, self._replacing = self._replacing, None
        if target is not None:
            await self._log.run(self._replace_with_nothing, target, sessions=(target,))

    def _replace_with_nothing(self, target: str) -> None:
        info = self._sync.session(target)
        if info is not None and info.length:
            self._sync.compact(target, start=0, end=info.length, summary=[], expected_head=info.head)

    def _check_branch_name(self, branch_name: str) -> None:
        if not isinstance(branch_name, str) or not branch_name:
            raise ValueError("Branch name cannot be empty")
        if branch_name == MAIN_BRANCH:
            raise ValueError("Cannot create a branch named 'main'")
        check_session_id(self.log_session_id(branch_name))

    def _branch_at_turn(self, source: str, target: str, turn_number: int, branch_name: str) -> None:
        log = self._sync
        items = log.messages(source)
        users = [position for position, item in enumerate(items) if _is_user(item)]
        if not 1 <= turn_number <= len(users):
            raise ValueError(f"Turn {turn_number} does not contain a user message in branch '{self._branch}'")
        at = users[turn_number - 1]
        existing = log.session(target)
        if existing is None:
            log.fork(source, target, at)
        elif existing.closed and existing.close_reason == DELETED:
            # The name of a deleted branch is used again: its session takes the new prefix
            # (the old items stay in the log, tombstoned).  The bodies are shared by content.
            log.flush(target, items[:at], replace=True)
        else:
            raise ValueError(f"Branch '{branch_name}' already exists")
        log.update_session(target, openai_agents_session=self.session_id, openai_agents_branch=branch_name)

    def _branch_sessions(self) -> list[str]:
        prefix = self.session_id + BRANCH_SEPARATOR
        return [self.session_id] + [sid for sid in self._sync.sessions() if sid.startswith(prefix)]

    def _list_branches(self) -> list[dict[str, Any]]:
        log = self._sync
        found: list[tuple[int, dict[str, Any]]] = []
        for target in self._branch_sessions():
            info = log.session(target)
            if info is None or (info.length == 0 and target == self.session_id):
                continue
            if info.closed and info.close_reason == DELETED:
                continue
            branch = MAIN_BRANCH if target == self.session_id else target[len(self.session_id + BRANCH_SEPARATOR) :]
            found.append(
                (
                    info.created_ns,
                    {
                        "branch_id": branch,
                        "message_count": info.length,
                        "user_turns": sum(map(_is_user, log.messages(target))),
                        "is_current": branch == self._branch,
                        "created_at": _timestamp(info.created_ns),
                    },
                )
            )
        found.sort(key=lambda pair: pair[0])
        return [branch for _, branch in found]

    async def _turns(self, branch_id: str | None) -> list[dict[str, Any]]:
        target = self.log_session_id(branch_id)
        return await self._log.run(self._user_turns, target)

    def _user_turns(self, target: str) -> list[dict[str, Any]]:
        """The live user messages of ``target`` with the time of the event that stored each."""
        log = self._sync
        out: list[dict[str, Any]] = []
        for occurrence in log.history(target):
            if occurrence.tombstone is not None or not _is_user(occurrence.message):
                continue
            content = occurrence.message.get("content", "")
            if not isinstance(content, str):  # input_text parts
                content = " ".join(
                    str(part.get("text")) for part in content if isinstance(part, Mapping) and part.get("text")
                )
            stored = next(log.events(after=occurrence.source[0] - 1), None)
            out.append(
                {
                    "turn": len(out) + 1,
                    "content": content,
                    "full_content": content,
                    "timestamp": _timestamp(stored.time_ns) if stored is not None else None,
                    "can_branch": True,
                }
            )
        return out

    def _store_usage(self, target: str, record: dict[str, Any]) -> None:
        log = self._sync
        items = log.messages(target)
        turn = sum(map(_is_user, items))
        info = log.session(target)
        previous = _turn_usage(info.metadata if info is not None else {}).get(turn, {})
        deltas = {
            "input_tokens": record["input_tokens"] - int(previous.get("input_tokens") or 0),
            "output_tokens": record["output_tokens"] - int(previous.get("output_tokens") or 0),
            "api_calls": record["requests"] - int(previous.get("requests") or 0),
        }
        log.update_session(target, **{f"{TURN_USAGE}{turn}": record}, **deltas)


def _details(details: Any) -> dict[str, Any] | None:
    if details is None:
        return None
    if hasattr(details, "model_dump"):
        return dict(details.model_dump())
    return dict(vars(details))


def _turn_usage(metadata: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    out = {}
    for key, value in metadata.items():
        if key.startswith(TURN_USAGE) and key[len(TURN_USAGE) :].isdigit() and isinstance(value, Mapping):
            out[int(key[len(TURN_USAGE) :])] = dict(value)
    return out
