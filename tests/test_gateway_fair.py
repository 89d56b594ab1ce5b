"""Fair sharing between users on one gateway: per-user and per-IP connection
caps over real WebSockets and SSE streams (exact counts and codes), catch-up
replays taking turns, and a catching-up member's bounded live buffer."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import free_port
from broker.store import StoredEvent
from gateway.context import GATEWAY
from gateway.main import serve

from .gw import RunningGateway, eventually, running_gateway, session_with, write_run, ws_connect
from .rawclient import RawWs

_RETRY_S = 7.0
_BIG = "x" * 2000


def _conns(g: RunningGateway) -> float:
    return sum(g.sample("runlog_gateway_connections", {"kind": k}) or 0 for k in ("ws", "sse"))


def _refused(g: RunningGateway, reason: str) -> float | None:
    return g.sample("runlog_gateway_connections_refused_total", {"reason": reason})


@asynccontextmanager
async def _sse(
    http: aiohttp.ClientSession, g: RunningGateway, user: str, run_id: str, **headers: str
) -> AsyncIterator[aiohttp.ClientResponse]:
    h = {**g.headers(user), "Accept": "text/event-stream", **headers}
    async with http.get(f"{g.url}/v1/runs/{run_id}/events", headers=h) as r:
        yield r


async def _open_sse(
    stack: AsyncExitStack, http: aiohttp.ClientSession, g: RunningGateway, user: str, run_id: str
) -> None:
    r = await stack.enter_async_context(_sse(http, g, user, run_id))
    assert r.status == 200, await r.text()
    await r.content.readuntil(b": connected\n\n")  # registered on the gateway by now


async def _assert_sse_refused(
    http: aiohttp.ClientSession, g: RunningGateway, user: str, run_id: str
) -> None:
    async with _sse(http, g, user, run_id) as r:
        assert r.status == 429
        assert r.headers["Retry-After"] == "7"
        err = (await r.json())["error"]
        assert (err["code"], err["retryable"], err["retry_after_s"]) == (
            "too_many_connections",
            True,
            _RETRY_S,
        )


async def _refusal(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    """The disconnect message of a refused WebSocket, after checking that
    the close (code 4429) follows it and nothing else came before."""
    msgs: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while True:
            m = await ws.receive()
            if m.type != aiohttp.WSMsgType.TEXT:
                break
            msgs.append(json.loads(m.data))
    assert ws.close_code == 4429, (ws.close_code, msgs)
    assert msgs[-1]["type"] == "disconnect", msgs
    assert [m["type"] for m in msgs[:-1]] in ([], ["hello"]), msgs
    return msgs[-1]


def _assert_refusal(d: dict[str, Any]) -> None:
    assert (d["code"], d["reconnect"], d["retry_after_s"], d["cursors"]) == (
        "too_many_connections",
        "resume",
        _RETRY_S,
        {},
    )


async def test_per_user_cap_counts_websockets_and_sse_and_refuses_the_next_with_its_code(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    caps = {"max_connections_per_user": 3, "connection_retry_after_s": _RETRY_S}
    async with running_gateway(settings, **caps) as g, AsyncExitStack() as stack:
        sid = await session_with(http, g, "alice", bob="viewer")
        run_id, _ = await write_run(broker, sid, 3, end=False)
        # alice: two WebSockets and one SSE stream, her cap.
        for _ in range(2):
            await stack.enter_async_context(ws_connect(http, g, "alice"))
        await _open_sse(stack, http, g, "alice", run_id)
        # The fourth, either kind, is refused with the code and the retry hint.
        await _assert_sse_refused(http, g, "alice", run_id)
        async with http.ws_connect(g.ws_url, headers=g.headers("alice")) as ws:
            _assert_refusal(await _refusal(ws))
        assert (_refused(g, "user"), _refused(g, "ip")) == (2, 0)
        # bob is not affected by alice's connections.
        bob = await stack.enter_async_context(ws_connect(http, g, "bob"))
        await bob.send(type="subscribe", run_id=run_id, after=0)
        assert (await bob.next_reply())["type"] == "subscribed"
        await _open_sse(stack, http, g, "bob", run_id)
        assert _conns(g) == 5
        # One of alice's goes away: the next one is accepted, and counts.
        await stack.aclose()
        await eventually(lambda: _conns(g) == 0, 10, "every connection closed")
        async with AsyncExitStack() as again:
            for _ in range(3):
                await again.enter_async_context(ws_connect(http, g, "alice"))
            await _assert_sse_refused(http, g, "alice", run_id)
        assert _refused(g, "user") == 3


async def test_per_user_cap_on_a_websocket_is_checked_when_it_authenticates(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    caps = {"max_connections_per_user": 1, "connection_retry_after_s": _RETRY_S}
    async with running_gateway(settings, **caps) as g, ws_connect(http, g, "alice"):
        async with http.ws_connect(g.ws_url) as ws:  # no credentials at the upgrade
            hello = await ws.receive_json()
            assert (hello["type"], hello["user"]) == ("hello", None)
            await ws.send_json({"type": "auth", "token": g.token("alice")})
            _assert_refusal(await _refusal(ws))
        # The same token on the upgrade of another user's cap is fine.
        async with ws_connect(http, g, "bob") as bob:
            await bob.send(type="ping")
            assert (await bob.next_reply())["type"] == "pong"
        assert _refused(g, "user") == 1


async def test_per_ip_cap_refuses_every_user_of_that_address_but_not_another_address(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    caps = {"max_connections_per_ip": 2, "connection_retry_after_s": _RETRY_S}
    async with running_gateway(settings, **caps) as g, AsyncExitStack() as stack:
        sid = await session_with(http, g, "alice", bob="viewer", carol="viewer")
        run_id, _ = await write_run(broker, sid, 3, end=False)
        await stack.enter_async_context(ws_connect(http, g, "alice"))
        await _open_sse(stack, http, g, "bob", run_id)
        # 127.0.0.1 has its two: carol, a first-time user there, is refused.
        await _assert_sse_refused(http, g, "carol", run_id)
        async with http.ws_connect(g.ws_url, headers=g.headers("carol")) as ws:
            _assert_refusal(await _refusal(ws))
        assert (_refused(g, "ip"), _refused(g, "user")) == (2, 0)
        # From another address (loopback is a /8), carol gets in.
        other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=other) as http2:
            async with ws_connect(http2, g, "carol"):
                await _open_sse(stack, http2, g, "carol", run_id)
                assert _conns(g) == 4
            await stack.aclose()


async def test_forwarded_for_counts_only_behind_a_trusted_proxy(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    for trusted, accepted in (("", 1), ("127.0.0.0/8", 2)):
        caps = {"max_connections_per_ip": 1, "trusted_proxies": trusted}
        async with running_gateway(settings, **caps) as g, AsyncExitStack() as stack:
            sid = await session_with(http, g, "alice")
            run_id, _ = await write_run(broker, sid, 3, end=False)
            codes = []
            for client in ("10.0.0.1", "10.0.0.2"):
                fwd = {"X-Forwarded-For": f"203.0.113.9, {client}"}
                r = await stack.enter_async_context(_sse(http, g, "alice", run_id, **fwd))
                codes.append(r.status)
            assert codes == [200] * accepted + [429] * (2 - accepted), trusted


async def test_replays_take_turns_so_another_users_replay_is_not_starved(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """One turn at a time, pages of 10: alice's ten replays (100 turns each)
    wait in her queue, bob's one goes round-robin with them, so bob's ends
    (after ~200 turns) long before any of hers (~1,100)."""
    limits = {"max_concurrent_replays": 1, "page_max_events": 10}
    async with running_gateway(settings, **limits) as g:
        sid = await session_with(http, g, "alice", bob="viewer")
        runs = [(await write_run(broker, sid, 1000))[0] for _ in range(10)]
        finished: list[str] = []

        async def follow(user: str, run_ids: list[str]) -> None:
            async with ws_connect(http, g, user) as c:
                for r in run_ids:
                    await c.send(type="subscribe", run_id=r, after=0, batch=True)
                for _ in run_ids:
                    assert (await c.next_reply())["type"] == "subscribed"
                for r in run_ids:
                    got = await c.collect(f"run:{r}", timeout_s=60)
                    assert [cur for cur, _ in got] == list(range(1, 1002))
                    finished.append(user)

        alice = asyncio.create_task(follow("alice", runs))
        await eventually(lambda: (g.sample("runlog_gateway_replays_waiting") or 0) >= 5, 20)
        await follow("bob", runs[:1])
        await alice
        assert finished == ["bob"] + ["alice"] * len(runs)
        assert g.sample("runlog_gateway_replays_running") == 0
        assert g.sample("runlog_gateway_replays_waiting") == 0


async def test_a_client_that_does_not_read_holds_no_replay_turn(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    limits = {"max_concurrent_replays": 1, "send_queue_lag_bytes": 16 * 1024}
    async with running_gateway(settings, **limits) as g:
        sid = await session_with(http, g, "alice", bob="viewer")
        big, w = await write_run(broker, sid, 0, end=False)
        for i in range(2000):  # 4 MB: more than the sockets on the way can hold
            await w.append(events.TextDelta(message_id=f"m{i}", delta=_BIG))
        await w.flush()
        stalled, _ = await RawWs.connect(g.port, g.token("alice"))
        try:
            assert (await stalled.message())["type"] == "hello"
            await stalled.send(type="subscribe", run_id=big, after=0)
            assert (await stalled.message())["type"] == "subscribed"
            # Her replay waits on her socket, not in a turn: bob's runs through.
            await eventually(lambda: (g.sample("runlog_gateway_send_queue_bytes") or 0) > 0, 10)
            async with ws_connect(http, g, "bob") as bob:
                await bob.send(type="subscribe", run_id=big, after=0, batch=True)
                assert (await bob.next_reply())["type"] == "subscribed"
                got = await bob.collect(f"run:{big}", count=2000, timeout_s=30)
                assert [c for c, _ in got] == list(range(1, 2001))
            assert g.sample("runlog_gateway_replays_running") == 0
        finally:
            await stalled.close()


async def test_a_catch_up_waiting_for_its_client_holds_no_page(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """Between turns a replay holds no events: the page it last read is
    gone while it waits for its client. (It used to stay referenced until the
    next turn, so 100 stalled replays of 1,000-event pages kept 100k rows
    alive, and every full garbage collection walked them.)"""
    limits = {"send_queue_lag_bytes": 16 * 1024}
    async with running_gateway(settings, **limits) as g:
        sid = await session_with(http, g, "alice")
        big, w = await write_run(broker, sid, 0, end=False)
        for i in range(2000):  # 4 MB: more than the sockets on the way can hold
            await w.append(events.TextDelta(message_id=f"m{i}", delta=_BIG))
        await w.flush()
        stalled, _ = await RawWs.connect(g.port, g.token("alice"))
        try:
            assert (await stalled.message())["type"] == "hello"
            await stalled.send(type="subscribe", run_id=big, after=0)
            assert (await stalled.message())["type"] == "subscribed"
            lag = limits["send_queue_lag_bytes"]
            await eventually(
                lambda: (
                    (g.sample("runlog_gateway_send_queue_bytes") or 0) > lag
                    and g.sample("runlog_gateway_replays_running") == 0
                ),
                10,
            )
            gc.collect()
            assert sum(isinstance(o, StoredEvent) for o in gc.get_objects()) == 0
        finally:
            await stalled.close()


async def test_a_serving_gateway_keeps_its_startup_heap_out_of_garbage_collections(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Objects alive when `runlog gateway` starts serving are frozen: no
    generation holds them, so full collections under load do not walk them."""
    alive_at_start: list[object] = []  # a tracked container, alive throughout
    s = dataclasses.replace(settings, gateway_host="127.0.0.1", gateway_port=free_port())
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="runlog.gateway")
    task = asyncio.create_task(serve(s, stop))
    try:
        await eventually(lambda: "gateway listening" in caplog.text, 20, "the gateway serving")
        assert not any(o is alive_at_start for o in gc.get_objects())
    finally:
        stop.set()
        await task
        gc.unfreeze()


async def test_a_waiting_catch_up_buffers_at_most_live_buffer_max_events(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """Five live batches of 50 events arrive while a member still catches
    up: past live_buffer_max (100) events its buffer is dropped, once, and it
    re-reads from PostgreSQL, missing nothing."""
    limits = {"live_buffer_max": 100, "send_queue_lag_bytes": 16 * 1024}
    async with running_gateway(settings, **limits) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        for i in range(2000):  # 4 MB of history: a catch-up paced by the client
            await w.append(events.TextDelta(message_id=f"h{i}", delta=_BIG))
        await w.flush()
        c, _ = await RawWs.connect(g.port, g.token("alice"))
        try:
            assert (await c.message())["type"] == "hello"
            await c.send(type="subscribe", run_id=run_id, after=0)
            assert (await c.message())["type"] == "subscribed"
            state = g.app[GATEWAY]
            await eventually(lambda: state.hub.member_count == 1 and _queued(g), 10)
            for _ in range(5):
                for j in range(50):
                    await w.append(events.TextDelta(message_id="live", delta=f"{j}"))
                await w.flush()
            await eventually(
                lambda: g.sample("runlog_gateway_catchup_buffer_overflows_total") == 1, 10
            )
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            got: list[int] = []
            while not got or got[-1] < w.last_seq:
                got.append((await asyncio.wait_for(c.message(), 20))["cursor"])
            assert got == list(range(1, w.last_seq + 1))
            assert g.sample("runlog_gateway_catchup_buffer_overflows_total") == 1
        finally:
            await c.close()


def _queued(g: RunningGateway) -> bool:
    return (g.sample("runlog_gateway_send_queue_bytes") or 0) > 0


async def test_a_streamed_run_start_past_the_cap_is_refused_before_the_run_starts(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    caps = {"max_connections_per_user": 1, "connection_retry_after_s": _RETRY_S}
    async with running_gateway(settings, **caps) as g, ws_connect(http, g, "alice"):
        sid = await session_with(http, g, "alice")
        h = {**g.headers("alice"), "Accept": "text/event-stream"}
        async with http.post(f"{g.url}/v1/sessions/{sid}/runs", json={}, headers=h) as r:
            assert r.status == 429
            assert (await r.json())["error"]["code"] == "too_many_connections"
        async with http.get(f"{g.url}/v1/sessions/{sid}", headers=g.headers("alice")) as r:
            assert (await r.json())["runs"] == []
