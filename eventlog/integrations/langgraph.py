"""A LangGraph checkpointer on the event log: :class:`EventLogSaver`.

LangGraph saves every channel of the graph at every super-step; a ``MessagesState``
graph hands its whole message list to ``put`` again and again, and each task's new
messages to ``put_writes`` first.  Here that list is a transcript session of the log:
a task's new messages are appended to it when the task's writes are stored, the
checkpoint that takes them in refers to them, and every checkpoint refers to the
transcript by its length and head node digest.  Everything else lives in two more
sessions per thread:

- ``<thread>`` — the conversation (the ``messages`` channel of the root graph);
  ``<thread>␟messages␟<ns>␟<channel>`` for other message channels and subgraphs
  (``␟`` is U+001F, which a thread id may therefore not contain);
- ``<thread>␟checkpoints`` — one row per checkpoint (what changed since its parent:
  versions, metadata, where each new channel value is) and one per ``put_writes``
  call, appended in order (:mod:`eventlog.integrations.langgraph_rows`);
- ``<thread>␟blobs`` — channel values larger than :data:`INLINE_BYTES` in LangGraph's
  serializer's form, each distinct value once (content-addressed by SHA-256).

A ``put`` or ``put_writes`` is one transaction of the log: the transcript's new
messages, new blobs and the row land together.  Nothing is ever deleted: a
time-travel fork or a ``RemoveMessage`` tombstones the transcript's tail
(``rewind``/``edit``), ``delete_thread`` tombstones every session of the thread
(``clear``), ``prune``/``delete_for_runs`` tombstone checkpoint rows.  The history
stays readable (``eventlog history``); docs/integrations/langgraph.md says how to
purge for good.
"""

from __future__ import annotations

import base64
import builtins
import dataclasses
import operator
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

from ..aio import AsyncEventLog
from ..codec import ZERO, canonical, content_digest, node_digest
from ..errors import ConflictError, UnknownSessionError
from ..log import EMPTY_HEAD, EventLog
from . import AnyEventLog, as_async, require

require("langgraph", "langgraph.checkpoint.base", distribution="langgraph")

from langchain_core.messages import BaseMessage, RemoveMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import (  # noqa: E402
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol  # noqa: E402

from .langgraph_messages import (  # noqa: E402
    SERDE_KEY,
    MessageCodec,
    copy,
    is_message_list,
    is_plain,
    snapshot,
    unchanged,
)
from .langgraph_rows import (  # noqa: E402
    HEAD_CHARS,
    decode_checkpoint,
    decode_writes,
    encode_checkpoint,
    encode_writes,
)

__all__ = ["INLINE_BYTES", "SEP", "EventLogSaver"]

SEP = "\x1f"
"""Separates a thread id from the parts of the names of its other sessions."""

INLINE_BYTES = 256
"""Serialized channel values up to this size are kept in the checkpoint row itself."""

MAX_SESSION_BYTES = 256
TRANSCRIPTS_KEPT = 256
"""Transcripts whose last flushed messages a saver keeps in memory (least recently used go)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _check_thread(thread_id: object) -> str:
    if not isinstance(thread_id, str) or not thread_id:
        raise ValueError(f"thread_id must be a non-empty str, not {thread_id!r}")
    if SEP in thread_id or "\x00" in thread_id:
        raise ValueError(f"thread_id {thread_id!r} contains U+001F or NUL, which name the thread's sessions")
    if len(thread_id.encode("utf-8", "surrogatepass")) > MAX_SESSION_BYTES - 16:
        raise ValueError(f"thread_id is longer than {MAX_SESSION_BYTES - 16} bytes of UTF-8")
    return thread_id


def records_session(thread_id: str) -> str:
    """The session holding the checkpoint and write rows of ``thread_id``."""
    return f"{_check_thread(thread_id)}{SEP}checkpoints"


def blobs_session(thread_id: str) -> str:
    """The session holding the large channel values of ``thread_id``."""
    return f"{_check_thread(thread_id)}{SEP}blobs"


def transcript_session(thread_id: str, checkpoint_ns: str, channel: str) -> str:
    """The transcript session of message channel ``channel`` in namespace ``checkpoint_ns``."""
    _check_thread(thread_id)
    if checkpoint_ns == "" and channel == "messages":
        return thread_id
    name = SEP.join((thread_id, "messages", checkpoint_ns, channel))
    if "\x00" in name or len(name.encode("utf-8", "surrogatepass")) > MAX_SESSION_BYTES:
        digest = sha256(f"{checkpoint_ns}{SEP}{channel}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
        name = SEP.join((thread_id, "messages", "#" + digest))
    return name


_FIELDS = operator.attrgetter("__dict__")
_EXTRA = operator.attrgetter("__pydantic_extra__")
_FIRST = operator.itemgetter(0)
_SECOND = operator.itemgetter(1)


def _short(head: str | None) -> str | None:
    """The part of a head node digest a reference keeps."""
    return head[:HEAD_CHARS] if head else None


@dataclass
class _Transcript:
    """A transcript session's live messages as this saver last wrote or read them.

    ``objects`` are the message objects (compared by identity with the lists LangGraph
    hands over), ``rows`` their stored rows, ``snaps`` what they looked like then,
    ``nodes`` the node digest at each position (computed when first needed), ``head``
    the session's head.  ``pending`` names the checkpoint whose tasks' writes were
    appended after its messages (``base`` of them), if any.
    """

    objects: list[BaseMessage]
    rows: list[dict[str, Any]]
    snaps: list[tuple[Any, Any]]
    head: str | None
    nodes: list[bytes] | None = None
    pending: tuple[str, str] | None = None
    base: int = 0

    def prefix(self, messages: Sequence[BaseMessage]) -> int:
        """How many leading ``messages`` are the very objects held here, unchanged."""
        objects, snaps = self.objects, self.snaps
        n = min(len(objects), len(messages))
        given = messages[:n]
        if (  # the common case, in C loops: all of them, untouched
            all(map(operator.is_, given, objects))
            and all(map(operator.eq, map(_FIELDS, given), map(_FIRST, snaps)))
            and all(map(operator.eq, map(_EXTRA, given), map(_SECOND, snaps)))
        ):
            return n
        for i in range(n):
            message = messages[i]
            if message is not objects[i] or not unchanged(message, snaps[i]):
                return i
        return n

    def node(self, length: int) -> str | None:
        """The short node digest of the message at ``length - 1`` (None for 0)."""
        if length == 0:
            return None
        if length == len(self.rows) and self.head is not None:
            return self.head[:HEAD_CHARS]
        if self.nodes is None:
            self.nodes = _chain(ZERO, self.rows)
        return self.nodes[length - 1].hex()[:HEAD_CHARS]

    def extended(self, messages: Sequence[BaseMessage], rows: list[dict[str, Any]]) -> _Transcript:
        """This transcript with ``messages`` (stored as ``rows``) appended, its head computed here.

        The lists are extended in place and shared with the result: a write that does not
        commit must drop this entry (:meth:`EventLogSaver._retrying` does).
        """
        # From the stored head, not from digests of the rows as read (a redacted row reads otherwise).
        nodes = _chain(bytes.fromhex(self.head) if self.head else ZERO, rows)
        if self.nodes is not None:
            self.nodes.extend(nodes)
        self.objects.extend(messages)
        self.rows.extend(rows)
        self.snaps.extend(snapshot(m) for m in messages)
        return dataclasses.replace(self, head=nodes[-1].hex())

    def untouched(self, start: int, stop: int) -> bool:
        """Whether messages ``start..stop`` still equal what they were when stored (C loops)."""
        objects, snaps = self.objects[start:stop], self.snaps[start:stop]
        return all(map(operator.eq, map(_FIELDS, objects), map(_FIRST, snaps))) and all(
            map(operator.eq, map(_EXTRA, objects), map(_SECOND, snaps))
        )


def _chain(parent: bytes, rows: list[dict[str, Any]]) -> list[bytes]:
    """The node digests the log gives ``rows`` appended after node ``parent``."""
    out = []
    for i, row in enumerate(rows):
        parent = node_digest(parent, content_digest(canonical(row, i)))
        out.append(parent)
    return out


def _appendable(rows: list[dict[str, Any]]) -> bool:
    """Whether the log stores ``rows`` as they are (no ``_`` key it would drop), so their heads are known."""
    return all(not key.startswith("_") for row in rows for key in row)


@dataclass
class _Plan:
    """One transaction of the log: rows to append per session, the heads they must follow,
    and the transcripts as they will be once it commits."""

    appends: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    expected: dict[str, str] = field(default_factory=dict)
    transcripts: dict[str, _Transcript] = field(default_factory=dict)
    heads: dict[str, str | None] = field(default_factory=dict)
    """Session heads read for this transaction (its compare-and-set checks them)."""

    def append(self, session_id: str, rows: list[dict[str, Any]], expected: str | None) -> None:
        if session_id in self.appends:
            self.appends[session_id].extend(rows)
        else:
            self.appends[session_id] = list(rows)
            if expected is not None:
                self.expected[session_id] = expected


@dataclass
class _Thread:
    """What a saver knows of one thread: its live checkpoint and write rows, indexed."""

    thread_id: str
    head: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """namespace -> checkpoint id -> its row (a later row with the same id replaces it)."""
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Any, str]]] = field(default_factory=dict)
    """(namespace, checkpoint id) -> (task id, index) -> (task id, channel, value ref, task path)."""
    blobs: dict[str, tuple[str, str]] | None = None
    """digest -> (serializer type, base64 data), loaded when first needed."""
    blobs_head: str | None = None

    def sessions(self, ns: str) -> Any:
        thread_id = self.thread_id
        return lambda channel: transcript_session(thread_id, ns, channel)

    def parent(self, ns: str, checkpoint_id: str) -> dict[str, Any] | None:
        return self.checkpoints.get(ns, {}).get(checkpoint_id)

    def full(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The full form of a stored row (read in order: a checkpoint after its parent)."""
        kind = stored.get("k")
        if kind == "c":
            return decode_checkpoint(stored, self.parent, self.latest_id, self.sessions)
        if kind == "w":
            return decode_writes(stored, self.latest_id, self.sessions)
        return stored

    def compact(self, row: dict[str, Any]) -> dict[str, Any]:
        """The stored form of a full row, a checkpoint as changes to its parent when that is known."""
        sessions = self.sessions(row["ns"])
        latest = self.latest_id(row["ns"])
        if row["kind"] == "writes":
            return encode_writes(row, latest, sessions)
        parent = self.parent(row["ns"], row["parent"]) if row["parent"] else None
        return encode_checkpoint(row, parent, latest, sessions)

    def apply(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        ns = row["ns"]
        if row["kind"] == "checkpoint":
            self.checkpoints.setdefault(ns, {})[row["id"]] = row
        else:
            found = self.writes.setdefault((ns, row["checkpoint"]), {})
            task, path = row["task"], row["path"]
            for idx, channel, ref in row["writes"]:
                found[(task, idx)] = (task, channel, ref, path)

    def latest(self, ns: str) -> dict[str, Any] | None:
        found = self.checkpoints.get(ns)
        return found[max(found)] if found else None

    def latest_id(self, ns: str) -> str | None:
        found = self.checkpoints.get(ns)
        return max(found) if found else None


class EventLogSaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer whose storage is an :class:`~eventlog.EventLog`.

    Pass it as ``checkpointer=`` to ``StateGraph.compile``.  It implements every
    method of ``BaseCheckpointSaver``, sync and async (the async ones run the sync
    ones on a worker thread), and LangGraph's conformance suite passes against it,
    extended capabilities included.  Channel values go through ``serde`` (LangGraph's
    ``JsonPlusSerializer`` by default); lists of messages are stored as transcripts.

    The saver keeps, per thread, an index of its checkpoint rows and the message
    objects it last wrote, so a step costs what its new messages cost; another
    process writing the same thread is noticed by the session heads and the index
    is read again.  Durability is the log's: open it with ``durability="full"``
    (default) to survive power loss.
    """

    def __init__(self, log: AnyEventLog, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)
        if not isinstance(log, (EventLog, AsyncEventLog)):
            raise TypeError(f"EventLogSaver needs an EventLog or an AsyncEventLog, not {type(log).__name__}")
        self._async = as_async(log)
        self.log = self._async.sync
        """The synchronous log every method works on (the async ones on the log's workers)."""
        self._codec = MessageCodec(self.serde)
        self._lock = threading.RLock()
        self._threads: dict[str, _Thread] = {}
        self._transcripts: dict[str, _Transcript] = {}
        self._histories: dict[str, tuple[str | None, builtins.list[Any]]] = {}

    @classmethod
    @contextmanager
    def from_path(
        cls, path: str, *, serde: SerializerProtocol | None = None, **options: Any
    ) -> Iterator[EventLogSaver]:
        """Open the log in directory ``path`` (``options`` go to :meth:`EventLog.open`) and close it afterwards.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as tmp, EventLogSaver.from_path(tmp) as saver:
        ...     saver.get_tuple({"configurable": {"thread_id": "t1"}}) is None
        True
        """
        log = EventLog.open(path, **options)
        try:
            yield cls(log, serde=serde)
        finally:
            log.close()

    # -- the thread index ------------------------------------------------------

    def _read(self, session_id: str) -> list[dict[str, Any]]:
        try:
            return self.log.messages(session_id)
        except UnknownSessionError:
            return []

    def _thread(self, thread_id: str) -> _Thread:
        """The thread's index, read again when another writer moved its checkpoint rows."""
        sid = records_session(thread_id)
        head = self.log.head(sid)
        found = self._threads.get(thread_id)
        if found is not None and found.head == head:
            return found
        found = _Thread(thread_id, head=head)
        for stored in self._read(sid):
            found.apply(found.full(stored))
        self._threads[thread_id] = found
        return found

    def _forget(self, thread_id: str) -> None:
        """Drop what this saver holds of a thread (another writer moved it)."""
        self._threads.pop(thread_id, None)
        prefix = thread_id + SEP
        for sid in [sid for sid in self._transcripts if sid == thread_id or sid.startswith(prefix)]:
            del self._transcripts[sid]

    def _commit(self, thread_id: str, thread: _Thread, plan: _Plan, rows: list[dict[str, Any]]) -> None:
        """Append ``rows`` (full form) to the thread's records with everything ``plan`` holds, in one transaction."""
        sid = records_session(thread_id)
        plan.append(sid, [thread.compact(row) for row in rows], thread.head or EMPTY_HEAD)
        results = self.log.append_many(plan.appends, expected_heads=plan.expected)
        for tid, entry in plan.transcripts.items():
            if tid in plan.appends and _short(results[tid].head) != _short(entry.head):
                self._transcripts.pop(tid, None)
                raise ValueError(
                    f"transcript {tid!r}: the log did not store a message as given (its ephemeral rule dropped it?)"
                )
            self._keep(tid, entry)
        for row in rows:
            thread.apply(row)
        thread.head = results[sid].head
        blobs = plan.appends.get(blobs_session(thread_id))
        if blobs:
            known = self._blobs(thread_id, thread, fresh=False)
            for row in blobs:
                known[row["digest"]] = (row["type"], row["data"])
            thread.blobs_head = results[blobs_session(thread_id)].head

    def _retrying(self, thread_id: str, step: Any) -> Any:
        """Run ``step(plan)`` (which commits ``plan`` once), again after a conflict with another writer.

        When the plan does not commit, the transcripts it extended are dropped: they are read
        again from the log when next needed.
        """
        for _ in range(8):
            plan = _Plan()
            try:
                return step(plan)
            except ConflictError:  # another process wrote the thread meanwhile: read it again, go after it
                self._forget(thread_id)
            except BaseException:
                for sid in plan.transcripts:
                    self._transcripts.pop(sid, None)
                raise
        raise ConflictError(f"thread {thread_id!r}: its sessions keep moving; try again")

    def _blobs(self, thread_id: str, thread: _Thread, *, fresh: bool = True) -> dict[str, tuple[str, str]]:
        if thread.blobs is not None and not fresh:
            return thread.blobs
        sid = blobs_session(thread_id)
        head = self.log.head(sid)
        if thread.blobs is None or thread.blobs_head != head:
            thread.blobs = {row["digest"]: (row["type"], row["data"]) for row in self._read(sid)}
            thread.blobs_head = head
        return thread.blobs

    def _plan_blobs(self, thread_id: str, thread: _Thread, blobs: dict[str, dict[str, Any]], plan: _Plan) -> None:
        if not blobs:
            return
        known = self._blobs(thread_id, thread)
        rows = [row for digest, row in blobs.items() if digest not in known]
        if rows:
            plan.append(blobs_session(thread_id), rows, None)

    # -- values ------------------------------------------------------------------

    def _ref(self, value: Any, blobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
        """How a value is kept: messages as transcript rows, other values serialized, inline when
        small, else by digest in the blobs session."""
        to_row = self._codec.to_row
        if is_message_list(value):  # a node's new messages, a graph's input: rows, not an opaque blob
            return {"rows": [to_row(m) for m in value]}
        if type(value) is dict and value and all(type(k) is str and is_message_list(v) for k, v in value.items()):
            return {"rows_by_key": {key: [to_row(m) for m in item] for key, item in value.items()}}
        kind, data = self.serde.dumps_typed(value)
        if len(data) <= INLINE_BYTES:
            return {"type": kind, "data": _b64(data)}
        digest = sha256(kind.encode("utf-8") + b"\x00" + data).hexdigest()
        blobs.setdefault(digest, {"digest": digest, "type": kind, "data": _b64(data)})
        return {"blob": digest}

    def _load(self, thread_id: str, thread: _Thread, ref: dict[str, Any]) -> Any:
        if "session" in ref:
            return self._read_transcript(ref)
        from_row = self._codec.from_row
        if "rows" in ref:
            return [from_row(row) for row in ref["rows"]]
        if "rows_by_key" in ref:
            return {key: [from_row(row) for row in rows] for key, rows in ref["rows_by_key"].items()}
        if "slices_by_key" in ref:
            return {key: self._read_transcript(item) for key, item in ref["slices_by_key"].items()}
        if "blob" in ref:
            found = self._blobs(thread_id, thread).get(ref["blob"])
            if found is None:
                raise KeyError(
                    f"thread {thread_id!r}: channel value {ref['blob']} is not in {blobs_session(thread_id)!r}"
                )
            kind, data = found
        else:
            kind, data = ref["type"], ref["data"]
        return self.serde.loads_typed((kind, base64.b64decode(data)))

    def _plain_or_serde(self, value: Any) -> Any:
        return value if is_plain(value) else {SERDE_KEY: list(self._ref_inline(value))}

    def _ref_inline(self, value: Any) -> tuple[str, str]:
        kind, data = self.serde.dumps_typed(value)
        return kind, _b64(data)

    def _unplain(self, value: Any) -> Any:
        if type(value) is dict and set(value) == {SERDE_KEY}:
            kind, data = value[SERDE_KEY]
            return self.serde.loads_typed((kind, base64.b64decode(data)))
        return value

    # -- transcripts -------------------------------------------------------------

    def _entry(self, sid: str, plan: _Plan | None = None) -> _Transcript | None:
        """What this saver knows of transcript ``sid`` (as ``plan`` will leave it), if still its head."""
        if plan is None:
            plan = _Plan()
        elif sid in plan.transcripts:
            return plan.transcripts[sid]
        cached = self._transcripts.get(sid)
        if cached is None:
            return None
        if sid not in plan.heads:
            plan.heads[sid] = self.log.head(sid)
        return cached if plan.heads[sid] == cached.head else None

    def _loaded(self, sid: str, plan: _Plan) -> _Transcript | None:
        """Transcript ``sid`` as known, else as read from the log (None when it changes meanwhile)."""
        entry = self._entry(sid, plan)
        if entry is not None:
            return entry
        head = self.log.head(sid)
        rows = self._read(sid)
        if self.log.head(sid) != head:
            return None  # written by another process while it was read
        objects = [self._codec.from_row(row) for row in rows]
        entry = _Transcript(objects, rows, [snapshot(m) for m in objects], head)
        self._keep(sid, entry)
        return entry

    @staticmethod
    def _slice(sid: str, start: int, length: int, head: str | None) -> dict[str, Any]:
        return {"session": sid, "start": start, "length": length, "head": _short(head)}

    def _plan_transcript(
        self, sid: str, key: tuple[str, str], messages: list[BaseMessage], plan: _Plan
    ) -> dict[str, Any]:
        """Make transcript ``sid`` hold ``messages`` for checkpoint ``key``; return the reference it keeps.

        Appending new messages joins ``plan``; anything else (a fork, an edit, a removal:
        tombstones) is a flush of its own, before the plan commits.
        """
        entry = self._entry(sid, plan)
        k = entry.prefix(messages) if entry is not None else 0
        to_row = self._codec.to_row
        if entry is not None and k == len(messages) and entry.pending == key and entry.base == k:
            return self._slice(sid, 0, k, entry.node(k))  # its tasks' messages follow, pending
        if entry is not None and k == len(entry.objects):
            new = messages[k:]
            if not new:
                entry = dataclasses.replace(entry, pending=None)
                plan.transcripts[sid] = entry
                return self._slice(sid, 0, len(messages), entry.head)
            rows = [to_row(m) for m in new]
            if _appendable(rows):
                plan.append(sid, rows, entry.head or EMPTY_HEAD)
                entry = dataclasses.replace(entry.extended(new, rows), pending=None)
                plan.transcripts[sid] = entry
                return self._slice(sid, 0, len(messages), entry.head)
        kept = entry.rows[:k] if entry is not None else []
        rows = kept + [to_row(m) for m in messages[len(kept) :]]
        result = self.log.flush(sid, rows, replace=True)
        entry = _Transcript(list(messages), rows, [snapshot(m) for m in messages], result.head)
        self._keep(sid, entry)
        plan.transcripts[sid] = entry
        return self._slice(sid, 0, len(messages), result.head)

    def _plan_pending(
        self, sid: str, key: tuple[str, str], known: bool, ref: Any, messages: Any, plan: _Plan
    ) -> dict[str, Any] | None:
        """A reference to ``messages``, written for checkpoint ``key``, as messages of transcript ``sid``;
        None when they cannot be.

        ``known``: the checkpoint is stored, and ``ref`` is where its messages are.
        Messages already in the transcript after the checkpoint's own (the graph's input,
        then its task's write; or the next checkpoint took them in first) are referred to
        where they are.  Others are appended after the checkpoint's messages, as that
        checkpoint's pending messages, when nothing else follows them.  Writes LangGraph
        hands over before their checkpoint (it stores checkpoints in the background) keep
        their own copy: what that checkpoint's messages will be is not known yet.
        A message without an id is not appended: ``add_messages`` gives it one when the step
        ends, on another thread, maybe while this runs; the write keeps its own copy.
        """
        if not known or not is_message_list(messages):
            return None
        if any(isinstance(m, RemoveMessage) or not m.id for m in messages):
            return None
        entry = self._loaded(sid, plan)
        if entry is None:
            return None
        live = len(entry.objects)
        if type(ref) is not dict or ref.get("session") != sid or ref.get("start", 0) != 0:
            return None
        length = ref["length"]
        if length > live or entry.node(length) != ref["head"]:
            return None  # the live transcript no longer starts with the checkpoint's messages
        own = live == length or (entry.pending == key and entry.base == length)
        count = len(messages)
        objects, snaps = entry.objects, entry.snaps
        for start in range(length, live - count + 1):
            if all(objects[start + i] is m and unchanged(m, snaps[start + i]) for i, m in enumerate(messages)):
                return self._slice(sid, start, start + count, entry.node(start + count))
        if not own:
            return None
        rows = [self._codec.to_row(m) for m in messages]
        if not _appendable(rows):
            return None
        plan.append(sid, rows, entry.head or EMPTY_HEAD)
        entry = dataclasses.replace(entry.extended(messages, rows), pending=key, base=length)
        plan.transcripts[sid] = entry
        return self._slice(sid, live, live + count, entry.head)

    def _keep(self, sid: str, entry: _Transcript) -> None:
        self._transcripts.pop(sid, None)
        self._transcripts[sid] = entry
        while len(self._transcripts) > TRANSCRIPTS_KEPT:
            self._transcripts.pop(next(iter(self._transcripts)))

    def _read_transcript(self, ref: dict[str, Any]) -> list[BaseMessage]:
        """The exact messages a reference names, live or from the transcript's history."""
        sid, length, head = ref["session"], ref["length"], _short(ref["head"])
        start = ref.get("start", 0)
        if length == 0:
            return []
        from_row = self._codec.from_row
        with self._lock:
            entry = self._loaded(sid, _Plan())
            if entry is not None and length <= len(entry.objects) and entry.node(length) == head:
                for i in range(start, length) if not entry.untouched(start, length) else ():
                    if not unchanged(entry.objects[i], entry.snaps[i]):  # edited in place since: read the row
                        fresh = from_row(entry.rows[i])
                        entry.objects[i] = fresh
                        entry.snaps[i] = snapshot(fresh)
                return entry.objects[start:length]
        history = self._history(sid)
        end = next((o for o in history if o.position == length - 1 and o.node.startswith(head)), None)
        if end is None:
            raise KeyError(f"transcript {sid!r} never had {length} messages ending in node {head}")
        # The list as it was right after the event that made ``head`` live: at each position the
        # occurrence live then (made live by then, not yet tombstoned).
        at = end.seq
        rows_at: dict[int, dict[str, Any]] = {}
        for o in history:
            if o.position < length and o.seq <= at and (o.tombstone is None or o.tombstone.seq > at):
                rows_at[o.position] = o.message
        if len(rows_at) != length:  # not expected; replay is the authority
            return [from_row(row) for row in self.log.messages(sid, as_of=at)[start:length]]
        return [from_row(rows_at[position]) for position in range(start, length)]

    def _history(self, sid: str) -> builtins.list[Any]:
        """The transcript's full history, kept while its head stays (``list`` reads many old checkpoints)."""
        head = self.log.head(sid)
        with self._lock:
            kept = self._histories.get(sid)
            if kept is not None and kept[0] == head:
                return kept[1]
        history = self.log.history(sid)
        with self._lock:
            self._histories = {sid: (head, history)}  # one transcript's history at a time
        return history

    # -- BaseCheckpointSaver -----------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint: message lists as transcripts, other new values by reference."""
        conf = config["configurable"]
        thread_id = _check_thread(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        parent_id = conf.get("checkpoint_id")
        full_metadata = get_checkpoint_metadata(config, metadata)
        with self._lock:
            self._retrying(
                thread_id,
                lambda plan: self._put(plan, thread_id, ns, parent_id, checkpoint, full_metadata, new_versions),
            )
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _put(
        self,
        plan: _Plan,
        thread_id: str,
        ns: str,
        parent_id: str | None,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> None:
        thread = self._thread(thread_id)
        parent = thread.parent(ns, parent_id) if parent_id else None
        parent_checkpoint = parent["checkpoint"] if parent else {}
        parent_versions = parent_checkpoint.get("channel_versions", {}) if type(parent_checkpoint) is dict else {}
        values = checkpoint["channel_values"]
        key = (ns, checkpoint["id"])
        refs: dict[str, Any] = {}
        blobs: dict[str, dict[str, Any]] = {}
        later = []
        for channel, version in checkpoint["channel_versions"].items():
            if channel not in values:
                continue
            value = values[channel]
            sid = transcript_session(thread_id, ns, channel)
            inherited = parent["values"].get(channel) if parent else None
            if (
                channel not in new_versions
                and inherited is not None
                and parent_versions.get(channel) == version
                and ("session" not in inherited or self._is_current(sid, key, inherited, plan))
            ):
                refs[channel] = inherited  # the same value at the same version: stored once
            elif is_message_list(value) or (type(value) is list and not value and sid in self.log):
                refs[channel] = self._plan_transcript(sid, key, value, plan)
            else:
                later.append(channel)
        row = {
            "kind": "checkpoint",
            "ns": ns,
            "id": checkpoint["id"],
            "parent": parent_id,
            "checkpoint": None,
            "metadata": self._plain_or_serde(copy(metadata)),
            "values": refs,
        }
        for channel in later:  # the graph's input ({"messages": [...]}): after the messages it will join
            value = values[channel]
            slices: dict[str, dict[str, Any]] = {}
            if type(value) is dict and value and all(type(key) is str for key in value):
                for name, item in value.items():
                    sid = transcript_session(thread_id, ns, name)
                    found = self._plan_pending(sid, (ns, row["id"]), True, refs.get(name), item, plan)
                    if found is None:
                        break
                    slices[name] = found
            whole = len(slices) == len(value) if slices else False
            refs[channel] = {"slices_by_key": slices} if whole else self._ref(value, blobs)
        # A copy: LangGraph goes on changing the dicts it handed over (versions) after put returns.
        rest = {key: copy(value) for key, value in checkpoint.items() if key != "channel_values"}
        row["checkpoint"] = rest if is_plain(rest) else {SERDE_KEY: list(self._ref_inline(rest))}
        self._plan_blobs(thread_id, thread, blobs, plan)
        self._commit(thread_id, thread, plan, [row])

    def _is_current(self, sid: str, key: tuple[str, str], ref: dict[str, Any], plan: _Plan) -> bool:
        """Whether transcript ``sid`` holds what ``ref`` names and nothing after it but pending
        messages of checkpoint ``key`` (so the live transcript follows the newest checkpoint)."""
        if ref["session"] != sid or ref.get("start", 0):
            return False
        entry = self._entry(sid, plan)
        if entry is not None and entry.pending == key and entry.base == ref["length"]:
            return entry.node(ref["length"]) == _short(ref["head"])
        head = entry.head if entry is not None else plan.heads.get(sid) or self.log.head(sid)
        return _short(head) == _short(ref["head"])

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes for a checkpoint; a retry of the same task and index is stored once.

        New messages for a message channel are appended to its transcript after the
        checkpoint's messages, and the write refers to them there.
        """
        conf = config["configurable"]
        thread_id = _check_thread(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = conf["checkpoint_id"]
        with self._lock:
            self._retrying(
                thread_id, lambda plan: self._put_writes(plan, thread_id, ns, checkpoint_id, writes, task_id, task_path)
            )

    def _put_writes(
        self,
        plan: _Plan,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        path: str,
    ) -> None:
        thread = self._thread(thread_id)
        stored = thread.writes.get((ns, checkpoint_id), {})
        checkpoint = thread.parent(ns, checkpoint_id)
        blobs: dict[str, dict[str, Any]] = {}
        entries = []
        for idx, (channel, value) in enumerate(writes):
            index = WRITES_IDX_MAP.get(channel, idx)
            if index >= 0 and (task_id, index) in stored:
                continue  # regular writes are kept as first stored; special ones are replaced
            sid = transcript_session(thread_id, ns, channel)
            ref = self._plan_pending(
                sid,
                (ns, checkpoint_id),
                checkpoint is not None,
                checkpoint["values"].get(channel) if checkpoint is not None else None,
                value,
                plan,
            )
            entries.append([index, channel, ref if ref is not None else self._ref(value, blobs)])
        if not entries:
            return
        row = {
            "kind": "writes",
            "ns": ns,
            "checkpoint": checkpoint_id,
            "task": task_id,
            "path": path,
            "writes": entries,
        }
        self._plan_blobs(thread_id, thread, blobs, plan)
        self._commit(thread_id, thread, plan, [row])

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (the newest of its namespace without ``checkpoint_id``), or None."""
        conf = config["configurable"]
        thread_id = _check_thread(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        with self._lock:
            thread = self._thread(thread_id)
            if checkpoint_id:
                row = thread.parent(ns, checkpoint_id)
            else:
                row = thread.latest(ns)
            if row is None:
                return None
            return self._tuple(thread_id, thread, row)

    def _tuple(self, thread_id: str, thread: _Thread, row: dict[str, Any]) -> CheckpointTuple:
        ns = row["ns"]
        checkpoint = copy(self._unplain(row["checkpoint"]))  # LangGraph changes the versions of what it gets
        checkpoint["channel_values"] = {
            channel: self._load(thread_id, thread, ref) for channel, ref in row["values"].items()
        }
        writes = sorted(
            thread.writes.get((ns, row["id"]), {}).items(), key=lambda item: writes_sort_key(item[1][3], *item[0])
        )
        pending = [
            (task, channel, self._load(thread_id, thread, ref))
            for (task, channel, ref, _path) in (w for _, w in writes)
        ]
        parent = row["parent"]
        return CheckpointTuple(
            config={"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": row["id"]}},
            checkpoint=checkpoint,
            metadata=copy(self._unplain(row["metadata"])),
            parent_config=(
                {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": parent}}
                if parent
                else None
            ),
            pending_writes=pending,
        )

    def _thread_ids(self) -> builtins.list[str]:
        suffix = f"{SEP}checkpoints"
        return [sid[: -len(suffix)] for sid in self.log.sessions() if sid.endswith(suffix)]

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first per namespace: of ``config``'s thread (and namespace, when given) or all."""
        thread_ids = [config["configurable"]["thread_id"]] if config else self._thread_ids()
        wanted_ns = config["configurable"].get("checkpoint_ns") if config else None
        wanted_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        remaining = limit
        for thread_id in thread_ids:
            with self._lock:
                thread = self._thread(thread_id)
                spaces = {ns: dict(found) for ns, found in thread.checkpoints.items()}
            for ns, found in spaces.items():
                if wanted_ns is not None and ns != wanted_ns:
                    continue
                for checkpoint_id in sorted(found, reverse=True):
                    if wanted_id and checkpoint_id != wanted_id:
                        continue
                    if before_id and checkpoint_id >= before_id:
                        continue
                    row = found[checkpoint_id]
                    if filter:
                        metadata = self._unplain(row["metadata"])
                        if not all(metadata.get(key) == value for key, value in filter.items()):
                            continue
                    if remaining is not None:
                        if remaining <= 0:
                            return
                        remaining -= 1
                    with self._lock:
                        item = self._tuple(thread_id, thread, row)
                    yield item

    def _sessions_of(self, thread_id: str) -> builtins.list[str]:
        prefix = thread_id + SEP
        return [sid for sid in self.log.sessions() if sid == thread_id or sid.startswith(prefix)]

    def delete_thread(self, thread_id: str) -> None:
        """Tombstone every session of the thread (reason ``clear``): it reads as empty, its history stays."""
        _check_thread(thread_id)
        with self._lock:
            if records_session(thread_id) not in self.log:
                return
            live = [sid for sid in self._sessions_of(thread_id) if self.log.head(sid) is not None]
            if live:
                self.log.flush_many({sid: [] for sid in live}, replace=True)
            self._forget(thread_id)

    def _rewrite(self, thread_id: str, keep: Any) -> None:
        """Keep the checkpoint rows ``keep(thread, row)`` accepts; tombstone the others.

        The kept rows are stored again as they read without the others (a checkpoint whose
        parent went is stored whole): those before the first row that goes are the rows
        already stored, so only the rows from there on are tombstoned and written.
        """
        with self._lock:
            thread = self._thread(thread_id)
            kept = [row for row in thread.rows if keep(thread, row)]
            if len(kept) == len(thread.rows):
                return
            again = _Thread(thread_id)
            rows = []
            for row in kept:
                rows.append(again.compact(row))
                again.apply(row)
            self.log.flush(records_session(thread_id), rows, replace=True, expected_head=thread.head or EMPTY_HEAD)
            self._threads.pop(thread_id, None)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Tombstone the checkpoints whose metadata ``run_id`` is one of ``run_ids``, and their writes."""
        runs = set(run_ids)
        if not runs:
            return
        for thread_id in self._thread_ids():
            with self._lock:
                thread = self._thread(thread_id)
                gone = {
                    (row["ns"], row["id"])
                    for row in thread.rows
                    if row["kind"] == "checkpoint" and self._unplain(row["metadata"]).get("run_id") in runs
                }
            if gone:
                self._rewrite(thread_id, lambda t, row, gone=gone: _key(row) not in gone)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another (the log shares what it can).

        The target's rows are stored whole and refer to the source's transcripts, whose
        history holds every message an old checkpoint had.
        """
        _check_thread(target_thread_id)
        with self._lock:
            if records_session(source_thread_id) not in self.log:
                return
            rows = self._thread(source_thread_id).rows
            records = records_session(source_thread_id)
            for sid in self._sessions_of(source_thread_id):
                if sid == records:
                    continue
                target = target_thread_id + sid[len(source_thread_id) :]
                if target not in self.log:
                    self.log.fork(sid, target)  # shares the chain: nothing is stored again
                else:
                    self.log.flush(target, self._read(sid), replace=True)
            self.log.append(records_session(target_thread_id), rows)
            self._forget(target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``keep_latest``: tombstone all but each namespace's newest checkpoint; ``delete``: delete the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"prune strategy must be 'keep_latest' or 'delete', not {strategy!r}")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            if records_session(thread_id) not in self.log:
                continue

            def keep(thread: _Thread, row: dict[str, Any]) -> bool:
                latest = thread.latest(row["ns"])
                return latest is not None and _key(row) == (latest["ns"], latest["id"])

            self._rewrite(thread_id, keep)

    # -- async twins ----------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._async.run(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await self._async.run(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._async.run(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._async.run(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._async.run(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._async.run(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._async.run(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._async.run(self.prune, thread_ids, strategy=strategy)


def _key(row: dict[str, Any]) -> tuple[str, str]:
    """The (namespace, checkpoint id) a checkpoint or writes row belongs to."""
    return row["ns"], row["id"] if row["kind"] == "checkpoint" else row["checkpoint"]
