"""Moving transcripts in and out of the log as JSON Lines.

Reading (:func:`read_jsonl`) accepts two shapes per line, mixed freely:

- a message: a JSON object such as ``{"role": "user", "content": "hi"}``;
- a conversation: an object with a ``messages`` list and none of a message's ``role``,
  ``type`` or ``content``, such as an OpenAI fine-tuning line ``{"messages": [...]}``.
  Its other keys (a dataset's ``id``, the request's ``tools``) are not imported.  An
  object with one of those message keys (a Responses-API item ``{"type": ...,
  "messages": ...}``) is a message, so the messages the log exports read back as themselves.

The whole file is parsed and checked before anything is written, so a bad line
fails the import with its line number and nothing of the file is stored.

Writing (:func:`export_lines`) produces one of three formats:

``jsonl``     one message per line, exactly as stored (import gives back the same digests);
``openai``    one line ``{"messages": [...]}`` (the OpenAI fine-tuning format);
``sharegpt``  one line ``{"conversations": [{"from": ..., "value": ...}]}`` with the roles
              ``system``, ``human``, ``gpt``, ``function_call`` and ``observation``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import codec
from .errors import InvalidMessageError
from .text import text_of

FORMATS = ("jsonl", "openai", "sharegpt")
"""The export formats, in the order the command line lists them."""

SHAREGPT_ROLES = {
    "system": "system",
    "user": "human",
    "assistant": "gpt",
    "tool": "observation",
    "function": "observation",
}
"""Chat roles to ShareGPT ``from`` values (assistant tool calls become ``function_call`` turns)."""


class ImportFormatError(InvalidMessageError):
    """A line of an import file is not a message or a conversation; the text names the line."""

    def __init__(self, message: str, *, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass(frozen=True, slots=True)
class Conversation:
    """The messages read from an import file; ``lines[i]`` is the line of ``messages[i]``."""

    messages: list[dict[str, Any]]
    lines: list[int]


MESSAGE_KEYS = frozenset({"role", "type", "content"})
"""Keys that make an object with a ``messages`` key a message rather than a conversation."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON-like number")


def read_jsonl(text: str, *, name: str = "<input>", split: bool = False) -> list[Conversation]:
    """Parse and check an import file; return its conversations.

    Without ``split`` every message of the file, in file order, belongs to one
    conversation.  With ``split`` each ``{"messages": [...]}`` line is a conversation
    of its own and consecutive plain message lines form one.

    Raises :class:`ImportFormatError` (a ``ValueError``) naming ``name:line`` for the
    first line that is not valid JSON, not an object, has no usable ``messages``
    list, or holds a value the log cannot store (such as a number too large for 64 bits).
    """
    conversations: list[Conversation] = []
    current = Conversation([], [])
    # Lines end at "\n" only: str.splitlines() would also split at U+2028, U+2029 and
    # U+0085, which JSON leaves unescaped inside strings (and the exports write as is).
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"{name}:{number}"
        try:
            value = json.loads(line, parse_constant=_reject_constant)
        except ValueError as e:
            raise ImportFormatError(f"{where}: not valid JSON ({e})", line=number) from None
        except RecursionError:
            raise ImportFormatError(f"{where}: nested too deeply to read", line=number) from None
        if not isinstance(value, dict):
            raise ImportFormatError(
                f'{where}: expected a JSON object (a message or {{"messages": [...]}}), found {_json_type(value)}',
                line=number,
            )
        if "messages" in value and not value.keys() & MESSAGE_KEYS:
            batch = value["messages"]
            if not isinstance(batch, list):
                raise ImportFormatError(f'{where}: "messages" must be a list, found {_json_type(batch)}', line=number)
            for i, message in enumerate(batch):
                if not isinstance(message, dict):
                    raise ImportFormatError(
                        f"{where}: messages[{i}] must be a JSON object, found {_json_type(message)}", line=number
                    )
            if split and current.messages:
                conversations.append(current)
                current = Conversation([], [])
            _check(batch, where, number)
            current.messages.extend(batch)
            current.lines.extend([number] * len(batch))
            if split:
                conversations.append(current)
                current = Conversation([], [])
        else:
            _check([value], where, number)
            current.messages.append(value)
            current.lines.append(number)
    if current.messages or not conversations:
        conversations.append(current)
    return conversations


def _check(messages: list[dict[str, Any]], where: str, number: int) -> None:
    for i, message in enumerate(messages):
        try:
            codec.canonical(message, i)
        except InvalidMessageError as e:
            detail = str(e)
            if len(messages) == 1 and detail.startswith("messages[0]"):
                detail = "message" + detail[len("messages[0]") :]
            raise ImportFormatError(f"{where}: {detail}", line=number) from None


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return "an object"


def export_lines(messages: Sequence[Mapping[str, Any]], fmt: str) -> Iterator[str]:
    """The lines (without newline) of ``messages`` written in format ``fmt`` (see :data:`FORMATS`)."""
    if fmt == "jsonl":
        for message in messages:
            yield _dumps(message)
    elif fmt == "openai":
        yield _dumps({"messages": list(messages)})
    elif fmt == "sharegpt":
        yield _dumps({"conversations": to_sharegpt(messages)})
    else:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")


def to_sharegpt(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Chat messages as ShareGPT turns ``{"from": ..., "value": ...}``.

    An assistant message with ``tool_calls`` gives its text (if any) as a ``gpt`` turn
    and one ``function_call`` turn per call, whose value is ``{"name", "arguments"}``
    as JSON; tool results become ``observation`` turns.
    """
    turns: list[dict[str, str]] = []
    for message in messages:
        role = str(message.get("role", ""))
        text = text_of(message.get("content")) or ""
        calls = tool_calls(message)
        if role == "assistant" and calls:
            if text:
                turns.append({"from": "gpt", "value": text})
            for function in map(function_of, calls):
                arguments = function.get("arguments", "")
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except ValueError:
                        pass
                turns.append(
                    {
                        "from": "function_call",
                        "value": _dumps({"name": function.get("name", ""), "arguments": arguments}),
                    }
                )
            continue
        turns.append({"from": SHAREGPT_ROLES.get(role, role or "unknown"), "value": text})
    return turns


def tool_calls(message: Mapping[str, Any]) -> list[Any]:
    """A message's ``tool_calls`` when they are a list (the log stores any JSON-like value)."""
    calls = message.get("tool_calls")
    return calls if isinstance(calls, list) else []


def function_of(call: Any) -> Mapping[str, Any]:
    """The ``function`` object of a tool call (``name`` and ``arguments``), or an empty mapping.

    OpenAI's calls nest it under ``function``; LangChain's (``{"name", "args", "id"}``) are
    flat, their arguments under ``args``.
    """
    if not isinstance(call, Mapping):
        return {}
    function = call.get("function")
    if isinstance(function, Mapping):
        return function
    if isinstance(call.get("name"), str) and "args" in call:
        return {"name": call["name"], "arguments": call["args"]}
    return {}


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
