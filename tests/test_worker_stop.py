"""Stop means stop: the model stream is cancelled (the provider sees its
connection closed), tools are cancelled, partial output is kept, and the run
ends aborted with the audit (real NATS + PostgreSQL; a fake provider)."""

from __future__ import annotations

import pytest

from broker import errors, events
from broker.runtime import Broker
from broker.settings import Settings
from workers.adapters.openai import OpenAIAdapter

from .fakes.providers import FakeProvider, slow_tokens
from .helpers import sample
from .workerkit import of, purge_jobs, read_run, running_worker, start, text_of, wait_event


def _check_abort(evs: list[events.AnyEvent], by: str, reason: str, step: int) -> events.StopAudit:
    intr, end = evs[-2], evs[-1]
    assert isinstance(intr, events.InterruptRequested)
    assert (intr.requested_by, intr.reason) == (by, reason)
    assert isinstance(end, events.RunEnd) and end.status == "aborted"
    audit = end.stop
    assert audit is not None
    assert (audit.requested_by, audit.reason, audit.step) == (by, reason, step)
    assert audit.at_seq == intr.seq - 1 and audit.requested_at > 0
    return audit


async def test_stop_mid_token_keeps_the_partial_text(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=40.0) as (b, w):
        _, run_id = await start(b, "a long answer, please")
        await wait_event(b, run_id, "text_delta", count=5)
        assert await b.interrupt(run_id, "bob", "enough") is True
        evs = await read_run(b, run_id)
        assert await b.store.interrupt_request(run_id) is not None
        try:
            await b.interrupt(run_id, "carol", "again")
            raise AssertionError("a stop after the end must be refused")
        except errors.RunEnded:
            pass
    audit = _check_abort(evs, "bob", "enough", step=1)
    assert audit.side_effects == []
    partial = text_of(evs)
    assert partial and len(partial.split()) < 2000  # stopped early, kept what streamed
    assert w.metrics is not None
    assert w.metrics.abort_propagation._sum.get() > 0
    assert sample(w.metrics, "runlog_worker_partial_persist_total") == 1
    assert sample(w.metrics, "runlog_worker_runs_total", outcome="aborted") == 1


async def test_stop_closes_the_provider_connection(settings: Settings) -> None:
    async with FakeProvider() as provider:
        provider.push(slow_tokens("openai", 2000, 50.0))
        adapter = OpenAIAdapter(provider.url + "/v1", "sk-test", "gpt-4o")
        async with running_worker(settings, adapter=adapter) as (b, w):
            _, run_id = await start(b, "hello")
            await wait_event(b, run_id, "text_delta", count=5)
            rec = provider.requests[0]
            assert not rec.closed_by_client
            await b.interrupt(run_id, "alice", "wrong question")
            await rec.wait_closed(timeout_s=10)
            evs = await read_run(b, run_id)
        assert not rec.finished  # the provider never got to finish generating
    _check_abort(evs, "alice", "wrong question", step=1)
    partial = text_of(evs)
    n = len(partial.split())
    assert 5 <= n < 2000 and partial == "".join(f"tok{i} " for i in range(n))
    assert w.metrics is not None and w.metrics.abort_propagation._sum.get() > 0


async def test_stop_cancels_a_running_tool_and_lists_side_effects(settings: Settings) -> None:
    async with running_worker(settings) as (b, _):
        _, run_id = await start(b, "take a note, slow tool")
        await wait_event(b, run_id, "progress")  # search_docs is running
        await b.interrupt(run_id, "bob", "taking too long")
        evs = await read_run(b, run_id)
    starts = {s.tool_name: s.tool_call_id for s in of(evs, events.ToolCallStart)}
    results = {r.tool_call_id: r for r in of(evs, events.ToolResult)}
    assert results[starts["save_note"]].status == "ok"
    cancelled = results[starts["search_docs"]]
    assert (cancelled.status, cancelled.summary) == ("error", "cancelled: the run was stopped")
    assert len(of(evs, events.Progress)) < 100
    audit = _check_abort(evs, "bob", "taking too long", step=1)
    assert audit.side_effects == [starts["save_note"]]


async def test_stop_while_waiting_for_approval(settings: Settings) -> None:
    async with running_worker(settings) as (b, _):
        _, run_id = await start(b, "send the report")
        req = await wait_event(b, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        await b.interrupt(run_id, "carol", "changed my mind")
        evs = await read_run(b, run_id)
        # The approval closed with the run: a late decision gets a clear error.
        with pytest.raises(errors.ApprovalExpired):
            await b.decide(req.approval_id, "approve", "bob")
    audit = _check_abort(evs, "carol", "changed my mind", step=2)
    assert audit.side_effects == []  # send_message never ran
    assert not of(evs, events.ApprovalDecided)
    skipped = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
    assert [(r.status, r.summary) for r in skipped] == [("skipped", "not run: the run ended")]


async def test_stop_sent_before_a_worker_took_the_run(settings: Settings) -> None:
    b = await Broker.connect(settings, name="test-no-worker")
    try:
        await purge_jobs(b)
        _, run_id = await start(b, "no tools")
        await b.interrupt(run_id, "bob", "never mind")  # no worker is running
    finally:
        await b.close()
    async with running_worker(settings, purge=False) as (b, _):
        evs = await read_run(b, run_id)
    assert [e.__struct_config__.tag for e in evs] == ["run_start", "interrupt_requested", "run_end"]
    _check_abort(evs, "bob", "never mind", step=0)


async def test_a_client_leaving_does_not_stop_the_run(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=200.0) as (b, _):
        _, run_id = await start(b, "no tools")
        sub = await b.subscribe(run_id=run_id, after=0)
        async for _batch in sub:
            break
        await sub.close()  # the only watcher disconnects mid-run
        evs = await read_run(b, run_id)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_every_tool_card_gets_a_result_when_stopped_mid_call(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=30.0) as (b, _):
        _, run_id = await start(b, "tell me about approvals")
        await wait_event(b, run_id, "tool_call_start", count=1)
        await b.interrupt(run_id, "bob", "stop mid-call")
        evs = await read_run(b, run_id)
    opened = [e.tool_call_id for e in of(evs, events.ToolCallStart)]
    resulted = [e.tool_call_id for e in of(evs, events.ToolResult)]
    assert opened and sorted(opened) == sorted(resulted)
    assert evs[-1].status == "aborted"  # type: ignore[union-attr]
