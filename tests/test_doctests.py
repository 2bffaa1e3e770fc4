"""The docstring examples of the modules that have them run and hold (each at least one)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "eventlog",
    "eventlog.aio",
    "eventlog.codec",
    "eventlog.merkle",
    "eventlog.redact",
    "eventlog.spill",
    "eventlog.text",
    "eventlog.verify",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no example to run"
    assert result.failed == 0
