from __future__ import annotations

import datetime
import math
from hashlib import sha256

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventlog import InvalidMessageError, codec

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
messages = st.dictionaries(st.text(max_size=10).filter(lambda k: not k.startswith("_")), json_values, max_size=6)


def test_canonical_is_sorted_msgpack_without_underscore_keys():
    body = codec.canonical({"role": "user", "content": "hi", "_private": object()}, 0)
    assert body == msgspec.msgpack.encode({"content": "hi", "role": "user"})


def test_key_order_does_not_change_bytes():
    a = codec.canonical({"a": 1, "b": {"x": 1, "y": 2}}, 0)
    b = codec.canonical({"b": {"y": 2, "x": 1}, "a": 1}, 0)
    assert a == b


def test_node_digest_chains_parent_and_content():
    digest = codec.content_digest(b"abc")
    assert digest == sha256(b"abc").digest()
    assert codec.node_digest(codec.ZERO, digest) == sha256(bytes(32) + digest).digest()


def test_strip_leaves_the_input_alone():
    message = {"role": "user", "_mark": True}
    assert codec.strip(message) == {"role": "user"}
    assert message == {"role": "user", "_mark": True}


@given(messages)
def test_round_trip(message):
    assert codec.decode(codec.canonical(message, 0)) == message


@given(messages)
def test_canonical_is_a_fixpoint(message):
    body = codec.canonical(message, 0)
    assert codec.canonical(codec.decode(body), 0) == body


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (b"bytes", "bytes is not JSON-like"),
        (datetime.datetime(2024, 1, 1), "datetime is not JSON-like"),
        ({1, 2}, "set is not JSON-like"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (2**64, "64 bits"),
        ("\ud800", "lone surrogate"),
        (object(), "object is not JSON-like"),
    ],
)
def test_non_json_values_are_refused_with_their_path(value, fragment):
    message = {"role": "assistant", "tool_calls": [{"function": {"arguments": value}}]}
    with pytest.raises(InvalidMessageError) as info:
        codec.canonical(message, 3)
    text = str(info.value)
    assert text.startswith('messages[3]["tool_calls"][0]["function"]["arguments"]: ')
    assert fragment in text
    assert info.value.index == 3


def test_non_string_keys_are_refused():
    with pytest.raises(InvalidMessageError, match=r"messages\[0\]\[\"meta\"\]\[1\]: key 1 is a int"):
        codec.canonical({"meta": {1: "x"}}, 0)


def test_non_mapping_message_is_refused():
    with pytest.raises(InvalidMessageError, match=r"messages\[2\]: list is not a message"):
        codec.canonical(["role", "user"], 2)


def test_deep_nesting_is_limited():
    value: object = "leaf"
    for _ in range(codec.MAX_DEPTH + 5):
        value = [value]
    with pytest.raises(InvalidMessageError, match="nested deeper than"):
        codec.canonical({"content": value}, 0)


def test_tuples_come_back_as_lists():
    assert codec.decode(codec.canonical({"args": (1, "a")}, 0)) == {"args": [1, "a"]}


class _Text(str):
    pass


odd_leaves = (
    st.binary(max_size=3)
    | st.just(math.nan)
    | st.just(-math.inf)
    | st.frozensets(st.integers(0, 3), max_size=2)
    | st.builds(_Text, st.text(max_size=3))
    | st.datetimes()
)
any_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text() | odd_leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(
            st.text(max_size=4) | st.integers(0, 3) | st.builds(_Text, st.text(max_size=1)), children, max_size=3
        )
    ),
    max_leaves=12,
)
any_messages = st.dictionaries(st.text(max_size=2) | st.builds(_Text, st.text(max_size=1)), any_values, max_size=5)


@given(st.lists(any_messages, min_size=1, max_size=6))
def test_a_batch_shown_plain_passes_every_check_of_each_message(batch):
    try:
        for message in batch:
            codec.encode(message)
    except Exception:
        return  # plain_batch is only asked about what msgspec encoded
    if codec.plain_batch(batch):
        for index, message in enumerate(batch):
            assert codec.inspect(message, index) is False  # valid, and no `_` key


@given(st.lists(messages, min_size=1, max_size=6))
def test_a_batch_of_plain_messages_is_shown_plain(batch):
    assert codec.plain_batch(batch)


@pytest.mark.parametrize(
    "odd",
    [
        {"_note": "x"},
        {"t": math.nan},
        {"t": [1.0, math.inf]},
        {"meta": {1: "x"}},
        {"meta": [{"k": b"bytes"}]},
        {"args": ({"a": datetime.datetime(2024, 1, 1)},)},
        {"text": _Text("x")},
        {_Text("role"): "tool"},  # equal to the key "role" of the first message, but not a str
        {"meta": {_Text("role"): 1}},
    ],
)
def test_a_batch_with_one_odd_message_is_not_shown_plain(odd):
    batch = [
        {"role": "user", "content": "hi", "t": 1.5},
        {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]},
    ]
    assert codec.plain_batch(batch)
    assert not codec.plain_batch([*batch, {"name": "x", **odd}])
    assert not codec.plain_batch([*batch, {"meta": {"role": 0}}, {**odd}])


@pytest.mark.parametrize("depth", [codec.MAX_DEPTH - 1, codec.MAX_DEPTH])
def test_a_batch_is_shown_plain_exactly_up_to_the_nesting_limit(depth):
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    try:
        codec.inspect({"content": value}, 0)
        valid = True
    except InvalidMessageError:
        valid = False
    assert valid is (depth < codec.MAX_DEPTH)
    assert codec.plain_batch([{"content": value}]) is valid
