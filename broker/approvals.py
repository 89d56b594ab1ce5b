"""Approvals in PostgreSQL: created by the run's worker, decided once.

Contract of `decide`: the first valid decision wins and is stored before it
returns; the same decision again returns the stored one (`created` False); a
different decision gets ApprovalConflict (carrying the stored one); a
decision after `expires_at` gets ApprovalExpired; an unknown id gets
ApprovalNotFound. The single conditional UPDATE makes concurrent deciders on
any number of gateways agree on one winner.
"""

from __future__ import annotations

from typing import NamedTuple

import asyncpg

from . import errors

_COLUMNS = """a.approval_id, a.run_id, r.session_id, a.tool_call_id, a.summary,
    (extract(epoch FROM a.expires_at) * 1000)::bigint AS expires_at_ms,
    a.decision, a.decided_by,
    (extract(epoch FROM a.decided_at) * 1000)::bigint AS decided_at_ms, a.comment"""


class ApprovalInfo(NamedTuple):
    approval_id: str
    run_id: str
    session_id: str
    tool_call_id: str
    summary: str
    expires_at_ms: int
    decision: str | None
    decided_by: str | None
    decided_at_ms: int | None
    comment: str


async def create(
    pool: asyncpg.Pool,
    *,
    approval_id: str,
    run_id: str,
    tool_call_id: str,
    summary: str,
    expires_at_ms: int,
) -> None:
    await pool.execute(
        "INSERT INTO approvals (approval_id, run_id, tool_call_id, summary, expires_at)"
        " VALUES ($1, $2, $3, $4, to_timestamp($5::float8 / 1000))"
        " ON CONFLICT (approval_id) DO NOTHING",
        approval_id,
        run_id,
        tool_call_id,
        summary,
        expires_at_ms,
    )


async def get(pool: asyncpg.Pool, approval_id: str) -> ApprovalInfo:
    row = await pool.fetchrow(
        f"SELECT {_COLUMNS} FROM approvals a JOIN runs r USING (run_id) WHERE a.approval_id = $1",
        approval_id,
    )
    if row is None:
        raise errors.ApprovalNotFound(f"no approval {approval_id}")
    return ApprovalInfo(*row)


async def decide(
    pool: asyncpg.Pool, approval_id: str, decision: str, decided_by: str, comment: str = ""
) -> tuple[ApprovalInfo, bool]:
    """Store a decision. Returns (the stored approval, whether this call decided it)."""
    if decision not in ("approve", "reject"):
        raise errors.ClientError("decision must be 'approve' or 'reject'")
    row = await pool.fetchrow(
        f"""WITH d AS (
            UPDATE approvals SET decision = $2, decided_by = $3, decided_at = now(), comment = $4
            WHERE approval_id = $1 AND decision IS NULL AND expires_at > now()
            RETURNING *)
        SELECT {_COLUMNS} FROM d a JOIN runs r USING (run_id)""",
        approval_id,
        decision,
        decided_by,
        comment,
    )
    if row is not None:
        return ApprovalInfo(*row), True
    stored = await get(pool, approval_id)
    if stored.decision is None or stored.decision == "expired":
        raise errors.ApprovalExpired(f"approval {approval_id} expired")
    if stored.decision == decision:
        return stored, False
    raise errors.ApprovalConflict(
        f"approval {approval_id} was already decided: {stored.decision} by {stored.decided_by}",
        extra={"stored": stored._asdict()},
    )


async def expire(pool: asyncpg.Pool, approval_id: str) -> ApprovalInfo:
    """Mark an undecided approval past its expiry as expired; return what is stored
    (a decision that won the race stays)."""
    await pool.execute(
        "UPDATE approvals SET decision = 'expired', decided_at = now(), decided_by = 'system'"
        " WHERE approval_id = $1 AND decision IS NULL AND expires_at <= now()",
        approval_id,
    )
    return await get(pool, approval_id)


async def open_for_run(pool: asyncpg.Pool, run_id: str) -> list[ApprovalInfo]:
    rows = await pool.fetch(
        f"SELECT {_COLUMNS} FROM approvals a JOIN runs r USING (run_id)"
        " WHERE a.run_id = $1 ORDER BY a.created_at",
        run_id,
    )
    return [ApprovalInfo(*r) for r in rows]


async def close_open_for_run(pool: asyncpg.Pool, run_id: str) -> int:
    """When a run ends while an approval is still open (stopped, failed, taken
    over): mark it expired, so a late decision gets ApprovalExpired instead of
    being stored for a run that will never act on it. Returns how many."""
    status = await pool.execute(
        "UPDATE approvals SET decision = 'expired', decided_at = now(), decided_by = 'system',"
        " comment = 'the run ended' WHERE run_id = $1 AND decision IS NULL",
        run_id,
    )
    return int(status.split()[-1])
