"""The events of the log: immutable, tagged msgspec Structs.

Every event is stored once, in sequence, under a gapless global ``seq``.  Tags are
explicit integers that are never reused and never derived from a class name, so
renaming code cannot break stored data.  Schema evolution follows msgspec's rules:
new fields get defaults, field types never change, tags are never recycled.

A stored event is an *envelope* (see :mod:`eventlog.store`) around the encoded
payload Struct defined here.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal, get_args

import msgspec

Reason = Literal["rewind", "compaction", "edit", "clear"]
"""Why messages were tombstoned."""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="k", omit_defaults=True):
    """Base of every event payload; ``session`` is the session the event belongs to.

    ``name`` is the kind's word in the command line's output (``eventlog tail --json``).
    """

    name: ClassVar[str]
    session: str


class SessionOpened(Event, tag=1, frozen=True, kw_only=True):
    """A session came into being, optionally forked from ``source`` sharing its first ``at`` messages."""

    name: ClassVar[str] = "opened"

    source: str | None = None
    at: int = 0
    source_head: bytes | None = None
    """Node digest of the source's message at ``at - 1`` (what the fork shares)."""


class MessagesAppended(Event, tag=2, frozen=True, kw_only=True):
    """Messages became live at positions ``position ..`` of the session.

    Columns rather than one Struct per message keep encoding and decoding cheap:
    ``digests`` and ``nodes`` are 32-byte digests concatenated, ``bodies[i]`` holds the
    canonical bytes of message ``i``.  A message carried over from an earlier
    occurrence (after an edit, a rewind or a compaction) is not stored again: its
    body is :data:`CARRIED` (MessagePack nil) and ``carried`` maps its index to the
    ``(seq, index)`` of the event that holds the body.
    """

    name: ClassVar[str] = "appended"

    position: int
    digests: bytes
    nodes: bytes
    bodies: list[msgspec.Raw]
    carried: dict[int, tuple[int, int]] = {}
    overrides: dict[int, dict[str, Any]] = {}
    """Display overrides for messages of this batch, keyed by batch index."""
    summaries: int = 0
    """How many leading messages of the batch are compaction summaries."""
    salts: bytes = b""
    """16 random bytes per message, concatenated: what the log's Merkle tree commits to is
    each message salted (:func:`eventlog.verifier.message_commitment`), so that once a
    message is redacted (salt and body erased) nothing left confirms a guess of it."""
    sealed: dict[int, bytes] = {}
    """The commitments of this batch's redacted messages (their salt and body are gone)."""

    def __len__(self) -> int:
        return len(self.bodies)

    def node(self, i: int) -> bytes:
        return self.nodes[32 * i : 32 * i + 32]

    def digest(self, i: int) -> bytes:
        return self.digests[32 * i : 32 * i + 32]


class MessagesTombstoned(Event, tag=3, frozen=True, kw_only=True):
    """Messages at ``position ..`` (the whole live suffix) left the live transcript.

    Nothing is deleted: the messages stay in the log for audit and replay.
    ``nodes`` holds the tombstoned node digests, concatenated.
    """

    name: ClassVar[str] = "tombstoned"

    position: int
    nodes: bytes
    reason: Reason

    @property
    def count(self) -> int:
        return len(self.nodes) // 32


class SessionClosed(Event, tag=4, frozen=True, kw_only=True):
    """The session ended (``reason``: free text such as ``"user_exit"``)."""

    name: ClassVar[str] = "closed"

    reason: str = ""


USAGE_COUNTERS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "api_calls",
    "tool_calls",
    "cost_usd",
)
"""Session metadata keys that add up across updates (:data:`eventlog.COUNTERS`); projections
give each a column of its own, in this order."""


class SessionUpdated(Event, tag=5, frozen=True, kw_only=True):
    """Session metadata: ``fields`` merge into the session's metadata, ``counters`` add up."""

    name: ClassVar[str] = "updated"

    fields: dict[str, Any] = {}
    counters: dict[str, float | int] = {}


class MessageAnnotated(Event, tag=6, frozen=True, kw_only=True):
    """A display override for an already stored, unchanged message at ``position``."""

    name: ClassVar[str] = "annotated"

    position: int
    node: bytes
    override: dict[str, Any]
    salt: bytes = b""
    """Random bytes the tree's commitment to ``override`` is salted with (see :class:`MessagesAppended`)."""
    sealed: bytes = b""
    """The commitment of a redacted override (its salt and text are gone)."""


class MessageRedacted(Event, tag=7, frozen=True, kw_only=True):
    """The content of message ``position`` of the session was erased for good.

    Its body was stored in event ``body_seq`` at batch index ``body_index``; that event now
    holds a placeholder in its place, its salt is gone and its commitment is kept in
    ``sealed``, so the Merkle tree, every checkpoint signed before and every proof of another
    message stay valid.  Every digest derived from the erased content was re-derived, so the
    stored bytes of every event from ``body_seq`` on were rewritten: a projection that
    applied any of them holds the erased content and must be rebuilt.  ``by`` names who
    redacted it, ``reason`` why; the event's time is when.
    """

    name: ClassVar[str] = "redacted"

    position: int
    body_seq: int
    body_index: int
    reason: str
    by: str = ""


AnyEvent = (
    SessionOpened
    | MessagesAppended
    | MessagesTombstoned
    | SessionClosed
    | SessionUpdated
    | MessageAnnotated
    | MessageRedacted
)
"""Every event kind: the decoder's union, and what readers ``match`` on (ending in
``case _: assert_never(event)``, so the type checker names a reader that misses a kind)."""

KINDS: Final[tuple[type[AnyEvent], ...]] = get_args(AnyEvent)

KIND: Final[dict[type[AnyEvent], int]] = {cls: int(cls.__struct_config__.tag) for cls in KINDS}  # type: ignore[arg-type]
"""Event class to its tag, read from the Structs themselves (the tag is also written in the
envelope, so readers can filter without decoding)."""

NAMES: Final[dict[int, str]] = {KIND[cls]: cls.name for cls in KINDS}
"""Tag to the kind's word (:attr:`Event.name`)."""

CARRIED: Final = msgspec.Raw(b"\xc0")
"""The body placeholder of a carried message (its body lives in an earlier event)."""


class AppendedBodies(msgspec.Struct, tag=2, tag_field="k"):
    """A read-side view of :class:`MessagesAppended`: the bodies decoded to Python values, and digests.

    Replay decodes a whole event's messages in one call this way (a carried body is None).
    """

    bodies: list[Any]
    digests: bytes = b""


encoder = msgspec.msgpack.Encoder()
decoder = msgspec.msgpack.Decoder(AnyEvent)
bodies_decoder = msgspec.msgpack.Decoder(AppendedBodies)
