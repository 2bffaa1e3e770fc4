"""The batch check of a bulk flush: the C walk against the pure-Python passes, and a bulk flush
through each (a bad message in the middle, unicode, huge messages).

Both checks must give the same answer for every batch (exact agreement), and neither may pass
a batch holding something the per-message inspection refuses.
"""

from __future__ import annotations

import decimal
import enum
import math
import uuid
from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import EventLog, codec
from eventlog.codec import MAX_DEPTH
from eventlog.errors import InvalidMessageError


class Colour(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    ONE = 1


class Text(str):
    pass


odd = st.sampled_from(
    [
        decimal.Decimal("1.5"),
        uuid.UUID(int=7),
        b"bytes",
        bytearray(b"x"),
        {1, 2},
        frozenset(),
        Colour.RED,
        Level.ONE,
        Text("t"),
        OrderedDict(a=1),
        1j,
    ]
)
numbers = st.sampled_from([0, 1, -1, 2**63 - 1, 2**64 - 1, True, False, 0.0, -0.0, 2.5, 1e300, math.inf, -math.inf])
leaves = st.one_of(st.none(), st.text(max_size=6), numbers, st.floats(), st.integers(-(2**70), 2**70), odd)
keys = st.one_of(st.text(max_size=4), st.sampled_from(["_", "_x", "a_", ""]), st.sampled_from([1, None, Text("k")]))
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.lists(inner, max_size=3).map(tuple) | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.dictionaries(keys, values, max_size=5)


def nested(depth: int, leaf: Any, container: str = "list") -> Any:
    """``leaf`` inside ``depth`` containers."""
    value = leaf
    for _ in range(depth):
        value = [value] if container == "list" else (value,) if container == "tuple" else {"k": value}
    return value


needs_c = pytest.mark.skipif(codec._plain is None, reason="eventlog._plain was not built (no C compiler)")


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.lists(messages, max_size=6))
def test_the_c_walk_answers_as_the_python_passes(batch):
    python = codec.plain_batch_python(batch)
    assert codec._plain.plain_batch(batch, MAX_DEPTH, False) == python
    if python:  # a batch shown plain is one the per-message inspection passes
        for i, message in enumerate(batch):
            try:
                codec.encode(message)
            except Exception:
                continue  # not what plain_batch is asked about: the flush inspects it anyway
            assert codec.inspect(message, i) is False
    checked = codec.plain_batch_python(batch, ints=True)
    assert codec._plain.plain_batch(batch, MAX_DEPTH, True) == checked
    assert checked <= python
    if checked:  # with its ints checked, a batch shown plain is one canonical() takes whole
        for i, message in enumerate(batch):
            assert codec.canonical(message, i) == codec.encode(message)


@pytest.mark.parametrize("container", ["list", "tuple", "dict"])
@pytest.mark.parametrize(
    ("depth", "leaf", "plain"),
    [
        (MAX_DEPTH - 2, 1.5, True),  # the float at depth MAX_DEPTH - 1
        (MAX_DEPTH - 1, 1.5, False),  # a float at MAX_DEPTH: the slow path decides
        (MAX_DEPTH - 1, "text", True),  # leaves may sit at any depth
        (MAX_DEPTH - 1, [], False),  # a container at MAX_DEPTH
        (MAX_DEPTH - 2, [], True),
        (3, math.nan, False),
        (3, math.inf, False),
        (3, decimal.Decimal(1), False),
        (3, Text("x"), False),
    ],
)
def test_the_edges_of_a_plain_batch(batch_check, container, depth, leaf, plain):
    batch = [{"role": "user"} for _ in range(40)]
    batch[20]["deep"] = nested(depth, leaf, container)
    assert codec.plain_batch(batch) is plain


@pytest.mark.parametrize(
    ("number", "fits"), [(2**64 - 1, True), (2**64, False), (-(2**63), True), (-(2**63) - 1, False), (2**200, False)]
)
def test_ints_are_checked_when_asked(batch_check, number, fits):
    batch = [{"role": "user", "n": 1} for _ in range(40)]
    batch[39]["content"] = [{"n": number}]
    assert codec.plain_batch(batch)  # a flush: msgspec's encoding already checked them
    assert codec.plain_batch(batch, ints=True) is fits


def test_what_a_plain_batch_may_not_hold(batch_check):
    base = [{"role": "user", "content": "hi"} for _ in range(40)]
    assert codec.plain_batch(base)
    for bad in ({"_private": 1}, {1: "int key"}, {Text("kind"): "x"}, {"x": {2: "nested int key"}}, {"x": b"b"}):
        batch = [dict(m) for m in base]
        batch[33].update(bad)
        assert not codec.plain_batch(batch), bad
    assert codec.plain_batch([{"a_": 1, "": 2}])  # only a leading underscore marks a key private


def test_a_bad_message_in_the_middle_of_a_bulk_flush_leaves_nothing_written(tmp_path, batch_check):
    batch = [{"role": "user", "content": f"message {i}", "n": i, "f": i / 3} for i in range(5000)]
    batch[2718]["content"] = {"parts": [{"text": "ok"}, {"value": decimal.Decimal("2.5")}]}
    with EventLog.open(tmp_path / "log", durability="none") as log:
        with pytest.raises(InvalidMessageError, match=r'messages\[2718\]\["content"\]\["parts"\]\[1\]\["value"\]'):
            log.flush("s", batch)
        assert log.last_seq == 0 and "s" not in log
        batch[2718]["content"]["parts"][1]["value"] = math.nan
        with pytest.raises(InvalidMessageError, match=r"messages\[2718\].*nan"):
            log.flush("s", batch)
        assert log.last_seq == 0 and "s" not in log
        batch[2718]["content"] = "fine"
        assert log.flush("s", batch).appended == 5000
        assert log.messages("s") == batch
        assert log.verify().ok


def test_unicode_and_huge_messages_flush_in_bulk_as_one_by_one(tmp_path, batch_check):
    texts = ["plain", "é", "中文", "😀 emoji", "\u2028 line separator", "\x00 nul", "ﬁ ligature"]
    batch = [{"role": "user", "content": texts[i % len(texts)] * (1 + i % 5), "i": i} for i in range(200)]
    batch[100]["content"] = "x" * 8_000_000 + "é"  # larger than the event buffer a store keeps
    batch[150]["tool_calls"] = [{"function": {"name": "f", "arguments": "{}" * 100_000}}]
    with (
        EventLog.open(tmp_path / "bulk", durability="none") as bulk,
        EventLog.open(tmp_path / "one", durability="none") as one,
    ):
        head = bulk.flush("s", batch).head
        for i in range(len(batch)):  # one message at a time: the per-message path
            one.flush("s", batch[: i + 1])
        assert one.head("s") == head
        assert bulk.messages("s") == batch
        assert bulk.verify().ok
