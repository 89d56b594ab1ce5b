"""PostgreSQL store: sessions, members, runs and reads of the log.

The append transaction lives in `log.py`; this module holds everything else
that touches the tables, as one method per query.

Contract of the reads: a page returns committed events only, in position
order (`seq` for a run, `cursor` for a session), strictly after the given
position. Positions are contiguous, so a page that is shorter than asked
means the caller has reached the head as of that read.

Contract of failures (`retry.py`): no method lets an asyncpg error out. A
read is retried while PostgreSQL is unreachable (for `db_retry_s`), a write
is tried once (whether it took effect is unknown, so repeating it is the
caller's call); then it raises `errors.StorageError` (`storage_unavailable`,
retryable), which is itself in `TRANSIENT_DB_ERRORS` for callers that retry.
A statement PostgreSQL refuses is `errors.DatabaseError`. Methods say which
they are with `@_reads` / `@_writes`; the modules that hold the SQL of one
noun (approvals, steps, sessions, members, retention, census) take the Store
and say it the same way.
"""

from __future__ import annotations

import asyncpg
import msgspec

from . import approvals, control, errors, ids, members, sessions, steps
from .retry import DB_ERRORS, TRANSIENT_DB_ERRORS, retry_read, retry_transient, unavailable
from .retry import reads as _reads
from .retry import writes as _writes
from .rows import ROW_CURSOR, ROW_PAYLOAD, ROW_RUN_ID, ROW_SEQ, ROW_TYPE, PageRow, StoredEvent
from .settings import Settings

__all__ = [
    "DB_ERRORS",
    "ROW_CURSOR",
    "ROW_PAYLOAD",
    "ROW_RUN_ID",
    "ROW_SEQ",
    "ROW_TYPE",
    "TRANSIENT_DB_ERRORS",
    "PageRow",
    "StoredEvent",
    "retry_transient",
    "unavailable",
]

ROLES = ("owner", "approver", "viewer")

# What the store hands out is frozen msgspec Structs (no cycles, so gc=False).
# Those made from one row (Ownership, RunInfo, RunSummary, QueuedRun; like
# approvals.ApprovalInfo and steps.StepRecord) are positional, `X(*row)` from a
# SELECT of their fields in order: the cheapest way to build one per run; the
# others take keywords.


class Ownership(msgspec.Struct, frozen=True, gc=False):
    """What a writer gets when it takes a run: the epoch that fences it."""

    run_id: str
    session_id: str
    epoch: int
    last_seq: int


class RunInfo(msgspec.Struct, frozen=True, gc=False):
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
    takeovers: int = 0  # times another worker took the run over


class RunSummary(msgspec.Struct, frozen=True, gc=False):
    run_id: str
    status: str
    started_by: str
    last_seq: int


class QueuedRun(msgspec.Struct, frozen=True, gc=False):
    """A run no worker has started yet (it waits for earlier runs of its session)."""

    run_id: str
    started_by: str
    input: str  # its first control.QUEUED_INPUT_CHARS characters
    created_at: int  # ms since the epoch
    stop_requested_by: str | None
    # Why it has not started: "earlier_run" (an earlier run of its session has
    # not ended), "user_limit" (its starter has worker_user_max_runs executing)
    # or "worker" (it waits for a free worker slot).
    waiting_for: str = "earlier_run"


class StreamPolicy(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What the session lets a Sim agent-events-v1 client see (docs/compat.md)."""

    include_thinking: bool = False
    include_tool_calls: bool = False


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    head: int
    run_policy: str
    members: list[tuple[str, str]]  # (user_id, role)
    runs: list[RunSummary]  # newest first
    stream_policy: StreamPolicy = StreamPolicy()
    title: str = ""
    created_at_ms: int = 0
    archived_at_ms: int | None = None  # None: not archived
    queued: tuple[QueuedRun, ...] = ()  # in the order they will start


_PAGE_COLUMNS = "run_id, seq, cursor, type, payload"  # StoredEvent's fields, in order
_RUN_PAGE = (
    f"SELECT {_PAGE_COLUMNS} FROM events WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3"
)
_SESSION_PAGE = (
    f"SELECT {_PAGE_COLUMNS} FROM events WHERE session_id = $1 AND cursor > $2"
    " ORDER BY cursor LIMIT $3"
)


# The namespace of the workers' liveness locks: pg_advisory_lock(LIVENESS_LOCK_NS,
# key) (workers/liveness.py), which pg_locks shows as classid = LIVENESS_LOCK_NS,
# objid = key, objsubid = 2 (the two-int4 form).
LIVENESS_LOCK_NS = 1919709031  # "rlog"


# A run some worker executes now: started, unended, not parked on an approval.
def _executing(t: str) -> str:
    return f"{t}.status <> 'queued' AND {t}.ended_at IS NULL AND {t}.parked_on IS NULL"


def _load(user: str) -> str:
    """SQL columns `executing, last_started` of `user` (see starter_load)."""
    return (
        f"(SELECT count(*) FROM runs x WHERE x.started_by = {user} AND {_executing('x')})"
        " AS executing, (SELECT coalesce(extract(epoch FROM max(s.started_at)), 0)::float8"
        f" FROM runs s WHERE s.started_by = {user}) AS last_started"
    )


def _held(key: str) -> str:
    """SQL: whether some session of this database holds the liveness lock `key`."""
    return (
        "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted"
        f" AND l.classid = {LIVENESS_LOCK_NS} AND l.objid = ({key})::oid AND l.objsubid = 2"
        " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
    )


async def _keep_session(conn: asyncpg.Connection) -> None:
    """A released connection is reused as it is. asyncpg's default reset
    sends a query (advisory unlocks, CLOSE ALL, UNLISTEN, RESET ALL) at every
    release, a round trip per use of the pool; runlog leaves no such session
    state (an open transaction is still rolled back by asyncpg itself)."""


class Store:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    @classmethod
    async def connect(cls, dsn: str, settings: Settings) -> Store:
        try:
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=settings.db_pool_size,
                command_timeout=60,
                reset=_keep_session,
                # A paused process must not hold its locks (the session's cursor
                # row, a run's row) for as long as it sleeps: PostgreSQL ends
                # the session, its transaction rolls back, the fence decides.
                server_settings={
                    "idle_in_transaction_session_timeout": str(
                        max(1, int(settings.db_idle_in_transaction_timeout_s * 1000))
                    )
                },
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
            raise errors.StorageError(f"cannot connect to PostgreSQL: {e}") from e
        return cls(pool, settings)

    async def close(self) -> None:
        await self.pool.close()

    # -- sessions and members

    @_writes("session create")
    async def create_session(
        self, created_by: str, title: str = "", stream_policy: StreamPolicy | None = None
    ) -> str:
        stream_policy = stream_policy or StreamPolicy()
        session_id = ids.session_id()
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO sessions (session_id, title, title_folded, created_by,"
                " include_thinking, include_tool_calls) VALUES ($1, $2, $3, $4, $5, $6)",
                session_id,
                title,
                sessions.fold(title),
                created_by,
                stream_policy.include_thinking,
                stream_policy.include_tool_calls,
            )
            await conn.execute(
                "INSERT INTO members (session_id, user_id, role, added_by) "
                "VALUES ($1, $2, 'owner', $2)",
                session_id,
                created_by,
            )
        return session_id

    async def add_member(
        self, session_id: str, user_id: str, role: str, added_by: str
    ) -> str | None:
        """Add a member, or change an existing member's role (as `set_member_role`
        does). Returns the role it had (None: it was not a member)."""
        if role not in ROLES:
            raise errors.ClientError(f"role must be one of {', '.join(ROLES)}")
        return await self.change_member(
            session_id, user_id, role, added_by, action="add_member", must_exist=False
        )

    async def set_member_role(self, session_id: str, user_id: str, role: str, by: str) -> str:
        """Change a member's role; returns the one it had. MemberNotFound if not one."""
        if role not in ROLES:
            raise errors.ClientError(f"role must be one of {', '.join(ROLES)}")
        before = await self.change_member(
            session_id, user_id, role, by, action="set_role", must_exist=True
        )
        assert before is not None
        return before

    async def remove_member(self, session_id: str, user_id: str, by: str) -> str:
        """Remove a member; returns the role it had. MemberNotFound if not one."""
        before = await self.change_member(
            session_id, user_id, None, by, action="remove_member", must_exist=True
        )
        assert before is not None
        return before

    @_writes("member change")
    async def change_member(
        self, session_id: str, user_id: str, role: str | None, by: str, *, action: str,
        must_exist: bool,
    ) -> str | None:  # fmt: skip
        """One membership change and its audit row, in one transaction, under the
        last-owner rule (see `members.py`). Returns the role it had."""
        async with self.pool.acquire() as conn, conn.transaction():
            before = await members.change(
                conn, session_id, user_id, role, by, must_exist=must_exist
            )
            await self.audit(
                by, action, session_id=session_id,
                detail={"user_id": user_id, "role": role, "previous_role": before}, conn=conn,
            )  # fmt: skip
        return before

    async def stream_roles(
        self, streams: list[tuple[str, str, str]]
    ) -> list[tuple[str | None, str | None]]:
        """(session, role or None) of each (user, kind, id) of an open stream: one query."""
        return await members.stream_roles(self, streams)

    # -- token revocation (per user)

    @_writes("token revocation")
    async def revoke_tokens(self, user_id: str, by: str) -> float:
        """Revoke every token of `user_id` issued so far; returns the new
        `not_before` (s since the epoch): the next whole second, since `iat` has
        one-second resolution, so a token issued in the revocation's second is
        revoked too. It never moves back (a second revocation keeps the later)."""
        async with self.pool.acquire() as conn, conn.transaction():
            not_before = await conn.fetchval(
                "INSERT INTO token_revocations (user_id, not_before, revoked_by)"
                " VALUES ($1, to_timestamp(floor(extract(epoch FROM now())) + 1), $2)"
                " ON CONFLICT (user_id) DO UPDATE SET"
                " not_before = greatest(token_revocations.not_before, EXCLUDED.not_before),"
                " revoked_by = EXCLUDED.revoked_by, revoked_at = now()"
                " RETURNING extract(epoch FROM not_before)::float8",
                user_id,
                by,
            )
            await self.audit(
                by, "revoke_tokens", detail={"user_id": user_id, "not_before": not_before},
                conn=conn,
            )  # fmt: skip
        return float(not_before)

    @_reads("revocations read")
    async def token_revocations(self) -> dict[str, float]:
        """Every user's `not_before` (s since the epoch)."""
        try:
            rows = await self.pool.fetch(
                "SELECT user_id, extract(epoch FROM not_before)::float8 FROM token_revocations"
            )
        except asyncpg.UndefinedTableError as e:
            raise errors.MigrationError(
                "the database has no token_revocations table (schema older than this version)",
                hint="run `runlog migrate` first",
            ) from e
        return {r[0]: r[1] for r in rows}

    @_reads("role check")
    async def member_role(self, session_id: str, user_id: str) -> str | None:
        role: str | None = await self.pool.fetchval(
            "SELECT role FROM members WHERE session_id = $1 AND user_id = $2", session_id, user_id
        )
        return role

    @_reads("session read")
    async def session_exists(self, session_id: str) -> bool:
        return bool(
            await self.pool.fetchval("SELECT 1 FROM sessions WHERE session_id = $1", session_id)
        )

    async def sessions_page(
        self, user_id: str, *, query: str = "", archived: bool = False,
        before: sessions.PageKey | None = None, limit: int = sessions.PAGE_SIZE,
    ) -> tuple[list[sessions.SessionSummary], sessions.PageKey | None]:  # fmt: skip
        """A page of the sessions `user_id` is a member of, newest first, and
        the key of the next page (None: none); see `sessions.py`."""
        return await sessions.page(
            self, user_id, query=query, archived=archived, before=before, limit=limit
        )

    @_reads("session read")
    async def session_info(self, session_id: str, runs_limit: int = 100) -> SessionInfo:
        """A session's head, run policy, members (oldest first), most recent runs
        and queued runs."""
        async with self.pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT last_cursor, run_policy, include_thinking, include_tool_calls, title,"
                " created_at, archived_at FROM sessions WHERE session_id = $1",
                session_id,
            )
            if row is None:
                raise errors.SessionNotFound(f"no session {session_id}")
            members = await conn.fetch(
                "SELECT user_id, role FROM members WHERE session_id = $1 ORDER BY added_at",
                session_id,
            )
            runs = await conn.fetch(
                "SELECT run_id, status, started_by, last_seq FROM runs WHERE session_id = $1"
                " ORDER BY created_at DESC LIMIT $2",
                session_id,
                runs_limit,
            )
            # The order earlier_active_runs waits in: the order they start.
            queued = await conn.fetch(
                "SELECT r.run_id, r.started_by, left(r.input, $3),"
                " (extract(epoch FROM r.created_at) * 1000)::bigint, r.interrupt_requested_by,"
                " CASE WHEN EXISTS (SELECT 1 FROM runs e WHERE e.session_id = r.session_id"
                " AND e.ended_at IS NULL AND (e.created_at, e.run_id) < (r.created_at, r.run_id))"
                " THEN 'earlier_run' WHEN $4 > 0 AND (SELECT count(*) FROM runs x"
                f" WHERE x.started_by = r.started_by AND {_executing('x')}) >= $4"
                " THEN 'user_limit' ELSE 'worker' END"
                " FROM runs r WHERE r.session_id = $1 AND r.status = 'queued'"
                " AND r.ended_at IS NULL ORDER BY r.created_at, r.run_id LIMIT $2",
                session_id,
                runs_limit,
                control.QUEUED_INPUT_CHARS,
                self.settings.worker_user_max_runs,
            )
        return SessionInfo(
            head=row[0], run_policy=row[1], members=[(m[0], m[1]) for m in members],
            runs=[RunSummary(*r) for r in runs],
            stream_policy=StreamPolicy(include_thinking=row[2], include_tool_calls=row[3]),
            title=row[4], created_at_ms=sessions.ms(row[5]) or 0,
            archived_at_ms=sessions.ms(row[6]), queued=tuple(QueuedRun(*r) for r in queued),
        )  # fmt: skip

    async def approval(self, approval_id: str) -> approvals.ApprovalInfo:
        return await approvals.get(self, approval_id)

    async def run_approvals(self, run_id: str) -> list[approvals.ApprovalInfo]:
        """Every approval of the run, decided or not, oldest first."""
        return await approvals.open_for_run(self, run_id)

    # The run owner's rows (backend.RunStore): approvals.py's and steps.py's
    # functions, whose contracts (fencing, retries) they keep.

    async def create_approval(
        self, *, approval_id: str, run_id: str, epoch: int, tool_call_id: str, summary: str,
        expires_at_ms: int, call_digest: str = "",
    ) -> None:  # fmt: skip
        await approvals.create(
            self, approval_id=approval_id, run_id=run_id, epoch=epoch, tool_call_id=tool_call_id,
            summary=summary, expires_at_ms=expires_at_ms, call_digest=call_digest,
        )  # fmt: skip

    async def poll_approval(self, approval_id: str) -> approvals.ApprovalInfo:
        return await approvals.poll(self, approval_id)

    async def expire_approval(
        self, approval_id: str, *, run_id: str, epoch: int
    ) -> approvals.ApprovalInfo:
        return await approvals.expire(self, approval_id, run_id=run_id, epoch=epoch)

    async def close_run_approvals(self, run_id: str, epoch: int) -> int:
        return await approvals.close_open_for_run(self, run_id, epoch)

    async def load_steps(self, run_id: str) -> list[steps.StepRecord]:
        return await steps.load(self, run_id)

    async def record_step(
        self, *, run_id: str, epoch: int, idx: int, name: str, kind: steps.StepKind, done: bool,
        result: bytes | None, seq: int,
    ) -> None:  # fmt: skip
        await steps.record(
            self, run_id=run_id, epoch=epoch, idx=idx, name=name, kind=kind, done=done,
            result=result, seq=seq,
        )  # fmt: skip

    @_writes("approval decision")
    async def decide_approval(
        self, approval_id: str, decision: str, decided_by: str, comment: str = "",
        call_digest: str = "",
    ) -> tuple[approvals.ApprovalInfo, bool]:  # fmt: skip
        """Store a decision (first one wins, see `approvals.decide`) and, if this
        call decided it, its audit row, in one transaction. Returns (the stored
        approval, whether this call decided it)."""
        async with self.pool.acquire() as conn, conn.transaction():
            info, created = await approvals.decide(
                conn, approval_id, decision, decided_by, comment, call_digest
            )
            if created:
                await self.audit(
                    decided_by, f"approval_{decision}", session_id=info.session_id,
                    run_id=info.run_id, detail={"approval_id": approval_id, "comment": comment},
                    conn=conn,
                )  # fmt: skip
        return info, created

    @_reads("approval event read")
    async def approval_seq(self, run_id: str, approval_id: str) -> int | None:
        """The seq of the run's `approval_required` for `approval_id` (None:
        not in its log)."""
        seq = await self.pool.fetchval(
            "SELECT seq FROM events WHERE run_id = $1 AND type = 'approval_required'"
            " AND convert_from(payload, 'UTF8')::jsonb ->> 'approval_id' = $2"
            " ORDER BY seq LIMIT 1",
            run_id,
            approval_id,
        )
        return None if seq is None else int(seq)

    async def ping(self, timeout_s: float) -> bool:
        """Whether PostgreSQL answers within `timeout_s` (no retries: for /readyz)."""
        try:
            return bool(await self.pool.fetchval("SELECT true", timeout=timeout_s))
        except (*TRANSIENT_DB_ERRORS, asyncpg.PostgresError):
            return False

    # -- runs

    async def create_run(
        self, session_id: str, started_by: str, *, model: str = "", input: str = ""
    ) -> str:
        run_id, _ = await self.create_run_checked(session_id, started_by, model=model, input=input)
        return run_id

    @_writes("run create")
    async def create_run_checked(
        self, session_id: str, started_by: str, *, model: str = "", input: str = ""
    ) -> tuple[str, list[str]]:
        """Create a queued run, applying the session's run policy atomically.
        Returns (run_id, the session's runs that were still active before it);
        raises RunBusy if the policy is 'reject' and one is active."""
        run_id = ids.run_id()
        async with self.pool.acquire() as conn, conn.transaction():
            # The session row's lock serializes run creation within the session,
            # so two concurrent starts cannot both see "nothing running".
            row = await conn.fetchrow(
                "SELECT run_policy, archived_at IS NOT NULL FROM sessions"
                " WHERE session_id = $1 FOR UPDATE",
                session_id,
            )
            if row is None:
                raise errors.SessionNotFound(f"no session {session_id}")
            policy, archived = row
            if archived:
                raise errors.SessionArchived(
                    f"session {session_id} is archived: it takes no new runs",
                    hint="an owner may unarchive it (PATCH /v1/sessions/{id} archived=false)",
                )
            active = [
                r[0]
                for r in await conn.fetch(
                    "SELECT run_id FROM runs WHERE session_id = $1 AND ended_at IS NULL"
                    " ORDER BY created_at",
                    session_id,
                )
            ]
            if active and policy == "reject":
                raise errors.RunBusy(
                    f"session {session_id} has a run in progress",
                    hint="wait for it to end, stop it, or change the session's run_policy",
                    extra={"active_runs": active},
                )
            await conn.execute(
                "INSERT INTO runs (run_id, session_id, started_by, model, input) "
                "VALUES ($1, $2, $3, $4, $5)",
                run_id,
                session_id,
                started_by,
                model,
                input,
            )
        return run_id, active

    @_reads("run read")
    async def get_run(self, run_id: str) -> RunInfo:
        row = await self.pool.fetchrow(
            "SELECT run_id, session_id, status, started_by, model, input, owner_id, owner_epoch,"
            " last_seq, (extract(epoch FROM created_at) * 1000)::bigint AS created_at_ms,"
            " (extract(epoch FROM ended_at) * 1000)::bigint AS ended_at_ms, takeovers"
            " FROM runs WHERE run_id = $1",
            run_id,
        )
        if row is None:
            raise errors.RunNotFound(f"no run {run_id}")
        return RunInfo(*row)

    @_writes("run claim")
    async def claim_queued(
        self, run_id: str, owner_id: str, lease_s: float, lock: int | None = None
    ) -> Ownership | None:
        """Take a run that no worker has started yet; None if it was taken already
        (a job delivered twice) or has ended. `lock`: the key of the claiming
        worker's liveness lock (workers/liveness.py)."""
        row = await self.pool.fetchrow(
            "UPDATE runs SET owner_id = $2, owner_epoch = owner_epoch + 1,"
            " lease_until = now() + make_interval(secs => $3), status = 'running',"
            " owner_lock = $4, started_at = now()"
            " WHERE run_id = $1 AND status = 'queued' AND ended_at IS NULL"
            " RETURNING run_id, session_id, owner_epoch, last_seq",
            run_id,
            owner_id,
            lease_s,
            lock,
        )
        return Ownership(*row) if row is not None else None

    @_writes("run claim")
    async def claim_expired(
        self,
        run_id: str,
        owner_id: str,
        lease_s: float,
        lock: int | None = None,
        *,
        orphan_of: int | None = None,
    ) -> Ownership | None:
        """Take over a started run whose owner's lease ran out — or, with
        `orphan_of`, whose owner held that liveness lock and holds it no more
        (its connection to PostgreSQL ended: the process died). The epoch bump
        fences the old owner. None if the owner is alive after all (renewed,
        or holds its lock again) or another worker took the run first."""
        row = await self.pool.fetchrow(
            "UPDATE runs SET owner_id = $2, owner_epoch = owner_epoch + 1,"
            " lease_until = now() + make_interval(secs => $3), owner_lock = $4,"
            " takeovers = takeovers + 1"
            " WHERE run_id = $1 AND status <> 'queued' AND ended_at IS NULL"
            f" AND (lease_until < now() OR (owner_lock = $5 AND NOT {_held('$5')}))"
            " RETURNING run_id, session_id, owner_epoch, last_seq",
            run_id,
            owner_id,
            lease_s,
            lock,
            orphan_of,
        )
        return Ownership(*row) if row is not None else None

    @_writes("run park")
    async def park(self, run_id: str, epoch: int, approval_id: str) -> bool:
        """Park the owner's run on `approval_id`: no lease, no owner liveness
        key, so no takeover touches it until it is woken (`claim_parked`)."""
        done = await self.pool.fetchval(
            "UPDATE runs SET parked_on = $3, lease_until = NULL, owner_lock = NULL"
            " WHERE run_id = $1 AND owner_epoch = $2 AND ended_at IS NULL RETURNING 1",
            run_id,
            epoch,
            approval_id,
        )
        return bool(done)

    @_writes("run claim")
    async def claim_parked(
        self, run_id: str, owner_id: str, lease_s: float, lock: int | None = None
    ) -> Ownership | None:
        """Take a parked run to resume it; None if it is not parked (any more)."""
        row = await self.pool.fetchrow(
            "UPDATE runs SET owner_id = $2, owner_epoch = owner_epoch + 1,"
            " lease_until = now() + make_interval(secs => $3), owner_lock = $4, parked_on = NULL"
            " WHERE run_id = $1 AND parked_on IS NOT NULL AND ended_at IS NULL"
            " RETURNING run_id, session_id, owner_epoch, last_seq",
            run_id,
            owner_id,
            lease_s,
            lock,
        )
        return Ownership(*row) if row is not None else None

    @_reads("parked run read")
    async def parked_session(self, run_id: str) -> str | None:
        """The session of `run_id` if the run is parked, else None."""
        value: str | None = await self.pool.fetchval(
            "SELECT session_id FROM runs WHERE run_id = $1 AND parked_on IS NOT NULL"
            " AND ended_at IS NULL",
            run_id,
        )
        return value

    @_reads("parked runs read")
    async def ready_parked_runs(self, limit: int = 100) -> list[str]:
        """Parked runs with something to wake them: their approval decided or
        expired, or a stop requested (a wake-up message may have been lost)."""
        rows = await self.pool.fetch(
            "SELECT r.run_id FROM runs r WHERE r.parked_on IS NOT NULL AND r.ended_at IS NULL"
            " AND (r.interrupt_requested_by IS NOT NULL OR EXISTS (SELECT 1 FROM approvals a"
            " WHERE a.approval_id = r.parked_on AND (a.decision IS NOT NULL"
            " OR a.expires_at <= now()))) LIMIT $1",
            limit,
        )
        return [r[0] for r in rows]

    @_reads("running runs read")
    async def starter_load(self, run_id: str) -> tuple[str, int, float] | None:
        """For a queued run: who started it, how many of their runs a worker
        executes now (started, unended, not parked), and when a run of theirs
        was last taken (epoch s; 0: never). None if the run is not queued."""
        row = await self.pool.fetchrow(
            f"SELECT q.started_by, {_load('q.started_by')} FROM runs q"
            " WHERE q.run_id = $1 AND q.status = 'queued' AND q.ended_at IS NULL",
            run_id,
        )
        return (row[0], row[1], row[2]) if row is not None else None

    @_reads("queued runs read")
    async def fairer_queued_run(
        self, user: str, executing: int, last_started: float
    ) -> tuple[str, str] | None:
        """A queued run that may start now (nothing earlier active in its
        session) of a user with a better claim to the next slot than `user`
        (who has `executing` runs executing and was last served at
        `last_started`): fewer executing, or as many and served less
        recently. Of those, the best user's oldest run: (run_id, session_id)."""
        row = await self.pool.fetchrow(
            "SELECT run_id, session_id FROM (SELECT r.run_id, r.session_id, r.created_at,"
            f" {_load('r.started_by')} FROM runs r"
            " WHERE r.status = 'queued' AND r.ended_at IS NULL AND r.started_by <> $1"
            " AND NOT EXISTS (SELECT 1 FROM runs e WHERE e.session_id = r.session_id"
            " AND e.ended_at IS NULL AND (e.created_at, e.run_id) < (r.created_at, r.run_id))"
            ") c WHERE (c.executing, c.last_started) < ($2, $3)"
            " ORDER BY c.executing, c.last_started, c.created_at LIMIT 1",
            user,
            executing,
            last_started,
        )
        return (row[0], row[1]) if row is not None else None

    @_reads("orphaned runs read")
    async def orphaned_runs(self, limit: int = 100) -> list[tuple[str, int]]:
        """Started, unended runs whose owner's liveness lock nobody holds:
        (run_id, owner_lock), whatever their lease says."""
        rows = await self.pool.fetch(
            "SELECT run_id, owner_lock FROM runs WHERE ended_at IS NULL AND status <> 'queued'"
            f" AND owner_lock IS NOT NULL AND NOT {_held('owner_lock')} LIMIT $1",
            limit,
        )
        return [(r[0], r[1]) for r in rows]

    @_writes("lease renewal")
    async def renew_lease(self, run_id: str, epoch: int, lease_s: float) -> bool:
        """Extend the owner's lease; False means ownership is lost (stop writing)."""
        done = await self.pool.fetchval(
            "UPDATE runs SET lease_until = now() + make_interval(secs => $3)"
            " WHERE run_id = $1 AND owner_epoch = $2 AND ended_at IS NULL RETURNING 1",
            run_id,
            epoch,
            lease_s,
        )
        return bool(done)

    @_writes("run release")
    async def release(self, run_id: str, epoch: int) -> None:
        """Give a run up at once (drain): its lease ends now, so another worker
        can take it over without waiting."""
        await self.pool.execute(
            "UPDATE runs SET lease_until = now() - interval '1 second'"
            " WHERE run_id = $1 AND owner_epoch = $2",
            run_id,
            epoch,
        )

    @_writes("run status")
    async def set_status(self, run_id: str, epoch: int, status: str) -> bool:
        """The run's status (`running`, `waiting_approval`) under the owner's
        epoch (fenced); False if another worker owns it or it ended."""
        done = await self.pool.fetchval(
            "UPDATE runs SET status = $3"
            " WHERE run_id = $1 AND owner_epoch = $2 AND ended_at IS NULL RETURNING 1",
            run_id,
            epoch,
            status,
        )
        return bool(done)

    @_reads("expired runs read")
    async def expired_runs(self, limit: int = 100) -> list[str]:
        """Started, unended runs whose owner's lease ran out."""
        rows = await self.pool.fetch(
            "SELECT run_id FROM runs WHERE ended_at IS NULL AND status <> 'queued'"
            " AND lease_until < now() ORDER BY lease_until LIMIT $1",
            limit,
        )
        return [r[0] for r in rows]

    @_reads("queued runs read")
    async def stale_queued_runs(
        self, older_than_s: float, limit: int = 100
    ) -> list[tuple[str, str]]:
        """Queued runs no worker has taken for a while: (run_id, session_id)."""
        rows = await self.pool.fetch(
            "SELECT run_id, session_id FROM runs WHERE status = 'queued' AND ended_at IS NULL"
            " AND created_at < now() - make_interval(secs => $1) ORDER BY created_at LIMIT $2",
            older_than_s,
            limit,
        )
        return [(r[0], r[1]) for r in rows]

    @_reads("conversation read")
    async def conversation(
        self, session_id: str, run_id: str, limit: int
    ) -> list[tuple[str, str, list[bytes]]]:
        """The session's last `limit` ended runs created before `run_id`, oldest
        first: (run_id, input, payloads of their text_delta and message_reset
        events in seq order)."""
        rows = await self.pool.fetch(
            "SELECT r.run_id, r.input FROM runs r, runs me WHERE me.run_id = $2"
            " AND r.session_id = $1 AND r.ended_at IS NOT NULL AND r.run_id <> me.run_id"
            " AND (r.created_at, r.run_id) < (me.created_at, me.run_id)"
            " ORDER BY r.created_at DESC, r.run_id DESC LIMIT $3",
            session_id,
            run_id,
            limit,
        )
        runs = [(r[0], r[1]) for r in reversed(rows)]
        texts: dict[str, list[bytes]] = {rid: [] for rid, _ in runs}
        if runs:
            for e in await self.pool.fetch(
                "SELECT run_id, payload FROM events WHERE run_id = ANY($1::text[])"
                " AND type IN ('text_delta', 'message_reset') ORDER BY run_id, seq",
                list(texts),
            ):
                texts[e[0]].append(e[1])
        return [(rid, inp, texts[rid]) for rid, inp in runs]

    @_reads("active runs read")
    async def earlier_active_runs(self, session_id: str, run_id: str) -> list[str]:
        """Unended runs of the session created before `run_id` (for 'enqueue')."""
        rows = await self.pool.fetch(
            "SELECT r.run_id FROM runs r, runs me WHERE me.run_id = $2"
            " AND r.session_id = $1 AND r.ended_at IS NULL AND r.run_id <> me.run_id"
            " AND (r.created_at, r.run_id) < (me.created_at, me.run_id)",
            session_id,
            run_id,
        )
        return [r[0] for r in rows]

    @_reads("active runs read")
    async def active_runs(self, session_id: str) -> list[str]:
        rows = await self.pool.fetch(
            "SELECT run_id FROM runs WHERE session_id = $1 AND ended_at IS NULL"
            " ORDER BY created_at",
            session_id,
        )
        return [r[0] for r in rows]

    @_reads("run policy read")
    async def session_run_policy(self, session_id: str) -> str:
        value = await self.pool.fetchval(
            "SELECT run_policy FROM sessions WHERE session_id = $1", session_id
        )
        if value is None:
            raise errors.SessionNotFound(f"no session {session_id}")
        return str(value)

    @_writes("run policy update")
    async def set_run_policy(self, session_id: str, policy: str) -> None:
        if policy not in ("reject", "enqueue", "interrupt"):
            raise errors.ClientError("run_policy must be reject, enqueue or interrupt")
        await self.pool.execute(
            "UPDATE sessions SET run_policy = $2 WHERE session_id = $1", session_id, policy
        )

    @_reads("stream policy read")
    async def stream_policy(self, session_id: str) -> StreamPolicy:
        row = await self.pool.fetchrow(
            "SELECT include_thinking, include_tool_calls FROM sessions WHERE session_id = $1",
            session_id,
        )
        if row is None:
            raise errors.SessionNotFound(f"no session {session_id}")
        return StreamPolicy(include_thinking=row[0], include_tool_calls=row[1])

    @_writes("session update")
    async def update_session(
        self, session_id: str, by: str, changes: sessions.Changes
    ) -> tuple[sessions.Settings, sessions.Settings]:
        """Change a session's settings and audit each change, in one
        transaction (see `sessions.py`). Returns (before, after)."""
        async with self.pool.acquire() as conn, conn.transaction():
            before, after = await sessions.update(conn, session_id, changes)
            for action, detail in sessions.audit_rows(before, after, changes):
                await self.audit(by, action, session_id=session_id, detail=detail, conn=conn)
        return before, after

    @_writes("interrupt request")
    async def request_interrupt(self, run_id: str, requested_by: str, reason: str) -> bool:
        """Record a stop request on the run (the first one is kept) and audit every
        request. Returns whether this call was the first; RunEnded if it ended."""
        async with self.pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                "SELECT session_id, interrupt_requested_by, ended_at IS NOT NULL"
                " FROM runs WHERE run_id = $1 FOR UPDATE",
                run_id,
            )
            if row is None:
                raise errors.RunNotFound(f"no run {run_id}")
            session_id, already_by, ended = row
            if ended:
                raise errors.RunEnded(f"run {run_id} has already ended")
            if already_by is None:
                await conn.execute(
                    "UPDATE runs SET interrupt_requested_by = $2,"
                    " interrupt_requested_at = now(), interrupt_reason = $3 WHERE run_id = $1",
                    run_id,
                    requested_by,
                    reason,
                )
            await self.audit(
                requested_by, "interrupt", session_id=session_id, run_id=run_id,
                detail={"reason": reason, "first": already_by is None}, conn=conn,
            )  # fmt: skip
            return already_by is None

    @_reads("interrupt read")
    async def interrupt_request(self, run_id: str) -> tuple[str, int, str] | None:
        """(requested_by, requested_at ms, reason) if a stop was requested."""
        row = await self.pool.fetchrow(
            "SELECT interrupt_requested_by,"
            " (extract(epoch FROM interrupt_requested_at) * 1000)::bigint, interrupt_reason"
            " FROM runs WHERE run_id = $1 AND interrupt_requested_by IS NOT NULL",
            run_id,
        )
        return (row[0], row[1], row[2]) if row is not None else None

    @_writes("audit")
    async def audit(
        self,
        actor: str,
        action: str,
        *,
        session_id: str | None = None,
        run_id: str | None = None,
        detail: dict[str, object] | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> None:
        sql = (
            "INSERT INTO audit (actor, action, session_id, run_id, detail)"
            " VALUES ($1, $2, $3, $4, $5::jsonb)"
        )
        args = (actor, action, session_id, run_id, msgspec.json.encode(detail or {}).decode())
        if conn is not None:
            await conn.execute(sql, *args)
        else:
            await self.pool.execute(sql, *args)

    @_writes("run claim")
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

    # -- reads of the log: with retries, like every read

    async def run_page(self, run_id: str, after: int, limit: int) -> list[StoredEvent]:
        return await self.stream_page(True, run_id, after, limit, retry_s=self.settings.db_retry_s)

    async def session_page(self, session_id: str, after: int, limit: int) -> list[StoredEvent]:
        return await self.stream_page(
            False, session_id, after, limit, retry_s=self.settings.db_retry_s
        )

    async def run_head(self, run_id: str) -> tuple[int, bool]:
        """(last committed seq, whether the run has ended)."""
        return await self.stream_head(True, run_id, retry_s=self.settings.db_retry_s)

    async def session_head(self, session_id: str) -> int:
        head, _ = await self.stream_head(False, session_id, retry_s=self.settings.db_retry_s)
        return head

    # -- a stream (a run's or a session's), read with retries: what readers use

    async def stream_page(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float
    ) -> list[StoredEvent]:
        """A run's page (by seq) or a session's (by cursor), retried while
        PostgreSQL is unreachable (at most `retry_s`), then StorageError."""
        rows = await self.stream_rows(by_run, ident, after, limit, retry_s=retry_s)
        return [StoredEvent(*r) for r in rows]

    async def stream_rows(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float
    ) -> list[PageRow]:
        """`stream_page` as the rows PostgreSQL returned, without an object
        per event: each row holds StoredEvent's fields in its order (index
        them with ROW_SEQ, ROW_CURSOR, ROW_TYPE, ROW_PAYLOAD; `StoredEvent(*row)`
        makes the event). For readers that need only positions and payloads
        (a catch-up replay builds its frames from them: ~0.5 µs an event
        less than a StoredEvent each)."""
        sql = _RUN_PAGE if by_run else _SESSION_PAGE
        rows: list[PageRow] = await retry_read(
            lambda: self.pool.fetch(sql, ident, after, limit), for_s=retry_s, what="page read"
        )
        return rows

    async def stream_head(self, by_run: bool, ident: str, *, retry_s: float) -> tuple[int, bool]:
        """(head position, whether the stream ended: only runs end), with retries."""
        if by_run:
            row = await retry_read(
                lambda: self.pool.fetchrow(
                    "SELECT last_seq, ended_at IS NOT NULL FROM runs WHERE run_id = $1", ident
                ),
                for_s=retry_s,
                what="head read",
            )
            if row is None:
                raise errors.RunNotFound(f"no run {ident}")
            return row[0], row[1]
        value = await retry_read(
            lambda: self.pool.fetchval(
                "SELECT last_cursor FROM sessions WHERE session_id = $1", ident
            ),
            for_s=retry_s,
            what="head read",
        )
        if value is None:
            raise errors.SessionNotFound(f"no session {ident}")
        return int(value), False
