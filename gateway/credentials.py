"""Where a request's bearer token may come from.

`Authorization: Bearer <token>` everywhere. `?access_token=<token>` only where
a browser cannot set that header: an EventSource (a GET of an events endpoint
with `Accept: text/event-stream`) and the WebSocket upgrade (`GET /v1/ws`,
which also takes the `bearer.<token>` subprotocol or a first `auth` message,
see ws.py). A token in a URL ends up in access logs, proxies and browser
history, and a link must never be able to change anything: anywhere else a
query token is refused with 401 `unauthorized` — not ignored, so a client that
sends one learns at once instead of failing some other way.

On the LangGraph routes only (compat/langgraph_http.py), LangGraph's own
`x-api-key: <token>` is a bearer token too, when no Authorization header is
sent: both of its SDKs send their API key there.

`refuse_misplaced_query_token` applies the rule to every route, including
ones that need no token and ones added later; `token_of` reads the token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from broker import errors

from . import auth, issuers

QUERY_PARAM = "access_token"
API_KEY_HEADER = "x-api-key"  # LangGraph's

# Routes (templates) that may take the token in the query, on a GET.
_STREAM_ROUTES = frozenset({"/v1/runs/{run_id}/events", "/v1/sessions/{session_id}/events"})
_WS_ROUTE = "/v1/ws"


def query_token_allowed(request: web.Request) -> bool:
    if request.method != "GET":
        return False
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else ""
    if route == _WS_ROUTE:
        return True
    return route in _STREAM_ROUTES and "text/event-stream" in request.headers.get("Accept", "")


def check_query_token(request: web.Request) -> None:
    if QUERY_PARAM in request.query and not query_token_allowed(request):
        raise errors.Unauthorized(
            f"?{QUERY_PARAM}= is accepted only on SSE streams (GET with Accept: "
            "text/event-stream) and the WebSocket upgrade",
            hint="send the token in an 'Authorization: Bearer <token>' header",
        )


def token_of(request: web.Request, *, api_key: bool = False) -> str | None:
    """The bearer token of the request: the header's, else the query's where
    that is allowed (elsewhere a query token is Unauthorized). With `api_key`
    (the LangGraph routes), `x-api-key` when no Authorization header is sent."""
    check_query_token(request)
    header = request.headers.get("Authorization")
    if api_key and not header and (key := request.headers.get(API_KEY_HEADER)):
        return key
    return auth.bearer(header) or request.query.get(QUERY_PARAM)


@web.middleware
def refuse_misplaced_query_token(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> Awaitable[web.StreamResponse]:
    # A plain function (no frame kept alive while a WebSocket lasts); what it
    # raises reaches error_middleware's try, which is outside it.
    check_query_token(request)
    wait = _keys_wait(request)
    return handler(request) if wait is None else _after(wait, handler, request)


def _keys_wait(request: web.Request) -> Awaitable[None] | None:
    """The JWKS fetch to await before the handler verifies the request's token
    (one that names a kid its trusted issuer has not published yet, see
    issuers.py); None for nearly every request. The WebSocket upgrade waits in
    ws.py, so that no frame of this middleware lives as long as the socket."""
    verifier = request.app.get(issuers.ISSUERS)
    if verifier is None or not verifier.names:
        return None
    resource = request.match_info.route.resource
    if resource is not None and resource.canonical == _WS_ROUTE:
        return None
    header = request.headers.get("Authorization")
    token = auth.bearer(header) or request.query.get(QUERY_PARAM)
    if not header and not token:
        token = request.headers.get(API_KEY_HEADER)
    return verifier.keys_ready(token) if token else None


async def _after(
    wait: Awaitable[None], handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    request: web.Request,
) -> web.StreamResponse:  # fmt: skip
    await wait
    return await handler(request)
