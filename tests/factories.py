"""Message builders shared by the tests."""

from __future__ import annotations


def user(text: str, **extra: object) -> dict[str, object]:
    return {"role": "user", "content": text, **extra}


def assistant(text: str, **extra: object) -> dict[str, object]:
    return {"role": "assistant", "content": text, **extra}


def tool(call_id: str, text: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}
