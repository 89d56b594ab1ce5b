"""Read path: stored history merged with the live feed, with no gap and no
duplicate.

Contract of `Subscription` (an async iterator of event lists):
- It yields every committed event of the run (or session) after `after`,
  exactly once, in position order (`seq` for a run, `cursor` for a session).
- It subscribes to the live feed *before* reading history, buffering live
  batches meanwhile, so nothing committed during the replay is missed.
- Live batches are deduplicated by position; a batch that starts past the
  next expected position reveals a hole, filled from PostgreSQL (those
  decisions, and the bounded queue of live batches, are merge.py's, which
  the gateway's hub shares).
- When the live feed is quiet for `position_check_s`, it compares its
  position with PostgreSQL's head and fills the difference: a tail whose
  live message never came (NATS down, message dropped) still arrives.
- A run subscription ends after delivering `run_end`; a session one never ends.

`follow(sink)` hands the same lists, in the same order, to a callback
instead: a live batch that continues exactly where the stream is while
nothing else is in progress goes to the sink from the NATS reader itself
(no queue, no task switch: the gateway's path at a model's pace, where
nearly every live message carries one or two events); everything else
(history, holes, position checks, batches that arrive meanwhile) takes the
iterator's path, in order after what was handed over already.

Since an event is published only after commit, every event yielded is one a
later replay returns (no phantom events).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from . import constants as C
from . import errors
from .backend import LiveBus, LiveSubscription, LogStore
from .bus import LiveBatch
from .merge import HOLE, STALE, LiveBuffer, place
from .metrics import BrokerMetrics
from .rows import StoredEvent
from .settings import Settings

log = logging.getLogger(__name__)


# Takes (events, committed_ms): see Subscription.follow.
Sink = Callable[[list[StoredEvent], float], None]


def batch_items(batch: LiveBatch) -> list[StoredEvent]:
    rid, seq, cur, types = batch.run_id, batch.seq, batch.cursor, batch.types
    return [
        StoredEvent(rid, seq + i, cur + i, types[i], bytes(raw))
        for i, raw in enumerate(batch.events)
    ]


class Subscription:
    def __init__(
        self,
        store: LogStore,
        bus: LiveBus | None,
        settings: Settings,
        metrics: BrokerMetrics,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        after: int = 0,
    ) -> None:
        if (run_id is None) == (session_id is None):
            raise ValueError("subscribe to exactly one of run_id or session_id")
        if after < 0:
            raise errors.InvalidCursor("a cursor is a non-negative integer")
        self.store = store
        self.bus = bus
        self.settings = settings
        self.metrics = metrics
        self.run_id = run_id
        self.session_id = session_id
        self.position = after
        self.ended = False
        # When the last list yielded came from the live feed: its commit time
        # (ms, wall clock); 0 when it came from PostgreSQL.
        self.committed_ms = 0.0
        self._replaying = True
        # Live batches not read yet, bounded by the events they hold (past
        # the bound one is dropped; the next batch or the position check
        # reveals the hole; one batch is always taken, however large: a hole
        # has to end). `overflowed` names the next gap fill's cause.
        self._queue: LiveBuffer[LiveBatch] = LiveBuffer(settings.live_buffer_max)
        # While the reader waits for the live feed: the future that wakes it
        # (True: something to do; False: quiet for position_check_s), and
        # when the feed last delivered (loop time).
        self._waiter: asyncio.Future[bool] | None = None
        self._quiet: asyncio.TimerHandle | None = None
        self._last_live = 0.0
        self._sink: Sink | None = None  # set by follow()
        self._sink_error: Exception | None = None
        self._live_sub: LiveSubscription | None = None
        self._by_run = run_id is not None
        self._ident = run_id if run_id is not None else session_id or ""

    # -- lifecycle

    async def start(self) -> Subscription:
        if self.bus is not None:
            subject = (
                C.run_events_filter(self.run_id)
                if self.run_id is not None
                else C.session_events_filter(self.session_id or "")
            )
            self._live_sub = await self.bus.subscribe_live(subject, self._on_live)
        try:
            head, ended = await self._head_and_end()
        except BaseException:
            await self.close()
            raise
        if ended and self.position >= head:
            self.ended = True  # an ended run, read to its end already
        if self.position > head:
            await self.close()
            raise errors.InvalidCursor(
                f"cursor {self.position} is past the head ({head})",
                hint="resume from a cursor this stream gave you",
            )
        return self

    async def close(self) -> None:
        if self._live_sub is not None:
            sub, self._live_sub = self._live_sub, None
            try:
                await sub.unsubscribe()
            except Exception:  # connection already closed: nothing to undo
                pass

    async def __aenter__(self) -> Subscription:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __aiter__(self) -> Subscription:
        return self

    # -- iteration

    async def __anext__(self) -> list[StoredEvent]:
        while True:
            if self._sink_error is not None:
                e, self._sink_error = self._sink_error, None
                raise e
            if self.ended:
                raise StopAsyncIteration
            if self._replaying:
                self.committed_ms = 0.0
                page = await self._page()
                if len(page) < self.settings.page_max_events:
                    self._replaying = False
                if page:
                    return self._deliver(page)
                continue
            if not self._queue:
                if await self._wait_live():
                    continue  # queued, or handed to the sink (which may have ended it)
                self.committed_ms = 0.0
                page = await self._check_position()
                if page:
                    return self._deliver(page)
                if self.ended:
                    raise StopAsyncIteration from None
                continue
            batch = self._queue.popleft()
            at = self._place(batch)
            if at == STALE:
                continue
            if at == HOLE:
                self.committed_ms = 0.0
                self.metrics.gap_fills.labels("gap").inc()
                page = await self._page()
                if page:
                    return self._deliver(page)
                continue  # not visible yet on this connection: wait for more
            self.committed_ms = batch.committed_ms
            items = batch_items(batch)
            return self._deliver(items[at:] if at else items)

    async def follow(self, sink: Sink) -> None:
        """Hand every event to `sink(items, committed_ms)` until the stream
        ends: the lists iterating would yield, in the same order, with the
        commit time (ms, wall clock) of a live one, 0 for one read from
        PostgreSQL. `sink` must not block or await (it may be called from
        the NATS reader); an exception from it ends `follow` with it."""
        self._sink = sink
        try:
            async for items in self:
                sink(items, self.committed_ms)
        finally:
            self._sink = None

    async def _wait_live(self) -> bool:
        """Wait for the live feed: True when a batch was queued or handed to
        the sink, False when it was quiet for `position_check_s`. One timer
        per quiet period, not per batch: a sink may take many meanwhile."""
        loop = asyncio.get_running_loop()
        self._waiter = fut = loop.create_future()
        self._last_live = loop.time()
        self._quiet = loop.call_at(self._last_live + self.settings.position_check_s,
                                   self._quiet_check, fut)  # fmt: skip
        try:
            return await fut
        finally:
            self._waiter = None
            if self._quiet is not None:
                self._quiet.cancel()
                self._quiet = None

    def _quiet_check(self, fut: asyncio.Future[bool]) -> None:
        if fut.done():
            return
        loop = asyncio.get_running_loop()
        due = self._last_live + self.settings.position_check_s
        if due > loop.time():
            self._quiet = loop.call_at(due, self._quiet_check, fut)
        else:
            fut.set_result(False)

    def _on_live(self, batch: LiveBatch) -> None:
        waiter = self._waiter
        if (
            waiter is not None
            and self._sink is not None
            and not waiter.done()
            and self._place(batch) == 0
        ):
            # The reader waits with nothing queued and this continues the
            # stream: hand it over now, from here.
            items = self._deliver(batch_items(batch))
            self._last_live = asyncio.get_running_loop().time()
            try:
                self._sink(items, batch.committed_ms)
            except Exception as e:
                self._sink_error = e
                waiter.set_result(True)
                return
            if self.ended:
                waiter.set_result(True)
            return
        if not self._queue.put(batch, len(batch.events)):
            return  # dropped: see _queue
        if waiter is not None and not waiter.done():
            waiter.set_result(True)

    def _key(self, e: StoredEvent) -> int:
        return e.seq if self._by_run else e.cursor

    def _place(self, batch: LiveBatch) -> int:
        """merge.place of a live batch: STALE, HOLE or where to deliver it from."""
        first = batch.seq if self._by_run else batch.cursor
        return place(self.position, first, first + len(batch.events) - 1)

    def _deliver(self, items: list[StoredEvent]) -> list[StoredEvent]:
        """Advance past `items` and return them (callers reset committed_ms for
        lists read from PostgreSQL)."""
        self.position = self._key(items[-1])
        if self._by_run and items[-1].type in ("run_end",):
            self.ended = True
        return items

    async def _page(self) -> list[StoredEvent]:
        return await self.store.stream_page(
            self._by_run, self._ident, self.position, self.settings.page_max_events,
            retry_s=self.settings.db_retry_s,
        )  # fmt: skip

    async def _head_and_end(self) -> tuple[int, bool]:
        """The head position, and whether the (run) stream has ended."""
        return await self.store.stream_head(
            self._by_run, self._ident, retry_s=self.settings.db_retry_s
        )

    async def _check_position(self) -> list[StoredEvent]:
        head, ended = await self._head_and_end()
        if head <= self.position:
            if ended:
                self.ended = True
            return []
        cause = "overflow" if self._queue.overflowed else "position_check"
        self.metrics.gap_fills.labels(cause).inc()
        self._queue.overflowed = False
        page = await self._page()
        if len(page) == self.settings.page_max_events:
            self._replaying = True  # far behind: page through before going live again
        return page
