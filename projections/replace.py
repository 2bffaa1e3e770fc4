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
import fcntl
import os
import sqlite3
import tempfile
from collections.abc import Iterator

SCRATCH_SUFFIX = ".rebuild"
"""Scratch files are ``.<name>.<random>.rebuild`` beside the projection, removed afterwards."""


_JOURNALS = ("-wal", "-shm", "-journal")


@contextlib.contextmanager
def scratch(path: str) -> Iterator[str]:
    """The path of a new, empty scratch file beside ``path``; it and its journals are removed on exit.

    The scratch file is locked (``flock``) while in use, so that the scratch files of rebuilds
    cut short (a process killed during one) are told from those in use, and removed here.
    """
    folder, name = os.path.split(os.path.abspath(path))
    remove_stale(folder, name)
    fd, where = tempfile.mkstemp(prefix=f".{name}.", suffix=SCRATCH_SUFFIX, dir=folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # while the file is empty: remove_stale leaves empty ones alone
        yield where
    finally:
        for suffix in ("", *_JOURNALS):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(where + suffix)
        os.close(fd)


def remove_stale(folder: str, name: str) -> None:
    """Remove the scratch files (and their journals) of rebuilds of projection ``name`` that were
    cut short: those nobody holds locked.  Each is a whole projection's size; left in place, they
    would fill the disk one interrupted rebuild at a time.  Symbolic links are not followed."""
    prefix = f".{name}."
    try:
        entries = [entry.name for entry in os.scandir(folder)]
    except OSError:
        return
    for entry in entries:
        if not (entry.startswith(prefix) and entry.endswith(SCRATCH_SUFFIX)):
            continue
        where = os.path.join(folder, entry)
        try:
            fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue  # gone, or a link: not a scratch file this code made
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # a rebuild in use
            if os.fstat(fd).st_size == 0:
                continue  # just created; its rebuild is about to lock it
            for suffix in ("", *_JOURNALS):
                with contextlib.suppress(OSError):
                    os.unlink(where + suffix)
        finally:
            os.close(fd)


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


def wal_left(path: str) -> bool:
    """Whether the database at ``path`` has a WAL with frames in it (before it is opened).

    A process stopped after replacing a projection's content and before truncating its WAL
    leaves the new pages in the WAL and the replaced ones, erased content and all, in the
    file until a checkpoint: the next open checkpoints it (:func:`truncate_wal`).
    """
    try:
        return os.path.getsize(path + "-wal") > 0
    except OSError:
        return False
