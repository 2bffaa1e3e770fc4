"""``eventlog demo``: a scripted agent session that exercises the whole product.

:func:`run_demo` plays a deterministic agent loop (a research assistant that calls
tools) of a few hundred messages against a fresh log and records what each step
did in a :class:`DemoReport`:

1. every turn the loop flushes its whole message list from several exit paths
   (end of turn, interrupt handler, autosave, shutdown); only new messages are
   written, never one twice, and loop scaffolding is never stored;
2. a stored tool result is redacted in place, which the next flush records as an
   ``edit`` tombstone;
3. the user undoes the last turns (a ``rewind`` tombstone) and the loop goes on;
4. the early conversation is replaced by a summary (a ``compaction`` tombstone);
5. a branch is forked to try another answer;
6. the loop "crashes" in the middle of a tool call and resumes with repaired
   tool calls;
7. the log is projected to SQLite (when the projection package is available) and
   searched;
8. the leaked key is erased for good (``log.redact``): afterwards its bytes are in no
   file of the log or the projection, and the log verifies.

Everything but event timestamps is deterministic: the same run gives the same
node digests on any machine.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .log import EventLog
from .render import summarize

MAIN = "demo-main"
BRANCH = "demo-branch"
MARKER = ".eventlog-demo"
"""File that marks a directory as demo output, so a re-run may clear it."""

EXIT_PATHS = ("end_of_turn", "interrupt_handler", "autosave", "shutdown")

TOPICS = [
    ("LMDB", "memory-mapped B+tree key-value store"),
    ("SQLite WAL", "write-ahead log journal mode"),
    ("fsync", "system call that flushes file data to stable storage"),
    ("SHA-256", "cryptographic hash function with a 256-bit digest"),
    ("MessagePack", "compact binary serialisation format"),
    ("FTS5", "SQLite full-text search extension"),
    ("copy-on-write", "technique that never overwrites live pages"),
    ("Merkle tree", "tree of hashes where each node commits to its children"),
    ("event sourcing", "storing state changes as an append-only sequence of events"),
    ("tombstone", "record that marks data as removed without deleting it"),
    ("group commit", "batching several transactions into one disk flush"),
    ("page cache", "kernel memory holding recently used file pages"),
]

SECRET = "sk-demo-0000-SECRET"


@dataclass(slots=True)
class DemoReport:
    """What :func:`run_demo` did, step by step, with the counts it observed."""

    path: str
    log_path: str
    db_path: str
    durability: str
    turns: int = 0
    """Every turn played, those after the rewind included."""
    turns_after_rewind: int = 0
    flushes: int = 0
    exit_paths: tuple[str, ...] = EXIT_PATHS
    distinct: int = 0
    """Messages the loop created (scaffolding aside): what should be written, once each."""
    offered: int = 0
    """Messages handed to flush in total (the same message is offered again and again)."""
    appended: int = 0
    """Messages the flushes actually wrote."""
    noop_flushes: int = 0
    """Flushes that found nothing new (no write transaction, no fsync)."""
    scaffolding_dropped: int = 0
    stored_live: int = 0
    """Length of the main session's live transcript before the edit."""
    edit: dict[str, int] = field(default_factory=dict)
    rewind: dict[str, int] = field(default_factory=dict)
    compaction: dict[str, int] = field(default_factory=dict)
    fork: dict[str, int] = field(default_factory=dict)
    resume: dict[str, int] = field(default_factory=dict)
    projection: dict[str, Any] = field(default_factory=dict)
    redaction: dict[str, Any] = field(default_factory=dict)
    verify_ok: bool = False
    verify_text: str = ""
    events: int = 0
    sessions: list[str] = field(default_factory=list)
    live_messages: dict[str, int] = field(default_factory=dict)
    head: str = ""
    """The main session's final head node digest: identical on every run."""
    seconds: float = 0.0

    def lines(self) -> list[str]:
        """The report as plain text lines."""
        out = [
            f"eventlog demo: a scripted agent session in {self.path} (durability {self.durability!r})",
            "",
            f"1. {self.turns} agent turns with tool calls ({self.turns - self.turns_after_rewind} played first, and"
            f" {self.turns_after_rewind} more after the rewind of step 3).",
            f"   The loop flushed its whole message list from {len(self.exit_paths)} exit paths",
            f"   ({', '.join(self.exit_paths)}): {self.flushes} flushes, {self.offered} messages offered.",
            f"   {self.distinct} distinct messages entered the list; {self.appended} were written, each exactly once.",
            f"   {self.noop_flushes} flushes found nothing new and wrote nothing (no write transaction, no fsync).",
            f"   {self.scaffolding_dropped} scaffolding messages (_thinking_prefill) were never stored.",
            f"2. A stored tool result that leaked an API key was edited in place to hide it (position {self.edit['position']})."
            f" The flush tombstoned {self.edit['tombstoned']}",
            f"   message(s) from there (reason 'edit') and appended {self.edit['appended']}; {self.edit['carried']} of them were"
            " carried, bodies not stored again",
            "   (their node digests changed because their parent did). The leaked text stayed in the log, tombstoned,"
            " until step 8.",
            f"3. The user undid the last {self.rewind['tombstoned']} messages: a 'rewind' tombstone;"
            f" the conversation went on with {self.rewind['appended_after']} new messages.",
            f"4. Messages 1..{self.compaction['end'] - 1} were replaced by one summary: a 'compaction' tombstone ended"
            f" {self.compaction['tombstoned']} live messages and the last {self.compaction['carried']} came back after the"
            " summary without storing their bodies again.",
            f"5. Forked {BRANCH!r} from {MAIN!r} at position {self.fork['at']} and gave it another ending"
            f" ({self.fork['appended']} new messages; the shared prefix is not copied).",
            f"6. The loop crashed inside a tool call; resuming with repair_tool_calls=True added"
            f" {self.resume['repaired']} synthetic tool result(s) without changing the log.",
        ]
        if self.projection.get("available"):
            out.append(
                f"7. Projected {self.projection['events']} events to SQLite in {self.projection['seconds']:.2f}s;"
                f" full-text search for {self.projection['query']!r} found {self.projection['hits']}"
                f" {'message' if self.projection['hits'] == 1 else 'messages'} in the log."
            )
        else:
            out.append(f"7. SQLite projection skipped: {self.projection.get('reason', 'not available')}.")
        out.append(
            f"8. The leaked key was erased for good (log.redact of the tombstoned tool result, event"
            f" {self.redaction['seq']}): {self.redaction['events_rewritten']} events rewritten, the data file"
            f" replaced by a compacting copy; files holding the key afterwards: {self.redaction['files_holding']}."
        )
        out += [
            f"9. verify: {self.verify_text}",
            "",
            f"The log holds {self.events} events in {len(self.sessions)} sessions: "
            + ", ".join(f"{s} ({self.live_messages[s]} live messages)" for s in self.sessions)
            + ".",
            f"Head of {MAIN!r}: {self.head} (the same on every run).",
            f"Done in {self.seconds:.1f}s.",
            "",
            "Where to look next:",
            f"  eventlog --log {self.log_path} sessions",
            f"  eventlog --log {self.log_path} show {MAIN}",
            f"  eventlog --log {self.log_path} history {MAIN}",
        ]
        if self.projection.get("available"):
            out += [
                f"  eventlog --log {self.log_path} search {self.projection['query']!r}"
                + (f" --limit {self.projection['hits']}" if self.projection["hits"] > 20 else ""),
                f"  sqlite3 {self.db_path} \"select position, role, substr(content, 1, 60) from live_messages where session_id = '{MAIN}'\"",
            ]
        out += [
            f"  eventlog --log {self.log_path} stats",
            "  docs/quickstart.md, docs/concepts.md, docs/integration.md",
        ]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def prepare_directory(path: Path) -> None:
    """Make ``path`` an empty demo directory; refuse to clear one the demo did not create."""
    if path.exists():
        if not path.is_dir():
            raise FileExistsError(f"{path} exists and is not a directory")
        if any(path.iterdir()) and not (path / MARKER).exists():
            raise FileExistsError(f"{path} is not empty and was not made by 'eventlog demo'; choose another --path")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by 'eventlog demo'; safe to delete\n")


class _Agent:
    """The scripted loop: builds turns and flushes from its exit paths, counting what happens."""

    def __init__(self, log: EventLog, report: DemoReport, leak_turn: int) -> None:
        self.log = log
        self.leak_turn = leak_turn
        self.report = report
        self.messages: list[dict[str, Any]] = [
            {
                "role": "system",
                "content": "You are a research assistant. Use tools to look things up; cite what you find.",
            }
        ]
        self.calls = 0
        report.distinct += len(self.messages)

    def flush(self, exit_path: str) -> None:
        result = self.log.flush(MAIN, self.messages)
        report = self.report
        report.flushes += 1
        report.offered += len(self.messages)
        report.appended += result.appended
        if result.appended == 0 and result.tombstoned == 0:
            report.noop_flushes += 1
        assert exit_path in EXIT_PATHS

    def add(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        self.report.distinct += 1

    def call_id(self) -> str:
        self.calls += 1
        return f"call_{self.calls:04d}"

    def turn(self, number: int) -> None:
        topic, meaning = TOPICS[number % len(TOPICS)]
        self.add(
            {"role": "user", "content": f"Question {number}: what is {topic}, and why does it matter for durable logs?"}
        )
        # Loop scaffolding: inserted for the loop's own recovery, removed again; never stored.
        scaffold = {"role": "assistant", "content": "", "_thinking_prefill": True}
        self.messages.append(scaffold)
        self.flush("autosave")
        self.report.scaffolding_dropped += 1
        self.messages.remove(scaffold)
        lookup, calc = self.call_id(), self.call_id()
        self.add(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": lookup,
                        "type": "function",
                        "function": {"name": "search_docs", "arguments": f'{{"query": "{topic}"}}'},
                    },
                    {
                        "id": calc,
                        "type": "function",
                        "function": {"name": "calculator", "arguments": f'{{"expression": "{number} * 4096"}}'},
                    },
                ],
            }
        )
        result = f"{topic}: {meaning}. (source: handbook, section {number % 7 + 1})"
        if number == self.leak_turn:
            result += f" Debug header: Authorization: Bearer {SECRET}"
        self.add({"role": "tool", "tool_call_id": lookup, "name": "search_docs", "content": result})
        self.add({"role": "tool", "tool_call_id": calc, "name": "calculator", "content": str(number * 4096)})
        self.add(
            {
                "role": "assistant",
                "content": f"{topic} is a {meaning}. It matters because a log must never lose or duplicate a turn; "
                f"page {number * 4096} of the handbook has the details.",
                "finish_reason": "stop",
            }
        )
        self.flush("end_of_turn")
        if number % 3 == 0:
            self.flush("interrupt_handler")  # Ctrl-C arrived just after the turn ended
        if number % 5 == 0:
            self.flush("shutdown")
        self.report.turns += 1


def run_demo(
    path: str | os.PathLike[str] = "eventlog-demo",
    *,
    turns: int = 60,
    durability: str = "full",
    say: Callable[[str], None] | None = None,
) -> DemoReport:
    """Run the scripted session into directory ``path`` (cleared first if the demo made it).

    ``turns`` (at least 10) is how many turns are played before the edit.  The log goes to ``path/log`` and the SQLite projection to ``path/log.sqlite``.
    ``say`` receives a line as each step starts (for progress output).  Returns the
    :class:`DemoReport`.  Raises ``FileExistsError`` if ``path`` holds anything the demo
    did not create.
    """
    if turns < 10:
        raise ValueError(f"the demo needs at least 10 turns, not {turns}")
    started = time.perf_counter()
    say = say or (lambda line: None)
    root = Path(path)
    prepare_directory(root)
    log_path, db_path = root / "log", root / "log.sqlite"
    report = DemoReport(str(root), str(log_path), str(db_path), durability)

    with EventLog.open(log_path, durability=durability) as log:
        agent = _Agent(log, report, leak_turn=max(1, turns - 6))
        log.update_session(MAIN, title="Research assistant demo", model="scripted-model-1")

        say(f"playing {turns} turns, flushing from {len(EXIT_PATHS)} exit paths")
        for number in range(1, turns + 1):
            agent.turn(number)
            log.update_session(MAIN, input_tokens=900 + number, output_tokens=120, api_calls=2, tool_calls=2)
        report.stored_live = len(log.messages(MAIN))

        say("hiding a leaked key in a stored tool result (in-place edit)")
        position = next(i for i, m in enumerate(agent.messages) if SECRET in str(m.get("content")))
        agent.messages[position]["content"] = agent.messages[position]["content"].replace(SECRET, "[REDACTED]")
        before_seq = log.last_seq
        edited = log.flush(MAIN, agent.messages)
        report.edit = {
            "position": position,
            "tombstoned": edited.tombstoned,
            "appended": edited.appended,
            "carried": summarize(log.events(after=before_seq)).carried,
        }

        say("undoing the last two turns (rewind)")
        before = len(agent.messages)
        del agent.messages[-10:]
        rewound = log.flush(MAIN, agent.messages)
        assert rewound.tombstoned == before - len(agent.messages)
        kept = len(agent.messages)
        for number in range(turns + 1, turns + 3):
            agent.turn(number)
            report.turns_after_rewind += 1
        report.rewind = {"tombstoned": rewound.tombstoned, "appended_after": len(agent.messages) - kept}

        say("compacting the early conversation into a summary")
        end = len(agent.messages) - 40
        summary = {
            "role": "user",
            "content": f"[Summary of the first {end - 1} messages] The user asked about {len(TOPICS)} storage topics; "
            "the assistant looked each up with search_docs and calculator and answered with citations.",
            "_compressed_summary": True,
        }
        agent.messages = [agent.messages[0], summary, *agent.messages[end:]]
        before_seq = log.last_seq
        compacted = log.flush(MAIN, agent.messages)
        report.compaction = {
            "end": end,
            "tombstoned": compacted.tombstoned,
            "carried": summarize(log.events(after=before_seq)).carried,
        }

        say("forking a branch to try another answer")
        at = len(agent.messages) - 1
        log.fork(MAIN, BRANCH, at=at)
        branch = log.messages(BRANCH)
        branch.append(
            {
                "role": "assistant",
                "content": "Another way to put it: durability is a promise about what survives a crash.",
                "finish_reason": "stop",
            }
        )
        branch.append({"role": "user", "content": "That is clearer, thanks."})
        forked = log.flush(BRANCH, branch)
        log.close_session(BRANCH, reason="user_exit")
        report.fork = {"at": at, "appended": forked.appended}

        say("crashing inside a tool call, then resuming")
        pending = agent.call_id()
        agent.messages.append({"role": "user", "content": "One more: how big is the log now?"})
        agent.messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": pending, "type": "function", "function": {"name": "disk_usage", "arguments": "{}"}}
                ],
            }
        )
        log.flush(MAIN, agent.messages)  # the error exit path, just before the process dies
        stored = log.messages(MAIN)
        resumed = log.messages(MAIN, repair_tool_calls=True)
        report.resume = {"stored": len(stored), "repaired": len(resumed) - len(stored)}

        say("projecting to SQLite")
        report.projection = _project(log, db_path)

        say("erasing the leaked key for good (redaction)")
        leaked = next(o for o in log.history(MAIN) if SECRET in str(o.message.get("content")))
        before_seq = log.last_seq
        log.redact(MAIN, leaked.position, seq=leaked.seq, reason="an API key leaked into a tool result", by="demo")
        if report.projection.get("available"):
            report.projection = _project(log, db_path)  # it rebuilds itself without the key
        report.redaction = {
            "position": leaked.position,
            "seq": leaked.seq,
            "events_rewritten": before_seq - leaked.source[0] + 1,
            "files_holding": sum(1 for f in root.rglob("*") if f.is_file() and SECRET.encode() in f.read_bytes()),
        }

        say("verifying every digest and the hash chain")
        verified = log.verify()
        report.verify_ok = verified.ok
        report.verify_text = str(verified)
        report.events = log.last_seq
        report.sessions = log.sessions()
        report.live_messages = {s: len(log.messages(s)) for s in report.sessions}
        report.head = log.head(MAIN) or ""
    report.seconds = time.perf_counter() - started
    return report


def _project(log: EventLog, db_path: Path) -> dict[str, Any]:
    try:
        from projections import SQLiteProjection
    except ImportError as e:
        return {"available": False, "reason": f"the projections package is not available ({e})"}
    started = time.perf_counter()
    projection = SQLiteProjection(db_path)
    try:
        projection.catch_up(log)
        seconds = time.perf_counter() - started
        query = "tombstone"
        hits = projection.search(query, limit=1_000_000)  # every session, as `eventlog search` below
        return {"available": True, "events": log.last_seq, "seconds": seconds, "query": query, "hits": len(hits)}
    finally:
        projection.close()
