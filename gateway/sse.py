"""Server-Sent Events: `GET /v1/runs/{id}/events`, `GET /v1/sessions/{id}/events`
(with `Accept: text/event-stream`), and `POST /v1/sessions/{id}/runs` streaming.

Framing: `id: <cursor>` on every event frame, LF only, a `: hb` comment when
quiet for `sse_heartbeat_s`, `X-Accel-Buffering: no`, no compression. The
cursor comes from `Last-Event-ID` or `?after=` (the larger wins, so a
reconnecting EventSource never goes backwards). A run's stream ends after
`run_end`; asking for a stream of an ended run from its end gets 204, which
tells EventSource not to reconnect.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from broker import errors

from .connection import Connection
from .context import ClientLike, Gateway
from .disconnect import CODES
from .frames import message
from .hub import Member
from .sendq import Item, SendQueue

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}


class SseClient(Connection, ClientLike):
    kind = "sse"

    def __init__(self, gw: Gateway, resp: web.StreamResponse, user: str) -> None:
        s = gw.settings
        super().__init__(
            user, "sse", SendQueue(s.send_queue_max_bytes, s.send_queue_lag_bytes), gw.metrics
        )
        self.gw = gw
        self.resp = resp
        self.member: Member | None = None
        self._done = asyncio.Event()
        self.disconnect_code: str | None = None
        self._last_write = asyncio.get_running_loop().time()

    async def write_frames(self, frames: list[bytes]) -> None:
        await self.resp.write(b"".join(frames))
        self._last_write = asyncio.get_running_loop().time()

    def abort(self, code: str) -> None:
        self.disconnect_code = code
        self._done.set()

    async def _write_items(self, items: list[Item]) -> None:
        await super()._write_items(items)
        if self.member is not None and self.member.ended and self.queue.nbytes == 0:
            self._done.set()  # the run's end is out: finish now, not at the next check

    async def server_disconnect(self, code: str) -> None:
        self.disconnect_code = code
        self._done.set()

    def cursor(self) -> int:
        assert self.member is not None
        return self.sent.get(self.member.topic.key, self.member.after)

    async def serve(self) -> None:
        """Until the run ends, the client leaves, or the server disconnects it."""
        s = self.gw.settings
        loop = asyncio.get_running_loop()
        assert self.member is not None
        while not self._done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._done.wait(), timeout=min(1.0, s.sse_heartbeat_s))
            if self._writer is not None and self._writer.done():
                return  # the client went away (a write failed)
            transport = self.resp._req.transport if self.resp._req else None
            if transport is None or transport.is_closing():
                return
            if self.member.ended and self.queue.nbytes == 0:
                return
            if loop.time() - self._last_write >= s.sse_heartbeat_s and self.queue.nbytes == 0:
                self.queue.put_message(b": hb\n\n")
        code = self.disconnect_code
        if code is not None:
            if code != "slow_consumer":
                await self.flush(2.0)
            self.queue.clear()
            await self.stop_writer()
            d = CODES[code]
            data = message("disconnect", code=code, reconnect=d.reconnect, cursor=self.cursor())
            with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                async with asyncio.timeout(2.0):  # a client that does not read
                    await self.resp.write(b"event: disconnect\ndata: " + data + b"\n\n")


def cursor_from(request: web.Request) -> int:
    """The resume cursor: max of `Last-Event-ID` and `?after=` (0 if neither)."""
    values = [request.headers.get("Last-Event-ID"), request.query.get("after")]
    best = 0
    for v in values:
        if v is None or v == "":
            continue
        if not v.isdigit() or len(v) > 18:
            raise errors.InvalidCursor(f"cursor {v!r} is not a non-negative integer")
        best = max(best, int(v))
    return best


async def stream(
    request: web.Request, gw: Gateway, user: str, kind: str, ident: str, after: int
) -> web.StreamResponse:
    if gw.draining:
        raise errors.StorageError("this gateway is draining", hint="connect to another gateway")
    head, ended = await gw.broker.store.stream_head(
        kind == "run", ident, retry_s=gw.settings.db_retry_s
    )
    if ended and after >= head:
        return web.Response(status=204)
    # Refused before the stream starts, so the client gets a JSON error.
    if after > head:
        raise errors.InvalidCursor(
            f"cursor {after} is past the head ({head})",
            hint="resume from a cursor this stream gave you",
        )
    resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
    client = SseClient(gw, resp, user)
    await resp.prepare(request)
    await resp.write(b"retry: 1000\n: connected\n\n")
    client.member = await gw.hub.join(client, kind, ident, after, "sse")
    try:
        gw.connections.add(client)
        gw.metrics.connections.labels("sse").inc()
        try:
            await client.serve()
        finally:
            gw.connections.discard(client)
            gw.metrics.connections.labels("sse").dec()
        if client.queue.nbytes:
            await client.flush(2.0)
    finally:
        gw.hub.leave(client.member)
        await client.stop_writer()
    try:
        # A client that stopped reading never drains the end of the stream.
        async with asyncio.timeout(2.0):
            await resp.write_eof()
    except (TimeoutError, ConnectionError, RuntimeError):
        if request.transport is not None:
            request.transport.abort()
    return resp
