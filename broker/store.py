"""PostgreSQL store: sessions, members, runs and reads of the log.

The append transaction lives in `log.py`; this module holds everything else
that touches the tables, as one method per query.

Contract of the reads: a page returns committed events only, in position
order (`seq` for a run, `cursor` for a session), strictly after the given
position. Positions are contiguous, so a page that is shorter than asked
means the caller has reached the head as of that read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple, TypeVar

import asyncpg

from . import errors, ids
from .settings import Settings

ROLES = ("owner", "approver", "viewer")

# Errors after which the server or connection is gone for now: whether a
# transaction in flight committed is unknown, and the same call may work later.
TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.OperatorInterventionError,
    # Raised by asyncpg when the connection broke in the middle of an operation.
    asyncpg.InternalClientError,
)

T = TypeVar("T")


async def retry_transient(
    call: Callable[[], Awaitable[T]], *, for_s: float, what: str = "read"
) -> T:
    """Run a read, retrying it while PostgreSQL is unreachable (at most `for_s`)."""
    deadline = time.monotonic() + for_s
    backoff = 0.05
    while True:
        try:
            return await call()
        except TRANSIENT_DB_ERRORS as e:
            if time.monotonic() > deadline:
                raise errors.StorageError(f"PostgreSQL unavailable during {what}") from e
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


class StoredEvent(NamedTuple):
    run_id: str
    seq: int
    cursor: int
    type: str
    payload: bytes  # the event's JSON, as appended


class Ownership(NamedTuple):
    """What a writer gets when it takes a run: the epoch that fences it."""

    run_id: str
    session_id: str
    epoch: int
    last_seq: int


class RunInfo(NamedTuple):
    run_id: str
    session_id: str
    status: str
    started_by: str
    model: str
    input: str
    owner_id: str | None
    owner_epoch: int
    last_seq: int
    created_at_ms: int
    ended_at_ms: int | None


_PAGE_COLUMNS = "run_id, seq, cursor, type, payload"


class Store:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    @classmethod
    async def connect(cls, dsn: str, settings: Settings) -> Store:
        try:
            pool = await asyncpg.create_pool(
                dsn, min_size=1, max_size=settings.db_pool_size, command_timeout=60
            )
        except (OSError, asyncpg.PostgresError) as e:
            raise errors.StorageError(f"cannot connect to PostgreSQL: {e}") from e
        return cls(pool, settings)

    async def close(self) -> None:
        await self.pool.close()

    # -- sessions and members

    async def create_session(self, created_by: str, title: str = "") -> str:
        session_id = ids.session_id()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO sessions (session_id, title, created_by) VALUES ($1, $2, $3)",
                session_id,
                title,
                created_by,
            )
            await conn.execute(
                "INSERT INTO members (session_id, user_id, role, added_by) "
                "VALUES ($1, $2, 'owner', $2)",
                session_id,
                created_by,
            )
        return session_id

    async def add_member(self, session_id: str, user_id: str, role: str, added_by: str) -> None:
        if role not in ROLES:
            raise errors.ClientError(f"role must be one of {', '.join(ROLES)}")
        try:
            await self.pool.execute(
                "INSERT INTO members (session_id, user_id, role, added_by) VALUES ($1, $2, $3, $4) "
                "ON CONFLICT (session_id, user_id) DO UPDATE SET role = EXCLUDED.role",
                session_id,
                user_id,
                role,
                added_by,
            )
        except asyncpg.ForeignKeyViolationError as e:
            raise errors.SessionNotFound(f"no session {session_id}") from e

    async def member_role(self, session_id: str, user_id: str) -> str | None:
        role: str | None = await self.pool.fetchval(
            "SELECT role FROM members WHERE session_id = $1 AND user_id = $2", session_id, user_id
        )
        return role

    async def session_exists(self, session_id: str) -> bool:
        return bool(
            await self.pool.fetchval("SELECT 1 FROM sessions WHERE session_id = $1", session_id)
        )

    # -- runs

    async def create_run(
        self, session_id: str, started_by: str, *, model: str = "", input: str = ""
    ) -> str:
        run_id = ids.run_id()
        try:
            await self.pool.execute(
                "INSERT INTO runs (run_id, session_id, started_by, model, input) "
                "VALUES ($1, $2, $3, $4, $5)",
                run_id,
                session_id,
                started_by,
                model,
                input,
            )
        except asyncpg.ForeignKeyViolationError as e:
            raise errors.SessionNotFound(f"no session {session_id}") from e
        return run_id

    async def get_run(self, run_id: str) -> RunInfo:
        row = await self.pool.fetchrow(
            "SELECT run_id, session_id, status, started_by, model, input, owner_id, owner_epoch,"
            " last_seq, (extract(epoch FROM created_at) * 1000)::bigint AS created_at_ms,"
            " (extract(epoch FROM ended_at) * 1000)::bigint AS ended_at_ms"
            " FROM runs WHERE run_id = $1",
            run_id,
        )
        if row is None:
            raise errors.RunNotFound(f"no run {run_id}")
        return RunInfo(*row)

    async def claim_run(self, run_id: str, owner_id: str, lease_s: float) -> Ownership:
        """Take ownership of a run: bump its epoch, which fences every earlier
        writer (their next commit appends nothing and fails with StaleEpoch)."""
        row = await self.pool.fetchrow(
            "UPDATE runs SET owner_id = $2, owner_epoch = owner_epoch + 1,"
            " lease_until = now() + make_interval(secs => $3),"
            " status = CASE WHEN status = 'queued' THEN 'running' ELSE status END"
            " WHERE run_id = $1 AND ended_at IS NULL"
            " RETURNING run_id, session_id, owner_epoch, last_seq",
            run_id,
            owner_id,
            lease_s,
        )
        if row is None:
            if await self.pool.fetchval("SELECT 1 FROM runs WHERE run_id = $1", run_id):
                raise errors.RunEnded(f"run {run_id} has ended")
            raise errors.RunNotFound(f"no run {run_id}")
        return Ownership(*row)

    # -- reads of the log

    async def run_page(self, run_id: str, after: int, limit: int) -> list[StoredEvent]:
        rows = await self.pool.fetch(
            f"SELECT {_PAGE_COLUMNS} FROM events WHERE run_id = $1 AND seq > $2"
            " ORDER BY seq LIMIT $3",
            run_id,
            after,
            limit,
        )
        return [StoredEvent(*r) for r in rows]

    async def session_page(self, session_id: str, after: int, limit: int) -> list[StoredEvent]:
        rows = await self.pool.fetch(
            f"SELECT {_PAGE_COLUMNS} FROM events WHERE session_id = $1 AND cursor > $2"
            " ORDER BY cursor LIMIT $3",
            session_id,
            after,
            limit,
        )
        return [StoredEvent(*r) for r in rows]

    async def run_head(self, run_id: str) -> tuple[int, bool]:
        """(last committed seq, whether the run has ended)."""
        row = await self.pool.fetchrow(
            "SELECT last_seq, ended_at IS NOT NULL FROM runs WHERE run_id = $1", run_id
        )
        if row is None:
            raise errors.RunNotFound(f"no run {run_id}")
        return row[0], row[1]

    async def session_head(self, session_id: str) -> int:
        value = await self.pool.fetchval(
            "SELECT last_cursor FROM sessions WHERE session_id = $1", session_id
        )
        if value is None:
            raise errors.SessionNotFound(f"no session {session_id}")
        return int(value)
