"""What a projection reads from a log: the :class:`EventSource` protocol.

An :class:`~eventlog.EventLog` is one; so is anything else that can hand out a log's
events in ``seq`` order (a copy shipped elsewhere, a test double that replays a list).
A projection keeps ``id`` and the last ``seq`` it applied as its checkpoint, and asks
for ``events(after=checkpoint)``; a ``last_seq`` below its checkpoint means the log is
an older copy than the one it projected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from .keys import Record


class EventSource(Protocol):
    """A log's id, its newest ``seq``, and its events after a ``seq``, in order."""

    @property
    def id(self) -> str:
        """The log's id (32 hex characters): a projection holds the events of one log only."""
        ...

    @property
    def last_seq(self) -> int:
        """The seq of the newest event (0 for an empty log)."""
        ...

    def events(self, after: int = 0) -> Iterable[Record]:
        """The events with ``seq > after``, in order; ``seq`` is gapless from 1."""
        ...
