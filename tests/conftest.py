from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eventlog import EventLog


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    with EventLog.open(tmp_path / "log") as opened:
        yield opened
