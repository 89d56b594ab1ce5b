"""Approvals: approve, deny, expire, racing approvers (real NATS + PostgreSQL)."""

from __future__ import annotations

import asyncio
import time

import pytest

from broker import errors, events, steps
from broker.settings import Settings

from .helpers import sample
from .workerkit import of, read_run, running_worker, start, text_of, wait_event


async def test_approve_and_deny(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=500.0) as (b, w):
        _, approved = await start(b, "send the report")
        _, denied = await start(b, "send the report")
        req_a = await wait_event(b, approved, "approval_required")
        req_d = await wait_event(b, denied, "approval_required")
        assert isinstance(req_a, events.ApprovalRequired)
        assert isinstance(req_d, events.ApprovalRequired)
        assert req_a.expires_at > time.time() * 1000 + 30_000
        assert "send_message" in req_a.summary
        # While waiting, PostgreSQL holds what lets any worker resume: the
        # approval's open row, at the seq before approval_required.
        info = await b.store.get_run(approved)
        assert info.status == "waiting_approval"
        last = (await steps.load(b.store, approved))[-1]
        assert (last.kind, last.done, last.seq) == ("approval", False, req_a.seq - 1)
        assert last.result is not None and req_a.approval_id.encode() in last.result

        await b.decide(req_a.approval_id, "approve", "bob", "go ahead")
        await b.decide(req_d.approval_id, "reject", "bob", "not now")
        a_evs, d_evs = await asyncio.gather(read_run(b, approved), read_run(b, denied))
        assert (await b.store.get_run(approved)).status == "completed"
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_approvals_total", outcome="approve") == 1
    assert sample(w.metrics, "runlog_worker_approvals_total", outcome="reject") == 1

    (dec,) = of(a_evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by, dec.comment) == ("approve", "bob", "go ahead")
    sent = [r for r in of(a_evs, events.ToolResult) if r.tool_call_id == req_a.tool_call_id]
    assert [(r.status, r.summary) for r in sent] == [("ok", "Message sent to team@example.com")]
    assert "the summary was sent" in text_of(a_evs)
    assert a_evs[-1].status == "completed"  # type: ignore[union-attr]

    (dec,) = of(d_evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by, dec.comment) == ("reject", "bob", "not now")
    denied_results = [r for r in of(d_evs, events.ToolResult) if r.status != "ok"]
    assert [(r.status, r.summary) for r in denied_results] == [("denied", "denied by bob")]
    assert "I did not send the message" in text_of(d_evs)
    assert d_evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_expired_approval_skips_the_tool_and_the_run_goes_on(settings: Settings) -> None:
    async with running_worker(settings, approval_timeout_s=1.0) as (b, w):
        _, run_id = await start(b, "send the report")
        req = await wait_event(b, run_id, "approval_required")
        evs = await read_run(b, run_id)
        with pytest.raises(errors.ApprovalExpired):
            await b.decide(req.approval_id, "approve", "bob")  # type: ignore[union-attr]
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by) == ("expired", "system")
    skipped = [r for r in of(evs, events.ToolResult) if r.status != "ok"]
    assert [(r.status, r.summary) for r in skipped] == [("skipped", "approval expired")]
    assert "Nobody approved in time" in text_of(evs)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_approvals_total", outcome="expired") == 1
    )


async def test_two_approvers_racing_make_one_decision(settings: Settings) -> None:
    async with running_worker(settings) as (b, _):
        for round_ in range(3):
            _, run_id = await start(b, "send the report")
            req = await wait_event(b, run_id, "approval_required")
            assert isinstance(req, events.ApprovalRequired)
            bob, carol = ("approve", "reject") if round_ % 2 else ("reject", "approve")
            results = await asyncio.gather(
                b.decide(req.approval_id, bob, "bob"),
                b.decide(req.approval_id, carol, "carol"),
                return_exceptions=True,
            )
            wins = [r for r in results if isinstance(r, tuple) and r[1]]
            conflicts = [r for r in results if isinstance(r, errors.ApprovalConflict)]
            assert len(wins) == 1 and len(conflicts) == 1, results
            winner = wins[0][0]
            assert winner.decision is not None
            # A repeat of the winning decision is a no-op.
            again, created = await b.decide(req.approval_id, winner.decision, "dave")
            assert not created and again.decided_by == winner.decided_by
            evs = await read_run(b, run_id)
            (dec,) = of(evs, events.ApprovalDecided)
            assert (dec.decision, dec.decided_by) == (winner.decision, winner.decided_by)
