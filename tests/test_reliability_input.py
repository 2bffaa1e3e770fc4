"""Hostile and bad input: every message round-trips exactly or is refused, naming where, writing nothing.

Also session ids built to escape (``../``, slashes, NUL, SQL quotes, 10 kB, unicode):
rejected, or stored and read back as themselves, never a file outside the log or a
changed SQL statement in the projection.
"""

from __future__ import annotations

import datetime
import decimal
import math
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventlog import EventLog, InvalidMessageError
from eventlog.codec import MAX_DEPTH

try:
    from projections import SQLiteProjection
except ImportError:  # pragma: no cover
    SQLiteProjection = None  # type: ignore[assignment,misc]


@pytest.fixture(scope="module")
def shared_log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventLog]:
    # One log for all examples: Hypothesis runs hundreds, and opening a log each time costs an fsync.
    with EventLog.open(tmp_path_factory.mktemp("input") / "log", durability="none") as log:
        yield log


# -- values -------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


class Custom:
    pass


bad_leaves = st.sampled_from(
    [
        b"bytes",
        bytearray(b"x"),
        datetime.datetime(2024, 1, 1),
        datetime.date(2024, 1, 1),
        decimal.Decimal("1.5"),
        uuid.UUID(int=1),
        float("nan"),
        float("inf"),
        -float("inf"),
        {1, 2},
        frozenset({1}),
        Custom(),
        object(),
        2**64,
        -(2**63) - 1,
        "lone \ud800 surrogate",
        1j,
    ]
)


def _normalise(value: Any) -> Any:
    """What a JSON-like value reads back as: tuples become lists."""
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    """Exact equality that also tells 1 from 1.0 from True and -0.0 from 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    content=json_values,
    extra=st.dictionaries(
        st.text(min_size=1, max_size=6).filter(lambda k: not k.startswith("_")), json_values, max_size=3
    ),
)
def test_json_like_messages_round_trip_exactly(shared_log: EventLog, content: Any, extra: dict[str, Any]) -> None:
    session = f"rt-{uuid.uuid4().hex}"
    message = {"role": "user", "content": content, **extra}
    shared_log.flush(session, [message])
    back = shared_log.messages(session)
    assert len(back) == 1 and _same(back[0], _normalise(message))


@st.composite
def poisoned(draw: st.DrawFn) -> tuple[list[dict[str, Any]], int, str]:
    """A list of messages with one bad value planted at a known index and path."""
    count = draw(st.integers(1, 4))
    messages = [{"role": "user", "content": draw(json_values)} for _ in range(count)]
    index = draw(st.integers(0, count - 1))
    bad = draw(bad_leaves | st.builds(lambda k: {k: 1}, st.sampled_from([1, 2.5, None, b"k", (1, 2)])))
    # Plain keys, so the path can be compared as text (quotes in keys are rendered lossily).
    keys = draw(st.lists(st.text("abcxyzéø0123", min_size=1, max_size=5), min_size=1, max_size=4))
    holder: dict[str, Any] = messages[index]
    path = ""
    for key in keys[:-1]:
        holder[key] = {}
        holder = holder[key]
        path += f'["{key}"]'
    holder[keys[-1]] = bad
    path += f'["{keys[-1]}"]'
    return messages, index, path


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=poisoned())
def test_bad_values_are_refused_naming_index_and_path_and_nothing_is_written(
    shared_log: EventLog, case: tuple[list[dict[str, Any]], int, str]
) -> None:
    messages, index, path = case
    session = f"bad-{uuid.uuid4().hex}"
    before = shared_log.last_seq
    with pytest.raises(InvalidMessageError) as caught:
        shared_log.flush(session, messages)
    assert isinstance(caught.value, ValueError)
    assert caught.value.index == index
    assert str(caught.value).startswith(f"messages[{index}]")
    assert str(caught.value).startswith(f"messages[{index}]{path}"), str(caught.value)
    assert shared_log.last_seq == before
    assert session not in shared_log
    with pytest.raises(InvalidMessageError):
        shared_log.append(session, messages)
    assert shared_log.last_seq == before


def test_scaffolding_before_a_bad_message_does_not_shift_the_index_named(log: EventLog) -> None:
    messages = [
        {"role": "user", "content": "ok"},
        {"role": "assistant", "_thinking_prefill": True},
        {"role": "user", "content": b"x"},
    ]
    with pytest.raises(InvalidMessageError, match=r"^messages\[2\]\[\"content\"\]"):
        log.flush("s", messages)
    assert log.last_seq == 0


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 10_000])
def test_deep_nesting_is_refused_with_a_clear_error(log: EventLog, depth: int) -> None:
    nested: Any = "leaf"
    for _ in range(depth):
        nested = [nested]
    with pytest.raises(InvalidMessageError, match=rf"nested deeper than {MAX_DEPTH}"):
        log.flush("s", [{"role": "user", "content": nested}])
    assert log.last_seq == 0


def test_nesting_up_to_the_limit_round_trips(log: EventLog) -> None:
    nested: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):
        nested = {"k": nested}
    log.flush("s", [{"role": "user", "content": nested}])
    assert log.messages("s")[0]["content"] == nested


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_cycles_are_refused_not_a_hang_or_recursion_error(log: EventLog, kind: str) -> None:
    cycle: Any = [] if kind == "list" else {}
    if kind == "list":
        cycle.append(cycle)
    else:
        cycle["self"] = cycle
    with pytest.raises(InvalidMessageError):
        log.flush("s", [{"role": "user", "content": cycle}])
    assert log.last_seq == 0


def test_nul_bytes_control_characters_and_unicode_round_trip(log: EventLog) -> None:
    message = {"role": "user", "content": "a\x00b\x01\x7f\u2028\U0001f600 \ufeff", "\x00key": "\x00", "ключ": "值"}
    log.flush("s", [message])
    assert log.messages("s") == [message]


def test_a_50_mb_tool_result_round_trips(tmp_path: Path) -> None:
    big = {"role": "tool", "tool_call_id": "c1", "content": "0123456789abcdef" * (50 * (1 << 20) // 16)}
    with EventLog.open(tmp_path / "log", durability="none") as log:
        transcript = [{"role": "user", "content": "read the file"}, big]
        assert log.flush("s", transcript).appended == 2
        assert log.flush("s", transcript).appended == 0
        back = log.messages("s")
        assert back[1]["content"] == big["content"]
        assert log.verify().ok


# -- session ids --------------------------------------------------------------------

HOSTILE_IDS = [
    "../escape",
    "../../../../tmp/escape",
    "/etc/passwd",
    "a/b\\c",
    "..",
    ".",
    "'; DROP TABLE messages; --",
    'quote" OR "1"="1',
    "Robert'); DELETE FROM sessions;--",
    "ünïcødé 会话 🧪",
    "\u202eRTL override",
    " leading and trailing ",
    "x" * 256,
    "é" * 128,
    "%s%n%x",
    "line\nbreak\r\ttab",
]


@pytest.mark.parametrize("session_id", HOSTILE_IDS)
def test_hostile_session_ids_are_stored_as_themselves_and_stay_inside_the_log(tmp_path: Path, session_id: str) -> None:
    path = tmp_path / "log"
    before = set(tmp_path.rglob("*"))
    message = {"role": "user", "content": "hi"}
    with EventLog.open(path) as log:
        log.flush(session_id, [message])
        assert log.sessions() == [session_id]
        assert log.messages(session_id) == [message]
        assert log.verify().ok
    created = {p for p in set(tmp_path.rglob("*")) - before}
    assert all(p == path or path in p.parents for p in created), sorted(map(str, created))
    assert sorted(p.name for p in path.iterdir()) == [
        "data.mdb",
        "eventlog.id",
        "eventlog.open",
        "eventlog.relay-full.lock",
        "lock.mdb",
    ]


@pytest.mark.parametrize(
    ("session_id", "error"),
    [
        ("", ValueError),
        ("nul\x00inside", ValueError),
        ("x" * 10_000, ValueError),
        ("é" * 129, ValueError),
        ("lone \udc80", ValueError),
        (None, TypeError),
        (b"bytes", TypeError),
        (42, TypeError),
    ],
)
def test_invalid_session_ids_are_refused_before_anything_is_written(
    log: EventLog, session_id: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        log.flush(session_id, [{"role": "user", "content": "x"}])
    with pytest.raises(error):
        log.append(session_id, [{"role": "user", "content": "x"}])
    assert log.last_seq == 0


@pytest.mark.skipif(SQLiteProjection is None, reason="projections package not importable")
def test_hostile_session_ids_reach_the_projection_as_data_not_sql(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as log, SQLiteProjection(tmp_path / "p.db") as projection:
        for i, session_id in enumerate(HOSTILE_IDS):
            log.flush(session_id, [{"role": "user", "content": f"message {i} from {session_id}"}])
        projection.catch_up(log)
        for i, session_id in enumerate(HOSTILE_IDS):
            rows = projection.messages(session_id)
            assert [row["content"] for row in rows] == [f"message {i} from {session_id}"]
        assert sorted(s["id"] if "id" in s else s.get("session_id") for s in projection.sessions()) == sorted(
            HOSTILE_IDS
        )
        # The tables are all still there and hold what the log says.
        assert len(projection.search("message", limit=100)) == len(HOSTILE_IDS)
    assert re.match(r"^[0-9a-f]{32}$", log.id)
    assert os.path.exists(tmp_path / "p.db")
