"""The C loops of the projections (``projections._rows``) against their pure-Python counterparts,
exactly: a row's derived columns, and the shaping of a SQLite projection's rows for
``executemany``; a projection written through either holds the same rows."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventlog import EventLog
from projections import SQLiteProjection, rows, sqlite_store
from projections.core import ROW_COLUMNS
from projections.sqlite_store import group_rows, group_rows_python

needs_c = pytest.mark.skipif(sqlite_store._rows is None, reason="projections._rows was not built (no C compiler)")


@pytest.fixture(params=["C loop", "pure-Python loop"])
def grouped_by(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param_index == 0:
        if sqlite_store._rows is None:
            pytest.skip("projections._rows was not built (no C compiler)")
    else:
        monkeypatch.setattr(sqlite_store, "_rows", None)
        monkeypatch.setattr(rows, "_rows", None)
    return str(request.param)


def tagged(value: Any) -> Any:
    """``value`` with the type of every scalar beside it (``1 == 1.0 == True``)."""
    if isinstance(value, tuple):
        return tuple(tagged(v) for v in value)
    return type(value), value


def outcome(derive: Any, message: Any) -> Any:
    try:
        return "columns", tagged(derive(message))
    except Exception as e:
        return "raises", type(e), str(e)


def c_derive(message: Any) -> Any:
    return sqlite_store._rows.derive(message, rows._json.encode, rows.text_of)  # type: ignore[union-attr]


KEYS = [
    "role", "content", "type", "output", "name", "tool_name", "tool_call_id", "call_id", "tool_calls",
    "finish_reason", "reasoning", "reasoning_content", "reasoning_details", "timestamp", "display_kind",
    "display_metadata", "platform_message_id", "function", "arguments", "input", "text",
]  # fmt: skip
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["assistant", "tool", "function", "user", "function_call", "tool_use", "server_tool_use", ""]),
)
json_values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=3), inner, max_size=4)
    ),
    max_leaves=12,
)
calls = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"id": st.text(max_size=3), "function": st.fixed_dictionaries({"name": leaves, "arguments": json_values})}
        ),
        st.dictionaries(st.sampled_from(["name", "arguments", "input", "function"]), json_values, max_size=3),
        leaves,
    ),
    max_size=3,
)
parts = st.lists(
    st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(["tool_use", "server_tool_use", "text", "image_url"])}).flatmap(
            lambda part: st.fixed_dictionaries(
                {**{k: st.just(v) for k, v in part.items()}, "name": leaves, "input": json_values, "text": leaves}
            )
        ),
        json_values,
    ),
    max_size=3,
)
messages = st.tuples(
    st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=4), json_values, max_size=8),
    st.fixed_dictionaries(
        {}, optional={"tool_calls": calls, "content": parts | json_values, "role": leaves, "type": leaves}
    ),
).map(lambda drawn: {**drawn[0], **drawn[1]})


@needs_c
@settings(max_examples=1500, deadline=None)
@given(message=messages)
def test_the_c_derive_gives_exactly_the_python_columns(message):
    derived = outcome(c_derive, message)
    assert derived != ("columns", (type(None), None)), "a dict of JSON values is derived in C"
    assert derived == outcome(lambda m: rows.derive_python(m, None), message)


@needs_c
@pytest.mark.parametrize(
    "message",
    [
        [("role", "user")],  # not a dict
        {"role": "user", "content": ("a", "tuple")},
        {"role": "user", "n": b"bytes"},
        {"role": type("Role", (str,), {})("assistant")},  # a str subclass (it may compare as it likes)
        {1: "a key that is not a str", "role": "user"},
        {"role": "assistant", "content": [{"type": type("Kind", (str,), {})("tool_use"), "name": "x"}]},
    ],
)
def test_what_the_c_derive_leaves_to_python_is_derived_there(message):
    assert c_derive(message) is None
    assert outcome(lambda m: rows.derive(m, None), message) == outcome(lambda m: rows.derive_python(m, None), message)


def test_a_message_with_a_display_override_is_derived_in_python(grouped_by):
    message = {
        "role": "assistant",
        "content": "wire text",
        "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
    }
    derived = rows.derive(message, {"content": "shown"})
    assert derived == rows.derive_python(message, {"content": "shown"})
    assert derived[rows.DERIVED.index("content")] == "shown"
    assert derived[rows.DERIVED.index("api_content")] == "wire text"
    assert derived[rows.DERIVED.index("tool_text")] == "f {}"


def test_the_columns_of_common_messages(grouped_by):
    derive = rows.derive
    column = rows.DERIVED.index
    tool = derive({"role": "tool", "name": "lookup", "tool_call_id": "c1", "content": "42", "timestamp": 2**64}, None)
    assert (tool[column("tool_name")], tool[column("tool_call_id")], tool[column("tool_text")]) == (
        "lookup",
        "c1",
        "lookup",
    )
    assert tool[column("timestamp")] == str(2**64)  # past SQLite's integers: as text
    call = derive({"type": "function_call", "name": "f", "arguments": {"q": 1}, "call_id": "c2"}, None)
    assert (call[column("role")], call[column("tool_call_id")], call[column("tool_text")]) == (
        "function_call",
        "c2",
        'f {"q":1}',
    )
    said = derive({"role": "assistant", "content": [{"type": "text", "text": "hi"}], "reasoning": {"r": 1}}, None)
    assert (said[column("content")], said[column("reasoning")]) == ("hi", '{"r":1}')
    assert derive({"role": "user", "reasoning": "no"}, None)[column("reasoning")] is None  # assistant rows only
    output = derive({"type": "function_call_output", "call_id": "c2", "output": "done"}, None)
    assert output[column("content")] == "done"
    assert derive({"role": "user", "platform_message_id": True}, None)[column("platform_message_id")] == 1


def typed(groups: dict[int, list[tuple[Any, ...]]]) -> list[tuple[int, list[list[tuple[type, Any]]]]]:
    """The groups with every value's type beside it (``bytearray(b"x") == b"x"``), in order."""
    return [(key, [[(type(v), v) for v in entry] for entry in group]) for key, group in groups.items()]


values = st.one_of(st.none(), st.text(max_size=5), st.integers(-(2**70), 2**70), st.floats(allow_nan=False))
blob_values = st.one_of(st.none(), st.binary(max_size=8))


@st.composite
def batches(draw: st.DrawFn) -> tuple[list[tuple[Any, ...]], int, int]:
    width = draw(st.integers(0, 12))
    blob_columns = draw(st.sets(st.integers(0, max(0, width - 1)), max_size=width)) if width else set()
    column = [blob_values if j in blob_columns else values for j in range(width)]
    rows = draw(st.lists(st.tuples(*column), max_size=20))
    return rows, width, sum(1 << j for j in blob_columns)


@needs_c
@settings(max_examples=400, deadline=None)
@given(batch=batches(), first_id=st.integers(-(2**70), 2**70))
def test_the_c_loop_groups_exactly_as_the_python_loop(batch, first_id):
    rows, width, blobs = batch
    assert typed(sqlite_store._rows.group_rows(rows, first_id, width, blobs)) == typed(
        group_rows_python(rows, first_id, width, blobs)
    )


def test_rows_are_grouped_by_their_null_columns_with_their_ids(grouped_by):
    rows = [(b"n0", "a", None), (b"n1", None, None), (b"n2", "c", None), (None, "d", 4)]
    groups = group_rows(rows, 7, 3, 0b001)
    assert typed(groups) == [
        (0b100, [[(int, 7), (bytearray, b"n0"), (str, "a")], [(int, 9), (bytearray, b"n2"), (str, "c")]]),
        (0b110, [[(int, 8), (bytearray, b"n1")]]),
        (0b001, [[(int, 10), (str, "d"), (int, 4)]]),
    ]
    assert group_rows([], 1, 3, 0) == {}
    assert typed(group_rows([(None, None)], 1, 2, 0b11)) == [(0b11, [[(int, 1)]])]


@pytest.mark.parametrize(
    ("rows", "width", "problem"),
    [
        ([("a", "b"), ["c", "d"]], 2, "row 1 is not a tuple of 2 values"),
        ([("a", "b", "c")], 2, "row 0 is not a tuple of 2 values"),
        ([("a",), ()], 1, "row 1 is not a tuple of 1 values"),
    ],
)
def test_a_row_of_another_shape_is_named(grouped_by, rows, width, problem):
    with pytest.raises(ValueError, match=problem):
        group_rows(rows, 1, width, 0)


@needs_c
def test_the_c_loop_refuses_what_it_cannot_group():
    with pytest.raises(TypeError):
        sqlite_store._rows.group_rows((("a",),), 1, 1, 0)  # not a list
    with pytest.raises(TypeError):
        sqlite_store._rows.group_rows([("a",)], "1", 1, 0)  # an id that is not an int
    with pytest.raises(ValueError, match="width"):
        sqlite_store._rows.group_rows([], 1, 64, 0)  # more columns than a mask has bits
    with pytest.raises(TypeError):
        sqlite_store._rows.group_rows([("a",)], 1, 1, 0b1)  # a blob column that bytearray() refuses


def test_a_row_without_its_identity_is_refused_before_any_insert(tmp_path, grouped_by):
    db = sqlite3.connect(tmp_path / "p.db", isolation_level=None)
    with SQLiteProjection(tmp_path / "p.db"):
        pass
    row: list[Any] = [None] * len(ROW_COLUMNS)
    for column, value in {
        "session_id": "s",
        "position": 0,
        "seq": 1,
        "idx": 0,
        "node": b"n" * 32,
        "digest": b"d" * 32,
        "body_seq": 1,
        "body_idx": 0,
        "summary": 0,
        "created_ns": 5,
    }.items():
        row[ROW_COLUMNS.index(column)] = value
    good = tuple(row)
    row[ROW_COLUMNS.index("node")] = None
    with pytest.raises(ValueError, match="identity NULL: \\['node'\\]"):
        sqlite_store.insert_rows(sqlite_store.Connection(db), [good, tuple(row)])
    assert db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    db.close()


def test_a_projection_holds_the_same_rows_through_either_loop(tmp_path, monkeypatch):
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi", "timestamp": 1.5},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42", "platform_message_id": 7},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}], "reasoning": "why", "n": 2**63},
    ]
    with EventLog.open(tmp_path / "log", durability="none") as log:
        for i in range(1, len(messages) + 1):
            log.flush("a", messages[:i])
        log.flush("b", messages * 30)
        found = []
        for name, c_loop in (("c", True), ("python", False)):
            if not c_loop:  # both loops in Python: the rows' shaping and their columns
                monkeypatch.setattr(sqlite_store, "_rows", None)
                monkeypatch.setattr(rows, "_rows", None)
            with SQLiteProjection(tmp_path / f"{name}.db") as projection:
                projection.catch_up(log)
                db = sqlite3.connect(tmp_path / f"{name}.db")
                found.append(db.execute("SELECT * FROM messages ORDER BY id").fetchall())
                db.close()
    assert len(found[0]) == 5 + 150
    assert found[0] == found[1]
    assert {type(row[ROW_COLUMNS.index("node") + 1]) for row in found[0]} == {bytes}  # stored as BLOBs
