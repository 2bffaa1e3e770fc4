"""LangChain messages as transcript rows of the log, and back, exactly.

A message of one of LangChain's standard classes (``HumanMessage``, ``AIMessage``,
``SystemMessage``, ``ToolMessage``, ``FunctionMessage``, ``ChatMessage``) becomes a
JSON-like dict with a chat ``role`` (``user``, ``assistant``, ``system``, ``tool``, ...)
and its fields, fields that hold their default value left out: the row the log's
projection, search and ``eventlog show`` read.  Reading rebuilds the same class with
``model_construct`` (no validator can change a field on the way back).

Every conversion is checked once, when the message is first stored: the row must
read back equal to the message.  A message that does not (a subclass, a field that
is not JSON-like, a tuple that would come back a list) is stored through the
checkpointer's own serializer instead, under :data:`SERDE_KEY`, with its role and
text beside it for readers.
"""

from __future__ import annotations

import base64
import math
from itertools import repeat
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from pydantic_core import PydanticUndefined

SERDE_KEY = "langgraph_serde"
"""The key of a row that holds a message in the serializer's form: ``[type, base64 bytes]``."""

CLASSES: dict[str, type[BaseMessage]] = {
    "user": HumanMessage,
    "assistant": AIMessage,
    "system": SystemMessage,
    "tool": ToolMessage,
    "function": FunctionMessage,
}
ROLES: dict[type[BaseMessage], str] = {cls: role for role, cls in CLASSES.items()}
_TYPE_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "function"}


def is_plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` reads back from the log equal and of the same types (JSON-like, no tuples)."""
    kind = type(value)
    if kind is str or value is None or kind is bool:
        return True
    if kind is int:
        return -(2**63) <= value < 2**64
    if kind is float:
        return math.isfinite(value)
    if depth > 60:
        return False
    if kind is list:
        return all(is_plain(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(key) is str and is_plain(item, depth + 1) for key, item in value.items())
    return False


def copy(value: Any) -> Any:
    """A copy of the containers of ``value`` sharing its leaves (strings are never copied)."""
    kind = type(value)
    if kind is dict:
        return {key: copy(item) for key, item in value.items()}
    if kind is list:
        return [copy(item) for item in value]
    if kind is tuple:
        return tuple(copy(item) for item in value)
    return value


def _defaults(cls: type[BaseMessage]) -> dict[str, Any]:
    """The fields of ``cls`` that a row may leave out, with the value they then take."""
    out: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if name == "content":
            continue
        if info.default_factory is not None:
            try:
                out[name] = info.default_factory()  # type: ignore[call-arg]
            except TypeError:
                continue
        elif info.default is not PydanticUndefined:
            out[name] = info.default
    return out


_STANDARD: list[type[BaseMessage]] = [*CLASSES.values(), ChatMessage]
_DEFAULTS = {cls: _defaults(cls) for cls in _STANDARD}


class MessageCodec:
    """Converts messages to rows and back; ``serde`` stores what a row cannot hold."""

    def __init__(self, serde: SerializerProtocol) -> None:
        self.serde = serde

    def to_row(self, message: BaseMessage) -> dict[str, Any]:
        """The transcript row of ``message``: compact when it reads back equal, else the serializer's form."""
        cls = type(message)
        if cls in _DEFAULTS:
            for compact in (True, False):
                row = _row(message, compact)
                if row is not None and is_plain(row):
                    try:
                        if self.from_row(row) == message:
                            return row
                    except Exception:  # a row some validator refuses: use the serializer
                        break
        kind, data = self.serde.dumps_typed(message)
        row = {"role": _TYPE_ROLES.get(str(getattr(message, "type", "")), str(getattr(message, "type", "message")))}
        if isinstance(message.content, str):
            row["content"] = message.content
        row[SERDE_KEY] = [kind, base64.b64encode(data).decode("ascii")]
        return row

    def from_row(self, row: dict[str, Any]) -> BaseMessage:
        """The message a row stands for (raises ``ValueError`` for a row no message class matches)."""
        stored = row.get(SERDE_KEY)
        if stored is not None:
            kind, data = stored
            message = self.serde.loads_typed((kind, base64.b64decode(data)))
            if not isinstance(message, BaseMessage):
                raise ValueError(f"a transcript row holds a {type(message).__name__}, not a message")
            return message
        if row.get("type") == "chat":
            cls: type[BaseMessage] = ChatMessage
            fields = dict(row)
        else:
            found = CLASSES.get(row.get("role"))  # type: ignore[arg-type]
            if found is None:
                raise ValueError(f"a transcript row has role {row.get('role')!r}, which no LangChain message class has")
            cls = found
            fields = {key: value for key, value in row.items() if key != "role"}
        # Every field given: pydantic resolving a default factory inspects its signature each time.
        for key, default in _DEFAULTS[cls].items():
            if key not in fields:
                fields[key] = default.copy() if type(default) in (dict, list) else default
        return cls.model_construct(**fields)


def _row(message: BaseMessage, compact: bool) -> dict[str, Any] | None:
    cls = type(message)
    defaults = _DEFAULTS[cls]
    fields = message.__dict__
    extra = message.__pydantic_extra__ or {}
    if cls is ChatMessage:
        row: dict[str, Any] = {}
    else:
        if "role" in fields or "role" in extra:
            return None
        row = {"role": ROLES[cls]}
    for key, value in (*fields.items(), *extra.items()):
        if compact and key != "content" and (cls is not ChatMessage or key != "type") and key in defaults:
            default = defaults[key]
            if type(value) is type(default) and value == default:
                continue
        row[key] = value
    return row


def snapshot(message: BaseMessage) -> tuple[Any, Any]:
    """What :func:`unchanged` compares ``message`` with later (a copy of its containers)."""
    return copy(message.__dict__), copy(message.__pydantic_extra__)


def unchanged(message: BaseMessage, snap: tuple[Any, Any]) -> bool:
    """Whether ``message`` still equals its :func:`snapshot` (every in-place edit shows)."""
    return message.__dict__ == snap[0] and message.__pydantic_extra__ == snap[1]


def is_message_list(value: Any) -> bool:
    """A non-empty list of LangChain messages (the ``messages`` channel of ``MessagesState``)."""
    return type(value) is list and bool(value) and all(map(isinstance, value, repeat(BaseMessage)))
