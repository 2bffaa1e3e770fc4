"""Files outside LMDB written whole or not at all: the id marker, spill files, exports."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterable


def write_atomic(path: str | os.PathLike[str], chunks: Iterable[bytes], *, mode: int | None = None) -> None:
    """Replace the file ``path`` with ``chunks``, durably and whole or not at all.

    The bytes go to a new file beside it (a name no other thread or process uses), which
    is synced, renamed over ``path``, and then the directory is synced so that the rename
    itself survives a power loss.  A failure (a full disk, an exception from ``chunks``)
    leaves the previous file as it was and removes the partial one.  An existing file's
    permissions are kept; a new file gets ``mode``, or what ``open()`` would give it.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with open(fd, "wb") as handle:
            handle.writelines(chunks)
            handle.flush()
            with contextlib.suppress(FileNotFoundError):
                mode = stat.S_IMODE(os.stat(path).st_mode)
            if mode is not None:
                os.chmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    sync_directory(folder or ".")


def sync_directory(folder: str | os.PathLike[str]) -> None:
    """fsync a directory, so that the entries just created or renamed in it are durable."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
