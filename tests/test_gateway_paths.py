"""Gateway paths the other tests do not take by themselves: every
server-initiated disconnect over a real socket (code, exact cursors, close
code), closes started by aiohttp or the client, subscribers joining a topic
that streams fast, a connection switching between direct writes and its
queue, and the catching-up buffer overflowing."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import aiohttp
import pytest

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from gateway.disconnect import CODES

from .gw import (
    RunningGateway,
    append_text,
    eventually,
    running_gateway,
    session_with,
    write_run,
    ws_connect,
)
from .helpers import KillableStack, make_settings
from .rawclient import OP_CLOSE, RawWs

_BIG = "x" * 2000


def _nothing_left(g: RunningGateway) -> bool:
    return (
        g.sample("runlog_gateway_connections", {"kind": "ws"}) == 0
        and g.sample("runlog_gateway_subscriptions") == 0
        and g.sample("runlog_gateway_send_queue_bytes") == 0
    )


async def _subscribed(g: RunningGateway, run_id: str, **connect: Any) -> RawWs:
    c, _ = await RawWs.connect(g.port, g.token("alice", connect.pop("ttl_s", None)), **connect)
    assert (await c.message())["type"] == "hello"
    await c.send(type="subscribe", run_id=run_id, after=0)
    assert (await c.message())["type"] == "subscribed"
    return c


async def _events_until_disconnect(c: RawWs) -> tuple[list[int], dict[str, Any], int | None]:
    """(cursors of the events received, the disconnect message, the close code)."""
    msgs, code = await asyncio.wait_for(c.read_to_end(), 30)
    evs = [m["cursor"] for m in msgs if m["type"] == "event"]
    (disconnect,) = [m for m in msgs if m["type"] == "disconnect"]
    assert msgs[-1] is disconnect  # the last message before the close frame
    return evs, disconnect, code


def _assert_disconnect(d: dict[str, Any], code: str, topic: str, cursor: int) -> None:
    assert d["code"] == code and d["reconnect"] == CODES[code].reconnect
    assert d["cursors"] == {topic: cursor}


@pytest.mark.parametrize("reason", ["token_expired", "rate_limited", "protocol_error"])
async def test_server_disconnects_carry_their_code_and_exact_cursor(
    reason: str, settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    # No leeway: the connection ends when the 3 s token does, not 30 s later.
    async with running_gateway(settings, jwt_leeway_s=0) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 30, end=False)
        topic = f"run:{run_id}"
        c = await _subscribed(g, run_id, ttl_s=3 if reason == "token_expired" else None)
        try:
            got = [(await c.message())["cursor"] for _ in range(30)]
            assert got == list(range(1, 31))
            if reason == "rate_limited":
                for _ in range(400):  # far past the bucket: errors, then the disconnect
                    await c.send(type="ping")
            elif reason == "protocol_error":
                for _ in range(20):  # malformed messages in a row
                    await c.send_frame(0x1, b"{")
            evs, d, close_code = await _events_until_disconnect(c)
            assert evs == []  # nothing more was written after the history
            _assert_disconnect(d, reason, topic, 30)
            assert close_code == CODES[reason].close_code
            await eventually(lambda: _nothing_left(g), what="nothing left")
        finally:
            await c.close()


async def test_storage_outage_disconnects_with_storage_unavailable_and_the_cursor(
    killable: KillableStack, http: aiohttp.ClientSession
) -> None:
    s = make_settings(killable, db_retry_s=1.0)
    b = await Broker.connect(make_settings(killable, db_retry_s=60.0), name="test-outage-writer")
    try:
        async with running_gateway(s) as g:
            sid = await session_with(http, g, "alice")
            run_id, _ = await write_run(b, sid, 12, end=False)
            c = await _subscribed(g, run_id)
            try:
                assert [(await c.message())["cursor"] for _ in range(12)] == list(range(1, 13))
                killable.pg.kill()
                await killable.pg.wait_stopped()
                # The topic's position check fails past db_retry_s: its members go.
                evs, d, close_code = await _events_until_disconnect(c)
                assert evs == []
                _assert_disconnect(d, "storage_unavailable", f"run:{run_id}", 12)
                assert close_code == 4002
                await eventually(lambda: _nothing_left(g), what="nothing left")
            finally:
                await c.close()
                await killable.pg.restart()
    finally:
        await b.close()


async def test_a_close_started_by_aiohttp_or_the_client_leaves_nothing_behind(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, ws_heartbeat_s=0.5) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 5, end=False)
        # Never answers aiohttp's pings: aiohttp closes it.
        silent = await _subscribed(g, run_id)
        try:
            await eventually(lambda: not silent.server_side_open(g.port), what="ping timeout")
            await eventually(lambda: _nothing_left(g), what="nothing left")
        finally:
            await silent.close()
        # Closes by itself, with a close frame, while subscribed.
        polite = await _subscribed(g, run_id)
        try:
            assert [(await polite.message())["cursor"] for _ in range(5)] == [1, 2, 3, 4, 5]
            await polite.send_frame(OP_CLOSE, (1000).to_bytes(2, "big"))
            op, data = await asyncio.wait_for(polite.frame(), 10)
            assert (op, int.from_bytes(data[:2], "big")) == (OP_CLOSE, 1000)
            assert await asyncio.wait_for(polite.rest(), 10) == b""
            await eventually(lambda: _nothing_left(g), what="nothing left")
        finally:
            await polite.close()


async def test_subscribers_joining_a_fast_streaming_run_miss_nothing(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        topic = f"run:{run_id}"
        rng = random.Random(7)

        async def follower(delay_s: float) -> tuple[int, list[int]]:
            await asyncio.sleep(delay_s)
            after = max(0, w.committed_seq - rng.randrange(0, 200))
            async with ws_connect(http, g, "alice") as c:
                await c.send(type="subscribe", run_id=run_id, after=after, batch=rng.random() < 0.5)
                await c.next_reply()
                got = await c.collect(topic, timeout_s=60)
            return after, [cur for cur, _ in got]

        followers = [asyncio.create_task(follower(0.05 * i)) for i in range(20)]
        await append_text(w, 3000, pause_every=20, pause_s=0.002)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        for after, got in await asyncio.gather(*followers):
            assert got == list(range(after + 1, 3002)), (after, got[:5])
        await eventually(lambda: _nothing_left(g), what="nothing left")


async def test_a_connection_switches_between_direct_writes_and_its_queue(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """A client that reads in spurts: what it gets goes through its queue
    while it does not keep up and straight to the socket again once it does,
    and it gets each event once, in order, across every switch."""
    big_queue = {"send_queue_max_bytes": 64 << 20, "send_queue_lag_bytes": 64 << 20}
    async with running_gateway(settings, **big_queue) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        c = await _subscribed(g, run_id)
        got: list[int] = []

        def frames(path: str) -> float:
            return g.sample("runlog_gateway_frames_sent_total", {"kind": "ws", "path": path}) or 0

        async def read(n: int) -> None:
            for _ in range(n):
                got.append((await asyncio.wait_for(c.message(), 10))["cursor"])

        try:
            for _ in range(3):
                # Not reading while events come: the queue takes over.
                while not g.sample("runlog_gateway_send_queue_bytes"):
                    for _ in range(10):
                        await w.append(events.TextDelta(message_id="m", delta=_BIG))
                    await w.flush()
                    await asyncio.sleep(0.005)
                queued_before = frames("queued")
                await read(w.committed_seq - len(got))  # everything, so the queue empties
                await eventually(lambda: g.sample("runlog_gateway_send_queue_bytes") == 0)
                assert frames("queued") > queued_before
                # Keeping up again: the next events go straight to the socket.
                direct_before = frames("direct")
                for _ in range(5):
                    await w.append(events.TextDelta(message_id="m", delta="small"))
                    await w.flush()
                    await read(1)
                assert frames("direct") == direct_before + 5
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            await read(1)
            assert got == list(range(1, w.committed_seq + 1))
        finally:
            await c.close()


async def test_a_catch_up_whose_live_buffer_overflows_rereads_and_misses_nothing(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    queue = {"send_queue_max_bytes": 64 << 20, "send_queue_lag_bytes": 64 * 1024}
    async with running_gateway(settings, **queue) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        for i in range(2000):  # 4 MB of history: a catch-up in many paced chunks
            await w.append(events.TextDelta(message_id=f"h{i}", delta=_BIG))
        await w.flush()
        c = await _subscribed(g, run_id)  # and, for now, it does not read
        try:
            # Live batches pile up for the member that is still catching up.
            n = 2000
            while g.sample("runlog_gateway_catchup_buffer_overflows_total") == 0:
                await w.append(events.TextDelta(message_id=f"l{n}", delta="y"))
                await w.flush()
                n += 1
                assert n < 5000
            for i in range(20):
                await w.append(events.TextDelta(message_id=f"late{i}", delta="z"))
                await w.flush()
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            got: list[int] = []
            while not got or got[-1] < n + 21:
                got.append((await asyncio.wait_for(c.message(), 20))["cursor"])
            assert got == list(range(1, n + 22))
            assert g.sample("runlog_gateway_catchup_buffer_overflows_total") == 1
        finally:
            await c.close()
