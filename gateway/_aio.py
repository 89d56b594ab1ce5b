"""The one place that touches aiohttp beyond its public API, and what it relies on.

The gateway writes pre-built WebSocket frames straight to the transport (one
write per batch, shared bytes, exact cursors), so it needs aiohttp's flow
control for that transport: `BaseProtocol._drain_helper`, which waits until
the transport's buffer is below its low-water mark. aiohttp shares one
future between every task that waits there, so a task waiting in it must
never be cancelled (the next waiter would get a bare CancelledError): the
gateway stops a blocked writer by aborting the transport instead.

A request aiohttp's own HTTP parser refuses (an over-long URL or header, a bad
Content-Length or chunk size, an invalid method) never reaches the app or its
middleware: `RequestHandler.handle_error` answers it, in plain text echoing
the bytes, and logs a traceback. aiohttp has no hook for that (aio-libs/aiohttp
#3287), so `AppRunner` gives every connection a `RequestHandler` whose
`handle_error` answers in runlog's error contract and logs one line. It gets
there by `AppRunner._make_server` (the `Server` aiohttp builds for the app) and
that `Server`'s `_loop` and `_kwargs`, which its `__call__` uses to build a
handler per connection.

The gateway's WebSocket heartbeat (heartbeat.py) needs to know that bytes
came in on an upgraded connection, which is what aiohttp's own heartbeat
learns through the `data_received_cb` its `WebSocketResponse` gives
`RequestHandler.set_parser`: with `heartbeat=None` it gives none, and
`on_data_received` sets the handler's `_data_received_cb` slot afterwards.

Each private name used here is a `Guard` below, checked when this module is
imported (broker/contract.py), and has a contract test against a real
server (tests/test_dependency_contracts.py).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

import msgspec
from aiohttp import http_exceptions, web
from aiohttp.base_protocol import BaseProtocol

from broker import codes, errors
from broker.contract import Guard, check, incompatible, params, uses

# The aiohttp release these names were read from: the pin in pyproject.toml
# (aiohttp~=TESTED) and the version the contract tests ran against.
TESTED = "3.14.5"

GUARDS = (
    Guard(
        "BaseProtocol._drain_helper",
        "a coroutine method (self) waiting until the transport takes writes",
        lambda: (
            inspect.iscoroutinefunction(BaseProtocol._drain_helper)
            and params(BaseProtocol._drain_helper) == ["self"]
        ),
    ),
    Guard(
        "AppRunner._make_server",
        "a coroutine method (self) building the Server, called by BaseRunner.setup",
        lambda: (
            inspect.iscoroutinefunction(web.AppRunner._make_server)
            and params(web.AppRunner._make_server) == ["self"]
            and uses(web.BaseRunner.setup, "_make_server")
        ),
    ),
    Guard(
        "Server._loop and Server._kwargs",
        "set by Server.__init__, passed by Server.__call__ to RequestHandler(self, loop=...)",
        lambda: (
            uses(web.Server.__init__, "_loop", "_kwargs")
            and uses(web.Server.__call__, "_loop", "_kwargs", "RequestHandler")
            and params(web.RequestHandler.__init__)[:3] == ["self", "manager", "loop"]
        ),
    ),
    Guard(
        "RequestHandler._data_received_cb",
        "a slot called by RequestHandler.data_received for an upgraded connection's bytes",
        lambda: (
            "_data_received_cb" in web.RequestHandler.__slots__
            and uses(web.RequestHandler.data_received, "_data_received_cb")
        ),
    ),
    Guard(
        "RequestHandler.handle_error",
        "(self, request, status, exc, message), answering the parser's refusals",
        lambda: (
            params(web.RequestHandler.handle_error)
            == ["self", "request", "status", "exc", "message"]
        ),
    ),
)
check("aiohttp", TESTED, GUARDS)

log = logging.getLogger("gateway.http")

# What the `Server` header says: no versions to look up vulnerabilities by.
SERVER = "runlog"

# Limits of aiohttp's parser. They differ so that a LineTooLong tells by its
# limit which it was: the request line (414) or a header field (431).
MAX_REQUEST_LINE_BYTES = 8190
MAX_HEADER_FIELD_BYTES = 8192

# The parser's refusals that have a more precise message than "malformed".
_MESSAGES: tuple[tuple[type[Exception], str], ...] = (
    (http_exceptions.BadHttpMethod, "invalid HTTP method"),
    (http_exceptions.InvalidURLError, "invalid URL"),
    (http_exceptions.BadStatusLine, "invalid request line"),
    (http_exceptions.InvalidHeader, "invalid header"),
    (http_exceptions.ContentLengthError, "the body is shorter than its Content-Length"),
    (http_exceptions.TransferEncodingError, "invalid chunked body"),
)


def refusal(exc: http_exceptions.HttpProcessingError) -> errors.ClientError:
    """The coded error for a request aiohttp's parser refused. Its message
    never echoes the request's bytes."""
    if isinstance(exc, http_exceptions.LineTooLong):
        if exc.args[1] == MAX_HEADER_FIELD_BYTES:
            return errors.HeadersTooLarge(f"a header is longer than {MAX_HEADER_FIELD_BYTES} bytes")
        return errors.UriTooLong(f"the request line is longer than {MAX_REQUEST_LINE_BYTES} bytes")
    for cls, message in _MESSAGES:
        if isinstance(exc, cls):
            return errors.ClientError(message)
    return errors.ClientError("malformed HTTP request")


class _RequestHandler(web.RequestHandler):
    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if isinstance(exc, http_exceptions.HttpProcessingError):
            err = refusal(exc)
            # The client's fault: one line, no traceback, no bytes of theirs.
            log.info("refused a request from %s: %s (%s)", request.remote, err.code, err.detail)
            body, status = err.to_dict(), err.http_status
        else:
            # An error that got past the app's middleware: a bug (answered as
            # the middleware answers one).
            log.error("unhandled error on a request from %s", request.remote, exc_info=exc)
            body = codes.body("internal", "internal error")
            status = errors.InternalError.http_status
        if request.writer.output_size > 0:
            raise ConnectionError("a response was sent already: cannot send the error")
        resp = web.Response(
            body=msgspec.json.encode({"error": body}),
            status=status,
            content_type="application/json",
            headers={"Server": SERVER},
        )
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _RequestHandler(self, loop=self._loop, **self._kwargs)


class AppRunner(web.AppRunner):
    """`web.AppRunner` whose connections answer aiohttp's own refusals as the
    app answers errors: `{"error": {"code", "message", "retryable"}}`."""

    def __init__(self, app: web.Application, **kwargs: object) -> None:
        kwargs["max_line_size"] = MAX_REQUEST_LINE_BYTES
        kwargs["max_field_size"] = MAX_HEADER_FIELD_BYTES
        super().__init__(app, **kwargs)  # type: ignore[arg-type]

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        if type(server) is not web.Server:  # the class _Server stands in for
            raise incompatible(
                "aiohttp", TESTED, "AppRunner._make_server", "returning a web.Server"
            )
        server.__class__ = _Server
        return server


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


def on_data_received(request: web.BaseRequest, cb: Callable[[], None]) -> None:
    """Call `cb` (no arguments) whenever bytes arrive on this upgraded
    connection, before they are parsed (as aiohttp's heartbeat is told)."""
    protocol = request.protocol
    assert isinstance(protocol, web.RequestHandler)
    protocol._data_received_cb = cb


def check_uncompressed(ws: web.WebSocketResponse) -> None:
    """Pre-built frames carry no RSV1 bit: the socket must not have
    negotiated permessage-deflate (the gateway never offers it)."""
    if ws.compress:
        raise AssertionError("pre-built frames need a WebSocket without compression")
