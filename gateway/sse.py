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
from collections.abc import Iterator, Mapping

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
    """A connection that is one streamed HTTP response: native SSE, and the
    compat formats' answers (compat/serve.py). Its life, shared by both:

    - `admitted` and `refuse_if_draining` before the response starts (the
      client still gets a JSON error and a status); `begin` starts it with
      its opening bytes; the connection is made only then.
    - `follow`: the hub follows the stream's topic for it from a cursor and
      it lives in `hold` until it closes or the client goes away, with
      `heartbeat` sent when the stream has been quiet for sse_heartbeat_s
      (and `wants_heartbeat`). A storage failure while joining ends the
      begun body with its code. Whatever ends it, its one teardown runs.
    - `write` is the only way the writer puts bytes in the body: nothing is
      written once the goodbye began. The goodbye ends the body: with a
      code, `farewell`'s bytes first (native SSE: `event: disconnect`) and
      the connection closed (the client reconnects with a new request);
      without, the socket may serve another request.
    """

    heartbeat: bytes | None = None  # sent when quiet; None: never

    def __init__(
        self, gw: Gateway, request: web.Request, resp: web.StreamResponse, user: str, mode: Mode,
        *, ticket: Ticket, issued_at: float,
    ) -> None:  # fmt: skip
        super().__init__(gw, user, mode)
        self.request = request
        self.resp = resp
        self.ticket = ticket
        self.issued_at = issued_at
        self.key = ""  # the topic it follows
        self._closing = asyncio.Event()
        self._eof = False  # the goodbye began: nothing more is written
        self._last_write = asyncio.get_running_loop().time()

    def transport(self) -> asyncio.Transport | None:
        return _aio.transport_of(self.request)

    def close(self, code: str | None) -> asyncio.Future[None]:
        self._closing.set()
        return super().close(code)

    def wants_heartbeat(self) -> bool:
        return True

    async def write(self, data: bytes) -> None:
        if self._eof:
            return  # the teardown ended the body: the client resumes from what it has
        await self.resp.write(data)
        self._last_write = asyncio.get_running_loop().time()

    def farewell(self, code: str, cursors: dict[str, int]) -> bytes:
        """What the body ends with when the server ends it with `code`."""
        return b""

    async def goodbye(self, code: str | None, cursors: dict[str, int]) -> None:
        self._eof = True
        if code is not None:
            self.resp.force_close()  # the client reconnects with a new request
            last = self.farewell(code, cursors)
            if last:
                await self.resp.write(last)
        await self.resp.write_eof()
        if code is None:
            self.spare_transport()  # a clean end: the connection may serve another request

    async def follow(self, kind: str, ident: str, after: int) -> None:
        """Until the stream ends, the client leaves, or the server ends it."""
        self.key = f"{kind}:{ident}"
        try:
            try:
                member = await self.gw.hub.join(self, kind, ident, after, self.mode)
            except errors.RunlogError as e:
                # The body has begun: the reason goes in it, not in a status.
                await self.close("storage_unavailable" if e.retryable else "internal")
                return
            if self.attach(self.key, member):
                await self.hold()
        finally:
            await self.close(None)

    async def hold(self) -> None:
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
                self.heartbeat is not None
                and self.queue.nbytes == 0
                and loop.time() - self._last_write >= s.sse_heartbeat_s
                and self.wants_heartbeat()
            ):
                self.queue.put_message(self.heartbeat)
        await self.close(None)  # waits for whichever teardown began


def refuse_if_draining(gw: Gateway) -> None:
    if gw.draining:
        raise errors.ServerDraining("this gateway is draining", hint="connect to another gateway")


@contextlib.contextmanager
def admitted(gw: Gateway, request: web.Request, user: str) -> Iterator[Ticket]:
    """The stream's place in the connection caps: past one, 429 with the JSON
    error (and Retry-After), before anything is read. Released when its
    connection is CLOSED, or on leaving this block if none was made (a no-op
    after the first)."""
    ticket = gw.admission.admit(gw.admission.client_ip(request), user)
    try:
        yield ticket
    finally:
        ticket.release()


async def begin(
    request: web.Request, headers: Mapping[str, str], opening: bytes
) -> web.StreamResponse:
    """Start the streamed response: its status and headers, then `opening`."""
    resp = web.StreamResponse(status=200, headers=headers)
    await resp.prepare(request)
    await resp.write(opening)
    return resp


class SseClient(HttpStream):
    kind = "sse"
    heartbeat = b": hb\n\n"

    async def send(self, items: list[Item]) -> None:
        for it in items:
            if it.topic is not None:
                self.sent[it.topic] = it.last  # resp.write hands it over before it waits
        await self.write(b"".join(it.render() for it in items))

    def notice(self, type_: str, **fields: object) -> None:
        # A named event without `id:`: EventSource's last event id (the
        # resume cursor) stays the log's, and `onmessage` never sees it.
        if self.state is State.OPEN:
            data = message(type_, **fields)
            self.queue.put_message(b"event: " + type_.encode() + b"\ndata: " + data + b"\n\n")

    def after_written(self) -> None:
        member = self.members.get(self.key)
        if member is not None and member.ended and self.queue.nbytes == 0:
            self.close(None)  # the run's end is out: finish now

    def farewell(self, code: str, cursors: dict[str, int]) -> bytes:
        d = CODES[code]
        data = message("disconnect", code=code, reconnect=d.reconnect,
                       cursor=cursors.get(self.key, 0))  # fmt: skip
        return b"event: disconnect\ndata: " + data + b"\n\n"


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
    refuse_if_draining(gw)
    with admitted(gw, request, user) as ticket:
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
        resp = await begin(request, SSE_HEADERS, b"retry: 1000\n: connected\n\n")
        client = SseClient(gw, request, resp, user, "sse", ticket=ticket, issued_at=issued_at)
        await client.follow(kind, ident, after)
        return resp
