"""The backend-neutral projection core: events in ``seq`` order to row changes.

Every target (SQLite, PostgreSQL, hermes' ``state.db``) shares what is decided here:

- which row changes an event makes (:class:`Applier`: sessions, live rows, tombstoned
  rows with their reason, display overrides, counters, the text that search indexes);
- the checkpoint rules (:func:`check_source`, :func:`check_chain`): a projection
  belongs to one log and refuses another log's events, refuses a log that ends before
  its checkpoint (restored from an older copy), and refuses an event that does not
  chain to the last one it applied;
- how events are cut into transactions (:func:`chunks`), never inside one write of
  the log, so a reader never sees half of a compaction;
- a damaged event is refused: the log's reader checks every event's hash and chain,
  and :func:`apply_chunk` checks that the ``seq`` are gapless after the checkpoint.

A target supplies a :class:`Store`: the row reads and writes of one open transaction
in its own database.  Nothing here reads a clock: every value comes from the events,
so any split into transactions gives the same tables as a rebuild.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol, assert_never

from eventlog import codec
from eventlog import events as ev
from eventlog.source import EventSource as Source

from .errors import LogMismatchError, ProjectionCorruptError, ProjectionError, RebuildNeeded
from .rows import DERIVED, add_counter, derive, from_json, to_json

if TYPE_CHECKING:
    from eventlog.store import Record


ROW_COLUMNS: Final = (
    "session_id",
    "position",
    "seq",
    "idx",
    "node",
    "digest",
    "body_seq",
    "body_idx",
    "summary",
    "created_ns",
    "redacted_seq",
    *DERIVED,
)
"""The columns of a row written by :meth:`Store.write_rows`, in tuple order."""

SESSION_COLUMNS: Final = (
    "id",
    "parent_id",
    "fork_position",
    "created_seq",
    "created_ns",
    "closed_seq",
    "closed_ns",
    "close_reason",
    "message_count",
    "head_node",
    "last_seq",
    "title",
    "model",
    "source",
    "metadata",
    "counters",
    *ev.USAGE_COUNTERS,
)
"""The fields of a session row (a list in this order), as :meth:`Store.session` returns them."""

# Where a session row keeps each field.
PARENT, FORK_AT, CLOSED_SEQ, CLOSED_NS, CLOSE_REASON, COUNT, HEAD, LAST_SEQ, METADATA, COUNTERS = (
    SESSION_COLUMNS.index(name)
    for name in (
        "parent_id",
        "fork_position",
        "closed_seq",
        "closed_ns",
        "close_reason",
        "message_count",
        "head_node",
        "last_seq",
        "metadata",
        "counters",
    )
)
COUNTER_COLUMNS: Final = frozenset(ev.USAGE_COUNTERS)
"""Usage counters that also have a column of their own (every counter is in ``counters``)."""
FIELD_COLUMNS: Final = frozenset({"title", "model", "source"})
NEW_SESSION: Final[dict[str, Any]] = {
    "message_count": 0,
    "metadata": "{}",
    "counters": "{}",
    **{name: 0 for name in COUNTER_COLUMNS},
    "cost_usd": 0.0,
}
"""Field values of a session that no event has touched yet (the rest are ``None``)."""

CONTENT, TOOL_TEXT, MESSAGE = (DERIVED.index(name) for name in ("content", "tool_text", "message"))

ROWS_PER_WRITE: Final = 5000
"""Appended rows are handed to :meth:`Store.write_rows` this many at a time (in bulk)."""


@dataclass(frozen=True)
class Checkpoint:
    """How far a projection has applied one log: ``last_seq`` and the hash of that event."""

    log_id: str | None
    last_seq: int = 0
    last_hash: bytes | None = None


class Store(Protocol):
    """The reads and writes of a target inside one open transaction, for one log.

    Rows are tuples in :data:`ROW_COLUMNS` order, sessions lists in
    :data:`SESSION_COLUMNS` order.  "Live" rows are those not tombstoned.  A row that
    ``write_rows`` was given is visible to every later read of the same transaction.
    """

    def session(self, session_id: str) -> list[Any] | None:
        """The stored session row, or ``None`` when the target has none."""
        ...

    def write_rows(self, rows: list[tuple[Any, ...]], *, bulk: bool) -> None:
        """Insert new live rows (``bulk``: a full batch of a long run, a hint for indexing)."""
        ...

    def live_nodes(self, session_id: str, position: int) -> list[bytes]:
        """Node digests of the session's live rows from ``position`` on, in order."""
        ...

    def node_at(self, session_id: str, position: int) -> bytes | None:
        """Node digest of the live row at ``position``."""
        ...

    def tombstone(self, session_id: str, position: int, seq: int, reason: str, time_ns: int) -> None:
        """End the life of the session's live rows from ``position`` on."""
        ...

    def copy_fork(self, session_id: str, seq: int, time_ns: int, source: str, at: int) -> None:
        """Copy the first ``at`` live rows of ``source`` into ``session_id`` (same digests, bodies, display)."""
        ...

    def live_message(self, session_id: str, position: int) -> tuple[bytes, str] | None:
        """``(node, message JSON)`` of the live row at ``position``."""
        ...

    def redisplay(self, session_id: str, position: int, derived: tuple[Any, ...]) -> None:
        """Replace the :data:`~projections.rows.DERIVED` columns of the live row at ``position``."""
        ...

    def stored_message(self, seq: int, idx: int) -> tuple[str, bytes, int | None] | None:
        """``(message JSON, content digest, redacted_seq)`` of the row first written by event
        ``seq`` at batch index ``idx`` (tombstoned or not)."""
        ...

    def redact(self, body_seq: int, body_idx: int, seq: int, derived: tuple[Any, ...]) -> None:
        """Mark every row whose body is ``(body_seq, body_idx)`` redacted by event ``seq``, tombstoned
        rows and other sessions' (forks) included, with these :data:`~projections.rows.DERIVED` columns."""
        ...

    def save_sessions(self, sessions: list[list[Any]]) -> None:
        """Insert or replace these session rows."""
        ...


class Applier:
    """Applies records to a :class:`Store` inside one open transaction.

    Appended rows are buffered and handed over in batches of :data:`ROWS_PER_WRITE`;
    every event that reads or changes existing rows (tombstones, forks, annotations,
    carried bodies) first hands over the buffer, so it always sees the rows in their
    order.  Session rows are kept in memory and saved once, by :meth:`finish`.

    ``fresh``: the target holds nothing of this log (a rebuild), so a session not seen
    yet does not exist and is not looked up.

    ``log``: the log being applied, read back at a :class:`~eventlog.events.MessageRedacted`
    event to check that the body the projection holds is the placeholder the log holds now
    (see :meth:`_redact`).
    """

    def __init__(self, store: Store, *, fresh: bool = False, log: Source | None = None) -> None:
        self.store = store
        self.fresh = fresh
        self.log = log
        self.rows: list[tuple[Any, ...]] = []
        self.sessions: dict[str, list[Any]] = {}
        self.touched: set[str] = set()
        self.messages = 0

    def apply(self, record: Record) -> None:
        event = record.event
        session = self._session(event.session, record)
        session[LAST_SEQ] = record.seq
        match event:
            case ev.MessagesAppended():
                self._append(record, event, session)
            case ev.MessagesTombstoned():
                self._tombstone(record, event, session)
            case ev.SessionOpened():
                self._open(record, event, session)
            case ev.SessionUpdated():
                self._update(event, session)
            case ev.SessionClosed():
                session[CLOSED_SEQ], session[CLOSED_NS], session[CLOSE_REASON] = (
                    record.seq,
                    record.time_ns,
                    event.reason,
                )
            case ev.MessageAnnotated():
                self._annotate(event)
            case ev.MessageRedacted():
                self._redact(record, event)
            case _:
                assert_never(event)

    def finish(self) -> None:
        """Hand over buffered rows and save the touched sessions."""
        self._write_rows()
        if self.touched:
            self.store.save_sessions([self.sessions[sid] for sid in sorted(self.touched)])
            self.touched.clear()

    # -- events ----------------------------------------------------------------

    def _append(self, record: Record, event: ev.MessagesAppended, session: list[Any]) -> None:
        sid, seq, now = event.session, record.seq, record.time_ns
        position = event.position
        count = len(event.bodies)
        if position != session[COUNT]:
            raise ProjectionCorruptError(
                f"event {seq}: appends at position {position} of {sid!r}, which has {session[COUNT]} live rows"
            )
        if count == 0:
            return
        carried = event.carried
        if carried:
            self._write_rows()  # carried bodies are looked up in the store
        overrides = event.overrides
        summaries = event.summaries
        digests, nodes = event.digests, event.nodes
        decode = codec.decode
        rows = self.rows
        for i, body in enumerate(event.bodies):
            where = carried.get(i) if carried else None
            redacted = None
            if where is None:
                message = decode(body)
                body_seq, body_idx = seq, i
            else:
                body_seq, body_idx = where
                message, redacted = self._stored_message(seq, body_seq, body_idx)
            o = 32 * i
            rows.append(
                (
                    sid,
                    position + i,
                    seq,
                    i,
                    nodes[o : o + 32],
                    digests[o : o + 32],
                    body_seq,
                    body_idx,
                    1 if i < summaries else 0,
                    now,
                    redacted,
                    *derive(message, overrides.get(i)),
                )
            )
        self.messages += count
        # New messages reopen a closed session, as in the log.
        session[CLOSED_SEQ] = session[CLOSED_NS] = session[CLOSE_REASON] = None
        session[COUNT] = position + count
        session[HEAD] = nodes[-32:]
        if len(rows) >= ROWS_PER_WRITE:
            self._write_rows(bulk=True)

    def _tombstone(self, record: Record, event: ev.MessagesTombstoned, session: list[Any]) -> None:
        self._write_rows()
        sid, position = event.session, event.position
        found = self.store.live_nodes(sid, position)
        if b"".join(found) != event.nodes or position + len(found) != session[COUNT]:
            raise ProjectionCorruptError(
                f"event {record.seq}: the live rows of {sid!r} from position {position} are not the tombstoned ones"
            )
        self.store.tombstone(sid, position, record.seq, event.reason, record.time_ns)
        session[COUNT] = position
        session[HEAD] = self.store.node_at(sid, position - 1) if position else None

    def _open(self, record: Record, event: ev.SessionOpened, session: list[Any]) -> None:
        if event.source is None:
            return
        self._write_rows()
        source = self._session(event.source, record)
        at = event.at
        session[PARENT], session[FORK_AT] = event.source, at
        if at == 0:
            return
        if at > source[COUNT] or self.store.node_at(event.source, at - 1) != event.source_head:
            raise ProjectionCorruptError(
                f"event {record.seq}: {event.source!r} has no live message {at - 1} with the fork's head"
            )
        self.store.copy_fork(event.session, record.seq, record.time_ns, event.source, at)
        self.messages += at
        session[COUNT] = at
        session[HEAD] = event.source_head

    def _update(self, event: ev.SessionUpdated, session: list[Any]) -> None:
        if event.fields:
            metadata = from_json(session[METADATA])
            metadata.update(event.fields)
            session[METADATA] = to_json(metadata)
            for key in FIELD_COLUMNS.intersection(event.fields):
                value = event.fields[key]
                session[SESSION_COLUMNS.index(key)] = value if value is None or type(value) is str else to_json(value)
        if event.counters:
            counters = from_json(session[COUNTERS])
            for key, value in event.counters.items():
                counters[key] = add_counter(counters.get(key), value)
                if key in COUNTER_COLUMNS:
                    session[SESSION_COLUMNS.index(key)] = counters[key]
            session[COUNTERS] = to_json(counters)

    def _annotate(self, event: ev.MessageAnnotated) -> None:
        self._write_rows()
        found = self.store.live_message(event.session, event.position)
        if found is None or found[0] != event.node:
            raise ProjectionCorruptError(
                f"annotation of {event.session!r} position {event.position}: no live row with that node"
            )
        self.store.redisplay(event.session, event.position, derive(from_json(found[1]), event.override))

    def _redact(self, record: Record, event: ev.MessageRedacted) -> None:
        """Mark the rows of the erased body redacted, displayed from the placeholder alone.

        The body the projection holds must be the placeholder the log now holds at
        ``(body_seq, body_index)``: a projection that applied the event before it was
        rewritten holds the erased content, and :class:`RebuildNeeded` is raised (a
        catch-up that read the log while it was being redacted, or one that started from a
        checkpoint the rewrite moved past).
        """
        self._write_rows()
        found = self.store.stored_message(event.body_seq, event.body_index)
        if found is None:
            raise ProjectionCorruptError(
                f"event {record.seq}: the redacted body ({event.body_seq}, {event.body_index}) is not in the projection"
            )
        message, digest, _ = found
        expected = None if self.log is None else body_digest(self.log, event)
        if self.log is not None and (expected is None or len(expected) != 32):
            raise ProjectionCorruptError(
                f"event {record.seq}: the redacted body ({event.body_seq}, {event.body_index}) is not a "
                "message the log holds"
            )
        if expected is not None and digest != expected:
            raise RebuildNeeded(
                f"event {record.seq}: the projection holds message {event.position} of {event.session!r} "
                f"(event {event.body_seq}) as it was before its redaction; rebuild(log) to erase it"
            )
        self.store.redact(event.body_seq, event.body_index, record.seq, derive(from_json(message), None))

    # -- helpers ---------------------------------------------------------------

    def _session(self, sid: str, record: Record) -> list[Any]:
        session = self.sessions.get(sid)
        if session is None:
            found = None if self.fresh else self.store.session(sid)
            if found is not None:
                session = list(found)
            else:
                # The first event of a session opens it; be lenient if it is anything else.
                fields = {
                    **NEW_SESSION,
                    "id": sid,
                    "created_seq": record.seq,
                    "created_ns": record.time_ns,
                    "last_seq": record.seq,
                }
                session = [fields.get(name) for name in SESSION_COLUMNS]
            self.sessions[sid] = session
        self.touched.add(sid)
        return session

    def _stored_message(self, seq: int, body_seq: int, body_idx: int) -> tuple[dict[str, Any], int | None]:
        found = self.store.stored_message(body_seq, body_idx)
        if found is None:
            raise ProjectionCorruptError(f"event {seq}: carried body ({body_seq}, {body_idx}) is not in the projection")
        message: dict[str, Any] = from_json(found[0])
        return message, found[2]

    def _write_rows(self, *, bulk: bool = False) -> None:
        if self.rows:
            rows, self.rows = self.rows, []
            self.store.write_rows(rows, bulk=bulk)


# -- the checkpoint rules -------------------------------------------------------


def check_source(where: str, checkpoint: Checkpoint, log: Source) -> None:
    """Refuse a log that is not the projection's own, or that ends before its checkpoint.

    ``where`` names the projection in messages (a path, a database and log id).
    """
    if checkpoint.log_id is not None and checkpoint.log_id != log.id:
        raise mismatch(where, checkpoint.log_id, log.id)
    if checkpoint.last_seq > log.last_seq:
        raise LogMismatchError(
            f"{where}: this projection has applied events up to {checkpoint.last_seq}, but the log ends at "
            f"{log.last_seq} (restored from an older copy?); rebuild(log) to project it again"
        )


def mismatch(where: str, owner: str, log_id: str) -> LogMismatchError:
    return LogMismatchError(
        f"{where}: this projection belongs to log {owner}, not {log_id}; use another target or rebuild(log) to replace it"
    )


def check_chain(where: str, checkpoint: Checkpoint, first: Record, log: Source | None = None) -> None:
    """Refuse the event after the checkpoint when it does not chain to the event the projection applied.

    Given the ``log``, a break that a redaction made is told apart: when the log holds a
    :class:`~eventlog.events.MessageRedacted` event after the checkpoint whose body was at or
    before it, the events the projection applied were rewritten to erase that body, and
    :class:`RebuildNeeded` is raised instead (see :func:`redaction_after`).
    """
    last = checkpoint.last_seq
    if last and first.seq == last + 1 and checkpoint.last_hash is not None and first.prev_hash != checkpoint.last_hash:
        if log is not None:
            redaction = redaction_after(log, last)
            if redaction is not None:
                raise RebuildNeeded(
                    f"{where}: message {redaction.position} of {redaction.session!r} (event {redaction.body_seq}) "
                    f"was redacted after this projection applied it; rebuild(log) to erase it"
                )
        raise LogMismatchError(
            f"{where}: event {last + 1} of the log does not follow the event {last} this "
            "projection applied: the log's history differs (restored from an older copy?); "
            "rebuild(log) to project it again"
        )


def redaction_after(log: Source, last_seq: int) -> ev.MessageRedacted | None:
    """The first redaction after event ``last_seq`` of a body stored at or before it, or ``None``.

    Reads every event after ``last_seq`` (only when the chain broke there).
    """
    for record in log.events(after=last_seq):
        event = record.event
        if type(event) is ev.MessageRedacted and event.body_seq <= last_seq:
            return event
    return None


def body_digest(log: Source, event: ev.MessageRedacted) -> bytes | None:
    """The content digest the log holds now for the redacted body (the placeholder's)."""
    for record in log.events(after=event.body_seq - 1):
        body = record.event
        if record.seq != event.body_seq or type(body) is not ev.MessagesAppended:
            return None
        return body.digest(event.body_index)
    return None


def apply_chunk(
    where: str,
    applier: Applier,
    checkpoint: Checkpoint,
    chunk: Sequence[Record],
    database_errors: tuple[type[BaseException], ...] = (),
) -> Record | None:
    """Apply the records of ``chunk`` after ``checkpoint`` (inside the open transaction).

    Records the checkpoint already covers (another process applied them meanwhile) are
    skipped.  Returns the last record applied, ``None`` when none was new; the caller
    records it as the checkpoint in the same transaction.  ``database_errors`` (the
    target's driver errors) propagate as they are, for the target to translate; any
    other failure names the event that caused it.
    """
    last = checkpoint.last_seq
    fresh = [record for record in chunk if record.seq > last]
    if not fresh:
        return None
    check_chain(where, checkpoint, fresh[0], applier.log)
    expected = last + 1
    for record in fresh:
        if record.seq != expected:
            raise ProjectionCorruptError(f"{where}: expected event {expected} after the checkpoint, got {record.seq}")
        try:
            applier.apply(record)
        except ProjectionError:
            raise
        except Exception as e:
            if isinstance(e, database_errors):
                raise
            # A value the target cannot take: name the event.
            raise ProjectionError(
                f"{where}: event {record.seq} ({type(record.event).__name__}) could not be "
                f"applied: {type(e).__name__}: {e}"
            ) from e
        expected += 1
    applier.finish()
    return fresh[-1]


def size(records: Sequence[Record]) -> int:
    """How many messages ``records`` count for :func:`chunks` (an event counts at least one)."""
    return sum(max(1, len(r.event.bodies)) if type(r.event) is ev.MessagesAppended else 1 for r in records)


def chunks(records: Iterable[Record], batch: int) -> Iterator[list[Record]]:
    """``records`` in chunks of about ``batch`` messages (an event counts at least one).

    A chunk ends only where one write of the log ends, so that readers never see part
    of one (a compaction's tombstones without the summary that replaces them).  The
    events of one write carry the same time; another write's is a different one (or,
    if it came in the same nanosecond, the chunk only grows).  A clock that does not
    move at all (frozen in a test) is bounded too: a chunk ends at 8 times ``batch``.
    """
    chunk: list[Record] = []
    size = 0
    for record in records:
        if size >= batch and (record.time_ns != chunk[-1].time_ns or size >= 8 * batch):
            yield chunk
            chunk, size = [], 0
        chunk.append(record)
        event = record.event
        size += max(1, len(event.bodies)) if type(event) is ev.MessagesAppended else 1
    if chunk:
        yield chunk


__all__ = [
    "ROWS_PER_WRITE",
    "ROW_COLUMNS",
    "SESSION_COLUMNS",
    "Applier",
    "Checkpoint",
    "Source",
    "Store",
    "apply_chunk",
    "body_digest",
    "check_chain",
    "check_source",
    "chunks",
    "redaction_after",
    "size",
]
