"""The worker's small HTTP endpoint: /metrics (Prometheus) and /healthz.

/healthz answers 200 while the worker takes jobs and 503 once it drains, so
an orchestrator stops counting it as ready.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .worker import Worker

_WORKER = web.AppKey("worker", Worker)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[_WORKER].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    w = request.app[_WORKER]
    status = "draining" if w.draining else "ok"
    return web.json_response(
        {"status": status, "worker_id": w.worker_id, "runs": len(w.active_runs)},
        status=503 if w.draining else 200,
    )


async def start_http(worker: Worker, host: str, port: int) -> web.AppRunner:
    app = web.Application()
    app[_WORKER] = worker
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
