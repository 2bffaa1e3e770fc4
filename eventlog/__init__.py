"""A durable, content-addressed transcript log for AI agents.

>>> import tempfile
>>> from eventlog import EventLog
>>> with tempfile.TemporaryDirectory() as tmp, EventLog.open(tmp) as log:
...     turn = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
...     log.flush("chat", turn).appended, log.flush("chat", turn).appended
...     log.messages("chat")[1]["content"]
(2, 0)
'hello'
"""

from __future__ import annotations

from .errors import (
    ConflictError,
    CorruptLogError,
    EventLogError,
    HistoryMismatchError,
    InvalidMessageError,
    LogInUseError,
    ReadOnlyError,
    RedactedError,
    StorageFullError,
    UnknownSessionError,
)
from .log import COUNTERS, EMPTY_HEAD, EventLog, FlushResult, check_session_id
from .redact import Redaction
from .replay import Occurrence, SessionInfo, Tombstone, repair
from .snapshot import EPHEMERAL_FLAGS, is_ephemeral
from .source import EventSource
from .spill import RecoveryReport, SpillingWriter, SpillResult, recover
from .store import Record
from .verify import LogHead, Problem, VerifyReport

__all__ = [
    "COUNTERS",
    "EMPTY_HEAD",
    "EPHEMERAL_FLAGS",
    "ConflictError",
    "CorruptLogError",
    "EventLog",
    "EventLogError",
    "EventSource",
    "FlushResult",
    "HistoryMismatchError",
    "InvalidMessageError",
    "LogHead",
    "LogInUseError",
    "Occurrence",
    "Problem",
    "ReadOnlyError",
    "Record",
    "RecoveryReport",
    "RedactedError",
    "Redaction",
    "SessionInfo",
    "SpillResult",
    "SpillingWriter",
    "StorageFullError",
    "Tombstone",
    "UnknownSessionError",
    "VerifyReport",
    "check_session_id",
    "is_ephemeral",
    "recover",
    "repair",
]
