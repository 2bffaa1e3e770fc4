"""Moving transcripts in and out of the log as JSON Lines.

Reading (:func:`read_jsonl`) accepts two shapes per line, mixed freely:

- a message: a JSON object such as ``{"role": "user", "content": "hi"}``;
- a conversation: an object with a ``messages`` list and none of a message's ``role``,
  ``type`` or ``content``, such as an OpenAI fine-tuning line ``{"messages": [...]}``.
  Its other keys (a dataset's ``id``, the request's ``tools``) are not imported.  An
  object with one of those message keys (a Responses-API item ``{"type": ...,
  "messages": ...}``) is a message, so the messages the log exports read back as themselves.

The whole file is parsed and checked before anything is written, so a bad line
fails the import with its line number and nothing of the file is stored.  Lines are
parsed by msgspec and the file's messages checked in one pass (see
:func:`~eventlog.codec.plain_batch`); a line msgspec refuses, or a file that pass cannot
vouch for, is read again line by line by the standard library's parser and checked message
by message, which names the first bad line and what is wrong with it.

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
from typing import Any, NoReturn

import msgspec

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
    # Per line: its number, its messages, and whether msgspec parsed it (its strings are then
    # known to be valid text; the standard parser lets lone surrogates through).
    read: list[tuple[int, list[dict[str, Any]], bool]] = []
    decode = _decode
    # Lines end at "\n" only: str.splitlines() would also split at U+2028, U+2029 and
    # U+0085, which JSON leaves unescaped inside strings (and the exports write as is).
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = decode(line)
            vetted = True
        except (msgspec.MsgspecError, RecursionError):
            value = _parse(line, read, name, number)  # the standard parser says what is wrong
            vetted = False
        if type(value) is not dict:
            _refuse(
                read,
                name,
                number,
                f'expected a JSON object (a message or {{"messages": [...]}}), found {_json_type(value)}',
            )
        if "messages" in value and not value.keys() & MESSAGE_KEYS:
            batch = value["messages"]
            if type(batch) is not list:
                _refuse(read, name, number, f'"messages" must be a list, found {_json_type(batch)}')
            for i, message in enumerate(batch):
                if type(message) is not dict:
                    _refuse(read, name, number, f"messages[{i}] must be a JSON object, found {_json_type(message)}")
            if split and current.messages:
                conversations.append(current)
                current = Conversation([], [])
            read.append((number, batch, vetted))
            current.messages.extend(batch)
            current.lines.extend([number] * len(batch))
            if split:
                conversations.append(current)
                current = Conversation([], [])
        else:
            read.append((number, [value], vetted))
            current.messages.append(value)
            current.lines.append(number)
    _check_all(read, name)
    if current.messages or not conversations:
        conversations.append(current)
    return conversations


_decode = msgspec.json.Decoder().decode


def _parse(line: str, read: list[tuple[int, list[dict[str, Any]], bool]], name: str, number: int) -> Any:
    """A line msgspec refused, parsed by the standard library: its error names what is wrong
    (or it reads a value msgspec refuses to, such as a lone surrogate, that the check names)."""
    try:
        return json.loads(line, parse_constant=_reject_constant)
    except ValueError as e:
        _refuse(read, name, number, f"not valid JSON ({e})")
    except RecursionError:
        _refuse(read, name, number, "nested too deeply to read")


def _refuse(read: list[tuple[int, list[dict[str, Any]], bool]], name: str, number: int, what: str) -> NoReturn:
    """Raise the error of line ``number``, unless a line before it holds a message that cannot
    be stored: the first bad line is the one named."""
    _check_all(read, name)
    raise ImportFormatError(f"{name}:{number}: {what}", line=number)


def _check_all(read: list[tuple[int, list[dict[str, Any]], bool]], name: str) -> None:
    """Raise :class:`ImportFormatError` for the first message of ``read`` that cannot be stored."""
    lines = read
    if codec.plain_batch([message for _, messages, vetted in read if vetted for message in messages], ints=True):
        lines = [line for line in read if not line[2]]  # the common file: every message plain JSON-like
    for number, messages, _ in lines:
        for i, message in enumerate(messages):
            try:
                codec.canonical(message, i)
            except InvalidMessageError as e:
                detail = str(e)
                if len(messages) == 1 and detail.startswith("messages[0]"):
                    detail = "message" + detail[len("messages[0]") :]
                raise ImportFormatError(f"{name}:{number}: {detail}", line=number) from None


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
