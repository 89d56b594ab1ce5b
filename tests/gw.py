"""Helpers for gateway tests: real gateways on real ports, real HTTP clients."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from broker import events
from broker.log import RunWriter
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import bind_free_port
from gateway import auth
from gateway._aio import AppRunner
from gateway.app import REGISTRY, build_app
from gateway.context import GATEWAY


@dataclasses.dataclass
class RunningGateway:
    url: str
    settings: Settings
    runner: web.AppRunner
    app: web.Application

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/v1/ws"

    @property
    def port(self) -> int:
        return self.settings.gateway_port

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """A metric's current value, read through the gateway's registry."""
        return self.app[REGISTRY].get_sample_value(name, labels or {})

    def token(self, user: str, ttl_s: float | None = None) -> str:
        return auth.mint(self.settings, user, ttl_s)

    def headers(self, user: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token(user)}"}

    async def stop(self) -> None:
        await self.runner.cleanup()


@asynccontextmanager
async def running_gateway(
    settings: Settings, routes: Iterable[web.AbstractRouteDef] = (), /, **overrides: Any
) -> AsyncIterator[RunningGateway]:
    """A gateway on a free port; `routes`: extra ones, for a test's own handlers.
    The port is bound before the app is built (which is told it), and held: no
    other process can take it in between."""
    sock = bind_free_port()
    try:
        port = sock.getsockname()[1]
        s = dataclasses.replace(settings, gateway_port=port, **overrides)
        app = build_app(s)
        app.add_routes(routes)
        runner = AppRunner(app, handle_signals=False, shutdown_timeout=5, access_log=None)
        await runner.setup()
        await web.SockSite(runner, sock).start()  # from here the server owns it
    except BaseException:
        sock.close()
        raise
    gw = RunningGateway(f"http://127.0.0.1:{port}", s, runner, app)
    try:
        yield gw
    except BaseException:
        await gw.stop()
        raise
    # The test's clients are gone: so must be everything the gateway held for them.
    state = app[GATEWAY]
    try:
        await eventually(lambda: not state.connections and state.hub.member_count == 0, 10)
    except AssertionError:
        raise AssertionError(
            f"the gateway still holds {len(state.connections)} connection(s) and "
            f"{state.hub.member_count} subscription(s) after the test"
        ) from None
    finally:
        await gw.stop()


async def session_with(
    http: aiohttp.ClientSession, gw: RunningGateway, owner: str, **members: str
) -> str:
    """Create a session owned by `owner` with extra members {user: role}."""
    async with http.post(
        gw.url + "/v1/sessions", json={"title": "t"}, headers=gw.headers(owner)
    ) as r:
        assert r.status == 201, await r.text()
        sid: str = (await r.json())["session_id"]
    for user, role in members.items():
        async with http.post(
            f"{gw.url}/v1/sessions/{sid}/members",
            json={"user_id": user, "role": role},
            headers=gw.headers(owner),
        ) as r:
            assert r.status == 201, await r.text()
    return sid


async def write_run(broker: Broker, session_id: str, n: int, *, end: bool = True,
                    pause_every: int = 0, pause_s: float = 0.0) -> tuple[str, RunWriter]:  # fmt: skip
    """A run written straight through the broker (the worker's path)."""
    run_id = await broker.store.create_run(session_id, "tester")
    w = await broker.claim(run_id, "test-writer")
    await append_text(w, n, pause_every=pause_every, pause_s=pause_s)
    if end:
        await w.append(events.RunEnd(status="completed"))
    await w.flush()
    return run_id, w


async def append_text(w: RunWriter, n: int, *, pause_every: int = 0, pause_s: float = 0.0) -> None:
    for i in range(n):
        await w.append(events.TextDelta(message_id="m1", delta=f"t{i} "))
        if pause_every and i % pause_every == pause_every - 1:
            await w.flush()
            await asyncio.sleep(pause_s)


async def read_sse(resp: aiohttp.ClientResponse, *, until_type: str | None = "run_end",
                   count: int | None = None, timeout_s: float = 30) -> list[tuple[int, dict[str, Any]]]:  # fmt: skip
    """Parse an SSE body into (id, event) pairs, strictly LF-framed."""
    out: list[tuple[int, dict[str, Any]]] = []
    buf = b""
    async with asyncio.timeout(timeout_s):
        async for chunk in resp.content.iter_any():
            assert b"\r" not in chunk
            buf += chunk
            while b"\n\n" in buf:
                frame, buf = buf.split(b"\n\n", 1)
                fields: dict[str, str] = {}
                for line in frame.split(b"\n"):
                    if line.startswith(b":") or not line:
                        continue
                    k, _, v = line.decode().partition(": ")
                    fields[k] = v
                if "data" in fields and "id" in fields:
                    ev = json.loads(fields["data"])
                    out.append((int(fields["id"]), ev))
                    if (until_type and ev["type"] == until_type) or (count and len(out) >= count):
                        return out
    return out


NOTICE_TYPES = frozenset({"presence", "run_queued"})


class WsClient:
    """A minimal protocol client for tests (the real client library is runlog.client)."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: dict[str, list[tuple[int, dict[str, Any]]]] = {}
        self.replies: list[dict[str, Any]] = []
        self.disconnect: dict[str, Any] | None = None
        self.closed_with: aiohttp.WSMessage | None = None
        # Messages that are not in the log (presence, run_queued), in order.
        self.notices: list[dict[str, Any]] = []

    async def send(self, **msg: Any) -> None:
        await self.ws.send_str(json.dumps(msg))

    async def next_reply(self, timeout_s: float = 10) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while not self.replies:
                if not await self._read_one():
                    raise ConnectionError("closed")
            return self.replies.pop(0)

    async def _read_one(self) -> bool:
        msg = await self.ws.receive()
        if msg.type != aiohttp.WSMsgType.TEXT:
            self.closed_with = msg
            return False
        m = json.loads(msg.data)
        if m["type"] == "event":
            self.events.setdefault(m["topic"], []).append((m["cursor"], m["event"]))
        elif m["type"] == "events":
            lst = self.events.setdefault(m["topic"], [])
            for i, e in enumerate(m["events"]):
                lst.append((m["cursor"] + i, e))
        elif m["type"] == "disconnect":
            self.disconnect = m
        elif m["type"] in NOTICE_TYPES:
            self.notices.append(m)
        else:
            self.replies.append(m)
        return True

    async def next_notice(self, type_: str, timeout_s: float = 10) -> dict[str, Any]:
        """The next notice of `type_` (earlier ones of other types are kept)."""
        async with asyncio.timeout(timeout_s):
            while True:
                for i, m in enumerate(self.notices):
                    if m["type"] == type_:
                        return self.notices.pop(i)
                if not await self._read_one():
                    raise ConnectionError("closed")

    async def collect(self, topic: str, *, until_type: str = "run_end", count: int | None = None,
                      timeout_s: float = 30) -> list[tuple[int, dict[str, Any]]]:  # fmt: skip
        async with asyncio.timeout(timeout_s):
            while True:
                got = self.events.get(topic, [])
                if got and (got[-1][1]["type"] == until_type or (count and len(got) >= count)):
                    return got
                if not await self._read_one():
                    return got


@asynccontextmanager
async def ws_connect(http: aiohttp.ClientSession, gw: RunningGateway, user: str,
                     **kwargs: Any) -> AsyncIterator[WsClient]:  # fmt: skip
    async with http.ws_connect(gw.ws_url, headers=gw.headers(user), **kwargs) as ws:
        c = WsClient(ws)
        hello = await c.next_reply()
        assert hello["type"] == "hello"
        yield c


async def eventually(pred: Callable[[], bool], timeout_s: float = 20.0, what: str = "") -> None:
    """Wait until `pred()` holds (polled); fail with `what` after `timeout_s`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)
