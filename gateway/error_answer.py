"""The HTTP answer to an error a handler raised, and the request counter.

Used by `app.error_middleware` for every route but `/v1/ws`, and by
`ws.handle_ws` itself for what fails before the upgrade: a middleware that
wraps the WebSocket handler keeps its coroutine frame alive for the whole
connection (~0.3 KiB each, docs/performance.md "idle"), so that route
answers its own errors, the same way.
"""

from __future__ import annotations

import logging
import math

from aiohttp import web

from broker import codes, errors
from broker.store import TRANSIENT_DB_ERRORS, unavailable

from .context import GATEWAY, json_response

log = logging.getLogger("gateway.app")


def answer(request: web.Request, exc: Exception) -> web.Response:
    """The coded JSON error for `exc` (a redirect, status < 400, is raised again)."""
    if isinstance(exc, errors.RunlogError):
        if isinstance(exc, errors.InternalError):
            log.error("internal error on %s: %s", request.path, exc.detail)
        resp = json_response({"error": exc.to_dict()}, exc.http_status)
        retry_after = exc.extra.get("retry_after_s")
        if isinstance(retry_after, int | float):
            resp.headers["Retry-After"] = str(math.ceil(retry_after))
        return resp
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        resp = json_response(
            {"error": codes.body(codes.http_code(exc.status), exc.reason)}, exc.status
        )
        for name, value in exc.headers.items():  # a 405's Allow, for one
            if name.lower() not in ("content-type", "content-length"):
                resp.headers.add(name, value)
        return resp
    if isinstance(exc, ConnectionError) and _client_gone(request):
        # Our write to a client that hung up (aiohttp's ClientConnectionResetError
        # is a ConnectionResetError): its doing, not the store's; nobody reads
        # the answer, and nothing is logged above debug.
        log.debug("%s %s: the client went away", request.method, request.path)
        return _coded("client_gone", "the client went away")
    if isinstance(exc, TRANSIENT_DB_ERRORS):
        # A connection error that got past the store: still the retryable
        # answer, and an outage is not a bug (no traceback).
        log.warning("%s on %s %s: answered storage_unavailable", type(exc).__name__,
                    request.method, request.path)  # fmt: skip
        err = unavailable("the request")
        return json_response({"error": err.to_dict()}, err.http_status)
    log.error("unhandled error on %s %s", request.method, request.path, exc_info=exc)
    return _coded("internal", "internal error")


def _coded(code: str, message: str) -> web.Response:
    status = codes.get(code).http
    assert status is not None, code  # a code of the registry's with an HTTP status
    return json_response({"error": codes.body(code, message)}, status)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def count(request: web.Request, status: int) -> None:
    """One request answered with `status`, by route template (a bounded label set)."""
    gw = request.app.get(GATEWAY)
    if gw is not None:
        info = request.match_info.route.resource
        route = info.canonical if info is not None else "unmatched"
        gw.metrics.requests.labels(route, f"{status // 100}xx").inc()
