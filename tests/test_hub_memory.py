"""The gateway's fan-out hub (gateway/hub.py) on the memory backends
(broker/backend_memory.py): subscribe, catch up from the log, switch to
live, a hole sending a member back to the log, pruned holes in a session,
a client that does not read, a store that fails. Milliseconds each, no
server; what only real servers show (test_catchup.py, test_gateway_*.py)
stays there.

Every test checks what a client's send queue received: each position once,
in order, and all of them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from broker import errors, events
from broker.backend import LiveBus, LogStore
from broker.backend_memory import MemoryBus, MemoryLog
from broker.metrics import BrokerMetrics
from broker.settings import Settings
from broker.subscribe import Subscription
from gateway.frames import contiguous
from gateway.hub import Hub, Member
from gateway.metrics import GatewayMetrics
from gateway.sendq import Mode, SendQueue


class MemoryReaders:
    """What the hub needs of a broker (hub.Log), on memory backends."""

    def __init__(self, settings: Settings, store: MemoryLog, bus: MemoryBus) -> None:
        self.settings = settings
        self._log: LogStore = store
        self.bus: LiveBus = bus
        self.metrics = BrokerMetrics(CollectorRegistry())

    @property
    def store(self) -> LogStore:
        return self._log

    async def subscribe(
        self, *, run_id: str | None = None, session_id: str | None = None, after: int = 0
    ) -> Subscription:
        sub = Subscription(
            self._log, self.bus, self.settings, self.metrics,
            run_id=run_id, session_id=session_id, after=after,
        )  # fmt: skip
        return await sub.start()


class Client:
    """A client connection as the hub sees it (gateway/subscriber.py), whose
    socket takes nothing directly: everything goes through its real send
    queue, which `read` empties the way the writer does."""

    def __init__(self, mode: Mode, *, lag_bytes: int = 256 * 1024) -> None:
        self.user = "u"
        self.mode = mode
        self.queue = SendQueue(64 * 1024 * 1024, lag_bytes)
        self.closed_with: list[str | None] = []
        self.overflowed = False
        self.positions: list[int] = []

    def write_now(self, frames: list[bytes], topic: str | None, last: int) -> bool:
        return False

    def overflow(self) -> None:
        self.overflowed = True

    def close(self, code: str | None) -> Awaitable[None]:
        self.closed_with.append(code)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def notice(self, type_: str, **fields: object) -> None:
        pass

    def read(self) -> list[int]:
        """Take what is queued (the socket wrote it); the positions it held."""
        items = self.queue.take()
        got: list[int] = []
        for it in items:
            if it.stored is not None:  # "raw": the events themselves
                got += [e.seq if it.topic and it.topic.startswith("run:") else e.cursor
                        for e in it.stored]  # fmt: skip
            else:  # SSE text: one `id:` line per event
                got += [int(m) for m in re.findall(rb"^id: (\d+)$", it.render(), re.M)]
        self.queue.written(items)
        self.positions += got
        return got


@dataclasses.dataclass
class World:
    log: MemoryLog
    bus: MemoryBus
    hub: Hub
    metrics: GatewayMetrics

    async def append(self, run_id: str, *evs: events.Event, publish: bool = True) -> None:
        batch = self.log.append(run_id, *evs)
        if publish:
            await self.bus.publish(batch)
        await self.bus.settle()


def _settings(**changes: object) -> Settings:
    quick: dict[str, object] = {"position_check_s": 0.005, "hub_linger_s": 0.01}
    return dataclasses.replace(Settings(), **{**quick, **changes})  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def make_world() -> AsyncIterator[Callable[..., World]]:
    hubs: list[Hub] = []

    def make(bus: MemoryBus | None = None, **changes: object) -> World:
        log, bus = MemoryLog(), bus or MemoryBus()
        metrics = GatewayMetrics(CollectorRegistry())
        s = _settings(**changes)
        hub = Hub(MemoryReaders(s, log, bus), metrics, s.hub_linger_s)
        hubs.append(hub)
        return World(log, bus, hub, metrics)

    yield make
    for hub in hubs:
        for topic in list(hub._topics.values()):
            for m in list(topic.members):
                hub.leave(m)
        await hub.close()


async def until(cond: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


def _texts(n: int) -> list[events.Event]:
    return [events.TextDelta(message_id="m", delta=f"t{i}") for i in range(n)]


MODES: list[Mode] = ["sse", "raw"]


@pytest.mark.parametrize("mode", MODES)
async def test_a_member_gets_history_then_live_once_in_order(
    make_world: Callable[..., World], mode: Mode
) -> None:
    w = make_world(page_max_events=4)
    w.log.create_run("r", "s")
    await w.append("r", events.RunStart(), *_texts(9), publish=False)  # history: 10
    c = Client(mode)
    m = await w.hub.join(c, "run", "r", 3, mode)
    await until(lambda: m.live, "the switch to live")
    assert c.read() == list(range(4, 11))
    for _ in range(3):
        await w.append("r", *_texts(2))
    await w.append("r", events.RunEnd(status="completed"))
    assert c.read() == list(range(11, 18))
    assert m.ended
    assert w.log.reads >= 2  # pages of 4: the history took more than one


async def test_live_batches_during_catch_up_are_held_then_settled_without_duplicates(
    make_world: Callable[..., World],
) -> None:
    """Commits land while a member is still reading history (its client has
    not read its first chunk): it holds them, and at the head delivers only
    what its pages did not."""
    w = make_world(page_max_events=2)
    w.log.create_run("r", "s")
    await w.append("r", events.RunStart(), *_texts(5), publish=False)
    c = Client("raw", lag_bytes=1)
    m = await w.hub.join(c, "run", "r", 0, "raw")
    await until(lambda: c.queue.nbytes > 1, "the first chunk")
    for _ in range(4):  # published before the member's pages reach them
        await w.append("r", *_texts(1))
    assert not m.live and len(m._held) == 4
    while not m.live:
        c.read()
        await asyncio.sleep(0.001)
    await w.append("r", *_texts(1))
    c.read()
    assert c.positions == list(range(1, 12))


async def test_a_hole_in_the_live_feed_sends_a_live_member_back_to_the_log(
    make_world: Callable[..., World],
) -> None:
    w = make_world(position_check_s=30.0)  # no position check fills the hole first
    w.log.create_run("r", "s")
    await w.append("r", events.RunStart())
    c = Client("sse")
    m = await w.hub.join(c, "run", "r", 0, "sse")
    await until(lambda: m.live, "the switch to live")
    # Three commits whose first two batches the member never sees (the
    # topic is gap-free, so this is its last line of defence).
    await w.append("r", *_texts(2), publish=False)
    await w.append("r", *_texts(1), publish=False)
    third = w.log.append("r", *_texts(2))
    items = [e for e in await w.log.stream_page(True, "r", 4, 10)]
    assert [e.seq for e in items] == [5, 6]
    reads = w.log.reads
    (batch,) = contiguous(m.topic.key, items, True)
    assert m.offer(batch) == 0 and not m.live  # a hole: back to the log
    await until(lambda: m.live, "live again")
    assert w.log.reads > reads
    assert c.read() == [1, 2, 3, 4, 5, 6]
    assert third.seq == 5


@pytest.mark.parametrize("mode", MODES)
async def test_a_session_member_skips_pruned_runs(
    make_world: Callable[..., World], mode: Mode
) -> None:
    w = make_world(page_max_events=3)
    for i in range(4):
        w.log.create_run(f"r{i}", "s")
        await w.append(f"r{i}", events.RunStart(), *_texts(i), publish=False)
        await w.append(f"r{i}", events.RunEnd(status="completed"), publish=False)
    # Cursors: r0 1-2, r1 3-5, r2 6-9, r3 10-14; r1 and r3 pruned.
    w.log.prune("r1")
    w.log.prune("r3")
    c = Client(mode)
    m = await w.hub.join(c, "session", "s", 0, mode)
    await until(lambda: m.live, "the switch to live")
    w.log.create_run("r4", "s")
    await w.append("r4", events.RunStart(), events.RunEnd(status="completed"))
    assert c.read() == [1, 2, 6, 7, 8, 9, 15, 16]


async def test_a_client_that_does_not_read_is_paced_and_its_buffer_bounded(
    make_world: Callable[..., World],
) -> None:
    """A member whose client does not read holds at most its lag mark queued
    and `live_buffer_max` live events; past that it drops its buffer (once,
    counted) and, once the client reads, gets everything from the log."""
    w = make_world(page_max_events=50, live_buffer_max=10)
    w.log.create_run("r", "s")
    big = [events.TextDelta(message_id="m", delta="x" * 500) for _ in range(40)]
    await w.append("r", events.RunStart(), *big, publish=False)
    c = Client("raw", lag_bytes=4096)
    m = await w.hub.join(c, "run", "r", 0, "raw")
    await until(lambda: c.queue.nbytes > 0, "the first chunk")
    for _ in range(30):
        await w.append("r", *_texts(1))
    # Below the lag mark before each turn, a turn's chunk at most the mark
    # (or one event): far less than the 23 kB of history.
    assert c.queue.nbytes <= 2 * 4096 + 600
    assert m._held.events <= 10 and not m.live
    assert _sample(w.metrics, "runlog_gateway_catchup_buffer_overflows_total") == 1
    while not m.live:
        c.read()
        await asyncio.sleep(0.001)
    c.read()
    assert c.positions == list(range(1, 72))


async def test_a_store_that_fails_during_catch_up_ends_the_member_with_its_code(
    make_world: Callable[..., World],
) -> None:
    w = make_world(position_check_s=30.0)  # the topic reads nothing meanwhile
    w.log.create_run("r", "s")
    await w.append("r", events.RunStart(), publish=False)
    w.log.unavailable = True
    c = Client("sse")
    with pytest.raises(errors.StorageError):
        await w.hub.join(c, "run", "r", 0, "sse")  # the head read fails: no member
    w.log.unavailable = False
    m = await w.hub.join(c, "run", "r", 0, "sse")
    w.log.unavailable = True  # before its first page (and the topic's)
    # The member's catch-up and the topic's subscription both fail: each
    # closes the client with the retryable code.
    await until(lambda: len(c.closed_with) == 2, "the close")
    assert set(c.closed_with) == {"storage_unavailable"}
    assert not m.live and c.read() == []


async def test_a_cursor_past_the_head_is_refused_and_an_unused_topic_closes(
    make_world: Callable[..., World],
) -> None:
    w = make_world()
    w.log.create_run("r", "s")
    await w.append("r", events.RunStart())
    with pytest.raises(errors.InvalidCursor):
        await w.hub.join(Client("sse"), "run", "r", 2, "sse")
    m = await w.hub.join(Client("sse"), "run", "r", 1, "sse")
    topic = m.topic
    w.hub.leave(m)
    await until(lambda: topic.closed, "the linger to end")
    assert _sample(w.metrics, "runlog_gateway_topics") == 0


@pytest.mark.parametrize("seed", range(8))
async def test_members_joining_while_a_faulty_bus_delivers_get_every_event_once(
    make_world: Callable[..., World], seed: int
) -> None:
    """Members join a session at random cursors and times while its runs
    append through a bus that drops, duplicates and reorders batches."""
    rnd = random.Random(seed)
    bus = MemoryBus(drop=0.2, duplicate=0.2, reorder=0.2, seed=seed)
    w = make_world(bus=bus, page_max_events=rnd.randint(1, 5), live_buffer_max=rnd.randint(1, 6))
    w.log.create_session("s")
    clients: list[tuple[Client, int]] = []
    runs = 0
    for _ in range(60):
        roll = rnd.random()
        if roll < 0.15 or runs == 0:
            runs += 1
            w.log.create_run(f"r{runs}", "s")
            await w.append(f"r{runs}", events.RunStart())
        elif roll < 0.25:
            head, _ = await w.log.stream_head(False, "s")
            after = rnd.randint(0, head)
            c = Client(rnd.choice(MODES))
            await w.hub.join(c, "session", "s", after, c.mode)
            clients.append((c, after))
        else:
            await w.append(f"r{rnd.randint(1, runs)}", *_texts(rnd.randint(1, 3)))
        if rnd.random() < 0.3:
            for c, _ in clients:
                c.read()
    bus.flush_late()
    head, _ = await w.log.stream_head(False, "s")

    def caught_up() -> bool:
        for c, _ in clients:
            c.read()
        return all(
            (not c.positions and a == head) or c.positions[-1:] == [head] for c, a in clients
        )

    await until(caught_up, "every member at the head")
    for c, after in clients:
        assert c.positions == list(range(after + 1, head + 1))


def _sample(metrics: GatewayMetrics, name: str) -> float:
    value = metrics.registry.get_sample_value(name)
    return value or 0.0


async def test_members_are_hub_members() -> None:
    """The test client is a Subscriber and the readers a hub.Log (mypy checks the calls)."""
    log, bus = MemoryLog(), MemoryBus()
    readers = MemoryReaders(Settings(), log, bus)
    hub = Hub(readers, GatewayMetrics(CollectorRegistry()), 0.01)
    log.create_run("r", "s")
    m = await hub.join(Client("raw"), "run", "r", 0, "raw")
    assert isinstance(m, Member)
    hub.leave(m)
    await hub.close()
