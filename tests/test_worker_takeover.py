"""Takeover of a built-in loop's run whose owner died at a durable point or
between two: each crash window resumes without writing anything twice, or
fails when it cannot (real NATS + PostgreSQL). The built-in loop is an agent
on `workers.api` (`workers/loop.py`), so its windows are the journal's
(`workers/durable.py`): dead owners are real worker processes killed with
SIGKILL, or logs written by hand where no kill can aim (a log no durable
point accounts for; takeovers without progress)."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from workers.metrics import WorkerMetrics
from workers.takeover import plan_takeover

from .helpers import sample
from .workerkit import (
    IN_SLOT,
    TOOL_LOG_ENV,
    killed_while_waiting,
    of,
    read_run,
    running_worker,
    text_of,
    tool_runs,
    wait_event,
)

SEND_TOOLS = "tests.workerkit:COUNTED_SEND_TOOLS"


@pytest.mark.parametrize("decided", ["while-dead", "after-the-resume"])
async def test_takeover_resumes_each_approval_window(
    settings: Settings,
    client: Broker,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    decided: str,
) -> None:
    """Killed while it waits for an approval: the new owner asks nobody
    again (one approval_required), takes the decision stored while no worker
    owned the run or waits for it, and runs the approved tool once."""
    runs = tmp_path / "tool-runs"
    monkeypatch.setenv(TOOL_LOG_ENV, str(runs))
    env = {"RUNLOG_TOOLS": SEND_TOOLS}
    run_id, req = await killed_while_waiting(settings, client, tmp_path / "a.log", env=env)
    if decided == "while-dead":
        await client.decide(req.approval_id, "approve", "bob")
    async with running_worker(settings, purge=False, tools=SEND_TOOLS) as (_, w):
        if decided == "after-the-resume":
            await wait_event(client, run_id, "status")  # resumed, waiting again
            await client.decide(req.approval_id, "approve", "bob")
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert [r.approval_id for r in of(evs, events.ApprovalRequired)] == [req.approval_id]
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by) == ("approve", "bob")
    sent = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
    assert [r.status for r in sent] == ["ok"]
    assert tool_runs(runs) == [f"send_message {run_id} {req.tool_call_id}"]  # ran exactly once
    assert "the summary was sent" in text_of(evs)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_a_resumed_run_stopped_while_it_waits_closes_the_card_it_replayed(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The card waiting for the approval was opened by a model turn the new
    owner replayed (not streamed again): a stop still gives it its result
    before run_end, as when the first owner is stopped."""
    run_id, req = await killed_while_waiting(settings, client, tmp_path / "a.log")
    async with running_worker(settings, purge=False, **IN_SLOT) as (_, w):
        await wait_event(client, run_id, "status")  # resumed, waiting in its slot
        await client.interrupt(run_id, "carol", "changed my mind")
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    card = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
    assert [(r.status, r.summary) for r in card] == [("skipped", "not run: the run ended")]
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "aborted" and end.stop is not None
    assert (end.stop.step, end.stop.side_effects) == (2, [])


async def test_stop_audit_after_takeover_names_side_effects_from_the_log(broker: Broker) -> None:
    """A tool with side effects ran after the last checkpoint (none here), then
    the worker died and a stop was requested: the audit still names it."""
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "dead-worker")
    await w.append(events.RunStart(model="m", started_by="alice"))
    for cid, status in (("c1", "ok"), ("c2", "denied")):
        await w.append(events.ToolCallStart(tool_call_id=cid, tool_name="save_note"))
        await w.append(events.ToolResult(tool_call_id=cid, status=status))  # type: ignore[arg-type]
    await w.append(events.ToolCallStart(tool_call_id="c3", tool_name="search_docs"))
    await w.flush()
    await broker.store.request_interrupt(run_id, "bob", "stop")
    await broker.store.pool.execute(
        "UPDATE runs SET lease_until = now() - interval '1 minute' WHERE run_id = $1", run_id
    )
    own = await broker.store.claim_expired(run_id, "survivor", 10.0)
    assert own is not None
    plan = await plan_takeover(broker.store, own)
    assert plan.outcome == "aborted"
    await plan.end(broker.store, broker.writer(own),
                   WorkerMetrics(CollectorRegistry(), ["save_note"]), frozenset({"save_note"}))  # fmt: skip
    last = events.decode_stored((await broker.store.run_page(run_id, 0, 100))[-1].payload)
    assert isinstance(last, events.RunEnd) and last.status == "aborted"
    assert last.stop is not None and last.stop.side_effects == ["c1"]


async def _dead_owner(broker: Broker, *, logged: list[events.Event]) -> str:
    """A run whose owner logged run_start and `logged`, wrote no durable
    point, then died (no lease left)."""
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice", input="tell me about reports, no approval")
    w = await broker.claim(run_id, "dead-worker")
    await w.append(events.RunStart(input="tell me about reports, no approval"))
    for ev in logged:
        await w.append(ev)
    await w.flush()
    await _expire(broker, run_id)
    return run_id


async def _expire(broker: Broker, run_id: str) -> None:
    await broker.store.pool.execute(
        "UPDATE runs SET lease_until = now() - interval '1 minute' WHERE run_id = $1", run_id
    )


async def _taken_and_lost(broker: Broker, run_id: str, times: int) -> None:
    """`times` owners took the run over and died before a durable point."""
    for k in range(times):
        own = await broker.store.claim_expired(run_id, f"survivor-{k}", 10.0)
        assert own is not None
        await _expire(broker, run_id)


@pytest.mark.parametrize(("lost", "outcome"), [(2, "completed"), (3, "failed")])
async def test_takeovers_without_a_durable_point_between_are_bounded(
    settings: Settings, lost: int, outcome: str
) -> None:
    """agent_max_resumes (3) takeovers since the last durable point resume;
    the next one fails the run (a run that kills its worker each time)."""
    async with running_worker(settings) as (b, _):
        run_id = await _dead_owner(b, logged=[])
        await _taken_and_lost(b, run_id, lost)
        evs = await read_run(b, run_id)
    assert evs[-1].status == outcome  # type: ignore[union-attr]
    if outcome == "failed":
        err = evs[-2]
        assert isinstance(err, events.RunError) and err.code == "worker_lost"
        assert "more than agent_max_resumes (3) times" in err.message
    else:
        assert "Here is what I know" in text_of(evs)


async def test_takeover_after_a_tool_result_no_durable_point_accounts_for_fails(
    settings: Settings,
) -> None:
    """A tool's result is in the log, but no durable point says which call
    of the agent's made it (the owner died before it wrote one): it ran,
    must not run again, and its output for the model is lost — the run
    cannot be resumed, and says why."""
    call = "call_1_0"
    logged: list[events.Event] = [
        events.ToolCallStart(tool_call_id=call, tool_name="search_docs"),
        events.ToolArgsDelta(tool_call_id=call, partial_json='{"query":"report"}'),
        events.ToolCallEnd(tool_call_id=call),
        events.Progress(label="searching", done=1, total=1),
        events.ToolResult(tool_call_id=call, status="ok", summary="3 docs"),
    ]
    async with running_worker(settings) as (b, _):
        run_id = await _dead_owner(b, logged=logged)
        evs = await read_run(b, run_id)
    err, end = evs[-2:]
    assert isinstance(err, events.RunError) and err.code == "worker_lost"
    # The reason, in words, for clients (and once, at WARNING, in the log).
    assert err.message == (
        "the run cannot be resumed: tool_result at seq 6 after the last durable point"
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"
    assert [r.tool_call_id for r in of(evs, events.ToolResult)] == [call]  # not run again
