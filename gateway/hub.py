"""The fan-out hub: one live subscription per run or session per gateway
process, shared by every client that follows it.

Contract:
- A `Topic` follows one run or session from its head with one broker
  `Subscription` (itself gap-free: replay, dedupe, gap fill, position check).
  Each batch is wrapped in an `EncodedBatch` once and offered to every member;
  offering never awaits, so one slow client cannot delay the others.
- A `Member` is one client's subscription. It joins "catching up": it replays
  from PostgreSQL after the client's cursor, paced by its connection's queue,
  while the topic's batches are buffered for it. Then, with no await between
  the check and the switch, it drains that buffer (dropping what it already
  sent, refilling from PostgreSQL if there is a hole) and goes live. So every
  client gets every event after its cursor exactly once, in order. (Those
  decisions are broker/merge.py's, shared with Subscription.)
- A topic nobody follows is closed after `hub_linger_s`.
- Replays take turns (`replay_slots.py`): each page is read and queued in a
  turn, at most `max_concurrent_replays` at once per gateway, round-robin
  between users, each slot resting for a share of the time while others
  wait (`replay_loop_share`). A turn holds one chunk (at most the lag mark
  of bytes): what else the read returned is dropped, and the next turn
  reads from there, fewer at a time; between turns the member waits for
  its client's queue, holding no turn and no page. So a slow or flooding
  client delays only its own replays, and a waiting replay holds no more
  than its buffer of live batches (at most `live_buffer_max` events, shared
  with the other members: the batches are the topic's). Live delivery never takes a turn.
- A replay whose client keeps up reads its next page while the current one
  is written, in a slot of its own taken only when one is free, and dropped
  before it would wait for its client; its frames are built from the page
  rows where the client's format allows (replay_page.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Protocol

from broker import errors
from broker.backend import LogStore
from broker.merge import HOLE, STALE, LiveBuffer, place, settle
from broker.rows import ROW_CURSOR, ROW_SEQ, ROW_TYPE, PageRow, StoredEvent
from broker.settings import Settings
from broker.subscribe import Subscription

from .frames import EncodedBatch, contiguous, ws_events_frame, ws_wire
from .metrics import GatewayMetrics
from .replay_page import PageRead, chunk_len, payloads_of, sse_text
from .replay_slots import ReplaySlots
from .sendq import Mode
from .subscriber import Subscriber

log = logging.getLogger(__name__)

_PENDING_MAX = 256  # batches buffered for a catching-up member before it re-reads


class Member:
    def __init__(self, topic: Topic, conn: Subscriber, after: int, mode: Mode) -> None:
        self.topic = topic
        self.conn = conn
        self.after = after
        self.head = after  # the stream's head when the member joined
        self.position = after
        self.mode = mode
        self.live = False
        self.ended = False
        self.closed = False
        # Live batches held while catching up (merge.py: dropped past the bound).
        self._held: LiveBuffer[EncodedBatch] = LiveBuffer(
            topic.hub.pending_events_max, max_batches=_PENDING_MAX, first_always=False
        )
        self._catchup: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._catchup = asyncio.create_task(self._catch_up(), name="runlog-member-catchup")
        self._catchup.add_done_callback(self._catchup_done)

    def _catchup_done(self, task: asyncio.Task[None]) -> None:
        if self._catchup is task:
            self._catchup = None  # a finished task is memory an idle member keeps

    def offer(self, batch: EncodedBatch) -> int:
        """Take a live batch; returns the events handed to the connection (for
        metrics, counted once per batch by the topic rather than per client)."""
        if self.closed or self.ended:
            return 0
        if not self.live:
            held = self._held
            if not held.overflowed and not held.put(batch, len(batch.items)):
                self.topic.hub.metrics.pending_overflows.inc()  # once per catch-up
            return 0
        at = place(self.position, batch.first, batch.last)
        if at == STALE:
            return 0
        if at == HOLE:
            # Cannot happen while the topic is gap-free, but if it does, the
            # member re-reads from PostgreSQL rather than skip anything.
            self.live = False
            self._held.clear()
            self._held.put(batch, len(batch.items))
            self.start()
            return 0
        return self._push(batch, at)

    def _push(self, batch: EncodedBatch, start: int = 0) -> int:
        """Hand `batch` from its index `start` to the connection (`start`
        from merge.place; 0 for a batch of page rows, which follows the
        position or the hole PostgreSQL shows before it: pruned runs leave
        holes in a session's cursors)."""
        conn = self.conn
        # Fast path: nothing queued and the socket keeps up, so the shared
        # wire frames go straight to it (no queue, no writer wake-up).
        if self.mode in ("sse", "raw") or not conn.write_now(batch.wire(self.mode, start), batch.topic,
                                                    batch.last):  # fmt: skip
            if not conn.queue.put_events(self.mode, batch, start):
                conn.overflow()
        self.position = batch.last
        if batch.ended:
            self.ended = True
        return len(batch.items) - start

    async def _catch_up(self) -> None:
        hub = self.topic.hub
        page_max = hub.broker.settings.page_max_events
        q = self.conn.queue
        limit = page_max
        ahead: PageRead | None = None  # the next page's read, started by the last turn
        try:
            while not self.closed:
                if ahead is not None and q.nbytes > q.lag_bytes:
                    ahead.drop(hub.replay_slots)  # about to wait: hold no page meanwhile
                    ahead = None
                # Paced by the client, holding no turn: a slow reader waits alone.
                await q.wait_below(q.lag_bytes)
                if self.closed:
                    return
                # The turn owns the read ahead from here (and frees its slot).
                taken, ahead = ahead, None
                pushed, read, ahead = await self._turn(limit, min(page_max, 2 * limit), taken)
                taken = None  # its task keeps the rows: hold none while we wait
                if self.ended:
                    return
                if pushed < read:
                    limit = pushed  # the rest was dropped: read it next turn, as many
                    continue
                if read == limit:
                    limit = min(page_max, 2 * limit)
                    continue
                # At the head as of that read: switch to live if the buffer
                # continues exactly where we are (no await from here on).
                if self._held.overflowed:
                    self._held.clear()
                    continue
                go, _, hole = settle(
                    self.position, ((b, b.first, b.last) for b in self._held.take())
                )
                for b, start in go:
                    hub.metrics.events_fanned_out.inc(self._push(b, start))
                if hole:
                    continue
                self.live = True
                return
        except asyncio.CancelledError:
            pass
        except errors.RunlogError as e:
            log.warning("catch-up of %s failed: %s", self.topic.key, e.code)
            self.conn.close("storage_unavailable")
        except Exception:
            log.exception("catch-up of %s failed", self.topic.key)
            self.conn.close("internal")
        finally:
            if ahead is not None:
                ahead.drop(hub.replay_slots)

    async def _turn(
        self, limit: int, next_limit: int, ahead: PageRead | None
    ) -> tuple[int, int, PageRead | None]:
        """One replay turn: read up to `limit` events after our position (or
        take the read `ahead` started for that) and push the first chunk of
        them; (events pushed, events read, the read of the next page if
        this turn started one: see replay_page.py). The page lives only in
        this call: a replay waiting for its client between turns holds no
        events (100 stalled replays would otherwise keep 100 pages of rows
        alive, and every full garbage collection walks them)."""
        hub = self.topic.hub
        slots = hub.replay_slots
        q = self.conn.queue
        if ahead is not None and (ahead.after, ahead.limit) != (self.position, limit):
            ahead.drop(slots)  # not the read this turn needs (never expected)
            ahead = None
        granted = await slots.acquire(self.conn.user) if ahead is None else ahead.granted
        nxt: PageRead | None = None
        try:
            if ahead is None:
                rows = await self.topic.rows(self.position, limit)
            else:
                rows = await ahead.task
            payloads = payloads_of(rows)
            # One chunk per turn (at most the lag mark of payload): a page of
            # large events never lands in a queue at once.
            n = chunk_len(payloads, q.lag_bytes)
            if n == len(rows) == limit and q.nbytes + sum(map(len, payloads)) <= q.lag_bytes:
                # The next turn will not wait for the client: read its page
                # while this one is built and written.
                g = slots.try_acquire()
                if g is not None:
                    after = rows[-1][ROW_SEQ if self.topic.by_run else ROW_CURSOR]
                    nxt = PageRead(self.topic.rows(after, next_limit), after, next_limit, g)
            if n:
                hub.metrics.replayed.inc(n)
                pushed = self._push_rows(rows[:n] if n < len(rows) else rows, payloads[:n])
                hub.metrics.events_fanned_out.inc(pushed)
            return n, len(rows), nxt
        except BaseException:
            if nxt is not None:
                nxt.drop(slots)
            raise
        finally:
            slots.release(granted)

    def _push_rows(self, rows: list[PageRow], payloads: list[bytes]) -> int:
        """Push a chunk of page rows (after our position, in order); the
        events handed to the connection. A WebSocket batch or SSE client
        whose queue is not lagging gets the chunk as one frame built from
        the rows; anything else takes the per-event path of live batches."""
        topic = self.topic
        by_run = topic.by_run
        at = ROW_SEQ if by_run else ROW_CURSOR
        first, last = rows[0][at], rows[-1][at]
        conn = self.conn
        q = conn.queue
        mode = self.mode
        if mode in ("ws_batch", "sse") and not q.lagging and last - first == len(rows) - 1:
            if mode == "ws_batch":
                frame = ws_wire(ws_events_frame(topic.key, first, payloads))
                if not conn.write_now([frame], topic.key, last) and not q.put_frame(
                    frame, topic.key, last
                ):
                    conn.overflow()
            elif not q.put_frame(sse_text(first, payloads), topic.key, last):
                conn.overflow()
            self.position = last
            if by_run and rows[-1][ROW_TYPE] == "run_end":
                self.ended = True
            return len(rows)
        n = 0
        for batch in contiguous(topic.key, [StoredEvent(*r) for r in rows], by_run):
            at = place(self.position, batch.first, batch.last)
            if at != STALE:  # HOLE: the hole PostgreSQL shows (a pruned run's cursors)
                n += self._push(batch, max(at, 0))
        return n

    def close(self) -> None:
        self.closed = True
        if self._catchup is not None and not self._catchup.done():
            self._catchup.cancel()


class Topic:
    def __init__(self, hub: Hub, kind: str, ident: str) -> None:
        self.hub = hub
        self.kind = kind
        self.ident = ident
        self.key = f"{kind}:{ident}"
        self.by_run = kind == "run"
        self.members: set[Member] = set()
        self.ended = False
        self.closed = False
        self._sub: Subscription | None = None
        self._pump: asyncio.Task[None] | None = None
        self._linger: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        head = await self.head()
        if self.by_run:
            self._sub = await self.hub.broker.subscribe(run_id=self.ident, after=head)
        else:
            self._sub = await self.hub.broker.subscribe(session_id=self.ident, after=head)
        self._pump = asyncio.create_task(self._run(), name=f"runlog-topic-{self.kind}")

    async def head(self) -> int:
        return await self.hub.head(self.kind, self.ident)

    async def rows(self, after: int, limit: int) -> list[PageRow]:
        b = self.hub.broker
        return await b.store.stream_rows(
            self.by_run, self.ident, after, limit, retry_s=b.settings.db_retry_s
        )

    async def _run(self) -> None:
        assert self._sub is not None
        try:
            await self._sub.follow(self._fan_out)
            self.ended = True
        except asyncio.CancelledError:
            pass
        except errors.RunlogError as e:
            # PostgreSQL gone for longer than db_retry_s: drop the members so
            # their clients resume (elsewhere or later) from their cursors.
            log.warning("topic %s stopped: %s", self.key, e.code)
            for m in list(self.members):
                m.conn.close("storage_unavailable")
        except Exception:
            log.exception("topic %s stopped", self.key)
            for m in list(self.members):
                m.conn.close("internal")
        finally:
            self.closed = True
            self.hub._forget(self)
            await self._sub.close()

    def _fan_out(self, items: list[StoredEvent], committed_ms: float) -> None:
        """Offer events to every member (never awaits: it may run in the NATS
        reader, see Subscription.follow)."""
        n = 0
        members = self.members
        for batch in contiguous(self.key, items, self.by_run):
            for m in list(members):  # a copy: an offer may end a connection, which leaves
                n += m.offer(batch)
        metrics = self.hub.metrics
        if n:
            metrics.events_fanned_out.inc(n)
        if committed_ms and members:
            metrics.commit_to_send_seconds.observe(max(0.0, time.time() - committed_ms / 1000))

    def add(self, member: Member) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        self.members.add(member)

    def remove(self, member: Member) -> None:
        self.members.discard(member)
        self.linger_if_unused()

    def _close_if_unused(self) -> None:
        self._linger = None
        if not self.members:
            self.closed = True  # from now on, joins make a new topic
            self.hub._forget(self)
            if self._pump is not None:
                self._pump.cancel()

    def linger_if_unused(self) -> None:
        if not self.members and self._linger is None and not self.closed:
            loop = asyncio.get_running_loop()
            self._linger = loop.call_later(self.hub.linger_s, self._close_if_unused)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        if self._sub is not None:
            await self._sub.close()


class SessionWatch(Protocol):
    """Told of every session subscription that starts or ends (notices.py)."""

    def joined(self, session_id: str, member: Member) -> None: ...
    def left(self, session_id: str, member: Member) -> None: ...


class Log(Protocol):
    """What the hub uses of its broker: runtime.Broker, or memory backends
    (broker/backend_memory.py) in a test."""

    @property
    def settings(self) -> Settings: ...

    @property
    def store(self) -> LogStore: ...

    async def subscribe(
        self, *, run_id: str | None = None, session_id: str | None = None, after: int = 0
    ) -> Subscription:
        """A started Subscription (subscribe.py) of the run or session after `after`."""
        ...


class Hub:
    def __init__(self, broker: Log, metrics: GatewayMetrics, linger_s: float) -> None:
        self.broker = broker
        self.metrics = metrics
        self.linger_s = linger_s
        self._topics: dict[str, Topic] = {}
        self._starting: dict[str, asyncio.Future[Topic]] = {}
        self.member_count = 0  # members joined and not yet left, over all topics
        s = broker.settings
        self.replay_slots = ReplaySlots(s.max_concurrent_replays, s.replay_loop_share)
        self.pending_events_max = broker.settings.live_buffer_max
        self.watch: SessionWatch | None = None

    async def join(self, conn: Subscriber, kind: str, ident: str, after: int, mode: Mode) -> Member:
        """Follow a run or session for `conn` from cursor `after`."""
        # Checked before any topic exists, so a bad cursor costs nothing (the
        # head only grows, so the check stays true).
        head = await self.head(kind, ident)
        if after > head:
            raise errors.InvalidCursor(
                f"cursor {after} is past the head ({head})",
                hint="resume from a cursor this stream gave you",
            )
        topic = await self._topic(kind, ident)
        member = Member(topic, conn, after, mode)
        member.head = head
        topic.add(member)
        self.member_count += 1
        member.start()
        if kind == "session" and self.watch is not None:
            self.watch.joined(ident, member)
        return member

    async def head(self, kind: str, ident: str) -> int:
        b = self.broker
        head, _ = await b.store.stream_head(kind == "run", ident, retry_s=b.settings.db_retry_s)
        return head

    def leave(self, member: Member) -> None:
        """Stop feeding `member` (any number of calls: the first counts)."""
        if member.closed:
            return
        member.close()
        member.topic.remove(member)
        self.member_count -= 1
        if member.topic.kind == "session" and self.watch is not None:
            self.watch.left(member.topic.ident, member)

    async def _topic(self, kind: str, ident: str) -> Topic:
        key = f"{kind}:{ident}"
        topic = self._topics.get(key)
        if topic is not None and not topic.ended and not topic.closed:
            return topic
        starting = self._starting.get(key)
        if starting is not None:
            return await asyncio.shield(starting)
        fut: asyncio.Future[Topic] = asyncio.get_running_loop().create_future()
        self._starting[key] = fut
        try:
            topic = Topic(self, kind, ident)
            await topic.start()
            self._topics[key] = topic
            topic.linger_if_unused()  # closed after a while if no member ever joins
            self.metrics.topics.set(len(self._topics))
            fut.set_result(topic)
            return topic
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._starting[key]

    def _forget(self, topic: Topic) -> None:
        if self._topics.get(topic.key) is topic:
            del self._topics[topic.key]
            self.metrics.topics.set(len(self._topics))

    async def close(self) -> None:
        for t in list(self._topics.values()):
            await t.close()
        self._topics.clear()
