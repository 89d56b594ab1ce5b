"""Approvals bound to the tool call they guard, and tool results as durable
points (issue 19, items 1 and 2): a replay after a takeover applies a stored
decision only to the call the approver saw, and a run killed after its tool
ran resumes instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker import errors, events
from broker.runtime import Broker
from broker.settings import Settings
from workers.binding import call_digest

from .workerkit import (
    DOOMED,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    wait_event,
    wait_until,
)

AGENTS = "tests.agents.api_agents"
_DOOMED = DOOMED


def _count(d: Path, name: str) -> int:
    p = d / name
    return len(p.read_text()) if p.exists() else 0


async def _resumed(b: Broker, run_id: str) -> bool:
    run = await b.store.get_run(run_id)
    return run.owner_epoch > 1 and run.status in ("waiting_approval", "completed", "failed")


async def test_an_approval_is_not_applied_to_arguments_the_replay_changed(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The approver saw worker_pid A; the replay after kill -9 produces
    worker_pid B. The stored decision must not authorize B: the run fails
    agent_nondeterministic and the tool never runs."""
    spec = json.dumps({"dir": str(tmp_path)})
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:drifting", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, spec)
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        await client.decide(req.approval_id, "approve", "bob", "looks right")
        # The decision is stored; the worker dies before it acts on it.
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:drifting"):
        evs = await read_run(client, run_id)
    assert _count(tmp_path, "restart") == 0
    (err,) = of(evs, events.RunError)
    assert (err.code, err.retryable) == ("agent_nondeterministic", False)
    assert req.approval_id in err.message and req.tool_call_id in err.message
    assert evs[-1].status == "failed"  # type: ignore[union-attr]
    assert not [r for r in of(evs, events.ToolResult) if r.status == "ok"]


async def test_an_approval_waited_for_across_a_takeover_is_not_applied_to_changed_arguments(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """Killed while waiting: the new owner's replay changes the arguments, so
    it fails the run before asking again, and a late approval changes nothing."""
    spec = json.dumps({"dir": str(tmp_path)})
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:drifting", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, spec)
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:drifting"):
        await wait_until(lambda: _resumed(client, run_id), timeout_s=60)
        try:
            await client.decide(req.approval_id, "approve", "bob", "")
        except errors.ApprovalExpired:
            pass  # the failed run closed it
        evs = await read_run(client, run_id)
    assert _count(tmp_path, "restart") == 0
    (err,) = of(evs, events.RunError)
    assert err.code == "agent_nondeterministic"
    assert len(of(evs, events.ApprovalRequired)) == 1


async def test_the_approval_carries_the_digest_of_the_call_it_guards(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    spec = json.dumps({"dir": str(tmp_path), "approval": True, "words": 1})
    async with running_worker(settings, agent=f"{AGENTS}:scripted"):
        _, run_id = await start(client, spec)
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        shown = call_digest("delete_rows", '{"rows": [1, 2, 3]}')
        assert req.call_digest == shown
        assert (await client.store.approval(req.approval_id)).call_digest == shown
        # A decision made on another call is refused and stores nothing.
        with pytest.raises(errors.ApprovalStale) as stale:
            await client.decide(req.approval_id, "approve", "bob", "", call_digest="0" * 64)
        assert stale.value.code == "approval_stale"
        assert (await client.store.approval(req.approval_id)).decision is None
        _, created = await client.decide(req.approval_id, "approve", "bob", "", call_digest=shown)
        assert created
        evs = await read_run(client, run_id)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert _count(tmp_path, "delete") == 1


async def test_kill_9_during_the_final_answer_after_the_tool_ran_resumes(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The docs' shape: the approved tool runs in a step, its tool_result is
    emitted after the step, then the answer streams. A kill during the answer
    resumes the run; the tool ran once and its result is not retracted."""
    spec = json.dumps(
        {"dir": str(tmp_path), "approval": True, "once": True, "words": 400, "delay_s": 0.01}
    )
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:scripted", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, spec)
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        await client.decide(req.approval_id, "approve", "bob", "")
        await wait_event(client, run_id, "tool_result")
        # "Looking. " is the first text_delta; 20 more are the answer's.
        await wait_event(client, run_id, "text_delta", count=21)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:scripted"):
        evs = await read_run(client, run_id)
    assert evs[-1].status == "completed", of(evs, events.RunError)  # type: ignore[union-attr]
    assert (_count(tmp_path, "delete"), _count(tmp_path, "report")) == (1, 1)
    assert [(r.status, r.summary) for r in of(evs, events.ToolResult)] == [("ok", "deleted 3 rows")]
    (reset,) = of(evs, events.MessageReset)
    after = [d for d in of(evs, events.TextDelta) if d.seq > reset.seq]
    assert "".join(d.delta for d in after) == "".join(f"w{i} " for i in range(400)) + "end."
