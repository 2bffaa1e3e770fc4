"""Files outside LMDB written whole or not at all: the id marker, spill files, exports."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterable

from .errors import UnsafeDirectoryError


def write_atomic(path: str | os.PathLike[str], chunks: Iterable[bytes], *, mode: int | None = None) -> None:
    """Replace the file ``path`` with ``chunks``, durably and whole or not at all.

    The bytes go to a new file beside it, created exclusively under an unguessable name
    (no other thread or process uses it, and a planted link is refused), which is synced, renamed over ``path``, and then the directory is synced so that the rename
    itself survives a power loss.  A failure (a full disk, an exception from ``chunks``)
    leaves the previous file as it was and removes the partial one.  An existing file's
    permissions are kept; a new file gets ``mode``, or what ``open()`` would give it.
    """
    path = os.fspath(path)
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{os.getpid()}.{secrets.token_hex(16)}.tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        with open(fd, "wb") as handle:
            handle.writelines(chunks)
            handle.flush()
            with contextlib.suppress(FileNotFoundError):
                existing = os.lstat(path)  # a link in its place is replaced, never followed
                if stat.S_ISREG(existing.st_mode):
                    mode = stat.S_IMODE(existing.st_mode)
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


LOCK_FILE_BYTES = 512 * 64 + 4096
"""At least the size LMDB gives the lock file for 512 reader slots (64 bytes each, plus its
header), which the file gets room for before LMDB maps it."""


def check_private_directory(folder: str | os.PathLike[str], *, what: str, allow_shared: bool = False) -> None:
    """Refuse ``folder`` when users other than this one (and root) can change what is in it.

    Anyone who can write a log's (or a spill) directory can plant a symlink or a file
    where the log will create one, and have this process write through it, as whatever
    user it runs as.  Refused: a directory writable by its group or by others (a sticky
    one as well: the sticky bit protects existing entries, not the names yet to be
    created), and one owned by another user.  ``allow_shared=True`` accepts such a
    directory; then every user who can write it is trusted.
    """
    if allow_shared:
        return
    info = os.stat(folder)
    me = os.geteuid()
    if info.st_uid not in (me, 0):
        raise UnsafeDirectoryError(
            f"{os.fspath(folder)}: the {what} directory belongs to user {info.st_uid}, not to this user ({me}); "
            "pass allow_shared_directory=True to trust it"
        )
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectoryError(
            f"{os.fspath(folder)}: other users can write the {what} directory (mode "
            f"{stat.S_IMODE(info.st_mode):o}); make it writable by its owner only (chmod go-w) "
            "or pass allow_shared_directory=True to trust them"
        )


def open_own_file(path: str | os.PathLike[str], *, create: bool) -> int:
    """Open (creating when ``create``) a regular file of this user's own, never through a link.

    Raises :class:`UnsafeDirectoryError` for a symlink, a file that is not a regular one,
    one with other hard links, or one owned by another user: what an attacker plants.
    """
    flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    if create:
        flags |= os.O_CREAT
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeDirectoryError(f"{os.fspath(path)} is a symbolic link; refusing to follow it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid not in (os.geteuid(), 0):
            raise UnsafeDirectoryError(
                f"{os.fspath(path)} is not a plain file of this user's own (a link, a device, or another "
                "user's file); refusing to write it"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def reserve_lock_file(path: str | os.PathLike[str]) -> None:
    """Create the LMDB lock file when missing and give it real blocks before LMDB maps it.

    LMDB extends a new lock file with ``ftruncate``, a file of holes, and writes it through
    a memory map: on a full file system that write kills the process with SIGBUS before any
    error can be raised.  Allocating the blocks first turns that into ``ENOSPC`` here.
    """
    fd = open_own_file(path, create=True)
    try:
        info = os.fstat(fd)
        size = max(info.st_size, LOCK_FILE_BYTES)
        if info.st_blocks * 512 < size:  # holes (new, or extended by LMDB elsewhere): fill them
            os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)
