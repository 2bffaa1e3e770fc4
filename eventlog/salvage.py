"""Copying what is provably intact out of a damaged log into a new one.

A damaged page can make a log unreadable through LMDB (see :mod:`eventlog.pages`),
but the events are still in the data file, and they prove themselves: each event
records the hash of the event before it, and each session's state records the hash
of the session's newest event.  :func:`salvage` reads the damaged data file as plain
bytes, page by page (B-tree leaves and the overflow pages of large values, whether
or not a tree still reaches them), and collects every event it finds.  Starting from
the hashes the session states record, it walks the chain backwards: an event whose
hash is named by a proven event (or by a session state) is proven, and names the one
before it.  Nothing unproven is ever copied.

The proven events are then replayed in seq order into a new log through the ordinary
write API (appends, rewinds, edits, compactions and clears by flushes, forks,
metadata, closes, display overrides), so the new log's indexes are built as a
healthy log's are.  A session's history is replayed up to its first lost event
(one of its events that is missing or unproven, a carried body that is lost, or a
fork of a session that is already cut short): what came after depends on it.  The
new log's seqs are gapless and its hash chain new; event times are those of the
salvage.  The :class:`SalvageReport` names every seq that was not copied and every
session that lost events, and the new log verifies.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from typing import Any

import msgspec

from . import codec
from . import events as ev
from .errors import EventLogError
from .keys import HEADER, STATE, SessionState, event_hash
from .log import EventLog
from .pages import F_BIGDATA, HEADER_SIZE, NODE, P_LEAF, P_OVERFLOW, PAGES
from .pages import HEADER as PAGE_HEADER
from .writer import SUMMARY_KEY

_META_KEYS = frozenset({b"format", b"log_id", b"next_sid"})

MAX_LOST_TAIL = 1_000_000
"""How far past the newest proven event a session state may name an event and be believed."""


@dataclass(slots=True)
class SalvageReport:
    """What :func:`salvage` copied and what it could not.

    ``lost_seqs`` are the seqs of the damaged log that are not in the new one (missing,
    unproven, or after a loss in their session); ``sessions`` maps each session that
    lost events to why and how far it was copied (``events_copied`` of it).
    """

    events_found: int = 0
    events_proven: int = 0
    events_copied: int = 0
    known_end: int = 0
    """The highest seq the damaged file shows: a proven event, or one a session state names."""
    lost_seqs: list[int] = field(default_factory=list)
    dropped_seqs: list[int] = field(default_factory=list)
    """The lost seqs that were intact but came after a loss in their session (so not replayable)."""
    sessions: dict[str, str] = field(default_factory=dict)
    sessions_copied: list[str] = field(default_factory=list)
    verified: bool = False
    """Whether the new log passed :meth:`~eventlog.EventLog.verify` after the copy."""

    @property
    def complete(self) -> bool:
        return not self.lost_seqs and not self.sessions

    def lost_ranges(self) -> list[tuple[int, int]]:
        """``lost_seqs`` as inclusive ranges."""
        out: list[tuple[int, int]] = []
        for seq in self.lost_seqs:
            if out and out[-1][1] == seq - 1:
                out[-1] = (out[-1][0], seq)
            else:
                out.append((seq, seq))
        return out


def salvage(
    damaged: str | os.PathLike[str], new: str | os.PathLike[str], *, page_size: int | None = None
) -> SalvageReport:
    """Copy every provably intact event of the log at ``damaged`` into a new log at ``new``.

    ``damaged`` is only read, as plain bytes.  ``new`` must not hold a log yet.  Raises
    :class:`EventLogError` when ``new`` already holds one, :class:`OSError` when the damaged
    data file cannot be read.
    """
    data = os.path.join(os.fspath(damaged), "data.mdb")
    if os.path.exists(os.path.join(os.fspath(new), "data.mdb")):
        raise EventLogError(f"{os.fspath(new)} already holds a log; salvage writes into a new one")
    psize = page_size or os.sysconf("SC_PAGE_SIZE")
    found = _scan(data, psize)
    proven = _prove(found)
    # An 8-byte key of another table is no event: only proven events count, and the newest
    # events the session states name (whose pages may be the ones lost), within reason.
    ends = [seq for seq in found.ends if seq <= max(proven, default=0) + MAX_LOST_TAIL]
    report = SalvageReport(events_found=len(found.events), known_end=max([*proven, *ends], default=0))
    report.events_proven = len(proven)
    # One event per commit, unsynced: the copy is synced once, whole, at the end.
    with EventLog.open(new, durability="none") as log:
        copied = _Replay(log, report).run(proven, found.sessions)
        path = log.path
    fd = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    with EventLog.open(new, readonly=True) as log:
        report.verified = log.verify().ok
    report.events_copied = len(copied)
    report.lost_seqs = [seq for seq in range(1, report.known_end + 1) if seq not in copied]
    report.dropped_seqs = [seq for seq in report.lost_seqs if seq in proven]
    return report


@dataclass(slots=True)
class _Found:
    events: dict[int, set[bytes]] = field(default_factory=dict)
    anchors: set[bytes] = field(default_factory=set)
    ends: set[int] = field(default_factory=set)
    sessions: set[str] = field(default_factory=set)


def _scan(data: str, psize: int) -> _Found:
    """Every leaf entry of the file that can be an event, a session state or a session id."""
    found = _Found()
    fd = os.open(data, os.O_RDONLY)
    try:
        pages = os.fstat(fd).st_size // psize
        for pgno in range(2, pages):
            page = os.pread(fd, psize, pgno * psize)
            try:
                named, _, flags, lower, upper = PAGE_HEADER.unpack_from(page)
            except struct.error:
                continue
            if named != pgno or flags & 0x3F != P_LEAF or not HEADER_SIZE < lower <= upper <= psize:
                continue
            count = (lower - HEADER_SIZE) // 2
            for offset in struct.unpack_from(f"<{count}H", page, HEADER_SIZE):
                try:
                    _entry(fd, psize, page, offset, found)
                except (struct.error, ValueError, OSError):
                    continue
    finally:
        os.close(fd)
    return found


def _entry(fd: int, psize: int, page: bytes, offset: int, found: _Found) -> None:
    lo, hi, flags, ksize = NODE.unpack_from(page, offset)
    key = page[offset + NODE.size : offset + NODE.size + ksize]
    size = lo | hi << 16
    at = offset + NODE.size + ksize
    if flags & F_BIGDATA:
        (opgno,) = struct.unpack_from("<Q", page, at)
        head = os.pread(fd, HEADER_SIZE, opgno * psize)
        named, _, oflags, _, _ = PAGE_HEADER.unpack_from(head)
        (count,) = PAGES.unpack_from(head, 12)
        if named != opgno or not oflags & P_OVERFLOW or HEADER_SIZE + size > count * psize:
            return
        if (opgno + count) * psize > os.fstat(fd).st_size:
            return  # a run past the end of the file
        value = os.pread(fd, size, opgno * psize + HEADER_SIZE)
    else:
        value = page[at : at + size]
    if len(value) != size:
        return
    if len(key) == 8 and size >= HEADER.size:
        found.events.setdefault(int.from_bytes(key, "big"), set()).add(value)
    if len(key) == 9 and key[8:] == b"h" and size == STATE.size:
        state = SessionState.unpack(int.from_bytes(key[:8], "big"), value)
        found.anchors.add(state.last_hash)
        found.ends.add(state.last_seq)
    if size == 8 and key not in _META_KEYS and b"\x00" not in key:  # a session id
        try:
            found.sessions.add(key.decode("utf-8"))
        except UnicodeDecodeError:
            pass


def _prove(found: _Found) -> dict[int, bytes]:
    """The events whose hash a session state or a proven later event names, by seq."""
    named = set(found.anchors)
    proven: dict[int, bytes] = {}
    for seq in sorted(found.events, reverse=True):
        for raw in found.events[seq]:
            if event_hash(seq, raw) in named:
                proven[seq] = raw
                named.add(raw[:32])  # the hash of the event before it
                break
    return proven


class _Replay:
    """Replays proven events, in seq order, into a new log through its write API."""

    def __init__(self, log: EventLog, report: SalvageReport) -> None:
        self.log = log
        self.report = report
        self.live: dict[str, list[dict[str, Any]]] = {}
        self.last: dict[str, int] = {}  # session -> old seq of its last replayed event
        self.bodies: dict[tuple[int, int], dict[str, Any]] = {}  # (old seq, index) -> message
        self.cut: dict[str, str] = {}  # session -> why its history stops
        self.pending: dict[str, tuple[int, ev.MessagesTombstoned]] = {}

    def run(self, proven: dict[int, bytes], named: set[str]) -> set[int]:
        copied: set[int] = set()
        for seq in sorted(proven):
            raw = proven[seq]
            try:
                event = ev.decoder.decode(memoryview(raw)[HEADER.size :])
            except msgspec.DecodeError:
                continue  # proven bytes always decode; a different format version would not
            before = HEADER.unpack_from(raw)[4]
            session = event.session
            if session in self.cut:
                continue
            if before != self.last.get(session, 0):
                kept = self.last.get(session, 0)
                self._cut(
                    session,
                    f"its event {before} is lost; "
                    + (f"copied up to its event {kept}" if kept else "nothing of it before that was copied"),
                )
                continue
            try:
                done = self._apply(seq, event)
            except (EventLogError, ValueError, TypeError) as e:
                self._cut(session, f"event {seq} could not be replayed ({e})")
                continue
            if session in self.cut:
                continue
            copied.update(done)
            self.last[session] = seq
        for session in list(self.pending):
            copied.update(self._tombstone_alone(session))
        for session in sorted(named - set(self.live) - set(self.cut)):
            self.report.sessions[session] = "every event of it is lost"
        self.report.sessions_copied = sorted(s for s in self.live if s not in self.cut)
        return copied

    def _cut(self, session: str, why: str) -> None:
        self.cut[session] = why
        self.report.sessions[session] = why
        self.pending.pop(session, None)

    def _apply(self, seq: int, event: ev.AnyEvent) -> set[int]:
        """Replay one event; the old seqs now in the new log (a tombstone waits for its append)."""
        log, session = self.log, event.session
        done: set[int] = set()
        if session in self.pending and not isinstance(event, ev.MessagesAppended):
            done |= self._tombstone_alone(session)
        match event:
            case ev.SessionOpened():
                if event.source is not None:
                    if event.source in self.cut or event.source not in self.live:
                        self._cut(session, f"it was forked from {event.source!r}, whose history is lost")
                        return set()
                    log.fork(event.source, session, event.at)
                    self.live[session] = [dict(m) for m in self.live[event.source][: event.at]]
                else:
                    self.live.setdefault(session, [])
                return done | {seq}
            case ev.MessagesAppended():
                messages = []
                for i, body in enumerate(event.bodies):
                    where = event.carried.get(i)
                    if where is None:
                        message = codec.decode(bytes(body))
                    else:
                        found = self.bodies.get(tuple(where))  # type: ignore[arg-type]
                        if found is None:
                            self._cut(session, f"event {seq} carries a message whose body is lost")
                            return set()
                        message = found
                    self.bodies[(seq, i)] = message
                    messages.append(message)
                live = self.live.setdefault(session, [])
                wanted = [*live[: event.position], *messages]
                flush = [dict(m) for m in wanted]
                for i in range(event.summaries):
                    flush[event.position + i][SUMMARY_KEY] = True
                overrides = {event.position + i: o for i, o in event.overrides.items()}
                pending = self.pending.pop(session, None)
                replace = pending is not None and pending[1].reason == "clear"
                if pending is not None and pending[1].position != event.position:
                    done |= self._tombstone_now(session, pending[1])
                    pending = None
                if pending is None and event.position != len(live):
                    self._cut(session, f"event {seq} appends at {event.position}, the copy holds {len(live)}")
                    return set()
                if pending is not None and pending[1].reason == "rewind":
                    log.rewind(session, to=event.position)
                    replace = False
                log.flush(session, flush, overrides=overrides or None, replace=replace)
                self.live[session] = wanted
                if pending is not None:
                    done.add(pending[0])
                return done | {seq}
            case ev.MessagesTombstoned():
                self.pending[session] = (seq, event)
                return done  # applied with the append that follows it, or alone
            case ev.SessionUpdated():
                log.update_session(session, **event.fields, **event.counters)
                self.live.setdefault(session, [])
                return done | {seq}
            case ev.SessionClosed():
                log.close_session(session, reason=event.reason)
                return done | {seq}
            case ev.MessageAnnotated():
                live = self.live.get(session, [])
                log.flush(session, [dict(m) for m in live], overrides={event.position: event.override})
                return done | {seq}
        return done

    def _tombstone_alone(self, session: str) -> set[int]:
        seq, event = self.pending.pop(session)
        return self._tombstone_now(session, event) | {seq}

    def _tombstone_now(self, session: str, event: ev.MessagesTombstoned) -> set[int]:
        live = self.live.get(session, [])
        if event.reason == "clear" and event.position == 0:
            self.log.flush(session, [], replace=True)
        else:
            self.log.rewind(session, to=event.position)
        self.live[session] = live[: event.position]
        return set()
