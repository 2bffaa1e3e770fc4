"""RFC 9162 Merkle trees: hashing, roots, inclusion and consistency proofs.

Pure functions over SHA-256, no storage and no third-party code.

- leaf hash  = SHA-256(0x00 || leaf input)
- node hash  = SHA-256(0x01 || left || right)
- the root of an empty tree is SHA-256 of nothing.

A tree of ``n`` leaves splits at ``k``, the largest power of two below ``n``
(RFC 9162, section 2.1.1).  Every interior node of that shape that is *complete*
(covers ``2**level`` leaves starting at a multiple of ``2**level``) never changes
once its last leaf is in; the tree's storage keeps exactly those, addressed as
``(level, index)``, and every other hash a proof needs is computed from them
(:func:`subtree_hash`).  Growing the tree by one leaf completes one node per
trailing one bit of the old size, all at the tree's right edge
(:class:`Frontier`).

The proof and verification algorithms are those of RFC 9162, sections 2.1.3 and
2.1.4, checked against the transparency-dev/merkle test vectors.  Verification is
in :mod:`eventlog.verifier` (re-exported here), which runs without the rest of the
package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# The verifying half lives in the stand-alone verifier, so there is one copy of it.
from .verifier import (
    EMPTY_ROOT,
    ProofError,
    leaf_hash,
    node_hash,
    root_from_inclusion,
    verify_consistency,
    verify_inclusion,
)

__all__ = [
    "EMPTY_ROOT",
    "Frontier",
    "ProofError",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "root",
    "root_from_inclusion",
    "subtree_hash",
    "verify_consistency",
    "verify_inclusion",
]


def _split(n: int) -> int:
    """The largest power of two smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """The root of the tree over ``leaves`` (leaf *hashes*), computed from scratch."""
    if not leaves:
        return EMPTY_ROOT
    frontier = Frontier()
    for leaf in leaves:
        frontier.append(leaf)
    return frontier.root()


NodeGetter = Callable[[int, int], bytes]
"""``get(level, index)``: the hash of the complete node covering leaves
``index * 2**level .. (index + 1) * 2**level - 1`` (level 0: the leaf hashes)."""


def subtree_hash(get: NodeGetter, lo: int, hi: int) -> bytes:
    """MTH of leaves ``lo .. hi-1`` from the complete nodes ``get`` returns.

    ``lo`` must be where the tree's recursive split puts a subtree, as it is for every
    subtree a proof names: then ``hi - lo`` leaves decompose into complete nodes.
    """
    size = hi - lo
    if size <= 0:
        raise ProofError(f"empty range {lo}..{hi}")
    if size & (size - 1) == 0 and lo % size == 0:
        level = size.bit_length() - 1
        return get(level, lo >> level)
    k = _split(size)
    return node_hash(subtree_hash(get, lo, lo + k), subtree_hash(get, lo + k, hi))


def inclusion_proof(get: NodeGetter, index: int, size: int) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of the first ``size`` leaves (RFC 9162 2.1.3.1)."""
    if not 0 <= index < size:
        raise ProofError(f"leaf {index} is not in a tree of {size} leaves")
    path: list[bytes] = []
    lo, hi = 0, size
    # Walk down from the root, collecting the sibling of each subtree the leaf is in;
    # the path lists them from the leaf up.
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append(subtree_hash(get, lo + k, hi))
            hi = lo + k
        else:
            path.append(subtree_hash(get, lo, lo + k))
            lo = lo + k
    path.reverse()
    return path


def consistency_proof(get: NodeGetter, old: int, new: int) -> list[bytes]:
    """The proof that the tree of ``old`` leaves is a prefix of the tree of ``new`` (RFC 9162 2.1.4.1)."""
    if not 0 < old <= new:
        raise ProofError(f"no consistency proof from a tree of {old} leaves to one of {new}")
    if old == new:
        return []
    proof: list[bytes] = []

    def subproof(m: int, lo: int, hi: int, whole: bool) -> None:
        n = hi - lo
        if m == n:
            if not whole:
                proof.append(subtree_hash(get, lo, hi))
            return
        k = _split(n)
        if m <= k:
            subproof(m, lo, lo + k, whole)
            proof.append(subtree_hash(get, lo + k, hi))
        else:
            subproof(m - k, lo + k, hi, False)
            proof.append(subtree_hash(get, lo, lo + k))

    subproof(old, 0, new, True)
    return proof


class Frontier:
    """The right edge of a growing tree: one complete node per set bit of its size.

    Enough to compute the root and to append leaves; :meth:`append` returns the
    complete nodes the new leaf finished, for a store to keep.

    >>> f = Frontier()
    >>> [(level, index) for level, index, _ in f.append(leaf_hash(b"a")) + f.append(leaf_hash(b"b"))]
    [(0, 0), (0, 1), (1, 0)]
    >>> f.root() == node_hash(leaf_hash(b"a"), leaf_hash(b"b"))
    True
    """

    __slots__ = ("nodes", "size")

    def __init__(self, size: int = 0, nodes: Sequence[bytes] = ()) -> None:
        if len(nodes) != bin(size).count("1"):
            raise ValueError(f"a tree of {size} leaves has {bin(size).count('1')} frontier nodes, not {len(nodes)}")
        self.size = size
        self.nodes = list(nodes)
        """From the largest (leftmost) subtree to the smallest."""

    @classmethod
    def load(cls, get: NodeGetter, size: int) -> Frontier:
        """The frontier of the tree of ``size`` leaves, read from its complete nodes."""
        nodes = []
        lo = 0
        for level in range(size.bit_length() - 1, -1, -1):
            if size >> level & 1:
                nodes.append(get(level, lo >> level))
                lo += 1 << level
        return cls(size, nodes)

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add a leaf hash; return the complete nodes it finished as ``(level, index, hash)``."""
        done = [(0, self.size, leaf)]
        node = leaf
        level = 0
        size = self.size
        while size >> level & 1:
            node = node_hash(self.nodes.pop(), node)
            level += 1
            done.append((level, size >> level, node))
        self.nodes.append(node)
        self.size = size + 1
        return done

    def root(self) -> bytes:
        """The root hash of the tree so far."""
        if not self.nodes:
            return EMPTY_ROOT
        r = self.nodes[-1]
        for node in reversed(self.nodes[:-1]):
            r = node_hash(node, r)
        return r
