"""The client side of `bench scale`: a process holding many idle subscribed
WebSocket clients that resume by themselves, and check what they receive.

    python -m bench._stormload     # driven by bench/scale.py over stdin/stdout

Each `Resumer` is one client of a session stream, the way a console or an
SDK follows one (bench/_wsload.py's lean protocol client, `WsConn`, for the
connection itself): it keeps the cursor of the last event it got and, when
its connection ends (the gateway's `disconnect`, a refused connect, any
error), reconnects **after a random delay with exponential backoff and full
jitter** — `uniform(0, min(max_s, base_s * 2**attempt))`, the policy of the
shipped browser client (gateway/static/runlog-client.js: 250 ms, 10 s) —
and subscribes again from that cursor. Every event frame is checked against
the cursor: the next one must be cursor + 1; one at or below it is a
duplicate, one past it a gap (with the number of events skipped).

Commands (one JSON line each way, as bench/_wsload.py):

| command | does | reply |
|---|---|---|
| `connect` url, n, token, topics, sources, concurrency | n clients, each connected and subscribed from 0 to topics[i % len] | seconds, rss |
| `status` | live / down counts, attempts, losses, the wall time of the last re-live | … |
| `cursors` | per topic: the lowest and highest cursor of its clients | |
| `check` heads {topic: head} | gaps, duplicates, clients short of their topic's head | |
| `rss` / `quit` | | |
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from typing import Any

from ._wsload import Load, WsConn, _upgrade_request, raise_fd_limit, rss_bytes, serve_commands

# The reconnect policy under test (see the module's docstring).
BACKOFF_BASE_S = 0.25
BACKOFF_MAX_S = 10.0
# Connect, hello, subscribed: each, per attempt. It grows with the attempts
# (30, 60, 120 s, then 240 s): a client that gives up on a busy gateway and
# tries again only adds to its queue (seen at 100k: the storm fed itself).
_STEP_TIMEOUT_S = 30.0
_STEP_TIMEOUT_MAX_S = 240.0


class Fleet:
    """Every client of this process, and what they saw."""

    def __init__(self, url: str, token: str, sources: int) -> None:
        self.url = url
        self.token = token
        self.sources = sources
        self.clients: list[Resumer] = []
        self.live = 0
        self.attempts = 0
        self.failed_attempts = 0
        self.losses = 0
        self.t_last_live = 0.0
        self.t_first_loss = 0.0
        self.errors: dict[str, int] = {}
        self.load = Load()  # WsConn reports into one; unused here
        self.rng = random.Random()

    def note_error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1


class StormConn(WsConn):
    """One connection of a `Resumer`: checks every event's cursor."""

    def __init__(self, client: Resumer, request: bytes) -> None:
        super().__init__(client.fleet.load, request, want_hello=True)
        self.client = client

    def _event(self, buf: bytearray, s: int, e: int, t: float) -> None:
        k = buf.find(b'"cursor":', s, e) + 9
        cursor = int(buf[k : buf.find(b",", k, e)])
        self.client.event(cursor)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.client.lost(self)


class Resumer:
    __slots__ = (
        "attempt",
        "conn",
        "cursor",
        "dups",
        "fleet",
        "gaps",
        "index",
        "live",
        "received",
        "topic",
    )  # fmt: skip

    def __init__(self, fleet: Fleet, index: int, topic: str) -> None:
        self.fleet = fleet
        self.index = index
        self.topic = topic
        self.cursor = 0
        self.received = 0
        self.gaps = 0
        self.dups = 0
        self.attempt = 0
        self.conn: StormConn | None = None
        self.live = False

    def event(self, cursor: int) -> None:
        if cursor == self.cursor + 1:
            self.received += 1
            self.cursor = cursor
        elif cursor <= self.cursor:
            self.dups += 1
        else:
            self.gaps += cursor - self.cursor - 1
            self.received += 1
            self.cursor = cursor

    async def open(self) -> None:
        """Connect, subscribe from the cursor, wait for `subscribed`."""
        f = self.fleet
        host, port, request = _upgrade_request(f.url, f.token, "runlog.v1")
        src = f"127.0.0.{2 + self.index % f.sources}" if f.sources > 1 else None
        conn = StormConn(self, request)
        loop = asyncio.get_running_loop()
        f.attempts += 1
        step_s = min(_STEP_TIMEOUT_MAX_S, _STEP_TIMEOUT_S * 2 ** max(0, self.attempt - 1))
        async with asyncio.timeout(step_s):
            await loop.create_connection(
                lambda: conn, host, port, local_addr=(src, 0) if src else None
            )
            self.conn = conn
            await conn.ready
            kind, _, ident = self.topic.partition(":")
            conn.send({"type": "subscribe", f"{kind}_id": ident, "after": self.cursor})
            r = await conn.reply(step_s)
        if r.get("type") != "subscribed":
            conn.close()
            raise ConnectionError(f"subscribe: {r.get('code') or r.get('type')}")
        self.live = True
        self.attempt = 0
        f.live += 1
        f.t_last_live = time.time()

    def lost(self, conn: StormConn) -> None:
        # Lost during an attempt: open() fails, and _failed() retries.
        if conn is not self.conn or not self.live:
            return
        self.conn = None
        self.live = False
        f = self.fleet
        f.live -= 1
        f.losses += 1
        if not f.t_first_loss:
            f.t_first_loss = time.time()
        self._later()

    def _later(self) -> None:
        f = self.fleet
        cap = min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**self.attempt)
        self.attempt += 1
        asyncio.get_running_loop().call_later(f.rng.uniform(0, cap), self._retry)

    def _retry(self) -> None:
        asyncio.get_running_loop().create_task(self._attempt())

    async def _attempt(self) -> None:
        if self.live or self.conn is not None:
            return
        try:
            await self.open()
        except (OSError, TimeoutError) as e:
            self._failed(type(e).__name__)
        except ConnectionError as e:
            self._failed(str(e)[:60])

    def _failed(self, what: str) -> None:
        f = self.fleet
        f.failed_attempts += 1
        f.note_error(what)
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.client = _Detached  # its connection_lost no longer concerns us
            conn.close()
        self._later()


class _DetachedClient:
    def lost(self, conn: StormConn) -> None:
        pass

    def event(self, cursor: int) -> None:
        pass


_Detached: Any = _DetachedClient()


class Driver:
    def __init__(self) -> None:
        self.fleet: Fleet | None = None

    async def connect(self, url: str, n: int, token: str, topics: list[str], sources: int = 1,
                      concurrency: int = 100, index0: int = 0) -> dict[str, Any]:  # fmt: skip
        rss0 = rss_bytes()
        f = self.fleet = Fleet(url, token, sources)
        gate = asyncio.Semaphore(concurrency)
        t0 = time.perf_counter()

        async def one(i: int) -> None:
            c = Resumer(f, index0 + i, topics[i % len(topics)])
            f.clients.append(c)
            async with gate:
                await c.open()

        await asyncio.gather(*(one(i) for i in range(n)))
        return {"seconds": time.perf_counter() - t0, "rss0": rss0, "rss": rss_bytes()}

    def status(self) -> dict[str, Any]:
        f = self.fleet
        assert f is not None
        return {"t": time.time(), "clients": len(f.clients), "live": f.live,
                "attempts": f.attempts, "failed_attempts": f.failed_attempts,
                "losses": f.losses, "t_first_loss": f.t_first_loss,
                "t_last_live": f.t_last_live, "errors": f.errors,
                "received": sum(c.received for c in f.clients)}  # fmt: skip

    def check(self, heads: dict[str, int]) -> dict[str, Any]:
        f = self.fleet
        assert f is not None
        short = [c for c in f.clients if c.cursor < heads[c.topic]]
        return {"gaps": sum(c.gaps for c in f.clients), "dups": sum(c.dups for c in f.clients),
                "short": len(short), "received": sum(c.received for c in f.clients),
                "examples": [(c.topic, c.cursor, heads[c.topic]) for c in short[:3]]}  # fmt: skip


async def main() -> None:
    raise_fd_limit()
    d = Driver()
    await serve_commands({"connect": d.connect, "status": d.status, "check": d.check,
                          "rss": lambda: {"rss": rss_bytes()}})  # fmt: skip


if __name__ == "__main__":
    if "--uvloop" in sys.argv:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
