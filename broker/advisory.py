"""A session-level advisory lock held on a connection of its own: what a
worker's liveness is (`workers/liveness.py`).

PostgreSQL releases the lock the moment the connection ends, whoever ends
it: the holder (`release`), its process dying (the kernel closes the
socket), or PostgreSQL restarting. `on_lost` is called when the connection
ends without `release`; `alive` asks it to answer a query.

Contract of failures: `take` raises `errors.StorageError` when PostgreSQL
cannot be reached or refuses (`DatabaseError` never: a refused lock is just
not taken); `alive` and `release` never raise.

Needs a direct connection to PostgreSQL (a session-level lock does not
survive a transaction-pooling proxy such as PgBouncer in transaction mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

from . import errors
from .retry import TRANSIENT_DB_ERRORS

# Anything asyncpg raises when a connection or a query fails.
_FAILED = (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError, OSError, TimeoutError)


class SessionLock:
    """`pg_advisory_lock(ns, key)`, held while its connection lives."""

    def __init__(self, conn: asyncpg.Connection, ns: int, key: int) -> None:
        self._conn = conn
        self.ns = ns
        self.key = key
        self._released = False

    @classmethod
    async def take(
        cls, dsn: str, ns: int, key: int, on_lost: Callable[[SessionLock], None]
    ) -> SessionLock | None:
        """Connect and take the lock; None if another session holds it."""
        try:
            conn = await asyncpg.connect(
                dsn,
                timeout=10,
                # Idle by design: no server-side idle timeout may end it.
                server_settings={"idle_session_timeout": "0"},
            )
        except _FAILED as e:
            raise errors.StorageError(f"cannot take the advisory lock: {e}") from e
        try:
            got = await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", ns, key)
        except BaseException as e:
            await _close(conn)
            if isinstance(e, _FAILED):
                raise errors.StorageError(f"cannot take the advisory lock: {e}") from e
            raise
        if not got:
            await _close(conn)
            return None
        lock = cls(conn, ns, key)
        conn.add_termination_listener(lambda _: None if lock._released else on_lost(lock))
        return lock

    async def alive(self, timeout_s: float) -> bool:
        """Whether the connection (so the lock) answers within `timeout_s`."""
        if self._conn.is_closed():
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await self._conn.fetchval("SELECT 1")
        except _FAILED:
            return False
        return True

    async def release(self) -> None:
        """End the connection, and so the lock (`on_lost` is not called)."""
        self._released = True
        await _close(self._conn)


async def _close(conn: asyncpg.Connection) -> None:
    try:
        async with asyncio.timeout(2):
            await conn.close()
    except _FAILED:
        conn.terminate()
