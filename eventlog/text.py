"""The text of a message's content: one rule for the command line, exports and projections.

A string is its own text; a list of parts gives its text parts joined by newlines, with a
placeholder for an image, audio or a file (``[image]``) and nothing for parts that are
not display text (tool calls, reasoning); a single part as a mapping is read as a list of
one; anything else is shown as its JSON.  The full message always stays in the log.

>>> text_of([{"type": "text", "text": "look:"}, {"type": "image_url", "image_url": {"url": "..."}}])
'look:\\n[image]'
>>> text_of(None) is None
True
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

PLACEHOLDERS: Final = {
    "image": "[image]",
    "image_url": "[image]",
    "input_image": "[image]",
    "audio": "[audio]",
    "input_audio": "[audio]",
    "output_audio": "[audio]",
    "file": "[file]",
    "input_file": "[file]",
    "document": "[file]",
}
"""Part types of multimodal content and the text that stands for them."""

TEXT_PARTS: Final = frozenset({"text", "input_text", "output_text"})
SILENT_PARTS: Final = frozenset(
    {"tool_use", "function_call", "thinking", "redacted_thinking", "reasoning", "server_tool_use"}
)
"""Parts that are not display text (tool calls are shown and indexed on their own)."""

_json = msgspec.json.Encoder()


def text_of(content: Any) -> str | None:
    """The display text of a message's ``content`` (``None`` when it has none)."""
    if content is None or type(content) is str:
        return content
    if type(content) is list:
        return "\n".join([text for text in map(_part_text, content) if text])
    if type(content) is dict:
        return _part_text(content) or ""
    return _json.encode(content).decode()


def _part_text(part: Any) -> str | None:
    if type(part) is str:
        return part
    if type(part) is not dict:
        return None
    kind = part.get("type")
    if kind in TEXT_PARTS:
        text = part.get("text")
        return text if type(text) is str else None
    placeholder = PLACEHOLDERS.get(kind) if type(kind) is str else None
    if placeholder is not None:
        return placeholder
    if kind == "refusal":
        text = part.get("refusal")
        return text if type(text) is str else None
    if kind == "tool_result":
        return text_of(part.get("content"))
    if kind in SILENT_PARTS:
        return None
    text = part.get("text")
    if type(text) is str:
        return text
    return f"[{kind}]" if type(kind) is str else None
