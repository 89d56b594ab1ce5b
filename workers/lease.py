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
    last_ok = time.monotonic()
    while True:
        await asyncio.sleep(interval)
        try:
            alive = await store.renew_lease(ownership.run_id, ownership.epoch, lease_s)
            if alive and signals.stop is None:
                stop = await store.interrupt_request(ownership.run_id)
                if stop is not None:
                    signals.request_stop(*stop)
        except (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError) as e:
            if time.monotonic() - last_ok > lease_s:
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
        last_ok = time.monotonic()
