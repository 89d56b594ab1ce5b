"""Retention: `runlog prune` deletes ended runs older than a cutoff with their
events, approvals and run-scoped audit rows, and nothing else.

Old runs are made by backdating `created_at` / `ended_at` by ten years, far
past anything other tests (or a shared external database) hold, so the prune
below can only reach the runs made here.
"""

from __future__ import annotations

import asyncio
import sys
import time

import asyncpg
import pytest

from broker import approvals, errors, events, retention
from broker.runtime import Broker
from broker.settings import Settings

from .helpers import collect, text

_OLD = "10 years"
_CUTOFF_DAYS = 3000.0  # ~8.2 years: the backdated runs are older, nothing else is


async def _run(
    broker: Broker, session_id: str, n: int, *, end: bool = True, approval: bool = False
) -> str:
    run_id = await broker.store.create_run(session_id, "alice")
    w = await broker.claim(run_id, "prune-test")
    if approval:  # created by the owner while the run is going
        await approvals.create(
            broker.store, approval_id=f"ap_{run_id}", run_id=run_id, epoch=w.epoch,
            tool_call_id="call_1", summary="send it?",
            expires_at_ms=int(time.time() * 1000) + 60_000,
        )  # fmt: skip
    for i in range(n):
        await w.append(text(i))
    if end:
        await w.append(events.RunEnd(status="completed"))
    await w.flush()
    await broker.store.audit("alice", "interrupt", session_id=session_id, run_id=run_id)
    return run_id


async def _backdate(pool: asyncpg.Pool, run_id: str, *, created: bool, ended: bool) -> None:
    if created:
        await pool.execute(
            f"UPDATE runs SET created_at = created_at - interval '{_OLD}' WHERE run_id = $1",
            run_id,
        )
    if ended:
        await pool.execute(
            f"UPDATE runs SET ended_at = ended_at - interval '{_OLD}' WHERE run_id = $1", run_id
        )


async def _counts(pool: asyncpg.Pool, run_ids: list[str]) -> dict[str, int]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM runs WHERE run_id = ANY($1::text[])),"
        " (SELECT count(*) FROM events WHERE run_id = ANY($1::text[])),"
        " (SELECT count(*) FROM approvals WHERE run_id = ANY($1::text[])),"
        " (SELECT count(*) FROM audit WHERE run_id = ANY($1::text[]))",
        run_ids,
    )
    assert row is not None
    return dict(zip(("runs", "events", "approvals", "audit"), row, strict=True))


async def _session_rows(pool: asyncpg.Pool, session_ids: list[str]) -> tuple[int, ...]:
    row = await pool.fetchrow(
        "SELECT (SELECT count(*) FROM sessions WHERE session_id = ANY($1::text[])),"
        " (SELECT count(*) FROM members WHERE session_id = ANY($1::text[])),"
        " (SELECT count(*) FROM audit WHERE session_id = ANY($1::text[]) AND run_id IS NULL)",
        session_ids,
    )
    assert row is not None
    return tuple(row)


async def test_prune_removes_old_ended_runs_and_nothing_else(
    broker: Broker, settings: Settings
) -> None:
    pool = broker.store.pool
    s1 = await broker.store.create_session("alice")  # old and new runs
    s2 = await broker.store.create_session("alice")  # only old ones: left empty
    s3 = await broker.store.create_session("alice")  # nothing old
    old = [
        await _run(broker, s1, 40, approval=True),
        await _run(broker, s1, 15),
        await _run(broker, s2, 30, approval=True),
    ]
    for run_id in old:
        await _backdate(pool, run_id, created=True, ended=True)
    unended = await _run(broker, s1, 10, end=False)  # old, but never ended
    await _backdate(pool, unended, created=True, ended=False)
    ended_recently = await _run(broker, s1, 12, approval=True)  # created long ago
    await _backdate(pool, ended_recently, created=True, ended=False)
    kept_new = [await _run(broker, s1, 8), await _run(broker, s3, 9, approval=True)]
    kept = [unended, ended_recently, *kept_new]
    for sid in (s1, s2, s3):
        await broker.store.audit("alice", "add_member", session_id=sid)

    old_before = await _counts(pool, old)
    kept_before = await _counts(pool, kept)
    sessions_before = await _session_rows(pool, [s1, s2, s3])
    assert old_before == {"runs": 3, "events": 88, "approvals": 2, "audit": 3}

    # A dry run counts exactly what the real run deletes, and deletes nothing.
    dry = await retention.prune(broker.store, older_than_s=_CUTOFF_DAYS * 86400, dry_run=True)
    assert (dry.runs, dry.events, dry.approvals, dry.audit) == (3, 88, 2, 3)
    assert await _counts(pool, old) == old_before

    # Bounded transactions: at most 20 events per batch puts each run (41,
    # 16 and 31 events) in a transaction of its own: runs are never split.
    report = await retention.prune(broker.store, older_than_s=_CUTOFF_DAYS * 86400, batch_events=20)
    assert (report.runs, report.events, report.approvals, report.audit) == (3, 88, 2, 3)
    assert report.batches == 3 and not report.dry_run

    assert await _counts(pool, old) == {"runs": 0, "events": 0, "approvals": 0, "audit": 0}
    assert await _counts(pool, kept) == kept_before
    assert await _session_rows(pool, [s1, s2, s3]) == sessions_before  # sessions stay

    # Nothing is left to prune; a second pass is a no-op.
    again = await retention.prune(broker.store, older_than_s=_CUTOFF_DAYS * 86400)
    assert (again.runs, again.events, again.batches) == (0, 0, 0)

    # The session stream skips the pruned cursors: it replays exactly the
    # events of the runs that are left, in cursor order.
    sub = await broker.subscribe(session_id=s1, after=0)
    remaining = kept_before["events"] - 9 - 1  # s3's run (9 deltas + run_end) is elsewhere
    got = await collect(sub, remaining)
    await sub.close()
    assert len(got) == remaining
    assert {e.run_id for e in got} == {unended, ended_recently, kept_new[0]}
    cursors = [e.cursor for e in got]
    assert cursors == sorted(set(cursors))


async def test_prune_command(broker: Broker, settings: Settings) -> None:
    sid = await broker.store.create_session("alice")
    run_id = await _run(broker, sid, 5)
    await _backdate(broker.store.pool, run_id, created=True, ended=True)

    async def prune(*args: str) -> str:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlog.cli", "prune",
            "--older-than-days", str(_CUTOFF_DAYS), "--database-url", settings.database_url,
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await proc.communicate()
        assert proc.returncode == 0, out.decode()
        return out.decode()

    assert "would delete 1 run(s)" in await prune("--dry-run")
    assert await _counts(broker.store.pool, [run_id]) == {
        "runs": 1, "events": 6, "approvals": 0, "audit": 1,
    }  # fmt: skip
    assert "deleted 1 run(s)" in await prune()
    assert (await _counts(broker.store.pool, [run_id]))["runs"] == 0


async def test_prune_refuses_a_non_positive_period(broker: Broker) -> None:
    with pytest.raises(errors.ClientError):
        await retention.prune(broker.store, older_than_s=0)
