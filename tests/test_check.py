"""The default mode's edit check: the C accelerator against the pure-Python check.

Both must give the same answer for every message and every edit (exact agreement), and
neither may call a message unchanged whose canonical bytes changed.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import codec, snapshot
from eventlog.codec import MAX_DEPTH

pytestmark = pytest.mark.skipif(snapshot._check is None, reason="eventlog._check was not built (no C compiler)")

numbers = st.sampled_from(
    [0, 1, -1, 2**63 - 1, 2**64 - 1, True, False, 0.0, -0.0, 1.0, 2.5, -7.25, 1e300, math.inf, math.nan]
)
leaves = st.one_of(st.none(), st.text(max_size=6), numbers, st.integers(-(2**63), 2**64 - 1), st.floats())
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
messages = st.dictionaries(st.text(max_size=5), values, min_size=1, max_size=5)


def c_says_unchanged(record: Any, live: Any) -> bool:
    return snapshot._check.first_changed([record], [live], 0, 1) == 1


def python_says_unchanged(copied: Any, live: Any) -> bool:
    return snapshot._first_unequal([copied], [live], 0, 1) == 1


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*path, key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            out += _paths(item, (*path, i))
    return out


def _replace(value: Any, path: tuple, new: Any) -> Any:
    """``value`` with the item at ``path`` replaced, editing dicts and lists in place (as a
    caller would) and rebuilding tuples."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, tuple):
        items = list(value)
        items[head] = _replace(items[head], rest, new)
        return tuple(items)
    value[head] = _replace(value[head], rest, new)
    return value


def _confusable(old: Any) -> list[Any]:
    """Values that Python's == may take for ``old`` although their canonical bytes differ, and
    equal fresh objects whose bytes do not."""
    out: list[Any] = [copy.deepcopy(old)]
    if type(old) is str:
        out.append("".join(list(old)) + "")
    if type(old) in (int, bool, float) and not (type(old) is float and math.isnan(old)):
        out += [int(old) if math.isfinite(old) else old, float(old), bool(old), -old]
    if type(old) is tuple:
        out.append(list(old))
    if type(old) is list:
        out.append(tuple(old))
    return out


@settings(max_examples=400, deadline=None)
@given(messages, st.data())
def test_c_and_python_checks_agree_on_every_edit(message: dict[str, Any], data: st.DataObject) -> None:
    record, copied = snapshot._check.record(message, MAX_DEPTH), snapshot.copy_message(message)
    assert (record is None) == (copied is snapshot.UNCOPYABLE)
    if record is None:
        return
    # Untouched: both say unchanged.
    assert c_says_unchanged(record, message) and python_says_unchanged(copied, message)
    before = codec.encode(message)
    path = data.draw(st.sampled_from(_paths(message)), label="path")
    old: Any = message
    for step in path:
        old = old[step]
    new = data.draw(st.sampled_from(_confusable(old)) | values, label="new")
    edited = _replace(message, path, new)
    c, py = c_says_unchanged(record, edited), python_says_unchanged(copied, edited)
    assert c == py
    if c:
        assert codec.encode(edited) == before  # never "unchanged" when the bytes changed


RICH = {
    "role": "assistant",
    "content": [{"type": "text", "text": "hi"}, {"type": "image", "detail": None}],
    "n": 1,
    "big": 2**64 - 1,
    "ok": True,
    "no": False,
    "zero": 0.0,
    "minus": -0.0,
    "whole": 3.0,
    "t": 1717200007.5,
    "pair": ("a", 2),
    "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
}


def test_c_and_python_checks_agree_on_every_confusable_edit_of_every_leaf() -> None:
    base = copy.deepcopy(RICH)
    for path in _paths(base):
        old: Any = base
        for step in path:
            old = old[step]
        for new in _confusable(old):
            message = copy.deepcopy(RICH)
            record, copied = snapshot._check.record(message, MAX_DEPTH), snapshot.copy_message(message)
            before = codec.encode(message)
            edited = _replace(message, path, new)
            c, py = c_says_unchanged(record, edited), python_says_unchanged(copied, edited)
            assert c == py, (path, old, new)
            assert not c or codec.encode(edited) == before, (path, old, new)


@pytest.mark.parametrize(
    "value",
    [{1: "int key"}, {"s": {1, 2}}, {"b": b"bytes"}, {"deep": _deep} if (_deep := None) else {"x": object()}],
)
def test_messages_holding_anything_but_json_like_values_are_remembered_by_neither(value: dict) -> None:
    assert snapshot._check.record(value, MAX_DEPTH) is None
    assert snapshot.copy_message(value) is snapshot.UNCOPYABLE


def test_nesting_deeper_than_the_limit_is_remembered_by_neither() -> None:
    seen = set()
    for depth in range(MAX_DEPTH - 2, MAX_DEPTH + 3):
        for leaf in (1, "s", [], {}):
            value: Any = leaf
            for _ in range(depth):
                value = [value]
            message = {"v": value}
            recordable = snapshot._check.record(message, MAX_DEPTH) is not None
            assert recordable == (snapshot.copy_message(message) is not snapshot.UNCOPYABLE), (depth, leaf)
            seen.add(recordable)
    assert seen == {True, False}  # the limit lies inside the range tried


def test_a_record_keeps_its_leaves_alive() -> None:
    """The check compares leaves by identity first: a leaf freed and its address reused by a new
    object would pass for the old one, so the record must hold every leaf."""
    message = {"content": "".join(["a"] * 50), "n": 10**30}
    record = snapshot._check.record(message, MAX_DEPTH)
    leaves = [message["content"], message["n"]]
    message["content"], message["n"] = "other", 5
    assert all(any(leaf is kept for kept in record) for leaf in leaves)
    assert not c_says_unchanged(record, message)


def test_first_changed_scans_a_list_and_stops_at_markers() -> None:
    held = [{"role": "user", "content": str(i)} for i in range(100)]
    records = [snapshot._check.record(m, MAX_DEPTH) for m in held]
    assert snapshot._check.first_changed(records, held, 0, 100) == 100
    held[70]["content"] = "edited"
    assert snapshot._check.first_changed(records, held, 0, 100) == 70
    assert snapshot._check.first_changed(records, held, 71, 100) == 100
    records[10] = snapshot.PENDING
    assert snapshot._check.first_changed(records, held, 0, 100) == 10
    assert snapshot._check.first_changed(records, held[:50], 0, 100) == 10
    assert snapshot._check.first_changed(records[:5], held, 0, 100) == 5  # shorter lists end the scan
