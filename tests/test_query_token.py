"""`?access_token=` only where a browser cannot set a header: an EventSource
(GET of an events endpoint with `Accept: text/event-stream`) and the
WebSocket upgrade. Anywhere else a query token is refused (401 with a hint),
not silently ignored: a token in a URL ends up in logs and histories, and a
state-changing request must never be made from a link.

The table is every route the app has (read from its router), so a route
added later is covered without a change here."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio

from broker.runtime import Broker
from broker.settings import Settings
from gateway.app import STATIC_DIR

from .gw import RunningGateway, running_gateway, session_with, write_run

SSE = {"Accept": "text/event-stream"}
# (method, route) where a query token is accepted, with the headers that make it so.
ALLOWED = {
    ("GET", "/v1/runs/{run_id}/events"): SSE,
    ("GET", "/v1/sessions/{session_id}/events"): SSE,
}
WS_ROUTE = "/v1/ws"
BODIES: dict[str, dict[str, Any]] = {
    "/v1/sessions": {"title": "t"},
    "/v1/sessions/{session_id}/members": {"user_id": "bob", "role": "viewer"},
    "/v1/sessions/{session_id}/runs": {"input": "hi"},
    "/v1/runs/{run_id}/interrupt": {"reason": "r"},
    "/v1/runs/{run_id}/approvals/{approval_id}": {"decision": "approve"},
}


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


def _routes(gw: RunningGateway) -> list[tuple[str, str]]:
    out = []
    for route in gw.app.router.routes():
        info = route.resource
        assert info is not None
        if route.method != "*":
            out.append((route.method, info.canonical))
    return sorted(set(out))


def _path(canonical: str, ids: dict[str, str]) -> str:
    if canonical == "/static":
        return "/static/" + sorted(p.name for p in STATIC_DIR.iterdir() if p.is_file())[0]
    path = canonical
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    assert "{" not in path, f"no test value for a parameter of {canonical}: add it to ids"
    return path


async def _ids(gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker) -> dict[str, str]:
    sid = await session_with(http, gw, "alice")
    run_id, _ = await write_run(broker, sid, 3)
    return {"session_id": sid, "run_id": run_id, "approval_id": "ap_none", "user_id": "bob",
            "thread_id": sid}  # fmt: skip


async def _refusal(r: aiohttp.ClientResponse) -> str:
    """ "" if `r` is the refusal of a query token, else what it was instead."""
    if r.status != 401:
        return str(r.status)
    if r.method == "HEAD":
        return ""
    err = (await r.json())["error"]
    if err["code"] != "unauthorized" or "Authorization" not in err.get("hint", ""):
        return str(err)
    return ""


async def test_a_query_token_is_refused_on_every_other_endpoint(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    ids = await _ids(gw, http, broker)
    routes = _routes(gw)
    assert ("POST", "/v1/sessions") in routes and ("GET", WS_ROUTE) in routes
    tok = gw.token("alice")
    checked, wrong = [], []
    for method, canonical in routes:
        if (method, canonical) in ALLOWED or canonical == WS_ROUTE:
            continue
        url = f"{gw.url}{_path(canonical, ids)}?access_token={tok}"
        body = BODIES.get(canonical) if method in ("POST", "PUT", "PATCH") else None
        # With SSE asked for too (it must not open the door on a POST or a
        # non-streaming GET), and with a header as well (the query token is
        # still refused, not ignored).
        for extra in ({}, SSE, gw.headers("alice")):
            try:
                async with http.request(method, url, json=body, headers=extra) as r:
                    got = await _refusal(r)
            except aiohttp.ClientError as e:  # a HEAD answered with a stream, say
                got = type(e).__name__
            if got:
                wrong.append(f"{method} {canonical} {sorted(extra)}: {got}")
        checked.append((method, canonical))
    assert not wrong, "accepted a query token:\n" + "\n".join(wrong)
    known = {
        ("GET", "/"), ("GET", "/healthz"), ("GET", "/readyz"), ("GET", "/metrics"),
        ("GET", "/v1/openapi.json"), ("POST", "/v1/sessions"), ("GET", "/v1/sessions"),
        ("GET", "/v1/sessions/{session_id}"), ("POST", "/v1/sessions/{session_id}/members"),
        ("POST", "/v1/sessions/{session_id}/runs"), ("GET", "/v1/runs/{run_id}"),
        ("POST", "/v1/runs/{run_id}/interrupt"),
        ("POST", "/v1/runs/{run_id}/approvals/{approval_id}"), ("GET", "/static"),
    }  # fmt: skip
    assert known <= set(checked), known - set(checked)


async def test_a_query_token_works_on_an_sse_get_but_not_on_its_json_page(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    ids = await _ids(gw, http, broker)
    tok = gw.token("alice")
    for (method, canonical), headers in ALLOWED.items():
        url = f"{gw.url}{_path(canonical, ids)}?access_token={tok}"
        async with http.request(method, url, headers=headers) as r:
            assert r.status == 200, canonical
            assert r.headers["Content-Type"].startswith("text/event-stream")
            first = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
            assert b": connected" in first
        async with http.request(method, url) as r:  # the JSON page: a fetch can set headers
            assert await _refusal(r) == "", canonical


async def test_a_query_token_works_on_the_websocket_upgrade(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    async with http.ws_connect(f"{gw.ws_url}?access_token={gw.token('ann')}") as ws:
        assert json.loads((await ws.receive(timeout=10)).data)["user"] == "ann"
