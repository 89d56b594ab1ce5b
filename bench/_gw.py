"""Helpers shared by the gateway and worker scenarios (fanout, latency,
replay, idle, worker): the writer side in this process, tokens, summaries.

The writer side is the worker's path: `Broker.claim` → `RunWriter.append`,
on a `Broker` connected from this (the bench) process; gateways and clients
run in their own processes (bench/_procs.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from broker import events
from broker.log import RunWriter
from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth

from . import _lib
from ._lib import Figure, Stack

USER = "bench"  # owner of every session the benchmarks create


def settings_for(st: Stack, **overrides: Any) -> Settings:
    return dataclasses.replace(
        Settings.from_env({}), nats_url=st.nats_url, database_url=st.database_url, **overrides
    )


async def connect_broker(st: Stack, name: str = "runlog-bench", **overrides: Any) -> Broker:
    return await Broker.connect(
        settings_for(st, **overrides), registry=CollectorRegistry(), name=name
    )


def token(user: str = USER, ttl_s: float = 4 * 3600) -> str:
    """A bearer token the gateways accept (they run with the default secret)."""
    return auth.mint(Settings.from_env({}), user, ttl_s)


async def new_run(b: Broker, session_id: str) -> RunWriter:
    """A run owned by this process, with its run_start committed."""
    run_id = await b.store.create_run(session_id, USER, model="bench")
    w = await b.claim(run_id, "bench-writer")
    await w.append(events.RunStart(model="bench", started_by=USER))
    await w.flush()
    return w


async def append_burst(w: RunWriter, n: int, message_id: str = "m_0001") -> None:
    """`n` token deltas as fast as the appender takes them, yielding after each
    one as a stream read from a socket would; then wait for the commit."""
    tokens = _lib.TOKENS
    for i in range(n):
        await w.append(events.TextDelta(message_id=message_id, delta=tokens[i % len(tokens)]))
        await asyncio.sleep(0)
    await w.flush()


async def end_run(w: RunWriter) -> None:
    await w.append(events.RunEnd(status="completed"))
    await w.flush()


def median(values: Sequence[float]) -> float:
    vals = [v for v in values if v == v]
    return statistics.median(vals) if vals else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def figure(section: str, name: str, unit: str, per_trial: list[dict[str, Any]], key: str) -> Figure:
    return _lib.summarize(section, name, unit, [t.get(key, float("nan")) for t in per_trial])


def progress(msg: str) -> None:
    print(msg, flush=True)


async def append_paced(
    w: RunWriter, rate_per_s: float, seconds: float, message_id: str = "m_0001"
) -> float:
    """Token deltas at `rate_per_s` for `seconds`, in ticks of 5 ms (tokens
    arrive from a socket in small bursts); returns the wall time the last
    commit returned."""
    import time

    tokens = _lib.TOKENS
    tick_s = 0.005
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    total = int(rate_per_s * seconds)
    sent = 0
    while sent < total:
        due = int(min(total, (loop.time() - t0 + tick_s) * rate_per_s))
        while sent < due:
            await w.append(
                events.TextDelta(message_id=message_id, delta=tokens[sent % len(tokens)])
            )
            sent += 1
        await asyncio.sleep(tick_s)
    await w.flush()
    return time.time()
