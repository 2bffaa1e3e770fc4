"""Turning a caller's message list into digests, cheaply on the second flush.

:func:`prepare` drops ephemeral scaffolding, validates and encodes each message and
chains its node digest.  Agent loops flush the same, growing list again and again,
so per session the last flushed list is remembered in a :class:`SnapshotCache`:
strong references to the caller's objects (so an ``id()`` can never be recycled
while it is cached) with each message's canonical bytes and node digest.

- Default mode: a message that is the *same object* as last time is re-encoded
  and its bytes compared with the cached bytes (no hashing).  Every in-place edit
  is still detected.
- Trust mode (``trust_identity=True``): the caller promises never to mutate a
  flushed message, and the same object is trusted without re-encoding, so a flush
  costs what its new messages cost.

The cache only says what the caller's list *hashes to*; whether those nodes are
stored is always decided against the log itself.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from operator import is_
from typing import Any

from . import codec
from .codec import ZERO

EPHEMERAL_FLAGS = (
    "_empty_recovery_synthetic",
    "_empty_terminal_sentinel",
    "_thinking_prefill",
    "_verification_stop_synthetic",
    "_pre_verify_synthetic",
    "_kanban_stop_synthetic",
    "_dropped_toolcall_nudge",
)
"""Top-level keys that mark a message as loop scaffolding (the default rule)."""

_FLAG_SET = frozenset(EPHEMERAL_FLAGS)


def is_ephemeral(message: Any) -> bool:
    """The default scaffolding rule: any of :data:`EPHEMERAL_FLAGS` is truthy."""
    if not isinstance(message, Mapping) or _FLAG_SET.isdisjoint(message):
        return False
    return any(message.get(flag) for flag in EPHEMERAL_FLAGS)


@dataclass(slots=True)
class Prepared:
    """A flushed list reduced to what the log compares and stores.

    ``kept[j]`` is the index in the caller's list of the ``j``-th stored message;
    ``bodies``, ``digests`` and ``nodes`` are per kept message.
    """

    kept: list[int]
    bodies: list[bytes]
    digests: list[bytes]
    nodes: list[bytes]
    raw: list[Any] = field(default_factory=list)
    """The caller's list as flushed (strong references), for the cache."""
    fast: list[bytes | None] = field(default_factory=list)
    """Per caller index: the encoding of the message as given (with ``_`` keys), None if not encodable."""
    flags: list[bool] = field(default_factory=list)
    """Per caller index: whether the message was scaffolding."""
    chunks: list[tuple[int, int, bytes | None]] = field(default_factory=list)
    """``(start, stop, blob)``: ``blob`` is ``fast[start:stop]`` joined (None if one is
    None).  Re-encoding ``raw[start:stop]`` as one list and comparing it with the blob
    checks a whole run of messages in one C call (default mode only)."""



class SnapshotCache:
    """The last flushed :class:`Prepared` per session, bounded by total messages held (LRU)."""

    def __init__(self, max_messages: int = 200_000) -> None:
        self.max_messages = max_messages
        self._items: OrderedDict[str, Prepared] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def get(self, session_id: str) -> Prepared | None:
        with self._lock:
            found = self._items.get(session_id)
            if found is not None:
                self._items.move_to_end(session_id)
            return found

    def put(self, session_id: str, prepared: Prepared) -> None:
        if len(prepared.raw) > self.max_messages:
            self.discard(session_id)
            return
        with self._lock:
            old = self._items.pop(session_id, None)
            if old is not None:
                self._size -= len(old.raw)
            self._items[session_id] = prepared
            self._size += len(prepared.raw)
            while self._size > self.max_messages and self._items:
                _, evicted = self._items.popitem(last=False)
                self._size -= len(evicted.raw)

    def discard(self, session_id: str) -> None:
        with self._lock:
            old = self._items.pop(session_id, None)
            if old is not None:
                self._size -= len(old.raw)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._size = 0


def prepare(
    messages: Sequence[Any],
    previous: Prepared | None,
    *,
    ephemeral: Callable[[Any], bool] = is_ephemeral,
    trust_identity: bool = False,
    chain: bool = True,
) -> Prepared:
    """Compute bodies, digests and nodes for ``messages``, reusing ``previous`` where it is safe.

    With ``chain=False`` node digests are left out (the caller chains the digests
    onto a head it reads inside its transaction).

    Raises :class:`~eventlog.errors.InvalidMessageError` for a message that is not
    JSON-like; nothing is cached or written in that case.
    """
    given = messages if type(messages) is list else list(messages)
    reuse = _reusable(given, previous, trust_identity)
    if previous is not None and reuse == len(given) == len(previous.raw) and (chain or not previous.nodes):
        return previous  # the very same messages, unchanged: nothing to compute or copy
    raw = list(given) if given is messages else given  # a snapshot: the caller's list will change
    out = Prepared([], [], [], [], raw, [], [])
    parent = ZERO
    if reuse:
        assert previous is not None
        kept_reused = bisect_left(previous.kept, reuse)  # kept indices below `reuse`
        out.kept = previous.kept[:kept_reused]
        out.bodies = previous.bodies[:kept_reused]
        out.digests = previous.digests[:kept_reused]
        out.nodes = previous.nodes[:kept_reused]
        out.fast = previous.fast[:reuse]
        out.flags = previous.flags[:reuse]
        if not trust_identity:
            out.chunks = [chunk for chunk in previous.chunks if chunk[1] <= reuse]
        if out.nodes:
            parent = out.nodes[-1]
    # The per-message loop of every flush: locals and inlined checks on purpose.
    encode, inspect, strip = codec.encode, codec.inspect, codec.strip
    default_rule = ephemeral is is_ephemeral
    flags_seen = _FLAG_SET.isdisjoint
    fast_out, flags_out = out.fast.append, out.flags.append
    kept_out, bodies_out, digests_out, nodes_out = out.kept.append, out.bodies.append, out.digests.append, out.nodes.append
    for index in range(reuse, len(raw)):
        message = raw[index]
        try:
            fast: bytes | None = encode(message)
        except Exception:  # _ keys may hold process-local objects; only canonical bytes matter
            fast = None
        fast_out(fast)
        if (not flags_seen(message) and ephemeral(message)) if default_rule else ephemeral(message):
            flags_out(True)
            continue
        flags_out(False)
        private = inspect(message, index, encoded=fast is not None)
        if fast is not None and not private and type(message) is dict:
            body = fast  # no `_` keys: the encoding just made is the canonical one
        else:
            body = encode(strip(message))
        digest = sha256(body).digest()
        kept_out(index)
        bodies_out(body)
        digests_out(digest)
        if chain:
            parent = sha256(parent + digest).digest()
            nodes_out(parent)
    if not trust_identity:
        _extend_chunks(out)
    return out


CHUNK_MESSAGES = 256
"""Most messages per verification chunk: encoding a few hundred messages at a time keeps the
buffers small and warm (one multi-megabyte encoding costs more than its pieces)."""


def _extend_chunks(out: Prepared) -> None:
    """Cover the messages after the last chunk, merging small chunks like a binary counter (so a
    session grown ten messages at a time has few chunks) up to :data:`CHUNK_MESSAGES` each."""
    chunks = out.chunks
    fast = out.fast
    start = chunks[-1][1] if chunks else 0
    while start < len(fast):
        stop = min(start + CHUNK_MESSAGES, len(fast))
        part = fast[start:stop]
        chunks.append((start, stop, None if None in part else b"".join(part)))  # type: ignore[arg-type]
        start = stop
        while len(chunks) >= 2:
            (a, m, left), (_, b, right) = chunks[-2], chunks[-1]
            if m - a > b - m or b - a > CHUNK_MESSAGES:
                break
            chunks[-2:] = [(a, b, None if left is None or right is None else left + right)]


def _array_header_size(n: int) -> int:
    return 1 if n < 16 else 3 if n < 65536 else 5


def _identical_prefix(raw: list[Any], old: list[Any]) -> int:
    """How many leading items of ``raw`` are the very objects of ``old``."""
    n = min(len(raw), len(old))
    if all(map(is_, raw, old)):  # map stops at the shorter list
        return n
    start, block = 0, 256
    while start < n:  # find the block with the first difference in C, then the item
        stop = min(start + block, n)
        if all(map(is_, raw[start:stop], old[start:stop])):
            start = stop
            continue
        while raw[start] is old[start]:
            start += 1
        return start
    return n


def _reusable(raw: list[Any], previous: Prepared | None, trust_identity: bool) -> int:
    """How many leading messages of ``raw`` can reuse ``previous``'s results unchanged."""
    if previous is None or not previous.raw:
        return 0
    same = _identical_prefix(raw, previous.raw)
    if trust_identity or same == 0:
        return same
    # Same objects, but a dict may have been edited in place: compare fresh encodings
    # with the cached ones, a chunk at a time (one C call and one memcmp each), no hashing.
    encode, fast = codec.encode, previous.fast
    checked = 0
    for start, stop, blob in previous.chunks:
        if stop > same:
            break
        if blob is not None:
            try:
                current = encode(raw[start:stop])
            except Exception:  # an unencodable `_` value; look message by message
                current = b""
            if len(current) == len(blob) + _array_header_size(stop - start) and current.endswith(blob):
                checked = stop
                continue
        changed = _first_changed(raw, fast, start, stop)
        if changed < stop:
            return changed
        checked = stop
    return _first_changed(raw, fast, checked, same)


def _first_changed(raw: list[Any], fast: list[bytes | None], start: int, stop: int) -> int:
    """The first index in ``start..stop-1`` whose encoding differs from ``fast`` (else ``stop``)."""
    encode = codec.encode
    for index in range(start, stop):
        try:
            current: bytes | None = encode(raw[index])
        except Exception:
            current = None
        if current is None or current != fast[index]:
            # Could be a change only in `_` keys or scaffolding flags; hashing it again sorts that out.
            return index
    return stop
