"""The one place that touches aiohttp beyond its public API, and what it relies on.

The gateway writes pre-built WebSocket frames straight to the transport (one
write per batch, shared bytes, exact cursors), so it needs aiohttp's flow
control for that transport: `BaseProtocol._drain_helper`, which waits until
the transport's buffer is below its low-water mark. aiohttp shares one
future between every task that waits there, so a task waiting in it must
never be cancelled (the next waiter would get a bare CancelledError): the
gateway stops a blocked writer by aborting the transport instead.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.base_protocol import BaseProtocol

assert callable(getattr(BaseProtocol, "_drain_helper", None)), "aiohttp changed its flow control"


def transport_of(request: web.BaseRequest) -> asyncio.Transport | None:
    t = request.transport
    return t if isinstance(t, asyncio.Transport) else None


async def drained(request: web.BaseRequest) -> None:
    """Wait until the connection's transport takes writes again. Raises
    ConnectionResetError once the connection is lost (or aborted)."""
    protocol = request.protocol
    assert isinstance(protocol, BaseProtocol)
    if protocol.writing_paused:
        await protocol._drain_helper()
    elif protocol.transport is None:
        raise ConnectionResetError("connection lost")


def check_uncompressed(ws: web.WebSocketResponse) -> None:
    """Pre-built frames carry no RSV1 bit: the socket must not have
    negotiated permessage-deflate (the gateway never offers it)."""
    if ws.compress:
        raise AssertionError("pre-built frames need a WebSocket without compression")
