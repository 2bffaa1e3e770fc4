"""The log as pydantic-ai's conversation store.

Two lines switch an app over::

    from eventlog.integrations.pydantic_ai import EventLogConversationStore
    store = EventLogConversationStore(log)   # an EventLog or an AsyncEventLog

:class:`EventLogConversationStore` implements pydantic-ai's
:class:`~pydantic_ai.conversation_store.ConversationStore` storage primitives;
``load``, ``save``, ``branch``, ``fork``, ``delete`` and ``list_conversations`` are the
framework's own and work on top of them unchanged.  Each conversation lives in the log as:

- its **transcript**, session ``<namespace>:<conversation id>``: the history its record's
  ``head_id`` ends, one message per entry (the model message in pydantic-ai's JSON form,
  with its entry id, its parent's, and a ``role``/``content`` for readers of the log);
  ``eventlog show`` shows it as the model will see it on the next run;
- its **record**, session ``<transcript>#record``: one message, the record and where the
  histories it left (its branches) can be replayed from;
- one **entry** session per message, ``<namespace>#entry:<entry id>``, so
  :meth:`~EventLogConversationStore.read_entry` is one lookup of the log's session index.

Every write of a record is one :meth:`~eventlog.EventLog.flush_many` of those sessions with
the record session's head as its compare-and-set (``expected_heads``): it lands whole or not
at all, and a writer in another process that saved first makes it raise pydantic-ai's own
``ConversationConflict``.  Nothing is deleted: a branch or a rewrite tombstones the messages
it leaves (``rewind`` or ``edit``), a delete tombstones the transcript and the record
(``clear``).  docs/integrations/pydantic-ai.md has the whole mapping.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Final

from ..aio import AsyncEventLog
from ..errors import ConflictError
from ..log import EventLog
from ..writer import EMPTY_HEAD
from . import AnyEventLog, as_async, require

require("pydantic_ai", "pydantic_ai.conversation_store", distribution="pydantic-ai")

import pydantic  # noqa: E402  (after the framework check, like every import of it below)
from pydantic_ai.conversation_store import (  # noqa: E402
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelRequest  # noqa: E402

__all__ = ["EventLogConversationStore"]

WRITE_ATTEMPTS: Final = 8
"""Times a write re-reads the record after the log reported a concurrent change that left the
caller's revision current (its reads and the commit straddled another writer's commit)."""

CACHED_TRANSCRIPTS: Final = 256
"""Conversations whose transcript rows the store keeps in memory between saves, each checked
against the head of its record session before use, so another process's writes are seen."""

_RECORD: Final = pydantic.TypeAdapter(ConversationRecord)
RECORD_KIND: Final = "pydantic-ai.record"


def _message_json(message: ModelMessage) -> dict[str, Any]:
    # The list adapter carries pydantic-ai's own encoding of bytes (base64), so a message
    # with binary content dumps and loads as it does in a serialized history.
    dumped: dict[str, Any] = ModelMessagesTypeAdapter.dump_python([message], mode="json")[0]
    return dumped


def _message_of(data: dict[str, Any]) -> ModelMessage:
    loaded: ModelMessage = ModelMessagesTypeAdapter.validate_python([data])[0]
    return loaded


def _role_and_text(message: ModelMessage) -> tuple[str, str]:
    """A chat role and the message's text, for the log's readers (projection, search, show)."""
    texts: list[str] = []
    kinds: set[str] = set()
    for part in message.parts:
        kind = getattr(part, "part_kind", "")
        kinds.add(kind)
        content = getattr(part, "content", None)
        if isinstance(content, str):
            texts.append(content)
    if not isinstance(message, ModelRequest):
        role = "assistant"
    elif kinds & {"tool-return", "retry-prompt"}:
        role = "tool"
    elif kinds and kinds <= {"system-prompt"}:
        role = "system"
    else:
        role = "user"
    return role, "\n".join(texts)


def _transcript_message(entry_id: str, parent_id: str | None, message: ModelMessage) -> dict[str, Any]:
    """The transcript row of an entry: its text once, as ``content``, and the rest of the message."""
    role, text = _role_and_text(message)
    dumped = _message_json(message)
    row: dict[str, Any] = {
        "role": role,
        "content": text,
        "entry_id": entry_id,
        "parent_id": parent_id,
        "message": dumped,
    }
    texts = [i for i, part in enumerate(dumped.get("parts", ())) if isinstance(part.get("content"), str)]
    if len(texts) == 1 and dumped["parts"][texts[0]]["content"] == text:
        # The text is the row's content: not stored a second time inside the message.
        parts = list(dumped["parts"])
        parts[texts[0]] = {**parts[texts[0]], "content": None}
        row["message"] = {**dumped, "parts": parts}
        row["text_part"] = texts[0]
    return row


def _row_message(row: dict[str, Any]) -> ModelMessage:
    data = row["message"]
    index = row.get("text_part")
    if index is not None:
        parts = list(data["parts"])
        parts[index] = {**parts[index], "content": row["content"]}
        data = {**data, "parts": parts}
    return _message_of(data)


def _entry_of(row: dict[str, Any]) -> ConversationEntry:
    return ConversationEntry(id=row["entry_id"], parent_id=row["parent_id"], message=_row_message(row))


class EventLogConversationStore(ConversationStore):
    """A pydantic-ai ``ConversationStore`` that keeps conversations in an event log.

    ``log`` is an :class:`~eventlog.EventLog` or an :class:`~eventlog.aio.AsyncEventLog`;
    the store never blocks the event loop (each call runs its reads and its one write on a
    worker thread) and never closes the log.  ``namespace`` prefixes the log sessions the
    store uses, so several stores (or other integrations) can share one log.

    ``delete`` tombstones a conversation and keeps its entries in the log, for audit and
    for forks that point into it: :meth:`read_entry` still finds them.  Use the log's
    redaction to erase a message's content.
    """

    def __init__(self, log: AnyEventLog, *, namespace: str = "pydantic-ai") -> None:
        if not isinstance(log, (EventLog, AsyncEventLog)):
            raise TypeError(f"log must be an EventLog or an AsyncEventLog, not {type(log).__name__}")
        if not isinstance(namespace, str) or not namespace or any(c in namespace for c in ":#"):
            raise ValueError(f"namespace must be a non-empty str without ':' or '#', not {namespace!r}")
        self._async = as_async(log)
        self._log = self._async.sync
        self._namespace = namespace
        # transcript session -> (head of its record session, the transcript's rows at that head):
        # every write of a transcript through the store also replaces its record, whose head is
        # therefore a version of both.
        self._rows: OrderedDict[str, tuple[str, list[dict[str, Any]]]] = OrderedDict()
        self._rows_guard = threading.Lock()

    # -- where things live in the log -----------------------------------------

    def transcript_session(self, conversation_id: str) -> str:
        """The log session holding ``conversation_id``'s history (what ``eventlog show`` takes)."""
        if not isinstance(conversation_id, str):
            raise TypeError(f"conversation_id must be a str, not {type(conversation_id).__name__}")
        return f"{self._namespace}:{urllib.parse.quote(conversation_id, safe='')}"

    def _record_session(self, conversation_id: str) -> str:
        return self.transcript_session(conversation_id) + "#record"

    def _entry_session(self, entry_id: str) -> str:
        if not isinstance(entry_id, str):
            raise TypeError(f"entry_id must be a str, not {type(entry_id).__name__}")
        return f"{self._namespace}#entry:{urllib.parse.quote(entry_id, safe='')}"

    # -- the storage primitives -----------------------------------------------

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        stored = await self._async.run(self._stored_record, self._record_session(conversation_id))
        return None if stored is None else _RECORD.validate_python(stored["record"])

    async def read_records(self, *, scope: str | None = None, limit: int | None = None) -> Sequence[ConversationRecord]:
        return await self._async.run(self._read_records, scope, limit)

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        transcript = self.transcript_session(record.conversation_id)
        await self._async.run(self._write_record, record, list(new_entries), expected_revision, sessions=(transcript,))

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        transcript = self.transcript_session(conversation_id)
        await self._async.run(self._delete_record, conversation_id, expected_revision, sessions=(transcript,))

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        """The entry with this id: one lookup of the log's session index.

        Raises ``KeyError`` when the store never stored it.
        """
        return await self._async.run(self._read_entry, entry_id)

    async def read_history(self, head_id: str | None, *, limit: int | None = None) -> list[ConversationEntry]:
        """The entries up to ``head_id``, read as one slice of the transcript that holds it.

        A conversation's current history is its transcript session; a history it left
        (a branch) is replayed from the log as of the write that left it.  Only an entry
        that neither holds (the head of a fork whose source moved on before the fork
        saved anything) is followed parent by parent through the entry index.
        """
        if limit is not None and limit < 0:
            raise ValueError("limit must not be negative")
        rows = await self._async.run(self._history, head_id, limit)
        return [_entry_of(row) for row in rows]

    # -- on the worker thread -------------------------------------------------

    def _stored_record(self, record_session: str) -> dict[str, Any] | None:
        rows = self._log.messages(record_session, last=1)
        return rows[-1] if rows else None

    def _transcript_rows(self, transcript: str, record_head: str | None) -> list[dict[str, Any]]:
        """The rows of ``transcript`` while its record session's head is ``record_head``."""
        with self._rows_guard:
            cached = self._rows.get(transcript)
            if cached is not None and record_head is not None and cached[0] == record_head:
                self._rows.move_to_end(transcript)
                return cached[1]
        return self._log.messages(transcript)

    def _remember(self, transcript: str, record_head: str | None, rows: list[dict[str, Any]]) -> None:
        with self._rows_guard:
            if record_head is None:
                self._rows.pop(transcript, None)
                return
            self._rows[transcript] = (record_head, rows)
            self._rows.move_to_end(transcript)
            while len(self._rows) > CACHED_TRANSCRIPTS:
                self._rows.popitem(last=False)

    def _read_records(self, scope: str | None, limit: int | None) -> list[ConversationRecord]:
        prefix = self._namespace + ":"
        records = []
        for session_id in self._log.sessions():
            if session_id.startswith(prefix) and session_id.endswith("#record"):
                stored = self._stored_record(session_id)
                if stored is None:
                    continue  # deleted
                record = _RECORD.validate_python(stored["record"])
                if scope is None or record.scope == scope:
                    records.append(record)
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records[:limit]

    def _read_entry(self, entry_id: str) -> ConversationEntry:
        rows = self._log.messages(self._entry_session(entry_id), last=1)
        if not rows:
            raise KeyError(entry_id)
        return _entry_of(self._resolve(rows[-1]))

    def _resolve(self, entry_row: dict[str, Any]) -> dict[str, Any]:
        """The transcript row an entry session's row points at (the entry was saved there, at its position).

        Live there: one positional lookup.  Else (the conversation branched, rewrote its
        history or was deleted since) from the log's history of that transcript, which
        keeps every message it ever held.
        """
        if "message" in entry_row:  # an entry stored whole
            return _transcript_row(entry_row)
        entry_id = entry_row["entry_id"]
        home = self.transcript_session(entry_row["conversation"])
        found = self._log.message(home, entry_row["position"])
        if found is not None and found.get("entry_id") == entry_id:
            return found
        for occurrence in reversed(self._log.history(home)):
            if occurrence.message.get("entry_id") == entry_id:
                return occurrence.message
        raise KeyError(entry_id)

    def _history(self, head_id: str | None, limit: int | None) -> list[dict[str, Any]]:
        """Transcript rows from the first entry up to ``head_id`` (the last ``limit`` of them)."""
        if head_id is None or limit == 0:
            return []
        log = self._log
        rows = log.messages(self._entry_session(head_id), last=1)
        if not rows:
            raise KeyError(head_id)
        home = self.transcript_session(rows[-1]["conversation"])
        position: int = rows[-1]["position"]
        # The usual case: the head of the conversation the entry was saved in.
        rows_now = self._transcript_rows(home, log.head(home + "#record")) if limit is None else None
        window = rows_now if rows_now is not None else log.messages(home, last=limit)
        if window and window[-1]["entry_id"] == head_id:
            return window
        candidates: list[list[dict[str, Any]]] = []
        if limit is not None:
            candidates.append(log.messages(home))
        stored = self._stored_record(home + "#record")
        for seq in (stored or {}).get("branch_seqs", {}).values():
            candidates.append(log.messages(home, as_of=seq))
        for line in candidates:
            if len(line) > position and line[position]["entry_id"] == head_id:
                line = line[: position + 1]
                return line if limit is None else line[len(line) - limit :]
        # Follow the parents through the entry index.
        out: list[dict[str, Any]] = []
        entry_id: str | None = head_id
        while entry_id is not None and (limit is None or len(out) < limit):
            found = log.messages(self._entry_session(entry_id), last=1)
            if not found:
                raise KeyError(entry_id)
            row = found[-1]
            out.append(self._resolve(row))
            entry_id = row["parent_id"]
        out.reverse()
        return out

    def _history_through(self, entry_id: str | None, current: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The transcript rows up to ``entry_id``: a prefix of ``current`` when it is there."""
        if entry_id is None:
            return []
        for index in range(len(current) - 1, -1, -1):
            if current[index]["entry_id"] == entry_id:
                return current[: index + 1]
        return self._history(entry_id, None)

    def _write_record(
        self, record: ConversationRecord, new_entries: list[ConversationEntry], expected_revision: str | None
    ) -> None:
        if not isinstance(record, ConversationRecord):
            raise TypeError(f"record must be a ConversationRecord, not {type(record).__name__}")
        log = self._log
        conversation_id = record.conversation_id
        transcript = self.transcript_session(conversation_id)
        record_session = transcript + "#record"
        new_by_id = {entry.id: entry for entry in new_entries}
        for _ in range(WRITE_ATTEMPTS):
            # The head first: a record read after it is at least as new, so a commit against
            # this head can only succeed if nothing changed since the record was read.
            head = log.head(record_session)
            stored = self._stored_record(record_session)
            if (stored["record"]["revision"] if stored else None) != expected_revision:
                raise ConversationConflict(conversation_id)
            current = self._transcript_rows(transcript, head) if stored is not None else []
            left_at = log.last_seq  # the transcript as of this seq is `current`
            chain: list[ConversationEntry] = []
            entry_id = record.head_id
            while entry_id is not None and entry_id in new_by_id:
                chain.append(new_by_id[entry_id])
                entry_id = new_by_id[entry_id].parent_id
            chain.reverse()
            try:
                history = list(self._history_through(entry_id, current))
            except KeyError:
                # The head names an entry the store does not have (a fork's source released it).
                raise ConversationConflict(conversation_id) from None
            parent = history[-1]["entry_id"] if history else None
            entry_rows: dict[str, list[dict[str, Any]]] = {}
            for entry in chain:
                if entry.parent_id != parent:
                    raise ValueError(f"new entry {entry.id!r} points at {entry.parent_id!r}, not at {parent!r}")
                row = _transcript_message(entry.id, entry.parent_id, entry.message)
                # Where the entry is, not a second copy of it: read_entry looks it up there.
                entry_rows[self._entry_session(entry.id)] = [
                    {
                        "entry_id": entry.id,
                        "parent_id": entry.parent_id,
                        "conversation": conversation_id,
                        "position": len(history),
                    }
                ]
                history.append(row)
                parent = entry.id
            branch_seqs: dict[str, int] = dict(stored["branch_seqs"]) if stored else {}
            left = current[-1]["entry_id"] if current else None
            if left is not None and left in record.branches and left not in branch_seqs:
                branch_seqs[left] = left_at
            record_row = {
                "kind": RECORD_KIND,
                "record": _RECORD.dump_python(record, mode="json"),
                "branch_seqs": {tip: seq for tip, seq in branch_seqs.items() if tip in record.branches},
            }
            if stored is None and not chain and history and transcript not in log:
                self._fork_into(transcript, history)
            try:
                results = log.flush_many(
                    {record_session: [record_row], transcript: history, **entry_rows},
                    expected_heads={record_session: head or EMPTY_HEAD},
                    replace=True,
                )
            except ConflictError:
                continue  # someone wrote between our reads and the commit: check the revision again
            self._remember(transcript, results[record_session].head, history)
            return
        raise ConversationConflict(conversation_id)

    def _fork_into(self, transcript: str, history: list[dict[str, Any]]) -> None:
        """Start a new conversation's transcript as a fork of the one its history is live in,
        so the two share the stored messages.  Only a head start: the write that follows
        makes the transcript equal ``history`` whatever the fork copied."""
        last = history[-1]
        rows = self._log.messages(self._entry_session(last["entry_id"]), last=1)
        if not rows:
            return
        source = self.transcript_session(rows[-1]["conversation"])
        live = self._log.messages(source)
        if len(live) < len(history) or live[len(history) - 1]["entry_id"] != last["entry_id"]:
            return  # not live there any more (a branch it left): the write copies it
        try:
            self._log.fork(source, transcript, at=len(history))
        except (ConflictError, ValueError):
            pass  # the source is shorter now, or the transcript exists: the write copies instead

    def _delete_record(self, conversation_id: str, expected_revision: str) -> None:
        log = self._log
        transcript = self.transcript_session(conversation_id)
        record_session = transcript + "#record"
        for _ in range(WRITE_ATTEMPTS):
            head = log.head(record_session)
            stored = self._stored_record(record_session)
            if stored is None or stored["record"]["revision"] != expected_revision:
                raise ConversationConflict(conversation_id)
            try:
                log.flush_many(
                    {record_session: [], transcript: []},
                    expected_heads={record_session: head or EMPTY_HEAD},
                    replace=True,
                )
            except ConflictError:
                continue
            self._remember(transcript, None, [])
            info = log.session(transcript)
            if info is not None and not info.closed:  # the transcript ends here; its messages stay
                log.close_session(transcript, reason="deleted")
            return
        raise ConversationConflict(conversation_id)


def _transcript_row(entry_row: dict[str, Any]) -> dict[str, Any]:
    """The transcript row of an entry session's row (which adds where the entry was saved)."""
    return {key: value for key, value in entry_row.items() if key not in ("conversation", "position")}
