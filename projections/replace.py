"""Replacing a SQLite projection's content with a fresh file's, erasing what it held.

A rebuild after a redaction must leave nothing of the erased message in the file: not in
its rows, its search index's segments, its free pages or its WAL.  So the projection is
rebuilt into a scratch file beside it, and that file is copied over the projection with
SQLite's online backup: one write transaction on the projection's own connection, which
overwrites its pages and shrinks the file to the new size.  Readers see the old
projection until the copy commits and the new one after; nobody's connection breaks.

Renaming the scratch file over the projection would not do: SQLite finds a database's
``-wal`` and ``-shm`` files by name, so a connection opening the new file would take the
old one's WAL as its own while the old file's readers still use it.

The WAL, which held the old pages (and now holds the copy), is then checkpointed and
truncated to nothing (:func:`truncate_wal`); a reader inside a transaction begun before
the copy holds it until that transaction ends.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import tempfile
from collections.abc import Iterator

SCRATCH_SUFFIX = ".rebuild"
"""Scratch files are ``.<name>.<random>.rebuild`` beside the projection, removed afterwards."""


@contextlib.contextmanager
def scratch(path: str) -> Iterator[str]:
    """The path of a new, empty scratch file beside ``path``; it and its journals are removed on exit."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, where = tempfile.mkstemp(prefix=f".{name}.", suffix=SCRATCH_SUFFIX, dir=folder)
    os.close(fd)
    try:
        yield where
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where + suffix)


def copy_over(source: sqlite3.Connection, target: sqlite3.Connection) -> None:
    """Replace ``target``'s database with ``source``'s, in one transaction on ``target``."""
    source.backup(target)


def truncate_wal(db: sqlite3.Connection, *, wait: float, busy_timeout: float) -> bool:
    """Checkpoint ``db``'s WAL into the file and truncate it to nothing; return whether it was.

    Waits up to ``wait`` seconds for readers inside a transaction begun before; then
    restores the connection's busy timeout (``busy_timeout`` seconds).
    """
    db.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
    try:
        busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
    return not busy
