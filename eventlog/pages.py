"""A structural check of the LMDB data file, read as plain bytes, that no damage can crash.

LMDB trusts its pages: a zeroed or stale page reached through a B-tree (what power
loss without sync, or a disk that lies, leaves) makes it fail an assertion and abort
the whole process (``IS_LEAF(mp)`` in ``mdb_cursor_next``), before any error can be
raised.  :func:`check_pages` walks every B-tree of the data file the way LMDB would,
from the meta page of the caller's read snapshot, but in Python over ``pread``: each
page reached must name itself, be of the kind its place in the tree needs, and hold
nodes that fit in it; large values must point at overflow pages that name themselves
and are long enough.  Only a file that passes is read through LMDB by
:func:`~eventlog.verify.verify`.  For a damaged page of the ``events`` table the
report names the seqs the page covered (the keys of the branch that points at it).

The layout read here is LMDB 0.9's on-disk format (py-lmdb bundles 0.9): a 16-byte
page header (page number, flags, lower and upper bounds, or the count of an overflow
run), two meta pages holding the roots of the free and main databases, and the named
databases as sub-database records in the main one.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
MAGIC = 0xBEEFC0DE
HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
PAGES = struct.Struct("<I")  # an overflow run's page count, in place of lower/upper
NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
DB = struct.Struct("<IHHQQQQQ")  # pad, flags, depth, branch, leaf, overflow pages, entries, root
META = struct.Struct("<IIQQ")  # magic, version, address, map size
P_INVALID = (1 << 64) - 1
HEADER_SIZE = 16


@dataclass(frozen=True, slots=True)
class DamagedPage:
    """A page reached from a B-tree that is not what its place in the tree needs."""

    pgno: int
    table: str
    what: str
    seqs: tuple[int, int | None] | None = None
    """For the events table: the seqs the page covered, ``(first, last)`` (``last`` None: to the end)."""

    def __str__(self) -> str:
        where = f"page {self.pgno} of the data file ({self.table} table"
        if self.seqs is not None:
            first, last = self.seqs
            where += f", events {first}..{'the end' if last is None else last}"
        return f"{where}) is damaged: {self.what}"


@dataclass(slots=True)
class PageReport:
    """What :func:`check_pages` found: the pages walked and the damaged ones."""

    pages: int = 0
    damaged: list[DamagedPage] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.damaged


class _Bad(Exception):
    pass


def check_pages(data_path: str, txnid: int | None = None, *, page_size: int | None = None) -> PageReport:
    """Walk every B-tree of the data file at ``data_path`` and report the damaged pages.

    ``txnid`` is the caller's read snapshot (``txn.id()``): the meta page of that
    transaction is used (or, when writers have committed twice since and it was reused, the
    newer one), so that pages a writer frees meanwhile stay as they were (the snapshot's
    reader slot keeps LMDB from reusing any page freed after it).  None takes the newer
    valid meta page.
    Never raises for damage; raises :class:`OSError` when the file cannot be read.
    """
    report = PageReport()
    fd = os.open(data_path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        psize = page_size or os.sysconf("SC_PAGE_SIZE")
        metas = [_meta(os.pread(fd, psize, n * psize)) for n in (0, 1)]
        valid = [m for m in metas if m is not None]
        # The snapshot's own meta page; once two later commits have reused it, a newer one: the
        # caller's open snapshot keeps every page freed after it from being written again.
        chosen = [m for m in valid if txnid is None or m[0] == txnid] or [
            m for m in valid if txnid is not None and m[0] > txnid
        ]
        if not chosen:
            report.damaged.append(DamagedPage(0, "meta", "no valid meta page names the snapshot being checked"))
            return report
        _, last_pg, free_db, main_db = max(chosen)
        walker = _Walker(fd, psize, min(last_pg, size // psize - 1), report)
        walker.tree("free", free_db, sorted_keys=False)
        named: list[tuple[bytes, bytes]] = []
        walker.tree("main", main_db, subdbs=named)
        for name, record in named:
            walker.tree(name.decode("utf-8", "replace"), record)
    finally:
        os.close(fd)
    return report


def _meta(page: bytes) -> tuple[int, int, bytes, bytes] | None:
    """``(txnid, last page, free db record, main db record)`` of a valid meta page, else None."""
    if len(page) < HEADER_SIZE + META.size + 2 * DB.size + 16:
        return None
    _, _, flags, _, _ = HEADER.unpack_from(page)
    magic, _version, _, _ = META.unpack_from(page, HEADER_SIZE)
    if not flags & P_META or magic != MAGIC:
        return None
    at = HEADER_SIZE + META.size
    free_db, main_db = page[at : at + DB.size], page[at + DB.size : at + 2 * DB.size]
    last_pg, txnid = struct.unpack_from("<QQ", page, at + 2 * DB.size)
    return txnid, last_pg, free_db, main_db


class _Walker:
    def __init__(self, fd: int, psize: int, last_pg: int, report: PageReport) -> None:
        self.fd, self.psize, self.last_pg, self.report = fd, psize, last_pg, report

    def tree(
        self,
        table: str,
        record: bytes,
        *,
        sorted_keys: bool = True,
        subdbs: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        if len(record) != DB.size:
            self.report.damaged.append(DamagedPage(0, table, "its database record is malformed"))
            return
        _, _, depth, _, _, _, _, root = DB.unpack(record)
        if root == P_INVALID:
            return  # empty
        events = table == "events"
        # (pgno, level, first seq covered, last seq covered)
        stack: list[tuple[int, int, int | None, int | None]] = [(root, 1, 1 if events else None, None)]
        while stack:
            pgno, level, low, high = stack.pop()
            self.report.pages += 1
            try:
                children = self._page(pgno, level, depth, sorted_keys, subdbs, events, table)
            except _Bad as e:
                seqs = (low or 1, high) if events else None
                self.report.damaged.append(DamagedPage(pgno, table, str(e), seqs))
                continue
            # Children come back in key order; each covers from its key up to the next one's.
            for i in range(len(children) - 1, -1, -1):
                child, key = children[i]
                child_low = low if i == 0 or not events else _seq(key)
                child_high = high if i == len(children) - 1 or not events else _seq(children[i + 1][1]) - 1
                stack.append((child, level + 1, child_low, child_high))

    def _read(self, pgno: int) -> bytes:
        if not 2 <= pgno <= self.last_pg:
            raise _Bad(f"it is past the end of the file or names a meta page (page {pgno})")
        page = os.pread(self.fd, self.psize, pgno * self.psize)
        if len(page) != self.psize:
            raise _Bad("the file ends inside it")
        return page

    def _page(
        self,
        pgno: int,
        level: int,
        depth: int,
        sorted_keys: bool,
        subdbs: list[tuple[bytes, bytes]] | None,
        events: bool,
        table: str,
    ) -> list[tuple[int, bytes]]:
        page = self._read(pgno)
        named, _, flags, lower, upper = HEADER.unpack_from(page)
        if named != pgno:
            raise _Bad(f"it names itself page {named} (zeroed, or a stale copy)")
        leaf = level == depth
        want = P_LEAF if leaf else P_BRANCH
        if flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META | P_LEAF2) != want:
            raise _Bad(f"its flags {flags:#x} are not those of a {'leaf' if leaf else 'branch'} page")
        if not HEADER_SIZE <= lower <= upper <= self.psize or (lower - HEADER_SIZE) % 2:
            raise _Bad(f"its bounds {lower}..{upper} do not fit the page")
        count = (lower - HEADER_SIZE) // 2
        if count == 0:
            raise _Bad("it holds no entries")
        offsets = struct.unpack_from(f"<{count}H", page, HEADER_SIZE)
        children: list[tuple[int, bytes]] = []
        previous: bytes | None = None
        for index, offset in enumerate(offsets):
            if not upper <= offset <= self.psize - NODE.size:
                raise _Bad(f"entry {index} starts outside the page's data")
            lo, hi, nflags, ksize = NODE.unpack_from(page, offset)
            key_at = offset + NODE.size
            if key_at + ksize > self.psize:
                raise _Bad(f"entry {index}'s key runs past the page")
            key = page[key_at : key_at + ksize]
            if sorted_keys and previous is not None and key <= previous:
                raise _Bad(f"entry {index}'s key is out of order")
            if leaf or index:  # a branch's first key is not stored: it covers everything below
                previous = key
            if not leaf:
                child = lo | hi << 16 | nflags << 32
                if events and index and ksize != 8:
                    raise _Bad(f"entry {index}'s key is not a seq")
                children.append((child, key))
                continue
            dsize = lo | hi << 16
            data_at = key_at + ksize
            if nflags & F_BIGDATA:
                if data_at + 8 > self.psize:
                    raise _Bad(f"entry {index}'s overflow page number runs past the page")
                self._overflow(struct.unpack_from("<Q", page, data_at)[0], dsize, index)
                continue
            if data_at + dsize > self.psize:
                raise _Bad(f"entry {index}'s value runs past the page")
            if nflags & F_SUBDATA and subdbs is not None:
                subdbs.append((key, page[data_at : data_at + dsize]))
        return children

    def _overflow(self, pgno: int, dsize: int, index: int) -> None:
        try:
            page = self._read(pgno)
        except _Bad as e:
            raise _Bad(f"entry {index}'s overflow page: {e}") from None
        named, _, flags, _, _ = HEADER.unpack_from(page)
        (pages,) = PAGES.unpack_from(page, 12)
        if named != pgno or not flags & P_OVERFLOW:
            raise _Bad(f"entry {index}'s overflow page {pgno} is not an overflow page (zeroed, or a stale copy)")
        if HEADER_SIZE + dsize > pages * self.psize or pgno + pages - 1 > self.last_pg:
            raise _Bad(f"entry {index}'s overflow run at page {pgno} is shorter than its value")
        self.report.pages += pages


def _seq(key: bytes) -> int:
    return int.from_bytes(key, "big") if len(key) == 8 else 0
