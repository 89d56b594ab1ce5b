"""The client side of the gateway benchmarks: a separate process holding many
WebSocket connections (and, on request, an SSE stream or a JSON page reader).

    python -m bench._wsload        # driven by the bench process over stdin/stdout

Why not aiohttp's client: one aiohttp client WebSocket costs ~10-20 µs of
Python per received message (a WSMessage, a queue, a task wake-up), as much
as the server spends sending it, so a client process holding 1,000 of them
would be the bottleneck it is meant to measure. Here each connection is an
`asyncio.Protocol` that does the HTTP upgrade itself and reads server frames
straight from the byte stream (server frames are never masked), looking only
at what the benchmark needs: the frame's `cursor` and how many events it
carries. That costs ~1-2 µs per frame, the same for the product gateway and
for the raw aiohttp server the benchmarks compare it with.

Protocol with the parent: one JSON object per line each way. Every command
gets one reply line (`{"ok": true, ...}` or `{"ok": false, "error": ...}`);
`arm` first answers `{"ok": true, "armed": true}` (the parent then starts the
load) and later its result.

| command | does | reply |
|---|---|---|
| `connect` url, n, token?, protocol?, hello?, sources?, concurrency?, cursor?, proto?, subject? | open n connections (wait for the upgrade and, with `hello`, the server's hello); `proto` "nats" or "sio": a peer's client (`NatsConn`, `SioConn`: ready once subscribed; `cursor` then counts messages received) | rss, seconds |
| `subscribe` topics (one per connection, cycled), batch, after | send `subscribe`, wait for every `subscribed` | seconds, errors |
| `arm` target | until every connection's cursor reaches `target` | t_first, t_last, frames, events |
| `record` on | keep (topic, cursor, wall time) of every event received | |
| `dump` | the recorded receipts, and stop recording | records |
| `close_all` | close every connection | |
| `ws_replay` url, token, topic, last, batch | one fresh connection: subscribe from 0 until `last` | seconds, frames, events |
| `sse_replay` url, token, events? | read an SSE stream to its end (or, with `events`, until that many arrived: a session's stream never ends) | seconds, events, bytes |
| `page_replay` url, token, limit | page through `url` until the end | seconds, events, pages |
| `stats` | per-connection counters, closes seen | |
| `rss` | this process's RSS | |
| `quit` | exit | |
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import msgspec

_EVENT = b'{"type":"event'  # both "event" and "events" frames start with this
_CURSOR = b'"cursor":'
_TOPIC = b'"topic":"'
_SEQ = b'"seq":'


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def client_frame(opcode: int, payload: bytes) -> bytes:
    """A masked client frame (RFC 6455 §5.3)."""
    key = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        head = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    if n:
        mask = (key * (n // 4 + 1))[:n]
        body = (int.from_bytes(payload, "big") ^ int.from_bytes(mask, "big")).to_bytes(n, "big")
    else:
        body = b""
    return head + key + body


class Load:
    """What every connection reports into: the armed target and the receipts."""

    def __init__(self) -> None:
        self.conns: list[WsConn] = []
        self.target = 0
        self.remaining = 0
        self.t_first = 0.0
        self.t_last = 0.0
        self.frames = 0
        self.events = 0
        self.done = asyncio.Event()
        self.recording = False
        self.records: list[tuple[str, int, float]] = []

    def arm(self, target: int) -> None:
        self.target = target
        self.t_first = self.t_last = 0.0
        self.frames = self.events = 0
        self.done.clear()
        self.remaining = sum(1 for c in self.conns if c.cursor < target and not c.closed)
        if self.remaining == 0:
            self.done.set()

    def reached(self, t: float) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.t_last = t
            self.done.set()


class WsConn(asyncio.Protocol):
    def __init__(self, load: Load, request: bytes, want_hello: bool) -> None:
        self.load = load
        self.request = request
        self.want_hello = want_hello
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.upgraded = False
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.cursor = 0
        self.frames = 0
        self.events = 0
        self.closed = False
        self.close_info = ""
        self.replies: list[dict[str, Any]] = []
        self.reply_waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, yet alike.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.ready.done():
            self.ready.set_exception(ConnectionError(f"closed before ready: {exc}"))
        if self.reply_waiter is not None and not self.reply_waiter.done():
            self.reply_waiter.set_result(None)
        if self.load.remaining and self.cursor < self.load.target:
            self.load.reached(time.time())  # it will never get there

    def data_received(self, data: bytes) -> None:
        t = time.time()
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buf[: buf.find(b"\r\n")])
            if b" 101 " not in status:
                self.ready.set_exception(ConnectionError(status.decode(errors="replace")))
                assert self.transport is not None
                self.transport.close()
                return
            del buf[: end + 4]
            self.upgraded = True
            if not self.want_hello:
                self.ready.set_result(None)
        self._frames(t)

    # -- frames

    def _frames(self, t: float) -> None:
        buf = self.buf
        i = 0
        n = len(buf)
        while n - i >= 2:
            b1 = buf[i + 1] & 0x7F
            if b1 < 126:
                s = i + 2
            elif b1 == 126:
                if n - i < 4:
                    break
                b1 = int.from_bytes(buf[i + 2 : i + 4], "big")
                s = i + 4
            else:
                if n - i < 10:
                    break
                b1 = int.from_bytes(buf[i + 2 : i + 10], "big")
                s = i + 10
            e = s + b1
            if e > n:
                break
            op = buf[i] & 0x0F
            i = e
            if op == 1 or op == 2:
                self._data(buf, s, e, t)
            elif op == 9:  # ping: answer, or the server closes us
                if self.transport is not None:
                    self.transport.write(client_frame(0xA, bytes(buf[s:e])))
            elif op == 8:
                code = int.from_bytes(buf[s : s + 2], "big") if e - s >= 2 else 0
                self.close_info = f"{code} {bytes(buf[s + 2 : e]).decode(errors='replace')}"
                if self.transport is not None:
                    self.transport.close()
        if i:
            del buf[:i]

    def _data(self, buf: bytearray, s: int, e: int, t: float) -> None:
        """A text or binary frame's payload, buf[s:e] (peer protocols override)."""
        if buf.startswith(_EVENT, s):
            self._event(buf, s, e, t)
        else:
            self._reply(json.loads(bytes(buf[s:e])))

    def _delivered(self, k: int, t: float) -> None:
        """A peer's frame carrying `k` messages: for peers, `cursor` counts
        the messages this connection received."""
        load = self.load
        if load.t_first == 0.0:
            load.t_first = t
        self.frames += 1
        load.frames += 1
        self.events += k
        load.events += k
        before = self.cursor
        self.cursor += k
        if before < load.target <= self.cursor:
            load.reached(t)

    def _event(self, buf: bytearray, s: int, e: int, t: float) -> None:
        k = buf.find(_CURSOR, s, e) + 9
        c = buf.find(b",", k, e)
        cursor = int(buf[k:c])
        if buf[s + 14] == 0x73:  # "events": one frame, several events
            count = buf.count(_SEQ, c, e)
            last = cursor + count - 1
        else:
            count = 1
            last = cursor  # a coalesced frame ("from") also ends at its cursor
        load = self.load
        if load.t_first == 0.0:
            load.t_first = t
        self.frames += 1
        load.frames += 1
        covered = last - self.cursor
        self.events += covered
        load.events += covered
        before = self.cursor
        self.cursor = last
        if load.recording:
            p = buf.find(_TOPIC, s, e) + 9
            topic = bytes(buf[p : buf.find(b'"', p, e)]).decode()
            for j in range(count):
                load.records.append((topic, cursor + j, t))
        if before < load.target <= last:
            load.reached(t)

    def _reply(self, msg: dict[str, Any]) -> None:
        if msg.get("type") == "hello" and not self.ready.done():
            self.ready.set_result(None)
            return
        if msg.get("type") == "disconnect":
            self.close_info = f"disconnect {msg.get('code')}"
        self.replies.append(msg)
        if self.reply_waiter is not None and not self.reply_waiter.done():
            self.reply_waiter.set_result(None)

    # -- requests

    def send(self, msg: dict[str, Any]) -> None:
        assert self.transport is not None
        self.transport.write(client_frame(1, json.dumps(msg).encode()))

    async def reply(self, timeout_s: float) -> dict[str, Any]:
        async with asyncio.timeout(timeout_s):
            while not self.replies:
                if self.closed:
                    raise ConnectionError(f"closed ({self.close_info})")
                self.reply_waiter = asyncio.get_running_loop().create_future()
                await self.reply_waiter
        return self.replies.pop(0)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            with contextlib.suppress(Exception):
                self.transport.write(client_frame(8, (1000).to_bytes(2, "big")))
            self.transport.close()


class NatsConn(WsConn):
    """A client of nats-server's WebSocket listener, speaking the NATS text
    protocol: INFO, then `CONNECT`, `SUB`, `PING`; ready at the PONG (the SUB
    is in place). nats-server puts several MSGs in one frame, and may split
    one across two: MSGs are counted by their `MSG ` marker, with the last 3
    bytes of the previous frame carried over."""

    def __init__(self, load: Load, request: bytes, subject: str) -> None:
        super().__init__(load, request, want_hello=True)
        self.hello = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\nSUB %s 1\r\nPING\r\n' % subject.encode()  # fmt: skip
        self.live = False
        self.tail = b""

    def _data(self, buf: bytearray, s: int, e: int, t: float) -> None:
        tr = self.transport
        if not self.live:
            data = bytes(buf[s:e])
            if data.startswith(b"INFO ") and tr is not None:
                tr.write(client_frame(2, self.hello))
            elif b"-ERR" in data and not self.ready.done():
                self.ready.set_exception(ConnectionError(data[:200].decode(errors="replace")))
            elif b"PONG\r\n" in data:
                self.live = True
                if not self.ready.done():
                    self.ready.set_result(None)
            return
        k = buf.count(b"MSG ", s, e)
        if self.tail:
            k += (self.tail + bytes(buf[s : min(e, s + 3)])).count(b"MSG ")
        self.tail = bytes(buf[max(s, e - 3) : e])
        if buf.find(b"PING\r\n", s, e) >= 0 and tr is not None:  # keepalive (2 min)
            tr.write(client_frame(2, b"PONG\r\n"))
        if k:
            self._delivered(k, t)


class SioConn(WsConn):
    """A python-socketio client over the WebSocket transport, Engine.IO v4 /
    Socket.IO v5 framing by hand: `0{open}` → `40` → `40{sid}` (ready, in
    the room the server's connect handler put it in); ping `2` → `3`;
    every `42[...]` frame is one event."""

    def __init__(self, load: Load, request: bytes) -> None:
        super().__init__(load, request, want_hello=True)

    def _data(self, buf: bytearray, s: int, e: int, t: float) -> None:
        if buf.startswith(b"42", s):
            self._delivered(1, t)
        elif e - s == 1 and buf[s] == 0x32:  # "2": Engine.IO ping
            if self.transport is not None:
                self.transport.write(client_frame(1, b"3"))
        elif buf.startswith(b"0{", s):
            if self.transport is not None:
                self.transport.write(client_frame(1, b"40"))
        elif buf.startswith(b"40", s) and not self.ready.done():
            self.ready.set_result(None)


def _upgrade_request(url: str, token: str | None, protocol: str | None) -> tuple[str, int, bytes]:
    assert url.startswith("ws://")
    hostport, _, path = url[5:].partition("/")
    host, _, port = hostport.partition(":")
    lines = [
        f"GET /{path} HTTP/1.1",
        f"Host: {hostport}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}",
        "Sec-WebSocket-Version: 13",
    ]
    if protocol:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return host, int(port), ("\r\n".join(lines) + "\r\n\r\n").encode()


async def open_conn(
    load: Load,
    url: str,
    *,
    token: str | None,
    protocol: str | None,
    hello: bool,
    source: str | None = None,
    timeout_s: float = 60.0,
    proto: str = "runlog",
    subject: str = "fan",
) -> WsConn:
    host, port, request = _upgrade_request(url, token, protocol)
    loop = asyncio.get_running_loop()
    conn: WsConn
    if proto == "nats":
        conn = NatsConn(load, request, subject)
    elif proto == "sio":
        conn = SioConn(load, request)
    else:
        conn = WsConn(load, request, hello)
    local = (source, 0) if source else None
    await loop.create_connection(lambda: conn, host, port, local_addr=local)
    async with asyncio.timeout(timeout_s):
        await conn.ready
    return conn


# -- commands


class Driver:
    def __init__(self) -> None:
        self.load = Load()

    async def connect(self, url: str, n: int, token: str | None = None,
                      protocol: str | None = None, hello: bool = True, sources: int = 1,
                      concurrency: int = 100, cursor: int = 0, proto: str = "runlog",
                      subject: str = "fan") -> dict[str, Any]:  # fmt: skip
        rss0 = rss_bytes()
        gate = asyncio.Semaphore(concurrency)
        t0 = time.perf_counter()
        base = len(self.load.conns)

        async def one(i: int) -> WsConn:
            # Several source addresses spread 10k+ connections over more
            # ephemeral ports (and past TIME_WAIT of earlier trials).
            src = f"127.0.0.{2 + (base + i) % sources}" if sources > 1 else None
            async with gate:
                return await open_conn(self.load, url, token=token, protocol=protocol,
                                       hello=hello, source=src, proto=proto, subject=subject)  # fmt: skip

        conns = await asyncio.gather(*(one(i) for i in range(n)))
        for c in conns:
            c.cursor = cursor  # where the stream stands (raw server: its last cursor)
        self.load.conns.extend(conns)
        return {"seconds": time.perf_counter() - t0, "rss0": rss0, "rss": rss_bytes(),
                "connections": len(self.load.conns)}  # fmt: skip

    async def subscribe(self, topics: list[str], batch: bool = False, after: int = 0,
                        concurrency: int = 100, timeout_s: float = 60.0) -> dict[str, Any]:  # fmt: skip
        gate = asyncio.Semaphore(concurrency)
        errors: list[str] = []
        t0 = time.perf_counter()

        async def one(i: int, conn: WsConn) -> None:
            kind, _, ident = topics[i % len(topics)].partition(":")
            msg: dict[str, Any] = {"type": "subscribe", f"{kind}_id": ident, "after": after,
                                   "batch": batch, "ref": str(i)}  # fmt: skip
            async with gate:
                conn.send(msg)
                r = await conn.reply(timeout_s)
            if r.get("type") != "subscribed":
                errors.append(json.dumps(r)[:300])
            else:
                conn.cursor = max(conn.cursor, after)

        await asyncio.gather(*(one(i, c) for i, c in enumerate(self.load.conns)))
        return {"seconds": time.perf_counter() - t0, "errors": errors[:5],
                "n_errors": len(errors), "rss": rss_bytes()}  # fmt: skip

    async def arm(self, target: int, timeout_s: float = 120.0) -> dict[str, Any]:
        load = self.load
        load.arm(target)
        emit({"ok": True, "armed": True})
        timed_out = False
        try:
            async with asyncio.timeout(timeout_s):
                await load.done.wait()
        except TimeoutError:
            timed_out = True
            load.t_last = time.time()
        short = [c.cursor for c in load.conns if c.cursor < target]
        return {"t_first": load.t_first, "t_last": load.t_last, "frames": load.frames,
                "events": load.events, "timed_out": timed_out, "short": len(short),
                "closed": sum(1 for c in load.conns if c.closed)}  # fmt: skip

    def record(self, on: bool = True) -> dict[str, Any]:
        self.load.recording = on
        if on:
            self.load.records = []
        return {}

    def dump(self) -> dict[str, Any]:
        self.load.recording = False
        recs, self.load.records = self.load.records, []
        return {"records": recs}

    async def close_all(self) -> dict[str, Any]:
        for c in self.load.conns:
            c.close()
        self.load.conns = []
        await asyncio.sleep(0.2)
        return {"rss": rss_bytes()}

    def stats(self) -> dict[str, Any]:
        conns = self.load.conns
        closes: dict[str, int] = {}
        for c in conns:
            if c.closed or c.close_info:
                closes[c.close_info or "closed"] = closes.get(c.close_info or "closed", 0) + 1
        return {"t": time.time(), "connections": len(conns),
                "closed": sum(1 for c in conns if c.closed),
                "closes": closes, "frames": sum(c.frames for c in conns),
                "events": sum(c.events for c in conns),
                "min_cursor": min((c.cursor for c in conns), default=0)}  # fmt: skip

    async def ws_replay(self, url: str, token: str, topic: str, last: int,
                        batch: bool = True, timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
        load = Load()
        conn = await open_conn(load, url, token=token, protocol="runlog.v1", hello=True)
        load.conns.append(conn)
        try:
            kind, _, ident = topic.partition(":")
            load.arm(last)
            t0 = time.time()
            conn.send({"type": "subscribe", f"{kind}_id": ident, "after": 0, "batch": batch})
            async with asyncio.timeout(timeout_s):
                await load.done.wait()
            return {"seconds": load.t_last - t0, "frames": conn.frames, "events": conn.events,
                    "closed": conn.close_info}  # fmt: skip
        finally:
            conn.close()

    async def sse_replay(self, url: str, token: str, events: int = 0,
                         timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
        import aiohttp

        headers = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        n = nbytes = 0
        t_last = 0.0
        tail = b""
        async with aiohttp.ClientSession() as http:
            t0 = time.time()
            async with asyncio.timeout(timeout_s), http.get(url, headers=headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"SSE: HTTP {resp.status}: {await resp.text()}")
                async for chunk in resp.content.iter_any():
                    nbytes += len(chunk)
                    data = tail + chunk
                    # One `id:` line per event frame (notices, e.g. a session's
                    # presence, have none); the 4-byte tail catches a marker
                    # split across two reads (and is too short to hold a whole one).
                    k = data.count(b"\nid: ")
                    if k:
                        n += k
                        t_last = time.time()
                    tail = data[-4:]
                    if events and n >= events:
                        break
            t1 = time.time()
        # The stream ends some time after its last event (the server notices the
        # run's end on its own schedule): the replay rate is up to the last event.
        return {"seconds": t_last - t0, "events": n, "bytes": nbytes, "to_eof_s": t1 - t0}

    async def page_replay(self, url: str, token: str, limit: int = 1000,
                          timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
        import aiohttp

        class Page(msgspec.Struct):
            events: list[msgspec.Raw]
            next_after: int
            head: int
            ended: bool

        decode = msgspec.json.Decoder(Page).decode
        headers = {"Authorization": f"Bearer {token}"}
        after = n = pages = nbytes = 0
        async with aiohttp.ClientSession() as http:
            t0 = time.time()
            async with asyncio.timeout(timeout_s):
                while True:
                    async with http.get(url, params={"after": after, "limit": limit},
                                        headers=headers) as resp:  # fmt: skip
                        body = await resp.read()
                        if resp.status != 200:
                            raise RuntimeError(f"page: HTTP {resp.status}: {body[:300]!r}")
                    page = decode(body)
                    pages += 1
                    nbytes += len(body)
                    n += len(page.events)
                    after = page.next_after
                    if not page.events or (page.ended and after >= page.head):
                        break
            t1 = time.time()
        return {"seconds": t1 - t0, "events": n, "pages": pages, "bytes": nbytes}


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main() -> None:
    raise_fd_limit()
    d = Driver()
    handlers: dict[str, Callable[..., Any]] = {
        "connect": d.connect, "subscribe": d.subscribe, "arm": d.arm, "record": d.record,
        "dump": d.dump, "close_all": d.close_all, "stats": d.stats, "ws_replay": d.ws_replay,
        "sse_replay": d.sse_replay, "page_replay": d.page_replay,
        "rss": lambda: {"rss": rss_bytes()},
    }  # fmt: skip
    await serve_commands(handlers)


async def serve_commands(handlers: dict[str, Callable[..., Any]]) -> None:
    """The load process's side of bench/_procs.py: say ready, then answer one
    JSON command a line on stdin (`{"cmd": name, **kwargs}`) with one JSON
    line on stdout, until stdin closes or `quit`."""
    emit({"ok": True, "pid": os.getpid()})
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        req = json.loads(line)
        cmd = req.pop("cmd")
        if cmd == "quit":
            emit({"ok": True})
            return
        try:
            result = handlers[cmd](**req)
            if asyncio.iscoroutine(result):
                result = await result
            emit({"ok": True, **result})
        except Exception as e:
            emit({"ok": False, "error": f"{type(e).__name__}: {e}"})


if __name__ == "__main__":
    if "--uvloop" in sys.argv:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
