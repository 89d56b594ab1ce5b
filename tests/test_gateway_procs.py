"""Gateways as real processes: kill -9 one and resume on another; drain on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest_asyncio

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth

from .gw import WsClient, append_text
from .procs import RunlogProcess


@pytest_asyncio.fixture(loop_scope="session")
async def two_gateways(settings: Settings, tmp_root: Path) -> AsyncIterator[list[RunlogProcess]]:
    gws = [RunlogProcess("gateway", settings, tmp_root) for _ in range(2)]
    try:
        for g in gws:
            await g.start()
        for g in gws:
            await g.wait_ready()
        yield gws
    finally:
        for g in gws:
            await g.stop()


async def _connect(http: aiohttp.ClientSession, url: str, token: str) -> WsClient:
    ws = await http.ws_connect(url.replace("http", "ws") + "/v1/ws",
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    c = WsClient(ws)
    assert (await c.next_reply())["type"] == "hello"
    return c


async def test_kill_9_gateway_clients_resume_on_the_other(
    two_gateways: list[RunlogProcess], settings: Settings, broker: Broker
) -> None:
    a, b = two_gateways
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    topic = f"run:{run_id}"
    writer = asyncio.create_task(append_text(w, 3000, pause_every=50, pause_s=0.005))
    async with aiohttp.ClientSession() as http:
        clients = [await _connect(http, a.url, token) for _ in range(5)]
        for c in clients:
            await c.send(type="subscribe", run_id=run_id, after=0)
            await c.next_reply()
        await asyncio.gather(*(c.collect(topic, count=200, until_type="-") for c in clients))
        a.kill()  # no goodbye: the clients just see the connection drop
        await a.wait()
        resumed = []
        for c in clients:
            got = c.events.get(topic, [])
            cursor = got[-1][0] if got else 0
            c2 = await _connect(http, b.url, token)
            await c2.send(type="subscribe", run_id=run_id, after=cursor)
            await c2.next_reply()
            resumed.append((got, c2))
        await writer
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        for got, c2 in resumed:
            rest = await c2.collect(topic)
            seqs = [s for s, _ in got + rest]
            assert seqs == list(range(1, 3002))
            await c2.ws.close()
        for c in clients:
            await c.ws.close()


async def test_sigterm_drains_with_code_and_cursor(
    two_gateways: list[RunlogProcess], settings: Settings, broker: Broker
) -> None:
    _, b = two_gateways
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    await append_text(w, 100)
    await w.flush()
    async with aiohttp.ClientSession() as http:
        c = await _connect(http, b.url, token)
        await c.send(type="subscribe", run_id=run_id, after=0)
        await c.next_reply()
        await c.collect(f"run:{run_id}", count=100, until_type="-")
        t0 = time.monotonic()
        b.signal(signal.SIGTERM)
        await c.collect(f"run:{run_id}", count=10**9, until_type="-", timeout_s=20)
        assert c.disconnect is not None
        assert c.disconnect["code"] == "server_draining" and c.disconnect["reconnect"] == "resume"
        assert c.disconnect["cursors"] == {f"run:{run_id}": 100}
        assert c.closed_with is not None and c.closed_with.data == 4000
        assert await b.wait(20) == 0
        assert time.monotonic() - t0 < settings.gateway_drain_s + 5
    await w.append(events.RunEnd(status="completed"))
    await w.flush()
