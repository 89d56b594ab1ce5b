"""`runlog worker`: one worker process, until SIGTERM/SIGINT, then drain.

Every worker serves /metrics and /healthz (workers/http.py): on
`worker_metrics_port`, or, when that is 0 (the default), on a free port the
kernel picks, printed on the `ready` line so whoever started it can scrape it;
or on the socket it inherited as `worker_metrics_fd` (`runlog up` bound it).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys

from aiohttp import web
from prometheus_client import CollectorRegistry

from broker import errors
from broker.runtime import Broker
from broker.settings import Settings

from .http import bound_port, start_http
from .worker import Worker

log = logging.getLogger("runlog.worker")


async def serve(settings: Settings, stop: asyncio.Event, *, concurrency: int | None = None) -> None:
    """Run a worker until `stop` is set, then drain it and disconnect."""
    if not settings.nats_url or not settings.database_url:
        raise errors.ClientError(
            "RUNLOG_NATS_URL and RUNLOG_DATABASE_URL must be set for `runlog worker`",
            hint="`runlog up` runs an embedded stack with a worker",
        )
    registry = CollectorRegistry()
    broker = await Broker.connect(settings, registry=registry, name="runlog-worker")
    worker = Worker(broker, settings, concurrency=concurrency, registry=registry)
    runner: web.AppRunner | None = None
    try:
        fd = settings.worker_metrics_fd
        sock = socket.socket(fileno=fd) if fd >= 0 else None
        runner = await start_http(worker, settings.gateway_host, settings.worker_metrics_port, sock)
        await worker.start()
        url = f"http://{settings.gateway_host}:{bound_port(runner)}/metrics"
        sys.stdout.write(f"runlog worker {worker.worker_id} ready; metrics {url}\n")  # one write(2)
        sys.stdout.flush()
        await stop.wait()
        log.info("stopping: draining")
    finally:
        await worker.close()
        if runner is not None:
            await runner.cleanup()
        await broker.close()
