"""`runlog gateway --processes N`: N gateway processes sharing one port, supervised.

Each child is a whole gateway (`runlog gateway` with gateway_reuse_port:
console, REST, WebSocket, SSE, compat routes) bound to the same gateway_port
with SO_REUSEPORT. The kernel hashes each new connection (its addresses and
ports) to one of the sockets bound there: connections spread evenly, and a
process that is gone has no socket, so it gets none. (Rather than one socket
held here and accepted from by every child: each wakeup of a child's loop
accepts all that is queued, so whichever child wakes first takes a whole burst.)
`public_url` and `gateway_urls` stay the shared port; nothing a client sees
depends on which process serves it. gateway_port 0: this process binds a free
port with SO_REUSEPORT and holds it (never listening, so no connection comes
here) for the group's life; the children bind it beside it.

Per process: child k (from 0; named "process k+1") serves its own /metrics,
/healthz and /readyz on gateway_metrics_port + k, since a request to the
shared port reaches whichever process the kernel picked. When that is 0, on a
free port bound here and inherited (runlog/supervisor.py's `OwnPort`): no
other process can take it before the child listens, and a restarted child
serves on it again. Prometheus scrapes each one (its `instance` label tells
them apart); the lines printed at start name every pid and port.

Contract:

- Up once every child's own /readyz answered 200. A child that exits before
  is a failed start: the others are stopped and this process exits 1.
- A child that dies later is restarted with `runlog up`'s backoff
  (runlog/supervisor.py), and a line says so. Meanwhile the others serve: the
  kernel gives them its share of new connections, and the clients it had (cut
  off with it) resume on the same port.
- SIGTERM or SIGINT: every child drains at once, as a lone gateway does
  (`server_draining` with cursors, at most gateway_drain_s), then this process
  exits: 0 when every child exited 0, else 1.
- Children die with this process (PR_SET_PDEATHSIG), as `runlog up`'s do.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from broker import errors
from broker.settings import Settings
from broker.sockets import bind_free_port, port_is_free

from .supervisor import (
    ChildSpec,
    OwnPort,
    StartFailed,
    Supervisor,
    install_stop_signals,
    settings_env,
)

log = logging.getLogger("runlog.gateway")

_READY_S = 60.0
# A child drains for at most gateway_drain_s, then closes what is left (at most
# as long again); this bounds it beyond that.
_STOP_MARGIN_S = 10.0


def metrics_ports(
    settings: Settings, count: int, held: contextlib.ExitStack, first: int = 0
) -> list[OwnPort]:
    """The own ports of processes first .. first+count-1: gateway_metrics_port + k,
    or, when it is 0, a free port each, bound until `held` closes."""
    base, host = settings.gateway_metrics_port, settings.gateway_host
    return [OwnPort.of(base + first + k if base else 0, host, held) for k in range(count)]


def specs(
    settings: Settings, env: dict[str, str], *, port: int, metrics: list[OwnPort], prefix: str
) -> list[ChildSpec]:
    """One child per port of `metrics`, all sharing `port`; named prefix + "1", "2", ..."""
    host = settings.gateway_host
    return [
        ChildSpec(
            name=f"{prefix}{k + 1}",
            args=["gateway"],
            env={
                **env,
                "RUNLOG_GATEWAY_PORT": str(port),
                "RUNLOG_GATEWAY_PROCESSES": "1",  # a child is one process, not a parent
                "RUNLOG_GATEWAY_REUSE_PORT": "true",
                **m.env("gateway_metrics"),
            },
            port=f"port {port}, metrics port {m.port}",
            ready_url=f"http://{host}:{m.port}/readyz",
            pass_fds=m.pass_fds,
        )
        for k, m in enumerate(metrics)
    ]


def check(processes: int) -> None:
    """InvalidSetting for a group that cannot be formed."""
    if processes < 1:
        raise errors.InvalidSetting("gateway_processes", str(processes), "is not 1 or more")


def shared_port(settings: Settings, held: contextlib.ExitStack) -> int:
    """gateway_port, once seen free; for 0 a free one bound with SO_REUSEPORT
    (not listening), held until `held` closes."""
    host, port = settings.gateway_host, settings.gateway_port
    if not port:
        sock = held.enter_context(bind_free_port(host, reuse_port=True))
        return int(sock.getsockname()[1])
    # A port another group holds with SO_REUSEPORT would let ours join it: take
    # it only when it is free (ours set SO_REUSEPORT once they bind).
    if not port_is_free(port, host):
        raise errors.PortInUse(port, "gateway", "gateway_port")
    return port


async def run(settings: Settings, processes: int) -> int:
    """Serve until SIGTERM/SIGINT; the exit code (0: every child drained)."""
    from gateway import auth, issuers

    check(processes)
    auth.check_secret(settings)  # one line here rather than N children failing
    issuers.check(settings)
    with contextlib.ExitStack() as held:  # the ports bound here, until every child is gone
        port = shared_port(settings, held)
        ports = metrics_ports(settings, processes, held)
        _check_given(ports, port, settings.gateway_host)
        return await _supervise(settings, processes, port, ports)


def _check_given(ports: list[OwnPort], shared: int, host: str) -> None:
    """PortInUse for a given metrics port that is taken (or is the shared one);
    those bound here are no one else's."""
    for m in ports:
        if m.sock is None and (m.port == shared or not port_is_free(m.port, host)):
            raise errors.PortInUse(m.port, "gateway metrics", "gateway_metrics_port")


async def _supervise(settings: Settings, processes: int, port: int, ports: list[OwnPort]) -> int:
    """Start the children, serve until SIGTERM/SIGINT, stop them; the exit code."""
    host = settings.gateway_host
    stop = asyncio.Event()
    install_stop_signals(stop)
    supervisor = Supervisor(
        stop_timeout_s=2 * settings.gateway_drain_s + _STOP_MARGIN_S,
        say=lambda line: log.warning("%s", line),
        who="runlog gateway",
    )
    env = {**os.environ, **settings_env(settings)}
    try:
        for spec in specs(settings, env, port=port, metrics=ports, prefix="process "):
            await supervisor.start(spec)
        try:
            await supervisor.wait_up(_READY_S)
        except StartFailed as e:
            log.error("runlog gateway: %s; its output is above", e)
            return 1
        log.info("gateway listening on http://%s:%s: %d processes", host, port, processes)
        for k, m in enumerate(ports):
            pid = supervisor.pid(f"process {k + 1}")
            log.info("gateway process %d: pid %d, metrics http://%s:%d/metrics",
                     k + 1, pid, host, m.port)  # fmt: skip
        await stop.wait()
        log.info("gateway draining: %d processes", processes)
    finally:
        codes = await supervisor.stop()
    unclean = {name: rc for name, rc in codes.items() if rc != 0}
    if unclean:
        log.error("gateway stopped; not every process drained cleanly: %s",
                  ", ".join(f"{n}: exit {rc}" for n, rc in unclean.items()))  # fmt: skip
        return 1
    log.info("gateway stopped: %d processes drained", processes)
    return 0
