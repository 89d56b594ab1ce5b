"""Helpers shared by the tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import NamedTuple, Protocol

from prometheus_client import CollectorRegistry

from broker import events
from broker.settings import Settings
from broker.store import Store, StoredEvent
from broker.subscribe import Subscription
from runlog.embedded import NatsProcess, PostgresProcess

# Tasks of a module- or session-scoped fixture that a test restarts (their
# lifetime is the fixture's, not the test's) carry this name prefix; the
# leak check (conftest.no_leaks) leaves them alone.
FIXTURE_TASK_PREFIX = "fixture:"


class Stack(NamedTuple):
    nats_url: str
    database_url: str


class KillableStack(NamedTuple):
    nats: NatsProcess
    pg: PostgresProcess


def make_settings(stack: Stack | KillableStack, **overrides: object) -> Settings:
    if isinstance(stack, KillableStack):
        urls = {"nats_url": stack.nats.url, "database_url": stack.pg.url}
    else:
        urls = {"nats_url": stack.nats_url, "database_url": stack.database_url}
    base = Settings.from_env({})
    # A quick position check keeps tests that lose live messages short.
    return dataclasses.replace(base, position_check_s=0.2, **urls, **overrides)  # type: ignore[arg-type]


async def new_run(store: Store, user: str = "alice") -> tuple[str, str]:
    """A fresh session with one run: (session_id, run_id)."""
    session_id = await store.create_session(user)
    run_id = await store.create_run(session_id, user)
    return session_id, run_id


def text(i: int, message_id: str = "m1") -> events.TextDelta:
    return events.TextDelta(message_id=message_id, delta=f"tok{i} ")


async def collect(sub: Subscription, count: int, timeout_s: float = 30.0) -> list[StoredEvent]:
    """Read from `sub` until `count` events arrived (or it ends)."""
    out: list[StoredEvent] = []
    async with asyncio.timeout(timeout_s):
        async for batch in sub:
            out.extend(batch)
            if len(out) >= count:
                break
    return out


class HasRegistry(Protocol):
    registry: CollectorRegistry


def sample(metrics: HasRegistry, name: str, **labels: str) -> float:
    """A metric's value, read through its registry: 0 for a label set never
    counted, but a metric that does not exist fails (a typo must not read 0)."""
    value = metrics.registry.get_sample_value(name, labels)
    if value is not None:
        return value
    names = {m.name for m in metrics.registry.collect()}
    assert name in names or name.removesuffix("_total") in names, f"no metric {name}"
    return 0.0


def assert_contiguous(items: list[StoredEvent], *, first: int, by: str = "seq") -> None:
    positions = [getattr(e, by) for e in items]
    assert positions == list(range(first, first + len(items))), positions[:20]
