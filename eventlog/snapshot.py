"""Turning a caller's message list into digests, cheaply on the second flush.

:func:`prepare` drops ephemeral scaffolding, validates and encodes each message and
chains its node digest.  Agent loops flush the same, growing list again and again,
so per session the last flushed list is remembered in a :class:`SnapshotCache`:
strong references to the caller's objects (so an ``id()`` can never be recycled
while it is cached) with each message's digests, and its canonical bytes until
they are stored (see :func:`release`).

- Default mode: the message at each position flushed before (the same dict, or a
  fresh one) is checked against a *record* of what it was when it was flushed (see
  :func:`remember`): its leaves compared by identity, so the check never reads the
  text, and numbers by type, value and sign.  Every in-place edit is detected, and
  anything the check cannot vouch for is re-encoded and re-hashed.
- Trust mode (``trust_identity=True``): the caller promises never to mutate a
  flushed message; the same object (or a dict equal to it) is reused without a
  look inside, so a flush costs what its new messages cost.

The cache only says what the caller's list *hashes to*; whether those nodes are
stored is always decided against the log itself.
"""

from __future__ import annotations

import os
import threading
from array import array
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from math import copysign
from typing import Any, Final

from . import codec, overlap
from .codec import MAX_DEPTH, ZERO

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

    kept: array[int]
    """Machine integers (``array("q")``): a list would hold an int object for each message."""
    bodies: list[bytes | None]
    """Per kept message, its canonical bytes; None for those before ``released`` (see :func:`release`)."""
    digests: list[bytes]
    nodes: list[bytes]
    raw: list[Any] = field(default_factory=list)
    """The caller's list as flushed (strong references), for the cache."""
    fast: list[bytes | None] = field(default_factory=list)
    """Per caller index: the encoding of the message as given (with ``_`` keys), None if not
    encodable, :data:`RELEASED` once it was the body and was let go."""
    flags: list[bool] = field(default_factory=list)
    """Per caller index: whether the message was scaffolding."""
    copies: list[Any] = field(default_factory=list)
    """Per caller index: what :func:`remember` made of the message, or
    :data:`PENDING` until a later flush has checked the message against ``fast`` (a session
    flushed once, like a bulk import, never pays for copies), or :data:`UNCOPYABLE`
    (default mode only)."""
    released: int = 0
    """The bodies of the kept messages before this index were let go: they are stored."""
    released_bytes: int = 0
    """How many bytes those bodies held (to reserve room when they are needed again)."""
    dropped: int = 0
    """``copies`` before this caller index are :data:`DROPPED`: the list is longer than the
    cache, which keeps copies of its last positions only (see :class:`SnapshotCache`)."""


class SnapshotCache:
    """The last flushed :class:`Prepared` per session, bounded by total messages held (LRU).

    A session longer than the whole bound is still cached, as its tail: the copies of
    its first positions are let go (:data:`DROPPED`), so that it holds copies of
    ``max_messages`` messages, like a full cache.  Its digests, node digests and
    references to the caller's messages stay, about 200 bytes a message.  A flush then
    checks the positions without copies by encoding and hashing them once (their node
    digests are not recomputed), and only those: its cost grows with how far the session
    is beyond the bound, not with its whole length.  In trust mode there are no copies
    and nothing is hashed again.
    """

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

    def _weight(self, prepared: Prepared) -> int:
        return min(len(prepared.raw), self.max_messages)

    def take(self, session_id: str) -> Prepared | None:
        """Remove and return the session's entry: the caller owns it until it puts one back."""
        with self._lock:
            found = self._items.pop(session_id, None)
            if found is not None:
                self._size -= self._weight(found)
            return found

    def put(self, session_id: str, prepared: Prepared) -> None:
        """Cache ``prepared`` (owned by the caller until now) as the session's entry."""
        excess = len(prepared.copies) - self.max_messages
        if excess > prepared.dropped:  # longer than the cache: keep the copies of its tail
            prepared.copies[prepared.dropped : excess] = [DROPPED] * (excess - prepared.dropped)
            prepared.dropped = excess
        with self._lock:
            old = self._items.pop(session_id, None)
            if old is not None:
                self._size -= self._weight(old)
            self._items[session_id] = prepared
            self._size += self._weight(prepared)
            while self._size > self.max_messages and len(self._items) > 1:
                _, evicted = self._items.popitem(last=False)
                self._size -= self._weight(evicted)

    def discard(self, session_id: str) -> None:
        with self._lock:
            old = self._items.pop(session_id, None)
            if old is not None:
                self._size -= self._weight(old)

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
    owned: bool = False,
) -> Prepared:
    """Compute bodies, digests and nodes for ``messages``, reusing ``previous`` where it is safe.

    With ``chain=False`` node digests are left out (the caller chains the digests
    onto a head it reads inside its transaction).  ``owned=True`` says no other
    thread can see ``previous`` (it was taken out of the cache): when ``messages``
    only extends it, it is extended in place, so a growing session costs what its
    new messages cost instead of a copy of every list.

    Raises :class:`~eventlog.errors.InvalidMessageError` for a message that is not
    JSON-like; nothing is cached or written in that case, and ``previous`` is as it was.
    """
    given = messages if type(messages) is list else list(messages)
    reuse = _reusable(given, previous, trust_identity, owned)
    if previous is not None and reuse == len(previous.raw) and (chain or not previous.nodes):
        if reuse == len(given):
            return previous  # the very same messages, unchanged: nothing to compute or copy
        if owned:
            sizes = [len(part) for part in _parts(previous)]
            previous.raw.extend(given[reuse:])
            try:
                return _extend(
                    previous, reuse, previous.nodes[-1] if previous.nodes else ZERO, ephemeral, trust_identity, chain
                )
            except BaseException:
                for part, size in zip(_parts(previous), sizes):
                    del part[size:]
                raise
    raw = list(given) if given is messages else given  # a snapshot: the caller's list will change
    if reuse and trust_identity and raw is not given:
        # Another thread may have replaced a message since `reuse` was measured on the live
        # list; identity is all trust mode checks, so measure it again on the snapshot.
        reuse = _reusable(raw, previous, trust_identity)
    out = Prepared(array("q"), [], [], [], raw, [], [])
    parent = ZERO
    if reuse:
        assert previous is not None
        kept_reused = bisect_left(previous.kept, reuse)  # kept indices below `reuse`
        out.kept = previous.kept[:kept_reused]
        out.bodies = previous.bodies[:kept_reused]
        out.released = min(previous.released, kept_reused)
        if previous.released:
            out.released_bytes = previous.released_bytes * out.released // previous.released
        out.digests = previous.digests[:kept_reused]
        out.nodes = previous.nodes[:kept_reused]
        out.fast = previous.fast[:reuse]
        out.flags = previous.flags[:reuse]
        if not trust_identity:
            out.copies = previous.copies[:reuse]
            out.dropped = min(previous.dropped, reuse)
        if out.nodes:
            parent = out.nodes[-1]
    return _extend(out, reuse, parent, ephemeral, trust_identity, chain, previous is not None)


def _parts(prepared: Prepared) -> tuple[list[Any] | array[int], ...]:
    return (
        prepared.raw,
        prepared.kept,
        prepared.bodies,
        prepared.digests,
        prepared.nodes,
        prepared.fast,
        prepared.flags,
        prepared.copies,
    )


def _extend(
    out: Prepared,
    reuse: int,
    parent: bytes,
    ephemeral: Callable[[Any], bool],
    trust_identity: bool,
    chain: bool,
    seen: bool = True,
) -> Prepared:
    """Compute ``out``'s results for ``out.raw[reuse:]`` after ``parent`` (``seen``: the
    session was flushed before, so its new messages are copied for the next check)."""
    raw = out.raw
    # A session flushed again and again gets copies of its new messages for the next check,
    # taken before the message is encoded (an edit racing with this flush then shows).
    copying = seen and not trust_identity
    if not trust_identity and not seen:
        out.copies.extend([PENDING] * (len(raw) - len(out.copies)))
    copies_out = out.copies.append
    if (
        len(raw) - reuse >= BATCH_PATH
        and ephemeral is is_ephemeral
        and _extend_batch(out, reuse, parent, chain, copying)
    ):
        return out
    # The per-message loop of every flush: locals and inlined checks on purpose.
    encode, inspect, strip = codec.encode, codec.inspect, codec.strip
    default_rule = ephemeral is is_ephemeral
    flags_seen = _FLAG_SET.isdisjoint
    fast_out, flags_out = out.fast.append, out.flags.append
    kept_out, bodies_out, digests_out, nodes_out = (
        out.kept.append,
        out.bodies.append,
        out.digests.append,
        out.nodes.append,
    )
    as_message = codec.as_message
    for index in range(reuse, len(raw)):
        message = raw[index]
        if type(message) is dict:
            if copying:
                copies_out(remember(message))
        else:
            message = as_message(message, index)  # a pydantic model: its dump, made anew each flush
            if copying:
                copies_out(UNCOPYABLE if message is not raw[index] else remember(message))
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
    return out


BATCH_PATH = 4
"""From this many new messages (a turn has about ten), a flush first tries them as one batch (see
:func:`_extend_batch`): measured cheaper than the per-message loop from about four."""

PLAIN_BATCH = 32
"""From this many new messages, :func:`~eventlog.codec.plain_batch` validates them (its passes
cost more than a loop over a turn's ten, less from about thirty)."""

EACH_FROM = 64
"""From this many new messages (a bulk flush, not a turn), :func:`_extend_batch` hashes the
bodies with ``eventlog._digest`` (:mod:`eventlog.overlap`): one C loop instead of a hash object
per digest, on the worker thread beside the encoding of the next :data:`EACH_PART` messages."""
EACH_PART = 64

_DIGEST = type(sha256()).digest
_DICT = frozenset({dict})


def _extend_batch(out: Prepared, reuse: int, parent: bytes, chain: bool, copying: bool) -> bool:
    """The per-message loop of :func:`_extend` as a few passes over all new messages (a turn,
    an import), for the common case: plain dicts, no ``_`` keys, so nothing is scaffolding
    and each encoding is the canonical one.  With ``copying``, every copy is taken before
    any message is encoded.

    Returns False, having changed nothing, when that is not the case; the loop then handles
    every message.  Raises :class:`~eventlog.errors.InvalidMessageError` like the loop, or
    leaves a message that is not JSON-like to it.
    """
    batch = out.raw[reuse:]
    if not set(map(type, batch)) <= _DICT:
        return False
    copies = [remember(message) for message in batch] if copying else None  # before encoding
    hashing = overlap._digest if len(batch) >= EACH_FROM else None
    jobs = []
    try:
        if hashing is None:
            bodies = list(map(codec.encode, batch))
        else:
            # Each part's bodies are hashed on the worker thread while the next part is encoded.
            bodies = []
            for at in range(0, len(batch), EACH_PART):
                part = list(map(codec.encode, batch[at : at + EACH_PART]))
                bodies += part
                jobs.append(hashing.each(part, overlap.OFFLOAD))
    except Exception:
        return False  # a job dropped unfinished waits for the worker to let go of its bodies
    if len(batch) >= PLAIN_BATCH:
        if not codec.plain_batch(batch):  # also refuses `_` keys, so the scaffolding flags
            return False
    else:
        if not all(map(_FLAG_SET.isdisjoint, batch)):
            return False  # scaffolding: the loop drops it before any check
        inspect = codec.inspect_encoded
        if any([inspect(message, index) for index, message in enumerate(batch, reuse)]):
            return False  # `_` keys: the loop strips them
    if hashing is None:
        digests = list(map(_DIGEST, map(sha256, bodies)))
    else:
        digests = jobs[0].finish()
        for job in jobs[1:]:
            digests += job.finish()
    if copies is not None:
        out.copies += copies
    out.fast += bodies
    out.flags += [False] * len(batch)
    out.kept.extend(range(reuse, len(out.raw)))
    out.bodies += bodies
    out.digests += digests
    if chain and hashing is not None:
        out.nodes += hashing.chain(parent, digests)
    elif chain:
        nodes_out = out.nodes.append
        for digest in digests:
            parent = sha256(parent + digest).digest()
            nodes_out(parent)
    return True


RELEASED: Final = b""
"""In ``Prepared.fast``: the encoding was the message's body and was let go with it; the
digest stands for it (no message encodes to no bytes)."""


class ChangedSince(Exception):
    """A message whose body the cache let go no longer encodes to its digest: it was changed
    in place after it was checked (during the flush, or against a trust-mode promise)."""


def release(prepared: Prepared) -> None:
    """Let go of the bodies of ``prepared``'s messages: the caller has just seen them stored.

    A cached list then holds each message's digests and copies, not a second copy of its
    bytes (for a bulk import, most of the memory the cache would hold).  A body needed
    again, when the stored transcript was rewound under the cache, is encoded again by
    :func:`bodies_from` and checked against its digest.
    """
    start, stop = prepared.released, len(prepared.bodies)
    if start >= stop:
        return
    kept, fast, bodies = prepared.kept, prepared.fast, prepared.bodies
    first, last = kept[start], kept[stop - 1] + 1
    if last - first == stop - start and fast[first:last] == bodies[start:stop]:
        fast[first:last] = [RELEASED] * (stop - start)  # the common case, compared by pointer in C
    else:
        for j in range(start, stop):
            if fast[kept[j]] == bodies[j]:  # not for a message with `_` keys or scaffolding
                fast[kept[j]] = RELEASED
    prepared.released_bytes += sum(map(len, filter(None, bodies[start:stop])))  # a body is never empty
    prepared.released = stop  # first: a body still held below it is only encoded again
    bodies[start:stop] = [None] * (stop - start)


def bodies_from(prepared: Prepared, start: int, stop: int | None = None) -> list[bytes]:
    """``prepared.bodies[start:stop]``, with the bodies let go encoded again.

    Raises :class:`ChangedSince` when one of them no longer matches its digest.
    """
    out = prepared.bodies[start:stop]
    for j in range(start, min(prepared.released, start + len(out))):
        if out[j - start] is not None:
            continue
        message = prepared.raw[prepared.kept[j]]
        try:
            body = codec.canonical(message, prepared.kept[j])
        except Exception as e:
            raise ChangedSince from e
        if sha256(body).digest() != prepared.digests[j]:
            raise ChangedSince
        out[j - start] = body
    return out  # type: ignore[return-value]


class _Marker:
    """A placeholder in a list of copies; it equals nothing but itself, so a list comparison stops at it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


PENDING: Any = _Marker("PENDING")
"""No copy yet: the message is checked against its encoding, then copied."""
DROPPED: Any = _Marker("DROPPED")
"""The copy was let go (the list is longer than the cache): the message is checked against its
encoding or digest every time, and not copied again."""
UNCOPYABLE: Any = _Marker("UNCOPYABLE")
"""The message holds something other than JSON-like values (under a ``_`` key): always re-encoded."""


class _Number:
    """A number inside a message copy: equal only to a number of the same type, value and sign.

    ``1 == 1.0 == True`` and ``0.0 == -0.0`` in Python, but their canonical bytes
    differ, so a copy must not take one for the other.
    """

    __slots__ = ("value",)

    def __init__(self, value: int | float) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        value = self.value
        if other is value:
            return True
        if type(other) is not type(value) or other != value:
            return False
        return value != 0 or copysign(1.0, other) == copysign(1.0, value)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"_Number({self.value!r})"


class _Uncopyable(Exception):
    pass


try:
    from . import _check
except ImportError:  # built without a C compiler: the pure-Python check gives the same answers
    _check = None  # type: ignore[assignment, unused-ignore]

ACCELERATED = _check is not None and not os.environ.get("EVENTLOG_PURE_PYTHON")
"""Whether the default mode's edit check runs in C (``eventlog._check``).  The pure-Python
check (copies compared with ``==``, see :func:`copy_message`) gives the same answers on
JSON-like values; ``EVENTLOG_PURE_PYTHON=1`` in the environment selects it."""


def remember(message: Any) -> Any:
    """What a later flush compares ``message`` with to tell whether it changed in place: a C
    record (see ``eventlog/_check.c``) when :data:`ACCELERATED`, else :func:`copy_message`;
    :data:`UNCOPYABLE` for a message that holds anything but JSON-like values."""
    if ACCELERATED:
        found = _check.record(message, MAX_DEPTH)
        return UNCOPYABLE if found is None else found
    return copy_message(message)


def first_changed(remembered: list[Any], messages: list[Any], start: int, stop: int) -> int:
    """The first index in ``start..stop-1`` whose message is not what :func:`remember` saw
    (or was not remembered: :data:`PENDING`, :data:`UNCOPYABLE`), else ``stop``."""
    if ACCELERATED:
        return int(_check.first_changed(remembered, messages, start, stop))
    return _first_unequal(remembered, messages, start, stop)


def copy_message(message: Any) -> Any:
    """A copy of ``message``'s dicts, lists and tuples that shares its strings.

    ``copy == message`` is then True exactly when nothing was changed in place
    (a false "changed" only costs a re-encoding): the comparison walks the containers
    in C and, for the strings that are still the very same objects, compares
    pointers.  Numbers are wrapped in :class:`_Number`, which equals only a number of
    the same type, value and sign: Python's ``==`` takes ``True`` for ``1``, ``1.0``
    for ``1``, ``-0.0`` for ``0.0`` and a ``Decimal`` or ``Fraction`` for an equal float,
    and the canonical bytes of each differ.  Returns :data:`UNCOPYABLE` for a message
    holding anything else (possible under ``_`` keys), or nested deeper than
    :data:`~eventlog.codec.MAX_DEPTH`.

    The values are compared with their own ``==``: a value of a user-defined subclass
    of ``str``, ``dict`` or ``list`` put in place of one (never JSON-like data) is judged
    by its class's ``__eq__``, where the C check, which runs no Python code, calls it
    changed.
    """
    if type(message) is not dict:
        return UNCOPYABLE
    try:
        return _copy(message, 0)
    except _Uncopyable:
        return UNCOPYABLE


def _copy(value: Any, depth: int) -> Any:
    kind = type(value)
    if kind is str or value is None:
        return value
    if depth > MAX_DEPTH:
        raise _Uncopyable
    if kind is dict:
        copied = {
            key: item if type(item) is str or item is None else _copy(item, depth + 1) for key, item in value.items()
        }
        if not all([type(key) is str for key in copied]):
            raise _Uncopyable  # as the C record: only string keys (a JSON object's)
        return copied
    if kind is list:
        return [item if type(item) is str or item is None else _copy(item, depth + 1) for item in value]
    if kind is tuple:
        return tuple([item if type(item) is str or item is None else _copy(item, depth + 1) for item in value])
    if kind is int or kind is float or kind is bool:
        return _Number(value)
    raise _Uncopyable


def _reusable(raw: list[Any], previous: Prepared | None, trust_identity: bool, owned: bool = False) -> int:
    """How many leading messages of ``raw`` can reuse ``previous``'s results unchanged."""
    if previous is None or not previous.raw:
        return 0
    same = min(len(raw), len(previous.raw))
    if trust_identity:
        # The same objects (or ones equal to them): list equality compares pointers first, in C,
        # without touching the objects.
        old = previous.raw
        if same == len(old) and _leading_equal(old, raw, owned):
            return same
        return _first_unequal(old, raw, 0, same)
    # A dict may have been edited in place, or replaced by a fresh one: compare with the copies.
    copies = previous.copies
    if ACCELERATED:
        if same == len(copies) and _check.first_changed(copies, raw, 0, same) == same:
            return same
    elif same == len(copies) and _leading_equal(copies, raw, owned):
        return same
    start = min(previous.dropped, same)
    for index in range(start):  # no copies kept: check what they encode to
        if not _encodes_as_before(raw[index], index, previous):
            return index
    while (start := first_changed(copies, raw, start, same)) < same:
        copy = copies[start]
        if copy is not PENDING and copy is not UNCOPYABLE and copy is not DROPPED:
            return start  # changed in place (or only in a way hashing it again will show is harmless)
        message = raw[start]
        # Copied before it is checked: an edit racing with this flush then differs from the copy.
        fresh = remember(message) if copy is PENDING else copy
        if not _encodes_as_before(message, start, previous):
            return start
        # Unchanged since it was flushed: from now on a comparison checks it.  (Writing into
        # the cached list is safe: it only ever gains copies.)
        copies[start] = fresh
        start += 1
    return same


def _encodes_as_before(message: Any, index: int, previous: Prepared) -> bool:
    """Whether ``message`` encodes as the message flushed at ``index`` of ``previous`` did."""
    try:
        current = codec.encode(message if type(message) is dict else codec.as_message(message, index))
    except Exception:  # an unencodable `_` value: only hashing it again can tell
        return False
    known = previous.fast[index]
    if known == RELEASED:
        return bool(sha256(current).digest() == previous.digests[bisect_left(previous.kept, index)])
    return current == known


def _leading_equal(old: list[Any], raw: list[Any], owned: bool) -> bool:
    """Whether ``raw`` starts with items equal to all of ``old``, in one C comparison.

    For a grown ``raw``, an ``owned`` ``old`` is compared grown by ``raw``'s new items for the
    moment (they compare with themselves, by pointer): slicing the caller's list instead would
    touch every message.  A comparison that raises (a ``_`` value with a strange ``__eq__``)
    counts as unequal: the caller then looks closer.
    """
    same = len(old)
    try:
        if same == len(raw):
            return bool(old == raw)
        if not owned:
            return bool(old == raw[:same])
        old.extend(raw[same:])
        try:
            return bool(old == raw)
        finally:
            del old[same:]
    except Exception:
        return False


def _first_unequal(old: list[Any], raw: list[Any], start: int, stop: int) -> int:
    """The first index in ``start..stop-1`` where ``old[i] != raw[i]``, else ``stop``.

    Compares growing blocks in C; an unequal block is searched item by item.
    """
    block = 64
    try:
        while start < stop:
            end = min(start + block, stop)
            if old[start:end] == raw[start:end]:
                start = end
                block = min(block * 2, 8192)
                continue
            for index in range(start, end):
                if not old[index] == raw[index]:
                    return index
            return start  # the block differed a moment ago: a concurrent edit; check it all again
    except Exception:
        return start  # a comparison raised: hash again from here
    return stop
