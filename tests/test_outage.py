"""A PostgreSQL outage as clients see it (DESIGN guarantee 10).

Every storage failure a client sees is the retryable `storage_unavailable`
(HTTP 503, WebSocket error reply, disconnect code), on every path; the shipped
clients (`runlog.client.Client`, `gateway/static/runlog-client.js`) and
clients that follow the protocol's rules (an SSE reader that reconnects with
`Last-Event-ID` as EventSource does, a REST poller) wait it out and end with
every event exactly once, in order.

The outage tests stop the private `killable` PostgreSQL (tests/conftest.py)
under a live gateway whose reads give up after `GW_RETRY_S`, shorter than the
outage, while a run is written through a broker writer that retries its
commits for longer than the outage.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import pytest_asyncio

from broker import approvals, ids
from broker.runtime import Broker
from broker.settings import Settings

from .gw import running_gateway, session_with, write_run, ws_connect
from .helpers import KillableStack, make_settings
from .proxy import CuttingProxy

GW_RETRY_S = 2.0  # the gateway's reads give up after this, well within the outage
WRITER_RETRY_S = 120.0  # the writer's commits wait the whole outage out
UNAVAILABLE = {"code": "storage_unavailable", "retryable": True}


def _pinned(err: dict[str, Any]) -> dict[str, Any]:
    return {"code": err["code"], "retryable": err["retryable"]}


async def _until(cond: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def _restarting(killable: KillableStack) -> AsyncIterator[None]:
    """Whatever the test does to PostgreSQL, it is running again afterwards."""
    try:
        yield
    finally:
        if not killable.pg.running:
            await killable.pg.start()


@contextlib.asynccontextmanager
async def _connected(settings: Settings, name: str) -> AsyncIterator[Broker]:
    b = await Broker.connect(settings, name=name)
    try:
        yield b
    finally:
        await b.close()


@contextlib.asynccontextmanager
async def _cancelling(tasks: list[asyncio.Task[Any]]) -> AsyncIterator[None]:
    """Tasks still running at the end (a failed test) are cancelled and awaited."""
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest_asyncio.fixture(loop_scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_every_v1_endpoint_answers_storage_unavailable_while_postgres_is_down(
    killable: KillableStack, http: aiohttp.ClientSession
) -> None:
    async with (
        _restarting(killable),
        running_gateway(make_settings(killable), db_retry_s=0.3) as gw,
    ):
        sid = await session_with(http, gw, "alice")
        async with _connected(make_settings(killable), "outage-setup") as b:
            run_id, _ = await write_run(b, sid, 3, end=False)
            aid = ids.approval_id()
            await approvals.create(b.store.pool, approval_id=aid, run_id=run_id,
                                   tool_call_id="c1", summary="send it?",
                                   expires_at_ms=int(time.time() * 1000) + 600_000)  # fmt: skip
        sse = {"Accept": "text/event-stream"}
        table: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = [
            ("POST", "/v1/sessions", {"title": "x"}, {}),
            ("GET", "/v1/sessions", None, {}),
            ("GET", f"/v1/sessions/{sid}", None, {}),
            ("POST", f"/v1/sessions/{sid}/members", {"user_id": "bob", "role": "viewer"}, {}),
            ("POST", f"/v1/sessions/{sid}/runs", {"input": "hi"}, {}),
            ("POST", f"/v1/sessions/{sid}/runs", {"input": "hi"}, sse),
            ("GET", f"/v1/sessions/{sid}/events?after=0", None, {}),
            ("GET", f"/v1/sessions/{sid}/events", None, sse),
            ("GET", f"/v1/runs/{run_id}", None, {}),
            ("GET", f"/v1/runs/{run_id}/events?after=1", None, {}),
            ("GET", f"/v1/runs/{run_id}/events", None, sse),
            ("POST", f"/v1/runs/{run_id}/interrupt", {"reason": "x"}, {}),
            ("POST", f"/v1/runs/{run_id}/approvals/{aid}", {"decision": "approve"}, {}),
        ]
        # Every route under /v1 that can touch storage is in the table (the
        # OpenAPI document is static; the WebSocket is covered below).
        routes = {
            (r.method, re.sub(r"\{\w+\}", "*", r.resource.canonical))
            for r in gw.app.router.routes()
            if r.resource is not None and r.resource.canonical.startswith("/v1/")
            and r.method != "HEAD"
        }  # fmt: skip

        def template(path: str) -> str:
            return path.split("?")[0].replace(sid, "*").replace(run_id, "*").replace(aid, "*")

        tabled = {(m, template(p)) for m, p, _, _ in table}
        assert routes - tabled == {("GET", "/v1/openapi.json"), ("GET", "/v1/ws")}

        await killable.pg.stop()
        answers = []
        for method, path, body, headers in table:
            async with http.request(method, gw.url + path, json=body,
                                    headers={**gw.headers("alice"), **headers}) as r:  # fmt: skip
                answers.append((method, path, r.status, _pinned((await r.json())["error"])))
        assert answers == [(m, p, 503, UNAVAILABLE) for m, p, _, _ in table]

        async with ws_connect(http, gw, "alice") as c:
            for msg in (
                {"type": "subscribe", "run_id": run_id, "after": 0},
                {"type": "subscribe", "session_id": sid, "after": 0},
                {"type": "interrupt", "run_id": run_id, "reason": "x"},
                {"type": "decide", "approval_id": aid, "decision": "approve"},
            ):
                await c.send(**msg, ref="t")
                reply = await c.next_reply(timeout_s=30)
                assert (msg["type"], reply["type"], _pinned(reply)) == (
                    msg["type"], "error", UNAVAILABLE)  # fmt: skip
            await c.send(type="ping", ref="p")  # the connection itself is fine
            assert (await c.next_reply())["type"] == "pong"
        await killable.pg.start()

        # Back: the same requests work again.
        async with http.get(f"{gw.url}/v1/sessions/{sid}", headers=gw.headers("alice")) as r:
            assert r.status == 200 and (await r.json())["head"] == 3


@pytest.mark.parametrize("transport", ["rest", "ws"])
async def test_a_raw_connection_error_is_storage_unavailable_without_a_traceback(
    settings: Settings,
    http: aiohttp.ClientSession,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
    transport: str,
) -> None:
    """The backstop: an asyncpg connection error that escapes to the error
    middleware or the WebSocket read loop is still `storage_unavailable`,
    logged as a warning without a traceback. The gateway's connection to
    PostgreSQL is cut while it stores a decision."""
    u = urlsplit(settings.database_url)
    proxy = CuttingProxy(u.hostname or "127.0.0.1", u.port or 5432)
    await proxy.start()
    via_proxy = settings.database_url.replace(f":{u.port}/", f":{proxy.port}/")
    try:
        async with running_gateway(settings, database_url=via_proxy) as gw:
            sid = await session_with(http, gw, "alice")
            run_id, _ = await write_run(broker, sid, 1, end=False)
            aid = ids.approval_id()
            await approvals.create(broker.store.pool, approval_id=aid, run_id=run_id,
                                   tool_call_id="c1", summary="send it?",
                                   expires_at_ms=int(time.time() * 1000) + 600_000)  # fmt: skip
            caplog.clear()
            proxy.arm(b"UPDATE approvals")
            if transport == "rest":
                async with http.post(f"{gw.url}/v1/runs/{run_id}/approvals/{aid}",
                                     json={"decision": "approve"},
                                     headers=gw.headers("alice")) as r:  # fmt: skip
                    got = (r.status, _pinned((await r.json())["error"]))
                assert got == (503, UNAVAILABLE)
            else:
                async with ws_connect(http, gw, "alice") as c:
                    await c.send(type="decide", approval_id=aid, decision="approve", ref="d")
                    reply = await c.next_reply(timeout_s=30)
                assert (reply["type"], reply["ref"], _pinned(reply)) == ("error", "d", UNAVAILABLE)
            assert proxy.cuts == 1
    finally:
        await proxy.stop()
    gateway_logs = [r for r in caplog.records if r.name.startswith("gateway")]
    assert [(r.levelno, r.exc_info) for r in gateway_logs] == [(logging.WARNING, None)]
    assert "ConnectionDoesNotExistError" in gateway_logs[0].getMessage()
