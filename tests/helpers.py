"""Helpers shared by the tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import NamedTuple

from prometheus_client import CollectorRegistry

from broker import events
from broker.embedded import NatsProcess, PostgresProcess
from broker.settings import Settings
from broker.store import Store, StoredEvent
from broker.subscribe import Subscription


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


def assert_contiguous(items: list[StoredEvent], *, first: int, by: str = "seq") -> None:
    positions = [getattr(e, by) for e in items]
    assert positions == list(range(first, first + len(items))), positions[:20]


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    """A sample's value (the metric must exist: a typo fails, not reads 0)."""
    value = registry.get_sample_value(name, labels)
    assert value is not None, (name, labels)
    return value
