"""A catch-up replay's pages as PostgreSQL returned them (`Store.stream_rows`),
and the read of the next one started ahead of its turn.

A replay of a long stream to a client that keeps up is bound by two costs
that add up when done one after the other: PostgreSQL reading a page and the
gateway turning it into frames and writing them. So:

- The frames of a page are built from the rows themselves (payloads joined
  once), with no `StoredEvent` per event; the member falls back to the
  per-event path (`contiguous` → `EncodedBatch`) where it needs one (a
  lagging queue coalesces per event, one event per frame, compat "raw").
- While one page is built and written, the next is read (`PageRead`): only
  when that turn pushed a whole, full page, the client's queue will not make
  the next turn wait, and a replay slot is free right now (`try_acquire`,
  never a wait: with others waiting there is no read ahead, and turns stay
  round-robin). The read holds its own slot until its page is pushed, so
  "a page is held only inside a turn" still holds, and a replay holds at
  most two turns' pages; one about to wait for its client drops its read
  ahead (`drop`), holding no page while it waits.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Coroutine, Sequence
from typing import Any

from broker.rows import ROW_PAYLOAD, PageRow

from .replay_slots import ReplaySlots


def chunk_len(payloads: Sequence[bytes], max_bytes: int) -> int:
    """How many of `payloads` (from the start) one turn pushes: at most
    `max_bytes` of payload, at least one."""
    if sum(map(len, payloads)) <= max_bytes:
        return len(payloads)
    for i, size in enumerate(itertools.accumulate(map(len, payloads))):
        if i and size > max_bytes:
            return i
    return len(payloads)  # unreachable: the total is over max_bytes


def payloads_of(rows: Sequence[PageRow]) -> list[bytes]:
    return [r[ROW_PAYLOAD] for r in rows]


def sse_text(first: int, payloads: Sequence[bytes]) -> bytes:
    """SSE frames of contiguous events first, first+1, ... (as `frames.sse_frame` each)."""
    parts: list[bytes] = []
    for pos, payload in enumerate(payloads, first):
        parts += (b"id: ", str(pos).encode(), b"\ndata: ", payload, b"\n\n")
    return b"".join(parts)


class PageRead:
    """A page read started ahead of its turn, holding the replay slot it
    was granted (`granted`, for `ReplaySlots.release`)."""

    __slots__ = ("after", "granted", "limit", "task")

    def __init__(
        self,
        read: Coroutine[Any, Any, list[PageRow]],
        after: int,
        limit: int,
        granted: float,
    ) -> None:
        self.after = after
        self.limit = limit
        self.granted = granted
        self.task = asyncio.get_running_loop().create_task(read, name="runlog-replay-read")

    def drop(self, slots: ReplaySlots) -> None:
        """Give it up: cancel the read, free its slot (never awaits)."""
        self.task.cancel()
        self.task.add_done_callback(_retrieve)
        slots.release(self.granted)


def _retrieve(task: asyncio.Task[list[PageRow]]) -> None:
    if not task.cancelled():
        task.exception()  # a read that failed before it was dropped: nothing to report
