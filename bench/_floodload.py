"""The flooding user of bench/flood.py: a separate process that opens as many
WebSockets and SSE streams as it is told (all as one user), each replaying a
session from its start; the WebSockets replay again and again (unsubscribe,
subscribe from 0, alternating between two sessions so that late frames of the
previous subscription are told apart), the SSE streams once, then stay.

    python -m bench._floodload     # driven by bench/flood.py over stdin/stdout

Commands (one JSON object per line each way, as bench/_wsload.py):

| command | does | reply |
|---|---|---|
| `start` ws_url, sse_urls, token, ws, sse, sessions, target | open them all, subscribe the accepted ones | accepted and refused counts, by code |
| `stop` | close everything | replays completed, events received |
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aiohttp

from ._wsload import (
    _TOPIC,
    Load,
    WsConn,
    _upgrade_request,
    raise_fd_limit,
    rss_bytes,
    serve_commands,
)  # fmt: skip


class FloodConn(WsConn):
    """A WsConn that counts only the frames of its current subscription."""

    current = b""

    def _event(self, buf: bytearray, s: int, e: int, t: float) -> None:
        p = buf.find(_TOPIC, s, e) + 9
        if bytes(buf[p : buf.find(b'"', p, e)]) == self.current:
            super()._event(buf, s, e, t)


class Flood:
    def __init__(self) -> None:
        self.load = Load()
        self.conns: list[FloodConn] = []
        self.sessions: list[str] = []
        self.replays = 0
        self.sse_events = 0
        self.tasks: list[asyncio.Task[Any]] = []
        self.http: aiohttp.ClientSession | None = None

    def _subscribe(self, c: FloodConn, i: int) -> None:
        sid = self.sessions[i % len(self.sessions)]
        c.current = f"session:{sid}".encode()
        c.cursor = 0
        c.send({"type": "subscribe", "session_id": sid, "after": 0, "batch": True})

    async def _ws(self, url: str, token: str) -> str:
        host, port, request = _upgrade_request(url, token, "runlog.v1")
        conn = FloodConn(self.load, request, False)
        try:
            await asyncio.get_running_loop().create_connection(lambda: conn, host, port)
            async with asyncio.timeout(30):
                await conn.ready
            first = await conn.reply(30)  # hello, or the refusal's disconnect
        except (OSError, ConnectionError, TimeoutError) as e:
            return f"error {type(e).__name__}"
        if first.get("type") != "hello":
            return str(first.get("code", first.get("type")))
        self.conns.append(conn)
        return "accepted"

    async def _sse(self, url: str, token: str) -> str:
        assert self.http is not None
        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        resp = await self.http.get(url, headers=headers)
        if resp.status != 200:
            body = await resp.json()
            resp.release()
            return str(body["error"]["code"])
        self.tasks.append(asyncio.create_task(self._read_sse(resp)))
        return "accepted"

    async def _read_sse(self, resp: aiohttp.ClientResponse) -> None:
        with contextlib.suppress(Exception):
            async for chunk in resp.content.iter_any():
                self.sse_events += chunk.count(b"\nid: ")
        resp.release()

    async def _replay_loop(self, target: int) -> None:
        flips = [0] * len(self.conns)
        while True:
            for i, c in enumerate(self.conns):
                if c.cursor >= target and not c.closed:
                    self.replays += 1
                    c.send({"type": "unsubscribe", "session_id": c.current.decode()[8:]})
                    flips[i] += 1
                    self._subscribe(c, i + flips[i])
                    c.replies.clear()
            await asyncio.sleep(0.02)

    async def start(self, ws_url: str, sse_urls: list[str], token: str, ws: int, sse: int,
                    sessions: list[str], target: int) -> dict[str, Any]:  # fmt: skip
        self.sessions = sessions
        self.replays = self.sse_events = 0  # per flood, not since the process started
        self.tasks = []
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        gate = asyncio.Semaphore(100)

        async def bounded(coro: Any) -> str:
            async with gate:
                result: str = await coro
                return result

        ws_out = await asyncio.gather(*(bounded(self._ws(ws_url, token)) for _ in range(ws)))
        sse_out = await asyncio.gather(
            *(bounded(self._sse(sse_urls[i % len(sse_urls)], token)) for i in range(sse))
        )
        for i, c in enumerate(self.conns):
            self._subscribe(c, i)
        self.tasks.append(asyncio.create_task(self._replay_loop(target)))
        return {"ws": _tally(ws_out), "sse": _tally(sse_out), "rss": rss_bytes()}

    async def stop(self) -> dict[str, Any]:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for c in self.conns:
            c.close()
        events = sum(c.events for c in self.conns)
        self.conns = []
        if self.http is not None:
            await self.http.close()
        return {"replays": self.replays, "ws_events": events, "sse_events": self.sse_events}


def _tally(outcomes: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outcomes:
        out[o] = out.get(o, 0) + 1
    return out


async def main() -> None:
    raise_fd_limit()
    f = Flood()
    handlers: dict[str, Callable[..., Any]] = {"start": f.start, "stop": f.stop}
    await serve_commands(handlers)


if __name__ == "__main__":
    asyncio.run(main())
