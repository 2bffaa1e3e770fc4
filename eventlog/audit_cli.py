"""The ``eventlog`` commands of the audit trail: migrate, keygen, checkpoint, prove, verify-proof.

Registered on the main command group by :mod:`eventlog.cli`.
"""

from __future__ import annotations

import click

from . import cli as base
from .log import EventLog


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
