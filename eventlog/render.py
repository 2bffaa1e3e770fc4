"""What the command line and the demo print: event lines, message text, and summaries of a log.

Everything here reads :class:`~eventlog.store.Record` and message values and returns
text or plain data; nothing opens a log or writes.  ``eventlog sessions``, ``stats``,
``show``, ``history`` and ``tail`` render through it, and the demo counts with it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

from . import codec
from . import events as ev
from .interchange import function_of, tool_calls
from .keys import Record
from .replay import Occurrence
from .terminal import visible
from .text import text_of


@dataclass(slots=True)
class SessionSummary:
    """What a pass over the events says about one session."""

    session: str
    live: int = 0
    events: int = 0
    appended: int = 0
    tombstoned: Counter[str] = field(default_factory=Counter)
    forked_from: str | None = None
    fork_at: int = 0
    closed: bool = False
    first_seq: int = 0
    last_seq: int = 0
    first_ns: int = 0
    last_ns: int = 0
    fields: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "live_messages": self.live,
            "events": self.events,
            "appended": self.appended,
            "tombstoned": dict(self.tombstoned),
            "forked_from": self.forked_from,
            "fork_at": self.fork_at if self.forked_from else None,
            "closed": self.closed,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "created": iso(self.first_ns),
            "updated": iso(self.last_ns),
            "metadata": self.fields,
            "counters": self.counters,
        }


@dataclass(slots=True)
class LogSummary:
    sessions: dict[str, SessionSummary] = field(default_factory=dict)
    kinds: Counter[str] = field(default_factory=Counter)
    bodies: int = 0
    carried: int = 0
    tombstone_events: Counter[str] = field(default_factory=Counter)
    tombstoned: Counter[str] = field(default_factory=Counter)


def summarize(records: Iterable[Record]) -> LogSummary:
    """One pass over the events: per-session counts, event kinds, tombstones by reason."""
    out = LogSummary()
    sessions = out.sessions
    for record in records:
        event = record.event
        out.kinds[ev.NAMES.get(record.kind, str(record.kind))] += 1
        summary = sessions.get(event.session)
        if summary is None:
            summary = sessions[event.session] = SessionSummary(
                event.session, first_seq=record.seq, first_ns=record.time_ns
            )
        summary.events += 1
        summary.last_seq = record.seq
        summary.last_ns = record.time_ns
        match event:
            case ev.SessionOpened():
                if event.source is not None:
                    summary.forked_from = event.source
                    summary.fork_at = summary.live = event.at
            case ev.MessagesAppended():
                n = len(event)
                summary.live = event.position + n
                summary.appended += n
                out.carried += len(event.carried)
                out.bodies += n - len(event.carried)
                summary.closed = False
            case ev.MessagesTombstoned():
                summary.live = event.position
                summary.tombstoned[event.reason] += event.count
                out.tombstone_events[event.reason] += 1
                out.tombstoned[event.reason] += event.count
            case ev.SessionClosed():
                summary.closed = True
            case ev.SessionUpdated():
                summary.fields.update(event.fields)
                for key, value in event.counters.items():
                    summary.counters[key] = summary.counters.get(key, 0) + value
            case ev.MessageAnnotated() | ev.MessageRedacted():
                pass
            case _:
                assert_never(event)
    return out


def iso(ns: int) -> str | None:
    """An event time (ns since the epoch) as ISO 8601 UTC; None for 0."""
    if not ns:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns / 1e9))


def clip(text: str, width: int | None) -> str:
    """``text`` safe for a terminal (:func:`~eventlog.terminal.visible`): on one line of at most
    ``width`` characters, or (``None``) whole, its line breaks shown as indented continuation lines."""
    if width is None:
        return visible(text, newline="\n    ")
    text = visible(" ".join(text.split()))
    if len(text) > width:
        return text[: width - 1] + "…"
    return text


def columns() -> int | None:
    """The terminal's width when standard output is one (or ``COLUMNS`` says it), else None."""
    if os.environ.get("COLUMNS", "").isdigit():
        return max(20, int(os.environ["COLUMNS"]))
    if sys.stdout.isatty():
        return max(20, shutil.get_terminal_size().columns)
    return None


def fit(line: str, width: int | None) -> str:
    """``line`` cut to ``width`` characters (a one-line rendering on a terminal; None: as it is)."""
    if width is None or len(line) <= width:
        return line
    return line[: width - 1] + "…"


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural when ``n`` is not 1 ("1 session", "2 sessions")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def render_message(message: Mapping[str, Any], *, width: int | None = 160) -> str:
    """One message as readable text: role, content, tool calls and tool results.

    ``width`` clips the content to one line of that many characters (None: in full).
    """
    role = str(message.get("role") or message.get("type") or "?")
    parts = []
    text = text_of(message.get("content")) or ""
    if role == "tool":
        name = message.get("name") or message.get("tool_name")
        label = f"tool {name}" if name else "tool"
        call = message.get("tool_call_id")
        role = f"{label} ({call})" if call else label
    role = visible(role)
    if text:
        parts.append(clip(text, width))
    for call in tool_calls(message):
        function = function_of(call)
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = call.get("id", "") if isinstance(call, Mapping) else ""
        name = visible(str(function.get("name", "?")))
        parts.append(f"→ {name}({clip(arguments, 80 if width else None)}) [{visible(str(call_id))}]")
    body = "\n    ".join(parts) if width is None else "  ".join(parts)
    return f"{role}: {body}" if body else f"{role}:"


def markers(history: list[Occurrence]) -> dict[int, list[str]]:
    """Tombstone marker lines keyed by the live position they are printed before.

    A tombstone ends the live suffix from its position on; its marker goes before
    the live message now at that position (or at the end when the transcript is
    shorter now), and names the position it had, so nothing reads ambiguously.
    """
    stones: dict[int, tuple[str, int, int]] = {}  # seq -> reason, count, first position
    for occurrence in history:
        stone = occurrence.tombstone
        if stone is None:
            continue
        reason, count, first = stones.get(stone.seq, (stone.reason, 0, occurrence.position))
        stones[stone.seq] = (reason, count + 1, min(first, occurrence.position))
    live = sum(1 for o in history if o.tombstone is None)
    out: dict[int, list[str]] = {}
    for seq in sorted(stones):
        reason, count, first = stones[seq]
        noun = "message" if count == 1 else "messages"
        out.setdefault(min(first, live), []).append(
            f"  ✂ event {seq}: {count} {noun} from position {first} tombstoned ({reason})"
        )
    return out


def size(n: int) -> str:
    """A byte count for people: ``1.5 MiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def describe(record: Record) -> str:
    """One line for an event: seq, time, session, what happened."""
    event = record.event
    match event:
        case ev.SessionOpened():
            what = f"opened (fork of {event.source!r} sharing {event.at})" if event.source is not None else "opened"
        case ev.MessagesAppended():
            what = f"appended {len(event)} at {event.position}"
            if event.carried:
                what += f" ({len(event.carried)} carried)"
            if event.summaries:
                what += f" ({event.summaries} summary)"
            newest = newest_message(event)
            if newest is not None:
                what += f": {newest}"
        case ev.MessagesTombstoned():
            what = f"tombstoned {event.count} from {event.position} ({event.reason})"
        case ev.SessionClosed():
            what = f"closed ({event.reason})" if event.reason else "closed"
        case ev.SessionUpdated():
            keys = sorted([*event.fields, *event.counters])
            what = f"updated {', '.join(keys)}"
        case ev.MessageAnnotated():
            what = f"annotated position {event.position}"
        case ev.MessageRedacted():
            what = f"redacted position {event.position} ({event.reason})"
        case _:
            assert_never(event)
    stamp = time.strftime("%H:%M:%S", time.localtime(record.time_ns / 1e9))
    return f"{record.seq:>8} {stamp} {visible(event.session)} {visible(what)}"


def newest_message(event: ev.MessagesAppended) -> str | None:
    """The role and first line of the last message an append event stored (None when carried)."""
    try:
        message = codec.decode(bytes(event.bodies[-1])) if event.bodies else None
    except Exception:  # the event was checked when read; a body that does not decode shows nothing
        return None
    if not isinstance(message, dict):
        return None
    role = str(message.get("role") or message.get("type") or "?")
    text = text_of(message.get("content")) or ""
    if not text and tool_calls(message):
        text = "→ " + ", ".join(str(function_of(call).get("name", "?")) for call in tool_calls(message))
    first = text.strip().split("\n", 1)[0]
    return f"{role}: {clip(first, 80)}" if first else f"{role}:"


def event_json(record: Record) -> dict[str, Any]:
    """An event as ``eventlog tail --json`` prints it: seq, time, session, kind and its fields."""
    event = record.event
    out: dict[str, Any] = {
        "seq": record.seq,
        "time": record.time_ns,
        "session": event.session,
        "kind": ev.NAMES.get(record.kind, record.kind),
    }
    match event:
        case ev.MessagesAppended():
            out.update(position=event.position, count=len(event), carried=len(event.carried), summaries=event.summaries)
        case ev.MessagesTombstoned():
            out.update(position=event.position, count=event.count, reason=event.reason)
        case ev.SessionOpened():
            out.update(source=event.source, at=event.at)
        case ev.SessionClosed():
            out.update(reason=event.reason)
        case ev.SessionUpdated():
            out.update(fields=event.fields, counters=event.counters)
        case ev.MessageAnnotated():
            out.update(position=event.position)
        case ev.MessageRedacted():
            out.update(
                position=event.position,
                body_seq=event.body_seq,
                body_index=event.body_index,
                reason=event.reason,
                by=event.by,
            )
        case _:
            assert_never(event)
    return out
