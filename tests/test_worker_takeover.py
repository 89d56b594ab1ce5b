"""Takeover of a run whose owner died at a durable point or between two:
each crash window resumes without writing anything twice, or fails when it
cannot (real NATS + PostgreSQL; the dead owner's state is written by hand,
exactly as it would have been)."""

from __future__ import annotations

import time

import pytest
from prometheus_client import CollectorRegistry

from broker import approvals, events, ids
from broker.runtime import Broker
from broker.settings import Settings
from broker.store import Ownership
from workers.metrics import WorkerMetrics
from workers.model import Message, ToolCall
from workers.state import AgentState, DecidedCall, decode_state, encode_state
from workers.takeover import TakeoverPlan, plan_takeover

from .helpers import sample
from .workerkit import of, purge_jobs, read_run, running_worker, wait_event


async def _dead_owner_waiting(b: Broker, *, logged: tuple[str, ...]) -> tuple[str, str, AgentState]:
    """A run whose owner checkpointed an approval wait, logged `logged` of
    ("approval_required", "approval_decided") after it, then died."""
    session_id = await b.store.create_session("alice")
    run_id = await b.store.create_run(session_id, "alice", input="send the report")
    w = await b.claim(run_id, "dead-worker", lease_s=60)
    search = ToolCall(id="call_1_0", name="search_docs", arguments='{"query":"report"}')
    send = ToolCall(id="call_2_0", name="send_message", arguments='{"to":"a@b.c","text":"hi"}')
    await w.append(events.RunStart(input="send the report"))
    for call in (search, send):
        await w.append(
            events.ToolCallStart(tool_call_id=call.id, tool_name=call.name, risk_level="low")
        )
        await w.append(events.ToolArgsDelta(tool_call_id=call.id, partial_json=call.arguments))
        await w.append(events.ToolCallEnd(tool_call_id=call.id))
        if call is search:
            await w.append(events.ToolResult(tool_call_id=call.id, status="ok", summary="3 docs"))
    approval_id = ids.approval_id()
    expires = int(time.time() * 1000) + 60_000
    state = AgentState(
        messages=[
            Message(role="user", content="send the report"),
            Message(role="assistant", tool_calls=[search]),
            Message(role="tool", content="[]", tool_call_id=search.id, name=search.name),
            Message(role="assistant", tool_calls=[send]),
        ],
        step=2,
        pending=[send],
        approval_id=approval_id,
        approval_expires_at=expires,
        approval_summary="send it?",
        at_seq=await w.flush(),
    )
    await approvals.create(
        b.store.pool, approval_id=approval_id, run_id=run_id, epoch=w.epoch,
        tool_call_id=send.id, summary="send it?", expires_at_ms=expires,
    )  # fmt: skip
    assert await b.store.save_checkpoint(run_id, w.epoch, encode_state(state), "waiting_approval")
    if "approval_required" in logged:
        await w.append(
            events.ApprovalRequired(
                approval_id=approval_id, tool_call_id=send.id, summary="send it?",
                expires_at=expires,
            )
        )  # fmt: skip
    if "approval_decided" in logged:
        await approvals.decide(b.store.pool, approval_id, "approve", "bob")
        await w.append(
            events.ApprovalDecided(approval_id=approval_id, decision="approve", decided_by="bob")
        )
    await w.flush()
    return run_id, approval_id, state


async def _die(b: Broker, run_id: str) -> None:
    """The owner is gone: its lease ends now (as if it ran out)."""
    info = await b.store.get_run(run_id)
    await b.store.release(run_id, info.owner_epoch)


@pytest.mark.parametrize(
    "logged",
    [(), ("approval_required",), ("approval_required", "approval_decided")],
    ids=["before-request", "waiting", "after-decision"],
)
async def test_takeover_resumes_each_approval_window(
    settings: Settings, logged: tuple[str, ...]
) -> None:
    async with running_worker(settings) as (b, w):
        await purge_jobs(b)
        run_id, approval_id, state = await _dead_owner_waiting(b, logged=logged)
        await _die(b, run_id)
        if "approval_decided" not in logged:
            req = await _wait_request(b, run_id)
            assert req.approval_id == approval_id and req.seq > state.at_seq
            await b.decide(approval_id, "approve", "bob")
        evs = await read_run(b, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert len(of(evs, events.ApprovalRequired)) == 1
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by) == ("approve", "bob")
    sent = [r for r in of(evs, events.ToolResult) if r.tool_call_id == "call_2_0"]
    assert [r.status for r in sent] == ["ok"]  # ran exactly once
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_takeover_after_the_tool_started_fails_the_run(settings: Settings) -> None:
    async with running_worker(settings) as (b, w):
        await purge_jobs(b)
        run_id, _, _ = await _dead_owner_waiting(
            b, logged=("approval_required", "approval_decided")
        )
        # The dead owner had also started the tool (its checkpoint not yet cleared).
        info = await b.store.get_run(run_id)
        w2 = b.writer(Ownership(run_id, info.session_id, info.owner_epoch, info.last_seq))
        await w2.append(events.Progress(label="sending", done=1, total=2))
        await w2.flush()
        await _die(b, run_id)
        evs = await read_run(b, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="failed") == 1
    )
    assert of(evs, events.RunError)[0].code == "worker_lost"
    assert not [r for r in of(evs, events.ToolResult) if r.tool_call_id == "call_2_0"]


async def _wait_request(b: Broker, run_id: str) -> events.ApprovalRequired:
    ev = await wait_event(b, run_id, "approval_required")
    assert isinstance(ev, events.ApprovalRequired)
    return ev


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


_SEARCH = ToolCall(id="call_1_0", name="search_docs", arguments='{"query":"report"}')


async def _dead_owner_after_turn(broker: Broker, *, resumes: int = 0) -> tuple[str, Ownership]:
    """A run whose owner checkpointed its first model turn (one search_docs
    call pending), then died; `resumes` takeovers since that checkpoint."""
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice", input="tell me about reports")
    w = await broker.claim(run_id, "dead-worker")
    await w.append(events.RunStart(input="tell me about reports"))
    await w.append(events.ToolCallStart(tool_call_id=_SEARCH.id, tool_name=_SEARCH.name))
    await w.append(events.ToolArgsDelta(tool_call_id=_SEARCH.id, partial_json=_SEARCH.arguments))
    await w.append(events.ToolCallEnd(tool_call_id=_SEARCH.id))
    state = AgentState(
        messages=[
            Message(role="user", content="tell me about reports"),
            Message(role="assistant", tool_calls=[_SEARCH]),
        ],
        step=1,
        pending=[_SEARCH],
        at_seq=await w.flush(),
        resumes=resumes,
    )
    assert await broker.store.save_checkpoint(run_id, w.epoch, encode_state(state), "running")
    return run_id, Ownership(run_id, sid, w.epoch, w.last_seq)


async def _expire(broker: Broker, run_id: str) -> Ownership:
    await broker.store.pool.execute(
        "UPDATE runs SET lease_until = now() - interval '1 minute' WHERE run_id = $1", run_id
    )
    own = await broker.store.claim_expired(run_id, "survivor", 10.0)
    assert own is not None
    return own


async def _carry_out(broker: Broker, own: Ownership, plan: TakeoverPlan) -> list[events.AnyEvent]:
    """End the run as its new owner would (a resumed one: as if it finished),
    so no later test's worker finds it; its log."""
    w = broker.writer(own)
    if plan.run:
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
    else:
        await plan.end(broker.store, w, WorkerMetrics(CollectorRegistry(), []))
    return [
        events.decode_stored(e.payload) for e in await broker.store.run_page(own.run_id, 0, 100)
    ]


@pytest.mark.parametrize(("resumes", "outcome"), [(2, "resumed"), (3, "failed")])
async def test_takeovers_without_a_durable_point_between_are_bounded(
    broker: Broker, resumes: int, outcome: str
) -> None:
    """agent_max_resumes (3) takeovers since the last checkpoint resume; the
    next one fails the run (a run that kills its worker each time)."""
    run_id, _ = await _dead_owner_after_turn(broker, resumes=resumes)
    own = await _expire(broker, run_id)
    plan = await plan_takeover(broker.store, own, max_resumes=3)
    assert (plan.outcome, plan.run) == (outcome, outcome == "resumed")
    state = decode_state(await broker.store.load_checkpoint(run_id) or b"")
    assert state is not None
    # A resume is counted in the checkpoint (under the new owner's epoch).
    assert state.resumes == (resumes + 1 if outcome == "resumed" else resumes)
    evs = await _carry_out(broker, own, plan)
    if outcome == "failed":
        err = evs[-2]
        assert isinstance(err, events.RunError) and err.code == "worker_lost"


async def test_takeover_after_a_tool_result_past_the_checkpoint_fails(broker: Broker) -> None:
    """The tool's result is in the log but not in the checkpoint (the owner
    died between the two): it ran, must not run again, and its output for
    the model is lost — the run cannot be resumed."""
    run_id, own = await _dead_owner_after_turn(broker)
    w = broker.writer(own)
    await w.append(events.Progress(label="searching", done=1, total=1))
    await w.append(events.ToolResult(tool_call_id=_SEARCH.id, status="ok", summary="3 docs"))
    await w.flush()
    own = await _expire(broker, run_id)
    plan = await plan_takeover(broker.store, own, max_resumes=3)
    assert (plan.outcome, plan.run) == ("failed", False)
    err, end = (await _carry_out(broker, own, plan))[-2:]
    assert isinstance(err, events.RunError) and err.code == "worker_lost"
    # The reason, in words, for clients (and once, at WARNING, in the log).
    assert err.message == (
        "the run cannot be resumed: tool_result at seq 6 after the last durable point"
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"


async def test_takeover_after_the_decision_runs_the_tool_without_asking_again(
    settings: Settings,
) -> None:
    """The owner logged the decision and checkpointed it, then died before
    the approved tool started: the new owner runs it, asks nobody again."""
    async with running_worker(settings) as (b, w):
        await purge_jobs(b)
        run_id, approval_id, state = await _dead_owner_waiting(
            b, logged=("approval_required", "approval_decided")
        )
        info = await b.store.get_run(run_id)
        state.approval_id = ""
        state.decided = DecidedCall(call_id="call_2_0", decision="approve", decided_by="bob")
        state.at_seq = info.last_seq
        assert await b.store.save_checkpoint(
            run_id, info.owner_epoch, encode_state(state), "running"
        )
        await _die(b, run_id)
        evs = await read_run(b, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert [r.approval_id for r in of(evs, events.ApprovalRequired)] == [approval_id]
    assert len(of(evs, events.ApprovalDecided)) == 1
    sent = [r for r in of(evs, events.ToolResult) if r.tool_call_id == "call_2_0"]
    assert [r.status for r in sent] == ["ok"]  # ran exactly once
    assert "the summary was sent" in "".join(d.delta for d in of(evs, events.TextDelta))
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
