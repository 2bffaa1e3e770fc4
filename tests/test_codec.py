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
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
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
    with pytest.raises(InvalidMessageError, match=r"messages\[2\]: list is not a mapping"):
        codec.canonical(["role", "user"], 2)


def test_deep_nesting_is_limited():
    value: object = "leaf"
    for _ in range(codec.MAX_DEPTH + 5):
        value = [value]
    with pytest.raises(InvalidMessageError, match="nested deeper than"):
        codec.canonical({"content": value}, 0)


def test_tuples_come_back_as_lists():
    assert codec.decode(codec.canonical({"args": (1, "a")}, 0)) == {"args": [1, "a"]}
