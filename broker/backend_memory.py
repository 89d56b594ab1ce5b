"""Memory backends: `MemoryLog` (a backend.LogStore) and `MemoryBus` (a
backend.LiveBus), for tests that need the log's and the live feed's
behaviour but no server. They keep the contracts of backend.py, nothing
more: what only PostgreSQL or NATS can show (durability, outages, fencing,
the retry of reads) stays tested against the real servers.

`MemoryLog` appends the way the appender commits (log.py): per run `seq`
1, 2, 3, …, per session `cursor` across its runs, atomically, nothing after
`run_end`; `prune` deletes an ended run whole, leaving a hole of its cursors
in its session, as `runlog prune` does. `unavailable = True` makes every read
raise StorageError (the store after `db_retry_s` of outage).

`MemoryBus` fans each published batch out to the subscriptions whose filter
matches its subject (NATS subject wildcards `*` and `>`), each delivery a
callback from the event loop (`loop.call_soon`, in publish order), as the
NATS reader does. Its fault knobs, drawn from a seeded `random.Random`, make
the feed as bad as backend.LiveBus allows: `drop` (the batch reaches no
subscriber), `duplicate` (it reaches them twice), `reorder` (it is held and
delivered after the next published batch). `hold()` keeps every batch from
then on until `release()` (optionally shuffled); `settle()` waits until all
scheduled deliveries have run.

A server-free test (see docs/architecture.md):

    log, bus = MemoryLog(), MemoryBus()
    log.create_run("r1", "s1")
    sub = await Subscription(log, bus, settings, metrics, run_id="r1").start()
    await bus.publish(log.append("r1", events.RunStart(), events.RunEnd(status="completed")))
    assert [e.seq async for items in sub for e in items] == [1, 2]
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Callable

import msgspec

from . import errors, events
from .bus import LiveBatch, decode_batch, encode_batch
from .constants import events_subject
from .rows import PageRow, StoredEvent

__all__ = ["MemoryBus", "MemoryLog", "MemorySubscription"]


class _Run:
    __slots__ = ("ended", "events", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.events: list[StoredEvent] = []  # events[i].seq == i + 1
        self.ended = False


class _Session:
    __slots__ = ("cursors", "events", "last_cursor")

    def __init__(self) -> None:
        self.last_cursor = 0
        self.events: list[StoredEvent] = []  # in cursor order
        self.cursors: list[int] = []  # events' cursors, for bisect


class MemoryLog:
    """A LogStore in memory (contract: backend.py; behaviour: this module)."""

    def __init__(self, *, clock_ms: Callable[[], int] | None = None) -> None:
        self._runs: dict[str, _Run] = {}
        self._sessions: dict[str, _Session] = {}
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.unavailable = False  # True: every read raises StorageError
        self.reads = 0  # page reads served (stream_page and stream_rows)

    # -- writing (what the appender and retention do to PostgreSQL)

    def create_session(self, session_id: str) -> None:
        self._sessions.setdefault(session_id, _Session())

    def create_run(self, run_id: str, session_id: str) -> None:
        """A run of `session_id` (created too if new) with no event yet."""
        if run_id in self._runs:
            raise ValueError(f"run {run_id} exists")
        self.create_session(session_id)
        self._runs[run_id] = _Run(session_id)

    def append(self, run_id: str, *evs: events.Event) -> LiveBatch:
        """Commit `evs` to the run at once (their run_id, session_id, seq and
        ts are set here, as RunWriter.append does) and return the live batch
        the appender would publish for them (publish it with MemoryBus.publish,
        or don't: a batch lost on the way)."""
        if not evs:
            raise ValueError("append at least one event")
        run = self._runs.get(run_id)
        if run is None:
            raise errors.RunNotFound(f"no run {run_id}")
        if run.ended:
            raise errors.RunEnded(f"run {run_id} has ended; nothing can follow run_end")
        session = self._sessions[run.session_id]
        now = self._clock_ms()
        first_seq, first_cursor = len(run.events) + 1, session.last_cursor + 1
        payloads, types = [], []
        ended = False
        for i, ev in enumerate(evs):  # all or nothing: checked before any is stored
            if ended:
                raise errors.RunEnded(f"run {run_id}: nothing can follow run_end")
            ev.run_id, ev.session_id, ev.seq, ev.ts = run_id, run.session_id, first_seq + i, now
            tag = ev.__struct_config__.tag
            assert isinstance(tag, str)
            payloads.append(events.encode(ev))
            types.append(tag)
            ended = tag in events.TERMINAL_TYPES
        run.ended = ended
        for i, (tag, payload) in enumerate(zip(types, payloads, strict=True)):
            stored = StoredEvent(run_id, first_seq + i, first_cursor + i, tag, payload)
            run.events.append(stored)
            session.events.append(stored)
            session.cursors.append(stored.cursor)
        session.last_cursor += len(evs)
        return LiveBatch(
            run_id=run_id,
            session_id=run.session_id,
            seq=first_seq,
            cursor=first_cursor,
            events=[msgspec.Raw(p) for p in payloads],
            types=types,
            ended=run.ended,
            committed_ms=float(now),
        )

    def prune(self, run_id: str) -> int:
        """Delete an ended run and its events (its session keeps a hole of
        their cursors); how many events. A run not ended is never pruned."""
        run = self._runs.get(run_id)
        if run is None:
            return 0
        if not run.ended:
            raise ValueError(f"run {run_id} has not ended: retention never prunes it")
        del self._runs[run_id]
        session = self._sessions[run.session_id]
        session.events = [e for e in session.events if e.run_id != run_id]
        session.cursors = [e.cursor for e in session.events]
        return len(run.events)

    # -- LogStore

    async def stream_page(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float = 0.0
    ) -> list[StoredEvent]:
        return self._page(by_run, ident, after, limit)

    async def stream_rows(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float = 0.0
    ) -> list[PageRow]:
        return list(self._page(by_run, ident, after, limit))

    async def stream_head(
        self, by_run: bool, ident: str, *, retry_s: float = 0.0
    ) -> tuple[int, bool]:
        self._check()
        if by_run:
            run = self._runs.get(ident)
            if run is None:
                raise errors.RunNotFound(f"no run {ident}")
            return len(run.events), run.ended
        session = self._sessions.get(ident)
        if session is None:
            raise errors.SessionNotFound(f"no session {ident}")
        return session.last_cursor, False

    def _page(self, by_run: bool, ident: str, after: int, limit: int) -> list[StoredEvent]:
        self._check()
        self.reads += 1
        after = max(after, 0)
        if by_run:
            run = self._runs.get(ident)
            return run.events[after : after + limit] if run is not None else []
        session = self._sessions.get(ident)
        if session is None:
            return []
        i = bisect.bisect_right(session.cursors, after)
        return session.events[i : i + limit]

    def _check(self) -> None:
        if self.unavailable:
            raise errors.StorageError("the memory log is unavailable (MemoryLog.unavailable)")


def _matches(pattern: list[str], subject: list[str]) -> bool:
    for i, token in enumerate(pattern):
        if token == ">":
            return len(subject) > i
        if i >= len(subject) or (token != "*" and token != subject[i]):
            return False
    return len(pattern) == len(subject)


class MemorySubscription:
    """One MemoryBus.subscribe_live (a backend.LiveSubscription)."""

    def __init__(self, bus: MemoryBus, pattern: str, callback: Callable[[LiveBatch], None]) -> None:
        self.bus = bus
        self.pattern = pattern.split(".")
        self.callback = callback
        self.delivered = 0  # batches handed to the callback

    async def unsubscribe(self) -> None:
        self.bus._subscriptions.discard(self)


class MemoryBus:
    """A LiveBus in memory, with fault knobs (behaviour: this module's docstring)."""

    def __init__(
        self, *, drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0, seed: int = 0
    ) -> None:
        self.drop = drop  # the chance a batch reaches no subscriber
        self.duplicate = duplicate  # the chance it reaches them twice
        self.reorder = reorder  # the chance it is delivered after the next one
        self._random = random.Random(seed)
        self._subscriptions: set[MemorySubscription] = set()
        self._seq = 0  # the bus's own stream position (publish acks)
        self._late: list[tuple[str, bytes]] = []  # held by `reorder`
        self._held: list[tuple[str, bytes]] | None = None  # held by `hold()`
        self._scheduled = 0
        self._idle = asyncio.Event()  # set while no delivery is scheduled
        self._idle.set()
        self.published = 0
        self.dropped = 0

    # -- LiveBus

    async def publish_live(self, subject: str, data: bytes, msg_id: str) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        self._seq += 1
        self.published += 1
        fut: asyncio.Future[int] = loop.create_future()
        fut.set_result(self._seq)
        if self._held is not None:
            self._held.append((subject, data))
            return fut
        r = self._random
        if self.drop and r.random() < self.drop:
            self.dropped += 1
            return fut
        if self.reorder and r.random() < self.reorder:
            self._late.append((subject, data))
            return fut
        self._schedule(subject, data)
        if self.duplicate and r.random() < self.duplicate:
            self._schedule(subject, data)
        late, self._late = self._late, []
        for msg in late:
            self._schedule(*msg)
        return fut

    async def subscribe_live(
        self, subject: str, callback: Callable[[LiveBatch], None]
    ) -> MemorySubscription:
        sub = MemorySubscription(self, subject, callback)
        self._subscriptions.add(sub)
        return sub

    # -- for tests

    async def publish(self, batch: LiveBatch) -> None:
        """Publish `batch` as the appender does (MemoryLog.append returns it)."""
        msg_id = f"{batch.run_id}:{batch.seq}"
        await self.publish_live(
            events_subject(batch.session_id, batch.run_id), encode_batch(batch), msg_id
        )

    def hold(self) -> None:
        """Keep every batch published from now on until `release`."""
        if self._held is None:
            self._held = []

    def release(self, *, shuffle: bool = False) -> None:
        """Deliver what `hold` kept (in publish order, or shuffled) and stop holding."""
        held, self._held = self._held or [], None
        if shuffle:
            self._random.shuffle(held)
        for msg in held:
            self._schedule(*msg)

    def flush_late(self) -> None:
        """Deliver the batches `reorder` holds back now (the last publish's)."""
        late, self._late = self._late, []
        for msg in late:
            self._schedule(*msg)

    async def settle(self) -> None:
        """Return once every delivery scheduled so far (and any they caused) has run."""
        while self._scheduled:
            await self._idle.wait()

    def _schedule(self, subject: str, data: bytes) -> None:
        self._scheduled += 1
        self._idle.clear()
        asyncio.get_running_loop().call_soon(self._deliver, subject, data)

    def _deliver(self, subject: str, data: bytes) -> None:
        try:
            tokens = subject.split(".")
            for sub in list(self._subscriptions):
                if sub in self._subscriptions and _matches(sub.pattern, tokens):
                    sub.delivered += 1
                    # Decoded per subscriber, as each NATS subscription decodes its copy.
                    sub.callback(decode_batch(data))
        finally:
            self._scheduled -= 1
            if not self._scheduled:
                self._idle.set()
