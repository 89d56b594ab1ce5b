"""Keep a run's ownership lease alive, and notice when it is lost.

Renewed every `lease_s / 3`. A renewal that finds another epoch (or the run
ended) means ownership is lost: `on_lost` is called at once (the worker
cancels the run's task, which appends nothing more; fencing would refuse it
anyway).

A renewal that fails — PostgreSQL unreachable, or no answer within `lease_s
/ 3` — does not give the run up. While PostgreSQL is away nobody can take
the run over, and once it is back the fence decides every commit, so the run
is kept (its events buffered by the appender) and the renewal retried about
every second, for up to `outage_grace_s` after the last one that succeeded;
only then is the run given up. When PostgreSQL answers again, the first
renewal tells: extended (every worker's reaper holds back for a lease after
it saw PostgreSQL fail, see worker.py, so the owner gets there first), or
lost (the lease ran out while PostgreSQL was up for another worker that
took the run: this worker was partitioned or paused, and is fenced).

Each round also reads the run's interrupt columns, so a stop recorded in
PostgreSQL whose control message never arrived still reaches the run within
`lease_s / 3`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from broker.store import DB_ERRORS, Ownership, Store

from .signals import RunSignals

log = logging.getLogger(__name__)

# Longest wait between two renewal attempts while they fail: the owner must
# renew soon after PostgreSQL is back, well within the reapers' hold-back.
_RETRY_S = 1.0


async def keep_lease(
    store: Store,
    ownership: Ownership,
    lease_s: float,
    signals: RunSignals,
    on_lost: Callable[[], None],
    *,
    outage_grace_s: float,
) -> None:
    run_id = ownership.run_id
    interval = lease_s / 3
    renewed = time.monotonic()  # when the last renewal that succeeded was sent
    failing = False
    while True:
        await asyncio.sleep(min(interval, _RETRY_S) if failing else interval)
        sent = time.monotonic()
        try:
            # Bounded: a renewal that hangs (a silent partition) is retried.
            async with asyncio.timeout(interval):
                alive = await store.renew_lease(run_id, ownership.epoch, lease_s)
                if alive and signals.stop is None:
                    stop = await store.interrupt_request(run_id)
                    if stop is not None:
                        signals.request_stop(*stop)
        except DB_ERRORS as e:
            if time.monotonic() - renewed >= outage_grace_s:
                log.warning(
                    "run %s: lease not renewed for %.0f s (storage_outage_grace_s); giving it up",
                    run_id,
                    outage_grace_s,
                )
                on_lost()
                return
            if not failing:
                log.warning(
                    "run %s: lease renewal failed (%s); keeping the run while PostgreSQL is away",
                    run_id,
                    type(e).__name__,
                )
            failing = True
            continue
        if not alive:
            log.info("run %s: lease lost (another worker owns it, or it ended)", run_id)
            on_lost()
            return
        if failing:
            log.info("run %s: lease renewed after %.1f s without", run_id, sent - renewed)
        failing = False
        renewed = sent
