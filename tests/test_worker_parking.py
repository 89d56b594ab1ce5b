"""Runs waiting for an approval are parked (issue 19, item 6): a row, not a
worker slot. The decision, the expiry or a stop wakes a parked run on any
worker, which resumes it by the same durable path as a takeover: the model
is not called again and the approved tool runs once."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker import events
from broker.runtime import Broker
from broker.settings import Settings

from .helpers import sample
from .workerkit import (
    TOOL_LOG_ENV,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    tool_runs,
    wait_event,
    wait_until,
)

TOOLS = "tests.workerkit:COUNTED_SEND_TOOLS"
_ANSWER_OPENING = "Done: the summary was sent to the team."  # the scripted answer once sent


async def _start_many(b: Broker, n: int, input: str) -> list[str]:
    run_ids: list[str] = []
    for i in range(0, n, 50):
        chunk = await asyncio.gather(*(start(b, input) for _ in range(min(50, n - i))))
        run_ids.extend(r for _, r in chunk)
    return run_ids


async def _count(b: Broker, run_ids: list[str], where: str) -> int:
    n: int = await b.store.pool.fetchval(
        f"SELECT count(*) FROM runs WHERE run_id = ANY($1) AND {where}", run_ids
    )
    return n


async def _parked(b: Broker, run_ids: list[str]) -> bool:
    return await _count(b, run_ids, "parked_on IS NOT NULL") == len(run_ids)


async def _ended(b: Broker, run_ids: list[str]) -> bool:
    return await _count(b, run_ids, "ended_at IS NULL") == 0


async def _open_approvals(b: Broker, run_ids: list[str]) -> list[str]:
    rows = await b.store.pool.fetch(
        "SELECT approval_id FROM approvals WHERE run_id = ANY($1) AND decision IS NULL", run_ids
    )
    return [r[0] for r in rows]


async def _decide_all(b: Broker, approval_ids: list[str]) -> None:
    for i in range(0, len(approval_ids), 50):
        await asyncio.gather(*(b.decide(a, "approve", "bob") for a in approval_ids[i : i + 50]))


def _sent(log: Path) -> list[str]:
    """The run of each execution of send_message, in order."""
    return [line.split()[1] for line in tool_runs(log)]


async def test_a_thousand_waiting_runs_hold_no_slot_and_each_resumes_once(
    settings: Settings, client: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "sent"
    monkeypatch.setenv(TOOL_LOG_ENV, str(log))
    n = 1000
    # Sixteen slots for a thousand runs: all of them park, none holds a slot.
    # (With 4, the thousand queued behind four slots, each held for
    # search_docs's 150 ms before the run parks: 68 s against 43 s, loaded.)
    async with running_worker(settings, concurrency=16, tools=TOOLS) as (_, w):
        run_ids = await _start_many(client, n, "send the report")
        await wait_until(lambda: _parked(client, run_ids), timeout_s=300, interval_s=0.5)

        async def no_slot_held() -> bool:
            return not w.active_runs

        await wait_until(no_slot_held)
        # Another user's run gets a slot while the thousand wait.
        _, other = await start(client, "hello, no approval", user="dave")
        evs = await read_run(client, other, timeout_s=60)
        assert evs[-1].status == "completed"  # type: ignore[union-attr]
        assert await _parked(client, run_ids)  # still waiting, every one

        approval_ids = await _open_approvals(client, run_ids)
        assert len(approval_ids) == n
        await _decide_all(client, approval_ids)
        await wait_until(lambda: _ended(client, run_ids), timeout_s=300, interval_s=0.5)
        m = w.metrics
        assert m is not None
        assert sample(m, "runlog_worker_runs_total", outcome="parked") == n
        assert sample(m, "runlog_worker_runs_total", outcome="completed") == n + 1
        assert sample(m, "runlog_worker_jobs_total", outcome="woken") == n
        assert sample(m, "runlog_worker_takeovers_total", outcome="resumed") == 0
    assert await _count(client, run_ids, "status = 'completed'") == n
    assert sorted(_sent(log)) == sorted(run_ids)  # each sent once
    # A few logs in full: the decision once, no retraction, no "resumed".
    for run_id in run_ids[:: n // 10]:
        evs = await read_run(client, run_id)
        assert [d.decision for d in of(evs, events.ApprovalDecided)] == ["approve"]
        assert of(evs, events.MessageReset) == [] and of(evs, events.Status) == []
        assert [r.status for r in of(evs, events.ToolResult)] == ["ok", "ok"]
        assert _ANSWER_OPENING in "".join(d.delta for d in of(evs, events.TextDelta))
        assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_parked_runs_woken_on_a_worker_killed_while_resuming_them_complete_once(
    settings: Settings, client: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parked runs are decided; the worker resuming them is killed (-9) while
    they stream their answers; another worker takes them over. Each sends
    once, and each completes."""
    log = tmp_path / "sent"
    monkeypatch.setenv(TOOL_LOG_ENV, str(log))
    n = 8
    async with running_worker(settings, concurrency=4, tools=TOOLS) as _:
        run_ids = await _start_many(client, n, "send the report")
        await wait_until(lambda: _parked(client, run_ids))
    # No worker now: decided while parked, they wait for one.
    await _decide_all(client, await _open_approvals(client, run_ids))
    doomed = WorkerProcess(
        settings, tmp_path / "a.log", scripted_tokens_per_s=5.0, worker_lease_s=15.0
    )  # answers slowly: every run is still answering when the last one has sent
    doomed.env["RUNLOG_TOOLS"] = TOOLS
    await doomed.start(concurrency=n)
    try:
        for run_id in run_ids:
            await wait_event(client, run_id, "tool_result", count=2)  # sent; answering
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, tools=TOOLS) as (_, w):
        logs = await asyncio.gather(*(read_run(client, r) for r in run_ids))
        assert w.metrics is not None
        assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == n
    assert sorted(_sent(log)) == sorted(run_ids)
    for evs in logs:
        assert [s.code for s in of(evs, events.Status)] == ["resumed"]
        assert [r.status for r in of(evs, events.ToolResult)] == ["ok", "ok"]
        assert of(evs, events.RunError) == []
        assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_an_expired_approval_wakes_its_parked_run(settings: Settings, client: Broker) -> None:
    async with running_worker(settings, approval_timeout_s=1.0) as (_, w):
        _, run_id = await start(client, "send the report")
        await wait_until(lambda: _parked(client, [run_id]))
        evs = await read_run(client, run_id)
        assert w.metrics is not None
        assert sample(w.metrics, "runlog_worker_jobs_total", outcome="woken") == 1
    assert [d.decision for d in of(evs, events.ApprovalDecided)] == ["expired"]
    assert "Nobody approved in time" in "".join(d.delta for d in of(evs, events.TextDelta))
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_a_stop_ends_a_parked_run_and_skips_its_call(
    settings: Settings, client: Broker
) -> None:
    async with running_worker(settings) as _:
        _, run_id = await start(client, "send the report")
        await wait_until(lambda: _parked(client, [run_id]))
        await client.interrupt(run_id, "alice", "not today")
        evs = await read_run(client, run_id)
    req = of(evs, events.ApprovalRequired)[0]
    results = {r.tool_call_id: r.status for r in of(evs, events.ToolResult)}
    assert results[req.tool_call_id] == "skipped"
    (stop,) = of(evs, events.InterruptRequested)
    assert (stop.requested_by, stop.reason) == ("alice", "not today")
    assert evs[-1].status == "aborted"  # type: ignore[union-attr]


async def test_a_run_decided_before_it_could_park_goes_on_in_its_slot(
    settings: Settings, client: Broker
) -> None:
    """approval_park_after_s keeps the slot a while: a quick decision costs
    no resume."""
    async with running_worker(settings, approval_park_after_s=60.0) as (_, w):
        _, run_id = await start(client, "send the report")
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        await client.decide(req.approval_id, "approve", "bob")
        evs = await read_run(client, run_id)
        assert w.metrics is not None
        assert sample(w.metrics, "runlog_worker_runs_total", outcome="parked") == 0
    assert [d.decision for d in of(evs, events.ApprovalDecided)] == ["approve"]
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
