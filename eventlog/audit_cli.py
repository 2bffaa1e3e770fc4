"""The ``eventlog`` commands of the audit trail: migrate, keygen, checkpoint, prove, verify-proof.

Registered on the main command group by :mod:`eventlog.cli`.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict

import click

from . import cli as base
from . import signing, verifier
from .errors import EventLogError
from .files import write_atomic
from .log import EventLog
from .verifier import Verifier


@base.cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def migrate(as_json: bool) -> None:
    """Upgrade the log to the current format in place (salted messages, the Merkle tree).

    Any write does the same on a log's first open for writing; this command does only
    that, in one transaction, and prints the log's tree size afterwards.
    """
    path = base._settings().log_path
    before = EventLog.format_of(path)
    if before is None:
        base._fail(f"no event log at {path} (give --log PATH or set EVENTLOG_PATH)")
    with base._open_log(write=True) as log:
        size = log.tree_size()
    after = EventLog.format_of(path)
    if as_json:
        base._print_json({"from": before, "to": after, "tree_size": size})
    elif before == after:
        click.echo(f"already at format {after}: {size} events in the tree")
    else:
        click.echo(f"upgraded from format {before} to {after}: {size} events in the tree")


def _outside_log(path: str, what: str) -> None:
    """Refuse a private key inside the log directory: whoever can rewrite the log could then re-sign it."""
    log_dir = os.path.realpath(base._settings().log_path)
    target = os.path.realpath(path)
    if target == log_dir or target.startswith(log_dir + os.sep):
        base._fail(f"{path}: the {what} must not live inside the log directory {log_dir}")


def _read(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as e:
        base._fail(f"{path}: cannot read the {what} ({e.strerror})")
    except UnicodeDecodeError:
        base._fail(f"{path}: the {what} is not UTF-8 text")


def _write(path: str, text: str) -> None:
    write_atomic(path, [text.encode("utf-8")])


@base.cli.command()
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), metavar="KEY", help="Private key file.")
@click.option("--name", default="eventlog", show_default=True, help="Key name, e.g. example.com/agent-log.")
def keygen(out: str, name: str) -> None:
    """Make an Ed25519 signing key: KEY (private, mode 0600) and KEY.pub (the verifier key).

    Keep KEY off the log's host if you can, and never inside the log directory; hand
    KEY.pub to whoever checks checkpoints and proofs.
    """
    _outside_log(out, "private key")
    signer = signing.generate(name)
    private, public = signing.write_keys(signer, out)
    click.echo(f"private key: {private}")
    click.echo(f"verifier key: {public}")
    click.echo(str(signer.verifier()))


@base.cli.command(name="checkpoint")
@click.option("--key", "key", type=click.Path(dir_okay=False), metavar="KEY", help="Private key file (keygen).")
@click.option(
    "--signer",
    "command",
    metavar="COMMAND",
    help="Sign with COMMAND instead: it reads the note text on stdin and prints the signature.",
)
@click.option(
    "--signer-key",
    "signer_key",
    type=click.Path(dir_okay=False),
    metavar="KEY.pub",
    help="The verifier key of --signer.",
)
@click.option("--origin", help="The checkpoint's origin line (default: eventlog/<log id>).")
@click.option("--out", "out", type=click.Path(dir_okay=False), metavar="FILE", help="Also write the note to FILE.")
def checkpoint_(
    key: str | None, command: str | None, signer_key: str | None, origin: str | None, out: str | None
) -> None:
    """Sign the log's Merkle tree as it is now: a C2SP checkpoint, stored in the log and printed.

    Publish it somewhere the log's host cannot change (a file elsewhere, a witness, a
    second host); `eventlog verify --checkpoint FILE --key KEY.pub` checks the log
    against it later, and `eventlog prove` proves messages to it.
    """
    signer: signing.Signer
    if (key is None) == (command is None):
        raise click.UsageError("give --key KEY or --signer COMMAND --signer-key KEY.pub")
    if key is not None:
        _outside_log(key, "private key")
        signer = signing.KeySigner.load(key)
    else:
        if signer_key is None:
            raise click.UsageError("--signer needs --signer-key KEY.pub (the key its signatures verify under)")
        assert command is not None
        signer = signing.CommandSigner(command, Verifier.parse(_read(signer_key, "verifier key")))
    with base._open_log(write=True) as log:
        note = log.checkpoint([signer], origin=origin)
    if out is not None:
        _write(out, note)
    click.echo(note, nl=False)


@base.cli.command()
@click.argument("session", required=False)
@click.argument("position", required=False, type=click.IntRange(min=0))
@click.option(
    "--checkpoint", "checkpoint_file", type=click.Path(dir_okay=False), metavar="FILE", help="A checkpoint note."
)
@click.option(
    "--consistency",
    nargs=2,
    type=click.Path(dir_okay=False),
    metavar="OLD NEW",
    help="Prove instead that checkpoint OLD is a prefix of checkpoint NEW.",
)
@click.option("--out", "out", type=click.Path(dir_okay=False), metavar="PROOF", help="Write the proof to PROOF.")
def prove(
    session: str | None,
    position: int | None,
    checkpoint_file: str | None,
    consistency: tuple[str, str] | None,
    out: str | None,
) -> None:
    """Write a JSON proof that message POSITION of SESSION is in the log at a checkpoint.

    The proof holds the message, its event's commitments and the inclusion path to the
    checkpoint's root; `eventlog verify-proof PROOF --key KEY.pub` (or the stand-alone
    eventlog/verifier.py) checks it with nothing else.  With --consistency OLD NEW, a
    proof that the log at checkpoint OLD is a prefix of the log at checkpoint NEW.
    """
    with base._open_log() as log:
        if consistency:
            if session is not None or checkpoint_file is not None:
                raise click.UsageError("--consistency takes two checkpoint files and nothing else")
            proof = log.prove_consistency(_read(consistency[0], "checkpoint"), _read(consistency[1], "checkpoint"))
        else:
            if session is None or position is None or checkpoint_file is None:
                raise click.UsageError("give SESSION POSITION --checkpoint FILE, or --consistency OLD NEW")
            proof = log.prove(session, position, _read(checkpoint_file, "checkpoint"))
    text = json.dumps(proof, ensure_ascii=False, indent=2) + "\n"
    if out is not None:
        _write(out, text)
    else:
        click.echo(text, nl=False)


@base.cli.command(name="verify-proof")
@click.argument("proof", type=click.Path(dir_okay=False))
@click.option(
    "--key",
    "keys",
    multiple=True,
    required=True,
    type=click.Path(dir_okay=False),
    metavar="KEY.pub",
    help="A trusted verifier key (repeatable).",
)
def verify_proof(proof: str, keys: tuple[str, ...]) -> None:
    """Check a proof from `eventlog prove` offline, with the proof and the verifier key alone.

    Exits 0 and prints what was proven, or exits 1 naming the check that failed.
    Needs no log: the same check as `python eventlog/verifier.py PROOF --key KEY.pub`.
    """
    try:
        click.echo(verifier.verify_file(proof, list(keys)))
    except verifier.ProofError as e:
        click.echo(f"FAILED: {e}", err=True)
        sys.exit(1)


@base.cli.command()
@click.argument("session")
@click.argument("position", type=click.IntRange(min=0))
@click.option("--reason", required=True, help="Why the content is erased (kept in the log's redaction event).")
@click.option("--by", "by", default="", metavar="WHO", help="Who erases it (kept in the redaction event).")
@click.option(
    "--seq",
    "seq",
    type=click.IntRange(min=1),
    metavar="SEQ",
    help="POSITION is of the occurrence event SEQ made live (see `eventlog history`), tombstoned or not.",
)
@click.option(
    "--spill-dir",
    "spill_dir",
    type=click.Path(file_okay=False),
    metavar="DIR",
    help="Also erase the content from the spill files in DIR.",
)
@click.option(
    "--db",
    "db",
    metavar="DB",
    envvar="EVENTLOG_DB",
    help="The projection to bring up to date (and so erase) too; default LOG.sqlite when it exists.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the redactions as JSON.")
def redact(
    session: str,
    position: int,
    reason: str,
    by: str,
    seq: int | None,
    spill_dir: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Erase the content of live message POSITION of SESSION for good.

    Its body becomes a placeholder (role and tool-call ids kept, text "[redacted]"), every
    digest derived from it is derived again, a redaction event records who, why and when,
    and the data file is replaced by a compacting copy: the content's bytes are nowhere in
    the log directory afterwards.  Every checkpoint signed before and every proof of another
    message still verifies; heads written down with `eventlog head` do not.  Then the
    projection (--db, or LOG.sqlite when it exists) catches up, which rebuilds it without the
    content.  Refused while another process has the log open.
    """
    target = db or base._default_db(base._settings().log_path)
    with base._open_log(write=True) as log:
        base._require_session(log, session)

        def catch_up() -> str | None:
            if db is None and not os.path.isfile(target):
                return None
            projection = base._projection(target)
            try:
                projection.catch_up(log)
            finally:
                projection.close()
            return projection.where if base._is_postgres(target) else target

        before = log.last_seq
        try:
            done = log.redact(session, position, reason=reason, by=by, seq=seq, spill_dir=spill_dir)
        except EventLogError:
            if log.last_seq != before:  # recorded, then something after it failed: erase the projection all the same
                catch_up()
            raise
        projected = catch_up()
    if as_json:
        base._print_json({"redactions": [asdict(r) for r in done], "projection": projected})
        return
    for r in done:
        click.echo(f"redacted: {r}")
    if projected is not None:
        click.echo(f"projection {projected}: brought up to date without the content")


@base.cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the sizes as JSON.")
def vacuum(as_json: bool) -> None:
    """Replace the data file by a compacting copy: only the pages in use, free pages gone.

    `eventlog redact` does this by itself; run it when that was refused because another
    process had the log open.  Refused while another process has the log open.
    """
    with base._open_log(write=True) as log:
        sizes = log.vacuum()
    if as_json:
        base._print_json(sizes)
    else:
        click.echo(f"data file: {sizes['before']} bytes before, {sizes['after']} after")
