"""Approvals in PostgreSQL: created by the run's worker, decided once.

Contract of `decide`: the first valid decision wins and is stored before it
returns; the same decision again returns the stored one (`created` False); a
different decision gets ApprovalConflict (carrying the stored one); a
decision after `expires_at` gets ApprovalExpired; an unknown id gets
ApprovalNotFound. The single conditional UPDATE makes concurrent deciders on
any number of gateways agree on one winner. `decide` takes a connection so
that the caller can commit the decision together with its audit row.

Contract of the worker's writes (`create`, `expire`, `close_open_for_run`):
each is made on the run's behalf by its owner and is fenced like an append
(`log.py`) or `Store.set_status`: it takes effect only while
`runs.owner_epoch` is the writer's epoch and the run has not ended, else it
changes nothing and raises StaleEpoch. The check is part of the write's own
statement, and it locks the run's row (FOR SHARE), which a takeover's epoch
bump must wait for: either the write commits first (and the new owner sees
it), or it sees the new epoch. So a worker that was paused or partitioned
while it owned the run — even one whose statement was already on its way —
can neither leave an approval behind for a run it no longer owns nor expire
the one the new owner waits on.

Contract of failures: `retry.py` (`get` and `open_for_run` read, `poll`
is tried once, the worker's writes write); `decide` runs in its caller's transaction
(`Store.decide_approval`), which says it.
"""

from __future__ import annotations

import asyncpg
import msgspec

from . import errors
from .fence import as_owner
from .retry import Database, reads, writes

_COLUMNS = """a.approval_id, a.run_id, r.session_id, a.tool_call_id, a.summary,
    (extract(epoch FROM a.expires_at) * 1000)::bigint AS expires_at_ms,
    a.decision, a.decided_by,
    (extract(epoch FROM a.decided_at) * 1000)::bigint AS decided_at_ms, a.comment,
    a.call_digest"""


class ApprovalInfo(msgspec.Struct, frozen=True, gc=False):
    """An approval as stored: a row of `_COLUMNS`, in order (`ApprovalInfo(*row)`)."""

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
    call_digest: str  # what the approver was shown (migration 0007); "" before it


@writes("approval create")
async def create(
    store: Database,
    *,
    approval_id: str,
    run_id: str,
    epoch: int,
    tool_call_id: str,
    summary: str,
    expires_at_ms: int,
    call_digest: str = "",
) -> None:
    """Store a new approval for the run (fenced by `epoch`). Creating the same
    id again is a no-op, so a create whose reply was lost can be retried."""
    await as_owner(
        store,
        run_id,
        epoch,
        "INSERT INTO approvals (approval_id, run_id, tool_call_id, summary, expires_at,"
        " call_digest)"
        " SELECT $3, run_id, $4, $5, to_timestamp($6::float8 / 1000), $7 FROM owner"
        " ON CONFLICT (approval_id) DO NOTHING RETURNING 1",
        approval_id,
        tool_call_id,
        summary,
        expires_at_ms,
        call_digest,
    )


@reads("approval read")
async def get(store: Database, approval_id: str) -> ApprovalInfo:
    return await _get(store.pool, approval_id)


@writes("approval poll")
async def poll(store: Database, approval_id: str) -> ApprovalInfo:
    """`get`, tried once: for a caller that polls (its next round is the retry)."""
    return await _get(store.pool, approval_id)


async def _get(db: asyncpg.Pool | asyncpg.Connection, approval_id: str) -> ApprovalInfo:
    row = await db.fetchrow(
        f"SELECT {_COLUMNS} FROM approvals a JOIN runs r USING (run_id) WHERE a.approval_id = $1",
        approval_id,
    )
    if row is None:
        raise errors.ApprovalNotFound(f"no approval {approval_id}")
    return ApprovalInfo(*row)


async def decide(
    conn: asyncpg.Connection,
    approval_id: str,
    decision: str,
    decided_by: str,
    comment: str = "",
    call_digest: str = "",
) -> tuple[ApprovalInfo, bool]:
    """Store a decision. Returns (the stored approval, whether this call decided it).
    The decision commits with the transaction `conn` is in.
    With `call_digest` (the one the approver was shown), a decision for an
    approval bound to another call gets ApprovalStale and stores nothing."""
    if decision not in ("approve", "reject"):
        raise errors.ClientError("decision must be 'approve' or 'reject'")
    row = await conn.fetchrow(
        f"""WITH d AS (
            UPDATE approvals SET decision = $2, decided_by = $3, decided_at = now(), comment = $4
            WHERE approval_id = $1 AND decision IS NULL AND expires_at > now()
              AND ($5 = '' OR call_digest = $5)
            RETURNING *)
        SELECT {_COLUMNS} FROM d a JOIN runs r USING (run_id)""",
        approval_id,
        decision,
        decided_by,
        comment,
        call_digest,
    )
    if row is not None:
        return ApprovalInfo(*row), True
    return not_taken(await _get(conn, approval_id), decision, call_digest)


def not_taken(stored: ApprovalInfo, decision: str, call_digest: str) -> tuple[ApprovalInfo, bool]:
    """A decision that did not take effect on `stored`: (stored, False) when it
    repeats the stored one, else the error that says why (a store's `decide`,
    this module's or the memory store's, after its update matched nothing)."""
    approval_id = stored.approval_id
    if call_digest and stored.call_digest != call_digest:
        raise errors.ApprovalStale(
            f"approval {approval_id} guards another tool call than the one shown "
            "(its arguments changed): decide it again from what it shows now",
            extra={"call_digest": stored.call_digest},
        )
    if stored.decision is None or stored.decision == "expired":
        raise errors.ApprovalExpired(f"approval {approval_id} expired")
    if stored.decision == decision:
        return stored, False
    raise errors.ApprovalConflict(
        f"approval {approval_id} was already decided: {stored.decision} by {stored.decided_by}",
        extra={"stored": msgspec.structs.asdict(stored)},
    )


@writes("approval expiry")
async def expire(store: Database, approval_id: str, *, run_id: str, epoch: int) -> ApprovalInfo:
    """Mark an undecided approval of the run past its expiry as expired (fenced
    by `epoch`); return what is stored (a decision that won the race stays)."""
    await as_owner(
        store,
        run_id,
        epoch,
        "UPDATE approvals SET decision = 'expired', decided_at = now(), decided_by = 'system'"
        " WHERE approval_id = $3 AND run_id = $1 AND EXISTS (SELECT FROM owner)"
        " AND decision IS NULL AND expires_at <= now() RETURNING 1",
        approval_id,
    )
    return await _get(store.pool, approval_id)


@reads("approvals read")
async def open_for_run(store: Database, run_id: str) -> list[ApprovalInfo]:
    """Every approval of the run, decided or not, oldest first."""
    rows = await store.pool.fetch(
        f"SELECT {_COLUMNS} FROM approvals a JOIN runs r USING (run_id)"
        " WHERE a.run_id = $1 ORDER BY a.created_at",
        run_id,
    )
    return [ApprovalInfo(*r) for r in rows]


@writes("approval close")
async def close_open_for_run(store: Database, run_id: str, epoch: int) -> int:
    """When a run ends while an approval is still open (stopped, failed, taken
    over): mark it expired, so a late decision gets ApprovalExpired instead of
    being stored for a run that will never act on it. Fenced by `epoch`: the
    owner ending the run calls it before its run_end commits. Returns how many."""
    return await as_owner(
        store,
        run_id,
        epoch,
        "UPDATE approvals SET decision = 'expired', decided_at = now(), decided_by = 'system',"
        " comment = 'the run ended'"
        " WHERE run_id = $1 AND EXISTS (SELECT FROM owner) AND decision IS NULL RETURNING 1",
    )
