"""From a stored message and its display override to the columns of a transcript row.

Everything here is a pure function of the wire message (decoded from its
canonical bytes) and the override recorded in the log, so incremental catch-up
and a rebuild compute identical rows.

Rules:

- The override's fields go into the row's columns.  When it replaces ``content``,
  the wire content is kept in ``api_content`` (``NULL`` when both are equal).  A
  text override never replaces list (multimodal) content; a list override does.
- ``content`` is a text projection: a string stays as it is; in a list of parts the
  text parts are kept and images, audio and files become ``[image]``, ``[audio]``
  and ``[file]``.  The wire message itself is kept whole, as JSON, in ``message``.
- ``reasoning``, ``reasoning_content`` and ``reasoning_details`` are kept on
  assistant rows only.
- ``tool_text`` (indexed for search) holds the tool names and call arguments.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Final

import msgspec

from eventlog.text import text_of

try:
    from . import _rows
except ImportError:  # built without a C compiler: derive_python gives the same columns
    _rows = None  # type: ignore[assignment, unused-ignore]
if os.environ.get("EVENTLOG_PURE_PYTHON"):
    _rows = None  # type: ignore[assignment, unused-ignore]

DERIVED: Final = (
    "role",
    "content",
    "api_content",
    "tool_calls",
    "tool_call_id",
    "tool_name",
    "name",
    "finish_reason",
    "reasoning",
    "reasoning_content",
    "reasoning_details",
    "timestamp",
    "display_kind",
    "display_metadata",
    "display_override",
    "platform_message_id",
    "tool_text",
    "message",
)
"""The row columns computed by :func:`derive`, in its output order."""

OVERRIDABLE: Final = frozenset(
    {
        "role",
        "content",
        "tool_calls",
        "tool_call_id",
        "tool_name",
        "name",
        "finish_reason",
        "reasoning",
        "reasoning_content",
        "reasoning_details",
        "timestamp",
        "display_kind",
        "display_metadata",
        "platform_message_id",
    }
)
"""Override keys that set a column.  Other keys are kept in ``display_override`` only;
identity and bookkeeping columns (digests, seq, ``message``, tombstones) never change."""

_json = msgspec.json.Encoder()
_from_json = msgspec.json.Decoder()


def to_json(value: Any) -> str:
    return _json.encode(value).decode()


def from_json(text: str) -> Any:
    return _from_json.decode(text)


def text_or_json(value: Any) -> str | None:
    """``None`` stays ``NULL``, a string is stored as is, anything else as JSON text."""
    if value is None or type(value) is str:
        return value
    return to_json(value)


INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1


def scalar(value: Any) -> Any:
    """A value SQLite can store as it is (str, int, float, NULL); containers become JSON.

    The log takes integers up to 2**64 - 1, SQLite's up to 2**63 - 1: a larger one is
    stored as its decimal text (the row's ``message`` JSON keeps the number).
    """
    kind = type(value)
    if value is None or kind is str or kind is float:
        return value
    if kind is int:
        return value if INT64_MIN <= value <= INT64_MAX else str(value)
    if kind is bool:
        return int(value)
    return to_json(value)


def add_counter(total: Any, value: int | float) -> int | float:
    """``total + value`` for a session counter, kept to what SQLite and JSON can hold.

    An integer sum past 64 bits becomes a float; a float sum saturates at the largest
    finite float instead of reaching infinity (which JSON cannot write).
    """
    result = (total or 0) + value
    if type(result) is int:
        return result if INT64_MIN <= result <= INT64_MAX else float(result)
    return result if math.isfinite(result) else math.copysign(sys.float_info.max, result)


def tool_text(message: dict[str, Any], tool_name: str | None) -> str | None:
    """Tool names and call arguments, for the search index."""
    words: list[str] = []
    if tool_name:
        words.append(tool_name)
    calls = message.get("tool_calls")
    if type(calls) is list:
        for call in calls:
            if type(call) is dict:
                function = call.get("function")
                _call_words(function if type(function) is dict else call, words)
    if message.get("type") == "function_call":  # a Responses API item
        _call_words(message, words)
    content = message.get("content")
    if type(content) is list:
        for part in content:
            if type(part) is dict and part.get("type") in ("tool_use", "server_tool_use"):
                _call_words(part, words)
    return " ".join(words) if words else None


def _call_words(call: dict[str, Any], words: list[str]) -> None:
    name = call.get("name")
    if type(name) is str:
        words.append(name)
    arguments = call.get("arguments", call.get("input"))
    if arguments is not None:
        words.append(arguments if type(arguments) is str else to_json(arguments))


def derive(message: dict[str, Any], override: dict[str, Any] | None) -> tuple[Any, ...]:
    """The :data:`DERIVED` columns of a row for ``message`` displayed with ``override``.

    One call in C for a message without an override when the extension ``projections._rows``
    is built (and ``EVENTLOG_PURE_PYTHON`` is not set), else :func:`derive_python`, which gives
    the same columns.
    """
    if not override and _rows is not None:
        derived = _rows.derive(message, _json.encode, text_of)
        if derived is not None:
            return derived
    return derive_python(message, override)


def derive_python(message: dict[str, Any], override: dict[str, Any] | None) -> tuple[Any, ...]:
    """:func:`derive` in Python."""
    view = message
    content = message.get("content")
    api_content = None
    if override:
        view = dict(message)
        for key, value in override.items():
            if key in OVERRIDABLE and key != "content":
                view[key] = value
        if "content" in override:
            replacement = override["content"]
            # A text override must not hide images or audio that the wire copy carries.
            if type(content) is not list or type(replacement) is list:
                if replacement != content and content is not None:
                    api_content = text_or_json(content)
                content = replacement
    role = view.get("role")
    if role is None and type(view.get("type")) is str:
        role = view["type"]  # Responses API items (function_call, function_call_output, ...)
    if content is None and "content" not in message and "output" in message:
        content = message["output"]  # Responses API function_call_output
    assistant = role == "assistant"
    name = view.get("name")
    tool_name = view.get("tool_name")
    if tool_name is None and role in ("tool", "function") and type(name) is str:
        tool_name = name
    tool_call_id = view.get("tool_call_id", view.get("call_id"))
    return (
        text_or_json(role),
        text_of(content),
        api_content,
        text_or_json(view.get("tool_calls")),
        text_or_json(tool_call_id),
        text_or_json(tool_name),
        text_or_json(name),
        text_or_json(view.get("finish_reason")),
        text_or_json(view.get("reasoning")) if assistant else None,
        text_or_json(view.get("reasoning_content")) if assistant else None,
        text_or_json(view.get("reasoning_details")) if assistant else None,
        scalar(view.get("timestamp")),
        text_or_json(view.get("display_kind")),
        text_or_json(view.get("display_metadata")),
        to_json(override) if override else None,
        scalar(view.get("platform_message_id")),
        tool_text(view, tool_name if type(tool_name) is str else None),
        to_json(message),
    )
