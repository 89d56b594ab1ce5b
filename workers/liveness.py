"""A worker's liveness, as PostgreSQL sees it: a session-level advisory lock.

At start a worker opens a connection of its own (not one of the pool's) and
takes `pg_advisory_lock(LIVENESS_LOCK_NS, key)` with a random key
(`broker/advisory.py`); every run
it claims records that key (`runs.owner_lock`). PostgreSQL releases the lock
the moment that connection ends: the process died (kill -9, OOM — the kernel
closes its sockets and PostgreSQL sees the end at once), or PostgreSQL itself
restarted. Every `worker_liveness_interval_s` the other workers look for
unended runs whose owner's lock nobody holds (`Store.orphaned_runs`) and take
them over then and there, without waiting for the lease to run out.

A worker that is only paused (SIGSTOP) or cut off keeps its connection (the
kernel keeps the socket open and answers for it), so its lock stays held and
its runs are taken over when the lease runs out, as before; the epoch fence
decides what it may still write.

A restart or failover of PostgreSQL drops every lock at once, the living
owners' too. Each worker's own lock connection ends with it, so each takes
its key again as soon as it can reach PostgreSQL (every `_RETRY_S`), and none
takes an orphan over until it has held its own lock for
`worker_liveness_grace_s`: the owners have that long to take theirs back.
Taking a run whose owner was only slow to come back costs a resume, never
safety (the fence).

Needs a direct connection to PostgreSQL (a session-level lock does not
survive a transaction-pooling proxy such as PgBouncer in transaction mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time

from broker import errors
from broker.advisory import SessionLock
from broker.store import LIVENESS_LOCK_NS

log = logging.getLogger(__name__)

_RETRY_S = 0.5
# A silent connection (a half-open socket) is noticed within this: the lock
# connection answers a trivial query every _PING_S.
_PING_S = 2.0


class Liveness:
    def __init__(self, dsn: str, grace_s: float) -> None:
        self._dsn = dsn
        self._grace_s = grace_s
        self.key = 0
        self._lock: SessionLock | None = None
        self._held_since: float | None = None
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def settled(self) -> bool:
        """The lock has been held without a break for the grace: orphans seen
        now are runs whose owners had that long to take their locks back."""
        since = self._held_since
        return since is not None and time.monotonic() - since >= self._grace_s

    async def start(self) -> None:
        try:
            for _ in range(8):  # a key another worker holds: draw again
                self.key = secrets.randbelow(2**31 - 1) + 1
                if await self._take():
                    break
            else:
                raise errors.StorageError("no free liveness lock key after 8 draws")
        except errors.StorageError as e:
            raise errors.StorageError(f"cannot take the worker's liveness lock: {e}") from e
        self._task = asyncio.create_task(self._keep(), name="runlog-worker-liveness")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._drop()

    async def _take(self) -> bool:
        """Connect and take the lock; False if another session holds this key."""
        lock = await SessionLock.take(self._dsn, LIVENESS_LOCK_NS, self.key, self._on_lost)
        if lock is None:
            return False
        self._lost.clear()
        self._lock, self._held_since = lock, time.monotonic()
        return True

    def _on_lost(self, lock: SessionLock) -> None:
        if lock is self._lock:
            self._lost.set()

    async def _drop(self) -> None:
        lock, self._lock, self._held_since = self._lock, None, None
        if lock is not None:
            await lock.release()

    async def _keep(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_PING_S):
                    await self._lost.wait()
            lock = self._lock
            if lock is not None and not self._lost.is_set() and await lock.alive(_PING_S):
                continue
            log.warning("worker liveness lock lost (PostgreSQL connection ended); taking it again")
            await self._drop()
            await self._retake()

    async def _retake(self) -> None:
        while True:
            try:
                if await self._take():
                    log.info("worker liveness lock taken again")
                    return
                # Someone holds our key: only a session of ours PostgreSQL has
                # not yet seen end. It goes soon; try again.
            except errors.StorageError:
                pass
            await asyncio.sleep(_RETRY_S)
