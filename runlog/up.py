"""`runlog up`: the embedded default stack, on one machine.

Starts a real nats-server (JetStream, file store) and a real PostgreSQL under
the data folder, unless RUNLOG_NATS_URL / RUNLOG_DATABASE_URL point at
external ones; applies migrations; creates the JetStream streams; then runs
`--workers N` worker processes and `--gateways M` gateway processes (gateway
k listens on gateway_port + k: consecutive ports, so each can be reached,
killed and drained on its own; with worker_metrics_port set, worker k serves
/metrics on worker_metrics_port + k). Prints every URL, and a console link that
signs you in with a short-lived development token. On Ctrl-C or SIGTERM it
drains the gateways and workers (SIGTERM), then stops PostgreSQL and NATS.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys

from broker import migrate
from broker.embedded import NatsProcess, PostgresProcess
from broker.runtime import Broker
from broker.settings import Settings

from .cli import install_stop_signals

log = logging.getLogger("runlog.up")

_CHILD_STOP_S = 30.0


async def run(settings: Settings, *, workers: int = 1, gateways: int = 1) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    servers: list[NatsProcess | PostgresProcess] = []
    children: list[tuple[str, asyncio.subprocess.Process]] = []
    try:
        nats_url = settings.nats_url
        if not nats_url:
            nats = NatsProcess(data_dir / "nats", port=settings.embedded_nats_port)
            await nats.start()
            servers.append(nats)
            nats_url = nats.url
        database_url = settings.database_url
        if not database_url:
            pg = PostgresProcess(data_dir / "postgres", port=settings.embedded_postgres_port)
            await pg.start()
            servers.append(pg)
            database_url = pg.url
        settings = dataclasses.replace(settings, nats_url=nats_url, database_url=database_url)
        applied = await migrate.apply(database_url)
        log.info("migrations applied: %d", len(applied))
        broker = await Broker.connect(settings, name="runlog-up")
        await broker.close()

        env = {**os.environ, **_env(settings)}
        worker_metrics = []
        for i in range(workers):
            wenv = env
            if settings.worker_metrics_port:
                # Like the gateways: worker k serves /metrics on worker_metrics_port + k.
                port = settings.worker_metrics_port + i
                wenv = {**env, "RUNLOG_WORKER_METRICS_PORT": str(port)}
                worker_metrics.append(f"http://{settings.gateway_host}:{port}/metrics")
            children.append((f"worker {i + 1}", await _spawn(["worker"], wenv)))
        urls = [
            f"http://{settings.gateway_host}:{settings.gateway_port + i}" for i in range(gateways)
        ]
        # A console served by one gateway fails over to the others: each allows
        # the others' origins (WebSocket Origin check and CORS).
        origins = ",".join(
            o for o in [settings.allowed_origins, *urls, *_localhost_aliases(urls)] if o
        )
        for i in range(gateways):
            port = settings.gateway_port + i
            genv = {**env, "RUNLOG_GATEWAY_PORT": str(port), "RUNLOG_ALLOWED_ORIGINS": origins}
            children.append((f"gateway :{port}", await _spawn(["gateway"], genv)))
        await _wait_ready(urls, children)

        from gateway import auth

        token = auth.mint(settings, "you", ttl_s=12 * 3600)
        print("runlog is up", flush=True)
        failover = f"&gateways={','.join(urls)}" if len(urls) > 1 else ""
        print(f"  console:     {urls[0]}/#token={token}{failover}", flush=True)
        for u in urls:
            print(f"  gateway:     {u}  (REST {u}/v1, WebSocket {u.replace('http', 'ws')}/v1/ws,"
                  f" metrics {u}/metrics)", flush=True)  # fmt: skip
        print(f"  workers:     {workers}", flush=True)
        for u in worker_metrics:
            print(f"  worker metrics: {u}", flush=True)
        if not worker_metrics:
            print("  (worker /metrics is off: set RUNLOG_WORKER_METRICS_PORT)", flush=True)
        print(f"  NATS:        {nats_url}", flush=True)
        print(f"  PostgreSQL:  {database_url}", flush=True)
        print(f"  data folder: {data_dir}", flush=True)
        print("The console link signs you in as 'you' for 12 h. Ctrl-C stops everything.",
              flush=True)  # fmt: skip
        await _watch(stop, children)
    finally:
        await _stop_children(children)
        for server in reversed(servers):
            try:
                await server.stop()
            except Exception:
                log.exception("could not stop %s", type(server).__name__)
        print("runlog stopped", flush=True)


def _localhost_aliases(urls: list[str]) -> list[str]:
    """127.0.0.1 and localhost are different origins to a browser."""
    out = []
    for u in urls:
        if "://127.0.0.1:" in u:
            out.append(u.replace("://127.0.0.1:", "://localhost:"))
        elif "://localhost:" in u:
            out.append(u.replace("://localhost:", "://127.0.0.1:"))
    return out


def _env(settings: Settings) -> dict[str, str]:
    """The settings as RUNLOG_* variables, so child processes see the same ones."""
    out = {}
    for f in dataclasses.fields(settings):
        out["RUNLOG_" + f.name.upper()] = str(getattr(settings, f.name))
    return out


async def _spawn(args: list[str], env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "runlog.cli", *args, env=env)


async def _wait_ready(
    urls: list[str], children: list[tuple[str, asyncio.subprocess.Process]]
) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as http, asyncio.timeout(60):
        for url in urls:
            while True:
                for name, p in children:
                    if p.returncode is not None:
                        raise SystemExit(f"runlog up: {name} exited with {p.returncode}")
                try:
                    async with http.get(url + "/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)


async def _watch(
    stop: asyncio.Event, children: list[tuple[str, asyncio.subprocess.Process]]
) -> None:
    """Wait for Ctrl-C; if a child dies meanwhile, say so and stop everything."""
    waits = {asyncio.ensure_future(p.wait()): name for name, p in children}
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait([stopper, *waits], return_when=asyncio.FIRST_COMPLETED)
    for d in done:
        if d in waits:
            print(f"runlog up: {waits[d]} exited with {d.result()}; stopping", flush=True)
    stopper.cancel()
    for w in waits:
        w.cancel()


async def _stop_children(children: list[tuple[str, asyncio.subprocess.Process]]) -> None:
    for _, p in children:
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
    for name, p in children:
        try:
            await asyncio.wait_for(p.wait(), _CHILD_STOP_S)
        except TimeoutError:
            log.warning("%s did not stop in %.0fs; killing it", name, _CHILD_STOP_S)
            p.kill()
            await p.wait()
