"""The aiohttp application: routes, error middleware, health, metrics.

`build_app` does no I/O; the broker connection is made in a cleanup context
(or passed in, for tests and for `runlog up`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from broker.runtime import Broker
from broker.settings import Settings

from . import _aio, auth, console, credentials, error_answer, issuers, openapi, rest, ws
from .compat import agentui_http, agui_http, aisdk_http, langgraph_http, openai_http, sim_http
from .context import GATEWAY, Gateway, json_response
from .metrics import GatewayMetrics

log = logging.getLogger(__name__)

REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry", CollectorRegistry)
STATIC_DIR = Path(__file__).parent / "static"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# The middlewares are plain functions that return the next handler's
# awaitable where they let a request through: an `async def` middleware's
# frame would stay alive as long as a WebSocket (~0.3 KiB each at 10k idle
# connections). `/v1/ws` answers its own errors (ws.handle_ws).


@web.middleware
def error_middleware(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    if ws.is_ws_route(request):
        return handler(request)
    return _answered(request, handler)


async def _answered(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        resp = await handler(request)
    except Exception as e:
        resp = error_answer.answer(request, e)
    error_answer.count(request, resp.status)
    return resp


# Cross-origin REST and SSE for the Origins allowed to open WebSockets (a
# console served by one gateway fails over to another). Bearer tokens, no
# cookies: no credentialed CORS is needed.
_CORS_PREFLIGHT = {
    "Access-Control-Allow-Methods": "GET, POST, PATCH, DELETE",
    "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept, Last-Event-ID, "
    "X-Sim-Stream-Protocol",
    "Access-Control-Max-Age": "600",
}


def _cors_origin(request: web.Request) -> str | None:
    origin = request.headers.get("Origin")
    if origin is None or not request.path.startswith("/v1/") or GATEWAY not in request.app:
        return None
    gw = request.app[GATEWAY]
    return origin if auth.origin_allowed(gw.settings, origin, gw.own_origins) else None


@web.middleware
def cors_preflight(request: web.Request, handler: Handler) -> Awaitable[web.StreamResponse]:
    if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
        return _preflight(request)
    return handler(request)


async def _preflight(request: web.Request) -> web.StreamResponse:
    origin = _cors_origin(request)
    if origin is None:
        return web.Response(status=403)
    return web.Response(status=204, headers={"Access-Control-Allow-Origin": origin,
                                             "Vary": "Origin", **_CORS_PREFLIGHT})  # fmt: skip


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = _aio.SERVER


async def _cors_headers(request: web.Request, response: web.StreamResponse) -> None:
    origin = _cors_origin(request)
    if origin is not None:
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers.add("Vary", "Origin")


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    checks = {"nats": gw.broker.bus.nc.is_connected, "postgres": False, "draining": gw.draining}
    checks["postgres"] = await gw.broker.store.ping(timeout_s=2)
    ok = checks["nats"] and checks["postgres"] and not gw.draining
    return json_response({"ready": ok, **checks}, 200 if ok else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi_doc(request: web.Request) -> web.Response:
    return json_response(openapi.document(request.app[GATEWAY].settings))


async def index(request: web.Request) -> web.StreamResponse:
    page = STATIC_DIR / "index.html"
    if page.exists():
        csp = request.app[console.CONSOLE].csp  # connects to the listed gateways only
        return web.FileResponse(page, headers={"Content-Security-Policy": csp})
    return web.Response(text="runlog gateway\n", content_type="text/plain")


def build_app(
    settings: Settings,
    *,
    broker: Broker | None = None,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    """The gateway app. Without `broker`, it connects one at startup."""
    registry = registry if registry is not None else CollectorRegistry()
    app = web.Application(
        middlewares=[cors_preflight, error_middleware, credentials.refuse_misplaced_query_token],
        client_max_size=settings.max_message_bytes,
    )
    app[REGISTRY] = registry
    app[console.CONSOLE] = console.ConsoleConfig.from_settings(settings)
    app.on_response_prepare.append(_cors_headers)
    app.on_response_prepare.append(_server_header)

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        own = broker is None
        b = broker or await Broker.connect(settings, registry=registry, name="runlog-gateway")
        gw = Gateway(b, settings, GatewayMetrics(registry))
        app[GATEWAY] = gw
        app[issuers.ISSUERS] = gw.issuers  # credentials' middleware: fresh keys before a handler
        try:
            await gw.start()
            yield
        finally:
            await gw.drain()
            await gw.close()
            if own:
                await b.close()

    app.cleanup_ctx.append(lifecycle)
    r = app.router
    r.add_get("/", index)
    r.add_get("/healthz", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/metrics", metrics)
    r.add_get("/v1/openapi.json", openapi_doc)
    r.add_get("/v1/config", console.config)
    r.add_get("/v1/ws", ws.handle_ws)
    r.add_post("/v1/sessions", rest.create_session)
    r.add_get("/v1/sessions", rest.list_sessions)
    r.add_get("/v1/sessions/{session_id}", rest.get_session)
    r.add_patch("/v1/sessions/{session_id}", rest.update_session)
    r.add_post("/v1/sessions/{session_id}/members", rest.add_member)
    r.add_patch("/v1/sessions/{session_id}/members/{user_id}", rest.set_member_role)
    r.add_delete("/v1/sessions/{session_id}/members/{user_id}", rest.remove_member)
    r.add_post("/v1/sessions/{session_id}/runs", rest.start_run)
    r.add_get("/v1/sessions/{session_id}/events", rest.session_events)
    r.add_get("/v1/runs/{run_id}", rest.get_run)
    r.add_get("/v1/runs/{run_id}/events", rest.run_events)
    r.add_post("/v1/runs/{run_id}/interrupt", rest.interrupt)
    r.add_post("/v1/runs/{run_id}/approvals/{approval_id}", rest.decide_approval)
    langgraph_http.routes(app)
    agui_http.routes(app)
    openai_http.routes(app)
    aisdk_http.routes(app)
    sim_http.routes(app)
    agentui_http.routes(app)
    if STATIC_DIR.is_dir():
        r.add_static("/static/", STATIC_DIR)
    return app


def build_ops_app(app: web.Application) -> web.Application:
    """This process's /metrics, /healthz and /readyz alone, for its own port
    (gateway_metrics_port): on a port several processes share, a request
    reaches any one of them. Build it once `app` has started (its gateway is
    in it); the answers are those of `app`'s routes."""
    ops = web.Application()
    ops[REGISTRY] = app[REGISTRY]
    ops[GATEWAY] = app[GATEWAY]
    ops.on_response_prepare.append(_server_header)
    ops.router.add_get("/healthz", healthz)
    ops.router.add_get("/readyz", readyz)
    ops.router.add_get("/metrics", metrics)
    return ops
