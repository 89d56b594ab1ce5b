"""Approvals in PostgreSQL (real server): every write a run's owner makes to
them is fenced by its epoch, and a decision commits with its audit row."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from broker import approvals, errors, events, ids
from broker.approvals import ApprovalInfo
from broker.runtime import Broker

from .workerkit import wait_until


@pytest_asyncio.fixture(loop_scope="session")
async def run_id(broker: Broker) -> AsyncIterator[str]:
    """A run of the test's own, ended afterwards: a worker of a later test
    must not take it over."""
    session_id = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(session_id, "alice")
    yield run_id
    if not (await broker.store.run_head(run_id))[1]:
        w = await broker.claim(run_id, "test-cleanup")
        await w.append(events.RunEnd(status="completed"))
        await w.flush()


def _states(rows: list[ApprovalInfo]) -> dict[str, tuple[str | None, str | None, str]]:
    return {a.approval_id: (a.decision, a.decided_by, a.comment) for a in rows}


async def test_a_fenced_owner_cannot_create_expire_or_close_approvals(
    broker: Broker, run_id: str
) -> None:
    old = await broker.claim(run_id, "worker-a")
    new = await broker.claim(run_id, "worker-b")  # what a takeover does: epoch + 1
    assert (old.epoch, new.epoch) == (1, 2)
    now = int(time.time() * 1000)

    # The old owner (a zombie) creates nothing.
    with pytest.raises(errors.StaleEpoch):
        await approvals.create(
            broker.store, approval_id=ids.approval_id(), run_id=run_id, epoch=old.epoch,
            tool_call_id="call_z", summary="zombie", expires_at_ms=now + 60_000,
        )  # fmt: skip
    assert await approvals.open_for_run(broker.store, run_id) == []

    # The new owner's approvals: one it waits on, one past its expiry.
    waiting, due = ids.approval_id(), ids.approval_id()
    for aid, expires in ((waiting, now + 60_000), (due, now - 1)):
        await approvals.create(
            broker.store, approval_id=aid, run_id=run_id, epoch=new.epoch,
            tool_call_id="call_" + aid, summary="send it?", expires_at_ms=expires,
        )  # fmt: skip
    untouched = {waiting: (None, None, ""), due: (None, None, "")}
    assert _states(await approvals.open_for_run(broker.store, run_id)) == untouched

    # The zombie can neither expire one nor close them all.
    with pytest.raises(errors.StaleEpoch):
        await approvals.expire(broker.store, due, run_id=run_id, epoch=old.epoch)
    with pytest.raises(errors.StaleEpoch):
        await approvals.close_open_for_run(broker.store, run_id, old.epoch)
    assert _states(await approvals.open_for_run(broker.store, run_id)) == untouched

    # The owner can.
    expired = await approvals.expire(broker.store, due, run_id=run_id, epoch=new.epoch)
    assert (expired.decision, expired.decided_by) == ("expired", "system")
    await approvals.create(  # a retried create (its reply was lost) changes nothing
        broker.store, approval_id=due, run_id=run_id, epoch=new.epoch,
        tool_call_id="call_" + due, summary="changed?", expires_at_ms=now + 60_000,
    )  # fmt: skip
    assert (await approvals.get(broker.store, due)).summary == "send it?"
    assert await approvals.close_open_for_run(broker.store, run_id, new.epoch) == 1
    assert _states(await approvals.open_for_run(broker.store, run_id)) == {
        waiting: ("expired", "system", "the run ended"),
        due: ("expired", "system", ""),
    }

    # Once the run has ended, not even its last owner can add one.
    await new.append(events.RunEnd(status="completed"))
    await new.flush()
    with pytest.raises(errors.StaleEpoch):
        await approvals.create(
            broker.store, approval_id=ids.approval_id(), run_id=run_id, epoch=new.epoch,
            tool_call_id="call_late", summary="late", expires_at_ms=now + 60_000,
        )  # fmt: skip
    assert len(await approvals.open_for_run(broker.store, run_id)) == 2


async def test_an_owners_write_racing_a_takeover_waits_for_it(broker: Broker, run_id: str) -> None:
    """The fence locks the run's row: a write that starts while a takeover's
    epoch bump is in flight waits for it, then sees the new epoch. (Reading
    the epoch without the lock would let the write commit after the new
    owner looked, leaving an approval no owner knows of.)"""
    pool = broker.store.pool
    old = await broker.claim(run_id, "worker-a")

    async def zombie_create() -> None:
        await approvals.create(
            broker.store, approval_id=ids.approval_id(), run_id=run_id, epoch=old.epoch,
            tool_call_id="call_z", summary="zombie", expires_at_ms=int(time.time() * 1000) + 60_000,
        )  # fmt: skip

    async with pool.acquire() as conn:
        takeover = conn.transaction()
        await takeover.start()
        await conn.execute(
            "UPDATE runs SET owner_id = 'worker-b', owner_epoch = owner_epoch + 1"
            " WHERE run_id = $1",
            run_id,
        )
        create = asyncio.create_task(zombie_create())

        async def blocked_or_done() -> bool:
            waiting = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%INSERT INTO approvals%'"
            )
            return create.done() or bool(waiting)

        try:
            await wait_until(blocked_or_done)
        finally:
            await takeover.commit()
            (outcome,) = await asyncio.gather(create, return_exceptions=True)
    assert isinstance(outcome, errors.StaleEpoch), outcome
    assert await approvals.open_for_run(broker.store, run_id) == []


async def _audits(pool: asyncpg.Pool, approval_id: str) -> list[tuple[str, str]]:
    rows = await pool.fetch(
        "SELECT actor, action FROM audit WHERE detail->>'approval_id' = $1 ORDER BY audit_id",
        approval_id,
    )
    return [(r[0], r[1]) for r in rows]


async def _open_approval(broker: Broker, run_id: str) -> str:
    w = await broker.claim(run_id, "worker-a")
    aid = ids.approval_id()
    await approvals.create(
        broker.store, approval_id=aid, run_id=run_id, epoch=w.epoch, tool_call_id="call_1",
        summary="send it?", expires_at_ms=int(time.time() * 1000) + 60_000,
    )  # fmt: skip
    return aid


async def test_each_stored_decision_has_one_audit_row(broker: Broker, run_id: str) -> None:
    pool = broker.store.pool
    aid = await _open_approval(broker, run_id)
    info, created = await broker.decide(aid, "approve", "bob", "ok")
    assert created and (info.decision, info.decided_by) == ("approve", "bob")
    assert await _audits(pool, aid) == [("bob", "approval_approve")]
    # A repeat is a no-op, a conflicting decision an error: neither is audited.
    _, created = await broker.decide(aid, "approve", "carol")
    assert not created
    with pytest.raises(errors.ApprovalConflict):
        await broker.decide(aid, "reject", "carol")
    assert await _audits(pool, aid) == [("bob", "approval_approve")]


_REFUSED_COMMENT = "this audit row is refused"


async def test_a_decision_whose_audit_fails_is_not_stored(broker: Broker, run_id: str) -> None:
    pool = broker.store.pool
    aid = await _open_approval(broker, run_id)
    # A constraint only this test's decision violates: the audit insert fails
    # after the decision's UPDATE has run.
    await pool.execute(
        "ALTER TABLE audit ADD CONSTRAINT test_refused_audit"
        f" CHECK (detail->>'comment' IS DISTINCT FROM '{_REFUSED_COMMENT}') NOT VALID"
    )
    try:
        # The store's error, not the driver's (issue 23, item 2): code internal,
        # asyncpg's error as its cause, and no SQL text in what a client sees.
        with pytest.raises(errors.DatabaseError) as info:
            await broker.decide(aid, "approve", "bob", _REFUSED_COMMENT)
        assert isinstance(info.value.__cause__, asyncpg.CheckViolationError)
        assert info.value.code == "internal" and "23514" in info.value.detail
        assert "test_refused_audit" not in info.value.detail
    finally:
        await pool.execute("ALTER TABLE audit DROP CONSTRAINT test_refused_audit")
    stored = await approvals.get(broker.store, aid)
    assert (stored.decision, stored.decided_by) == (None, None)
    assert await _audits(pool, aid) == []
    # Nothing half-done is left behind: the same decision can be made again.
    _, created = await broker.decide(aid, "approve", "bob", "ok")
    assert created and await _audits(pool, aid) == [("bob", "approval_approve")]
