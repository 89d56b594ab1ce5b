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

What a run's execution (`workers.context.RunContext`) needs of the log's
write side: `RunLog`, its owner's writer (PostgreSQL: `log.RunWriter`), and
`RunStore`, the run's rows (PostgreSQL: `store.Store`).

Contract of a `RunLog` (one run, one owner, one epoch):
- `append` gives the event the next `seq` (1, 2, 3, … with no hole), its
  run and session ids and `ts`, and returns the seq at once; `flush` waits
  until everything appended is committed and returns the last seq.
- Fencing: a commit takes effect only while the writer's `epoch` owns the
  run; otherwise nothing of it is stored and the writer raises
  `errors.StaleEpoch`, for that and every later call. Nothing follows
  `run_end`: an append after it raises `errors.RunEnded`. A store that stays
  away past the outage grace fails the writer with `errors.StorageError`.
  After any failure the writer is dead: every call raises that error.

Contract of a `RunStore` (the run's steps, approvals, status; the log read):
- The owner's writes (`record_step`, `create_approval`, `expire_approval`,
  `close_run_approvals`, `set_status`) are fenced like a commit: while
  `epoch` owns the unended run they take effect, else nothing is written
  and StaleEpoch is raised (`set_status` returns False instead).
- Approvals are decided once (`approvals.py`'s contract of `decide`); the
  worker reads a decision with `poll_approval` (tried once).
- Failures: `retry.py` (reads retried for `db_retry_s`, writes and polls
  tried once, an outage is StorageError).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, cast

from . import events
from .approvals import ApprovalInfo
from .bus import LiveBatch
from .rows import PageRow, StoredEvent
from .steps import StepKind, StepRecord

__all__ = ["LiveBatch", "LiveBus", "LiveSubscription", "LogStore", "RunLog", "RunStore"]


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


class RunLog(Protocol):
    """The owner's writer of one run's log (the contract: module docstring)."""

    @property
    def run_id(self) -> str: ...

    @property
    def session_id(self) -> str: ...

    @property
    def epoch(self) -> int:
        """The owner's epoch, which fences its commits and writes."""
        ...

    @property
    def last_seq(self) -> int:
        """The seq given to the latest append (committed or not)."""
        ...

    @property
    def committed_seq(self) -> int:
        """The last seq known committed."""
        ...

    async def append(self, event: events.Event) -> int:
        """Give `event` the next seq (and its ids and ts); return the seq."""
        ...

    async def flush(self) -> int:
        """Wait until every event appended is committed; return the last seq."""
        ...


class RunStore(Protocol):
    """What a run's execution reads and writes besides its log (the contract:
    module docstring): the `Store` methods the runner, the journal, the
    approvals, the ending and a takeover call. Declared returning awaitables,
    as the Store's retrying methods (`retry.reads`/`writes`) are typed."""

    def run_page(self, run_id: str, after: int, limit: int) -> Awaitable[list[StoredEvent]]:
        """Up to `limit` committed events of the run after seq `after`."""
        ...

    def conversation(
        self, session_id: str, run_id: str, limit: int
    ) -> Awaitable[list[tuple[str, str, list[bytes]]]]:
        """The session's last `limit` ended runs created before `run_id`, oldest
        first: (run_id, input, payloads of their text_delta and message_reset)."""
        ...

    def set_status(self, run_id: str, epoch: int, status: str) -> Awaitable[bool]:
        """The run's status under `epoch` (fenced); False if it is not the owner's."""
        ...

    def interrupt_request(self, run_id: str) -> Awaitable[tuple[str, int, str] | None]:
        """(requested_by, requested_at_ms, reason) of the run's stop, if one was asked."""
        ...

    def load_steps(self, run_id: str) -> Awaitable[list[StepRecord]]:
        """The run's durable steps, by index."""
        ...

    def record_step(
        self, *, run_id: str, epoch: int, idx: int, name: str, kind: StepKind, done: bool,
        result: bytes | None, seq: int,
    ) -> Awaitable[None]:  # fmt: skip
        """Write step `idx` (fenced); again, it overwrites it but keeps its first epoch."""
        ...

    def create_approval(
        self, *, approval_id: str, run_id: str, epoch: int, tool_call_id: str, summary: str,
        expires_at_ms: int, call_digest: str = "",
    ) -> Awaitable[None]:  # fmt: skip
        """A new approval of the run (fenced); the same id again is a no-op."""
        ...

    def poll_approval(self, approval_id: str) -> Awaitable[ApprovalInfo]:
        """The approval as stored, read once; ApprovalNotFound if there is none."""
        ...

    def expire_approval(
        self, approval_id: str, *, run_id: str, epoch: int
    ) -> Awaitable[ApprovalInfo]:
        """Mark it expired if undecided and past its expiry (fenced); what is stored."""
        ...

    def run_approvals(self, run_id: str) -> Awaitable[list[ApprovalInfo]]:
        """Every approval of the run, decided or not, oldest first."""
        ...

    def close_run_approvals(self, run_id: str, epoch: int) -> Awaitable[int]:
        """Expire the run's undecided approvals (fenced: the run ends); how many."""
        ...


if TYPE_CHECKING:
    # The PostgreSQL and NATS implementations satisfy the protocols (mypy
    # checks these lines; they are never run).
    from .bus import Bus
    from .log import RunWriter
    from .store import Store

    _store: LogStore = cast(Store, None)
    _bus: LiveBus = cast(Bus, None)
    _writer: RunLog = cast(RunWriter, None)
    _run_store: RunStore = cast(Store, None)
