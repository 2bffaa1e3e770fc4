"""Redaction: erasing a message's content for good, while every checkpoint and every proof of
another message stays valid.

The Merkle tree's leaves never cover a message's bytes or its unsalted digest: a stored
message is committed to as SHA-256("M" || salt || content digest || override digest)
(:func:`eventlog.verifier.message_commitment`).  So a redaction can rewrite everything that
was derived from the content and leave the tree as it was:

1. The message's body, in the event that stores it, becomes a *placeholder*
   (:func:`placeholder`), its content digest the placeholder's, its display override is
   dropped, and its commitment moves into the event's ``sealed`` column (its salt is
   zeroed): the leaf is computed from ``sealed`` and stays the same.
2. Every digest computed from the erased content is derived again as if the placeholder
   had been there: node digests of every later position of every chain that holds the
   message (its own session, its forks, the messages carried after an edit), tombstones
   naming those nodes, annotations of them (an annotation *of* the message has its
   override erased and sealed too), a fork's shared head, the carried references' digest
   columns, the live chain index entries and the session heads.  None of those is in the
   tree; keeping any of them would let anyone confirm a guess of the content (a node
   digest chains through the erased digest).
3. The envelope hash chain is rewritten from the first rewritten event on (it covers the
   stored bytes), and each session's recorded last hash with it.
4. A :class:`~eventlog.events.MessageRedacted` event (who, why, which body) is appended:
   a new leaf.

Every stored copy of the same content (the same message flushed into another session, or
stored again after a rewind) is erased with it, each with a redaction event of its own:
what is erased is the content, not one row.  All of this is one write transaction; the
compacting copy that removes the old pages from the data file follows it
(:meth:`eventlog.store.Store.vacuum`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from hashlib import sha256
from typing import Any, Final

import lmdb
import msgspec

from . import codec
from . import events as ev
from .codec import ZERO
from .errors import CorruptLogError, RedactedError, UnknownSessionError
from .keys import (
    HEADER,
    LINK,
    SEQ,
    STATE,
    SessionState,
    chain_key,
    event_hash,
    note_key,
    pairs,
    redaction_key,
    state_key,
)
from .store import UNVACUUMED, Batch, Store
from .tree import commitments, override_digest
from .verifier import SALT_SIZE, message_commitment

REDACTED: Final = "[redacted]"
"""The text a redacted message's content is replaced with."""


_KEPT_KEYS: Final = ("role", "type", "id", "call_id", "tool_call_id")
"""Top-level keys a placeholder keeps (when they hold a string): what a transcript needs to stay
well formed (roles, item types, the ids that pair a tool result with its call); never text."""
_TOOL_NAME_ROLES: Final = frozenset({"tool", "function"})
"""Roles whose ``name`` names a tool rather than a person, and is kept."""


def placeholder(message: Mapping[str, Any]) -> dict[str, Any]:
    """What a redacted message becomes: its shape and ids without any of its text.

    - ``role``, ``type``, ``id``, ``call_id`` and ``tool_call_id`` are kept (strings only),
      and ``name`` when the role is ``tool`` or ``function`` (a tool's name, not a person's);
    - ``content`` becomes ``"[redacted]"``; a list of content blocks keeps its tool blocks
      (``tool_use`` with its ``id`` and ``name`` and empty ``input``, ``tool_result`` with its
      ``tool_use_id``) and the rest becomes one ``{"type": "text", "text": "[redacted]"}``;
    - ``tool_calls`` keep each call's ``id``, ``type`` and ``function.name``, with arguments
      ``"{}"``; a Responses API call item keeps ``name`` and gets ``arguments`` ``"{}"``, its
      output item ``output`` ``"[redacted]"``.

    So a tool result still pairs with its call after either is redacted, and a resumed agent
    sends a transcript the model API accepts.  Applying it to a placeholder changes nothing.

    >>> placeholder({"role": "tool", "tool_call_id": "call_1", "name": "shell", "content": "sk-live-123"})
    {'role': 'tool', 'tool_call_id': 'call_1', 'name': 'shell', 'content': '[redacted]'}
    """
    out: dict[str, Any] = {key: message[key] for key in _KEPT_KEYS if isinstance(message.get(key), str)}
    role = message.get("role")
    if isinstance(message.get("name"), str) and (role in _TOOL_NAME_ROLES or "arguments" in message):
        out["name"] = message["name"]
    content = message.get("content")
    if isinstance(content, list):
        blocks = [_block(block) for block in content if isinstance(block, Mapping)]
        kept = [block for block in blocks if block is not None]
        out["content"] = [{"type": "text", "text": REDACTED}, *kept] if len(kept) < len(content) else kept
    else:
        out["content"] = REDACTED
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_call(call) for call in calls if isinstance(call, Mapping)]
    if "arguments" in message:
        out["arguments"] = "{}"
    if "output" in message:
        out["output"] = REDACTED
    return out


def _block(block: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "tool_use":
        kept = {key: block[key] for key in ("type", "id", "name") if isinstance(block.get(key), str)}
        return {**kept, "input": {}}
    if kind == "tool_result":
        kept = {key: block[key] for key in ("type", "tool_use_id") if isinstance(block.get(key), str)}
        return {**kept, "content": REDACTED}
    return None  # text, images, a placeholder's own text block (put first again): dropped


def _call(call: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {key: call[key] for key in ("id", "type") if isinstance(call.get(key), str)}
    function = call.get("function")
    if isinstance(function, Mapping):
        name = function.get("name")
        out["function"] = {**({"name": name} if isinstance(name, str) else {}), "arguments": "{}"}
    return out


@dataclass(frozen=True, slots=True)
class Redaction:
    """One redacted message: where it was, who erased it, why and when.

    ``session`` and ``position`` name it as the redaction was asked for (for a copy erased
    with it: the session and position where the copy was stored); ``body_seq`` and
    ``body_index`` the event and index that held its body and now hold the placeholder;
    ``seq`` and ``time_ns`` the redaction event.
    """

    session: str
    position: int
    body_seq: int
    body_index: int
    reason: str
    by: str
    seq: int
    time_ns: int

    def __str__(self) -> str:
        who = f" by {self.by}" if self.by else ""
        return (
            f"message {self.position} of session {self.session!r} (body in event {self.body_seq}, "
            f"index {self.body_index}) redacted in event {self.seq}{who}: {self.reason}"
        )


class _Stored(msgspec.Struct, tag=ev.KIND[ev.MessagesAppended], tag_field="k"):
    """A read-side view of an append: what says which of its messages are bodies, and their digests."""

    digests: bytes
    carried: dict[int, tuple[int, int]] = {}
    sealed: dict[int, bytes] = {}


_stored_decoder = msgspec.msgpack.Decoder(_Stored)
_APPENDED: Final = ev.KIND[ev.MessagesAppended]
_KIND_AT: Final = 40
"""The offset of the kind tag in an envelope (after the previous hash and the time)."""


@dataclass(slots=True)
class _Target:
    """A body being erased, and what takes its place."""

    body: msgspec.Raw
    digest: bytes


Link = tuple[bytes, bytes, int, int]
"""A live chain entry: node digest, content digest, body seq and index."""


def locate(store: Store, txn: lmdb.Transaction, session_id: str, position: int, seq: int | None) -> tuple[int, int]:
    """The ``(seq, index)`` of the body of message ``position`` of the session.

    ``seq=None``: the live message at ``position``.  Otherwise the occurrence at ``position``
    that event ``seq`` made live, as :meth:`~eventlog.EventLog.history` lists it (its ``seq``
    and ``position``), tombstoned or not.
    """
    from .replay import replay

    state = store.session(txn, session_id)
    if state is None:
        raise UnknownSessionError(f"no session {session_id!r} in {store.path}")
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"position must be an int, not {type(position).__name__}")
    if seq is None:
        if not 0 <= position < state.length:
            raise ValueError(f"session {session_id!r} has {state.length} live messages; no position {position}")
        return store.link(txn, state.number, position)[2:]
    if isinstance(seq, bool) or not isinstance(seq, int):
        raise TypeError(f"seq must be an int, not {type(seq).__name__}")
    occurrences, _ = replay(store, txn, session_id)
    for occurrence in occurrences:
        if occurrence.seq == seq and occurrence.position == position:
            return occurrence.source
    raise ValueError(
        f"session {session_id!r} has no message at position {position} made live by event {seq} "
        "(history() lists each occurrence's seq and position)"
    )


def body_event(store: Store, txn: lmdb.Transaction, seq: int, index: int) -> ev.MessagesAppended:
    raw = store.raw_event(txn, seq)
    event = None if raw is None else store.decode(seq, bytes(raw))
    if not isinstance(event, ev.MessagesAppended) or not 0 <= index < len(event) or index in event.carried:
        raise CorruptLogError(f"{store.path}: event {seq} holds no message body at index {index} (run verify)")
    return event


def redact(
    store: Store,
    txn: lmdb.Transaction,
    session_id: str,
    position: int,
    *,
    seq: int | None,
    reason: str,
    by: str,
    now: int | None = None,
) -> Erased:
    """Erase a message's content in ``txn`` (see the module): the redactions, the asked one first."""
    body_seq, body_index = locate(store, txn, session_id, position, seq)
    event = body_event(store, txn, body_seq, body_index)
    if body_index in event.sealed:
        raise RedactedError(f"message {position} of session {session_id!r} was redacted already")
    digest = event.digest(body_index)
    stand_in = codec.encode(placeholder(codec.decode(bytes(event.bodies[body_index]))))
    stand_digest = sha256(stand_in).digest()
    if stand_digest == digest:
        raise RedactedError(
            f"message {position} of session {session_id!r} is a redaction placeholder already: it holds nothing to erase"
        )
    bodies = _copies(store, txn, digest)
    bodies.remove((body_seq, body_index))
    bodies.insert(0, (body_seq, body_index))
    target = _Target(msgspec.Raw(stand_in), stand_digest)
    tail = _rewrite(store, txn, dict.fromkeys(bodies, target), min(seq for seq, _ in bodies))
    store.tip.pending = tail  # the redaction events chain to the rewritten tail
    batch = Batch(store, txn, now)
    out = []
    for i, (where_seq, where_index) in enumerate(bodies):
        if i == 0:
            session, at = session_id, position
        else:
            copy = body_event(store, txn, where_seq, where_index)
            session, at = copy.session, copy.position + where_index
        state = store.session(txn, session)
        if state is None:
            raise CorruptLogError(f"{store.path}: session {session!r} of event {where_seq} has no state (run verify)")
        redaction_seq = batch.emit(
            ev.MessageRedacted(
                session=session, position=at, body_seq=where_seq, body_index=where_index, reason=reason, by=by
            ),
            state,
        )
        batch.save(session, state)
        txn.put(redaction_key(where_seq, where_index), SEQ.pack(redaction_seq), db=store.redactions)
        out.append(Redaction(session, at, where_seq, where_index, reason, by, redaction_seq, batch.now))
    # Until a compacting copy is swapped in, the old pages hold the content (see Store.vacuum).
    txn.put(UNVACUUMED, SEQ.pack(out[-1].seq), db=store.meta)
    return Erased(out, digest, stand_digest)


@dataclass(frozen=True, slots=True)
class Erased:
    """What one redaction transaction did: its redactions, and the content digest it erased
    (kept in memory only as long as it takes to scrub spill files)."""

    redactions: list[Redaction]
    digest: bytes
    stand_in: bytes
    """The placeholder's content digest."""


def _copies(store: Store, txn: lmdb.Transaction, digest: bytes) -> list[tuple[int, int]]:
    """Every stored body (not a carried reference, not redacted) whose content digest is ``digest``."""
    found = []
    for key, raw in txn.cursor(db=store.events):
        if len(raw) < HEADER.size or raw[_KIND_AT] != _APPENDED:
            continue
        seq = store.seq_of(key)
        digests = bytes(raw[HEADER.size :])
        if digest not in digests:  # most appends: one search of the encoded payload
            continue
        try:
            stored = _stored_decoder.decode(digests)
        except msgspec.DecodeError as e:
            raise CorruptLogError(f"{store.path}: event {seq} cannot be decoded ({e})") from e
        at = stored.digests.find(digest)
        while at >= 0:
            if at % 32 == 0:
                index = at // 32
                if index not in stored.carried and index not in stored.sealed:
                    found.append((seq, index))
            at = stored.digests.find(digest, at + 1)
    return found


def _rewrite(
    store: Store, txn: lmdb.Transaction, targets: dict[tuple[int, int], _Target], first: int
) -> tuple[int, bytes]:
    """Put the targets' placeholders in place and derive every digest after them again.

    Replays every session's live chain from the first event on (the events before ``first``
    as they are), and rewrites each event from ``first`` on: its payload where a digest it
    holds changed, its envelope's previous-event hash always.  Then the index entries of the
    sessions those events belong to.  Returns the log's new last ``(seq, hash)``.
    """
    chains: dict[str, list[Link]] = {}
    numbers: dict[str, int] = {}
    touched: set[str] = set()
    last: dict[int, tuple[int, bytes]] = {}  # session number -> its last event, as rewritten
    prev = b""
    tail = (0, bytes(32))
    cursor = txn.cursor(db=store.events)
    for key, value in cursor:
        key = bytes(key)
        seq = store.seq_of(key)
        raw = bytes(value)
        event = store.decode(seq, raw)
        stored_prev, time_ns, kind, number, before = HEADER.unpack_from(raw)
        if isinstance(event, ev.SessionOpened):
            numbers.setdefault(event.session, number)
        if seq < first:
            _follow(seq, event, chains)
            continue
        if not prev:
            prev = stored_prev  # the event before the first rewritten one is as it was
        touched.add(event.session)
        derived = _derive(seq, event, chains, targets)
        payload = raw[HEADER.size :] if derived is event else ev.encoder.encode(derived)
        raw = HEADER.pack(prev, time_ns, kind, number, before) + payload
        cursor.put(key, raw)  # in place: the cursor stays on this event and goes on from it
        prev = event_hash(seq, raw)
        last[number] = tail = (seq, prev)
    for session in touched:
        number = numbers.get(session)
        if number is None:
            raise CorruptLogError(f"{store.path}: session {session!r} has no opening event (run verify)")
        _reindex(store, txn, number, chains.get(session, []), last.get(number), targets)
    return tail


def _follow(seq: int, event: ev.AnyEvent, chains: dict[str, list[Link]]) -> None:
    """Track the live chains through event ``seq``, which is not rewritten."""
    match event:
        case ev.SessionOpened():
            shared = chains.get(event.source, [])[: event.at] if event.source is not None else []
            chains[event.session] = list(shared)
        case ev.MessagesAppended():
            chain = chains.setdefault(event.session, [])
            del chain[event.position :]
            for i in range(len(event)):
                where = event.carried.get(i, (seq, i))
                chain.append((event.node(i), event.digest(i), where[0], where[1]))
        case ev.MessagesTombstoned():
            del chains.setdefault(event.session, [])[event.position :]
        case ev.MessageAnnotated() | ev.SessionClosed() | ev.SessionUpdated() | ev.MessageRedacted():
            pass


def _derive(
    seq: int, event: ev.AnyEvent, chains: dict[str, list[Link]], targets: dict[tuple[int, int], _Target]
) -> ev.AnyEvent:
    """``event`` with every digest derived again from the chains as rewritten (the same object when nothing changed)."""
    match event:
        case ev.SessionOpened():
            shared = chains.get(event.source, [])[: event.at] if event.source is not None else []
            chains[event.session] = list(shared)
            if shared and shared[-1][0] != event.source_head:
                return msgspec.structs.replace(event, source_head=shared[-1][0])
            return event
        case ev.MessagesAppended():
            return _derive_appended(seq, event, chains.setdefault(event.session, []), targets)
        case ev.MessagesTombstoned():
            chain = chains.setdefault(event.session, [])
            nodes = b"".join(link[0] for link in chain[event.position :])
            del chain[event.position :]
            return event if nodes == event.nodes else msgspec.structs.replace(event, nodes=nodes)
        case ev.MessageAnnotated():
            chain = chains.get(event.session, [])
            if not 0 <= event.position < len(chain):
                return event  # verify reports it; a redaction leaves damage as it found it
            node, _, body_seq, body_index = chain[event.position]
            if (body_seq, body_index) in targets and not event.sealed:
                # An override of the erased message: its text goes, its commitment stays.
                sealed = message_commitment(event.salt, override_digest(event.override) or b"", None)
                return msgspec.structs.replace(event, node=node, override={}, salt=b"", sealed=sealed)
            return event if node == event.node else msgspec.structs.replace(event, node=node)
        case ev.SessionClosed() | ev.SessionUpdated() | ev.MessageRedacted():
            return event
    return event


def _derive_appended(
    seq: int, event: ev.MessagesAppended, chain: list[Link], targets: dict[tuple[int, int], _Target]
) -> ev.MessagesAppended:
    n = len(event)
    del chain[event.position :]  # an append follows the live chain (verify checks it)
    parent = chain[-1][0] if chain else ZERO
    digests = bytearray(event.digests)
    nodes = bytearray()
    overrides = event.overrides
    bodies = event.bodies
    sealed = event.sealed
    salts = event.salts
    committed: list[bytes] | None = None
    for i in range(n):
        where = event.carried.get(i, (seq, i))
        target = targets.get((where[0], where[1]))
        digest = event.digest(i)
        if target is not None:
            digest = target.digest
            digests[32 * i : 32 * i + 32] = digest
            if i in overrides:
                overrides = {k: v for k, v in overrides.items() if k != i}
            if where == (seq, i):  # the body itself
                if committed is None:
                    committed = commitments(event)
                sealed = {**sealed, i: committed[i]}
                bodies = [*bodies[:i], target.body, *bodies[i + 1 :]]
                salts = salts[: SALT_SIZE * i] + bytes(SALT_SIZE) + salts[SALT_SIZE * i + SALT_SIZE :]
        parent = sha256(parent + digest).digest()
        nodes += parent
        chain.append((parent, digest, where[0], where[1]))
    if bytes(digests) == event.digests and bytes(nodes) == event.nodes and sealed is event.sealed:
        return event
    return msgspec.structs.replace(
        event,
        digests=bytes(digests),
        nodes=bytes(nodes),
        bodies=bodies,
        overrides=overrides,
        sealed=sealed,
        salts=salts,
    )


def _reindex(
    store: Store,
    txn: lmdb.Transaction,
    number: int,
    chain: list[Link],
    last: tuple[int, bytes] | None,
    targets: dict[tuple[int, int], _Target],
) -> None:
    """Bring one session's index entries (live chain, overrides, state) to its rewritten events."""
    index = store.index
    for position, link in enumerate(chain):
        key = chain_key(number, position)
        packed = LINK.pack(*link)
        if txn.get(key, db=index) != packed:
            txn.put(key, packed, db=index)
    cursor = txn.cursor(db=index)
    notes: list[tuple[bytes, bytes | None]] = []
    if cursor.set_range(note_key(number, 0)):
        for key, value in pairs(cursor):
            if key[:9] != note_key(number, 0)[:9]:
                break
            position = SEQ.unpack(key[9:])[0]
            if position >= len(chain):
                continue  # verify reports it
            node, _, body_seq, body_index = chain[position]
            if (body_seq, body_index) in targets:
                notes.append((bytes(key), None))
            elif bytes(value[:32]) != node:
                notes.append((bytes(key), node + bytes(value[32:])))
    for key, note in notes:
        if note is None:
            txn.delete(key, db=index)
        else:
            txn.put(key, note, db=index)
    raw = txn.get(state_key(number), db=index)
    if raw is None or len(raw) != STATE.size:
        raise CorruptLogError(f"{store.path}: session number {number} has no valid state (run verify)")
    state = SessionState.unpack(number, raw)
    state.head = chain[-1][0] if chain else ZERO
    if last is not None and state.last_seq == last[0]:
        state.last_hash = last[1]
    txn.put(state_key(number), state.pack(), db=index)


def sealed_stand_in(store: Store, txn: lmdb.Transaction, link: Link, message: Any) -> tuple[bytes, bytes] | None:
    """The placeholder's body and digest, when ``link`` is a redacted message and ``message``
    (what a caller holds at that position) redacts to it; else None.

    A flush uses it to seal a redacted position: an agent still holding the original message
    there compares as the placeholder, so its next flush neither diverges nor stores the
    erased content again.
    """
    try:
        stand_in = codec.encode(placeholder(codec.strip(message)))
    except (TypeError, msgspec.EncodeError):
        return None
    digest = sha256(stand_in).digest()
    if digest != link[1] or store.redactions is None:
        return None
    if txn.get(redaction_key(link[2], link[3]), db=store.redactions) is None:
        return None  # a message that only looks like a placeholder
    return stand_in, digest


def redactions_of(
    store: Store, txn: lmdb.Transaction, bodies: list[tuple[int, int]]
) -> dict[tuple[int, int], Redaction]:
    """The redactions of those of ``bodies`` that were redacted."""
    out: dict[tuple[int, int], Redaction] = {}
    if store.redactions is None:
        return out
    for body in dict.fromkeys(bodies):
        found = txn.get(redaction_key(*body), db=store.redactions)
        if found is None or len(found) != SEQ.size:
            continue
        seq = SEQ.unpack(found)[0]
        raw = store.raw_event(txn, seq)
        event = None if raw is None else store.decode(seq, bytes(raw))
        if isinstance(event, ev.MessageRedacted):
            time_ns = HEADER.unpack_from(raw)[1]  # type: ignore[arg-type]
            out[body] = Redaction(
                event.session, event.position, event.body_seq, event.body_index, event.reason, event.by, seq, time_ns
            )
    return out
