"""`runlog up`: the embedded default stack, on one machine.

Starts a real nats-server (JetStream, file store) and a real PostgreSQL under
the data folder, unless RUNLOG_NATS_URL / RUNLOG_DATABASE_URL point at
external ones; applies migrations; creates the JetStream streams; then runs
`--workers N` worker processes and `--gateways M` gateways (gateway k
listens on gateway_port + k: consecutive ports, so each can be reached,
killed and drained on its own). With `--gateway-processes P` each gateway is
P processes sharing its port (SO_REUSEPORT, runlog/group.py), each
supervised here and serving its own /metrics and /readyz (gateway 1's on
gateway_metrics_port + k, gateway 2's from + P, ...; free ports when it is 0).
Every worker serves /metrics: worker k on worker_metrics_port + k, or, when
that is 0 (the default), on a free port. A free port is bound here and
inherited by its process (runlog/supervisor.py's `OwnPort`), so no other
process takes it first and a restarted process comes back on it. It prints
every URL, each process's pid and port, and a console link that signs you in
with a short-lived development token.

Tokens are signed with a random secret kept in the data folder
(`<data_dir>/jwt_secret`, mode 0600, made by the first `up` and reused by the
next ones; runlog/secret.py) unless jwt_secret is set: never with the public
default.

Every port it needs is checked before anything starts: a busy one is one line
naming it and the setting that moves it (`port_in_use`, exit 2).

The children are supervised (runlog/supervisor.py): one that dies is
restarted with backoff and a line says so; a Ctrl-C or SIGTERM drains the
gateways and workers (SIGTERM), then stops PostgreSQL and NATS. If `runlog
up` itself is killed, nothing it started lives on: every child and both
servers are spawned with PR_SET_PDEATHSIG (Linux), so the kernel kills the
workers and gateways and has PostgreSQL and NATS shut down, and the next
`runlog up` starts on the same data folder and ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import sys

from broker import errors, migrate
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import LOOPBACK, port_is_free
from runlog.embedded import NatsProcess, PostgresProcess

from . import group, secret, stack
from .supervisor import (
    ChildSpec,
    OwnPort,
    StartFailed,
    Supervisor,
    install_stop_signals,
    settings_env,
)

log = logging.getLogger("runlog.up")

_CHILD_STOP_S = 30.0
_READY_S = 60.0
_LINK_TTL_S = 12 * 3600.0  # the console link's token (at most jwt_max_ttl_s)


async def run(settings: Settings, *, workers: int = 1, gateways: int = 1) -> None:
    group.check(settings.gateway_processes)
    if not settings.gateway_port:  # its gateways' links and readiness need the port
        raise errors.InvalidSetting(
            "gateway_port", "0", "is not a port runlog up can link to: give one (default 8080)"
        )
    check_ports(settings, workers=workers, gateways=gateways)
    stop = asyncio.Event()
    install_stop_signals(stop)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # Never the public default: the children get this one by RUNLOG_JWT_SECRET.
    settings = secret.resolve(settings, create_missing=True)
    servers: list[NatsProcess | PostgresProcess] = []
    supervisor = Supervisor(stop_timeout_s=_CHILD_STOP_S, say=_say)
    held = contextlib.ExitStack()  # the ports bound here for the children, until they are gone
    try:
        nats_url, nats_pid = settings.nats_url, None
        if not nats_url:
            nats = NatsProcess(data_dir / "nats", port=settings.embedded_nats_port)
            await nats.start()
            servers.append(nats)
            nats_url, nats_pid = nats.url, nats.pid
        database_url, pg_pid = settings.database_url, None
        if not database_url:
            pg = PostgresProcess(data_dir / "postgres", port=settings.embedded_postgres_port)
            await pg.start()
            servers.append(pg)
            database_url, pg_pid = pg.url, pg.pid
        settings = dataclasses.replace(settings, nats_url=nats_url, database_url=database_url)
        applied = await migrate.apply(database_url)
        log.info("migrations applied: %d", len(applied))
        broker = await Broker.connect(settings, name="runlog-up")
        await broker.close()

        env = {**os.environ, **settings_env(settings)}
        host = settings.gateway_host
        worker_ports = _worker_metrics_ports(settings, workers, held)
        for i, own in enumerate(worker_ports):
            await supervisor.start(
                ChildSpec(
                    name=f"worker {i + 1}",
                    args=["worker"],
                    env={**env, **own.env("worker_metrics")},
                    port=f"metrics port {own.port}",
                    ready_url=f"http://{host}:{own.port}/healthz",
                    pass_fds=own.pass_fds,
                )
            )
        urls = [f"http://{host}:{settings.gateway_port + i}" for i in range(gateways)]
        # A console served by one gateway fails over to the others: each allows
        # the others' origins (WebSocket Origin check and CORS).
        origins = ",".join(
            o for o in [settings.allowed_origins, *urls, *_localhost_aliases(urls)] if o
        )
        # ...and lists them all: the console may use only listed gateways.
        listed = ",".join(u for u in [*urls, settings.gateway_urls] if u)
        shared = _gateway_metrics_ports(settings, gateways, held)
        for i, url in enumerate(urls):
            port = settings.gateway_port + i
            gw_env = {
                **env,
                "RUNLOG_GATEWAY_PORT": str(port),
                "RUNLOG_ALLOWED_ORIGINS": origins,
                "RUNLOG_GATEWAY_URLS": listed,
                "RUNLOG_GATEWAY_PROCESSES": "1",  # this supervisor runs each process itself
            }
            if shared is None:
                spec = ChildSpec(name=f"gateway {i + 1}", args=["gateway"], env=gw_env,
                                 port=f"port {port}", ready_url=url + "/readyz")  # fmt: skip
                await supervisor.start(spec)
                continue
            for spec in group.specs(settings, gw_env, port=port, metrics=shared[i],
                                    prefix=f"gateway {i + 1}."):  # fmt: skip
                await supervisor.start(spec)
        try:
            await supervisor.wait_up(_READY_S)
        except StartFailed as e:
            raise SystemExit(f"runlog up: {e}; its output is above") from None

        from gateway import auth

        link_ttl_s = min(_LINK_TTL_S, settings.jwt_max_ttl_s)
        token = auth.mint(settings, "you", ttl_s=link_ttl_s)
        failover = f"&gateways={','.join(urls)}" if len(urls) > 1 else ""
        stack.write(
            data_dir,
            stack.Running(
                pid=os.getpid(), nats_url=nats_url, database_url=database_url, gateway_urls=urls
            ),
        )
        _say("runlog is up")
        _say(_row("console", f"{urls[0]}/#token={token}{failover}"))
        for i, u in enumerate(urls):
            ws = u.replace("http", "ws", 1)
            if shared is None:
                pid = supervisor.pid(f"gateway {i + 1}")
                _say(_row(f"gateway {i + 1}", f"{u}  pid {pid}  (REST {u}/v1, WebSocket {ws}/v1/ws,"
                                              f" metrics {u}/metrics)"))  # fmt: skip
                continue
            _say(_row(f"gateway {i + 1}", f"{u}  {len(shared[i])} processes  (REST {u}/v1,"
                                          f" WebSocket {ws}/v1/ws)"))  # fmt: skip
            for k, m in enumerate(shared[i]):
                name = f"gateway {i + 1}.{k + 1}"
                metrics = f"http://{host}:{m.port}/metrics"
                _say(_row(name, f"pid {supervisor.pid(name)}  metrics {metrics}"))
        for i, own in enumerate(worker_ports):
            pid = supervisor.pid(f"worker {i + 1}")
            _say(_row(f"worker {i + 1}", f"pid {pid}  metrics http://{host}:{own.port}/metrics"))
        _say(_row("NATS", _server(nats_url, nats_pid)))
        _say(_row("PostgreSQL", _server(database_url, pg_pid)))
        _say(_row("data folder", str(data_dir)))
        _say(f"The console link signs you in as 'you' for {link_ttl_s / 3600:g} h. A process"
             " that dies is restarted; Ctrl-C stops everything.")  # fmt: skip
        await stop.wait()
    finally:
        stack.remove(data_dir)
        await supervisor.stop()
        held.close()
        for server in reversed(servers):
            try:
                await server.stop()
            except Exception:
                log.exception("could not stop %s", type(server).__name__)
        _say("runlog stopped")


def check_ports(settings: Settings, *, workers: int, gateways: int) -> None:
    """PortInUse for the first port `runlog up` needs that is taken (or given twice)."""
    wanted: list[tuple[str, int, str, str]] = []  # host, port, what, setting
    if not settings.nats_url and settings.embedded_nats_port:
        wanted.append(
            (LOOPBACK, settings.embedded_nats_port, "embedded NATS", "embedded_nats_port")
        )
    if not settings.database_url and settings.embedded_postgres_port:
        port = settings.embedded_postgres_port
        wanted.append((LOOPBACK, port, "embedded PostgreSQL", "embedded_postgres_port"))
    host = settings.gateway_host
    for i in range(gateways):
        wanted.append((host, settings.gateway_port + i, f"gateway {i + 1}", "gateway_port"))
    if settings.gateway_metrics_port:
        n = settings.gateway_processes
        for i in range(gateways * n):
            what = f"gateway {i // n + 1}.{i % n + 1} metrics"
            wanted.append((host, settings.gateway_metrics_port + i, what, "gateway_metrics_port"))
    if settings.worker_metrics_port:
        for i in range(workers):
            port = settings.worker_metrics_port + i
            wanted.append((host, port, f"worker {i + 1} metrics", "worker_metrics_port"))
    taken: dict[int, str] = {}
    for host, port, what, setting in wanted:
        if port in taken:
            raise errors.PortInUse(port, f"{taken[port]} and {what} both want it", setting)
        taken[port] = what
        if not port_is_free(port, host):
            raise errors.PortInUse(port, what, setting)


def _gateway_metrics_ports(
    settings: Settings, gateways: int, held: contextlib.ExitStack
) -> list[list[OwnPort]] | None:
    """The own ports of gateway i's processes (gateway_metrics_port + i*N + k),
    or None when each gateway is one process without one (its port serves all)."""
    n = settings.gateway_processes
    if n == 1 and not settings.gateway_metrics_port:
        return None
    return [group.metrics_ports(settings, n, held, first=i * n) for i in range(gateways)]


def _worker_metrics_ports(
    settings: Settings, workers: int, held: contextlib.ExitStack
) -> list[OwnPort]:
    """worker_metrics_port + k for worker k, or, when it is 0, a free port each,
    bound until `held` closes."""
    base, host = settings.worker_metrics_port, settings.gateway_host
    return [OwnPort.of(base + i if base else 0, host, held) for i in range(workers)]


def _say(line: str) -> None:
    # One write(2) for the line and its newline: the children write to the same
    # pipe, and print() unbuffered (PYTHONUNBUFFERED) writes them apart, so a
    # child's line could land between the two and glue itself to this one.
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _row(label: str, value: str) -> str:
    return f"  {label + ':':<13}{value}"


def _server(url: str, pid: int | None) -> str:
    return f"{url}  pid {pid}" if pid is not None else f"{url}  (external)"


def _localhost_aliases(urls: list[str]) -> list[str]:
    """127.0.0.1 and localhost are different origins to a browser."""
    out = []
    for u in urls:
        if "://127.0.0.1:" in u:
            out.append(u.replace("://127.0.0.1:", "://localhost:"))
        elif "://localhost:" in u:
            out.append(u.replace("://localhost:", "://127.0.0.1:"))
    return out
