"""A LangGraph checkpointer on the event log: :class:`EventLogSaver`.

LangGraph saves every channel of the graph at every super-step; a ``MessagesState``
graph hands its whole message list to ``put`` again and again.  Here that list is a
transcript session of the log, so a step that adds two messages stores two messages,
and every checkpoint refers to the transcript by its length and head node digest.
Everything else lives in two more sessions per thread, as JSON-like rows:

- ``<thread>`` — the conversation (the ``messages`` channel of the root graph);
  ``<thread>␟messages␟<ns>␟<channel>`` for other message channels and subgraphs
  (``␟`` is U+001F, which a thread id may therefore not contain);
- ``<thread>␟checkpoints`` — one row per checkpoint (its versions, metadata and where
  each channel value is) and one per ``put_writes`` call, appended in order;
- ``<thread>␟blobs`` — channel values larger than :data:`INLINE_BYTES` in LangGraph's
  serializer's form, each distinct value once (content-addressed by SHA-256).

Nothing is ever deleted: a time-travel fork or a ``RemoveMessage`` tombstones the
transcript's tail (``rewind``/``edit``), ``delete_thread`` tombstones every session of
the thread (``clear``), ``prune``/``delete_for_runs`` tombstone checkpoint rows.  The
history stays readable (``eventlog history``); docs/integrations/langgraph.md says how
to purge for good.
"""

from __future__ import annotations

import base64
import builtins
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any

from ..aio import AsyncEventLog
from ..errors import ConflictError, UnknownSessionError
from ..log import EMPTY_HEAD, EventLog
from . import AnyEventLog, as_async, require

require("langgraph", "langgraph.checkpoint.base", distribution="langgraph")

from langchain_core.messages import BaseMessage  # noqa: E402
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

from .langgraph_messages import SERDE_KEY, MessageCodec, is_message_list, is_plain, snapshot, unchanged  # noqa: E402

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


@dataclass
class _Transcript:
    """The message list last written to a transcript session by this saver, and its head."""

    objects: list[BaseMessage]
    rows: list[dict[str, Any]]
    snaps: list[tuple[Any, Any]]
    head: str | None

    def prefix(self, messages: Sequence[BaseMessage]) -> int:
        """How many leading ``messages`` are the very objects held here, unchanged."""
        objects, snaps = self.objects, self.snaps
        n = min(len(objects), len(messages))
        for i in range(n):
            message = messages[i]
            if message is not objects[i] or not unchanged(message, snaps[i]):
                return i
        return n


@dataclass
class _Thread:
    """What a saver knows of one thread: its live checkpoint and write rows, indexed."""

    head: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    """namespace -> checkpoint id -> its row (a later row with the same id replaces it)."""
    writes: dict[tuple[str, str], dict[tuple[str, int], tuple[str, str, Any, str]]] = field(default_factory=dict)
    """(namespace, checkpoint id) -> (task id, index) -> (task id, channel, value ref, task path)."""
    blobs: dict[str, tuple[str, str]] | None = None
    """digest -> (serializer type, base64 data), loaded when first needed."""
    blobs_head: str | None = None

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
        found = _Thread(head=head)
        for row in self._read(sid):
            found.apply(row)
        self._threads[thread_id] = found
        return found

    def _append(self, thread_id: str, thread: _Thread, rows: list[dict[str, Any]]) -> None:
        sid = records_session(thread_id)
        for _ in range(8):
            try:
                result = self.log.append(sid, rows, expected_head=thread.head or EMPTY_HEAD)
                break
            except ConflictError:  # another process appended meanwhile: read its rows, go after them
                thread = self._thread(thread_id)
        else:
            raise ConflictError(f"thread {thread_id!r}: its checkpoint rows keep moving; try again")
        for row in rows:
            thread.apply(row)
        thread.head = result.head

    def _blobs(self, thread_id: str, thread: _Thread) -> dict[str, tuple[str, str]]:
        sid = blobs_session(thread_id)
        head = self.log.head(sid)
        if thread.blobs is None or thread.blobs_head != head:
            thread.blobs = {row["digest"]: (row["type"], row["data"]) for row in self._read(sid)}
            thread.blobs_head = head
        return thread.blobs

    def _store_blobs(self, thread_id: str, thread: _Thread, blobs: dict[str, dict[str, Any]]) -> None:
        sid = blobs_session(thread_id)
        known = self._blobs(thread_id, thread)
        rows = [row for digest, row in blobs.items() if digest not in known]
        if not rows:
            return
        result = self.log.append(sid, rows)
        for row in rows:
            known[row["digest"]] = (row["type"], row["data"])
        thread.blobs_head = result.head

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

    def _write_transcript(self, sid: str, messages: list[BaseMessage]) -> dict[str, Any]:
        """Make transcript ``sid`` hold ``messages``; return the reference a checkpoint keeps."""
        with self._lock:
            cached = self._transcripts.pop(sid, None)
            if cached is not None and self.log.head(sid) != cached.head:
                cached = None  # written by someone else since
            k = cached.prefix(messages) if cached is not None else 0
            to_row = self._codec.to_row
            if cached is not None and k == len(cached.objects):
                if k < len(messages):
                    new = messages[k:]
                    rows = [to_row(m) for m in new]
                    try:
                        result = self.log.append(sid, rows, expected_head=cached.head or EMPTY_HEAD)
                    except ConflictError:
                        cached = None
                    else:
                        cached.objects.extend(new)
                        cached.rows.extend(rows)
                        cached.snaps.extend(snapshot(m) for m in new)
                        cached.head = result.head
                if cached is not None:
                    self._keep(sid, cached)
                    return {"session": sid, "length": len(messages), "head": cached.head}
            kept = cached.rows[:k] if cached is not None else []
            rows = kept + [to_row(m) for m in messages[len(kept) :]]
            result = self.log.flush(sid, rows, replace=True)
            entry = _Transcript(list(messages), rows, [snapshot(m) for m in messages], result.head)
            self._keep(sid, entry)
            return {"session": sid, "length": len(messages), "head": result.head}

    def _keep(self, sid: str, entry: _Transcript) -> None:
        self._transcripts[sid] = entry
        while len(self._transcripts) > TRANSCRIPTS_KEPT:
            self._transcripts.pop(next(iter(self._transcripts)))

    def _read_transcript(self, ref: dict[str, Any]) -> list[BaseMessage]:
        """The exact message list a checkpoint saw, live or from the transcript's history."""
        sid, length, head = ref["session"], ref["length"], ref["head"]
        if length == 0:
            return []
        from_row = self._codec.from_row
        with self._lock:
            cached = self._transcripts.get(sid)
            live = self.log.head(sid)
            if cached is not None and cached.head == head == live and len(cached.objects) == length:
                for i, message in enumerate(cached.objects):
                    if not unchanged(message, cached.snaps[i]):  # edited in place since: read the stored row
                        fresh = from_row(cached.rows[i])
                        cached.objects[i] = fresh
                        cached.snaps[i] = snapshot(fresh)
                return list(cached.objects)
            if live == head:
                rows = self._read(sid)
                if len(rows) == length:
                    objects = [from_row(row) for row in rows]
                    self._keep(sid, _Transcript(objects, rows, [snapshot(m) for m in objects], head))
                    return list(objects)
        history = self._history(sid)
        end = next((o for o in history if o.position == length - 1 and o.node == head), None)
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
            return [from_row(row) for row in self.log.messages(sid, as_of=at)[:length]]
        return [from_row(rows_at[position]) for position in range(length)]

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
        with self._lock:
            thread = self._thread(thread_id)
            parent = thread.checkpoints.get(ns, {}).get(parent_id) if parent_id else None
            parent_versions = parent["checkpoint"].get("channel_versions", {}) if parent else {}
            values = checkpoint["channel_values"]
            refs: dict[str, Any] = {}
            blobs: dict[str, dict[str, Any]] = {}
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
                    and ("session" not in inherited or self._is_current(sid, inherited))
                ):
                    refs[channel] = inherited  # the same value at the same version: stored once
                elif is_message_list(value) or (type(value) is list and not value and sid in self.log):
                    refs[channel] = self._write_transcript(sid, value)
                else:
                    refs[channel] = self._ref(value, blobs)
            rest = {key: value for key, value in checkpoint.items() if key != "channel_values"}
            row = {
                "kind": "checkpoint",
                "ns": ns,
                "id": checkpoint["id"],
                "parent": parent_id,
                "checkpoint": rest if is_plain(rest) else {SERDE_KEY: list(self._ref_inline(rest))},
                "metadata": self._plain_or_serde(get_checkpoint_metadata(config, metadata)),
                "values": refs,
            }
            if blobs:
                self._store_blobs(thread_id, thread, blobs)
            self._append(thread_id, thread, [row])
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    def _is_current(self, sid: str, ref: dict[str, Any]) -> bool:
        """Whether transcript ``sid`` holds what ``ref`` names (so the live transcript follows the newest checkpoint)."""
        if ref["session"] != sid:
            return False
        cached = self._transcripts.get(sid)
        head = cached.head if cached is not None else self.log.head(sid)
        return head == ref["head"]

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes for a checkpoint; a retry of the same task and index is stored once."""
        conf = config["configurable"]
        thread_id = _check_thread(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = conf["checkpoint_id"]
        with self._lock:
            thread = self._thread(thread_id)
            stored = thread.writes.get((ns, checkpoint_id), {})
            blobs: dict[str, dict[str, Any]] = {}
            entries = []
            for idx, (channel, value) in enumerate(writes):
                index = WRITES_IDX_MAP.get(channel, idx)
                if index >= 0 and (task_id, index) in stored:
                    continue  # regular writes are kept as first stored; special ones are replaced
                entries.append([index, channel, self._ref(value, blobs)])
            if not entries:
                return
            row = {
                "kind": "writes",
                "ns": ns,
                "checkpoint": checkpoint_id,
                "task": task_id,
                "path": task_path,
                "writes": entries,
            }
            if blobs:
                self._store_blobs(thread_id, thread, blobs)
            self._append(thread_id, thread, [row])

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint named by ``config`` (the newest of its namespace without ``checkpoint_id``), or None."""
        conf = config["configurable"]
        thread_id = _check_thread(conf["thread_id"])
        ns = conf.get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        with self._lock:
            thread = self._thread(thread_id)
            if checkpoint_id:
                row = thread.checkpoints.get(ns, {}).get(checkpoint_id)
            else:
                row = thread.latest(ns)
            if row is None:
                return None
            return self._tuple(thread_id, thread, row)

    def _tuple(self, thread_id: str, thread: _Thread, row: dict[str, Any]) -> CheckpointTuple:
        ns = row["ns"]
        checkpoint = dict(self._unplain(row["checkpoint"]))
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
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=dict(self._unplain(row["metadata"])),  # type: ignore[arg-type]
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
            for sid in live:
                self._transcripts.pop(sid, None)
            self._threads.pop(thread_id, None)

    def _rewrite(self, thread_id: str, keep: Any) -> None:
        """Keep the checkpoint rows ``keep(thread, row)`` accepts; tombstone the others."""
        with self._lock:
            thread = self._thread(thread_id)
            rows = [row for row in thread.rows if keep(thread, row)]
            if len(rows) == len(thread.rows):
                return
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
        """Copy every checkpoint and write of a thread to another (the log shares what it can)."""
        _check_thread(target_thread_id)
        with self._lock:
            if records_session(source_thread_id) not in self.log:
                return
            for sid in self._sessions_of(source_thread_id):
                target = target_thread_id + sid[len(source_thread_id) :]
                if target not in self.log:
                    self.log.fork(sid, target)  # shares the chain: nothing is stored again
                elif sid == records_session(source_thread_id):
                    self.log.append(target, self._read(sid))
                else:
                    self.log.flush(target, self._read(sid), replace=True)
                self._transcripts.pop(target, None)
            self._threads.pop(target_thread_id, None)

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
