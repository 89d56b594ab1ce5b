"""The AG-UI upstream adapter (workers/frameworks/agui.py) against a real AG-UI
server (tests/aguiserver.py: aiohttp + ag-ui-protocol's own encoder), with
real workers, NATS and PostgreSQL.

The stop tests every adapter shares are tests/test_agent_contract.py's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from ag_ui.core import (
    CustomEvent,
    Interrupt,
    ReasoningEndEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageChunkEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallChunkEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from aiohttp import web

from broker import events, steps
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import free_port
from workers.api import AgentError, Decision
from workers.frameworks import agui

from .aguiserver import Exchange, Upstream, serving
from .gw import running_gateway, ws_connect
from .helpers import sample
from .workerkit import (
    IN_SLOT,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    text_of,
    wait_event,
)

AGENT = "tests.agents.agui_agent:agent"


@pytest.fixture
def upstream_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """Points the module-level agent at an upstream (as RUNLOG_AGUI_URL does)."""
    return lambda url: monkeypatch.setenv("RUNLOG_AGUI_URL", url)


def finished(ex: Exchange, **kw: Any) -> RunFinishedEvent:
    return RunFinishedEvent(thread_id=ex.input.thread_id, run_id=ex.input.run_id, **kw)


def body_of(evs: list[events.AnyEvent]) -> list[tuple[Any, ...]]:
    """The run's events between run_start and run_end, as comparable tuples."""
    out: list[tuple[Any, ...]] = []
    for e in evs:
        t = type(e).__struct_config__.tag
        match e:
            case events.TextDelta() | events.ReasoningDelta():
                out.append((t, e.delta))
            case events.ToolCallStart():
                out.append((t, e.tool_name, e.risk_level))
            case events.ToolArgsDelta():
                out.append((t, e.partial_json))
            case events.ToolCallEnd():
                out.append((t,))
            case events.ToolResult():
                out.append((t, e.status, e.summary))
            case events.Status():
                out.append((t, e.code, e.summary))
            case events.ApprovalRequired():
                out.append((t, e.summary))
            case events.ApprovalDecided():
                out.append((t, e.decision, e.decided_by))
            case events.RunError():
                out.append((t, e.code, e.retryable))
    return out


# -- tokens, tools, the request


async def test_tokens_reach_a_subscriber_as_the_upstream_produces_them(
    settings: Settings, upstream_env: Callable[[str], None]
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.started()
        await ex.send(
            TextMessageStartEvent(message_id="a1", role="assistant"),
            TextMessageContentEvent(message_id="a1", delta="Hello "),
        )
        if len(up.requests) == 1:
            await up.gate.wait()  # set once the test saw the first delta
        await ex.send(
            TextMessageContentEvent(message_id="a1", delta="world"),
            TextMessageEndEvent(message_id="a1"),
            finished(ex, usage=[TokenUsage(input_tokens=7, output_tokens=2, reasoning_tokens=1)]),
        )

    async with serving(script) as up, running_worker(settings, agent=AGENT) as (b, _):
        upstream_env(up.url)
        session_id, run_id = await start(b, "say hello")
        first = await wait_event(b, run_id, "text_delta")
        assert isinstance(first, events.TextDelta) and first.delta == "Hello "
        assert not up.gate.is_set()  # the upstream has not finished: it waits for us
        up.gate.set()
        evs = await read_run(b, run_id)
        # The next run of the session sends the conversation so far.
        run2 = await b.start_run(session_id, "alice", input="and again")
        evs2 = await read_run(b, run2)
    assert text_of(evs) == "Hello world" and text_of(evs2) == "Hello world"
    assert len({e.message_id for e in of(evs, events.TextDelta)}) == 1
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    assert end.usage == events.Usage(input_tokens=7, output_tokens=2, reasoning_tokens=1)
    first_req, second_req = up.requests
    assert (first_req.thread_id, first_req.run_id, first_req.protocol_version) == (
        session_id, run_id, "1.0"
    )  # fmt: skip
    assert (first_req.tools, first_req.context, first_req.state, first_req.forwarded_props,
            first_req.resume) == ([], [], {}, {}, None)  # fmt: skip
    assert [(m.role, m.content) for m in first_req.messages] == [("user", "say hello")]
    assert [(m.role, m.content) for m in second_req.messages] == [
        ("user", "say hello"), ("assistant", "Hello world"), ("user", "and again"),
    ]  # fmt: skip
    assert second_req.run_id == run2
    assert up.headers[0]["Accept"] == "text/event-stream"


async def test_a_tool_call_with_streamed_arguments_reasoning_steps_and_chunks(
    settings: Settings, upstream_env: Callable[[str], None]
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.started()
        await ex.send(
            StepStartedEvent(step_name="plan"),
            ReasoningStartEvent(message_id="r1"),
            ReasoningMessageStartEvent(message_id="r1"),
            ReasoningMessageContentEvent(message_id="r1", delta="think"),
            ReasoningMessageEndEvent(message_id="r1"),
            ReasoningEndEvent(message_id="r1"),
            TextMessageChunkEvent(message_id="a1", role="assistant", delta="Let me "),
            TextMessageChunkEvent(delta="look."),
            ToolCallStartEvent(tool_call_id="c1", tool_call_name="search", parent_message_id="a1"),
            ToolCallArgsEvent(tool_call_id="c1", delta='{"q": '),
            ToolCallArgsEvent(tool_call_id="c1", delta='"runlog"}'),
            ToolCallEndEvent(tool_call_id="c1"),
            ToolCallResultEvent(message_id="t1", tool_call_id="c1", content="3 hits\nA, B, C"),
            ToolCallChunkEvent(tool_call_id="c2", tool_call_name="fetch", delta='{"id": '),
            ToolCallChunkEvent(delta="1}"),
            CustomEvent(name="app.thing", value={"x": 1}),  # ignored; closes the chunked call
            StateSnapshotEvent(snapshot={"k": "v"}),  # ignored
            StepFinishedEvent(step_name="plan"),
            finished(ex),
        )

    async with serving(script) as up, running_worker(settings, agent=AGENT) as (b, _):
        upstream_env(up.url)
        _, run_id = await start(b, "search")
        evs = await read_run(b, run_id)
    assert body_of(evs) == [
        ("status", "step_started", "plan"),
        ("reasoning_delta", "think"),
        ("text_delta", "Let me "),
        ("text_delta", "look."),
        ("tool_call_start", "search", "low"),
        ("tool_args_delta", '{"q": '),
        ("tool_args_delta", '"runlog"}'),
        ("tool_call_end",),
        ("tool_result", "ok", "3 hits"),
        ("tool_call_start", "fetch", "low"),
        ("tool_args_delta", '{"id": '),
        ("tool_args_delta", "1}"),
        ("tool_call_end",),
        ("status", "step_finished", "plan"),
        ("tool_result", "skipped", "not run: the run ended"),  # runlog: `fetch` got no result
    ]
    starts = of(evs, events.ToolCallStart)
    (res, skipped) = of(evs, events.ToolResult)
    assert [res.tool_call_id, skipped.tool_call_id] == [s.tool_call_id for s in starts]
    assert len({e.message_id for e in of(evs, events.TextDelta)}) == 1
    (r,) = {e.message_id for e in of(evs, events.ReasoningDelta)}
    assert r not in {e.message_id for e in of(evs, events.TextDelta)}
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"


# -- approvals


INTERRUPT = Interrupt(
    id="int-1", reason="tool_approval", tool_call_id="c1", message="send the report to the team?"
)
DENIED = {"runlog": {"status": "denied"}}  # how an upstream may say the call was denied


def approval_script(up_ref: list[Upstream]) -> Callable[[Exchange], Awaitable[None]]:
    """Asks for approval to send a report; sends it (a counted side effect)
    when the resume approves."""

    async def script(ex: Exchange) -> None:
        up = up_ref[0]
        await ex.started()
        if not ex.input.resume:
            await ex.send(
                TextMessageStartEvent(message_id="a1", role="assistant"),
                TextMessageContentEvent(message_id="a1", delta="I will send the report. "),
                TextMessageEndEvent(message_id="a1"),
                ToolCallStartEvent(
                    tool_call_id="c1", tool_call_name="send_report", parent_message_id="a1"
                ),
                ToolCallArgsEvent(tool_call_id="c1", delta='{"to": "team"}'),
                ToolCallEndEvent(tool_call_id="c1"),
                finished(ex, outcome=RunFinishedInterruptOutcome(interrupts=[INTERRUPT])),
            )
            return
        (answer,) = ex.input.resume
        assert answer.interrupt_id == "int-1"
        if answer.status == "resolved" and (answer.payload or {})["decision"] == "approve":
            up.side_effects += 1
            await ex.send(
                ToolCallResultEvent(message_id="t1", tool_call_id="c1", content="sent"),
                TextMessageStartEvent(message_id="a2", role="assistant"),
                TextMessageContentEvent(message_id="a2", delta="the summary was sent"),
                TextMessageEndEvent(message_id="a2"),
            )
        else:
            await ex.send(
                ToolCallResultEvent(
                    message_id="t1", tool_call_id="c1", content="not sent", metadata=DENIED
                ),
                TextMessageStartEvent(message_id="a2", role="assistant"),
                TextMessageContentEvent(message_id="a2", delta="nothing was sent"),
                TextMessageEndEvent(message_id="a2"),
            )
        await ex.send(finished(ex))

    return script


def check_resumed(up: Upstream, decision: str, comment: str) -> None:
    """The second POST answers the interrupt and carries what the first produced."""
    first, second = up.requests
    assert first.resume is None
    assert second.resume is not None
    (answer,) = second.resume
    assert (answer.interrupt_id, answer.status, answer.payload) == (
        "int-1", "resolved", {"decision": decision, "comment": comment}
    )  # fmt: skip
    assert answer.metadata == {"runlog": {"decided_by": "bob"}}
    assert (second.thread_id, second.run_id) == (first.thread_id, first.run_id)
    sent = [m.model_dump(by_alias=True, exclude_none=True) for m in second.messages]
    assert sent == [
        {"id": f"{first.run_id}:user", "role": "user", "content": "send the report"},
        {"id": "a1", "role": "assistant", "content": "I will send the report. ", "toolCalls": [
            {"id": "c1", "type": "function",
             "function": {"name": "send_report", "arguments": '{"to": "team"}'}},
        ]},
    ]  # fmt: skip


async def test_an_approval_decided_over_rest_resumes_the_upstream(
    settings: Settings, http: aiohttp.ClientSession, upstream_env: Callable[[str], None]
) -> None:
    ref: list[Upstream] = []
    async with (
        serving(approval_script(ref)) as up,
        running_worker(settings, agent=AGENT) as (b, _),
        running_gateway(settings) as gw,
    ):
        ref.append(up)
        upstream_env(up.url)
        _, run_id = await start(b, "send the report")
        req = await wait_event(b, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        assert up.side_effects == 0 and len(up.requests) == 1
        async with http.post(
            f"{gw.url}/v1/runs/{run_id}/approvals/{req.approval_id}",
            json={"decision": "approve", "comment": "go"},
            headers=gw.headers("bob"),
        ) as r:
            assert r.status == 201, await r.text()
        evs = await read_run(b, run_id)
        recs = await steps.load(b.store, run_id)
    assert up.side_effects == 1
    check_resumed(up, "approve", "go")
    # The resume's answer is cut at the tool's result, a durable point between
    # two segments read from the same stream (no third POST).
    assert [(r.name, r.done) for r in recs] == [
        ("segment-0", True),
        ("approval", True),
        ("segment-1", True),
        ("runlog:tool_result", True),
        ("segment-2", True),
    ]
    assert body_of(evs) == [
        ("text_delta", "I will send the report. "),
        ("tool_call_start", "send_report", "low"),
        ("tool_args_delta", '{"to": "team"}'),
        ("tool_call_end",),
        ("approval_required", "send the report to the team?"),
        ("approval_decided", "approve", "bob"),
        ("tool_result", "ok", "sent"),
        ("text_delta", "the summary was sent"),
    ]
    (start_ev,) = of(evs, events.ToolCallStart)
    assert req.tool_call_id == start_ev.tool_call_id == of(evs, events.ToolResult)[0].tool_call_id
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"


async def test_an_approval_rejected_over_websocket_resumes_the_upstream(
    settings: Settings, http: aiohttp.ClientSession, upstream_env: Callable[[str], None]
) -> None:
    ref: list[Upstream] = []
    async with (
        serving(approval_script(ref)) as up,
        running_worker(settings, agent=AGENT) as (b, _),
        running_gateway(settings) as gw,
    ):
        ref.append(up)
        upstream_env(up.url)
        _, run_id = await start(b, "send the report")
        req = await wait_event(b, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        async with ws_connect(http, gw, "bob") as ws:
            await ws.send(type="decide", approval_id=req.approval_id, decision="reject",
                          comment="not today")  # fmt: skip
            reply = await ws.next_reply()
            assert reply["type"] == "ack", reply
        evs = await read_run(b, run_id)
    assert up.side_effects == 0
    check_resumed(up, "reject", "not today")
    assert body_of(evs)[-3:] == [
        ("approval_decided", "reject", "bob"),
        ("tool_result", "denied", "not sent"),
        ("text_delta", "nothing was sent"),
    ]
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"


async def test_kill_9_while_waiting_for_approval_resumes_on_another_worker(
    settings: Settings, client: Broker, tmp_path: Path, upstream_env: Callable[[str], None]
) -> None:
    ref: list[Upstream] = []
    async with serving(approval_script(ref)) as up:
        ref.append(up)
        doomed = WorkerProcess(
            settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT
        )
        doomed.env["RUNLOG_AGUI_URL"] = up.url
        await doomed.start()
        try:
            _, run_id = await start(client, "send the report")
            req = await wait_event(client, run_id, "approval_required")
            assert isinstance(req, events.ApprovalRequired)
        finally:
            await doomed.kill()
        # Decided while no worker owns the run: stored, and acted on by the next owner.
        await client.decide(req.approval_id, "approve", "bob", "go")
        upstream_env(up.url)
        async with running_worker(settings, purge=False, agent=AGENT) as (_, w):
            evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    # The first segment was not POSTed again; the resume was, once.
    assert len(up.requests) == 2 and up.side_effects == 1
    check_resumed(up, "approve", "go")
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.approval_id, dec.decision) == (req.approval_id, "approve")
    assert [r.status for r in of(evs, events.ToolResult)] == ["ok"]
    assert of(evs, events.ToolResult)[0].tool_call_id == req.tool_call_id
    assert text_of(evs) == "I will send the report. the summary was sent"
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"


async def test_kill_9_mid_stream_posts_the_first_segment_again(
    settings: Settings, client: Broker, tmp_path: Path, upstream_env: Callable[[str], None]
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.started()
        if len(up.requests) == 1:
            await ex.send(
                TextMessageStartEvent(message_id="a1", role="assistant"),
                TextMessageContentEvent(message_id="a1", delta="partial "),
            )
            await asyncio.Event().wait()  # the worker dies meanwhile
        await ex.send(
            TextMessageStartEvent(message_id="a1", role="assistant"),
            TextMessageContentEvent(message_id="a1", delta="complete"),
            TextMessageEndEvent(message_id="a1"),
            finished(ex),
        )

    async with serving(script) as up:
        doomed = WorkerProcess(
            settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT
        )
        doomed.env["RUNLOG_AGUI_URL"] = up.url
        await doomed.start()
        try:
            _, run_id = await start(client, "hello")
            cut = await wait_event(client, run_id, "text_delta")
            assert isinstance(cut, events.TextDelta)
        finally:
            await doomed.kill()
        upstream_env(up.url)
        async with running_worker(settings, purge=False, agent=AGENT) as (_, w):
            evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    assert len(up.requests) == 2 and up.disconnects == 1
    assert up.requests[1].resume is None
    (reset,) = of(evs, events.MessageReset)
    assert reset.message_id == cut.message_id  # the cut text is retracted
    first, again = of(evs, events.TextDelta)
    assert (first.delta, again.delta) == ("partial ", "complete")
    assert again.message_id != cut.message_id
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"


async def test_kill_9_while_the_resume_streams_fails_the_run_step_interrupted(
    settings: Settings, client: Broker, tmp_path: Path, upstream_env: Callable[[str], None]
) -> None:
    async def script(ex: Exchange) -> None:
        await ex.started()
        if not ex.input.resume:
            await ex.send(
                ToolCallStartEvent(tool_call_id="c1", tool_call_name="send_report"),
                ToolCallEndEvent(tool_call_id="c1"),
                finished(ex, outcome=RunFinishedInterruptOutcome(interrupts=[INTERRUPT])),
            )
            return
        up.side_effects += 1
        await ex.send(
            TextMessageStartEvent(message_id="a2", role="assistant"),
            TextMessageContentEvent(message_id="a2", delta="sending "),
        )
        await asyncio.Event().wait()  # the worker dies meanwhile

    async with serving(script) as up:
        doomed = WorkerProcess(
            settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT
        )
        doomed.env["RUNLOG_AGUI_URL"] = up.url
        await doomed.start()
        try:
            _, run_id = await start(client, "send the report")
            req = await wait_event(client, run_id, "approval_required")
            assert isinstance(req, events.ApprovalRequired)
            await client.decide(req.approval_id, "approve", "bob", "go")
            await wait_event(client, run_id, "text_delta")
        finally:
            await doomed.kill()
        upstream_env(up.url)
        async with running_worker(settings, purge=False, agent=AGENT):
            evs = await read_run(client, run_id)
    # The upstream may already be doing what was approved: not asked twice.
    assert len(up.requests) == 2 and up.side_effects == 1
    err, end = evs[-2], evs[-1]
    assert isinstance(err, events.RunError) and err.code == "step_interrupted", err
    assert isinstance(end, events.RunEnd) and end.status == "failed"


async def _approve(b: Broker, run_id: str) -> events.ApprovalRequired:
    req = await wait_event(b, run_id, "approval_required")
    assert isinstance(req, events.ApprovalRequired)
    await b.decide(req.approval_id, "approve", "bob", "go")
    return req


def kill_point_script(up_ref: list[Upstream], hold: str) -> Callable[[Exchange], Awaitable[None]]:
    """approval_script's run, whose stream hangs for good at `hold` in the
    worker to be killed: "before_tool" (the first POST, before the call),
    "after_tool" (the resume, right after the tool's result), "answer" (the
    resume, in the middle of the answer). A POST that carries the tool's
    result and no resume (an AG-UI client continuing the conversation) gets
    the answer."""

    async def script(ex: Exchange) -> None:
        up = up_ref[0]
        await ex.started()
        answered = any(m.role == "tool" for m in ex.input.messages)
        if not ex.input.resume and not answered:
            await ex.send(
                TextMessageStartEvent(message_id="a1", role="assistant"),
                TextMessageContentEvent(message_id="a1", delta="I will send the report. "),
            )
            if hold == "before_tool" and len(up.requests) == 1:
                await asyncio.Event().wait()
            await ex.send(
                TextMessageEndEvent(message_id="a1"),
                ToolCallStartEvent(
                    tool_call_id="c1", tool_call_name="send_report", parent_message_id="a1"
                ),
                ToolCallArgsEvent(tool_call_id="c1", delta='{"to": "team"}'),
                ToolCallEndEvent(tool_call_id="c1"),
                finished(ex, outcome=RunFinishedInterruptOutcome(interrupts=[INTERRUPT])),
            )
            return
        if ex.input.resume:
            up.side_effects += 1
            await ex.send(ToolCallResultEvent(message_id="t1", tool_call_id="c1", content="sent"))
            if hold == "after_tool":
                await asyncio.Event().wait()
            await ex.send(
                TextMessageStartEvent(message_id="a2", role="assistant"),
                TextMessageContentEvent(message_id="a2", delta="the summary "),
            )
            if hold == "answer":
                await asyncio.Event().wait()
            await ex.send(
                TextMessageContentEvent(message_id="a2", delta="was sent"),
                TextMessageEndEvent(message_id="a2"),
                finished(ex),
            )
            return
        await ex.send(
            TextMessageStartEvent(message_id="a3", role="assistant"),
            TextMessageContentEvent(message_id="a3", delta="the summary was sent"),
            TextMessageEndEvent(message_id="a3"),
            finished(ex),
        )

    return script


@pytest.mark.parametrize("hold", ["before_tool", "after_tool", "answer"])
async def test_kill_9_around_the_approved_tool_resumes_and_runs_it_once(
    settings: Settings,
    client: Broker,
    tmp_path: Path,
    upstream_env: Callable[[str], None],
    hold: str,
) -> None:
    """Killed mid-stream before the tool call, right after the upstream ran
    the approved tool (its tool_result is logged), or during the answer after
    it: the run resumes elsewhere and the upstream ran the tool once. (Killed
    while waiting for the approval:
    test_kill_9_while_waiting_for_approval_resumes_on_another_worker.)"""
    ref: list[Upstream] = []
    async with serving(kill_point_script(ref, hold)) as up:
        ref.append(up)
        doomed = WorkerProcess(
            settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT
        )
        doomed.env["RUNLOG_AGUI_URL"] = up.url
        await doomed.start()
        try:
            _, run_id = await start(client, "send the report")
            if hold == "before_tool":
                await wait_event(client, run_id, "text_delta")
            else:
                req = await _approve(client, run_id)
                await wait_event(client, run_id, "tool_result")
                if hold == "answer":
                    await wait_event(client, run_id, "text_delta", count=2)
        finally:
            await doomed.kill()
        upstream_env(up.url)
        async with running_worker(settings, purge=False, agent=AGENT):
            if hold == "before_tool":
                req = await _approve(client, run_id)
            evs = await read_run(client, run_id)
    assert of(evs, events.RunError) == []
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"
    assert up.side_effects == 1  # the approved tool, run once by the upstream
    assert [len(r.resume or ()) for r in up.requests] == (
        [0, 0, 1] if hold == "before_tool" else [0, 1, 0]
    )  # the resume[] POSTed once
    if hold != "before_tool":  # the continuation carries the tool's result
        last = up.requests[2].messages[-1].model_dump(by_alias=True, exclude_none=True)
        assert last == {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "sent"}
    assert len(of(evs, events.ApprovalRequired)) == 1
    assert [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)] == [
        (req.tool_call_id, "ok")
    ]  # never retracted
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    reset = {e.message_id for e in of(evs, events.MessageReset)}
    kept = "".join(d.delta for d in of(evs, events.TextDelta) if d.message_id not in reset)
    assert kept == "I will send the report. the summary was sent"
    resets = of(evs, events.MessageReset)
    after = "".join(
        d.delta for d in of(evs, events.TextDelta) if not resets or d.seq > resets[-1].seq
    )
    assert after == ("the summary was sent" if hold == "answer" else kept)


async def test_kill_9_after_a_tool_result_of_the_first_post_continues_from_it(
    settings: Settings, client: Broker, tmp_path: Path, upstream_env: Callable[[str], None]
) -> None:
    """A tool the upstream runs without an approval: its result is a durable
    point too, and the takeover POSTs a continuation instead of failing."""

    async def script(ex: Exchange) -> None:
        await ex.started()
        if any(m.role == "tool" for m in ex.input.messages):
            await ex.send(
                TextMessageStartEvent(message_id="a2", role="assistant"),
                TextMessageContentEvent(message_id="a2", delta="it is sunny"),
                finished(ex),
            )
            return
        up.side_effects += 1
        await ex.send(
            ToolCallStartEvent(tool_call_id="c1", tool_call_name="weather"),
            ToolCallEndEvent(tool_call_id="c1"),
            ToolCallResultEvent(message_id="t1", tool_call_id="c1", content="sunny"),
            TextMessageStartEvent(message_id="a1", role="assistant"),
            TextMessageContentEvent(message_id="a1", delta="it is "),
        )
        await asyncio.Event().wait()  # the worker dies meanwhile

    async with serving(script) as up:
        doomed = WorkerProcess(
            settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT
        )
        doomed.env["RUNLOG_AGUI_URL"] = up.url
        await doomed.start()
        try:
            _, run_id = await start(client, "weather?")
            await wait_event(client, run_id, "text_delta")
        finally:
            await doomed.kill()
        upstream_env(up.url)
        async with running_worker(settings, purge=False, agent=AGENT):
            evs = await read_run(client, run_id)
    assert isinstance(evs[-1], events.RunEnd) and evs[-1].status == "completed"
    assert up.side_effects == 1 and len(up.requests) == 2
    assert [(r.status, r.summary) for r in of(evs, events.ToolResult)] == [("ok", "sunny")]
    (reset,) = of(evs, events.MessageReset)
    assert [d.delta for d in of(evs, events.TextDelta) if d.seq > reset.seq] == ["it is sunny"]


# -- stop


# -- failures


async def failing_script(ex: Exchange) -> web.StreamResponse | None:
    """The failure named by the run's input."""
    match ex.input.messages[-1].content:
        case "http 503":
            return web.Response(status=503, text='{"error": {"message": "busy"}}')
        case "http 401":
            return web.Response(status=401, text="no")
        case "http 404":
            return web.Response(status=404, text="no such agent")
        case "json":
            return web.json_response({"ok": True})
        case "not json":
            await ex.started()
            await ex.raw(b"data: {not json\n\n")
        case "invalid event":
            await ex.started()
            await ex.raw(b'data: {"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1"}\n\n')
        case "cut":
            await ex.started()
            await ex.send(TextMessageStartEvent(message_id="a1"),
                          TextMessageContentEvent(message_id="a1", delta="partial"))  # fmt: skip
        case "run error":
            await ex.started()
            await ex.send(RunErrorEvent(message="the tool crashed", code="TOOL_CRASH"))
        case "silent":
            await ex.raw(b": hello\n\n")  # headers and a comment, then nothing
            await asyncio.Event().wait()
    return None


FAILURES = {
    "http 503": ("upstream_unavailable", True),
    "http 401": ("upstream_auth", False),
    "http 404": ("upstream_bad_request", False),
    "json": ("upstream_bad_response", True),
    "not json": ("upstream_bad_response", True),
    "invalid event": ("upstream_bad_response", True),
    "cut": ("upstream_incomplete", True),
    "run error": ("upstream_error", False),
    "silent": ("upstream_timeout", True),
}


async def test_upstream_failures_end_runs_with_coded_errors(
    settings: Settings, upstream_env: Callable[[str], None]
) -> None:
    async with (
        serving(failing_script) as up,
        running_worker(settings, agent=AGENT, model_timeout_s=2.0) as (b, _),
    ):
        upstream_env(up.url)
        runs = {what: (await start(b, what))[1] for what in FAILURES}
        got = {what: await read_run(b, run_id) for what, run_id in runs.items()}
    for what, evs in got.items():
        err, end = evs[-2], evs[-1]
        assert isinstance(err, events.RunError), (what, evs)
        assert (err.code, err.retryable) == FAILURES[what], (what, err)
        assert isinstance(end, events.RunEnd) and end.status == "failed"
    err = got["run error"][-2]
    assert isinstance(err, events.RunError) and err.message == "TOOL_CRASH: the tool crashed"
    assert text_of(got["cut"]) == "partial"


async def test_an_upstream_that_refuses_connections_is_upstream_unavailable(
    settings: Settings, upstream_env: Callable[[str], None]
) -> None:
    upstream_env(f"http://127.0.0.1:{free_port()}/agent")  # nobody listens there
    async with running_worker(settings, agent=AGENT) as (b, _):
        _, run_id = await start(b, "hello")
        evs = await read_run(b, run_id)
    err = evs[-2]
    assert isinstance(err, events.RunError)
    assert (err.code, err.retryable) == ("upstream_unavailable", True)
    assert "127.0.0.1" not in err.message  # names the failure, never the URL


# -- the pure core, without servers


class Recorder:
    """A `Sink` that records what the translator asks of the agent API."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._n = 0

    def message_id(self) -> str:
        self._n += 1
        return f"m{self._n}"

    def tool_call_id(self) -> str:
        self._n += 1
        return f"tc{self._n}"

    async def text(self, message_id: str, delta: str) -> None:
        self.calls.append(("text", message_id, delta))

    async def reasoning(self, message_id: str, delta: str) -> None:
        self.calls.append(("reasoning", message_id, delta))

    async def tool_start(self, tool_call_id: str, tool_name: str, *, risk: Any = "low") -> None:
        self.calls.append(("tool_start", tool_call_id, tool_name, risk))

    async def tool_args(self, tool_call_id: str, partial_json: str) -> None:
        self.calls.append(("tool_args", tool_call_id, partial_json))

    async def tool_end(self, tool_call_id: str) -> None:
        self.calls.append(("tool_end", tool_call_id))

    async def tool_result(self, tool_call_id: str, status: Any = "ok", summary: str = "",
                          output: str | None = None) -> None:  # fmt: skip
        self.calls.append(("tool_result", tool_call_id, status, summary, output))

    async def status(self, code: str, summary: str = "") -> None:
        self.calls.append(("status", code, summary))

    def usage(self, *, input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0) -> None:  # fmt: skip
        self.calls.append(("usage", input_tokens, output_tokens, reasoning_tokens))


async def feed_all(tr: agui.Translator, *items: str) -> None:
    for data in items:
        await tr.feed(data)


END = '{"type": "RUN_FINISHED", "threadId": "s", "runId": "r"}'


async def test_translator_reads_0x_thinking_and_ignores_unknown_types() -> None:
    rec = Recorder()
    tr = agui.Translator(rec, agui.Carry())
    await feed_all(
        tr,
        '{"type": "THINKING_START"}',
        '{"type": "THINKING_TEXT_MESSAGE_START"}',
        '{"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "hm"}',
        '{"type": "THINKING_TEXT_MESSAGE_END"}',
        '{"type": "THINKING_END"}',
        '{"type": "SOMETHING_NEW_IN_1_1", "x": 1}',
        '{"type": "TEXT_MESSAGE_START", "messageId": "u", "role": "user"}',
        '{"type": "TEXT_MESSAGE_CONTENT", "messageId": "u", "delta": "echo"}',
        '{"type": "REASONING_MESSAGE_CHUNK", "messageId": "r", "delta": "a"}',
        '{"type": "REASONING_MESSAGE_CHUNK", "delta": "b"}',
        END,
        '{"type": "TEXT_MESSAGE_CONTENT", "messageId": "u", "delta": "after the end"}',
    )
    assert rec.calls == [("reasoning", "m1", "hm"), ("reasoning", "m2", "a"),
                         ("reasoning", "m2", "b")]  # fmt: skip
    assert tr.segment().interrupts == []


@pytest.mark.parametrize(
    "data",
    [
        '{"type": "TOOL_CALL_ARGS", "toolCallId": "nope", "delta": "{}"}',
        '{"type": "TEXT_MESSAGE_CHUNK", "delta": "no id"}',
        '{"type": "TOOL_CALL_CHUNK", "toolCallId": "c9", "delta": "no name"}',
        '{"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": 5}',
        '["TEXT_MESSAGE_CONTENT"]',
        '{"type": 7}',
        "{",
    ],
)
async def test_translator_refuses_what_would_lose_or_garble_output(data: str) -> None:
    tr = agui.Translator(Recorder(), agui.Carry())
    with pytest.raises(AgentError) as e:
        await tr.feed(data)
    assert (e.value.code, e.value.retryable) == ("upstream_bad_response", True)


async def test_translator_keeps_ids_across_segments() -> None:
    rec = Recorder()
    tr = agui.Translator(rec, agui.Carry())
    await feed_all(
        tr,
        '{"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "x"}',
        '{"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "t"}',
        '{"type": "RUN_FINISHED", "threadId": "s", "runId": "r", "outcome": {"type": "interrupt",'
        ' "interrupts": [{"id": "i1", "reason": "tool_approval", "toolCallId": "c1"}]}}',
    )
    seg = tr.segment()
    assert seg.interrupts == [{"id": "i1", "reason": "tool_approval", "toolCallId": "c1"}]
    assert rec.calls == [("text", "m1", "x"), ("tool_start", "tc2", "t", "low"),
                         ("tool_end", "tc2")]  # fmt: skip
    # The next segment: a re-opened call and a continued message keep their cards.
    stored = msgspec.json.decode(msgspec.json.encode(seg), type=agui.Segment)
    rec2 = Recorder()
    tr2 = agui.Translator(rec2, stored.carry)
    await feed_all(
        tr2,
        '{"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "t"}',
        '{"type": "TOOL_CALL_RESULT", "messageId": "t1", "toolCallId": "c1",'
        ' "content": [{"type": "text", "text": "done"}]}',
        '{"type": "TEXT_MESSAGE_CONTENT", "messageId": "a1", "delta": "y"}',
        END,
    )
    assert rec2.calls == [("tool_result", "tc2", "ok", "done", "done"), ("text", "m1", "y")]
    msgs = tr2.segment().carry.messages
    assert [(m["id"], m["role"]) for m in msgs] == [
        ("a1", "assistant"), ("c1", "assistant"), ("t1", "tool"),
    ]  # fmt: skip
    assert msgs[0]["content"] == "xy" and msgs[1]["toolCalls"][0]["id"] == "c1"
    assert seg.carry.messages[0]["content"] == "x"  # the stored carry was not changed


async def test_translator_without_an_end_is_incomplete() -> None:
    tr = agui.Translator(Recorder(), agui.Carry())
    await tr.feed('{"type": "RUN_STARTED", "threadId": "s", "runId": "r"}')
    with pytest.raises(AgentError) as e:
        tr.segment()
    assert (e.value.code, e.value.retryable) == ("upstream_incomplete", True)


def test_a_decision_answers_its_interrupt() -> None:
    i = Interrupt(id="i1", reason="tool_approval")
    assert agui.default_answer(i, Decision("expired", "system", "")).model_dump(
        by_alias=True, exclude_none=True
    ) == {"interruptId": "i1", "status": "cancelled"}
    assert agui.default_answer(i, Decision("reject", "bob", "no")).model_dump(
        by_alias=True, exclude_none=True
    ) == {"interruptId": "i1", "status": "resolved",
          "payload": {"decision": "reject", "comment": "no"},
          "metadata": {"runlog": {"decided_by": "bob"}}}  # fmt: skip


def test_the_module_agent_needs_its_url() -> None:
    with pytest.raises(AgentError) as e:
        agui._from_env({})
    assert e.value.code == "upstream_not_configured"
    with pytest.raises(AgentError) as e:
        agui._from_env({"RUNLOG_AGUI_URL": "http://x", "RUNLOG_AGUI_HEADERS": '["a"]'})
    assert e.value.code == "upstream_not_configured"
    a = agui._from_env({"RUNLOG_AGUI_URL": "http://x", "RUNLOG_AGUI_HEADERS": '{"X-Key": "k"}'})
    assert a.url == "http://x" and a.headers["X-Key"] == "k"
