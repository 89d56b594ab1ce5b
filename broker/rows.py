"""A stored event as the log store hands it out: `StoredEvent`, and the
cheaper `PageRow` a page read returns (PostgreSQL's row itself, or a
StoredEvent from a memory store), indexed with the ROW_* positions.

Nothing here knows the database: a reader outside `broker/` (the hub, a
replay) types its rows as PageRow and never sees the driver's record type.

StoredEvent is a NamedTuple, where the broker's other results are msgspec
Structs: a page row is read by position on the hot replay path, the same
whether it is PostgreSQL's row or a StoredEvent, so it must index like one
(`row[ROW_SEQ]`, `StoredEvent(*row)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol


class StoredEvent(NamedTuple):
    run_id: str
    seq: int
    cursor: int
    type: str
    payload: bytes  # the event's JSON, as appended


# Where a page row holds each of StoredEvent's fields (`StoredEvent(*row)` makes one).
ROW_RUN_ID, ROW_SEQ, ROW_CURSOR, ROW_TYPE, ROW_PAYLOAD = range(5)


class PageRow(Protocol):
    """One event of a page: StoredEvent's fields, in its order."""

    def __getitem__(self, index: int, /) -> Any: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...
