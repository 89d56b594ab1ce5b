"""Approvals in PostgreSQL (real server): every write a run's owner makes to
them is fenced by its epoch."""

from __future__ import annotations

import time

import pytest

from broker import approvals, errors, events, ids
from broker.approvals import ApprovalInfo
from broker.runtime import Broker


async def _run(broker: Broker) -> str:
    session_id = await broker.store.create_session("alice")
    return await broker.store.create_run(session_id, "alice")


def _states(rows: list[ApprovalInfo]) -> dict[str, tuple[str | None, str | None, str]]:
    return {a.approval_id: (a.decision, a.decided_by, a.comment) for a in rows}


async def test_a_fenced_owner_cannot_create_expire_or_close_approvals(broker: Broker) -> None:
    pool = broker.store.pool
    run_id = await _run(broker)
    old = await broker.claim(run_id, "worker-a")
    new = await broker.claim(run_id, "worker-b")  # what a takeover does: epoch + 1
    assert (old.epoch, new.epoch) == (1, 2)
    now = int(time.time() * 1000)

    # The old owner (a zombie) creates nothing.
    with pytest.raises(errors.StaleEpoch):
        await approvals.create(
            pool, approval_id=ids.approval_id(), run_id=run_id, epoch=old.epoch,
            tool_call_id="call_z", summary="zombie", expires_at_ms=now + 60_000,
        )  # fmt: skip
    assert await approvals.open_for_run(pool, run_id) == []

    # The new owner's approvals: one it waits on, one past its expiry.
    waiting, due = ids.approval_id(), ids.approval_id()
    for aid, expires in ((waiting, now + 60_000), (due, now - 1)):
        await approvals.create(
            pool, approval_id=aid, run_id=run_id, epoch=new.epoch,
            tool_call_id="call_" + aid, summary="send it?", expires_at_ms=expires,
        )  # fmt: skip
    untouched = {waiting: (None, None, ""), due: (None, None, "")}
    assert _states(await approvals.open_for_run(pool, run_id)) == untouched

    # The zombie can neither expire one nor close them all.
    with pytest.raises(errors.StaleEpoch):
        await approvals.expire(pool, due, run_id=run_id, epoch=old.epoch)
    with pytest.raises(errors.StaleEpoch):
        await approvals.close_open_for_run(pool, run_id, old.epoch)
    assert _states(await approvals.open_for_run(pool, run_id)) == untouched

    # The owner can.
    expired = await approvals.expire(pool, due, run_id=run_id, epoch=new.epoch)
    assert (expired.decision, expired.decided_by) == ("expired", "system")
    await approvals.create(  # a retried create (its reply was lost) changes nothing
        pool, approval_id=due, run_id=run_id, epoch=new.epoch,
        tool_call_id="call_" + due, summary="changed?", expires_at_ms=now + 60_000,
    )  # fmt: skip
    assert (await approvals.get(pool, due)).summary == "send it?"
    assert await approvals.close_open_for_run(pool, run_id, new.epoch) == 1
    assert _states(await approvals.open_for_run(pool, run_id)) == {
        waiting: ("expired", "system", "the run ended"),
        due: ("expired", "system", ""),
    }

    # Once the run has ended, not even its last owner can add one.
    await new.append(events.RunEnd(status="completed"))
    await new.flush()
    with pytest.raises(errors.StaleEpoch):
        await approvals.create(
            pool, approval_id=ids.approval_id(), run_id=run_id, epoch=new.epoch,
            tool_call_id="call_late", summary="late", expires_at_ms=now + 60_000,
        )  # fmt: skip
    assert len(await approvals.open_for_run(pool, run_id)) == 2
