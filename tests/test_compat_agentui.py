"""AgentUiEvent (seed S0), the pure projection (gateway/compat/agentui.py): no servers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import cast

import aiohttp
import pytest_asyncio

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from gateway.compat.agentui import AgentUiProjection
from gateway.compat.base import Context

from .compat_logs import RUN, SESSION, answer, frames, numbered, resume_cases, scripted_log
from .gw import RunningGateway, eventually, running_gateway, session_with
from .seedclients import AgentUiClient, AgentUiState, decide, interrupt
from .workerkit import running_worker, stored


def _proj() -> AgentUiProjection:
    return AgentUiProjection(Context(RUN, SESSION))


def test_exact_frames_of_a_run() -> None:
    r = RUN
    expected: list[dict[str, object]] = [
        {"type": "run_start", "runId": r, "traceId": "t1", "sessionId": SESSION},
        {"type": "reasoning_delta", "runId": r, "messageId": "m1", "delta": "Check "},
        {"type": "reasoning_delta", "runId": r, "messageId": "m1", "delta": "docs."},
        {"type": "text_delta", "runId": r, "messageId": "m1", "delta": "Let me "},
        {"type": "text_delta", "runId": r, "messageId": "m1", "delta": "look."},
        {"type": "text_reset", "runId": r, "messageId": "m1"},
        {"type": "tool_call_start", "runId": r, "toolCallId": "c1", "toolName": "search_docs",
         "riskLevel": "low"},
        {"type": "tool_args_delta", "runId": r, "toolCallId": "c1", "partialJson": '{"query"'},
        {"type": "tool_args_delta", "runId": r, "toolCallId": "c1", "partialJson": ':"x"}'},
        {"type": "tool_call_end", "runId": r, "toolCallId": "c1"},
        {"type": "progress", "runId": r, "label": "search", "done": 1, "total": 3},
        {"type": "tool_result", "runId": r, "toolCallId": "c1", "status": "ok",
         "summary": "3 pages", "output": "raw"},
        {"type": "status", "runId": r, "code": "thinking", "summary": "turn 2"},
        {"type": "text_delta", "runId": r, "messageId": "m2", "delta": "I found "},
        {"type": "text_delta", "runId": r, "messageId": "m2", "delta": "three."},
        {"type": "tool_call_start", "runId": r, "toolCallId": "c2", "toolName": "send_message",
         "riskLevel": "high"},
        {"type": "tool_args_delta", "runId": r, "toolCallId": "c2", "partialJson": "{}"},
        {"type": "tool_call_end", "runId": r, "toolCallId": "c2"},
        {"type": "approval_required", "runId": r, "approvalId": "ap1", "toolCallId": "c2",
         "summary": "send?", "expiresAt": 123},
        {"type": "approval_decided", "runId": r, "approvalId": "ap1", "decision": "approve",
         "decidedBy": "bob", "comment": ""},
        {"type": "tool_result", "runId": r, "toolCallId": "c2", "status": "denied",
         "summary": "no"},
        {"type": "text_delta", "runId": r, "messageId": "m3", "delta": "Done: "},
        {"type": "text_delta", "runId": r, "messageId": "m3", "delta": "sent."},
        {"type": "run_end", "runId": r, "status": "completed"},
    ]  # fmt: skip
    p = _proj()
    got = frames(answer(p, scripted_log()))
    # One frame per event, each carrying its seq (in `id:` and in the JSON).
    assert got == [({**f, "seq": i}, i) for i, f in enumerate(expected, 1)]
    assert p.done


def test_an_error_is_followed_by_the_end_and_an_interrupt_is_an_extension() -> None:
    evs = numbered([
        events.RunStart(trace_id="t"),
        events.InterruptRequested(requested_by="bob", reason="enough"),
        events.RunError(code="model_timeout", retryable=True, message="no tokens"),
        events.RunEnd(status="failed"),
    ])  # fmt: skip
    p = _proj()
    got = [f for f, _ in frames(answer(p, evs))]
    assert got[1:] == [
        {"type": "interrupt_requested", "runId": RUN, "requestedBy": "bob", "reason": "enough",
         "seq": 2},
        {"type": "run_error", "runId": RUN, "code": "model_timeout", "retryable": True,
         "message": "no tokens", "seq": 3},
        {"type": "run_end", "runId": RUN, "status": "failed", "seq": 4},
    ]  # fmt: skip
    assert p.done


def test_an_approval_does_not_end_the_answer() -> None:
    evs = scripted_log()[:19]  # up to approval_required, undecided
    p = _proj()
    got = answer(p, evs)
    assert (got[-1].seq, p.done) == (19, False)


def test_resume_from_every_cursor() -> None:
    """Only the missing events: an answer from cursor c is exactly what the
    full answer sent after seq c."""
    cases = resume_cases(_proj, scripted_log())
    for c, expected, resumed in cases:
        assert resumed == expected, f"cursor {c}"
        assert [w.seq for w in resumed] == list(range(c + 1, len(scripted_log()) + 1))


# -- served, against real gateways and a real worker, with the seed's client rules
# (workers run with discard_text_before_tools, so that the log has message_reset)


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings, sse_heartbeat_s=0.5) as g:
        yield g


@pytest_asyncio.fixture(loop_scope="session")
async def gw2(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings, sse_heartbeat_s=0.5) as g:
        yield g


def _as_log(evs: list[events.AnyEvent]) -> AgentUiState:
    """What a client that applied the stored log's projection holds."""
    proj = AgentUiProjection(Context(evs[0].run_id, evs[0].session_id))
    st = AgentUiState()
    for w in answer(proj, evs):
        st.apply(json.loads(w.data))
    return st


def _check_against_log(st: AgentUiState, evs: list[events.AnyEvent]) -> None:
    """The client's state is the stored log's: text per message (reset ones
    dropped), reasoning, each tool call's arguments and result, approvals."""
    reset = {e.message_id for e in evs if isinstance(e, events.MessageReset)}
    text: dict[str, str] = {}
    for e in evs:
        if isinstance(e, events.TextDelta) and e.message_id not in reset:
            text[e.message_id] = text.get(e.message_id, "") + e.delta
    assert st.text == text
    assert "".join(st.reasoning.values()) == "".join(
        e.delta for e in evs if isinstance(e, events.ReasoningDelta))  # fmt: skip
    starts = [e for e in evs if isinstance(e, events.ToolCallStart)]
    assert {k: (c.name, c.risk, c.args) for k, c in st.tools.items()} == {
        s.tool_call_id: (s.tool_name, s.risk_level, "".join(
            e.partial_json for e in evs
            if isinstance(e, events.ToolArgsDelta) and e.tool_call_id == s.tool_call_id))
        for s in starts
    }  # fmt: skip
    results = {e.tool_call_id: e.status for e in evs if isinstance(e, events.ToolResult)}
    assert {k: c.result["status"] for k, c in st.tools.items() if c.result} == results
    assert st.decided == {e.approval_id: e.decision for e in evs
                          if isinstance(e, events.ApprovalDecided)}  # fmt: skip
    assert st.seq == len(evs) and st.run_id == evs[0].run_id


async def test_agentui_full_run_with_an_approval_decided_over_rest(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    """alice starts a run with the seed's POST on one gateway, bob follows it
    on another (GET …/events?after=0); approval_required reaches both, bob
    decides through runlog's REST, and both streams go on to run_end."""
    sid = await session_with(http, gw, "alice", bob="approver")
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        alice = AgentUiClient(http, gw.token("alice"))
        run = asyncio.create_task(alice.start(gw.url, sid, "tell me about runlog"))
        await eventually(lambda: alice.state.run_id is not None, 30, "run_start")
        rid = alice.state.run_id
        assert rid is not None
        bob = AgentUiClient(http, gw2.token("bob"))
        follow = asyncio.create_task(bob.resume(gw2.url, rid))
        await eventually(
            lambda: bool(alice.state.approvals and bob.state.approvals), 30, "approvals"
        )
        (approval,) = alice.state.approvals
        assert alice.state.approvals[approval]["toolCallId"] == "call_2_0"
        # Open while the run waits, kept alive by heartbeat comments.
        await eventually(lambda: ": hb" in alice.comments and ": hb" in bob.comments, 30, "hb")
        assert not run.done() and not follow.done()
        assert (await decide(http, gw2.url, gw2.token("bob"), rid, approval, "approve"))[0] == 201
        assert await run == 200 and await follow == 200
        log = await stored(broker, rid)
    assert alice.state.status == "completed" and alice.state.decided == {approval: "approve"}
    _check_against_log(alice.state, log)
    assert alice.state == bob.state == _as_log(log)
    assert (alice.state.trace_id, alice.state.session_id) == (
        cast(events.RunStart, log[0]).trace_id, sid)  # fmt: skip
    assert "text_reset" in alice.state.types and "reasoning_delta" in alice.state.types


async def test_agentui_cut_mid_text_and_mid_tool_args_resumed_on_either_gateway(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    """Cut every few events (inside text and inside tool arguments), resumed
    with `?after=seq` alternately on each gateway: the merge by toolCallId
    and messageId ends exactly as the log."""
    sid = await session_with(http, gw, "alice")
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        c = AgentUiClient(http, gw.token("alice"))
        await c.start(gw.url, sid, "tell me about runlog, no approval", cut_after=3)
        rid = c.state.run_id
        assert rid is not None
        cuts, cut_in_args = 1, 0
        while c.state.status is None:
            last = c.state.types[-1]
            cut_in_args += last == "tool_args_delta"
            assert await c.resume((gw2 if cuts % 2 else gw).url, rid, cut_after=3) == 200
            cuts += 1
        log = await stored(broker, rid)
    _check_against_log(c.state, log)
    assert c.state == _as_log(log) and cut_in_args >= 1 and cuts > 10


async def test_agentui_an_ended_run_replayed(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    sid = await session_with(http, gw, "alice", vic="viewer")
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        c = AgentUiClient(http, gw.token("alice"))
        assert await c.start(gw.url, sid, "tell me about runlog, no approval") == 200
        assert c.state.run_id is not None
        log = await stored(broker, c.state.run_id)
    late = AgentUiClient(http, gw2.token("vic"))
    assert await late.resume(gw2.url, c.state.run_id) == 200
    assert late.state == c.state == _as_log(log)
    # From its end: run_end again (these formats have no 204).
    end = AgentUiClient(http, gw2.token("vic"))
    end.state.seq = len(log)
    assert await end.resume(gw2.url, c.state.run_id) == 200
    assert (end.state.types, end.state.status) == (["run_end"], "completed")


async def test_agentui_stop_through_runlog_interrupt(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    """The seed's stop() only aborts the fetch (the run goes on); runlog's
    interrupt stops it: interrupt_requested, then run_end{aborted}."""
    sid = await session_with(http, gw, "alice", bob="approver")
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        c = AgentUiClient(http, gw.token("alice"))
        await c.start(gw.url, sid, "stall", until="text_delta")  # the fetch aborted
        rid = c.state.run_id
        assert rid is not None
        await eventually(lambda: len(c.state.text) > 0, 10, "text")
        assert (await broker.store.get_run(rid)).status == "running"  # a closed stream is no stop
        watch = asyncio.create_task(c.resume(gw2.url, rid))
        assert await interrupt(http, gw2.url, gw2.token("bob"), rid) == 202
        assert await watch == 200
        log = await stored(broker, rid)
    assert c.state.status == "aborted" and "interrupt_requested" in c.state.types
    _check_against_log(c.state, log)


async def test_agentui_bad_requests(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", vic="viewer")
    other = await session_with(http, gw, "alice")
    url = f"{gw.url}/v1/compat/agent-ui/sessions/{sid}/runs"
    cases: list[tuple[str, object, int, str]] = [
        ("alice", {"goal": "x", "sessionId": other}, 400, "invalid_request"),
        ("alice", {"goal": "x", "extra": 1}, 400, "invalid_request"),
        ("vic", {"goal": "x"}, 403, "forbidden"),
        ("mallory", {"goal": "x"}, 403, "not_a_member"),
    ]
    for user, body, status, code in cases:
        async with http.post(url, json=body, headers=gw.headers(user)) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (status, code), body
    assert (await broker.store.session_info(sid)).runs == []
    rid = "r_" + "A" * 22
    async with http.get(f"{gw.url}/v1/compat/agent-ui/runs/{rid}/events?after=x",
                        headers=gw.headers("alice")) as r:  # fmt: skip
        assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_cursor")
    async with http.get(f"{gw.url}/v1/compat/agent-ui/runs/{rid}/events",
                        headers=gw.headers("alice")) as r:  # fmt: skip
        assert (r.status, (await r.json())["error"]["code"]) == (403, "not_a_member")
