"""Reading sessions back: live transcripts, point-in-time replay and the audit history.

The live transcript of a session that only ever appended is read from its own
events; any other session's straight from the ``chain`` index.  History and
point-in-time replay walk a session's events (linked back through their envelopes) through a
small state machine, so they depend on the events alone.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from itertools import groupby
from operator import itemgetter
from typing import Any, Final, TypeVar, assert_never

import lmdb
import msgspec

from . import events as ev
from .errors import CorruptLogError
from .keys import HEADER, SEQ, STATE, SessionState, chain_key, event_hash, state_key
from .overlap import sha256_during
from .redact import Redaction
from .store import Store

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Tombstone:
    """Why and when a message occurrence left the live transcript."""

    reason: str
    seq: int


@dataclass(slots=True)
class Occurrence:
    """One message occurrence in a session, as :meth:`EventLog.history` reports it.

    ``origin`` is ``"append"`` (first stored here), ``"carry"`` (re-appended after a
    divergence, its body referring to ``source``), or ``"fork"`` (shared from the
    session this one was forked from).  ``source`` is the ``(seq, index)`` of the
    event that stores the body.
    """

    position: int
    node: str
    digest: str
    seq: int
    origin: str
    source: tuple[int, int]
    message: dict[str, Any] = field(default_factory=dict)
    override: dict[str, Any] | None = None
    tombstone: Tombstone | None = None
    redaction: Redaction | None = None
    """Set when the message's content was erased (``message`` is then its placeholder)."""


@contextmanager
def paused_gc(count: int, threshold: int = 1000) -> Iterator[None]:
    """Pause the cyclic garbage collector while ``count`` messages are decoded.

    Decoding a long transcript creates hundreds of thousands of containers, and the
    collector would traverse them again and again (measured: half the time of a
    100,000-message replay); the decoded messages hold no reference cycles.

    Afterwards the objects created meanwhile are moved to the oldest generation
    without being traversed (``gc.freeze()`` then ``gc.unfreeze()``, skipped when
    the process keeps objects frozen itself): otherwise the first collection after
    the pause would walk every one of them once more.
    """
    if count < threshold or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        gc.enable()


RECENT_EVENTS = 64
"""How many of the log's newest events a read of a live transcript looks at for a later event
of the session than its index entry names (see :meth:`BodyReader.current`)."""


class BodyReader:
    """Fetches message bodies for one read transaction, decoding each event once.

    Before an event's bodies are used, the event is checked against its hash as
    recorded by the next event (or, for a session's newest event, by the session's
    state), and each message's content digest in the live chain against the event's
    digest column (:meth:`messages`), or a session's appends against its state's
    length and head (:meth:`appended`): a damaged event gives :class:`CorruptLogError`,
    never a wrong message.
    """

    def __init__(self, store: Store, txn: lmdb.Transaction) -> None:
        self.store = store
        self.txn = txn
        self._ahead: tuple[int, bytes | None] = (0, None)

    def messages(self, locations: Iterable[tuple[bytes, int, int]]) -> list[dict[str, Any]]:
        """The messages stored at ``(digest, seq, index)`` locations, each a fresh dict."""
        runs = [(seq, list(run)) for seq, run in groupby(locations, key=itemgetter(1))]
        seqs = sorted({seq for seq, _ in runs})
        decoded: dict[int, ev.AppendedBodies] = {}
        plain: set[int] = set()  # events whose bodies are all messages (no carried slot)
        for seq in seqs:
            event = decoded[seq] = self._bodies(seq)
            # Checked right after decoding, while the event's messages are in the cache.
            if set(map(type, event.bodies)) == {dict}:
                plain.add(seq)
        out: list[dict[str, Any]] = []
        # Consecutive positions mostly sit at consecutive indexes of one event: take
        # those runs as slices of the event's decoded bodies, and check their digests
        # with one comparison.  A body can only be handed out twice when an event
        # appears in two runs or a run is not a plain slice.
        shared = len(seqs) != len(runs)
        for seq, entries in runs:
            event = decoded[seq]
            bodies, digests = event.bodies, event.digests
            first, last = entries[0][2], entries[-1][2]
            wanted = b"".join([entry[0] for entry in entries])
            if (
                last - first == len(entries) - 1
                and 0 <= first
                and last < len(bodies)
                and (len(entries) == 1 or [entry[2] for entry in entries] == list(range(first, last + 1)))
            ):
                chunk = bodies[first : last + 1]
                stored = digests[32 * first : 32 * last + 32]
            else:
                shared = True
                try:
                    chunk = [bodies[entry[2]] for entry in entries]
                except IndexError:
                    raise CorruptLogError(
                        f"{self.store.path}: event {seq} has fewer messages than referenced"
                    ) from None
                stored = b"".join([digests[32 * entry[2] : 32 * entry[2] + 32] for entry in entries])
            if stored != wanted:
                raise CorruptLogError(
                    f"{self.store.path}: the live chain and event {seq} disagree on a message's digest"
                )
            if seq not in plain and set(map(type, chunk)) != {dict}:
                raise CorruptLogError(f"{self.store.path}: a live message refers to a reference, not a body")
            out.extend(chunk)
        if shared and len(set(map(id, out))) != len(out):
            # The same stored body at two positions: hand out two dicts.
            seen: set[int] = set()
            for i, message in enumerate(out):
                if id(message) in seen:
                    out[i] = copy.deepcopy(message)
                seen.add(id(message))
        return out

    def _get(self, seq: int) -> bytes | None:
        ahead_seq, ahead = self._ahead
        if ahead_seq == seq:
            self._ahead = (0, None)
            return ahead
        return self.store.raw_event(self.txn, seq)

    def checked(self, seq: int) -> bytes:
        """The stored bytes of event ``seq``, checked against the hash the log recorded for it."""
        return self.checked_during(seq, lambda raw: raw)

    def checked_during(self, seq: int, read: Callable[[bytes], T]) -> T:
        """``read(raw)`` of event ``seq``'s stored bytes, once they are checked against the hash the
        log recorded for it.

        A large event is hashed on the second thread while ``read`` decodes it (see
        :mod:`eventlog.overlap`): the bytes are in the map and unchanged either way, a decoder
        reads damaged bytes as an error or as values that are dropped, and nothing ``read``
        returns is handed out until the hash matched.  A decoding error of an event that does
        not match its hash is reported as the mismatch.
        """
        store, txn = self.store, self.txn
        raw = self._get(seq)
        if raw is None or len(raw) < HEADER.size:
            raise CorruptLogError(f"{store.path}: event {seq} holding a message body is missing")
        following = self._get(seq + 1)
        if following is not None:
            recorded = bytes(following[:32])
            # Bodies are read in seq order: the next event is often read next.
            self._ahead = (seq + 1, following)
        else:
            number = HEADER.unpack_from(raw)[3]
            state = txn.get(state_key(number), db=store.index)
            # A damaged state anchors nothing.
            recorded = SessionState.unpack(number, state).last_hash if state and len(state) == STATE.size else b""

        try:
            digest, found = sha256_during(SEQ.pack(seq), raw, lambda: read(raw))  # event_hash(seq, raw), no copy
        except (msgspec.DecodeError, CorruptLogError):
            if event_hash(seq, raw) != recorded:
                raise _mismatch(store, seq) from None
            raise
        if digest != recorded:
            raise _mismatch(store, seq)
        return found

    def _bodies(self, seq: int) -> ev.AppendedBodies:
        """Every message of event ``seq``, decoded in one call."""
        try:
            return self.checked_during(seq, lambda raw: ev.bodies_decoder.decode(memoryview(raw)[HEADER.size :]))
        except msgspec.DecodeError as e:
            raise CorruptLogError(f"{self.store.path}: event {seq} holds no readable message bodies ({e})") from e

    def current(self, session_id: str, state: SessionState) -> None:
        """Check that ``state`` is the session's newest, as its events say, before it is used.

        The state names the session's last event and that event's hash: the event must be
        there, belong to the session and hash to it.  And none of the log's newest
        :data:`RECENT_EVENTS` events may be a later event of the session.  So a state left
        behind by a lost write of its index page is :class:`CorruptLogError`, never the
        transcript from before an acknowledged write, as long as the session wrote within
        the log's last :data:`RECENT_EVENTS` events; an older stale page is only found by
        :func:`~eventlog.verify.verify`.  Costs one event hashed and a few cursor steps.
        """
        store, txn = self.store, self.txn
        stale = CorruptLogError(
            f"{store.path}: the index entry of session {session_id!r} is not the one its events "
            "left (a lost or stale index page; run verify)"
        )
        if state.last_seq:
            raw = store.raw_event(txn, state.last_seq)
            if raw is None or len(raw) < HEADER.size or HEADER.unpack_from(raw)[3] != state.number:
                raise stale
            if event_hash(state.last_seq, raw) != state.last_hash:
                raise stale
        # The live chain must end at the state's head, and not go on past its length.
        if state.length and store.link(txn, state.number, state.length - 1)[0] != state.head:
            raise stale
        if txn.get(chain_key(state.number, state.length), db=store.index) is not None:
            raise stale
        cursor = txn.cursor(db=store.events)
        if not cursor.last():
            if state.last_seq:
                raise stale
            return
        for _ in range(RECENT_EVENTS):
            seq = store.seq_of(cursor.key())
            if seq <= state.last_seq:
                return
            value = cursor.value()
            if len(value) >= HEADER.size and HEADER.unpack_from(value)[3] == state.number:
                raise stale
            if not cursor.prev():
                return

    def appended(self, state: SessionState) -> list[dict[str, Any]] | None:
        """The live transcript of a session that only ever appended, read from its events alone.

        Every event of the session is checked against its recorded hash, the appends
        must follow on position by position, and their count and last node must equal
        the session state's length and head.  ``None`` for a session that was forked,
        had messages tombstoned or holds an event of another kind: its transcript is
        read through the live chain (:meth:`messages`).
        """
        store, txn = self.store, self.txn
        seqs: list[int] = []
        seq = state.last_seq
        while seq:
            raw = store.raw_event(txn, seq)
            if raw is None or len(raw) < HEADER.size:
                raise CorruptLogError(f"{store.path}: event {seq} of session {state.number} is missing")
            _, _, kind, number, before = HEADER.unpack_from(raw)
            if number != state.number or before >= seq:
                raise CorruptLogError(f"{store.path}: event {seq} is not linked to session {state.number}")
            if kind not in _APPEND_ONLY:
                return None
            seqs.append(seq)
            seq = before
        out: list[dict[str, Any]] = []
        head = b""
        for seq in reversed(seqs):
            kind, event = self.checked_during(seq, partial(_decode_appended, store.path, seq))
            if kind == _OPENED:
                if event.source is not None:
                    return None
            elif kind == _APPENDED:
                bodies = event.bodies
                if event.position != len(out) or len(event.nodes) != 32 * len(bodies):
                    raise CorruptLogError(f"{store.path}: event {seq} does not follow on the session's messages")
                if not bodies:
                    continue
                if set(map(type, bodies)) != {dict}:
                    return None  # carried bodies: they are found through the live chain
                out.extend(bodies)
                head = event.nodes[-32:]
        if len(out) != state.length or (out and head != state.head):
            raise CorruptLogError(f"{store.path}: the events of session {state.number} disagree with its state")
        return out


class _Appended(msgspec.Struct, tag=ev.KIND[ev.MessagesAppended], tag_field="k"):
    """A read-side view of :class:`~eventlog.events.MessagesAppended`: position, nodes, decoded bodies."""

    position: int
    nodes: bytes
    bodies: list[Any]


_appended_decoder = msgspec.msgpack.Decoder(_Appended)
_OPENED: Final = ev.KIND[ev.SessionOpened]
_APPENDED: Final = ev.KIND[ev.MessagesAppended]
_APPEND_ONLY: Final = frozenset(
    {_OPENED, _APPENDED, ev.KIND[ev.SessionClosed], ev.KIND[ev.SessionUpdated], ev.KIND[ev.MessageAnnotated]}
)
"""Event kinds that leave a session's live messages exactly the ones it appended."""


def _mismatch(store: Store, seq: int) -> CorruptLogError:
    return CorruptLogError(
        f"{store.path}: event {seq} does not match its recorded hash; the log is damaged (run verify)"
    )


def _decode_appended(path: str, seq: int, raw: bytes) -> tuple[int, Any]:
    """Event ``seq`` of a session that only appended: ``(kind, event)``, decoded as far as
    :meth:`BodyReader.appended` reads it (``None`` for the kinds it skips)."""
    kind = HEADER.unpack_from(raw)[2]
    if kind == _OPENED:
        try:
            opened = ev.decoder.decode(memoryview(raw)[HEADER.size :])
        except msgspec.DecodeError as e:
            raise CorruptLogError(f"{path}: event {seq} cannot be decoded ({e})") from e
        if not isinstance(opened, ev.SessionOpened):
            raise CorruptLogError(f"{path}: event {seq} is not the kind its envelope names")
        return kind, opened
    if kind == _APPENDED:
        try:
            return kind, _appended_decoder.decode(memoryview(raw)[HEADER.size :])
        except msgspec.DecodeError as e:
            raise CorruptLogError(f"{path}: event {seq} holds no readable message bodies ({e})") from e
    return kind, None


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """What the log knows about a session, without a projection (:meth:`EventLog.session`).

    ``length`` live messages ending at ``head`` (64 hex, ``None`` when empty);
    ``metadata``: every field given to ``update_session``, merged (a later value
    replaces an earlier one); ``counters``: the counter fields, summed.  Times are
    the log's event times in nanoseconds since the epoch: ``created_*`` of the event
    that opened the session, ``updated_*`` of its newest event.  ``closed`` is True
    from ``close_session`` until the next write to the session, with its
    ``close_reason``.  A forked session names its source and how many of the
    source's messages it shares (``fork_position``).
    """

    id: str
    length: int
    head: str | None
    metadata: dict[str, Any]
    counters: dict[str, float | int]
    created_seq: int
    created_ns: int
    updated_seq: int
    updated_ns: int
    closed: bool
    close_reason: str | None
    forked_from: str | None
    fork_position: int | None


_INFO_KINDS: Final = frozenset({ev.KIND[ev.SessionOpened], ev.KIND[ev.SessionUpdated], ev.KIND[ev.SessionClosed]})
"""The event kinds whose payload a session's description reads."""


def session_info(store: Store, txn: lmdb.Transaction, session_id: str) -> SessionInfo | None:
    """Describe a session from its state and its events (``None`` when it does not exist).

    The session's events are walked back through their envelopes; only the payloads of
    opening, metadata and close events are decoded, each checked against its hash first,
    so a message-heavy session costs one envelope read per event.
    """
    state = store.session(txn, session_id)
    if state is None:
        return None
    reader = BodyReader(store, txn)
    wanted: list[int] = []
    first = seq = state.last_seq
    last_ns = created_ns = 0
    while seq:
        raw = store.raw_event(txn, seq)
        if raw is None or len(raw) < HEADER.size:
            raise CorruptLogError(f"{store.path}: event {seq} of session {state.number} is missing")
        _, time_ns, kind, number, before = HEADER.unpack_from(raw)
        if number != state.number or before >= seq:
            raise CorruptLogError(f"{store.path}: event {seq} is not linked to session {state.number}")
        if seq == state.last_seq:
            last_ns = time_ns
        if kind in _INFO_KINDS:
            wanted.append(seq)
        first, created_ns = seq, time_ns
        seq = before
    for seq in (state.last_seq, first):  # the times shown are checked like the payloads read
        reader.checked(seq)
    metadata: dict[str, Any] = {}
    counters: dict[str, float | int] = {}
    close_reason: str | None = None
    forked_from: str | None = None
    fork_position: int | None = None
    for seq in reversed(wanted):
        event = store.decode(seq, reader.checked(seq))
        match event:
            case ev.SessionUpdated():
                metadata.update(event.fields)
                for key, value in event.counters.items():
                    counters[key] = counters.get(key, 0) + value
            case ev.SessionClosed():
                close_reason = event.reason
            case ev.SessionOpened():
                if event.source is not None:
                    forked_from, fork_position = event.source, event.at
            case ev.MessagesAppended() | ev.MessagesTombstoned() | ev.MessageAnnotated() | ev.MessageRedacted():
                pass  # not in _INFO_KINDS: never decoded here
            case _:
                assert_never(event)
    return SessionInfo(
        id=session_id,
        length=state.length,
        head=state.head.hex() if state.length else None,
        metadata=metadata,
        counters=counters,
        created_seq=first,
        created_ns=created_ns,
        updated_seq=state.last_seq,
        updated_ns=last_ns,
        closed=state.closed,
        close_reason=close_reason if state.closed else None,
        forked_from=forked_from,
        fork_position=fork_position,
    )


def session_events(store: Store, txn: lmdb.Transaction, state: SessionState, upto: int | None = None) -> list[int]:
    """The seqs of a session's events, in order, up to and including ``upto``.

    Each envelope names the seq of its session's previous event, so this follows
    those links back from the session's last event.
    """
    seqs: list[int] = []
    seq = state.last_seq
    while seq:
        raw = store.raw_event(txn, seq)
        if raw is None or len(raw) < HEADER.size:
            raise CorruptLogError(f"{store.path}: event {seq} of session {state.number} is missing")
        _, _, _, number, before = HEADER.unpack_from(raw)
        if number != state.number or before >= seq:
            raise CorruptLogError(f"{store.path}: event {seq} is not linked to session {state.number}")
        if upto is None or seq <= upto:
            seqs.append(seq)
        seq = before
    seqs.reverse()
    return seqs


def replay(
    store: Store, txn: lmdb.Transaction, session_id: str, upto: int | None = None
) -> tuple[list[Occurrence], list[int]]:
    """Every occurrence of a session up to ``upto``, and the indices of the live ones by position.

    Bodies are not loaded here (``message`` stays empty); see :func:`fill`.  Each event is
    checked against the hash the log recorded for it before it is used, so a damaged
    tombstone, fork or annotation gives :class:`CorruptLogError`, never a wrong history.
    """
    return _replay(BodyReader(store, txn), session_id, upto)


def _replay(reader: BodyReader, session_id: str, upto: int | None) -> tuple[list[Occurrence], list[int]]:
    store, txn = reader.store, reader.txn
    state = store.session(txn, session_id)
    if state is None:
        return [], []
    occurrences: list[Occurrence] = []
    live: list[int] = []
    for seq in session_events(store, txn, state, upto):
        event = store.decode(seq, reader.checked(seq))  # checked against its hash: not hashed again
        match event:
            case ev.MessagesAppended():
                if event.position != len(live):
                    raise CorruptLogError(
                        f"{store.path}: event {seq} appends at position {event.position}, "
                        f"but session {session_id!r} has {len(live)} live messages"
                    )
                for i in range(len(event)):
                    carried = event.carried.get(i)
                    live.append(len(occurrences))
                    occurrences.append(
                        Occurrence(
                            position=event.position + i,
                            node=event.node(i).hex(),
                            digest=event.digest(i).hex(),
                            seq=seq,
                            origin="append" if carried is None else "carry",
                            source=(seq, i) if carried is None else (carried[0], carried[1]),
                            override=event.overrides.get(i),
                        )
                    )
            case ev.MessagesTombstoned():
                stone = Tombstone(event.reason, seq)
                for index in live[event.position :]:
                    occurrences[index].tombstone = stone
                del live[event.position :]
            case ev.MessageAnnotated():
                if event.position < len(live):
                    occurrences[live[event.position]].override = None if event.sealed else event.override
            case ev.SessionOpened() if event.source is not None:
                source_occ, source_live = _replay(reader, event.source, seq)
                for position, index in enumerate(source_live[: event.at]):
                    shared = source_occ[index]
                    live.append(len(occurrences))
                    occurrences.append(
                        Occurrence(
                            position=position,
                            node=shared.node,
                            digest=shared.digest,
                            seq=seq,
                            origin="fork",
                            source=shared.source,
                            override=shared.override,
                        )
                    )
            case ev.SessionOpened() | ev.SessionClosed() | ev.SessionUpdated() | ev.MessageRedacted():
                pass
            case _:
                assert_never(event)
    return occurrences, live


def fill(store: Store, txn: lmdb.Transaction, occurrences: list[Occurrence]) -> None:
    """Load the message body of each occurrence."""
    messages = BodyReader(store, txn).messages((bytes.fromhex(occ.digest), *occ.source) for occ in occurrences)
    for occ, message in zip(occurrences, messages):
        occ.message = message


NO_RESULT: Final = "[no result: the tool call was interrupted before it returned]"
"""The text of a synthetic result that :func:`repair` gives a tool call left unanswered."""

_RESPONSES_OUTPUTS: Final = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
"""Responses API call item types and the type of the item that answers each."""


def repair(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Make a transcript acceptable to model APIs on resume, without touching the log.

    A call whose result never arrived (the loop stopped inside the tool) gets a
    synthetic result saying so, and a result that answers no call is dropped, in each
    of the three shapes the log commonly holds:

    - chat completions: an assistant ``tool_calls`` entry gets a ``tool`` message right
      after the assistant's other results; a ``tool`` message that answers no call of
      the assistant message right before it (an orphan, a duplicate, or one separated
      from its call) is dropped, since the API wants results right after their call;
    - Anthropic messages: a ``tool_use`` block of an assistant message gets a
      ``tool_result`` block (``is_error``) in the user message that follows, ahead of
      its other blocks (a user message is added when none follows); a ``tool_result``
      block that answers no ``tool_use`` of the assistant message right before it is
      dropped, and so is a user message left with no content;
    - Responses API items: a ``function_call`` (or ``custom_tool_call``) item with no
      output item after it gets one right after its run of calls and outputs; an output
      item whose ``call_id`` no earlier call has, or a second output for a call, is dropped.

    Returns a new list; the input and its messages are not modified.
    """
    return _repair_responses(_repair_anthropic(_repair_chat(messages)))


def _repair_chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # call ids of the last assistant message still awaiting results

    def close_pending() -> None:
        out.extend({"role": "tool", "tool_call_id": call_id, "content": NO_RESULT} for call_id in pending)
        pending.clear()

    for message in messages:
        role = message.get("role")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                continue
            pending.remove(call_id)
            out.append(message)
            continue
        close_pending()
        out.append(message)
        if role == "assistant":
            calls = message.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                call_id = call.get("id") if isinstance(call, dict) else None
                if isinstance(call_id, str):
                    pending.append(call_id)
    close_pending()
    return out


def _blocks(message: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [block for block in content if isinstance(block, dict) and block.get("type") == kind]


def _repair_anthropic(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # tool_use ids of the assistant message right before

    def missing(ids: list[str]) -> list[dict[str, Any]]:
        return [
            {"type": "tool_result", "tool_use_id": use_id, "content": NO_RESULT, "is_error": True} for use_id in ids
        ]

    for message in messages:
        if message.get("role") == "user" and (pending or _blocks(message, "tool_result")):
            content = message.get("content")
            blocks = content if isinstance(content, list) else ([{"type": "text", "text": content}] if content else [])
            answered: list[dict[str, Any]] = []
            rest: list[Any] = []
            for block in blocks:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    use_id = block.get("tool_use_id")
                    if use_id in pending:
                        pending.remove(use_id)
                        answered.append(block)
                    continue  # an orphan or a duplicate
                rest.append(block)
            content = missing(pending) + answered + rest
            pending = []
            if content == blocks:
                out.append(message)  # nothing to change
            elif content:
                out.append({**message, "content": content})
            continue
        if pending:
            out.append({"role": "user", "content": missing(pending)})
            pending = []
        out.append(message)
        if message.get("role") == "assistant":
            pending = [b["id"] for b in _blocks(message, "tool_use") if isinstance(b.get("id"), str)]
    if pending:
        out.append({"role": "user", "content": missing(pending)})
    return out


def _repair_responses(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls: dict[str, str] = {}  # call_id -> the type of item that answers it
    answered: set[str] = set()
    keep: list[bool] = []
    for item in messages:
        kind = item.get("type")
        call_id = item.get("call_id")
        if not isinstance(kind, str):  # any JSON value may stand there; only text names an item type
            kind = None
        if kind in _RESPONSES_OUTPUTS and isinstance(call_id, str):
            calls.setdefault(call_id, _RESPONSES_OUTPUTS[kind])
        elif kind in _RESPONSES_OUTPUTS.values():
            if not isinstance(call_id, str) or calls.get(call_id) != kind or call_id in answered:
                keep.append(False)  # answers no earlier call, or answers it again
                continue
            answered.add(call_id)
        keep.append(True)
    if not calls and all(keep):
        return messages
    out: list[dict[str, Any]] = []
    unanswered: list[str] = []  # calls of the current run of calls and outputs with no output anywhere
    for item, kept in zip(messages, keep):
        kind = item.get("type")
        in_run = isinstance(kind, str) and (kind in _RESPONSES_OUTPUTS or kind in _RESPONSES_OUTPUTS.values())
        if not in_run and unanswered:
            out.extend({"type": calls[call_id], "call_id": call_id, "output": NO_RESULT} for call_id in unanswered)
            unanswered = []
        if not kept:
            continue
        out.append(item)
        call_id = item.get("call_id")
        if (
            in_run
            and kind in _RESPONSES_OUTPUTS
            and isinstance(call_id, str)
            and call_id not in answered
            and call_id not in unanswered
        ):
            unanswered.append(call_id)
    out.extend({"type": calls[call_id], "call_id": call_id, "output": NO_RESULT} for call_id in unanswered)
    return out
