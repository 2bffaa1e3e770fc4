from collections.abc import Callable
from typing import Any

def group_rows(
    rows: list[tuple[Any, ...]], first_id: int, width: int, blobs: int, /
) -> dict[int, list[tuple[Any, ...]]]: ...
def derive(
    message: Any, encode: Callable[[Any], bytes], text_of: Callable[[Any], str | None], /
) -> tuple[Any, ...] | None: ...
