"""Retention of the log in PostgreSQL: pruning old runs (`runlog prune`).

JetStream keeps the live feed for `events_max_age_s` only; PostgreSQL keeps
every run until it is pruned. `prune` deletes the runs that *ended* before a
cutoff, together with everything that belongs to them alone: their events,
approvals and run-scoped audit rows.

Contract:
- Only ended runs are touched (`ended_at` before the cutoff); a run still
  queued, running or waiting for an approval is never deleted, however old.
- Sessions, their members and session-scoped audit rows stay, even when no
  run is left. A session stream then simply has no events at the pruned
  cursors: readers page with `cursor > N`, so they skip the holes.
- Each run is deleted whole, in one transaction with the other runs of its
  batch: a reader sees a run either complete or gone, never truncated.
- Transactions are bounded: a batch takes runs until their events add up to
  `batch_events` (a run bigger than that is a batch of its own), so locks are
  short and WAL is written in steps. Rerunning after an interruption finishes
  the job; the cutoff is fixed when the call starts.
- Candidates are walked in `run_id` order along the primary key, so the whole
  prune reads the runs table once, however many batches it takes.
- Failures (`retry.py`): a prune writes, so it is tried once; an outage is
  StorageError, and running it again finishes the job.
"""

from __future__ import annotations

import datetime as dt
import logging

import asyncpg
import msgspec

from . import errors
from .retry import Database, writes

log = logging.getLogger(__name__)

BATCH_EVENTS = 50_000
# Candidates fetched per read of the runs table (then cut into batches).
_SCAN_RUNS = 1_000


class PruneReport(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    cutoff: dt.datetime
    dry_run: bool
    runs: int
    events: int
    approvals: int
    audit: int
    batches: int

    def describe(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        return (
            f"{verb} {self.runs} run(s) that ended before {self.cutoff.isoformat()}: "
            f"{self.events} event(s), {self.approvals} approval(s), "
            f"{self.audit} audit row(s), in {self.batches} transaction(s)"
        )


@writes("prune")
async def prune(
    store: Database,
    *,
    older_than_s: float,
    dry_run: bool = False,
    batch_events: int = BATCH_EVENTS,
) -> PruneReport:
    """Delete (or with `dry_run`, count) ended runs older than `older_than_s`."""
    if older_than_s <= 0:
        raise errors.ClientError(
            "the retention period must be positive", hint="e.g. --older-than-days 30"
        )
    if batch_events < 1:
        raise errors.ClientError("batch_events must be at least 1")
    # One cutoff for the whole call, from the database clock (the one that
    # stamped ended_at), so batches agree with each other.
    pool = store.pool
    cutoff: dt.datetime = await pool.fetchval(
        "SELECT now() - make_interval(secs => $1)", older_than_s
    )
    totals = [0, 0, 0, 0]  # runs, events, approvals, audit
    batches = 0
    after = ""
    while True:
        rows = await pool.fetch(
            "SELECT run_id, last_seq FROM runs"
            " WHERE run_id > $1 AND ended_at IS NOT NULL AND ended_at < $2"
            " ORDER BY run_id LIMIT $3",
            after,
            cutoff,
            _SCAN_RUNS,
        )
        if not rows:
            break
        after = rows[-1][0]
        for batch in _batches([(r[0], r[1]) for r in rows], batch_events):
            counts = await (_count(pool, batch) if dry_run else _delete(pool, batch, cutoff))
            for i, n in enumerate(counts):
                totals[i] += n
            batches += 1
            log.info("prune: batch %d, %d run(s), %d event(s)", batches, counts[0], counts[1])
    runs, events, approvals, audit = totals
    return PruneReport(
        cutoff=cutoff,
        dry_run=dry_run,
        runs=runs,
        events=events,
        approvals=approvals,
        audit=audit,
        batches=batches,
    )


def _batches(runs: list[tuple[str, int]], batch_events: int) -> list[list[str]]:
    """Cut (run_id, event count) pairs into batches of at most `batch_events`
    events, keeping every run whole."""
    out: list[list[str]] = []
    current: list[str] = []
    size = 0
    for run_id, n in runs:
        if current and size + n > batch_events:
            out.append(current)
            current, size = [], 0
        current.append(run_id)
        size += n
    if current:
        out.append(current)
    return out


async def _delete(pool: asyncpg.Pool, run_ids: list[str], cutoff: dt.datetime) -> list[int]:
    async with pool.acquire() as conn, conn.transaction():
        # Lock the runs first and delete only those still matching: the
        # candidate list was read outside this transaction.
        locked = [
            r[0]
            for r in await conn.fetch(
                "SELECT run_id FROM runs WHERE run_id = ANY($1::text[])"
                " AND ended_at IS NOT NULL AND ended_at < $2 FOR UPDATE",
                run_ids,
                cutoff,
            )
        ]
        if not locked:
            return [0, 0, 0, 0]
        events = await conn.execute("DELETE FROM events WHERE run_id = ANY($1::text[])", locked)
        approvals = await conn.execute(
            "DELETE FROM approvals WHERE run_id = ANY($1::text[])", locked
        )
        audit = await conn.execute("DELETE FROM audit WHERE run_id = ANY($1::text[])", locked)
        runs = await conn.execute("DELETE FROM runs WHERE run_id = ANY($1::text[])", locked)
    return [_rowcount(runs), _rowcount(events), _rowcount(approvals), _rowcount(audit)]


async def _count(pool: asyncpg.Pool, run_ids: list[str]) -> list[int]:
    row = await pool.fetchrow(
        "SELECT cardinality($1::text[]),"
        " (SELECT count(*) FROM events WHERE run_id = ANY($1::text[])),"
        " (SELECT count(*) FROM approvals WHERE run_id = ANY($1::text[])),"
        " (SELECT count(*) FROM audit WHERE run_id = ANY($1::text[]))",
        run_ids,
    )
    assert row is not None
    return [int(v) for v in row]


def _rowcount(status: str) -> int:
    # asyncpg returns the command tag, e.g. "DELETE 42".
    return int(status.rsplit(" ", 1)[-1])
