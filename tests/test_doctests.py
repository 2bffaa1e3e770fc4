"""The docstring examples of the public modules run and hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["eventlog", "eventlog.spill", "eventlog.codec", "eventlog.log", "eventlog.replay", "eventlog.aio"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
