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
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, WebSocket, WebSocketRoute

from broker import approvals, events, ids
from broker.runtime import Broker
from broker.settings import Settings
from runlog.client import Client, ClientError

from .browser_helpers import WAIT_MS, Pages
from .gw import RunningGateway, append_text, running_gateway, session_with, write_run, ws_connect
from .helpers import KillableStack, make_settings
from .proxy import CuttingProxy

GW_RETRY_S = 0.5  # the gateway's reads give up after this, well within the outage
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
async def pages(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Pages]:
    p = Pages(browser, request.node.name)
    failed_before = request.session.testsfailed
    try:
        yield p
    finally:
        if request.session.testsfailed > failed_before or p.page_errors:
            await p.save_artifacts()
        await p.close()
    assert not p.page_errors, p.page_errors


# -- followers: each returns the (cursor, type) pairs it received, in order


async def _sse_follow(
    http: aiohttp.ClientSession, gw: RunningGateway, run_id: str, seen: list[str]
) -> list[tuple[int, str]]:
    """Follow a run over SSE the way EventSource does: after any end or
    failure, reconnect (after a pause) with `Last-Event-ID`. Errors go to
    `seen`; a non-retryable one means giving up (an AssertionError)."""
    got: list[tuple[int, str]] = []
    while True:
        headers = {**gw.headers("alice"), "Accept": "text/event-stream"}
        if got:
            headers["Last-Event-ID"] = str(got[-1][0])
        with contextlib.suppress(aiohttp.ClientError, ConnectionError):
            async with http.get(f"{gw.url}/v1/runs/{run_id}/events", headers=headers) as r:
                if r.status == 204:
                    return got  # the run's end was read already
                if r.status != 200:
                    err = (await r.json())["error"]
                    seen.append(f"{r.status} {err['code']} retryable={err['retryable']}")
                    assert err["retryable"], f"SSE reader gave up: {r.status} {err}"
                else:
                    fields: dict[str, str] = {}
                    async for raw in r.content:
                        line = raw.decode().rstrip("\n")
                        if line:
                            if not line.startswith(":"):
                                k, _, v = line.partition(": ")
                                fields[k] = v
                            continue
                        if fields.get("event") == "disconnect":
                            d = json.loads(fields["data"])
                            seen.append(f"disconnect {d['code']} reconnect={d['reconnect']}")
                        elif "id" in fields:
                            got.append((int(fields["id"]), json.loads(fields["data"])["type"]))
                            if got[-1][1] == "run_end":
                                return got
                        fields = {}
        await asyncio.sleep(0.2)


async def _rest_poll(
    http: aiohttp.ClientSession, gw: RunningGateway, run_id: str, seen: list[str]
) -> list[tuple[int, str]]:
    """Page through a run with `?after=` until it ends, polling at the head;
    retry what is retryable, give up (AssertionError) on anything else."""
    got: list[tuple[int, str]] = []
    after = 0
    while True:
        async with http.get(f"{gw.url}/v1/runs/{run_id}/events?after={after}",
                            headers=gw.headers("alice")) as r:  # fmt: skip
            body = await r.json()
        if r.status != 200:
            err = body["error"]
            seen.append(f"{r.status} {err['code']} retryable={err['retryable']}")
            assert err["retryable"], f"REST poller gave up: {r.status} {err}"
            await asyncio.sleep(0.2)
            continue
        got += [(body["cursor"] + i, e["type"]) for i, e in enumerate(body["events"])]
        after = body["next_after"]
        if body["ended"]:
            return got
        await asyncio.sleep(0.1)


async def _ws_follow(c: Client, run_id: str) -> list[tuple[int, str]]:
    return [(item.cursor, item.event["type"]) async for item in c.follow(run_id=run_id)]


# The JS client in the page, following one run; what it delivers and every
# state change are kept in window.__follow.
_JS_FOLLOW = """async ([baseUrl, token, runId, opts]) => {
  const { RunlogClient } = await import("/static/runlog-client.js");
  const rec = { got: [], states: [], errors: [] };
  window.__follow = rec;
  window.__client = new RunlogClient({ baseUrl, token, backoffBaseMs: 100, backoffMaxMs: 1000,
                                       ...opts });
  window.__client.subscribe({
    runId,
    onEvent: (cursor, event) => rec.got.push([cursor, event.type]),
    onState: (state, info) => rec.states.push([state, info.code ?? null]),
    onError: (e) => rec.errors.push(e.code),
  });
}"""


async def _js_follow(
    pages: Pages, name: str, gw: RunningGateway, run_id: str, *, sse: bool
) -> tuple[Page, list[dict[str, Any]], list[int]]:
    """A page running the JS client on `run_id`; with `sse`, its WebSockets are
    refused, so it falls back to SSE. Returns the page, the error and
    disconnect messages its WebSockets received, and the HTTP statuses of its
    SSE requests."""
    ctx = await pages.browser.new_context()
    pages.contexts.append(ctx)
    ws_messages: list[dict[str, Any]] = []
    sse_statuses: list[int] = []

    async def refuse(ws: WebSocketRoute) -> None:
        await ws.close(code=1011, reason="blocked by the test")

    def on_frame(payload: str | bytes) -> None:
        m = json.loads(payload)
        if m["type"] in ("error", "disconnect"):
            ws_messages.append(m)

    def on_ws(ws: WebSocket) -> None:
        ws.on("framereceived", on_frame)

    if sse:
        await ctx.route_web_socket(re.compile(r".*/v1/ws$"), refuse)
    page = await pages.open_in(ctx, name, gw.url + "/healthz")
    page.on("websocket", on_ws)
    page.on("response", lambda r: sse_statuses.append(r.status) if "/events" in r.url else None)
    opts = {"sseFallbackAfter": 1, "wsRetryMs": 600_000} if sse else {}
    await page.evaluate(_JS_FOLLOW, [gw.url, gw.token("alice"), run_id, opts])
    return page, ws_messages, sse_statuses


async def _js_record(page: Page) -> dict[str, Any]:
    rec: dict[str, Any] = await page.evaluate("window.__follow")
    return rec


async def _js_has(page: Page, n: int) -> None:
    await page.wait_for_function("(n) => window.__follow.got.length >= n", arg=n, timeout=WAIT_MS)


async def test_clients_of_every_transport_ride_out_a_postgres_outage(
    killable: KillableStack, http: aiohttp.ClientSession, pages: Pages
) -> None:
    tasks: list[asyncio.Task[Any]] = []
    async with (
        _restarting(killable),
        _connected(make_settings(killable, db_retry_s=WRITER_RETRY_S), "outage-writer") as writer,
        running_gateway(make_settings(killable), db_retry_s=GW_RETRY_S) as gw,
        Client(gw.url, gw.token("alice")) as client,
        _cancelling(tasks),
    ):
        sid = await session_with(http, gw, "alice")
        run_id, w = await write_run(writer, sid, 30, end=False)
        sse_seen: list[str] = []
        rest_seen: list[str] = []
        tasks += [
            asyncio.create_task(_ws_follow(client, run_id)),
            asyncio.create_task(_sse_follow(http, gw, run_id, sse_seen)),
            asyncio.create_task(_rest_poll(http, gw, run_id, rest_seen)),
        ]
        js_ws, js_ws_messages, _ = await _js_follow(pages, "js-ws", gw, run_id, sse=False)
        js_sse, _, js_sse_statuses = await _js_follow(pages, "js-sse", gw, run_id, sse=True)
        for page in (js_ws, js_sse):
            await _js_has(page, 30)  # everyone is following before the outage

        await killable.pg.stop()
        # Written during the outage: committed (and sent) once it is over.
        produce = asyncio.create_task(append_text(w, 30))
        tasks.append(produce)
        # A new subscription and a REST read while PostgreSQL is down.
        async with ws_connect(http, gw, "alice") as late:
            await late.send(type="subscribe", run_id=run_id, after=0, ref="late")
            reply = await late.next_reply(timeout_s=30)
        assert (reply["type"], reply["ref"], _pinned(reply)) == ("error", "late", UNAVAILABLE)
        async with http.get(f"{gw.url}/v1/runs/{run_id}", headers=gw.headers("alice")) as r:
            assert (r.status, _pinned((await r.json())["error"])) == (503, UNAVAILABLE)
        with pytest.raises(ClientError) as e:
            await client.get_run(run_id)
        assert (e.value.status, e.value.code, e.value.retryable) == (503, *UNAVAILABLE.values())
        # PostgreSQL stays down until every client has been refused at least
        # once (a resubscribe or a reconnect failed, not only the live stream
        # stopped).
        await _until(lambda: client.reconnect_reasons["storage_unavailable"] >= 2, "ws client")
        await _until(lambda: any(s.startswith("503") for s in sse_seen), "sse reader")
        await _until(lambda: bool(rest_seen), "rest poller")
        await _until(lambda: any(m["type"] == "error" for m in js_ws_messages), "js ws")
        await _until(lambda: 503 in js_sse_statuses, "js sse")
        await killable.pg.start()

        await asyncio.wait_for(produce, 60)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        ws_got, sse_got, rest_got = await asyncio.wait_for(asyncio.gather(*tasks[:3]), 60)
        for page in (js_ws, js_sse):
            await _js_has(page, 61)
        js_ws_rec, js_sse_rec = await _js_record(js_ws), await _js_record(js_sse)
        for page in (js_ws, js_sse):
            await page.evaluate("window.__client.close()")

    expected = [(seq, "text_delta") for seq in range(1, 61)] + [(61, "run_end")]
    assert ws_got == expected
    assert sse_got == expected
    assert rest_got == expected
    assert [tuple(g) for g in js_ws_rec["got"]] == expected
    assert [tuple(g) for g in js_sse_rec["got"]] == expected
    # What each client was told during the outage: storage_unavailable and
    # nothing else, always retryable; nobody gave up.
    assert set(client.reconnect_reasons) == {"storage_unavailable"}
    assert set(sse_seen) == {
        "disconnect storage_unavailable reconnect=resume",
        "503 storage_unavailable retryable=True",
    }
    assert set(rest_seen) == {"503 storage_unavailable retryable=True"}
    assert {(m["type"], m["code"], m.get("retryable"), m.get("reconnect"))
            for m in js_ws_messages} == {
        ("disconnect", "storage_unavailable", None, "resume"),
        ("error", "storage_unavailable", True, None),
    }  # fmt: skip
    assert set(js_sse_statuses) == {200, 503}
    for rec in (js_ws_rec, js_sse_rec):
        assert rec["errors"] == [] and "stopped" not in [s for s, _ in rec["states"]]
        assert ["reconnecting", "storage_unavailable"] in rec["states"]
        assert rec["states"][-1] == ["live", None]


def aisdk_rows(sid: str, run_id: str, aid: str) -> list[tuple[str, str, Any, dict[str, str]]]:
    """The AI SDK's routes (gateway/compat/aisdk_http.py): a message, an approval answer."""
    answer = {"type": "dynamic-tool", "toolCallId": "c1", "toolName": "t",
              "state": "approval-responded", "approval": {"id": aid, "approved": True}}  # fmt: skip
    return [
        ("GET", f"/v1/compat/ai-sdk/runs/{run_id}/stream", None, {}),
        ("POST", "/v1/compat/ai-sdk/runs",
         {"id": run_id, "messages": [{"id": run_id, "role": "assistant", "parts": [answer]}]}, {}),
        ("POST", f"/v1/compat/ai-sdk/sessions/{sid}",
         {"messages": [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]},
         {}),
        ("GET", f"/v1/compat/ai-sdk/sessions/{sid}/stream", None, {}),
    ]  # fmt: skip


def _langgraph(sid: str, run_id: str) -> list[tuple[str, str, Any, dict[str, str]]]:
    """The LangGraph compat routes (gateway/compat/langgraph_http.py)."""
    base = f"/v1/compat/langgraph/threads/{sid}"
    human = {"input": {"messages": [{"role": "user", "content": "hi"}]}}
    return [
        ("POST", "/v1/compat/langgraph/threads", {}, {}),
        ("GET", base, None, {}),
        ("POST", f"{base}/runs/stream", human, {}),
        ("GET", f"{base}/runs/{run_id}", None, {}),
        ("GET", f"{base}/runs/{run_id}/stream", None, {}),
        ("POST", f"{base}/runs/{run_id}/cancel", None, {}),
    ]


async def test_every_v1_endpoint_answers_storage_unavailable_while_postgres_is_down(
    killable: KillableStack, http: aiohttp.ClientSession
) -> None:
    async with (
        _restarting(killable),
        # Each read is tried three times (retried after 0.05 s and 0.1 s), then
        # answered: some forty requests, each a read or more, one after another.
        running_gateway(make_settings(killable), db_retry_s=0.1) as gw,
    ):
        sid = await session_with(http, gw, "alice")
        async with _connected(make_settings(killable), "outage-setup") as b:
            run_id, owner = await write_run(b, sid, 3, end=False)
            aid = ids.approval_id()
            await approvals.create(b.store, approval_id=aid, run_id=run_id,
                                   epoch=owner.epoch, tool_call_id="c1", summary="send it?",
                                   expires_at_ms=int(time.time() * 1000) + 600_000)  # fmt: skip
        sse = {"Accept": "text/event-stream"}
        chat = {"stream": True, "messages": [{"role": "user", "content": "hi"}]}
        agui_input = {"messages": [{"id": "u1", "role": "user", "content": "hi"}]}
        table: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = [
            ("POST", "/v1/sessions", {"title": "x"}, {}),
            ("GET", "/v1/sessions", None, {}),
            ("GET", f"/v1/sessions/{sid}", None, {}),
            ("PATCH", f"/v1/sessions/{sid}", {"include_thinking": True}, {}),
            ("POST", f"/v1/sessions/{sid}/members", {"user_id": "bob", "role": "viewer"}, {}),
            ("PATCH", f"/v1/sessions/{sid}/members/alice", {"role": "owner"}, {}),
            ("DELETE", f"/v1/sessions/{sid}/members/bob", None, {}),
            ("POST", f"/v1/sessions/{sid}/runs", {"input": "hi"}, {}),
            ("POST", f"/v1/sessions/{sid}/runs", {"input": "hi"}, sse),
            ("GET", f"/v1/sessions/{sid}/events?after=0", None, {}),
            ("GET", f"/v1/sessions/{sid}/events", None, sse),
            ("GET", f"/v1/runs/{run_id}", None, {}),
            ("GET", f"/v1/runs/{run_id}/events?after=1", None, {}),
            ("GET", f"/v1/runs/{run_id}/events", None, sse),
            ("POST", f"/v1/runs/{run_id}/interrupt", {"reason": "x"}, {}),
            ("POST", f"/v1/runs/{run_id}/approvals/{aid}", {"decision": "approve"}, {}),
            *_langgraph(sid, run_id),
            ("POST", f"/v1/compat/openai/sessions/{sid}/chat/completions", chat, {}),
            ("POST", f"/v1/compat/openai/runs/{run_id}/chat/completions", chat, {}),
            *aisdk_rows(sid, run_id, aid),
            ("POST", f"/v1/compat/sim/sessions/{sid}/chat", {"input": "hi"}, {}),
            ("GET", f"/v1/compat/sim/runs/{run_id}/stream", None, {}),
            ("POST", f"/v1/compat/agent-ui/sessions/{sid}/runs", {"goal": "hi"}, {}),
            ("GET", f"/v1/compat/agent-ui/runs/{run_id}/events?after=1", None, {}),
            ("POST", f"/v1/compat/agui/runs/{run_id}", {"messages": []}, sse),
            ("POST", f"/v1/compat/agui/sessions/{sid}", agui_input, sse),
        ]
        # Every route under /v1 that can touch storage is in the table (the
        # OpenAPI document and /v1/config are static; the WebSocket is covered below).
        routes = {
            (r.method, re.sub(r"\{\w+\}", "*", r.resource.canonical))
            for r in gw.app.router.routes()
            if r.resource is not None and r.resource.canonical.startswith("/v1/")
            and r.method != "HEAD"
        }  # fmt: skip

        def template(path: str) -> str:
            path = path.split("?")[0].replace(sid, "*").replace(run_id, "*").replace(aid, "*")
            return re.sub(r"/members/\w+$", "/members/*", path)

        tabled = {(m, template(p)) for m, p, _, _ in table}
        static = {("GET", "/v1/openapi.json"), ("GET", "/v1/config")}
        assert routes - tabled == {*static, ("GET", "/v1/ws")}

        await killable.pg.stop()
        answers = []
        for method, path, body, headers in table:
            async with http.request(method, gw.url + path, json=body,
                                    headers={**gw.headers("alice"), **headers}) as r:  # fmt: skip
                answers.append((method, path, r.status, _pinned((await r.json())["error"])))
        assert answers == [(m, p, 503, UNAVAILABLE) for m, p, _, _ in table]
        for _, path in static:
            async with http.get(gw.url + path) as r:
                assert r.status == 200, path

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
async def test_a_connection_cut_under_a_decision_is_storage_unavailable_without_a_traceback(
    settings: Settings,
    http: aiohttp.ClientSession,
    broker: Broker,
    caplog: pytest.LogCaptureFixture,
    transport: str,
) -> None:
    """The gateway's connection to PostgreSQL is cut while it stores a
    decision: the answer is `storage_unavailable`, and nothing is logged as a
    bug. The store tells it (Store.decide_approval's StorageError, issue 23,
    item 2); before, asyncpg's raw error got past the store to the error
    middleware's and the WebSocket loop's backstop, which logged a warning."""
    u = urlsplit(settings.database_url)
    proxy = CuttingProxy(u.hostname or "127.0.0.1", u.port or 5432)
    await proxy.start()
    via_proxy = settings.database_url.replace(f":{u.port}/", f":{proxy.port}/")
    try:
        async with running_gateway(settings, database_url=via_proxy) as gw:
            sid = await session_with(http, gw, "alice")
            run_id, owner = await write_run(broker, sid, 1, end=False)
            aid = ids.approval_id()
            await approvals.create(broker.store, approval_id=aid, run_id=run_id,
                                   epoch=owner.epoch, tool_call_id="c1", summary="send it?",
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
    assert [(r.levelno, r.exc_info) for r in gateway_logs if r.levelno >= logging.WARNING] == []


# The JS client's rules for error replies, against a fake socket in the
# browser: a retryable one is retried (with its reason shown), however often
# it comes; a non-retryable one ends that subscription.
_JS_RETRY_RULES = """async () => {
  const { RunlogClient } = await import("/static/runlog-client.js");
  const until = async (cond, what) => {
    const t0 = Date.now();
    while (!cond()) {
      if (Date.now() - t0 > 20000) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 5));
    }
  };
  const sockets = [];
  class FakeWS {
    constructor(url, protocols) { Object.assign(this, { url, sent: [], readyState: 0 }); sockets.push(this); }
    send(d) { this.sent.push(JSON.parse(d)); }
    close() { this.readyState = 3; }
    recv(msg) { this.readyState = 1; this.onmessage?.({ data: JSON.stringify(msg) }); }
  }
  const out = { states: [], errors: [], otherStates: [], otherErrors: [] };
  const client = new RunlogClient({ baseUrl: "http://gw", token: "t", WebSocket: FakeWS,
                                    backoffBaseMs: 1, backoffMaxMs: 5 });
  client.subscribe({ runId: "r1", after: 4, onState: (s, i) => out.states.push([s, i.code ?? null]),
                     onError: (e) => out.errors.push(e.code) });
  client.subscribe({ runId: "r2", onState: (s, i) => out.otherStates.push([s, i.code ?? null]),
                     onError: (e) => out.otherErrors.push([e.code, e.retryable]) });
  await until(() => sockets.length === 1, "a socket");
  const ws = sockets[0];
  ws.recv({ type: "hello", heartbeat_s: 15 });
  const subscribes = (ref) => ws.sent.filter((m) => m.type === "subscribe" && m.ref === ref);
  for (let n = 1; n <= 5; n++) {
    await until(() => subscribes("sub1").length === n, `subscribe #${n}`);
    ws.recv({ type: "error", ref: "sub1", code: n % 2 ? "storage_unavailable" : "bus_unavailable",
              message: "not now", retryable: true });
  }
  await until(() => subscribes("sub1").length === 6, "subscribe #6");
  ws.recv({ type: "subscribed", topic: "run:r1", cursor: 4, head: 4 });
  ws.recv({ type: "error", ref: "sub2", code: "not_a_member", message: "no", retryable: false });
  out.sent = subscribes("sub1").map((m) => m.after);
  out.sockets = sockets.length;
  client.close();
  return out;
}"""


async def test_js_client_retries_retryable_subscribe_errors_and_surfaces_the_others(
    pages: Pages, settings: Settings
) -> None:
    async with running_gateway(settings) as gw:
        page = await pages.open("rules", gw.url + "/healthz")
        out = await page.evaluate(_JS_RETRY_RULES)
    assert out["sent"] == [4] * 6 and out["sockets"] == 1  # the same cursor, one connection
    assert out["states"] == [
        ["connecting", None],
        ["connecting", "storage_unavailable"],
        ["connecting", "bus_unavailable"],
        ["connecting", "storage_unavailable"],
        ["connecting", "bus_unavailable"],
        ["connecting", "storage_unavailable"],
        ["resumed from #4", None],
        ["live", None],
    ]
    assert out["errors"] == []
    assert out["otherStates"] == [["connecting", None], ["stopped", None]]
    assert out["otherErrors"] == [["not_a_member", False]]
