"""An opt-in fallback so that a turn is never lost when the log cannot be written at all.

:class:`SpillingWriter` wraps an :class:`~eventlog.EventLog`: its :meth:`~SpillingWriter.flush`
flushes into the log, and when the *storage* refuses (disk or map full, read-only
file system, damaged or unreachable files) it writes the caller's list to a spill
file instead and reports that it did.  Errors that are the caller's (bad messages,
a conflicting head, a list that does not match the stored history) are raised as
usual: spilling them would only postpone the same refusal.

A spill file is JSON Lines in a directory of the caller's choosing (ideally on
another file system than the log): a header ``{"session": id, "messages": n,
"replace": bool, "base": head}`` (``base``: the session's stored head when the list
was spilled, absent when the log could not be read), then one line per message of
the flushed list, ``{"session": id, "index": i, "message": {...}}``, with
``"summary": true`` for a compaction summary and ``"override": {...}`` for a display
override.  An empty list (a clear) is a header alone.  A flush is a snapshot of the whole transcript, so a spill file holds
the latest list and is replaced atomically (write, fsync, rename).  File names
are the session id made path-safe plus a hash of the exact id, so two ids never
share a file and no id can name a path outside the directory.

:func:`recover` folds spill files back into the log with ordinary, idempotent
flushes: a recovery interrupted at any point is simply run again, and nothing is
written twice.  While the session's head is still the recorded ``base``, the list
is flushed exactly as the refused flush would have been (a rewind, an edit, a
compaction and a clear included).  Once the log has moved on, a list the log
already holds (or a prefix of it grown from ``base``) is removed without writing,
and one that would undo newer history is kept and reported, never applied.

>>> import tempfile, os
>>> from eventlog import EventLog
>>> from eventlog.spill import SpillingWriter, recover
>>> with tempfile.TemporaryDirectory() as tmp, EventLog.open(os.path.join(tmp, "log")) as log:
...     writer = SpillingWriter(log, os.path.join(tmp, "spill"))
...     writer.flush("chat", [{"role": "user", "content": "hi"}]).spilled
...     recover(log, os.path.join(tmp, "spill")).recovered
False
[]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from . import codec
from .errors import (
    ConflictError,
    CorruptLogError,
    EventLogError,
    HistoryMismatchError,
    InvalidMessageError,
    ReadOnlyError,
    StorageFullError,
    UnknownSessionError,
)
from .files import check_private_directory, write_atomic
from .log import SUMMARY_KEY, EventLog, FlushResult, check_session_id
from .snapshot import is_ephemeral

SUFFIX = ".jsonl"

CALLER_ERRORS = (InvalidMessageError, ConflictError, HistoryMismatchError, UnknownSessionError)
"""Errors about the caller's input, raised as they are: a spill would fail the same way later."""


def spill_name(session_id: str) -> str:
    """The spill file name of ``session_id``: path-safe, and distinct for distinct ids.

    Unsafe characters become ``_`` and the readable part is cut to 60 characters;
    the first 20 hex digits of SHA-256 of the exact id keep distinct ids apart.

    >>> spill_name("../../etc/passwd")[:11]
    'etc_passwd-'
    """
    check_session_id(session_id)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", session_id).strip("._-")[:60] or "session"
    digest = sha256(session_id.encode("utf-8")).hexdigest()[:20]
    return f"{readable}-{digest}{SUFFIX}"


@dataclass(frozen=True, slots=True)
class SpillResult:
    """What :meth:`SpillingWriter.flush` did.

    ``spilled`` is True when the log refused the write and the list went to
    ``path``; then ``error`` is the log's error and ``result`` is None.  Otherwise
    ``result`` is the log's :class:`~eventlog.FlushResult`.
    """

    spilled: bool
    result: FlushResult | None = None
    path: Path | None = None
    error: EventLogError | None = None


class SpillingWriter:
    """Flushes into ``log``, spilling to ``spill_dir`` when the storage refuses the write.

    ``ephemeral`` must be the rule the log was opened with (scaffolding is not
    spilled, as it is not stored).  After a successful flush of a session that this
    writer spilled, its spill file is removed: the log now holds the newer list.
    """

    def __init__(
        self,
        log: EventLog,
        spill_dir: str | os.PathLike[str],
        *,
        ephemeral: Callable[[Any], bool] = is_ephemeral,
        allow_shared_directory: bool = False,
    ) -> None:
        self.log = log
        self.spill_dir = Path(spill_dir)
        self._ephemeral = ephemeral
        self._allow_shared = allow_shared_directory
        self._spilled: set[str] = set()

    def flush(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        overrides: Mapping[int, Mapping[str, Any]] | None = None,
        replace: bool = False,
    ) -> SpillResult:
        """:meth:`EventLog.flush` ``messages``; spill them when the log cannot be written.

        Raises the log's error for bad input or a history mismatch, and
        :class:`OSError` (with the log's error as its cause) when the spill file
        cannot be written either.
        """
        check_session_id(session_id)
        try:
            result = self.log.flush(session_id, messages, overrides=overrides, replace=replace)
        except CALLER_ERRORS:
            raise
        except (StorageFullError, ReadOnlyError, CorruptLogError, EventLogError, OSError) as e:
            error = e if isinstance(e, EventLogError) else EventLogError(str(e))
            lines = self._lines(session_id, messages, overrides, replace, self._head(session_id))
            try:
                path = write_spill(self.spill_dir, session_id, lines, allow_shared_directory=self._allow_shared)
            except OSError as spill_error:
                raise spill_error from e
            self._spilled.add(session_id)
            return SpillResult(True, None, path, error)
        if session_id in self._spilled:
            self._spilled.discard(session_id)
            (self.spill_dir / spill_name(session_id)).unlink(missing_ok=True)
        return SpillResult(False, result)

    def _head(self, session_id: str) -> str | None:
        """The stored head when the log can still be read (a full disk usually can), else None."""
        try:
            return self.log.head(session_id) or ""
        except (EventLogError, OSError):
            return None

    def _lines(
        self,
        session_id: str,
        messages: Sequence[Mapping[str, Any]],
        overrides: Mapping[int, Mapping[str, Any]] | None,
        replace: bool,
        base: str | None,
    ) -> list[dict[str, Any]]:
        body_lines: list[dict[str, Any]] = []
        for index, message in enumerate(messages):
            if self._ephemeral(message):
                continue
            body = codec.strip(message)
            codec.check(body, index)  # the log validated it already unless the log was unreachable
            line: dict[str, Any] = {"session": session_id, "index": len(body_lines), "message": body}
            if isinstance(message, Mapping) and message.get(SUMMARY_KEY):
                line["summary"] = True
            if overrides and index in overrides:
                line["override"] = codec.strip(overrides[index])
            body_lines.append(line)
        # The header comes first, so that an empty list (a clear) is a whole spill too.
        header: dict[str, Any] = {"session": session_id, "messages": len(body_lines), "replace": replace}
        if base is not None:
            header["base"] = base  # the stored head the list was meant to replace
        return [header, *body_lines]


def write_spill(
    spill_dir: str | os.PathLike[str],
    session_id: str,
    lines: list[dict[str, Any]],
    *,
    allow_shared_directory: bool = False,
) -> Path:
    """Atomically replace ``session_id``'s spill file with ``lines`` (see :func:`~eventlog.files.write_atomic`).

    The temporary file has an unguessable name and is created exclusively, and the rename
    replaces a link rather than following it.  A directory other users can write is
    refused (:class:`~eventlog.errors.UnsafeDirectoryError`) unless
    ``allow_shared_directory``: its other users could plant spill files that
    :func:`recover` would write into the log.
    """
    directory = Path(spill_dir)
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_directory(directory, what="spill", allow_shared=allow_shared_directory)
    target = directory / spill_name(session_id)
    chunks = (
        (json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")
        for line in lines
    )
    write_atomic(target, chunks, mode=0o600)  # a transcript: readable by its owner only
    return target


@dataclass(slots=True)
class RecoveryReport:
    """What :func:`recover` did: sessions written back, already present, and kept with why."""

    recovered: list[str] = field(default_factory=list)
    already_stored: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    """Spill file name -> why it was left in place."""
    appended: int = 0

    @property
    def ok(self) -> bool:
        return not self.kept


def read_spill(
    path: str | os.PathLike[str],
) -> tuple[str, list[dict[str, Any]], dict[int, dict[str, Any]], bool, str | None]:
    """Parse a spill file: ``(session_id, messages, overrides, replace, base)``.

    ``base`` is the session's stored head when the list was spilled ("" for an
    empty or new session, None when the log could not be read then).

    The first line is a header (session, number of messages, ``replace``, ``base``);
    one line per message follows.  Files written before the header existed carry
    ``replace`` and ``base`` on their first message line and are read as well.
    Summary lines get their ``_compressed_summary`` flag back so the flush records
    a compaction.  Raises :class:`ValueError` for a file that is not a whole spill.
    """
    session_id: str | None = None
    messages: list[dict[str, Any]] = []
    overrides: dict[int, dict[str, Any]] = {}
    replace = False
    base: str | None = None
    count: int | None = None
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f):
            if not text.endswith("\n"):
                raise ValueError(f"{path}: line {number + 1} is cut short")
            line = json.loads(text)
            if not isinstance(line, dict) or not isinstance(line.get("session"), str):
                raise ValueError(f"{path}: line {number + 1} is not a spill line")
            if session_id is None:
                session_id = line["session"]
                base = line.get("base")
                replace = bool(line.get("replace"))
                if "message" not in line:  # the header
                    count = line["messages"]
                    if not isinstance(count, int) or count < 0:
                        raise ValueError(f"{path}: the header's message count is {count!r}")
                    continue
            if line["session"] != session_id or line["index"] != len(messages) or not isinstance(line["message"], dict):
                raise ValueError(f"{path}: line {number + 1} does not continue the spill")
            message = dict(line["message"])
            if line.get("summary"):
                message[SUMMARY_KEY] = True
            if "override" in line:
                overrides[len(messages)] = line["override"]
            replace = replace or bool(line.get("replace"))
            messages.append(message)
    if session_id is None:
        raise ValueError(f"{path}: empty spill file")
    if count is not None and count != len(messages):
        raise ValueError(f"{path}: the header announces {count} messages, the file holds {len(messages)}")
    if base is not None and not isinstance(base, str):
        raise ValueError(f"{path}: base {base!r} is not a head")
    return session_id, messages, overrides, replace, base


def recover(
    log: EventLog, spill_dir: str | os.PathLike[str], *, allow_shared_directory: bool = False
) -> RecoveryReport:
    """Fold every spill file in ``spill_dir`` back into ``log``, without duplicates.

    A spill records the session's head at spill time (its ``base``).  While the
    session's head is still that one, the spilled list is flushed exactly as the
    refused flush would have been: an extension appends, a rewind, an edit, a
    compaction or a clear (``replace``) tombstones as it would have, and an
    unchanged list writes nothing.  Once the log has moved on, a spill is applied
    only where that cannot undo newer history: a list that the log now holds, or
    a prefix of it that extended the old head, is removed without writing; a list
    that extends what the log holds now, grown from the old head, is flushed.
    Anything else (a rewind or an edit the log has since gone past, a list that
    diverges from newer history, one whose old head is unknown and that would
    tombstone) is kept and reported in :attr:`RecoveryReport.kept`, never applied
    over newer history.  Each file is removed once its list is in the log, so an
    interrupted recovery is simply run again.  Errors of the log itself are raised, and
    :class:`~eventlog.errors.UnsafeDirectoryError` for a directory other users can write
    (unless ``allow_shared_directory``).
    """
    report = RecoveryReport()
    directory = Path(spill_dir)
    if not directory.is_dir():
        return report
    # Whoever can write the directory decides what is written into the log: refuse others.
    check_private_directory(directory, what="spill", allow_shared=allow_shared_directory)
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            session_id, messages, overrides, replace, base = read_spill(path)
        except (ValueError, KeyError, TypeError) as e:
            report.kept[path.name] = f"unreadable: {e}"
            continue
        if path.name != spill_name(session_id):
            report.kept[path.name] = f"names session {session_id!r}, whose spill file is {spill_name(session_id)}"
            continue
        why = _recover_one(log, session_id, messages, overrides, replace, base, report)
        if why is not None:
            report.kept[path.name] = why
            continue
        path.unlink()
    return report


def _recover_one(
    log: EventLog,
    session_id: str,
    messages: list[dict[str, Any]],
    overrides: dict[int, dict[str, Any]],
    replace: bool,
    base: str | None,
    report: RecoveryReport,
) -> str | None:
    """Apply one spilled list as :func:`recover` describes; the reason it was kept, or None."""
    head = log.head(session_id) or ""
    if base is not None and base == head:  # the log has not moved: do what the refused flush would have
        return _flush(log, session_id, messages, overrides, replace, report)
    wanted = _chain(messages)
    have = _chain(log.messages(session_id) if head else [])
    grown_from_base = base is None or base == "" or base in wanted
    if wanted == have:
        return _flush(log, session_id, messages, overrides, replace, report)  # only overrides can be new
    if wanted[: len(have)] == have and (base is None or base == "" or base in have):
        return _flush(log, session_id, messages, overrides, replace, report)  # extends the log, grown from base
    if have[: len(wanted)] == wanted and wanted and grown_from_base and base is not None and not overrides:
        report.already_stored.append(session_id)  # the log took this list, and more, after the spill
        return None
    return (
        f"session {session_id!r} changed after the spill (its head was {base or 'unknown'}, now {head or 'empty'}); "
        f"the spilled list of {len(wanted)} messages would undo some of its {len(have)}: flush it yourself to decide"
    )


def _flush(
    log: EventLog,
    session_id: str,
    messages: list[dict[str, Any]],
    overrides: dict[int, dict[str, Any]],
    replace: bool,
    report: RecoveryReport,
) -> str | None:
    try:
        result = log.flush(session_id, messages, overrides=overrides or None, replace=replace)
    except HistoryMismatchError as e:  # the refused flush would have been refused for this too
        return f"the spilled list does not continue session {session_id!r} and was not a replacement: {e}"
    if result.appended or result.tombstoned:
        report.appended += result.appended
        report.recovered.append(session_id)
    else:
        report.already_stored.append(session_id)
    return None


def _chain(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The node digests (hex) of ``messages`` as a transcript, scaffolding already dropped."""
    nodes: list[str] = []
    parent = codec.ZERO
    for index, message in enumerate(messages):
        parent = codec.node_digest(parent, codec.content_digest(codec.canonical(codec.strip(message), index)))
        nodes.append(parent.hex())
    return nodes


__all__ = ["RecoveryReport", "SpillResult", "SpillingWriter", "read_spill", "recover", "spill_name", "write_spill"]


def scrub(spill_dir: str | os.PathLike[str], digest: bytes, *, allow_shared_directory: bool = False) -> list[Path]:
    """Erase from every spill file in ``spill_dir`` the messages whose content digest is ``digest``.

    Part of a redaction (:meth:`EventLog.redact <eventlog.EventLog.redact>` with ``spill_dir``):
    each such message becomes its placeholder (:func:`eventlog.redact.placeholder`) and
    loses its display override; the file is replaced atomically, so a recovery later flushes
    the placeholder, which the log holds already.  Returns the files rewritten.  A file that
    is not a whole spill is left alone (recovery reports it).
    """
    from .redact import placeholder

    directory = Path(spill_dir)
    if not directory.is_dir():
        return []
    check_private_directory(directory, what="spill", allow_shared=allow_shared_directory)
    rewritten = []
    for path in sorted(directory.glob("*" + SUFFIX)):
        try:
            with open(path, encoding="utf-8") as f:
                lines = [json.loads(text) for text in f]
        except (OSError, ValueError):
            continue
        changed = False
        for line in lines:
            message = line.get("message") if isinstance(line, dict) else None
            if not isinstance(message, dict):
                continue
            try:
                found = sha256(codec.encode(codec.strip(message))).digest()
            except Exception:  # not a message the log could have stored
                continue
            if found == digest:
                line["message"] = placeholder(message)
                line.pop("override", None)
                changed = True
        if changed:
            chunks = (
                (json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":")) + "\n").encode("utf-8")
                for line in lines
            )
            write_atomic(path, chunks, mode=0o600)
            rewritten.append(path)
    return rewritten
