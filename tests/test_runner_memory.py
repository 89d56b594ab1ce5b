"""The agent runner (workers/runner.py) on the memory backends
(broker/backend_memory.py: MemoryStore, MemoryRunWriter over a MemoryLog):
agents written against workers.api complete, fail with their code, replay a
step after a takeover without running it again, wait for an approval that is
decided meanwhile (or park on it), stop, and lose the run to a newer epoch;
the built-in loop's tool that loses the run while it runs; a takeover that
ends a stopped run (workers/takeover.py); and the memory backends' fences. Milliseconds each, no server;
what only PostgreSQL and NATS show (the fence's locks, outages, a worker
killed for real) stays in test_agent_api.py, test_worker_*.py.

Every test checks the run's whole log as the store holds it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from prometheus_client import CollectorRegistry

from broker import errors, events
from broker.backend_memory import MemoryRunWriter, MemoryStore
from broker.settings import Settings
from workers.api import Agent, AgentContext, AgentError
from workers.context import RunContext
from workers.loop import BuiltinAgent
from workers.metrics import WorkerMetrics
from workers.model import (
    Finish,
    ModelItem,
    ModelRequest,
    TextChunk,
    ToolArgsChunk,
    ToolCallBegin,
    ToolCallDone,
)
from workers.runner import Outcome, run_agent
from workers.signals import RunSignals
from workers.takeover import plan_takeover
from workers.tools import Tool, ToolContext, ToolOutput, ToolRegistry

RUN, SESSION = "r_1", "s_1"


def _settings(**changes: object) -> Settings:
    # Poll for a decision often and never park: the test decides on the store.
    quick: dict[str, object] = {"approval_poll_s": 0.005, "approval_park_after_s": -1.0}
    return dataclasses.replace(Settings(), **{**quick, **changes})  # type: ignore[arg-type]


class Worker:
    """What a worker does with a run, on the memory store: claim it (a new
    epoch), build its RunContext with that epoch's writer, run the agent."""

    def __init__(self, store: MemoryStore, settings: Settings, registry: ToolRegistry) -> None:
        self.store = store
        self.settings = settings
        self.registry = registry
        self.signals = RunSignals()
        self.resumes: list[str] = []
        self.writer: MemoryRunWriter | None = None

    async def run(self, agent: Agent, *, resumed: bool = False) -> Outcome:
        own = self.store.claim(RUN)
        self.writer = self.store.writer(own)
        ctx = RunContext(
            writer=self.writer,
            run=await self.store.get_run(RUN),
            signals=self.signals,
            store=self.store,
            settings=self.settings,
            metrics=WorkerMetrics(CollectorRegistry()),
            registry=self.registry,
        )
        ctx.on_resume = self.resumes.append
        return await run_agent(ctx, agent, resumed=resumed)


class World:
    def __init__(self, *, model: str = "m", **changes: object) -> None:
        self.store = MemoryStore()
        self.settings = _settings(**changes)
        self.store.create_run(RUN, SESSION, input="hello", model=model, started_by="alice")

    def worker(self, registry: ToolRegistry | None = None) -> Worker:
        return Worker(self.store, self.settings, registry or ToolRegistry())

    def log(self) -> list[events.AnyEvent]:
        return [events.decode_stored(e.payload) for e in self.store.log._run(RUN).events]

    def types(self) -> list[str]:
        return [str(e.__struct_config__.tag) for e in self.log()]


async def _until(cond: Callable[[], bool | Awaitable[bool]], timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            got = cond()
            if not isinstance(got, bool):
                got = await got
            if got:
                return
            await asyncio.sleep(0.001)


def _only(evs: list[events.AnyEvent], kind: type[events.AnyEvent]) -> list[events.AnyEvent]:
    return [e for e in evs if isinstance(e, kind)]


async def test_a_run_that_completes_is_logged_from_run_start_to_run_end() -> None:
    w = World()
    calls: list[str] = []

    async def agent(ctx: AgentContext) -> None:
        async def search() -> dict[str, int]:
            calls.append("search")
            return {"hits": 3}

        found = await ctx.step("search", search)
        m = ctx.message_id()
        await ctx.text(m, "found ")
        await ctx.text(m, str(found["hits"]))
        ctx.usage(input_tokens=7, output_tokens=2)

    assert await w.worker().run(agent) == "completed"
    evs = w.log()
    assert w.types() == ["run_start", "text_delta", "text_delta", "run_end"]
    assert [e.seq for e in evs] == [1, 2, 3, 4]
    assert {(e.run_id, e.session_id) for e in evs} == {(RUN, SESSION)}
    start = evs[0]
    assert isinstance(start, events.RunStart)
    assert (start.model, start.started_by, start.input) == ("m", "alice", "hello")
    assert [e.delta for e in evs[1:3]] == ["found ", "3"]  # type: ignore[union-attr]
    assert evs[-1] == events.RunEnd(
        run_id=RUN, session_id=SESSION, seq=4, ts=evs[-1].ts, status="completed",
        usage=events.Usage(input_tokens=7, output_tokens=2),
    )  # fmt: skip
    assert calls == ["search"]
    (step,) = await w.store.load_steps(RUN)
    assert (step.idx, step.name, step.kind, step.done, step.seq, step.epoch) == (
        0, "search", "step", True, 1, 1,
    )  # fmt: skip
    assert (await w.store.get_run(RUN)).status == "completed"


async def test_an_agent_error_fails_the_run_with_its_code() -> None:
    w = World()

    async def agent(ctx: AgentContext) -> None:
        raise AgentError("index_offline", "the search index is offline", retryable=True)

    assert await w.worker().run(agent) == "failed"
    assert w.types() == ["run_start", "run_error", "run_end"]
    _, err, end = w.log()
    assert isinstance(err, events.RunError) and isinstance(end, events.RunEnd)
    assert (err.code, err.retryable, err.message) == (
        "index_offline", True, "the search index is offline",
    )  # fmt: skip
    assert (end.seq, end.status, end.stop) == (3, "failed", None)


async def test_a_takeover_replays_a_finished_step_without_running_it_again() -> None:
    w = World()
    calls: list[int] = []
    first = w.worker()
    hang = asyncio.Event()  # the first owner never gets past its text

    def agent(owner: Worker) -> Agent:
        async def run(ctx: AgentContext) -> None:
            async def search() -> dict[str, int]:
                calls.append(owner.writer.epoch if owner.writer else 0)
                return {"hits": 3}

            found = await ctx.step("search", search)
            await ctx.text(ctx.message_id(), f"found {found['hits']}")
            if owner is first:
                await hang.wait()

        return run

    task = asyncio.ensure_future(first.run(agent(first)))
    await _until(lambda: w.types() == ["run_start", "text_delta"])
    # The first owner is presumed dead: its worker cancels it, another takes the run.
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    second = w.worker()
    assert await second.run(agent(second), resumed=True) == "completed"
    assert calls == [1]  # the step ran once, under epoch 1; the replay got its result
    assert second.resumes == ["resumed"]
    evs = w.log()
    assert w.types() == [
        "run_start", "text_delta", "message_reset", "status", "text_delta", "run_end",
    ]  # fmt: skip
    assert [e.seq for e in evs] == [1, 2, 3, 4, 5, 6]
    _, lost, reset, status, again, end = evs
    assert isinstance(lost, events.TextDelta) and isinstance(again, events.TextDelta)
    assert isinstance(reset, events.MessageReset) and isinstance(status, events.Status)
    assert (lost.delta, again.delta, reset.message_id) == ("found 3", "found 3", lost.message_id)
    assert (status.code, status.summary) == ("resumed", "resumed by another worker")
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    (step,) = await w.store.load_steps(RUN)
    assert (step.name, step.done, step.epoch, step.last_epoch) == ("search", True, 1, 1)
    assert (await w.store.get_run(RUN)).takeovers == 1


async def test_an_approval_asked_then_decided_meanwhile_lets_the_agent_go_on() -> None:
    w = World()
    worker = w.worker()

    async def agent(ctx: AgentContext) -> None:
        d = await ctx.approval("delete 3 rows?")
        await ctx.text(ctx.message_id(), f"{d.decision} by {d.decided_by}: {d.comment}")

    task = asyncio.ensure_future(worker.run(agent))

    async def waiting() -> bool:
        return (await w.store.get_run(RUN)).status == "waiting_approval"

    await _until(waiting)
    (asked,) = await w.store.run_approvals(RUN)
    assert (asked.summary, asked.decision, asked.session_id) == ("delete 3 rows?", None, SESSION)
    assert w.types() == ["run_start", "approval_required"]
    info, created = await w.store.decide_approval(asked.approval_id, "approve", "bob", "fine")
    assert created and (info.decision, info.decided_by) == ("approve", "bob")
    assert await task == "completed"
    evs = w.log()
    assert w.types() == [
        "run_start", "approval_required", "approval_decided", "text_delta", "run_end",
    ]  # fmt: skip
    _, req, dec, text, end = evs
    assert isinstance(req, events.ApprovalRequired) and isinstance(dec, events.ApprovalDecided)
    assert (req.approval_id, req.summary, req.expires_at) == (
        asked.approval_id, "delete 3 rows?", asked.expires_at_ms,
    )  # fmt: skip
    assert (dec.approval_id, dec.decision, dec.decided_by, dec.comment) == (
        asked.approval_id, "approve", "bob", "fine",
    )  # fmt: skip
    assert text.delta == "approve by bob: fine"  # type: ignore[union-attr]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    # Decided once: the same decision again changes nothing, another one is refused.
    again, created = await w.store.decide_approval(asked.approval_id, "approve", "carol")
    assert not created and again.decided_by == "bob"
    with pytest.raises(errors.ApprovalConflict):
        await w.store.decide_approval(asked.approval_id, "reject", "carol")
    (rec,) = await w.store.load_steps(RUN)
    assert (rec.kind, rec.done, rec.seq) == ("approval", True, 3)


async def test_a_stop_cancels_the_agent_and_ends_the_run_aborted_with_the_audit() -> None:
    w = World()
    worker = w.worker()
    seen: list[str] = []

    async def agent(ctx: AgentContext) -> None:
        await ctx.text(ctx.message_id(), "thinking")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = asyncio.ensure_future(worker.run(agent))
    await _until(lambda: w.types() == ["run_start", "text_delta"])
    worker.signals.request_stop("alice", 1234, "changed my mind")
    assert await task == "aborted"
    assert seen == ["cancelled"]
    assert w.types() == ["run_start", "text_delta", "interrupt_requested", "run_end"]
    _, _, stop, end = w.log()
    assert isinstance(stop, events.InterruptRequested) and isinstance(end, events.RunEnd)
    assert (stop.requested_by, stop.reason, stop.seq) == ("alice", "changed my mind", 3)
    assert end.status == "aborted"
    assert end.stop == events.StopAudit(
        requested_by="alice", requested_at=1234, reason="changed my mind", at_seq=2, step=0,
        side_effects=[],
    )  # fmt: skip


async def test_a_stale_epoch_loses_the_run_and_appends_nothing() -> None:
    w = World()
    worker = w.worker()
    go_on = asyncio.Event()

    async def agent(ctx: AgentContext) -> None:
        m = ctx.message_id()
        await ctx.text(m, "one")
        await go_on.wait()
        await ctx.text(m, "two")

    task = asyncio.ensure_future(worker.run(agent))
    await _until(lambda: w.types() == ["run_start", "text_delta"])
    before = w.log()
    w.store.claim(RUN)  # another worker took the run meanwhile (epoch 2)
    go_on.set()
    assert await task == "lost"
    assert w.log() == before
    assert isinstance(worker.writer and worker.writer.error, errors.StaleEpoch)
    info = await w.store.get_run(RUN)
    assert (info.owner_epoch, info.last_seq, info.status) == (2, 2, "running")


class _OneToolCall:
    """A model that asks for one call of `tool`, then answers "done"."""

    name = "test"

    def __init__(self, tool: str) -> None:
        self.tool = tool

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelItem]:
        return self._turn(request)

    async def _turn(self, request: ModelRequest) -> AsyncIterator[ModelItem]:
        if not any(m.role == "tool" for m in request.messages):
            yield ToolCallBegin(id="call_1", name=self.tool)
            yield ToolArgsChunk(id="call_1", json="{}")
            yield ToolCallDone(id="call_1")
            yield Finish(reason="tool_calls")
        else:
            yield TextChunk(text="done")
            yield Finish(reason="stop")


async def test_a_builtin_tool_that_loses_the_run_is_not_a_tool_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tool told StaleEpoch (its progress refused: another worker took the
    run while it ran) ends the run "lost": not logged as the tool's failure
    with a traceback, and nothing more is appended."""
    w = World(model="")  # the built-in agent's own model
    before: list[events.AnyEvent] = []

    async def slow(args: dict[str, object], tctx: ToolContext) -> ToolOutput:
        await _until(lambda: w.types()[-1:] == ["tool_call_end"])
        before.extend(w.log())
        w.store.claim(RUN)  # ownership lost while the tool runs
        await tctx.progress("rows", 1, 2)  # appended; its commit is refused
        await _until(lambda: worker.writer is not None and worker.writer.error is not None)
        await tctx.progress("rows", 2, 2)  # StaleEpoch
        return ToolOutput("should not be reached")

    registry = ToolRegistry([Tool(name="slow", description="slow", fn=slow)])
    worker = w.worker(registry)
    agent = BuiltinAgent(_OneToolCall("slow"), registry, model_name="test")
    with caplog.at_level(logging.INFO):
        assert await worker.run(agent) == "lost"
    assert [str(e.__struct_config__.tag) for e in before] == [
        "run_start", "tool_call_start", "tool_args_delta", "tool_call_end",
    ]  # fmt: skip
    assert w.log() == before
    assert isinstance(worker.writer and worker.writer.error, errors.StaleEpoch)
    loud = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert loud == []
    assert not [r for r in caplog.records if r.exc_info]
    assert [r.getMessage() for r in caplog.records if r.name == "workers.runner"] == [
        f"run {RUN}: ownership lost; another worker has it"
    ]


async def test_a_run_without_a_decision_is_parked_on_its_approval() -> None:
    w = World(approval_park_after_s=0.0)  # parked at the first look that finds no decision
    worker = w.worker()

    async def agent(ctx: AgentContext) -> None:
        await ctx.approval("delete 3 rows?")
        raise AssertionError("not reached before the decision")

    assert await worker.run(agent) == "parked"
    assert w.types() == ["run_start", "approval_required"]
    (open_,) = await w.store.run_approvals(RUN)
    assert (worker.signals.parked_on, open_.decision) == (open_.approval_id, None)
    (rec,) = await w.store.load_steps(RUN)
    assert (rec.kind, rec.done) == ("approval", False)


# -- the memory backends' own contracts (backend.py: RunLog, RunStore)


async def test_the_memory_writer_is_fenced_and_dead_after_a_failure() -> None:
    w = World()
    old = w.store.writer(w.store.claim(RUN))
    assert await old.append(events.RunStart()) == 1
    assert (old.last_seq, await old.flush(), old.committed_seq) == (1, 1, 1)
    new = w.store.writer(w.store.claim(RUN))  # a takeover: epoch 2, from seq 1
    assert (new.epoch, new.last_seq) == (2, 1)
    assert await old.append(events.Status(code="late")) == 2  # at once, not yet committed
    with pytest.raises(errors.StaleEpoch):
        await old.flush()
    with pytest.raises(errors.StaleEpoch):  # dead: every later call says so
        await old.append(events.Status(code="later"))
    assert await new.append(events.RunEnd(status="completed")) == 2
    assert await new.flush() == 2
    with pytest.raises(errors.RunEnded):
        await new.append(events.Status(code="after"))
    assert w.types() == ["run_start", "run_end"]
    assert (await w.store.get_run(RUN)).status == "completed"


async def test_the_memory_stores_owner_writes_are_fenced() -> None:
    w = World()
    own = w.store.claim(RUN)
    await w.store.record_step(
        run_id=RUN, epoch=1, idx=0, name="s", kind="step", done=False, result=None, seq=0
    )
    await w.store.create_approval(
        approval_id="a_1", run_id=RUN, epoch=1, tool_call_id="", summary="ok?", expires_at_ms=0
    )
    w.store.claim(RUN)
    with pytest.raises(errors.StaleEpoch):
        await w.store.record_step(
            run_id=RUN, epoch=1, idx=0, name="s", kind="step", done=True, result=b"1", seq=1
        )
    with pytest.raises(errors.StaleEpoch):
        await w.store.expire_approval("a_1", run_id=RUN, epoch=1)
    with pytest.raises(errors.StaleEpoch):
        await w.store.close_run_approvals(RUN, own.epoch)
    assert not await w.store.set_status(RUN, 1, "waiting_approval")
    (step,) = await w.store.load_steps(RUN)
    assert (step.done, step.epoch, step.last_epoch) == (False, 1, 1)
    await w.store.record_step(
        run_id=RUN, epoch=2, idx=0, name="s", kind="step", done=True, result=b"1", seq=1
    )
    (step,) = await w.store.load_steps(RUN)
    assert (step.done, step.result, step.epoch, step.last_epoch) == (True, b"1", 1, 2)
    # Past its expiry: a decision is refused, and the owner's expiry stores "expired".
    with pytest.raises(errors.ApprovalExpired):
        await w.store.decide_approval("a_1", "approve", "bob")
    info = await w.store.expire_approval("a_1", run_id=RUN, epoch=2)
    assert (info.decision, info.decided_by) == ("expired", "system")
    with pytest.raises(errors.ApprovalNotFound):
        await w.store.poll_approval("a_2")


async def test_a_takeover_of_a_run_stopped_while_waiting_for_an_approval_ends_it_aborted() -> None:
    """workers/takeover.py on the memory store: the owner died waiting for an
    approval guarding a tool call, a stop was asked meanwhile; the new owner
    closes the approval, gives the card its result and ends the run aborted."""
    w = World()
    first = w.worker()

    async def agent(ctx: AgentContext) -> None:
        call = ctx.tool_call_id()
        await ctx.tool_start(call, "delete_rows", risk="high")
        await ctx.tool_end(call)
        await ctx.approval("delete 3 rows?", tool_call_id=call)

    task = asyncio.ensure_future(first.run(agent))

    async def asked() -> bool:
        return bool(await w.store.run_approvals(RUN))

    await _until(asked)
    task.cancel()  # the owner is gone
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await w.store.request_interrupt(RUN, "alice", "not now")
    own = w.store.claim(RUN)
    plan = await plan_takeover(w.store, own)
    assert (plan.outcome, plan.run) == ("aborted", False)
    assert plan.stop is not None and (plan.stop[0], plan.stop[2]) == ("alice", "not now")
    await plan.end(w.store, w.store.writer(own), WorkerMetrics(CollectorRegistry()))
    assert w.types() == [
        "run_start", "tool_call_start", "tool_call_end", "approval_required", "tool_result",
        "interrupt_requested", "run_end",
    ]  # fmt: skip
    evs = w.log()
    card, result, end = evs[1], evs[4], evs[6]
    assert isinstance(card, events.ToolCallStart) and isinstance(result, events.ToolResult)
    assert (result.tool_call_id, result.status, result.summary) == (
        card.tool_call_id, "skipped", "not run: the run ended",
    )  # fmt: skip
    assert isinstance(end, events.RunEnd) and end.status == "aborted"
    assert end.stop == events.StopAudit(
        requested_by="alice", requested_at=plan.stop[1], reason="not now", at_seq=5, step=1,
        side_effects=[],
    )  # fmt: skip
    (closed,) = await w.store.run_approvals(RUN)
    assert (closed.decision, closed.decided_by, closed.comment) == (
        "expired", "system", "the run ended",
    )  # fmt: skip
    with pytest.raises(errors.ApprovalExpired):
        await w.store.decide_approval(closed.approval_id, "approve", "bob")
