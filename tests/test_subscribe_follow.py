"""`Subscription.follow`: live batches handed to a sink from the NATS reader
itself, the rest through the iterator's path, every event once and in
order (real NATS + PostgreSQL)."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from broker import events
from broker.runtime import Broker
from broker.store import StoredEvent

from .helpers import KillableStack, make_settings, new_run, sample, text
from .workerkit import wait_until


class Recorder:
    """A sink that records what it got, and whether it ran in the follow()
    task (the iterator's path) or elsewhere (from the NATS reader)."""

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.calls = 0
        self.direct = 0  # lists handed over from the NATS reader
        self.follower: asyncio.Task[None] | None = None

    def __call__(self, items: list[StoredEvent], committed_ms: float) -> None:
        self.seqs += [e.seq for e in items]
        self.calls += 1
        if asyncio.current_task() is not self.follower:
            assert committed_ms > 0  # only live batches come that way
            self.direct += 1


async def test_follow_hands_every_event_once_in_order_from_both_paths(broker: Broker) -> None:
    """A follower joins after 300 stored events while a writer streams 200
    more in small flushes: it gets 1..500 exactly once, in order; the
    history came through its own task, later live batches from the NATS
    reader directly."""
    _, run_id = await new_run(broker.store)
    w = await broker.claim(run_id, "w")
    for i in range(300):
        await w.append(text(i))
    await w.flush()
    sub = await broker.subscribe(run_id=run_id, after=0)
    rec = Recorder()
    rec.follower = follower = asyncio.create_task(sub.follow(rec))
    try:
        for i in range(300, 499):
            await w.append(text(i))
            if i % 5 == 0:
                await w.flush()
                await asyncio.sleep(0.005)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        await asyncio.wait_for(follower, 30)  # ends after run_end
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await sub.close()
    assert rec.seqs == list(range(1, 501))
    assert sub.ended
    assert 0 < rec.direct < rec.calls


async def test_a_sink_error_from_a_live_batch_ends_follow_with_it(broker: Broker) -> None:
    _, run_id = await new_run(broker.store)
    w = await broker.claim(run_id, "w")
    sub = await broker.subscribe(run_id=run_id, after=0)
    got: list[int] = []

    def sink(items: list[StoredEvent], committed_ms: float) -> None:
        got.extend(e.seq for e in items)
        if committed_ms:
            raise RuntimeError("sink broke")

    follower = asyncio.create_task(sub.follow(sink))
    try:
        await w.append(text(0))
        await w.flush()
        try:
            await asyncio.wait_for(follower, 30)
            raise AssertionError("follow() returned")
        except RuntimeError as e:
            assert str(e) == "sink broke"
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await sub.close()
    assert got == [1]


async def test_unsubscribing_forgets_the_direct_handler(broker: Broker) -> None:
    nc = broker.bus.nc
    before = dict(nc._direct)
    _, run_id = await new_run(broker.store)
    sub = await broker.subscribe(run_id=run_id, after=0)
    assert len(nc._direct) == len(before) + 1
    await sub.close()
    assert nc._direct == before


async def test_a_followed_stream_whose_live_feed_stops_gets_the_tail_by_position_check(
    killable: KillableStack,
) -> None:
    """Live batches go to the sink directly; then NATS dies while 10 more
    events are committed: with no live message coming, the quiet timer
    (position_check_s 0.2) reads them from PostgreSQL, once, in order."""
    settings = make_settings(killable)
    writer_side = await Broker.connect(settings, registry=CollectorRegistry(), name="test-w")
    reader_side = await Broker.connect(settings, registry=CollectorRegistry(), name="test-r")
    rec = Recorder()
    sub = None
    follower = None
    try:
        _, run_id = await new_run(writer_side.store)
        w = await writer_side.claim(run_id, "w")
        sub = await reader_side.subscribe(run_id=run_id, after=0)
        rec.follower = follower = asyncio.create_task(sub.follow(rec))
        for i in range(10):
            await w.append(text(i))
            await w.flush()

        async def got(n: int) -> bool:
            return len(rec.seqs) == n

        await wait_until(lambda: got(10))
        assert rec.direct > 0
        killable.nats.kill()
        await killable.nats.wait_stopped()
        for i in range(10, 20):
            await w.append(text(i))
        await w.flush()
        await wait_until(lambda: got(20))
        assert rec.seqs == list(range(1, 21))
        fills = sample(reader_side.metrics, "runlog_subscribe_gap_fills_total", reason="position_check")  # fmt: skip
        assert fills == 1
        await killable.nats.restart()
    finally:
        if follower is not None:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        if sub is not None:
            await sub.close()
        await reader_side.close()
        await writer_side.close()
