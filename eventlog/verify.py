"""Auditing a log: recompute every digest, the event hash chain and the derived indexes.

:func:`verify` walks every event once, in order, replaying each session's live
chain in memory from the events alone, and checks that

- seqs are gapless from 1 and each event names the hash of the one before it,
  and the log's recorded tail is the last event's hash;
- every stored body hashes to its content digest, every carried message refers to
  a stored body with the same digest, and every node digest is
  SHA-256(parent node || content digest) along its session's chain;
- tombstones and forks name the nodes that were live at the time;
- each session keeps the number its opening event gave it, and no two share one;
- the derived indexes (session numbers, heads and lengths, the live chain, the
  display overrides, the redactions) equal what the events say, entry for entry, with
  nothing extra; and the session counter is past every number in use;
- every redacted message is a placeholder with its salt and override gone, recorded by
  one redaction event: reported in :attr:`VerifyReport.redactions`, not as damage.  Its
  commitment in the tree is the sealed one (the tree check covers it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from hashlib import sha256
from typing import Any, assert_never

import lmdb

from . import codec
from . import events as ev
from .audit import check_checkpoints
from .codec import ZERO
from .errors import CorruptLogError, EventLogError
from .keys import HEADER, LINK, SEQ, STATE, SessionState, event_hash, pairs, redaction_key
from .merkle import Frontier, leaf_hash
from .pages import DamagedPage, check_pages
from .redact import Redaction, placeholder
from .store import UNVACUUMED, Store
from .tree import leaf_input, node_key
from .verifier import SALT_SIZE, Verifier


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing that is not as written: where (``seq`` 0 for an index) and what."""

    seq: int
    what: str

    def __str__(self) -> str:
        return f"event {self.seq}: {self.what}" if self.seq else self.what


_HEAD = re.compile(r"([0-9]+):([0-9a-fA-F]{64})")


@dataclass(frozen=True, slots=True)
class LogHead:
    """The newest event of a log as one writes it down: its ``seq`` and event ``hash`` (64 hex).

    Its text form is ``SEQ:HASH``, what ``eventlog head`` prints and ``eventlog verify
    --expect`` takes.  Every event's hash covers the one before it, so a log that still
    holds this event with this hash holds every event up to it unchanged.

    >>> LogHead.parse("7:" + "ab" * 32).seq
    7
    """

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"

    @classmethod
    def parse(cls, text: str) -> LogHead:
        """Read ``SEQ:HASH``; raises ValueError naming what is wrong."""
        found = _HEAD.fullmatch(text.strip()) if isinstance(text, str) else None
        if found is None or int(found.group(1)) < 1:
            raise ValueError(f"{text!r} is not SEQ:HASH (a seq from 1, a colon, 64 hex characters)")
        return cls(int(found.group(1)), found.group(2).lower())


@dataclass(slots=True)
class VerifyReport:
    """The outcome of :func:`verify`: ``ok`` when nothing failed; ``problems`` lists what did."""

    events: int = 0
    sessions: int = 0
    messages: int = 0
    problems: list[Problem] = field(default_factory=list)
    redactions: list[Redaction] = field(default_factory=list)
    """The messages whose content was erased on purpose (who, why, when): not damage."""
    vacuum_pending: bool = False
    """A redaction was committed but no compacting copy swapped in since (the process was stopped,
    or the copy refused): the data file's free pages may still hold the erased content until
    ``eventlog vacuum`` runs.  Not damage."""
    damaged_pages: list[DamagedPage] = field(default_factory=list)
    """Pages of the data file that are not what their B-tree needs (see :mod:`eventlog.pages`);
    when there are any, nothing was read through LMDB and ``problems`` lists only them."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first(self) -> Problem | None:
        return self.problems[0] if self.problems else None

    def __str__(self) -> str:
        if self.ok:
            redacted = f", {len(self.redactions)} redacted" if self.redactions else ""
            if self.vacuum_pending:
                redacted += " (erased content may remain in free pages of the data file: run `eventlog vacuum`)"
            return (
                f"ok: {self.events} events, {self.sessions} sessions, {self.messages} message bodies verified{redacted}"
            )
        return f"FAILED at {self.problems[0]} ({len(self.problems)} problem(s))"


def verify(
    store: Store,
    *,
    progress: Callable[[int, int], None] | None = None,
    limit: int = 100,
    expect: Iterable[LogHead] = (),
    checkpoints: Iterable[str] = (),
    keys: Iterable[Verifier] = (),
) -> VerifyReport:
    """Check the whole log; stop collecting after ``limit`` problems.

    ``progress(done, total)`` is called every few thousand events.  Each of ``expect``
    is an event the log must hold with that hash (a head written down earlier): a log
    restored from an older copy, or rewritten and resealed, fails here.
    """
    report = VerifyReport()
    try:
        with store.read() as txn:
            # LMDB aborts the process on a page that is not what the tree needs: walk the
            # snapshot's pages as plain bytes first, and read through LMDB only if they hold.
            pages = check_pages(os.path.join(store.path, "data.mdb"), txn.id(), page_size=store.env.stat()["psize"])
            report.damaged_pages = pages.damaged
            if not pages.ok:
                report.problems.extend(Problem(0, str(page)) for page in pages.damaged)
                return report
            _verify_snapshot(store, txn, report, progress, limit, expect)
            report.vacuum_pending = txn.get(UNVACUUMED, db=store.meta) is not None
            found = check_checkpoints(store, txn, checkpoints, list(keys))
            report.problems.extend(Problem(0, what) for what in found)
    except CorruptLogError as e:
        report.problems.append(Problem(0, str(e)))
    except OSError as e:
        report.problems.append(Problem(0, f"{store.path}: the data file cannot be read ({e})"))
    return report


def verify_files(path: str, error: EventLogError) -> VerifyReport:
    """The report on a log that cannot be opened at all: ``error``, and the damaged pages.

    The data file is walked as plain bytes (:func:`~eventlog.pages.check_pages`, from its
    newer valid meta page), so this never reads through LMDB.
    """
    report = VerifyReport(problems=[Problem(0, str(error))])
    try:
        pages = check_pages(os.path.join(path, "data.mdb"))
    except OSError as e:
        report.problems.append(Problem(0, f"{path}: the data file cannot be read ({e})"))
        return report
    report.damaged_pages = pages.damaged
    report.problems.extend(Problem(0, str(page)) for page in pages.damaged)
    return report


def _verify_snapshot(
    store: Store,
    txn: lmdb.Transaction,
    report: VerifyReport,
    progress: Callable[[int, int], None] | None,
    limit: int,
    expect: Iterable[LogHead],
) -> None:
    wanted = {head.seq: bytes.fromhex(head.hash) for head in expect}
    problems = report.problems
    chains: dict[str, list[tuple[bytes, bytes, int, int]]] = {}
    notes: dict[str, dict[int, bytes]] = {}  # session -> position -> node + override, as indexed
    numbers: dict[str, int] = {}  # session -> the number its opening event gave it
    owners: dict[int, str] = {}
    digests: dict[int, bytes] = {}  # seq of an append -> its digests, to check references
    prev_hash = bytes(32)
    expected_seq = 1
    last_of: dict[str, int] = {}  # session -> seq of its last event
    hashes: dict[int, bytes] = {}  # seq -> hash, for each session's last event
    try:
        total = store.last_seq(txn)
    except CorruptLogError as e:
        problems.append(Problem(0, str(e)))
        total = -1  # not a count any walk can match: the end of the log is unknown
    tree = _TreeCheck(store, txn)
    sealed = _Sealed(report)
    cursor = txn.cursor(db=store.events)
    for key, raw in pairs(cursor):
        if len(problems) >= limit:
            break
        if len(key) != SEQ.size:
            problems.append(Problem(0, f"events: malformed key {bytes(key).hex()}"))
            continue
        seq = SEQ.unpack(key)[0]
        report.events += 1
        if seq != expected_seq:
            problems.append(Problem(seq, f"seq gap: expected {expected_seq}"))
        expected_seq = seq + 1
        if len(raw) < HEADER.size:
            problems.append(Problem(seq, "envelope is truncated"))
            continue
        stored_prev, _, kind, number, before = HEADER.unpack_from(raw)
        if stored_prev != prev_hash:
            problems.append(Problem(seq, "previous-event hash does not match the event before it"))
        prev_hash = event_hash(seq, raw)
        if seq in wanted and wanted.pop(seq) != prev_hash:
            problems.append(
                Problem(seq, "does not have the hash written down for it (--expect): history was rewritten")
            )
        try:
            event = store.decode(seq, raw)  # hashed just above
        except CorruptLogError as e:
            problems.append(Problem(seq, str(e)))
            continue
        if ev.KIND[type(event)] != kind:
            problems.append(Problem(seq, f"envelope kind {kind} does not match the payload"))
        if before != last_of.get(event.session, 0):
            problems.append(Problem(seq, f"envelope does not link to the previous event of session {event.session!r}"))
        if isinstance(event, ev.SessionOpened) and event.session not in numbers:
            if number in owners:
                problems.append(
                    Problem(seq, f"session {event.session!r} opened as number {number}, which {owners[number]!r} has")
                )
            numbers[event.session] = number
            owners.setdefault(number, event.session)
        elif numbers.get(event.session, number) != number:
            problems.append(
                Problem(
                    seq,
                    f"envelope names session number {number}; session {event.session!r} is {numbers[event.session]}",
                )
            )
        hashes.pop(last_of.get(event.session, 0), None)
        last_of[event.session] = seq
        hashes[seq] = prev_hash
        _check_event(seq, event, chains, digests, problems, report)
        sealed.check(seq, HEADER.unpack_from(raw)[1], event, chains, problems)
        _track_notes(event, chains, notes)
        tree.add(seq, raw, event)
        if progress is not None and report.events % 4096 == 0:
            progress(report.events, total)
    if report.events != total and total >= 0:
        problems.append(Problem(0, f"the log ends at event {total}, but {report.events} events were found"))
    for seq in sorted(wanted):
        problems.append(
            Problem(0, f"the log has no event {seq}, which was written down as its head (--expect): an older copy?")
        )
    _check_indexes(store, txn, chains, notes, numbers, last_of, hashes, problems)
    sealed.finish(store, txn, problems)
    tree.finish()
    problems.extend(tree.problems)
    report.sessions = len(chains)
    if progress is not None:
        progress(report.events, total)


class _TreeCheck:
    """The Merkle tree recomputed from the events, compared node for node with the stored one.

    Both produce their nodes in key order, so the stored tree is read with one cursor
    alongside the walk over the events; the first difference is reported, once.
    """

    def __init__(self, store: Store, txn: Any) -> None:
        self.problems: list[Problem] = []  # reported after the others: a tree follows from the events
        problems = self.problems
        self.frontier = Frontier()
        self.failed = not store.tree.exists
        if self.failed:
            problems.append(Problem(0, "tree: the log predates its Merkle tree (format 1); run `eventlog migrate`"))
            self.stored: Iterator[tuple[bytes, bytes]] = iter(())
        else:
            self.stored = store.tree.nodes(txn)

    def add(self, seq: int, raw: bytes, event: ev.AnyEvent) -> None:
        if self.failed:
            return
        if seq != self.frontier.size + 1:
            self._fail(seq, "the tree cannot be checked past a gap in the events")
            return
        for level, index, h in self.frontier.append(leaf_hash(leaf_input(seq, raw, event))):
            found = next(self.stored, None)
            if found != (node_key(level, index), h):
                self._fail(seq, f"the Merkle tree differs from the events (node {level}/{index})")
                return

    def finish(self) -> None:
        if not self.failed and next(self.stored, None) is not None:
            self._fail(0, f"tree: nodes beyond the {self.frontier.size} events of the log")

    def _fail(self, seq: int, what: str) -> None:
        self.failed = True
        self.problems.append(Problem(seq, what))


class _Sealed:
    """Redacted messages: each sealed body a placeholder whose salt and override are gone, and
    recorded by exactly one redaction event (who, why, when), which the report lists; the
    ``redactions`` index names each one."""

    def __init__(self, report: VerifyReport) -> None:
        self.report = report
        self.bodies: dict[tuple[int, int], int | None] = {}  # sealed body -> seq of its redaction

    def check(
        self,
        seq: int,
        time_ns: int,
        event: ev.AnyEvent,
        chains: dict[str, list[tuple[bytes, bytes, int, int]]],
        problems: list[Problem],
    ) -> None:
        match event:
            case ev.MessagesAppended():
                for i in event.sealed:
                    if not 0 <= i < len(event) or i in event.carried:
                        problems.append(Problem(seq, f"sealed message {i} is not a message body of the event"))
                        continue
                    body = bytes(event.bodies[i])
                    try:
                        is_placeholder = codec.encode(placeholder(codec.decode(body))) == body
                    except Exception:
                        is_placeholder = False
                    if not is_placeholder:
                        problems.append(Problem(seq, f"message {i} is sealed as redacted but still holds content"))
                    if i in event.overrides or any(event.salts[SALT_SIZE * i : SALT_SIZE * (i + 1)]):
                        problems.append(Problem(seq, f"redacted message {i} still has its display override or salt"))
                    self.bodies[(seq, i)] = None
            case ev.MessageAnnotated() if event.sealed:
                chain = chains.get(event.session, [])
                where = tuple(chain[event.position][2:]) if event.position < len(chain) else None
                if event.override or event.salt or where not in self.bodies:
                    problems.append(
                        Problem(
                            seq, f"annotation of position {event.position} is sealed, but not of a redacted message"
                        )
                    )
            case ev.MessageRedacted():
                location = (event.body_seq, event.body_index)
                if location not in self.bodies:
                    problems.append(
                        Problem(
                            seq,
                            f"redaction of the body at event {location[0]}, index {location[1]}, which is not sealed",
                        )
                    )
                elif self.bodies[location] is not None:
                    problems.append(
                        Problem(seq, f"second redaction of the body at event {location[0]}, index {location[1]}")
                    )
                else:
                    self.bodies[location] = seq
                    self.report.redactions.append(
                        Redaction(
                            event.session,
                            event.position,
                            location[0],
                            location[1],
                            event.reason,
                            event.by,
                            seq,
                            time_ns,
                        )
                    )
            case _:
                pass

    def finish(self, store: Store, txn: lmdb.Transaction, problems: list[Problem]) -> None:
        for (seq, index), by in self.bodies.items():
            if by is None:
                problems.append(
                    Problem(seq, f"message {index} is sealed as redacted, but no redaction event records it")
                )
        expected = {redaction_key(*body): SEQ.pack(by) for body, by in self.bodies.items() if by is not None}
        found = {} if store.redactions is None else {bytes(k): bytes(v) for k, v in txn.cursor(db=store.redactions)}
        if found != expected:
            problems.append(Problem(0, "index: the redactions index differs from the redaction events"))


def _check_event(
    seq: int,
    event: ev.AnyEvent,
    chains: dict[str, list[tuple[bytes, bytes, int, int]]],
    digests: dict[int, bytes],
    problems: list[Problem],
    report: VerifyReport,
) -> None:
    session = event.session
    if isinstance(event, ev.SessionOpened):
        if session in chains:
            problems.append(Problem(seq, f"session {session!r} opened twice"))
        shared: list[tuple[bytes, bytes, int, int]] = []
        if event.source is not None:
            source = chains.get(event.source)
            if source is None or event.at > len(source):
                problems.append(Problem(seq, f"fork of {event.source!r} at {event.at}: no such prefix"))
            else:
                shared = source[: event.at]
                head = shared[-1][0] if shared else None
                if head != event.source_head:
                    problems.append(Problem(seq, f"fork of {event.source!r}: shared head does not match"))
        chains[session] = list(shared)
        return
    chain = chains.get(session)
    if chain is None:
        problems.append(Problem(seq, f"event for session {session!r} before it was opened"))
        chains[session] = chain = []
    match event:
        case ev.MessagesAppended():
            n = len(event)
            if len(event.digests) != 32 * n or len(event.nodes) != 32 * n:
                problems.append(Problem(seq, "digest or node columns do not match the number of messages"))
                return
            if event.position != len(chain):
                problems.append(Problem(seq, f"appends at position {event.position}, live length is {len(chain)}"))
                return
            digests[seq] = event.digests
            parent = chain[-1][0] if chain else ZERO
            for i in range(n):
                digest = event.digest(i)
                node = event.node(i)
                where = event.carried.get(i)
                if where is None:
                    report.messages += 1
                    if sha256(bytes(event.bodies[i])).digest() != digest:
                        problems.append(
                            Problem(
                                seq,
                                f"message {i} (position {event.position + i}): body does not match its content digest",
                            )
                        )
                    location = (seq, i)
                else:
                    ref_seq, ref_index = where
                    ref = digests.get(ref_seq)
                    if ref is None or ref[32 * ref_index : 32 * ref_index + 32] != digest:
                        problems.append(
                            Problem(seq, f"message {i}: carried body ({ref_seq}, {ref_index}) is missing or differs")
                        )
                    location = (ref_seq, ref_index)
                if sha256(parent + digest).digest() != node:
                    problems.append(
                        Problem(
                            seq,
                            f"message {i} (position {event.position + i}): node digest does not chain from its parent",
                        )
                    )
                chain.append((node, digest, location[0], location[1]))
                parent = node
        case ev.MessagesTombstoned():
            live = b"".join(link[0] for link in chain[event.position :])
            if live != event.nodes:
                problems.append(Problem(seq, f"tombstone at {event.position} does not name the live suffix"))
            del chain[event.position :]
        case ev.MessageAnnotated():
            if event.position >= len(chain) or chain[event.position][0] != event.node:
                problems.append(Problem(seq, f"annotation of position {event.position} names a node that is not live"))
        case ev.SessionClosed() | ev.SessionUpdated() | ev.MessageRedacted():
            pass
        case _:
            assert_never(event)


def _track_notes(
    event: ev.AnyEvent, chains: dict[str, list[tuple[bytes, bytes, int, int]]], notes: dict[str, dict[int, bytes]]
) -> None:
    """Follow the display overrides the index holds for ``event``'s session (after :func:`_check_event`)."""
    session = event.session
    if isinstance(event, ev.SessionOpened):
        source = notes.get(event.source, {}) if event.source is not None else {}
        notes[session] = {position: note for position, note in source.items() if position < event.at}
        return
    held = notes.setdefault(session, {})
    match event:
        case ev.MessagesAppended():
            for i, override in event.overrides.items():
                if 0 <= i < len(event):
                    held[event.position + i] = event.node(i) + codec.encode(override)
        case ev.MessagesTombstoned():
            for position in [p for p in held if p >= event.position]:
                del held[position]
        case ev.MessageAnnotated():
            if event.sealed:  # the override of a redacted message: erased, the position has none
                held.pop(event.position, None)
            elif event.position < len(chains.get(session, ())):
                held[event.position] = event.node + codec.encode(event.override)
        case ev.SessionClosed() | ev.SessionUpdated() | ev.MessageRedacted():
            pass
        case _:
            assert_never(event)


def _check_indexes(
    store: Store,
    txn: lmdb.Transaction,
    chains: dict[str, list[tuple[bytes, bytes, int, int]]],
    notes: dict[str, dict[int, bytes]],
    numbers: dict[str, int],
    last_of: dict[str, int],
    hashes: dict[int, bytes],
    problems: list[Problem],
) -> None:
    """Compare the ``sessions`` and ``index`` databases, entry for entry, with what the events say."""
    indexed: dict[int, str] = {}  # number -> session, for the sessions whose entry is right
    seen = 0
    for key, raw in txn.cursor(db=store.sessions):
        seen += 1
        session = str(key, "utf-8", "replace")
        if session not in chains:
            problems.append(Problem(0, f"index: session {session!r} has no events"))
        elif len(raw) != SEQ.size or SEQ.unpack(raw)[0] != numbers.get(session):
            problems.append(
                Problem(0, f"index: session {session!r} is indexed under another number than its events give it")
            )
        else:
            indexed[numbers[session]] = session
    if seen != len(chains):
        problems.append(Problem(0, f"index: {seen} sessions indexed, the events have {len(chains)}"))

    # One pass over the index: its keys sort by session number, then by kind and position.
    current: int | None = None
    entries: dict[bytes, bytes] = {}
    checked: set[int] = set()
    strays: set[int] = set()

    def settle() -> None:
        if current in indexed:
            session = indexed[current]
            checked.add(current)
            _check_session(
                session, current, entries, chains[session], notes.get(session, {}), last_of, hashes, problems
            )

    for key, value in txn.cursor(db=store.index):
        number = int.from_bytes(key[:8], "big")
        if number != current:
            settle()
            current, entries = number, {}
        if number in indexed:
            entries[bytes(key)] = bytes(value)
        elif number not in strays and len(strays) < 10:
            strays.add(number)
            problems.append(Problem(0, f"index: entries for session number {number}, which no indexed session has"))
    settle()
    for number in indexed.keys() - checked:
        problems.append(Problem(0, f"index: session {indexed[number]!r} has no state"))
    counter = txn.get(b"next_sid", db=store.meta)
    top = max(numbers.values(), default=0)
    if counter is not None and (len(counter) != SEQ.size or SEQ.unpack(counter)[0] <= top):
        problems.append(Problem(0, f"meta: the session counter is not past session number {top}, the highest in use"))
    elif counter is None and top:
        problems.append(Problem(0, "meta: the session counter is missing"))


def _check_session(
    session: str,
    number: int,
    entries: dict[bytes, bytes],
    chain: list[tuple[bytes, bytes, int, int]],
    notes: dict[int, bytes],
    last_of: dict[str, int],
    hashes: dict[int, bytes],
    problems: list[Problem],
) -> None:
    """The index entries of one session (``entries``: key -> value) against its events."""
    prefix = SEQ.pack(number)
    state_raw = entries.pop(prefix + b"h", None)
    if state_raw is None or len(state_raw) != STATE.size:
        problems.append(
            Problem(0, f"index: session {session!r} has {'no' if state_raw is None else 'a damaged'} state")
        )
        return
    state = SessionState.unpack(number, state_raw)
    head = chain[-1][0] if chain else ZERO
    if state.length != len(chain) or state.head != head:
        problems.append(Problem(0, f"index: session {session!r} length/head differ from its events"))
    elif state.last_seq != last_of.get(session):
        # A missing last event (a truncated log) shows up here too.
        problems.append(
            Problem(
                0,
                f"index: session {session!r} says its last event is {state.last_seq}, the log says {last_of.get(session)}",
            )
        )
    elif state.last_hash != hashes.get(state.last_seq):
        # The newest events are named by no later event: their session state anchors them.
        problems.append(Problem(state.last_seq, f"does not hash to what session {session!r} recorded for it"))
    expected = {prefix + b"c" + SEQ.pack(position): LINK.pack(*link) for position, link in enumerate(chain)}
    if {k: v for k, v in entries.items() if k[8:9] == b"c"} != expected:
        problems.append(Problem(0, f"index: live chain of session {session!r} differs from its events"))
    expected = {prefix + b"n" + SEQ.pack(position): note for position, note in notes.items()}
    if {k: v for k, v in entries.items() if k[8:9] == b"n"} != expected:
        problems.append(Problem(0, f"index: display overrides of session {session!r} differ from its events"))
    other = [k for k in entries if k[8:9] not in (b"c", b"n") or len(k) != 17]
    if other:
        problems.append(Problem(0, f"index: session {session!r} has {len(other)} entries of no known kind"))
