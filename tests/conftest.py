"""Test fixtures: real NATS and real PostgreSQL, started once per test session
by the same launcher `runlog up` uses (or external ones when
RUNLOG_NATS_URL / RUNLOG_DATABASE_URL are set).

Tests that kill or restart a server use `killable`, a private pair started
from the same launcher, so they never disturb the shared one (and work the
same when the shared one is external). State is not reset between tests:
every test makes its own sessions and runs, whose ids are random.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker import migrate
from broker.embedded import NatsProcess, PostgresProcess
from broker.runtime import Broker
from broker.settings import Settings

from .helpers import KillableStack, Stack, make_settings


@pytest.fixture(scope="session")
def tmp_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="runlog-test-") as d:
        os.chmod(d, 0o755)
        yield Path(d)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack(tmp_root: Path) -> AsyncIterator[Stack]:
    nats_url = os.environ.get("RUNLOG_NATS_URL", "")
    database_url = os.environ.get("RUNLOG_DATABASE_URL", "")
    started: list[NatsProcess | PostgresProcess] = []
    try:
        if not nats_url:
            nats = NatsProcess(tmp_root / "nats")
            await nats.start()
            started.append(nats)
            nats_url = nats.url
        if not database_url:
            pg = PostgresProcess(tmp_root / "pg", fast_init=True)
            await pg.start()
            started.append(pg)
            database_url = pg.url
        await migrate.apply(database_url)
        yield Stack(nats_url, database_url)
    finally:
        for p in reversed(started):
            await p.stop()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def killable(tmp_root: Path) -> AsyncIterator[KillableStack]:
    nats = NatsProcess(tmp_root / "k-nats")
    pg = PostgresProcess(tmp_root / "k-pg", fast_init=True)
    await nats.start()
    await pg.start()
    try:
        await migrate.apply(pg.url)
        yield KillableStack(nats, pg)
    finally:
        await pg.stop()
        await nats.stop()


@pytest.fixture(scope="session")
def settings(stack: Stack) -> Settings:
    return make_settings(stack)


@pytest_asyncio.fixture(loop_scope="session")
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = await Broker.connect(settings, name="runlog-test")
    try:
        yield b
    finally:
        await b.close()
