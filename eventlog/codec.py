"""Canonical bytes and digests: what makes a message's identity intrinsic.

A message's canonical bytes are the MessagePack encoding of the message without
its top-level ``_`` keys, with map keys sorted.  Equal content gives equal bytes
whatever the key insertion order, so:

- content digest = SHA-256(canonical bytes)
- node digest    = SHA-256(parent node digest || content digest), the parent of a
  session's first message being :data:`ZERO` (32 zero bytes).

A node digest names a message *and* everything before it, so one comparison tells
whether two transcripts share a prefix.

>>> canonical({"role": "user", "content": "hi", "_seen": True}, 0) == canonical({"content": "hi", "role": "user"}, 0)
True
>>> first = node_digest(ZERO, content_digest(canonical({"role": "user", "content": "ok"}, 0)))
>>> node_digest(first, content_digest(canonical({"role": "user", "content": "ok"}, 1))) == first
False

Messages must be JSON-like: ``dict`` with ``str`` keys, ``list``/``tuple``, ``str``,
``int`` (64-bit), finite ``float``, ``bool`` and ``None``.  Anything else is refused
with an :class:`~eventlog.errors.InvalidMessageError` that names the message index and
the path inside it, rather than stored in a form that would not read back the same.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from hashlib import sha256
from itertools import chain, compress, repeat
from operator import is_
from typing import Any

import msgspec

from .errors import InvalidMessageError

ZERO = bytes(32)
"""The parent node digest of a session's first message."""

MAX_DEPTH = 64
"""How deeply containers may nest inside a message (a message is depth 0)."""

_encoder = msgspec.msgpack.Encoder(order="deterministic")
_decoder = msgspec.msgpack.Decoder()

encode = _encoder.encode
"""Deterministic MessagePack encoding (sorted keys); the canonical form of stripped messages."""

decode = _decoder.decode
"""Decode MessagePack produced by :func:`encode` into JSON-like Python values."""


def strip(message: Mapping[str, Any]) -> dict[str, Any]:
    """The message without its process-local top-level ``_`` keys (a new dict; the input is untouched)."""
    for key in message:
        if type(key) is str and key[:1] == "_":
            return {k: v for k, v in message.items() if not (type(k) is str and k[:1] == "_")}
    return message if type(message) is dict else dict(message)


def as_message(message: Any, index: int) -> Mapping[str, Any]:
    """``message`` as the mapping that is stored for it.

    A mapping is itself.  A pydantic model (the OpenAI SDK's ``ChatCompletionMessage``,
    which loops append as ``response.choices[0].message``) becomes the dict the OpenAI
    client sends when the object is passed back in ``messages=``:
    ``model_dump(mode="json", exclude_unset=True)``, less the fields the model marks
    ``__api_exclude__`` (so the fields the API returned, and those set on the object
    since, with their JSON values).  Anything else raises :class:`InvalidMessageError`
    naming ``messages[index]`` and the type.  pydantic is never imported here: an object
    can only be a pydantic model once some other code has imported pydantic.
    """
    if isinstance(message, Mapping):
        return message
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(message, pydantic.BaseModel):
        try:
            dumped = message.model_dump(
                mode="json", exclude_unset=True, exclude=getattr(message, "__api_exclude__", None)
            )
        except Exception as e:
            raise InvalidMessageError(
                f"messages[{index}]: {type(message).__name__} cannot be dumped to JSON ({e})", index=index
            ) from None
        if isinstance(dumped, dict):
            return dumped
    raise _not_a_message(message, index)


def _not_a_message(message: Any, index: int) -> InvalidMessageError:
    return InvalidMessageError(
        f"messages[{index}]: {type(message).__name__} is not a message "
        "(a mapping, or a pydantic model such as openai's ChatCompletionMessage)",
        index=index,
    )


def canonical(message: Any, index: int) -> bytes:
    """Validate ``message`` (at ``index`` of the caller's list) and return its canonical bytes.

    Raises :class:`InvalidMessageError` naming ``messages[index]`` and the path of the
    first value that is not JSON-like.
    """
    message = as_message(message, index)
    private = inspect(message, index)
    return _encoder.encode(strip(message) if private or type(message) is not dict else message)


def inspect(message: Any, index: int, *, encoded: bool = False) -> bool:
    """Validate a message for storage; return whether it has top-level ``_`` keys.

    The values under ``_`` keys are process-local and not stored, so they are not
    checked.  ``encoded=True`` says the whole message was just encoded by msgspec
    without error, which already proves its keys are ``str``, its text valid UTF-8
    and its ints 64-bit, so only the types are left to check.  Raises
    :class:`InvalidMessageError` like :func:`canonical`.
    """
    if not isinstance(message, Mapping):
        raise _not_a_message(message, index)
    if encoded:
        return inspect_encoded(message, index)
    private = False
    for key, item in message.items():
        if type(key) is not str:
            _raise([key], f"key {key!r} is a {type(key).__name__}, not a str", index)
        if key[:1] == "_":
            private = True
            continue
        if not key.isascii() and not _utf8_ok(key):
            _raise([key], "key contains a lone surrogate", index)
        kind = type(item)
        if (
            (kind is str and item.isascii())
            or item is None
            or kind is bool
            or (kind is int and -(2**63) <= item < 2**64)
        ):
            continue
        found = _problem(item, 1)
        if found is not None:
            found[0].append(key)
            _raise(*found, index)
    return private


def inspect_encoded(message: Mapping[str, Any], index: int) -> bool:
    """:func:`inspect` of a mapping msgspec just encoded without error (the hot path of a flush)."""
    private = False
    for key, item in message.items():
        if type(key) is not str:
            _raise([key], f"key {key!r} is a {type(key).__name__}, not a str", index)
        if key[:1] == "_":
            private = True
            continue
        kind = type(item)
        if kind is str or item is None or kind is bool or kind is int or (kind is float and item - item == 0.0):
            continue  # the common leaves, without a call (x - x is 0.0 for finite floats only)
        found = _problem(item, 1, True)
        if found is not None:
            found[0].append(key)
            _raise(*found, index)
    return private


try:
    from . import _plain
except ImportError:  # built without a C compiler: plain_batch_python gives the same answers
    _plain = None  # type: ignore[assignment, unused-ignore]
if os.environ.get("EVENTLOG_PURE_PYTHON"):
    _plain = None  # type: ignore[assignment, unused-ignore]

_LEAVES = frozenset({str, type(None), bool, int})
_PLAIN = _LEAVES | {float, list, tuple, dict}


def plain_batch(messages: list[dict[str, Any]], *, ints: bool = False) -> bool:
    """Whether :func:`inspect_encoded` would pass every one of ``messages`` and find no ``_`` key.

    ``messages`` are plain dicts msgspec just encoded without error, which shows that every
    int fits in 64 bits; with ``ints=True`` (dicts read from JSON, not encoded yet) that is
    checked too, and True means :func:`canonical` would pass each of them.  False only means
    "not shown here" (a ``_`` key, a float too deep, a container subclass, a problem): the
    caller then inspects each message, which names the problem.  One walk in C when the
    extension ``eventlog._plain`` is built (and ``EVENTLOG_PURE_PYTHON`` is not set), else
    :func:`plain_batch_python`, which gives the same answers.
    """
    if _plain is not None:
        return _plain.plain_batch(messages, MAX_DEPTH, ints)
    return plain_batch_python(messages, ints=ints)


def plain_batch_python(messages: list[dict[str, Any]], *, ints: bool = False) -> bool:
    """:func:`plain_batch` in Python: a few passes over each level of nesting of the whole
    batch (a turn, an import), with the loops in C: distinct keys, then the set of value types."""
    if not _all_str(messages):
        return False
    for key in set().union(*messages):
        if key[:1] == "_":
            return False
    values = list(chain.from_iterable(map(dict.values, messages)))
    depth = 1  # of the values at hand, as in _problem
    while values:
        types = list(map(type, values))
        kinds = set(types)
        if ints and int in kinds and not all(map(_fits, compress(values, map(is_, types, repeat(int))))):
            return False
        if kinds <= _LEAVES:
            return True
        if not kinds <= _PLAIN or depth >= MAX_DEPTH:
            return False
        if float in kinds and not all(map(math.isfinite, compress(values, map(is_, types, repeat(float))))):
            return False
        nested: list[Any] = []
        if dict in kinds:
            dicts = list(compress(values, map(is_, types, repeat(dict))))
            if not _all_str(dicts):
                return False
            nested += chain.from_iterable(map(dict.values, dicts))
        if list in kinds:
            nested += chain.from_iterable(compress(values, map(is_, types, repeat(list))))
        if tuple in kinds:
            nested += chain.from_iterable(compress(values, map(is_, types, repeat(tuple))))
        values = nested
        depth += 1
    return True


def _fits(value: int) -> bool:
    return -(2**63) <= value < 2**64


def _all_str(dicts: list[dict[Any, Any]]) -> bool:
    """Whether every key of every dict is a plain ``str`` (type by type: a set of the keys
    would merge a ``str`` subclass into the equal ``str``)."""
    return set(map(type, chain.from_iterable(dicts))) <= _STR


_STR = frozenset({str})


def content_digest(data: bytes) -> bytes:
    return sha256(data).digest()


def node_digest(parent: bytes, digest: bytes) -> bytes:
    return sha256(parent + digest).digest()


def check(body: dict[str, Any], index: int) -> None:
    """Raise :class:`InvalidMessageError` unless ``body`` is JSON-like all the way down."""
    problem = _problem(body, 0)
    if problem is not None:
        _raise(*problem, index)


def _raise(path: list[Any], what: str, index: int) -> None:
    where = "".join(f'["{p}"]' if isinstance(p, str) else f"[{p}]" for p in reversed(path))
    raise InvalidMessageError(f"messages[{index}]{where}: {what}", index=index, path=where)


def _problem(value: Any, depth: int, encoded: bool = False) -> tuple[list[Any], str] | None:
    """The path and description of the first value that is not JSON-like, or None.

    ``encoded``: msgspec already encoded the value, so text and ints are known good.
    """
    t = type(value)
    if t is str:
        return None if encoded or value.isascii() or _utf8_ok(value) else ([], "str contains a lone surrogate")
    if t is dict or isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return [], f"nested deeper than {MAX_DEPTH} levels"
        for key, item in value.items():
            if type(key) is not str:
                return [key], f"key {key!r} is a {type(key).__name__}, not a str"
            kind = type(item)
            if encoded:
                if kind is str or item is None or kind is bool or kind is int or (kind is float and item - item == 0.0):
                    continue  # the common leaves, without a call
            else:
                if not key.isascii() and not _utf8_ok(key):
                    return [key], "key contains a lone surrogate"
                if (kind is str and item.isascii()) or item is None or kind is bool:
                    continue
            found = _problem(item, depth + 1, encoded)
            if found is not None:
                found[0].append(key)
                return found
        return None
    if t is list or t is tuple or isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            return [], f"nested deeper than {MAX_DEPTH} levels"
        for i, item in enumerate(value):
            kind = type(item)
            if encoded and (kind is str or item is None or kind is bool or kind is int):
                continue
            found = _problem(item, depth + 1, encoded)
            if found is not None:
                found[0].append(i)
                return found
        return None
    if value is None or t is bool:
        return None
    if t is int:
        return None if encoded or -(2**63) <= value < 2**64 else ([], "int does not fit in 64 bits")
    if t is float:
        return None if math.isfinite(value) else ([], f"float {value!r} is not JSON-like")
    if isinstance(value, str):  # str subclasses (enums) would not read back as themselves
        return [], f"{t.__name__} is not JSON-like (use a plain str)"
    return [], f"{t.__name__} is not JSON-like"


def _utf8_ok(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
