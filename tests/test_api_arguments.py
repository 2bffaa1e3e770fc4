"""Bad arguments anywhere in the public API raise TypeError/ValueError naming the parameter."""

from __future__ import annotations

import pytest
from factories import user

from eventlog import InvalidMessageError


@pytest.fixture
def stored(log):
    log.flush("s", [user("q"), user("r")])
    return log


@pytest.mark.parametrize(
    ("after", "error"), [(-5, ValueError), (1.5, TypeError), ("1", TypeError), (True, TypeError), (None, TypeError)]
)
def test_events_after(stored, after, error):
    with pytest.raises(error, match="after"):
        list(stored.events(after=after))
    assert [r.seq for r in stored.events(after=0)] == [1, 2]


@pytest.mark.parametrize(("as_of", "error"), [(-1, ValueError), (1.5, TypeError), ("2", TypeError), (False, TypeError)])
def test_messages_as_of(stored, as_of, error):
    with pytest.raises(error, match="as_of"):
        stored.messages("s", as_of=as_of)
    assert stored.messages("s", as_of=0) == []


@pytest.mark.parametrize("overrides", [[{"content": "y"}], "content", 5])
def test_flush_overrides_must_be_a_mapping(stored, overrides):
    seq = stored.last_seq
    with pytest.raises(TypeError, match="overrides must be a mapping"):
        stored.flush("s", [user("q"), user("r"), user("new")], overrides=overrides)
    assert stored.last_seq == seq


def test_a_lone_surrogate_in_a_key_is_invalid_input(stored):
    seq = stored.last_seq
    for message in ({"\ud800": "x"}, {"role": "user", "content": "x", "bad\udfff": 1}):
        with pytest.raises(InvalidMessageError, match="lone surrogate") as caught:
            stored.flush("s", [user("q"), user("r"), message])
        assert caught.value.index == 2
        with pytest.raises(InvalidMessageError, match="lone surrogate"):
            stored.append("s", [message])
    assert stored.last_seq == seq


@pytest.mark.parametrize("replace", ["yes", 1, None])
def test_replace_must_be_a_bool(stored, replace):
    with pytest.raises(TypeError, match="replace"):
        stored.flush("s", [], replace=replace)
    with pytest.raises(TypeError, match="replace"):
        stored.flush_many({"s": []}, replace=replace)
    assert len(stored.messages("s")) == 2
