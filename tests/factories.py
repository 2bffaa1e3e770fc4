"""Message builders and fixture helpers shared by the tests."""

from __future__ import annotations

import pytest


def user(text: str, **extra: object) -> dict[str, object]:
    return {"role": "user", "content": text, **extra}


def assistant(text: str, **extra: object) -> dict[str, object]:
    return {"role": "assistant", "content": text, **extra}


def tool(call_id: str, text: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def with_or_without_plain(module: object, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """For a fixture parametrized C first, then Python: ``module`` with ``eventlog._plain`` as
    built (skipped where it was not), or with it taken away so its pure-Python fallback runs."""
    if request.param_index == 0:
        if module._plain is None:
            pytest.skip("eventlog._plain was not built (no C compiler)")
    else:
        monkeypatch.setattr(module, "_plain", None)
    return str(request.param)
