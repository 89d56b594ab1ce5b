"""`runlog up`: the embedded default stack, on one machine.

Starts a real nats-server (JetStream, file store) and a real PostgreSQL under
the data folder, unless RUNLOG_NATS_URL / RUNLOG_DATABASE_URL point at
external ones; applies migrations; creates the JetStream streams; prints the
URLs; and on Ctrl-C or SIGTERM stops every child it started, last started
first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from broker import migrate
from broker.embedded import NatsProcess, PostgresProcess
from broker.runtime import Broker
from broker.settings import Settings

from .cli import install_stop_signals

log = logging.getLogger("runlog.up")


async def run(settings: Settings) -> None:
    stop = asyncio.Event()
    install_stop_signals(stop)
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    children: list[NatsProcess | PostgresProcess] = []
    try:
        nats_url = settings.nats_url
        if not nats_url:
            nats = NatsProcess(data_dir / "nats", port=settings.embedded_nats_port)
            await nats.start()
            children.append(nats)
            nats_url = nats.url
        database_url = settings.database_url
        if not database_url:
            pg = PostgresProcess(data_dir / "postgres", port=settings.embedded_postgres_port)
            await pg.start()
            children.append(pg)
            database_url = pg.url
        settings = dataclasses.replace(settings, nats_url=nats_url, database_url=database_url)
        applied = await migrate.apply(database_url)
        log.info("migrations applied: %d", len(applied))
        broker = await Broker.connect(settings, name="runlog-up")
        await broker.close()

        print("runlog is up", flush=True)
        print(f"  NATS:        {nats_url}", flush=True)
        print(f"  PostgreSQL:  {database_url}", flush=True)
        print(f"  data folder: {data_dir}", flush=True)
        print("Ctrl-C stops everything.", flush=True)
        await stop.wait()
    finally:
        for child in reversed(children):
            try:
                await child.stop()
            except Exception:
                log.exception("could not stop %s", type(child).__name__)
        print("runlog stopped", flush=True)
