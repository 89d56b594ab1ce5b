"""Server-Sent Events: `GET /v1/runs/{id}/events`, `GET /v1/sessions/{id}/events`
(with `Accept: text/event-stream`), and `POST /v1/sessions/{id}/runs` streaming.

Framing: `id: <cursor>` on every event frame, LF only, a `: hb` comment when
quiet for `sse_heartbeat_s`, `X-Accel-Buffering: no`, no compression. The
cursor comes from `Last-Event-ID` or `?after=` (the larger wins, so a
reconnecting EventSource never goes backwards). A run's stream ends after
`run_end`; asking for a stream of an ended run from its end gets 204, which
tells EventSource not to reconnect. A stream the server ends early (slow
client, drain, storage) ends with `event: disconnect` carrying the code and
the cursor of the last event written, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from broker import errors

from . import _aio, inputs
from .admission import Ticket
from .connection import Connection, State
from .context import Gateway
from .disconnect import CODES
from .frames import message
from .sendq import Item, Mode

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
    "Connection": "keep-alive",
}


class HttpStream(Connection):
    """A connection that is one streamed HTTP response (native SSE, and the
    compat formats' answers): it lives in `hold`, which ends when the
    connection closes or the client goes away, and sends `heartbeat` when the
    stream has been quiet for sse_heartbeat_s."""

    def __init__(
        self, gw: Gateway, request: web.Request, resp: web.StreamResponse, user: str, mode: Mode
    ) -> None:
        super().__init__(gw, user, mode)
        self.request = request
        self.resp = resp
        self._closing = asyncio.Event()
        self._last_write = asyncio.get_running_loop().time()

    def transport(self) -> asyncio.Transport | None:
        return _aio.transport_of(self.request)

    def close(self, code: str | None) -> asyncio.Future[None]:
        self._closing.set()
        return super().close(code)

    def wants_heartbeat(self) -> bool:
        return True

    async def hold(self, heartbeat: bytes | None) -> None:
        """Until the connection closes or the client leaves."""
        s = self.gw.settings
        loop = asyncio.get_running_loop()
        while self.state is State.OPEN:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), timeout=min(1.0, s.sse_heartbeat_s))
            if self.state is not State.OPEN:
                break
            t = self.transport()
            if t is None or t.is_closing():
                self.close(None)  # the client went away
            elif (
                heartbeat is not None
                and self.queue.nbytes == 0
                and loop.time() - self._last_write >= s.sse_heartbeat_s
                and self.wants_heartbeat()
            ):
                self.queue.put_message(heartbeat)
        await self.close(None)  # waits for whichever teardown began


class SseClient(HttpStream):
    kind = "sse"

    def __init__(
        self, gw: Gateway, request: web.Request, resp: web.StreamResponse, user: str
    ) -> None:
        super().__init__(gw, request, resp, user, "sse")
        self._key = ""

    async def send(self, items: list[Item]) -> None:
        for it in items:
            if it.topic is not None:
                self.sent[it.topic] = it.last  # resp.write hands it over before it waits
        await self.resp.write(b"".join(it.render() for it in items))
        self._last_write = asyncio.get_running_loop().time()

    def notice(self, type_: str, **fields: object) -> None:
        # A named event without `id:`: EventSource's last event id (the
        # resume cursor) stays the log's, and `onmessage` never sees it.
        if self.state is State.OPEN:
            data = message(type_, **fields)
            self.queue.put_message(b"event: " + type_.encode() + b"\ndata: " + data + b"\n\n")

    def after_written(self) -> None:
        member = self.members.get(self._key)
        if member is not None and member.ended and self.queue.nbytes == 0:
            self.close(None)  # the run's end is out: finish now

    async def goodbye(self, code: str | None, cursors: dict[str, int]) -> None:
        if code is not None:
            d = CODES[code]
            self.resp.force_close()  # the client reconnects with a new request
            data = message("disconnect", code=code, reconnect=d.reconnect,
                           cursor=cursors.get(self._key, 0))  # fmt: skip
            await self.resp.write(b"event: disconnect\ndata: " + data + b"\n\n")
        await self.resp.write_eof()
        if code is None:
            self.spare_transport()  # a clean end: the connection may serve another request

    async def serve(self, key: str) -> None:
        """Until the run ends, the client leaves, or the server ends the stream."""
        self._key = key
        await self.hold(b": hb\n\n")


def request_cursors(request: web.Request) -> list[int]:
    """The cursors a request names in `Last-Event-ID` and `?after=` (each
    ASCII digits, else InvalidCursor); empty if it names none."""
    found = []
    for v in (request.headers.get("Last-Event-ID"), request.query.get("after")):
        if v is None or v == "":
            continue
        n = inputs.parse_count(v)
        if n is None:
            raise errors.InvalidCursor(
                f"cursor {v[:40]!r} is not a non-negative integer in ASCII digits"
            )
        found.append(n)
    return found


def cursor_from(request: web.Request) -> int:
    """The resume cursor: max of `Last-Event-ID` and `?after=` (0 if neither)."""
    return max(request_cursors(request), default=0)


async def stream(
    request: web.Request, gw: Gateway, user: str, kind: str, ident: str, after: int,
    *, issued_at: float = 0.0,
) -> web.StreamResponse:  # fmt: skip
    """`issued_at`: the `iat` of the token it was opened with (0: any
    revocation of the user ends it)."""
    if gw.draining:
        raise errors.ServerDraining("this gateway is draining", hint="connect to another gateway")
    # Past a cap: 429 with the JSON error (and Retry-After), before anything is read.
    ticket = gw.admission.admit(gw.admission.client_ip(request), user)
    try:
        return await _stream(request, gw, user, kind, ident, after, ticket, issued_at)
    finally:
        ticket.release()  # a no-op once the stream's connection released it when CLOSED


async def _stream(
    request: web.Request, gw: Gateway, user: str, kind: str, ident: str, after: int,
    ticket: Ticket, issued_at: float,
) -> web.StreamResponse:  # fmt: skip
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
    await resp.prepare(request)
    await resp.write(b"retry: 1000\n: connected\n\n")
    client = SseClient(gw, request, resp, user)
    client.issued_at = issued_at
    client.ticket = ticket
    key = f"{kind}:{ident}"
    try:
        try:
            member = await gw.hub.join(client, kind, ident, after, "sse")
        except errors.RunlogError as e:
            # The stream has begun: the reason goes in it, not in a status.
            await client.close("storage_unavailable" if e.retryable else "internal")
            return resp
        if client.attach(key, member):
            await client.serve(key)
    finally:
        await client.close(None)
    return resp
