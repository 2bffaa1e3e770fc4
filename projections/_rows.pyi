from typing import Any

def group_rows(
    rows: list[tuple[Any, ...]], first_id: int, width: int, blobs: int, /
) -> dict[int, list[tuple[Any, ...]]]: ...
