"""What a reader of the log needs of its two backends: `LogStore`, the durable
log (PostgreSQL: `store.Store`), and `LiveBus`, the live feed (NATS: `bus.Bus`).
Memory implementations of both live beside this file (`backend_memory.py`),
so the merge of history and live (`merge.py`), `Subscription` and the
gateway's hub are tested in milliseconds, without servers.

A position is a run's `seq` (1, 2, 3, … with no hole while the run exists)
or a session's `cursor` (increasing across the session's runs; a pruned run
leaves a hole of the cursors it had). "The stream" is a run or a session:
`by_run` says which, `ident` is its id.

Contract of a `LogStore`:
- Ordering: a page holds the stream's committed events strictly after
  `after`, in increasing position, at most `limit` of them. A page shorter
  than `limit` means the reader is at the head as of that read.
- Visibility: only committed events are read, and an event committed before
  a read starts is in it (or in a later page). Once read, an event is read
  again by every later page that covers its position (nothing read is ever
  taken back), except that pruning deletes whole ended runs.
- Heads: `stream_head` is the last position committed (0 for an empty
  stream) and, for a run, whether it has ended (its `run_end` is committed);
  a session never ends. The head only grows.
- Failures: an unknown run or session raises `errors.RunNotFound` or
  `errors.SessionNotFound`; a store that cannot answer within `retry_s`
  raises `errors.StorageError` (retryable). Reads have no side effects.

Contract of a `LiveBus` (the live feed):
- Delivery is best effort: a batch may be missing (a server down, a
  subscriber too slow), duplicated (a retried publish) or, across
  publishers, out of order. A batch is published only after its events are
  committed, so a reader that dedupes by position and reads a page when it
  sees a hole never delivers an event the store does not hold.
- `subscribe_live` calls `callback` for each batch on a subject matching the
  filter, from the bus's reader, one at a time, in the order the bus
  received them: the callback must not block or await. The subscription is
  live at the bus when the call returns, so a batch published after that
  reaches it (unless lost, as above).
- `publish_live` returns a future resolved with the message's position in
  the bus's own stream when the bus acknowledges it; a publisher may retry
  one not acknowledged, with the same `msg_id`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, cast

from .bus import LiveBatch
from .rows import PageRow, StoredEvent

__all__ = ["LiveBatch", "LiveBus", "LiveSubscription", "LogStore"]


class LogStore(Protocol):
    """The durable log as its readers see it (the contract: module docstring)."""

    async def stream_page(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float
    ) -> list[StoredEvent]:
        """Up to `limit` events of the stream after position `after`, in order."""
        ...

    async def stream_rows(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float
    ) -> list[PageRow]:
        """`stream_page` as rows holding StoredEvent's fields in its order
        (index them with rows.ROW_*): for readers that need only positions and
        payloads, without an object per event."""
        ...

    async def stream_head(self, by_run: bool, ident: str, *, retry_s: float) -> tuple[int, bool]:
        """(the last committed position, whether the stream ended: only runs end)."""
        ...


class LiveSubscription(Protocol):
    """One `subscribe_live`; no batch reaches its callback once `unsubscribe` returns."""

    async def unsubscribe(self) -> None: ...


class LiveBus(Protocol):
    """The live feed's two ends (the contract: module docstring)."""

    async def publish_live(self, subject: str, data: bytes, msg_id: str) -> asyncio.Future[int]:
        """Send one encoded LiveBatch (bus.encode_batch) on `subject`
        (constants.events_subject); `msg_id` names it for deduplication
        of a retried publish. The future resolves when the bus acknowledges."""
        ...

    async def subscribe_live(
        self, subject: str, callback: Callable[[LiveBatch], None]
    ) -> LiveSubscription:
        """Call `callback` with each batch published on subjects matching
        `subject` (constants.run_events_filter, session_events_filter)."""
        ...


if TYPE_CHECKING:
    # The PostgreSQL and NATS implementations satisfy the protocols (mypy
    # checks these lines; they are never run).
    from .bus import Bus
    from .store import Store

    _store: LogStore = cast(Store, None)
    _bus: LiveBus = cast(Bus, None)
