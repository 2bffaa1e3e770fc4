"""Key and value formats of the LMDB databases, and the stored event as a reader sees it.

Every number is fixed-width and big-endian, so keys sort as their numbers do and a
session's writes land at the end of its own key range.  The layout of each database
is in docs/design.md; the formats are:

``events``    ``SEQ`` key -> ``HEADER`` envelope + msgspec-encoded payload.
``sessions``  UTF-8 session id -> ``SEQ`` session number.
``index``     :func:`chain_key` -> ``LINK``; :func:`state_key` -> ``STATE``;
              :func:`note_key` -> node digest (32 bytes) + encoded display override.
``meta``      ``b"format"`` -> :data:`FORMAT`, ``b"log_id"`` -> 16 bytes,
              ``b"next_sid"`` -> ``SEQ``, ``b"unvacuumed"`` -> ``SEQ`` (a redaction not
              compacted away yet, :data:`eventlog.store.UNVACUUMED`).
``tree``      the Merkle tree's complete nodes (:mod:`eventlog.tree`).
``checkpoints`` ``SEQ`` tree size -> a signed checkpoint note (UTF-8).
``redactions`` :func:`redaction_key` of a redacted body -> ``SEQ`` of its redaction event.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import sha256
from itertools import repeat
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:
    import lmdb

from . import events as ev

FORMAT: Final = b"2"
"""1: the first format; 2: salted messages and the Merkle tree (:mod:`eventlog.upgrade`)."""

SEQ = struct.Struct(">Q")
HEADER = struct.Struct(">32sQBQQ")
"""Envelope: previous hash, time (ns), kind, session number, session's previous seq."""
STATE = struct.Struct(">Q32sQ32sB")
"""Session state: live length, head node, last seq, hash of that last event, closed flag.

The hash anchors the newest event of the log, which no later event names yet."""
LINK = struct.Struct(">32s32sQI")
"""Chain entry: node digest, content digest, seq and index of the stored body."""
LOCATION = struct.Struct(">32x32sQI")
"""The content digest and body location of a chain entry."""
REDACTIONS_DB: Final = b"redactions"
"""Redacted bodies (:mod:`eventlog.redact`)."""


def redaction_key(seq: int, index: int) -> bytes:
    """The ``redactions`` key of the body at ``index`` of event ``seq``."""
    return SEQ.pack(seq) + index.to_bytes(4, "big")


@dataclass(slots=True)
class SessionState:
    """A session's row of the ``index``: read at the start of a write, saved at its end."""

    number: int
    length: int
    head: bytes
    last_seq: int
    last_hash: bytes = bytes(32)
    closed: bool = False
    new: bool = False
    """Created by the open transaction (its id is not registered yet)."""

    def pack(self) -> bytes:
        return STATE.pack(self.length, self.head, self.last_seq, self.last_hash, self.closed)

    @classmethod
    def unpack(cls, number: int, raw: bytes | memoryview) -> SessionState:
        length, head, last_seq, last_hash, closed = STATE.unpack(raw)
        return cls(number, length, head, last_seq, last_hash, bool(closed))


def chain_key(number: int, position: int) -> bytes:
    """The live chain entry of session ``number`` at ``position``."""
    return SEQ.pack(number) + b"c" + SEQ.pack(position)


try:
    from . import _plain
except ImportError:  # built without a C compiler: chain_entries_python gives the same entries
    _plain = None  # type: ignore[assignment, unused-ignore]
if os.environ.get("EVENTLOG_PURE_PYTHON"):
    _plain = None  # type: ignore[assignment, unused-ignore]


def chain_entries(
    number: int, base: int, nodes: list[bytes], digests: list[bytes], seq: int
) -> list[tuple[bytes, bytes]]:
    """The live chain entries of a bulk append: positions ``base..`` of session ``number``, whose
    bodies are at indexes ``0..`` of event ``seq`` (``nodes`` and ``digests``: 32 bytes each).

    Built in C (``eventlog._plain``) when it is built, else by :func:`chain_entries_python`,
    which gives the same entries."""
    prefix = chain_key(number, 0)[:9]
    if _plain is not None:
        return _plain.chain_entries(prefix, base, nodes, digests, seq)
    return chain_entries_python(prefix, base, nodes, digests, seq)


def chain_entries_python(
    prefix: bytes, base: int, nodes: list[bytes], digests: list[bytes], seq: int
) -> list[tuple[bytes, bytes]]:
    """:func:`chain_entries` by maps, with no Python frame per message (``prefix``: the session's
    first 9 bytes of :func:`chain_key`)."""
    keys = map(prefix.__add__, map(SEQ.pack, range(base, base + len(nodes))))
    return list(zip(keys, map(LINK.pack, nodes, digests, repeat(seq), range(len(nodes)))))


def note_key(number: int, position: int) -> bytes:
    """The display override of session ``number`` at ``position``."""
    return SEQ.pack(number) + b"n" + SEQ.pack(position)


def state_key(number: int) -> bytes:
    """The state of session ``number`` (it sorts right after the chain's last entry)."""
    return SEQ.pack(number) + b"h"


def event_hash(seq: int, raw: bytes | memoryview) -> bytes:
    """SHA-256(seq key || envelope || payload): the link the next event stores."""
    digest = sha256(SEQ.pack(seq))
    digest.update(raw)
    return digest.digest()


@dataclass(frozen=True, slots=True)
class Record:
    """An event as stored: its ``seq``, time, hash chain links and decoded payload."""

    seq: int
    time_ns: int
    kind: int
    prev_hash: bytes
    hash: bytes
    event: ev.AnyEvent

    @property
    def session(self) -> str:
        return self.event.session


def pairs(cursor: lmdb.Cursor) -> Iterator[tuple[bytes, bytes]]:
    """A cursor's ``(key, value)`` pairs from where it stands, as ``bytes``.

    The log never opens a transaction with ``buffers=True``, so LMDB hands out ``bytes``;
    lmdb's type stubs say ``bytes | memoryview`` for either.
    """
    return cast("Iterator[tuple[bytes, bytes]]", iter(cursor))


def got(value: object) -> bytes | None:
    """A ``Transaction.get`` result as the log reads it (``bytes``, see :func:`pairs`)."""
    return cast("bytes | None", value)
