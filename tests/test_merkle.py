"""RFC 9162 Merkle trees, against the transparency-dev/merkle test vectors.

``tests/data/transparency-dev-merkle.json`` holds, unchanged, the inclusion and
consistency probes of https://github.com/transparency-dev/merkle (``testdata/``) and
the leaf inputs and roots of its ``testonly/constants.go`` (Apache License 2.0,
Copyright Google LLC; see the file's ``source``, ``commit`` and ``license``).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import merkle
from eventlog.merkle import Frontier, ProofError

VECTORS = json.loads((Path(__file__).parent / "data" / "transparency-dev-merkle.json").read_text())
LEAVES = [merkle.leaf_hash(bytes.fromhex(h)) for h in VECTORS["leaf_inputs_hex"]]
ROOTS = [bytes.fromhex(h) for h in VECTORS["root_hashes_hex"]]


def b64(values):
    return [base64.b64decode(v) for v in values or ()]  # Go writes an empty proof as null


def store(leaves):
    """The complete nodes of the tree over ``leaves``, as a tree's storage keeps them."""
    nodes = {}
    frontier = Frontier()
    for leaf in leaves:
        for level, index, h in frontier.append(leaf):
            nodes[level, index] = h
    return lambda level, index: nodes[level, index]


def test_hasher_matches_rfc6962_vectors():
    h = VECTORS["hasher_hex"]
    assert merkle.EMPTY_ROOT.hex() == h["empty"]
    assert merkle.leaf_hash(b"").hex() == h["leaf_empty"]
    assert merkle.leaf_hash(b"L123456").hex() == h["leaf_L123456"]
    assert merkle.node_hash(b"N123", b"N456").hex() == h["children_N123_N456"]


def test_roots_of_every_prefix_match_the_reference():
    for size, expected in enumerate(ROOTS):
        assert merkle.root(LEAVES[:size]) == expected, size


@pytest.mark.parametrize("probe", VECTORS["inclusion"], ids=lambda p: p["file"].split("testdata/")[1])
def test_inclusion_probes(probe):
    leaf, root, proof = base64.b64decode(probe["leafHash"]), base64.b64decode(probe["root"]), b64(probe["proof"])
    if probe["wantErr"]:
        with pytest.raises(ProofError):
            merkle.verify_inclusion(probe["leafIdx"], probe["treeSize"], leaf, proof, root)
    else:
        merkle.verify_inclusion(probe["leafIdx"], probe["treeSize"], leaf, proof, root)


@pytest.mark.parametrize("probe", VECTORS["consistency"], ids=lambda p: p["file"].split("testdata/")[1])
def test_consistency_probes(probe):
    args = (
        probe["size1"],
        probe["size2"],
        base64.b64decode(probe["root1"]),
        base64.b64decode(probe["root2"]),
        b64(probe["proof"]),
    )
    if probe["wantErr"]:
        with pytest.raises(ProofError):
            merkle.verify_consistency(*args)
    else:
        merkle.verify_consistency(*args)


def test_generated_proofs_equal_the_published_ones():
    """The probes' happy paths are proofs in the reference tree: ours must be the same bytes."""
    get = store(LEAVES)
    happy = [p for p in VECTORS["inclusion"] if p["desc"] == "happy path"]
    assert len(happy) >= 4
    for p in happy:
        assert merkle.inclusion_proof(get, p["leafIdx"], p["treeSize"]) == b64(p["proof"])
        assert base64.b64decode(p["root"]) == ROOTS[p["treeSize"]]
    happy = [p for p in VECTORS["consistency"] if p["desc"] == "happy path" and p["size1"] != p["size2"]]
    assert len(happy) >= 3
    for p in happy:
        assert merkle.consistency_proof(get, p["size1"], p["size2"]) == b64(p["proof"])


def test_every_proof_in_the_reference_tree_verifies_and_a_wrong_root_does_not():
    get = store(LEAVES)
    for size in range(1, 9):
        for index in range(size):
            proof = merkle.inclusion_proof(get, index, size)
            merkle.verify_inclusion(index, size, LEAVES[index], proof, ROOTS[size])
            with pytest.raises(ProofError):
                merkle.verify_inclusion(index, size, LEAVES[index], proof, ROOTS[size - 1])
        for old in range(1, size + 1):
            merkle.verify_consistency(old, size, ROOTS[old], ROOTS[size], merkle.consistency_proof(get, old, size))


@settings(deadline=None, max_examples=60)  # a shared machine: no per-example deadline
@given(st.integers(1, 300), st.data())
def test_proofs_of_random_trees_verify(size, data):
    leaves = [merkle.leaf_hash(i.to_bytes(4, "big")) for i in range(size)]
    get = store(leaves)
    frontier = Frontier.load(get, size)
    assert frontier.root() == merkle.root(leaves)
    index = data.draw(st.integers(0, size - 1))
    old = data.draw(st.integers(1, size))
    root, old_root = merkle.root(leaves), merkle.root(leaves[:old])
    merkle.verify_inclusion(index, size, leaves[index], merkle.inclusion_proof(get, index, size), root)
    proof = merkle.consistency_proof(get, old, size)
    merkle.verify_consistency(old, size, old_root, root, proof)
    if old < size:
        forked = leaves[: old - 1] + [merkle.leaf_hash(b"forged")]
        with pytest.raises(ProofError):
            merkle.verify_consistency(old, size, merkle.root(forked), root, proof)


def test_requests_for_proofs_that_cannot_exist_are_refused():
    get = store(LEAVES)
    with pytest.raises(ProofError, match="not in a tree of 3 leaves"):
        merkle.inclusion_proof(get, 3, 3)
    with pytest.raises(ProofError, match="no consistency proof"):
        merkle.consistency_proof(get, 5, 4)
    with pytest.raises(ValueError, match="frontier nodes"):
        Frontier(3, [LEAVES[0]])
