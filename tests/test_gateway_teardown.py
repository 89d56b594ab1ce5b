"""A connection's end, however it comes: a client that stops reading (then
reads again, or never), a token that expires and a gateway that drains while
the writer is blocked, over WebSocket and SSE. Each must end with the
client's disconnect reason and exact cursor when it can still be delivered,
the socket closed by the server within a bound, and nothing left behind
(queued bytes, subscriptions, connections: read from the metrics)."""

from __future__ import annotations

import asyncio
import inspect
import json

import aiohttp
import pytest
from aiohttp import web

from broker import events
from broker.log import RunWriter
from broker.runtime import Broker
from broker.settings import Settings
from gateway.context import GATEWAY
from gateway.ws import WsClient

from .gw import (
    RunningGateway,
    eventually,
    running_gateway,
    session_with,
    write_run,
    ws_connect,
)
from .rawclient import OP_CLOSE, OP_TEXT, RawSse, RawWs

_BIG = "x" * 2000
# No heartbeat: its timeout would close a silent client too, hiding a leak.
_QUIET = {"ws_heartbeat_s": 600.0}
# Small bounds: a client that does not read reaches them with little data.
_SMALL_QUEUE = {"send_queue_max_bytes": 256 * 1024, "send_queue_lag_bytes": 64 * 1024, **_QUIET}
# Room for everything: the writer blocks on the socket, the queue never overflows.
_LARGE_QUEUE = {"send_queue_max_bytes": 64 << 20, "send_queue_lag_bytes": 64 << 20, **_QUIET}
# More than the kernel buffers on both ends of a loopback connection hold.
_BLOCKING_EVENTS = 4000


def _conns(g: RunningGateway, kind: str) -> float | None:
    return g.sample("runlog_gateway_connections", {"kind": kind})


def _slow(g: RunningGateway, kind: str) -> float | None:
    return g.sample("runlog_gateway_slow_client_disconnects_total", {"kind": kind})


async def _stream_until(g: RunningGateway, w: RunWriter, done: object, limit: int = 20000) -> int:
    """Append big deltas in bursts until `done()` holds; returns how many."""
    n = 0
    while not done():  # type: ignore[operator]
        for _ in range(20):
            await w.append(events.TextDelta(message_id=f"m{n}", delta=_BIG))
            n += 1
        await w.flush()
        await asyncio.sleep(0.01)
        assert n < limit, "the condition never came"
    return n


async def _subscribed_raw_ws(g: RunningGateway, run_id: str, ttl_s: float | None = None) -> RawWs:
    c, _ = await RawWs.connect(g.port, g.token("alice", ttl_s))
    assert (await c.message())["type"] == "hello"
    await c.send(type="subscribe", run_id=run_id, after=0)
    assert (await c.message())["type"] == "subscribed"
    return c


_WRITER_LIMIT = inspect.signature(web.WebSocketResponse).parameters["writer_limit"].default


def _frame_sizes(total: int) -> list[int]:
    """Small frame sizes (2..127 bytes) adding up to `total`."""
    out = []
    while total:
        size = min(127, total)
        if total - size == 1:
            size -= 1
        out.append(size)
        total -= size
    return out


def _assert_nothing_left(g: RunningGateway) -> None:
    assert _conns(g, "ws") == 0 and _conns(g, "sse") == 0
    assert g.sample("runlog_gateway_subscriptions") == 0
    assert g.sample("runlog_gateway_send_queue_bytes") == 0


async def test_slow_ws_client_reads_its_disconnect_with_the_exact_cursor_then_the_close(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, **_SMALL_QUEUE) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        topic = f"run:{run_id}"
        slow = await _subscribed_raw_ws(g, run_id)  # and from now on, it does not read
        try:
            async with ws_connect(http, g, "alice") as fast:
                await fast.send(type="subscribe", run_id=run_id, after=0)
                await fast.next_reply()
                reading = asyncio.create_task(fast.collect(topic, timeout_s=90))
                n = await _stream_until(g, w, lambda: _slow(g, "ws") == 1)
                await w.append(events.RunEnd(status="completed"))
                await w.flush()
                got = await reading
                assert fast.disconnect is None and fast.closed_with is None
                assert [c for c, _ in got] == list(range(1, n + 2))
                # The slow client reads again: what the server had written,
                # then its disconnect naming exactly the last event it got.
                msgs, code = await asyncio.wait_for(slow.read_to_end(), 30)
                *evs, last = msgs
                cursors = [m["cursor"] for m in evs]
                assert cursors == list(range(1, len(cursors) + 1))
                assert [m["type"] for m in evs] == ["event"] * len(evs)
                assert last["type"] == "disconnect" and last["code"] == "slow_consumer"
                assert last["reconnect"] == "resume"
                assert last["cursors"] == {topic: cursors[-1] if cursors else 0}
                assert code == 4001
                assert _slow(g, "ws") == 1
                assert g.sample("runlog_gateway_subscriptions") == 1  # the fast one only
            await eventually(lambda: _conns(g, "ws") == 0, what="connections closed")
            _assert_nothing_left(g)
        finally:
            await slow.close()


@pytest.mark.parametrize("kind", ["ws", "sse"])
async def test_a_client_that_never_reads_again_is_cut_within_the_bound(
    kind: str, settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, **_SMALL_QUEUE) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        slow: RawWs | RawSse
        if kind == "ws":
            slow = await _subscribed_raw_ws(g, run_id)
        else:
            slow = await RawSse.connect(g.port, f"/v1/runs/{run_id}/events", g.token("alice"))
        try:
            await eventually(lambda: _conns(g, kind) == 1)
            await _stream_until(g, w, lambda: _slow(g, kind) == 1)
            # More keeps coming for a while: none of it may queue up anywhere.
            for i in range(200):
                await w.append(events.TextDelta(message_id=f"late{i}", delta=_BIG))
            await w.flush()
            await eventually(lambda: not slow.server_side_open(g.port), what="socket cut")
            await eventually(lambda: _conns(g, kind) == 0, what="connection gone")
            _assert_nothing_left(g)
        finally:
            await slow.close()


async def test_token_expiry_with_a_blocked_writer_ends_the_connection(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    # No leeway: the connection ends when the 3 s token does, not 30 s later.
    async with running_gateway(settings, jwt_leeway_s=0, **_LARGE_QUEUE) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        slow = await _subscribed_raw_ws(g, run_id, ttl_s=3)
        try:
            # About 8 MB: the socket is full and the writer waits on it.
            for i in range(_BLOCKING_EVENTS):
                await w.append(events.TextDelta(message_id=f"m{i}", delta=_BIG))
            await w.flush()
            await eventually(lambda: not slow.server_side_open(g.port), 30, "socket closed")
            await eventually(lambda: _conns(g, "ws") == 0, what="expired connection gone")
            assert _slow(g, "ws") == 0
            _assert_nothing_left(g)
        finally:
            await slow.close()


async def test_drain_with_a_blocked_writer_ends_every_connection(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, **_LARGE_QUEUE) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        slow = await _subscribed_raw_ws(g, run_id)
        try:
            async with ws_connect(http, g, "alice") as reader:
                await reader.send(type="subscribe", run_id=run_id, after=0)
                await reader.next_reply()
                for i in range(_BLOCKING_EVENTS):
                    await w.append(events.TextDelta(message_id=f"m{i}", delta=_BIG))
                await w.flush()
                await reader.collect(f"run:{run_id}", count=_BLOCKING_EVENTS)
                await asyncio.wait_for(g.app[GATEWAY].drain(), 20)
                # The reading client got its reason and the exact cursor.
                await reader.collect(f"run:{run_id}", until_type="-", timeout_s=10)
                assert reader.disconnect is not None
                assert reader.disconnect["code"] == "server_draining"
                assert reader.disconnect["cursors"] == {f"run:{run_id}": _BLOCKING_EVENTS}
            await eventually(lambda: not slow.server_side_open(g.port), what="socket closed")
            await eventually(lambda: _conns(g, "ws") == 0, what="drained connections gone")
            _assert_nothing_left(g)
        finally:
            await slow.close()


async def test_slow_sse_client_reads_its_disconnect_with_the_exact_cursor(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, **_SMALL_QUEUE) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        slow = await RawSse.connect(g.port, f"/v1/runs/{run_id}/events", g.token("alice"))
        try:
            await eventually(lambda: _conns(g, "sse") == 1)
            await _stream_until(g, w, lambda: _slow(g, "sse") == 1)
            frames = await asyncio.wait_for(slow.read_to_end(), 30)
            *evs, last = frames
            ids = [int(f["id"]) for f in evs]
            assert ids == list(range(1, len(ids) + 1))
            assert last["event"] == "disconnect"
            d = json.loads(last["data"])
            assert d["code"] == "slow_consumer" and d["reconnect"] == "resume"
            assert d["cursor"] == (ids[-1] if ids else 0)
            await eventually(lambda: _conns(g, "sse") == 0, what="SSE stream ended")
            await eventually(lambda: not slow.server_side_open(g.port), what="socket closed")
            _assert_nothing_left(g)
        finally:
            await slow.close()


async def test_no_data_frame_follows_a_close_frame_and_nothing_is_compressed(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """The client closes while the gateway's writer waits on a full socket,
    and aiohttp's close frame has to wait for the socket too (its writer
    drains once the bytes it wrote pass its 64 KiB limit; pongs count, so a
    client can bring it there). When the socket drains, both wake: events
    must not follow the close frame."""
    async with running_gateway(settings, **_LARGE_QUEUE) as g:
        gw = g.app[GATEWAY]
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        c, head = await RawWs.connect(
            g.port,
            g.token("alice"),
            extra_headers="Sec-WebSocket-Extensions: permessage-deflate\r\n",
        )
        try:
            assert b"sec-websocket-extensions" not in head.lower()  # never negotiated
            assert (await c.message())["type"] == "hello"
            await c.send(type="subscribe", run_id=run_id, after=0)
            assert (await c.message())["type"] == "subscribed"
            (conn,) = gw.connections
            assert isinstance(conn, WsClient)
            t = conn.transport()
            assert t is not None
            # Not reading: the socket fills, the writer waits on it, events queue.
            n = 0
            while not t.get_protocol().writing_paused or not conn.queue.nbytes:  # type: ignore[attr-defined]
                for _ in range(20):
                    await w.append(events.TextDelta(message_id=f"m{n}", delta=_BIG))
                    n += 1
                await w.flush()
                await asyncio.sleep(0.01)
                assert n < 10_000
            # Pongs worth the writer's limit minus 2 bytes through aiohttp's writer,
            # so its 4-byte close frame passes the limit and has to drain.
            for size in _frame_sizes(_WRITER_LIMIT - 2):
                await c.send_frame(0x9, b"p" * (size - 2))  # pong = ping payload + 2
            await c.send_frame(OP_CLOSE, (1000).to_bytes(2, "big"))
            await eventually(lambda: conn.ws.closed, what="aiohttp answering the close")
            frames = []
            while True:
                op, _ = await asyncio.wait_for(c.frame(), 30)
                frames.append(op)
                if op == OP_CLOSE:
                    break
            assert set(frames[:-1]) <= {OP_TEXT, 0xA}  # events and pongs, then the close
            assert await asyncio.wait_for(c.reader.read(), 10) == b"", "data after the close"
            await eventually(lambda: _conns(g, "ws") == 0, what="connection gone")
            _assert_nothing_left(g)
        finally:
            await c.close()


async def test_a_draining_gateway_refuses_new_streams_with_server_draining(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 3, end=False)
        await g.app[GATEWAY].drain()
        expected = {"code": "server_draining", "retryable": True}
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            async with http.ws_connect(g.ws_url, headers=g.headers("alice")):
                pass
        assert refused.value.status == 503
        async with http.get(g.url + "/v1/ws", headers=g.headers("alice")) as r:
            body = await r.json()
            assert r.status == 503 and {k: body["error"][k] for k in expected} == expected
        sse = {**g.headers("alice"), "Accept": "text/event-stream"}
        async with http.get(f"{g.url}/v1/runs/{run_id}/events", headers=sse) as r:
            body = await r.json()
            assert r.status == 503 and {k: body["error"][k] for k in expected} == expected
