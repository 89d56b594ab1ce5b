"""Keep a run's ownership lease alive, and notice when it is lost.

Renewed every `lease_s / 3`. A renewal that finds another epoch (or the run
ended) means ownership is lost: `on_lost` is called at once (the worker
cancels the run's task, which appends nothing more; fencing would refuse it
anyway). If PostgreSQL cannot be reached for a whole lease, the lease is
presumed lost too: another worker may already have taken the run over.

Each round also reads the run's interrupt columns, so a stop recorded in
PostgreSQL whose control message never arrived still reaches the run within
`lease_s / 3`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import asyncpg

from broker.store import TRANSIENT_DB_ERRORS, Ownership, Store

from .signals import RunSignals

log = logging.getLogger(__name__)


async def keep_lease(
    store: Store,
    ownership: Ownership,
    lease_s: float,
    signals: RunSignals,
    on_lost: Callable[[], None],
) -> None:
    interval = lease_s / 3
    # The lease is valid until (time the last successful renewal was *sent*)
    # + lease_s, minus a margin: PostgreSQL's clock started counting then.
    # A renewal that hangs (a silent partition) must not keep us writing past
    # that, so each one is bounded by the time left.
    margin = min(1.0, lease_s / 10)
    valid_until = time.monotonic() + lease_s - margin
    while True:
        await asyncio.sleep(interval)
        sent = time.monotonic()
        left = valid_until - sent
        if left <= 0:
            log.warning("run %s: lease expired unrenewed; giving it up", ownership.run_id)
            on_lost()
            return
        try:
            async with asyncio.timeout(left):
                alive = await store.renew_lease(ownership.run_id, ownership.epoch, lease_s)
                if alive and signals.stop is None:
                    stop = await store.interrupt_request(ownership.run_id)
                    if stop is not None:
                        signals.request_stop(*stop)
        except (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError) as e:
            if time.monotonic() >= valid_until:
                log.warning(
                    "run %s: lease not renewed for %.0f s; giving it up", ownership.run_id, lease_s
                )
                on_lost()
                return
            log.warning("run %s: lease renewal failed (%s); retrying", ownership.run_id, e)
            continue
        if not alive:
            log.info("run %s: lease lost (another worker owns it, or it ended)", ownership.run_id)
            on_lost()
            return
        valid_until = sent + lease_s - margin
