"""Text that is safe to print on a terminal: control characters shown, never obeyed.

Message text and session ids come from models, tools and users.  Printed raw, an escape
sequence in a tool result can erase the line above it (the tool call it answers) or set the
window title, and a bidi override can reorder what is shown.  Human output therefore passes
every such character through :func:`visible`, which writes it as a Python-style escape
(``\\x1b``, ``\\u202e``); JSON output stays exact.
"""

from __future__ import annotations

import re
from typing import Final

_UNSAFE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff]")
"""C0 and C1 controls, DEL, the line and paragraph separators, bidi embeddings, overrides and
isolates, and the zero-width no-break space: characters a terminal acts on or hides."""

_NAMED: Final = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str, *, newline: str | None = None) -> str:
    """``text`` with every control character written as an escape (``\\x1b``, ``\\t``, ``\\u202e``).

    ``newline``: what a line break becomes instead of ``\\n`` (for example a newline and an
    indent, so that a multi-line message reads as continuation lines).
    """
    if newline is not None:
        return newline.join(_UNSAFE.sub(_escape, line) for line in text.split("\n"))
    return _UNSAFE.sub(_escape, text)
