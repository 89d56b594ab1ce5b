"""A 3-node JetStream cluster: the broker works unchanged, and losing a node
mid-stream loses no event.

Three `nats-server` processes on loopback, from the same wheel and launcher
as `runlog up`, clustered over routes; streams with 3 replicas; PostgreSQL is
the session's shared one. The node killed (SIGKILL) is the leader of the
live-feed stream, and both the writer and the subscriber are connected to it,
so the test goes through the worst path: both clients reconnect, and the
stream elects a new leader before publishes are acknowledged again.

The subscriber's position check is set to a minute, so everything it gets
within the test arrived through the live feed (or a gap fill that a live
message triggered): "delivery resumed" means the cluster delivers again, not
that PostgreSQL polling papered over it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio

from broker import constants, events
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import free_port
from runlog.embedded import ClusterSpec, NatsProcess

from .helpers import assert_contiguous, sample, text

_RESUME_BOUND_S = 30.0  # generous: a slow 2-core box; the measured figure is printed


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(tmp_root: Path) -> AsyncIterator[list[NatsProcess]]:
    route_ports = [free_port() for _ in range(3)]
    nodes = [
        NatsProcess(
            tmp_root / f"cluster-{port}",
            cluster=ClusterSpec("runlog", port, [p for p in route_ports if p != port]),
        )
        for port in route_ports
    ]
    await asyncio.gather(*(n.start() for n in nodes))
    try:
        yield nodes
    finally:
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)


def _port(b: Broker) -> int:
    url = b.bus.nc.connected_url  # a urllib ParseResult, None while disconnected
    return (url.port or 0) if url is not None else 0


async def _connect_to(settings: Settings, node_port: int, name: str) -> Broker:
    """A broker whose NATS connection happens to be on `node_port`. The client
    picks one of the listed servers at random, so reconnect until it lands
    there (each try is a 1-in-3 chance)."""
    for _ in range(40):
        b = await Broker.connect(settings, name=name)
        if _port(b) == node_port:
            return b
        await b.close()
    raise AssertionError(f"could not connect {name} to node :{node_port}")


async def test_node_killed_mid_stream_loses_nothing(
    cluster: list[NatsProcess], settings: Settings
) -> None:
    urls = ",".join(n.url for n in cluster)
    s = dataclasses.replace(settings, nats_url=urls, stream_replicas=3)
    # Creates the streams with 3 replicas; waits for the cluster's meta leader.
    setup = await Broker.connect(s, name="cluster-setup")
    try:
        info = await setup.bus.js.stream_info(constants.EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader
        leader = info.cluster.leader
        session_id = await setup.store.create_session("alice")
        run_id = await setup.store.create_run(session_id, "alice")
    finally:
        await setup.close()
    victim = next(n for n in cluster if n.cluster and n.cluster.server_name == leader)

    writer = await _connect_to(s, victim.port, "cluster-writer")
    reader = await _connect_to(
        dataclasses.replace(s, position_check_s=60.0), victim.port, "cluster-reader"
    )
    try:
        w = await writer.claim(run_id, "w")
        sub = await reader.subscribe(run_id=run_id, after=0)
        got: list[int] = []
        killed_at_seq = 0
        t_kill = 0.0
        resumed_after_s: float | None = None
        resumed = asyncio.Event()

        async def follow() -> None:
            nonlocal resumed_after_s
            async for batch in sub:
                got.extend(e.seq for e in batch)
                # Delivery "resumed" once events appended clearly after the
                # kill (200 ms of appends later) reach the subscriber.
                if killed_at_seq and resumed_after_s is None and got[-1] > killed_at_seq + 100:
                    resumed_after_s = time.monotonic() - t_kill
                    resumed.set()

        follower = asyncio.create_task(follow())
        seq = 0

        async def append_for(duration_s: float) -> None:
            # ~500 events/s in small flushed steps, like a model streaming tokens.
            nonlocal seq
            end = time.monotonic() + duration_s
            while time.monotonic() < end:
                for _ in range(5):
                    seq = await w.append(text(seq))
                await asyncio.sleep(0.01)

        await append_for(1.5)
        assert got, "nothing delivered before the kill"
        killed_at_seq = seq
        published_before = sample(writer.metrics, "runlog_publish_messages_total")
        t_kill = time.monotonic()
        victim.kill()

        # Keep appending through the failover until delivery resumed, then a bit more.
        deadline = t_kill + _RESUME_BOUND_S + 10
        while not resumed.is_set() and time.monotonic() < deadline:
            await append_for(0.5)
        await append_for(1.0)
        # The writer's live publishes are acknowledged again (by the new leader).
        while sample(writer.metrics, "runlog_publish_messages_total") == published_before:
            assert time.monotonic() < deadline, "no live publish acknowledged since the kill"
            await asyncio.sleep(0.05)
        await w.append(events.RunEnd(status="completed"))
        total = await w.flush()
        await asyncio.wait_for(follower, _RESUME_BOUND_S + 10)

        print(
            f"\n3-node cluster, leader node killed at seq {killed_at_seq}: delivery resumed "
            f"after {resumed_after_s:.2f} s; {total} events; writer now on :{_port(writer)}, "
            f"reader on :{_port(reader)} (killed :{victim.port})"
        )
        assert resumed_after_s is not None and resumed_after_s < _RESUME_BOUND_S
        assert_contiguous_seqs(got, total)
        assert sub.ended
        # The stream kept its 3-replica config and elected a new leader.
        info = await writer.bus.js.stream_info(constants.EVENTS_STREAM)
        assert info.config.num_replicas == 3
        assert info.cluster is not None and info.cluster.leader != leader
        # PostgreSQL holds the same log (the system of record).
        replay = await writer.store.run_page(run_id, 0, total + 1)
        assert_contiguous(replay, first=1)
        assert len(replay) == total
    finally:
        await reader.close()
        await writer.close()


def assert_contiguous_seqs(got: list[int], total: int) -> None:
    """Every event exactly once, in order: 1..total."""
    assert len(got) == total, (len(got), total)
    assert got == list(range(1, total + 1))


async def test_streams_wait_for_a_replica_node_that_joins_late(
    tmp_root: Path, settings: Settings
) -> None:
    """A process that starts while the cluster has its meta leader but fewer
    live nodes than a 3-replica stream needs (one is being replaced) waits for
    the node, as it waits for the meta leader, instead of crashing:
    JetStream answers such a stream `no suitable peers for placement` (400,
    err_code 10005) until the third node is back."""
    route_ports = [free_port() for _ in range(3)]
    nodes = [
        NatsProcess(
            tmp_root / f"late-{port}",
            cluster=ClusterSpec("late", port, [p for p in route_ports if p != port]),
        )
        for port in route_ports
    ]
    await asyncio.gather(*(n.start() for n in nodes))
    try:
        nodes[2].kill()
        await nodes[2].wait_stopped()
        s = dataclasses.replace(
            settings, nats_url=",".join(n.url for n in nodes[:2]), stream_replicas=3
        )
        connecting = asyncio.create_task(Broker.connect(s, name="late-setup"))
        # Until the third node runs again, nothing can place the streams:
        # JetStream first times out (5 s), then answers 10005.
        await asyncio.sleep(8.0)
        assert not connecting.done(), connecting.exception() if connecting.done() else None
        await nodes[2].start()
        b = await asyncio.wait_for(connecting, 40.0)
        try:
            info = await b.bus.js.stream_info(constants.EVENTS_STREAM)
            assert info.config.num_replicas == 3
        finally:
            await b.close()
    finally:
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
