"""`runlog gateway`: serve the app until SIGTERM/SIGINT, then drain.

A port already in use is `port_in_use` (one line, exit 2), not a traceback;
so is the public default jwt_secret (or an empty one) on an address other
than loopback (`insecure_secret`).

gateway_port 0: the gateway binds a free port before anything else (held from
then on, so nothing else can take it) and serves as if it had been given that
one: its own origin, the console's URL and the `gateway listening on` line
name it.

With gateway_reuse_port the client port is bound with SO_REUSEPORT, shared
with the other processes of a group (`runlog gateway --processes N`,
runlog/group.py); with gateway_metrics_port this process also serves its own
/metrics, /healthz and /readyz there, which the shared port cannot (a request
to it reaches any process of the group): on the socket it inherited when
gateway_metrics_fd is set (its parent bound the port), else binding it.

Drain: stop accepting connections, tell every client to resume elsewhere
(code `server_draining` with its cursors), wait for them to go (at most
`gateway_drain_s`), close.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
import signal
import socket

from aiohttp import web

from broker import errors
from broker.settings import Settings
from broker.sockets import bind_free_port

from . import auth, issuers
from ._aio import AppRunner
from .app import build_app, build_ops_app
from .context import GATEWAY

log = logging.getLogger("runlog.gateway")


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    auth.check_secret(settings)
    issuers.check(settings)
    with contextlib.ExitStack() as held:
        sock = None
        if not settings.gateway_port:
            sock = held.enter_context(
                bind_free_port(settings.gateway_host, reuse_port=settings.gateway_reuse_port)
            )
            settings = dataclasses.replace(settings, gateway_port=sock.getsockname()[1])
        await _serve(settings, stop, sock)


async def _serve(settings: Settings, stop: asyncio.Event, sock: socket.socket | None) -> None:
    """Serve on gateway_port, or on `sock` (bound to it already) when given."""
    app = build_app(settings)
    runner = AppRunner(
        app, handle_signals=False, shutdown_timeout=settings.gateway_drain_s, access_log=None
    )
    await runner.setup()  # connects the broker: a process joins a shared port once it can serve
    ops: web.AppRunner | None = None
    try:
        site = await _listen(runner, settings, sock)
        if settings.gateway_metrics_port:  # after: its /readyz says the shared port is bound
            ops = await _start_ops(app, settings)
    except BaseException:
        if ops is not None:
            await ops.cleanup()
        await runner.cleanup()
        raise
    freeze_startup_heap()
    shared = " (shared: SO_REUSEPORT)" if settings.gateway_reuse_port else ""
    own = f", metrics port {settings.gateway_metrics_port}" if ops is not None else ""
    log.info("gateway listening on http://%s:%s%s%s", settings.gateway_host,
             settings.gateway_port, shared, own)  # fmt: skip
    try:
        await stop.wait()
    finally:
        log.info("gateway draining")
        await site.stop()
        gw = app.get(GATEWAY)
        if gw is not None:
            try:
                async with asyncio.timeout(settings.gateway_drain_s):
                    await gw.drain()
            except TimeoutError:
                log.warning("drain took longer than %.1fs", settings.gateway_drain_s)
        await runner.cleanup()
        if ops is not None:  # last: /readyz says 503 (draining) until the end
            await ops.cleanup()
        log.info("gateway stopped")


async def _listen(
    runner: web.AppRunner, settings: Settings, sock: socket.socket | None
) -> web.BaseSite:
    """The client port, shared with the other processes of a group (SO_REUSEPORT:
    the kernel spreads new connections over every socket bound to it)."""
    site: web.BaseSite
    if sock is not None:
        # As asyncio sets it on the sockets it binds: the connections accepted
        # carry it, so that a later process can bind this port again while some
        # are in TIME_WAIT. Not before: until it listens, it would let others bind.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        site = web.SockSite(runner, sock)
    else:
        site = web.TCPSite(runner, settings.gateway_host, settings.gateway_port,
                           reuse_port=settings.gateway_reuse_port or None)  # fmt: skip
    try:
        await site.start()
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise errors.PortInUse(settings.gateway_port, "gateway", "gateway_port") from e
        raise
    return site


async def _start_ops(app: web.Application, settings: Settings) -> web.AppRunner:
    """This process's /metrics, /healthz and /readyz on gateway_metrics_port: on
    the socket inherited as gateway_metrics_fd (bound to it by the parent), else
    binding the port."""
    ops = web.AppRunner(build_ops_app(app), handle_signals=False, access_log=None)
    await ops.setup()
    site: web.BaseSite
    if settings.gateway_metrics_fd >= 0:
        site = web.SockSite(ops, socket.socket(fileno=settings.gateway_metrics_fd))
    else:
        site = web.TCPSite(ops, settings.gateway_host, settings.gateway_metrics_port)
    try:
        await site.start()
    except OSError as e:
        await ops.cleanup()
        if e.errno == errno.EADDRINUSE:
            port = settings.gateway_metrics_port
            raise errors.PortInUse(port, "gateway metrics", "gateway_metrics_port") from e
        raise
    return ops


def freeze_startup_heap() -> None:
    """Move every object alive now (modules, the app, its pools: they live as
    long as the process) out of the garbage collector's sight. A full
    collection walks every tracked object, and under a replay flood one ran
    several times a second: with the ~50k startup objects frozen each walks
    only what came since (bench flood: ~25 ms a pause → ~5 ms)."""
    gc.collect()  # what is garbage already is freed, not frozen
    gc.freeze()


async def run(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await serve(settings, stop)
