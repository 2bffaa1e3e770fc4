"""The ``eventlog`` command: look into, check, project, import and export a log.

Every command finds the log at ``--log PATH``, else ``$EVENTLOG_PATH``, else
``./eventlog-data``.  Commands that only read never create a log.  Errors are one
line on stderr and exit status 1; ``verify`` exits 1 when the log is not intact;
usage errors exit 2.  ``python -m eventlog.cli`` is the same command.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import codec, render
from .errors import ConflictError, CorruptLogError, EventLogError, UnknownSessionError
from .files import write_atomic
from .interchange import FORMATS, export_lines, read_jsonl
from .log import EMPTY_HEAD, EventLog
from .snapshot import is_ephemeral
from .store import Record
from .terminal import visible
from .verify import LogHead

DEFAULT_LOG = "eventlog-data"
"""Where the log lives when neither ``--log`` nor ``EVENTLOG_PATH`` says."""

DEFAULT_DEMO = "eventlog-demo"

HELP_WIDTH = 100
"""Help text is wrapped at this width everywhere, so that ``docs/cli.md`` can match it."""


@dataclass(slots=True)
class Settings:
    log_path: str
    written: str = "nothing was written (this command only reads)"
    """What an interrupt (Ctrl-C) leaves behind; a command that writes keeps it current."""


def _settings() -> Settings:
    return click.get_current_context().find_object(Settings)  # type: ignore[return-value]


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)


class _Group(click.Group):
    """Turns the errors a user can act on into one line and exit status 1, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            settings = ctx.find_object(Settings)
            written = settings.written if settings is not None else "nothing was written"
            click.echo(f"\nAborted: {written}.", err=True)
            sys.exit(130)
        except (click.ClickException, click.exceptions.Exit, click.Abort, BrokenPipeError):
            raise
        except UnknownSessionError as e:
            _fail(str(e))
        except CorruptLogError as e:
            text = _one_line(e).replace(" (run verify)", "")
            _fail(f"{text}; run 'eventlog verify' to check the whole log and name every damaged event")
        except EventLogError as e:
            from projections.errors import LogMismatchError, NotAProjectionError

            if isinstance(e, NotAProjectionError):
                _fail(f"{e.path}: {e.what}; give another DB, or run 'eventlog rebuild --force {e.path}' to replace it")
            if isinstance(e, LogMismatchError):
                _fail(f"{_one_line(e).split(';')[0]}; give another DB, or run 'eventlog rebuild DB' to replace it")
            _fail(_one_line(e))
        except (OSError, ValueError) as e:
            _fail(_one_line(e))


def _one_line(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return " ".join(text.split())


def _stdout() -> Console:
    # Created per call: click's test runner swaps sys.stdout.  Wide and without
    # highlighting, so transcripts print as written.
    return Console(file=sys.stdout, highlight=False, width=None if sys.stdout.isatty() else 200)


def _stderr() -> Console:
    return Console(file=sys.stderr, highlight=False)


def _progress() -> Progress:
    """A progress bar on stderr, shown only when stderr is a terminal (scripts see none)."""
    console = _stderr()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
        disable=not console.is_terminal,
    )


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _open_log(*, write: bool = False, durability: str = "full") -> EventLog:
    """Open the configured log; read-only unless ``write`` (which may create it)."""
    path = _settings().log_path
    if not write and not os.path.isfile(os.path.join(path, "data.mdb")):
        _fail(f"no event log at {path} (give --log PATH or set EVENTLOG_PATH)")
    return EventLog.open(path, readonly=not write, durability=durability)


def _require_session(log: EventLog, session_id: str) -> None:
    if session_id not in log:
        known = log.sessions()
        hint = (
            f"; sessions: {', '.join(known[:5])}{' ...' if len(known) > 5 else ''}"
            if known
            else "; the log has no sessions"
        )
        _fail(f"no session {session_id!r} in {log.path}{hint}")


def _default_db(log_path: str) -> str:
    return os.path.normpath(log_path) + ".sqlite"


# -- the group ----------------------------------------------------------------


@click.group(
    cls=_Group,
    invoke_without_command=True,
    subcommand_metavar="[COMMAND] [ARGS]...",
    context_settings={
        "help_option_names": ["-h", "--help"],
        "max_content_width": HELP_WIDTH,
        "terminal_width": HELP_WIDTH,
    },
)
@click.option(
    "--log",
    "log_path",
    envvar="EVENTLOG_PATH",
    default=DEFAULT_LOG,
    show_default=True,
    metavar="PATH",
    help="The log directory (else $EVENTLOG_PATH).",
)
@click.version_option(package_name="agent-eventlog", prog_name="eventlog")
@click.pass_context
def cli(ctx: click.Context, log_path: str) -> None:
    """A durable, content-addressed transcript log for AI agents.

    Look into a log, check it, project it to SQLite, move transcripts in and out.
    Commands that only read never create a log. Start with `eventlog demo`.
    """
    ctx.obj = Settings(log_path)
    if ctx.invoked_subcommand is None:  # bare `eventlog`: the help, and success
        click.echo(ctx.get_help())
        ctx.exit(0)


# -- demo ---------------------------------------------------------------------


@cli.command()
@click.option(
    "--path",
    "path",
    default=DEFAULT_DEMO,
    show_default=True,
    metavar="DIR",
    help="Directory for the demo's log and SQLite file (cleared if an earlier demo made it).",
)
@click.option(
    "--turns",
    default=60,
    show_default=True,
    type=click.IntRange(10, 10_000),
    help="Agent turns to play before the edit, rewind and compaction.",
)
@click.option(
    "--durability",
    type=click.Choice(["full", "process", "none"]),
    default="full",
    show_default=True,
    help="Sync mode of the demo's log.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def demo(path: str, turns: int, durability: str, as_json: bool) -> None:
    """Play a scripted agent session into DIR and report what the log did.

    A few hundred messages with tool calls, flushed from several exit paths, then an
    in-place edit, a rewind, a compaction, a fork, a crash and resume with repaired
    tool calls, a SQLite projection and a full verify.
    """
    from .demo import run_demo

    say = (lambda line: None) if as_json else (lambda line: _stderr().print(f"[dim]… {escape(line)}[/dim]"))
    report = run_demo(path, turns=turns, durability=durability, say=say)
    if as_json:
        _print_json(asdict(report))
    else:
        click.echo(str(report))
    if not report.verify_ok:
        sys.exit(1)


# -- reading ------------------------------------------------------------------


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of sessions.")
@click.option(
    "--from", "source", metavar="URL", help="List the sessions of a PostgreSQL projection (every host's) instead."
)
@click.option("--log-id", metavar="LOG", help="With --from: only this log's sessions.")
def sessions(as_json: bool, source: str | None, log_id: str | None) -> None:
    """List the sessions: live messages, tombstones, forks, metadata."""
    if source is not None:
        _sessions_from(source, log_id, as_json)
        return
    with _open_log() as log:
        summaries = render.summarize(log.events()).sessions
    rows = [summaries[s] for s in sorted(summaries)]
    if as_json:
        _print_json([row.as_dict() for row in rows])
        return
    if not rows:
        click.echo("no sessions")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("session", "live", "tombstoned", "events", "updated", "title", "notes"):
        table.add_column(
            column,
            justify="right" if column in ("live", "tombstoned", "events") else "left",
            no_wrap=column == "session",
        )
    for row in rows:
        notes = []
        if row.forked_from:
            notes.append(f"fork of {row.forked_from}@{row.fork_at}")
        if row.closed:
            notes.append("closed")
        table.add_row(
            escape(visible(row.session)),
            str(row.live),
            str(sum(row.tombstoned.values())),
            str(row.events),
            render.iso(row.last_ns) or "",
            escape(visible(str(row.fields.get("title", "")))),
            escape(visible(", ".join(notes))),
        )
    _stdout().print(table)


@cli.command()
@click.argument("session")
@click.option(
    "--as-of", type=click.IntRange(min=0), metavar="SEQ", help="The transcript as it was right after event SEQ."
)
@click.option("--repair", is_flag=True, help="Repair tool calls as a resuming agent would (the log is not changed).")
@click.option("--full", is_flag=True, help="Print whole contents instead of one line per message.")
@click.option("--json", "as_json", is_flag=True, help="Print the live messages as a JSON array (the wire dicts).")
@click.option("--from", "source", metavar="URL", help="Read SESSION from a PostgreSQL projection instead of the log.")
@click.option("--log-id", metavar="LOG", help="With --from: the log holding SESSION (when several do).")
def show(
    session: str,
    as_of: int | None,
    repair: bool,
    full: bool,
    as_json: bool,
    source: str | None = None,
    log_id: str | None = None,
) -> None:
    """Print the live transcript of SESSION with roles, tool calls and tombstone markers.

    A marker line shows where messages left the transcript (edit, rewind, compaction,
    clear); `history` lists them.
    """
    columns = None if full else render.columns()
    width = None if full else min(160, columns or 160)
    if source is not None:
        if as_of is not None or repair:
            _fail("--as-of and --repair read the log itself; they do not go with --from")
        _show_from(source, session, log_id, width, as_json)
        return
    with _open_log() as log:
        _require_session(log, session)
        if as_json or as_of is not None or repair:
            messages = log.messages(session, as_of=as_of, repair_tool_calls=repair)
            if as_json:
                _print_json(messages)
                return
            for position, message in enumerate(messages):
                click.echo(render.fit(f"[{position}] {render.render_message(message, width=width)}", columns))
            return
        history = log.history(session)
    markers = render.markers(history)
    lines: list[str] = []
    for occurrence in history:
        if occurrence.tombstone is None:
            lines.extend(markers.pop(occurrence.position, ()))
            lines.append(f"[{occurrence.position}] {render.render_message(occurrence.message, width=width)}")
    for rest in markers.values():
        lines.extend(rest)
    for line in lines:
        click.echo(render.fit(line, columns))


@cli.command()
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help="Print every occurrence as JSON.")
def history(session: str, as_json: bool) -> None:
    """Audit SESSION: every message occurrence, live or tombstoned, with reason and event.

    `origin` is append (stored here), carry (re-linked after an edit, rewind or
    compaction, body not stored again) or fork (shared with the parent session).
    """
    with _open_log() as log:
        _require_session(log, session)
        occurrences = log.history(session)
    if as_json:
        _print_json(
            [
                {
                    "position": o.position,
                    "seq": o.seq,
                    "origin": o.origin,
                    "node": o.node,
                    "digest": o.digest,
                    "live": o.tombstone is None,
                    "tombstone_reason": o.tombstone.reason if o.tombstone else None,
                    "tombstone_seq": o.tombstone.seq if o.tombstone else None,
                    "override": o.override,
                    "message": o.message,
                    "redacted": None
                    if o.redaction is None
                    else {"seq": o.redaction.seq, "reason": o.redaction.reason, "by": o.redaction.by},
                }
                for o in occurrences
            ]
        )
        return
    columns = render.columns()
    click.echo(f"{'seq':>6} {'pos':>5} {'origin':<6} {'status':<16} {'node':<12} message")
    for o in occurrences:
        status = "live" if o.tombstone is None else f"✗ {o.tombstone.reason}@{o.tombstone.seq}"
        if o.redaction is not None:
            status = f"{status} redacted@{o.redaction.seq}"
        line = f"{o.seq:>6} {o.position:>5} {o.origin:<6} {status:<16} {o.node[:12]} {render.render_message(o.message, width=100)}"
        click.echo(render.fit(line, columns))
    live = sum(1 for o in occurrences if o.tombstone is None)
    click.echo(f"{render.count(len(occurrences), 'occurrence')}, {live} live, {len(occurrences) - live} tombstoned")


# -- projection ---------------------------------------------------------------


def _is_postgres(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def _projection(db: str, *, force: bool = False) -> Any:
    """The projection at ``db``: a PostgreSQL one for a ``postgresql://`` URL, else a SQLite
    file; with ``force``, a file that is not a projection (not SQLite, or another program's
    database) is replaced by a new one."""
    if _is_postgres(db):
        try:
            from projections.postgres import PostgresProjection
        except ImportError as e:
            _fail(f"{e}")
        return PostgresProjection(db)
    try:
        from projections import NotAProjectionError, SQLiteProjection
    except ImportError as e:  # pragma: no cover - the package ships both
        _fail(f"the SQLite projection is not available ({e})")
    try:
        return SQLiteProjection(db)
    except NotAProjectionError:
        if not force:
            raise
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(db + suffix)
    return SQLiteProjection(db)


def _sessions_from(source: str, log_id: str | None, as_json: bool) -> None:
    projection = _postgres(source)
    try:
        rows = projection.sessions(log_id=log_id)
    finally:
        projection.close()
    keys = ("log_id", "id", "message_count", "title", "model", "created_ns", "closed_ns", "parent_id")
    if as_json:
        _print_json([{k: r[k] for k in keys} for r in rows])
        return
    if not rows:
        click.echo("no sessions")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("log", "session", "live", "created", "title"):
        table.add_column(column)
    for r in rows:
        table.add_row(
            escape(visible(r["log_id"][:12])),
            escape(visible(r["id"])),
            str(r["message_count"]),
            render.iso(r["created_ns"]) or "",
            escape(visible(r["title"] or "")),
        )
    Console(soft_wrap=True).print(table)
    click.echo(f"{render.count(len(rows), 'session')} in {render.count(len({r['log_id'] for r in rows}), 'log')}")


def _show_from(source: str, session: str, log_id: str | None, width: int | None, as_json: bool) -> None:
    projection = _postgres(source)
    try:
        rows = projection.messages(session, log_id=log_id)
    finally:
        projection.close()
    if not rows:
        _fail(f"no session {session!r} in {projection.where}")
    messages = [json.loads(r["message"]) for r in rows]
    if as_json:
        _print_json(messages)
        return
    for r, message in zip(rows, messages):
        click.echo(f"[{r['position']}] {render.render_message(message, width=width)}")


def _postgres(source: str) -> Any:
    if not _is_postgres(source):
        _fail(f"--from takes a postgresql:// URL, not {source!r}")
    return _projection(source)


class _CountingLog:
    """What a projection reads from a log (``id``, ``last_seq``, ``events``), reporting progress as it goes."""

    def __init__(self, log: EventLog, advance: Callable[[int], None]) -> None:
        self._log = log
        self._advance = advance

    @property
    def id(self) -> str:
        return self._log.id

    @property
    def last_seq(self) -> int:
        return self._log.last_seq

    def events(self, after: int = 0) -> Iterator[Record]:
        for record in self._log.events(after=after):
            yield record
            self._advance(record.seq)


def _project(db: str | None, *, rebuild: bool, as_json: bool, exclusive: bool = False, force: bool = False) -> None:
    log_path = _settings().log_path
    target = db or _default_db(log_path)
    with _open_log() as log:
        total = log.last_seq
        projection = _projection(target, force=force)
        try:
            postgres = _is_postgres(target)
            if rebuild:
                start = 0
            else:
                start = projection.last_seq_of(log.id) if postgres else projection.last_seq
            started = time.perf_counter()
            with _progress() as bar:
                task = bar.add_task(
                    "rebuild" if rebuild else "project", total=max(total, 1), completed=min(start, total)
                )
                counting = _CountingLog(log, lambda seq: bar.update(task, completed=seq))
                if not rebuild:
                    applied = projection.catch_up(counting)
                elif postgres:
                    applied = projection.rebuild(counting)
                else:
                    applied = projection.rebuild(counting, exclusive=exclusive or None)
                bar.update(task, completed=max(total, 1))
            seconds = time.perf_counter() - started
        finally:
            projection.close()
    rate = applied / seconds if seconds > 0 else 0.0
    if as_json:
        _print_json(
            {
                "db": projection.where if _is_postgres(target) else target,
                "log": log_path,
                "applied": applied,
                "last_seq": total,
                "seconds": seconds,
                "events_per_second": rate,
            }
        )
        return
    verb = "rebuilt" if rebuild else "projected"
    where = projection.where if _is_postgres(target) else target
    click.echo(
        f"{verb} {applied} events into {where} in {seconds:.2f}s ({rate:,.0f} events/s); projection at event {total}"
    )


_TO_HELP = "The projection: a SQLite file or a postgresql:// URL (the same as DB)."


def _target(db: str | None, to: str | None) -> str | None:
    if db is not None and to is not None and db != to:
        _fail(f"give the projection once: DB {db!r} or --to {to!r}")
    return to or db


@cli.command()
@click.argument("db", required=False, metavar="[DB]", envvar="EVENTLOG_DB")
@click.option("--to", "to", metavar="DB", help=_TO_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def project(db: str | None, to: str | None, as_json: bool) -> None:
    """Bring the projection DB up to date with the log.

    DB is a SQLite file or a PostgreSQL URL (postgresql://...), where many hosts' logs
    share one database. It defaults to $EVENTLOG_DB, else the log path plus .sqlite.
    Applies only the events after this log's checkpoint; a SQLite DB that projects
    another log is refused. A DB that holds a message redacted since is rebuilt (a SQLite DB into a
    fresh file, erasing the message; see docs/audit.md for PostgreSQL).
    """
    _project(_target(db, to), rebuild=False, as_json=as_json)


@cli.command()
@click.argument("db", required=False, metavar="[DB]", envvar="EVENTLOG_DB")
@click.option(
    "--exclusive",
    is_flag=True,
    help="Take DB for itself while it runs, when nothing else has it open: faster, but readers that open it meanwhile wait until it commits.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace DB even when it is not a projection (not a SQLite database, or another program's).",
)
@click.option("--to", "to", metavar="DB", help=_TO_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def rebuild(db: str | None, exclusive: bool, force: bool, to: str | None, as_json: bool) -> None:
    """Re-project the whole log into DB, from the first event.

    DB defaults to $EVENTLOG_DB, else the log path plus .sqlite. A SQLite DB is replaced
    whole, even a projection of another log, in one transaction; in a PostgreSQL DB only
    this log's rows are replaced. Readers keep seeing the old projection until it
    commits, unless --exclusive (SQLite; the default for a DB with nothing projected yet).
    When the log holds a redaction, a SQLite DB is rebuilt into a fresh file copied over it,
    so that nothing of the erased content stays in its pages or WAL. A DB that is no
    projection at all is left alone unless --force.
    """
    _project(_target(db, to), rebuild=True, as_json=as_json, exclusive=exclusive, force=force)


@cli.command()
@click.argument("words", nargs=-1, required=True, metavar="WORDS...")
@click.option("--session", "session", metavar="SESSION", help="Search only this session.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1), help="Most results to print.")
@click.option(
    "--db", metavar="DB", envvar="EVENTLOG_DB", help="The projection to search (else $EVENTLOG_DB, else LOG.sqlite)."
)
@click.option("--fts", is_flag=True, help='Pass QUERY as SQLite FTS5 syntax ("phrases", AND/OR/NOT, prefix*, NEAR).')
@click.option(
    "--from", "source", metavar="URL", help="Search a PostgreSQL projection (every host's logs); the log is not read."
)
@click.option("--log-id", metavar="LOG", help="With --from: search only this log.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def search(
    words: tuple[str, ...],
    session: str | None,
    limit: int,
    db: str | None,
    fts: bool,
    as_json: bool,
    source: str | None = None,
    log_id: str | None = None,
) -> None:
    """Full-text search of the live messages: those containing every one of WORDS.

    Searches message text and tool names and arguments in the SQLite projection,
    which is caught up with the log first, so results are current. Quoting is not
    needed (`eventlog search fox lazy`); with --fts the words are one FTS5 query. With
    --from, searches a PostgreSQL projection as it is (WORDS in web-search syntax: words,
    "phrases", or, -word).
    """
    query = " ".join(words)
    if source is not None:
        _search_from(source, query, session, log_id, limit, as_json)
        return
    if not fts:
        query = plain_query(query)
    target = db or _default_db(_settings().log_path)
    with _open_log() as log:
        if session is not None:
            _require_session(log, session)
        projection = _projection(target)
        try:
            projection.catch_up(log)
            results = projection.search(query, session_id=session, limit=limit)
        finally:
            projection.close()
    if as_json:
        _print_json(
            [{k: r[k] for k in ("session_id", "position", "seq", "role", "snippet", "content")} for r in results]
        )
        return
    if not results:
        click.echo("no live message matches")
        return
    columns = render.columns()
    for r in results:
        line = f"{visible(r['session_id'])} [{r['position']}] {visible(str(r['role']))}: {render.clip(r['snippet'] or '', 160)}"
        click.echo(render.fit(line, columns))
    click.echo(render.count(len(results), "result"))


def _search_from(source: str, query: str, session: str | None, log_id: str | None, limit: int, as_json: bool) -> None:
    if not query.split():
        raise click.BadParameter("give at least one word to search for", param_hint="QUERY")
    projection = _postgres(source)
    try:
        results = projection.search(query, session_id=session, log_id=log_id, limit=limit)
    finally:
        projection.close()
    if as_json:
        keys = ("log_id", "session_id", "position", "seq", "role", "snippet", "content")
        _print_json([{k: r[k] for k in keys} for r in results])
        return
    if not results:
        click.echo("no live message matches")
        return
    for r in results:
        click.echo(
            f"{visible(r['log_id'][:12])} {visible(r['session_id'])} [{r['position']}] {visible(str(r['role']))}: "
            f"{render.clip(r['snippet'] or '', 160)}"
        )
    click.echo(render.count(len(results), "result"))


def plain_query(text: str) -> str:
    """Words as an FTS5 query that matches rows containing all of them (each word quoted)."""
    words = text.split()
    if not words:
        raise click.BadParameter("give at least one word to search for", param_hint="WORDS")
    return " ".join('"' + word.replace('"', '""') + '"' for word in words)


# -- checking -----------------------------------------------------------------


def _log_head(value: str) -> LogHead:
    try:
        return LogHead.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the head as JSON.")
def head(as_json: bool) -> None:
    """Print the newest event's seq and hash as SEQ:HASH, to write down somewhere else.

    ``eventlog verify --expect SEQ:HASH`` later fails if the log no longer holds that
    event with that hash (an older copy restored, a history rewritten).
    """
    with _open_log() as log:
        found = log.log_head()
    if found is None:
        _fail(f"the log at {_settings().log_path} has no events yet")
    if as_json:
        _print_json({"seq": found.seq, "hash": found.hash})
    else:
        click.echo(str(found))


def _read_text(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as e:
        _fail(f"{path}: cannot read the {what} ({e.strerror})")
    except UnicodeDecodeError:
        _fail(f"{path}: the {what} is not UTF-8 text")


@cli.command()
@click.option(
    "--expect",
    "expect",
    multiple=True,
    metavar="SEQ:HASH",
    callback=lambda _ctx, _param, values: [_log_head(v) for v in values],
    help="An event the log must hold with this hash (from `eventlog head`); repeatable.",
)
@click.option(
    "--checkpoint",
    "checkpoint_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="A signed checkpoint kept outside the log: the log must extend it (repeatable; needs --key).",
)
@click.option(
    "--key",
    "key_files",
    multiple=True,
    type=click.Path(dir_okay=False),
    metavar="KEY.pub",
    help="A verifier key trusted to sign checkpoints (repeatable).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(expect: list[LogHead], checkpoint_files: tuple[str, ...], key_files: tuple[str, ...], as_json: bool) -> None:
    """Recompute every digest and the event hash chain; exit 0 only if the log is intact.

    With --checkpoint FILE --key KEY.pub, also check that the log's Merkle tree has, at
    the checkpoint's size, the root the checkpoint signed: a history rewritten and
    resealed, a log rolled back, an event deleted or backdated before the checkpoint
    fails here.  On failure prints which event is wrong and what differs, and exits 1.
    """
    from .verifier import ProofError, Verifier

    if checkpoint_files and not key_files:
        raise click.UsageError("--checkpoint needs --key KEY.pub (the key the checkpoint must be signed with)")
    notes, keys = [], []
    for name in checkpoint_files:
        notes.append(_read_text(name, "checkpoint"))
    for name in key_files:
        try:
            keys.append(Verifier.parse(_read_text(name, "verifier key")))
        except ProofError as e:
            _fail(f"{name}: {e}")
    from .verify import verify_files

    try:
        log = _open_log()
    except EventLogError as e:  # damaged beyond opening: report the damaged pages the file shows
        report = verify_files(_settings().log_path, e)
        if not any(page.pgno for page in report.damaged_pages):
            raise  # not an LMDB file at all, or nothing to point at: the error says it all
    else:
        with log, _progress() as bar:
            task = bar.add_task("verify", total=None)

            def advance(done: int, total: int) -> None:
                bar.update(task, completed=done, total=max(total, 1))

            report = log.verify(progress=advance, expect=expect, checkpoints=notes, keys=keys)
    if as_json:
        _print_json(
            {
                "ok": report.ok,
                "events": report.events,
                "sessions": report.sessions,
                "messages": report.messages,
                "problems": [{"seq": p.seq, "what": p.what} for p in report.problems],
                "redactions": [asdict(r) for r in report.redactions],
                "vacuum_pending": report.vacuum_pending,
                "damaged_pages": [
                    {"page": d.pgno, "table": d.table, "seqs": d.seqs, "what": d.what} for d in report.damaged_pages
                ],
            }
        )
    elif report.ok:
        click.echo(str(report))
        for redaction in report.redactions:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(redaction.time_ns / 1e9))
            click.echo(f"  redacted at {when} UTC: {redaction}")
    else:
        click.echo(f"NOT INTACT: {len(report.problems)} problem(s) in {_settings().log_path}", err=True)
        for problem in report.problems[:20]:
            click.echo(f"  {problem}", err=True)
        if len(report.problems) > 20:
            click.echo(f"  ... and {len(report.problems) - 20} more", err=True)
    if not report.ok:
        sys.exit(1)


@cli.command()
@click.argument("damaged", type=click.Path(file_okay=False, exists=True))
@click.argument("new", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the salvage report as JSON.")
def salvage(damaged: str, new: str, as_json: bool) -> None:
    """Copy every provably intact event of the damaged log DAMAGED into a new log NEW.

    DAMAGED is only read, as plain bytes (it need not open). Each event copied is proven
    by the hash chain; the report names every seq and session that was lost. Exits 0
    when nothing was lost and the new log verifies, 1 otherwise.
    """
    from .salvage import salvage as salvage_log

    try:
        report = salvage_log(damaged, new)
    except OSError as e:
        _fail(f"cannot read {damaged}: {e}")
    if as_json:
        _print_json({**asdict(report), "lost_ranges": report.lost_ranges(), "complete": report.complete})
    else:
        click.echo(
            f"{report.events_copied} of {report.known_end} events copied into {new} "
            f"({report.events_found} found, {report.events_proven} proven intact); "
            f"{len(report.sessions_copied)} session(s) whole; new log {'verifies' if report.verified else 'FAILS verify'}"
        )
        if report.lost_seqs:
            ranges = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in report.lost_ranges())
            click.echo(f"lost events: {ranges}", err=True)
            if report.dropped_seqs:
                click.echo(
                    f"  ({len(report.dropped_seqs)} of them intact, but after a loss in their session)", err=True
                )
        for session, why in sorted(report.sessions.items()):
            click.echo(f"  session {session!r}: {why}", err=True)
    if not report.complete or not report.verified:
        sys.exit(1)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def stats(as_json: bool) -> None:
    """Events, sessions, messages, tombstones by reason, size on disk and map size."""
    with _open_log() as log:
        info = log.info()
        summary = render.summarize(log.events())
    live = sum(s.live for s in summary.sessions.values())
    numbers = {
        "path": info["path"],
        "log_id": info["id"],
        "events": info["events"],
        "events_by_kind": dict(sorted(summary.kinds.items())),
        "sessions": info["sessions"],
        "live_messages": live,
        "stored_bodies": summary.bodies,
        "carried_references": summary.carried,
        "tombstone_events": dict(sorted(summary.tombstone_events.items())),
        "tombstoned_messages": dict(sorted(summary.tombstoned.items())),
        "used_bytes": info["used_bytes"],
        "file_bytes": info["file_bytes"],
        "map_size": info["map_size"],
    }
    if as_json:
        _print_json(numbers)
        return
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()

    def by(counter: Mapping[str, int]) -> str:
        return ", ".join(f"{k} {v}" for k, v in counter.items()) or "none"

    table.add_row("log", escape(f"{numbers['path']} (id {numbers['log_id']})"))
    table.add_row("events", f"{numbers['events']} ({by(numbers['events_by_kind'])})")
    table.add_row("sessions", str(numbers["sessions"]))
    table.add_row("live messages", str(live))
    table.add_row("stored bodies", f"{summary.bodies} (+{summary.carried} carried references, not stored again)")
    table.add_row("tombstones", f"{sum(summary.tombstone_events.values())} events: {by(numbers['tombstone_events'])}")
    table.add_row("tombstoned", f"{sum(summary.tombstoned.values())} messages: {by(numbers['tombstoned_messages'])}")
    table.add_row("size on disk", f"{render.size(info['file_bytes'])} file, {render.size(info['used_bytes'])} used")
    table.add_row("map size", render.size(info["map_size"]))
    _stdout().print(table)


# -- following ----------------------------------------------------------------


@cli.command()
@click.argument("session", required=False)
@click.option(
    "-n",
    "--lines",
    "count",
    default=10,
    show_default=True,
    type=click.IntRange(min=0),
    help="Print this many recent events first.",
)
@click.option("--once", is_flag=True, help="Print the recent events and exit instead of following.")
@click.option("--timeout", type=click.FloatRange(min=0), metavar="SECONDS", help="Stop following after SECONDS.")
@click.option(
    "--interval",
    default=0.2,
    show_default=True,
    type=click.FloatRange(min=0.01),
    metavar="SECONDS",
    help="How often to look for new events.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per event (JSON Lines).")
def tail(session: str | None, count: int, once: bool, timeout: float | None, interval: float, as_json: bool) -> None:
    """Print the newest events (of SESSION, or of the whole log) and follow new ones.

    Follows events written by other processes until interrupted (Ctrl-C), or until
    --timeout; --once prints and exits.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    columns = render.columns()
    with _open_log() as log:
        if session is not None:
            _require_session(log, session)

        def emit(record: Record) -> None:
            if session is not None and record.event.session != session:
                return
            click.echo(
                json.dumps(render.event_json(record), ensure_ascii=False, default=_jsonable)
                if as_json
                else render.fit(render.describe(record), columns)
            )

        last = log.last_seq
        recent: list[Record] = []
        if count:
            # Walk back in windows until enough matching events are found.
            window = max(count, 64)
            lo = last
            while lo > 0 and len(recent) < count:
                start = max(0, lo - window)
                chunk = [
                    r
                    for r in log.events(after=start)
                    if r.seq <= lo and (session is None or r.event.session == session)
                ]
                recent = chunk + recent
                lo = start
                window *= 4
        for record in recent[-count:] if count else ():
            emit(record)
        sys.stdout.flush()
        if once:
            return
        try:
            while deadline is None or time.monotonic() < deadline:
                newest = log.last_seq
                if newest > last:
                    for record in log.events(after=last):
                        if record.seq > newest:
                            break
                        emit(record)
                    last = newest
                    sys.stdout.flush()
                pause = interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic()))
                time.sleep(pause)
        except KeyboardInterrupt:
            pass


# -- moving transcripts ---------------------------------------------------------


@cli.command(name="import")
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option(
    "--session", "session", metavar="SESSION", help="Session to import into (default: the file name without extension)."
)
@click.option(
    "--split",
    is_flag=True,
    help='Each {"messages": [...]} line (and each run of message lines) is its own session SESSION-1, SESSION-2, ... (numbered even when there is one).',
)
@click.option(
    "--replace",
    is_flag=True,
    help="Replace an existing transcript that the file does not extend (tombstone reason clear).",
)
@click.option(
    "--durability",
    type=click.Choice(["full", "process", "none"]),
    default="full",
    show_default=True,
    help="Sync mode of the write.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def import_(file: str, session: str | None, split: bool, replace: bool, durability: str, as_json: bool) -> None:
    """Import messages from a JSON Lines FILE (- for stdin) into a session.

    Each line is one message object, or an OpenAI-style {"messages": [...]} object.
    The file is flushed like an agent's list: importing it again writes nothing, and
    a longer version of the file appends only what is new. A bad line, or a session
    the file does not continue, fails the whole import; nothing of the file is written.
    """
    default_name = session is None
    if session is None:
        if file == "-":
            _fail("reading stdin: give --session SESSION")
        session = Path(file).stem
    name = "<stdin>" if file == "-" else file
    source = None if file == "-" else os.path.realpath(file)
    settings = _settings()
    settings.written = "nothing was imported"
    with _status(f"reading {name}"):
        # utf-8-sig: a byte order mark at the start (as some editors write) is not part of the text
        with click.open_file(file, "r", encoding="utf-8-sig") as handle:
            try:
                text = handle.read()
            except UnicodeDecodeError as e:
                _fail(f"{name}: not UTF-8 text ({e.reason} at byte {e.start})")
        conversations = read_jsonl(text, name=name, split=split)
    if split:  # numbered even when there is one, so that a file that grows keeps its names
        targets = {f"{session}-{i}": c for i, c in enumerate(conversations, start=1)}
    else:
        targets = {session: conversations[0]}
    total = sum(len(c.messages) for c in targets.values())
    with _open_log(write=True, durability=durability) as log:
        heads: dict[str, str] = {}
        for target, conversation in targets.items():
            info = log.session(target)
            heads[target] = info.head if info is not None and info.head is not None else EMPTY_HEAD
            if info is None or replace:
                continue
            earlier = info.metadata.get("imported_from")
            if default_name and source is not None and isinstance(earlier, str) and earlier != source:
                _fail(
                    f"session {target!r} was imported from {earlier}, not {name}; nothing was imported; "
                    "give --session SESSION to import this file into a session of its own"
                )
            problem = _does_not_extend(log.messages(target), conversation, name)
            if problem is not None:
                _fail(
                    f"session {target!r}: {problem}; nothing was imported; pass --replace to replace the "
                    "transcript, or choose another --session"
                )
        try:  # one transaction: every session of the file is written, or none
            with _status(f"writing {render.count(total, 'message')} to {render.count(len(targets), 'session')}"):
                written = log.flush_many(
                    {target: c.messages for target, c in targets.items()},
                    expected_heads=None if replace else heads,
                    replace=replace,
                )
        except ConflictError as e:
            _fail(f"{_one_line(e)}: another process wrote to it while this import ran; nothing was imported")
        settings.written = "the import was written whole"
        if default_name and source is not None:
            # What a later import under the same name is checked against; one session of a
            # split file carries it (a write per session would cost a commit each).
            first = next(iter(targets))
            info = log.session(first)
            if info is not None and info.metadata.get("imported_from") != source:
                log.update_session(first, imported_from=source)
    results = [
        {
            "session": target,
            "messages": len(c.messages),
            "appended": written[target].appended,
            "tombstoned": written[target].tombstoned,
            "head": written[target].head,
        }
        for target, c in targets.items()
    ]
    if as_json:
        _print_json(results)
        return
    for target, c in targets.items():
        done = written[target]
        extra = f", {done.tombstoned} tombstoned" if done.tombstoned else ""
        click.echo(
            f"{visible(target)}: {render.count(len(c.messages), 'message')} read, {done.appended} written{extra}"
        )


def _does_not_extend(stored: list[dict[str, Any]], conversation: Any, name: str) -> str | None:
    """Why importing ``conversation`` would tombstone stored messages, or None when it extends them.

    Scaffolding and ``_`` keys are left out as a flush leaves them out; the first message
    that differs is named by its line in the file.
    """
    kept = [
        (line, codec.canonical(message, index))
        for index, (message, line) in enumerate(zip(conversation.messages, conversation.lines))
        if not is_ephemeral(message)
    ]
    for position, (message, (line, body)) in enumerate(zip(stored, kept)):
        if codec.encode(message) != body:
            return f"{name}:{line} differs from stored message {position}, so the file does not extend the session"
    if len(kept) < len(stored):
        return (
            f"it holds {len(stored)} messages and {name} only its first {len(kept)} "
            "(an older copy?), so importing it would rewind the session"
        )
    return None


def _status(text: str) -> contextlib.AbstractContextManager[Any]:
    """A spinner with ``text`` on stderr while long work runs, when stderr is a terminal."""
    console = _stderr()
    if not console.is_terminal:
        return contextlib.nullcontext()
    return console.status(escape(text))


@cli.command()
@click.argument("spill_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the recovery report as JSON.")
def recover(spill_dir: str, as_json: bool) -> None:
    """Fold the spill files in SPILL_DIR back into the log (see eventlog.spill).

    Spill files hold turns that could not be written when the log was unwritable.
    Each is flushed like the agent's list: nothing is written twice, and running
    this again is harmless. A file that no longer matches the stored history is
    kept and reported; the exit code is then 1.
    """
    from .spill import recover as recover_spills

    if not os.path.isdir(spill_dir):
        _fail(f"no spill directory at {spill_dir}")
    with _open_log(write=True) as log:
        report = recover_spills(log, spill_dir)
    if as_json:
        _print_json(asdict(report))
    else:
        click.echo(
            f"{len(report.recovered)} session(s) recovered ({report.appended} messages written), "
            f"{len(report.already_stored)} already stored, {len(report.kept)} kept"
        )
        for name, why in report.kept.items():
            click.echo(f"  kept {name}: {why}", err=True)
    if not report.ok:
        sys.exit(1)


@cli.command()
@click.argument("session")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="jsonl",
    show_default=True,
    help='jsonl: a message per line; openai: {"messages": [...]}; sharegpt: {"conversations": [...]}.',
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    show_default=True,
    help="File to write.",
)
@click.option(
    "--as-of", type=click.IntRange(min=0), metavar="SEQ", help="Export the transcript as it was right after event SEQ."
)
@click.option("--repair", is_flag=True, help="Repair tool calls first (a result for every call, no orphan results).")
def export(session: str, fmt: str, output: str, as_of: int | None, repair: bool) -> None:
    """Export the live transcript of SESSION as JSON Lines."""
    with _open_log() as log:
        _require_session(log, session)
        messages = log.messages(session, as_of=as_of, repair_tool_calls=repair)
    lines = (line + "\n" for line in export_lines(messages, fmt))
    if output == "-":
        with click.open_file("-", "w", encoding="utf-8") as handle:  # UTF-8 whatever the locale
            handle.writelines(lines)
        return
    target = os.path.realpath(output)  # through a symlink, to the file it names
    try:
        if os.path.exists(target) and not os.path.isfile(target):
            with open(target, "w", encoding="utf-8") as handle:  # a pipe or a device: written as it comes
                handle.writelines(lines)
        else:
            write_atomic(target, (line.encode("utf-8") for line in lines))
    except OSError as e:
        _fail(f"{output}: {e.strerror or e}; the file is left as it was")


# -- framework plugins ----------------------------------------------------------


@cli.group()
def hermes() -> None:
    """The hermes-agent plugin that flushes every hermes turn to a log."""


@hermes.command("install")
@click.option(
    "--home",
    type=click.Path(file_okay=False),
    help="hermes' home directory (default: $HERMES_HOME, else ~/.hermes).",
)
@click.option(
    "--log",
    "log_dir",
    type=click.Path(file_okay=False),
    help="The log the plugin writes (default: HOME/eventlog; the global --log is not used here).",
)
@click.option(
    "--durability",
    type=click.Choice(["full", "process", "none"]),
    default="full",
    show_default=True,
    help="The log's durability mode for hermes' turns.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was installed as JSON.")
def install(home: str | None, log_dir: str | None, durability: str, as_json: bool) -> None:
    """Install the plugin into hermes' home and enable it in hermes' config.yaml.

    hermes loads it at its next start (it must run in a Python environment where
    agent-eventlog is installed).  Installing again updates the settings.
    """
    try:
        from .integrations import hermes as plugin
    except ImportError as e:
        _fail(str(e))
    try:
        done = plugin.install(home, log=log_dir, durability=durability)
    except OSError as e:
        _fail(f"{e.filename or home}: {e.strerror or e}")
    if as_json:
        report = {
            "plugin": str(done.plugin_dir),
            "log": str(done.log),
            "durability": done.durability,
            "config": str(done.config),
            "already_enabled": done.already_enabled,
        }
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"plugin   {done.plugin_dir}")
    click.echo(f"log      {done.log} ({done.durability} durability)")
    click.echo(f"enabled  in {done.config}" + (" (it already was)" if done.already_enabled else ""))


# -- entry points -------------------------------------------------------------

from . import audit_cli  # noqa: E402  (its commands join the group above)

_ = audit_cli


def main(argv: list[str] | None = None) -> None:
    """Run the command line (the ``eventlog`` console script)."""
    try:
        cli.main(args=argv, prog_name="eventlog")
    except BrokenPipeError:
        # The reader went away (`eventlog show ... | head`): stop quietly, as Unix tools do.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)


if __name__ == "__main__":
    main()
