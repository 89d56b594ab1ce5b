"""Counts of unfinished runs by status, sampled from PostgreSQL for /metrics.

No single process knows how many runs are queued or waiting for an approval
(gateways create them, any worker may own them), so every process that has a
`Broker` samples the count from PostgreSQL every `runs_sample_interval_s`
into `runlog_runs_unfinished{status}`. The query reads only unended runs,
through the partial index `runs_active_idx`, so it stays cheap however much
history the log keeps. Dashboards take the max over processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .metrics import UNFINISHED_STATUSES, BrokerMetrics
from .retry import reads
from .store import DB_ERRORS, Store

log = logging.getLogger(__name__)


class RunCensus:
    def __init__(self, store: Store, metrics: BrokerMetrics, interval_s: float) -> None:
        self.store = store
        self.metrics = metrics
        self.interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.interval_s > 0 and self._task is None:
            self._task = asyncio.create_task(self._loop(), name="runlog-run-census")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def sample(self) -> dict[str, int]:
        counts = await unfinished(self.store)
        for status, n in counts.items():
            self.metrics.runs_unfinished.labels(status).set(n)
        return counts

    async def _loop(self) -> None:
        while True:
            try:
                await self.sample()
            except DB_ERRORS as e:
                # A gauge may go stale while PostgreSQL is away; the append
                # path reports the outage itself.
                log.debug("run census failed: %s", e)
            await asyncio.sleep(self.interval_s)


@reads("run census")
async def unfinished(store: Store) -> dict[str, int]:
    """How many unended runs there are of each of UNFINISHED_STATUSES."""
    rows = await store.pool.fetch(
        "SELECT status, count(*) FROM runs WHERE ended_at IS NULL GROUP BY status"
    )
    counts = dict.fromkeys(UNFINISHED_STATUSES, 0)
    for status, n in rows:
        if status in counts:  # allow-list: an unexpected status is not a new label
            counts[status] = n
    return counts
