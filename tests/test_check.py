"""The default mode's edit check: the C accelerator against the pure-Python check.

Both must give the same answer for every message and every edit (exact agreement), and
neither may call a message unchanged whose canonical bytes changed.
"""

from __future__ import annotations

import copy
import math
import sys
from decimal import Decimal
from fractions import Fraction
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
# Interned strings (a role, a tool's name: literals in the caller's code) are held by a record's
# shared shape rather than by the record itself; other strings by the record.
interned = st.sampled_from(["user", "assistant", "tool", "role", "content", "stop", ""]).map(sys.intern)
leaves = st.one_of(st.none(), st.text(max_size=6), interned, numbers, st.integers(-(2**63), 2**64 - 1), st.floats())
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
keys = st.text(max_size=5) | interned
messages = st.dictionaries(keys, values, min_size=1, max_size=5)


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


class _Real(float):
    pass


class _Whole(int):
    pass


def _confusable(old: Any) -> list[Any]:
    """Values that Python's == may take for ``old`` although their canonical bytes differ, and
    equal fresh objects whose bytes do not."""
    out: list[Any] = [copy.deepcopy(old)]
    if type(old) is str:
        out += ["".join(list(old)) + "", sys.intern(old)]  # the same text, not (or now) interned
    if type(old) in (int, bool, float) and not (type(old) is float and math.isnan(old)):
        out += [int(old) if math.isfinite(old) else old, float(old), bool(old), -old]
    if type(old) is float and math.isfinite(old):
        out += [Decimal(old), Fraction(old), _Real(old), float(repr(old))]  # equal to ==, not to the codec
    if type(old) is int and abs(old) < 2**63:
        out += [Decimal(old), Fraction(old), _Whole(old), int(str(old))]
    if type(old) is tuple:
        out.append(list(old))
    if type(old) is list:
        out.append(tuple(old))
    if type(old) is dict:
        out.append(dict(reversed(old.items())))  # the same keys in another order: not an edit
        if old:
            out.append({**old, next(iter(old)): "replaced"})
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
    object would pass for the old one, so the record (or its shape) must hold every leaf."""
    key, role = "".join(["k"] * 9), sys.intern("".join(["r"] * 9))
    message = {"content": "".join(["a"] * 50), "n": 10**30, "t": 1717200007.5, key: role}
    held = [message["content"], message["n"], message["t"], key, role]
    counts = [sys.getrefcount(leaf) for leaf in held]
    record = snapshot._check.record(message, MAX_DEPTH)
    assert [sys.getrefcount(leaf) for leaf in held] == [n + 1 for n in counts]
    message["content"], message["n"], message["t"] = "other", 5, 2.5
    del message[key]
    message[key + "2"] = role
    assert not c_says_unchanged(record, message)
    del record
    assert [sys.getrefcount(leaf) for leaf in held[:3]] == counts[:3]  # let go with the record


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


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=40), st.data())
def test_c_and_python_checks_find_the_same_first_changed_message(
    held: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Over a held list (long enough for the C scan to look ahead of the message it checks),
    with edits at any positions, both checks name the same first changed message."""
    records = [snapshot._check.record(m, MAX_DEPTH) for m in held]
    copies = [snapshot.copy_message(m) for m in held]
    records = [snapshot.UNCOPYABLE if r is None else r for r in records]
    assert snapshot._check.first_changed(records, held, 0, len(held)) == len(held)
    for _ in range(data.draw(st.integers(0, 3), label="edits")):
        i = data.draw(st.integers(0, len(held) - 1), label="message")
        path = data.draw(st.sampled_from(_paths(held[i])), label="path")
        old: Any = held[i]
        for step in path:
            old = old[step]
        held[i] = _replace(held[i], path, data.draw(st.sampled_from(_confusable(old)) | values, label="new"))
    start = data.draw(st.integers(0, len(held)), label="start")
    c = snapshot._check.first_changed(records, held, start, len(held))
    assert c == snapshot._first_unequal(copies, held, start, len(held))


def test_a_shared_sub_object_edited_in_place_changes_every_message_holding_it() -> None:
    shared = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    held = [{"role": "assistant", "tool_calls": [shared]} for _ in range(20)]
    records = [snapshot._check.record(m, MAX_DEPTH) for m in held]
    copies = [snapshot.copy_message(m) for m in held]
    shared["function"]["arguments"] = '{"a": 1}'
    assert snapshot._check.first_changed(records, held, 0, 20) == 0 == snapshot._first_unequal(copies, held, 0, 20)
    assert snapshot._check.first_changed(records, held, 7, 20) == 7 == snapshot._first_unequal(copies, held, 7, 20)


class _Text(str):
    pass


class _Map(dict):
    pass


class _Items(list):
    pass


class _Liar(dict):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = None  # type: ignore[assignment]


class _Raises(str):
    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparison")

    __hash__ = str.__hash__


def _nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@pytest.mark.parametrize(
    "replacement",
    [
        _Text("hi"),
        _Map({"type": "text"}),
        _Items(["a"]),
        _Liar(),
        _Raises("hi"),
        _nested(100_000, "deep"),
        Decimal("1717200007.5"),
        b"hi",
        object(),
    ],
    ids=[
        "str subclass",
        "dict subclass",
        "list subclass",
        "lying __eq__",
        "raising __eq__",
        "deep",
        "Decimal",
        "bytes",
        "object",
    ],
)
def test_hostile_values_put_in_place_are_changes_to_the_c_check(replacement: Any) -> None:
    """The C check runs no Python code: a subclass, whatever its ``__eq__`` does, a value
    nested far deeper than any record, is a change, never a crash."""
    for key in ("content", "parts", "t"):
        message = {"role": "user", "content": "hi", "parts": [{"type": "text"}, ["a"]], "t": 1717200007.5}
        record = snapshot._check.record(message, MAX_DEPTH)
        message[key] = replacement
        assert not c_says_unchanged(record, message)
        if key == "parts":
            message[key] = [replacement, ["a"]]
            assert not c_says_unchanged(record, message)
        # The pure-Python check never crashes either; it judges a subclass by its own __eq__.
        snapshot._first_unequal([snapshot.copy_message({"content": "hi"})], [message], 0, 1)


def test_a_cycle_made_after_recording_is_a_change_and_ends() -> None:
    message: dict[str, Any] = {"role": "user", "parts": [["a"]]}
    record, copied = snapshot._check.record(message, MAX_DEPTH), snapshot.copy_message(message)
    message["parts"][0].append(message["parts"])  # parts -> [a, parts]: a cycle
    assert not c_says_unchanged(record, message) and not python_says_unchanged(copied, message)
    cyclic: dict[str, Any] = {"role": "user"}
    cyclic["self"] = cyclic
    assert snapshot._check.record(cyclic, MAX_DEPTH) is None and snapshot.copy_message(cyclic) is snapshot.UNCOPYABLE


def test_keys_in_another_order_or_other_equal_objects_are_not_changes() -> None:
    """Canonical bytes sort a dict's keys, so a dict rebuilt in another order is unchanged; a
    key or interned value replaced by an equal string is too, another one is not."""
    role = sys.intern("assistant")
    message = {"role": role, "content": "x", "tool_calls": [{"id": "c1", "type": "function"}]}
    record = snapshot._check.record(message, MAX_DEPTH)
    rebuilt = {"tool_calls": [{"type": "function", "id": "c1"}], "content": "x", "role": "".join(["assis", "tant"])}
    assert c_says_unchanged(record, rebuilt)
    rebuilt["role"] = "user"
    assert not c_says_unchanged(record, rebuilt)
    renamed = {"".join(["ro", "le"]): role, "content": "x", "tool_calls": [{"id": "c1", "type": "function"}]}
    assert c_says_unchanged(record, renamed)
    renamed[_Text("id")] = renamed.pop("content")  # a key of another type in the lookup path
    assert not c_says_unchanged(record, renamed)


def test_a_dict_made_where_a_recorded_one_was_freed_is_not_taken_for_it() -> None:
    """A record notes where its dicts were (a dict found there, unchanged, is not read again):
    a new dict made at a freed one's address, as Python's allocator does at once, is checked."""
    message: dict[str, Any] = {"role": "user", "meta": {"k": "v1"}, "parts": [{"k": "v1"}]}
    record, copied = snapshot._check.record(message, MAX_DEPTH), snapshot.copy_message(message)
    message["meta"] = None  # the recorded dict is freed
    message["meta"] = {"k": "v2"}
    message["parts"][0] = None
    message["parts"][0] = {"k": "v2"}
    assert not c_says_unchanged(record, message) and not python_says_unchanged(copied, message)
    message["meta"]["k"] = message["parts"][0]["k"] = "v1"
    assert c_says_unchanged(record, message) and python_says_unchanged(copied, message)


def test_a_value_assigned_again_is_unchanged_and_a_list_edited_in_an_unchanged_dict_is_not() -> None:
    content = "".join(["text"] * 30)
    message: dict[str, Any] = {"role": "user", "content": content, "parts": ["a", ["b"]]}
    record = snapshot._check.record(message, MAX_DEPTH)
    message["content"] = content  # the very same object: the dict is unchanged
    assert c_says_unchanged(record, message)
    message["content"] = "".join(["text"] * 30)  # an equal string: the dict changed, its text did not
    assert c_says_unchanged(record, message)
    message["parts"][1].append("c")  # the dict holding the list is untouched
    assert not c_says_unchanged(record, message)
    message["parts"][1].pop()
    assert c_says_unchanged(record, message)
    message["parts"][1][0] = "".join(["b", "!"])[:1]
    assert c_says_unchanged(record, message)
    message["parts"][1][0] = "c"
    assert not c_says_unchanged(record, message)
