"""The chain entries of a bulk append: the C loop (``eventlog._plain``) against the pure-Python
maps, exactly, and a log written through each reads back and verifies."""

from __future__ import annotations

import os

import pytest
from factories import with_or_without_plain
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import EventLog, keys
from eventlog.keys import LINK, chain_entries, chain_entries_python, chain_key

needs_c = pytest.mark.skipif(keys._plain is None, reason="eventlog._plain was not built (no C compiler)")

digests = st.binary(min_size=32, max_size=32)


@pytest.fixture(params=["C loop", "pure-Python maps"])
def entries_built(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    return with_or_without_plain(keys, request, monkeypatch)


@needs_c
@settings(max_examples=300, deadline=None)
@given(
    number=st.integers(0, 2**64 - 1),
    base=st.integers(0, 2**64 - 1 - 40),
    pairs=st.lists(st.tuples(digests, digests), max_size=40),
    seq=st.integers(0, 2**64 - 1),
)
def test_the_c_loop_builds_exactly_the_python_entries(number, base, pairs, seq):
    nodes = [node for node, _ in pairs]
    found = [digest for _, digest in pairs]
    prefix = chain_key(number, 0)[:9]
    assert keys._plain.chain_entries(prefix, base, nodes, found, seq) == chain_entries_python(
        prefix, base, nodes, found, seq
    )


def test_an_entry_is_the_chain_key_and_the_link(entries_built):
    nodes, found = [os.urandom(32) for _ in range(3)], [os.urandom(32) for _ in range(3)]
    assert chain_entries(12, 40, nodes, found, 9) == [
        (chain_key(12, 40 + i), LINK.pack(nodes[i], found[i], 9, i)) for i in range(3)
    ]
    assert chain_entries(12, 40, [], [], 9) == []


@needs_c
@pytest.mark.parametrize(
    ("base", "nodes", "found", "error"),
    [
        (0, [b"x" * 31], [b"y" * 32], ValueError),  # every node and digest is 32 bytes
        (0, [b"x" * 32], [b"y" * 33], ValueError),
        (0, [b"x" * 32], [], ValueError),  # as many of each
        (-1, [], [], OverflowError),
        (2**64 - 1, [b"x" * 32, b"x" * 32], [b"y" * 32, b"y" * 32], OverflowError),  # positions past 64 bits
    ],
)
def test_the_c_loop_refuses_what_is_not_a_chain(base, nodes, found, error):
    with pytest.raises(error):
        keys._plain.chain_entries(b"p" * 9, base, nodes, found, 1)


def test_a_log_written_through_either_builds_the_same_chain(tmp_path, entries_built):
    messages = [{"role": "user", "content": f"message {i}", "n": i} for i in range(2100)]
    with EventLog.open(tmp_path / "log", durability="none") as log:
        log.flush("a", messages[:1500])
        log.flush("a", messages)  # a second bulk, after 1,500 stored positions
        log.flush("b", messages[:10])
        assert log.messages("a") == messages
        assert log.verify().ok  # the index compared entry by entry with the events
