from typing import Any, final

@final
class Record:
    """What a message was when it was flushed (see :func:`record`)."""

def record(message: Any, max_depth: int, /) -> Record | None: ...
def first_changed(records: list[Any], messages: list[Any], start: int, stop: int, /) -> int: ...
