"""The worker's small HTTP endpoint: /metrics (Prometheus) and /healthz.

/healthz answers 200 while the worker takes jobs, 503 before it started and
once it drains, so an orchestrator counts it as ready only in between. It
listens before the worker starts, so a busy port (`port_in_use`, one line, not
a traceback) fails the process before it took any job. Port 0 binds a free port
chosen by the kernel (no race with another process); `bound_port` tells which.
Given a socket bound already (by the parent, which chose its port), it serves
on that one.
"""

from __future__ import annotations

import errno
import socket

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from broker import errors

from .worker import Worker

_WORKER = web.AppKey("worker", Worker)


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[_WORKER].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    w = request.app[_WORKER]
    # `metrics` is set by Worker.start(): None means not started yet.
    status = "starting" if w.metrics is None else "draining" if w.draining else "ok"
    return web.json_response(
        {"status": status, "worker_id": w.worker_id, "runs": len(w.active_runs)},
        status=200 if status == "ok" else 503,
    )


async def start_http(
    worker: Worker, host: str, port: int, sock: socket.socket | None = None
) -> web.AppRunner:
    """Serve /metrics and /healthz on `host`:`port` (see `bound_port`), or on
    `sock` when given."""
    app = web.Application()
    app[_WORKER] = worker
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port) if sock is None else web.SockSite(runner, sock)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        if e.errno == errno.EADDRINUSE:
            raise errors.PortInUse(port, "worker metrics", "worker_metrics_port") from e
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The port `start_http` really listens on (the kernel's pick for port 0)."""
    port: int = runner.addresses[0][1]
    return port
