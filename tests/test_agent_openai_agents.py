"""The OpenAI Agents SDK adapter (workers/frameworks/openai_agents.py) with the
real SDK, offline: its runs stream, call tools, wait for approvals decided
through runlog, survive kill -9 of their worker, stop, and fail coded.

The agent and its scripted model are tests/agents/oa_agent.py.

The stop and tool-call tests every adapter shares are tests/test_agent_contract.py's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker import events, steps
from broker.runtime import Broker
from broker.settings import Settings

from .agents import oa_agent
from .agents.oa_agent import counted
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
    wait_until,
)

AGENT = "tests.agents.oa_agent:agent"


def _spec(**kw: Any) -> str:
    return json.dumps(kw)


def _tag() -> str:
    return uuid.uuid4().hex


def _delete_args(d: Path) -> list[str]:
    """delete_rows' arguments, streamed in three pieces."""
    return ['{"dir": ', json.dumps(str(d)), ', "n": 2}']


def _async(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()

    return check


def _kept_text(evs: list[events.AnyEvent]) -> str:
    """The run's text without the messages it reset."""
    reset = {e.message_id for e in of(evs, events.MessageReset)}
    return "".join(d.delta for d in of(evs, events.TextDelta) if d.message_id not in reset)


async def test_tokens_reach_a_subscriber_while_the_model_streams(settings: Settings) -> None:
    g = _tag()
    async with running_worker(settings, agent=AGENT) as (b, _):
        _, run_id = await start(b, _spec(words=["Hel", "lo", " world"], gate=g, reasoning="hmm"))
        first = await wait_event(b, run_id, "text_delta")
        # The model waits for the gate after its first word: what we got, it
        # had not finished producing.
        assert isinstance(first, events.TextDelta) and first.delta == "Hel"
        assert (await b.store.run_head(run_id))[1] is False
        oa_agent.gate(g).set()
        evs = await read_run(b, run_id)
    assert [type(e).__name__ for e in evs] == [
        "RunStart", "ReasoningDelta", "TextDelta", "TextDelta", "TextDelta", "RunEnd",
    ]  # fmt: skip
    assert text_of(evs) == "Hello world"
    (thought,) = of(evs, events.ReasoningDelta)
    assert thought.delta == "hmm"
    # One message per model response, reasoning and text alike (as the built-in loop).
    assert {e.message_id for e in of(evs, events.TextDelta)} == {thought.message_id}
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    assert end.usage == events.Usage(input_tokens=11, output_tokens=3, reasoning_tokens=2)


async def test_the_sdk_context_is_made_per_run_by_the_factory(settings: Settings) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _):
        _, run_id = await start(b, _spec(tool="whoami", args=["{}"]), user="dave")
        evs = await read_run(b, run_id)
    assert [(r.status, r.summary) for r in of(evs, events.ToolResult)] == [("ok", "dave")]
    assert text_of(evs) == "done: dave"


async def test_the_sessions_conversation_is_the_sdk_runs_input(settings: Settings) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _):
        session_id, first = await start(b, _spec(words=["Hel", "lo"]))
        await read_run(b, first)
        second_input = _spec(echo=True)
        second = await b.start_run(session_id, "alice", input=second_input)
        evs = await read_run(b, second)
    assert json.loads(text_of(evs)) == [
        ["user", _spec(words=["Hel", "lo"])],
        ["assistant", "Hello"],
        ["user", second_input],
    ]


async def _approval_run(b: Broker, tmp_path: Path) -> tuple[str, events.ApprovalRequired]:
    _, run_id = await start(b, _spec(tool="delete_rows", args=_delete_args(tmp_path)))
    req = await wait_event(b, run_id, "approval_required")
    assert isinstance(req, events.ApprovalRequired)
    assert req.summary == f'delete_rows({{"dir": {json.dumps(str(tmp_path))}, "n": 2}})'
    assert (await b.store.get_run(run_id)).status == "waiting_approval"
    assert counted(tmp_path, "delete") == 0  # the SDK's run is interrupted, the tool not run
    return run_id, req


def _the_card(evs: list[events.AnyEvent], req: events.ApprovalRequired) -> events.ToolCallStart:
    (card,) = of(evs, events.ToolCallStart)
    assert card.tool_call_id == req.tool_call_id
    assert (card.tool_name, card.risk_level) == ("delete_rows", "high")
    return card


async def test_an_approval_decided_over_rest_resumes_the_sdk_run(
    settings: Settings, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with running_gateway(settings) as gw, running_worker(settings, agent=AGENT) as (b, _):
        run_id, req = await _approval_run(b, tmp_path)
        async with http.post(
            f"{gw.url}/v1/runs/{run_id}/approvals/{req.approval_id}",
            json={"decision": "approve", "comment": "go"},
            headers=gw.headers("bob"),
        ) as r:
            assert r.status == 201, await r.text()
        evs = await read_run(b, run_id)
        recs = await steps.load(b.store, run_id)
    _the_card(evs, req)
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by) == ("approve", "bob")
    assert [(r.status, r.summary) for r in of(evs, events.ToolResult)] == [("ok", "deleted 2 rows")]
    assert counted(tmp_path, "delete") == 1
    assert text_of(evs) == "done: deleted 2 rows"
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    # The approved call ran in a step of its own that stopped before the next
    # model call: the tool's result is in it, the answer in the next segment.
    assert [(r.name, r.kind, r.done) for r in recs] == [
        ("segment-0", "step", True),
        ("approval", "approval", True),
        ("tools-1", "step", True),
        ("segment-2", "step", True),
    ]
    (result,) = of(evs, events.ToolResult)
    (answer,) = of(evs, events.TextDelta)
    assert recs[1].seq < result.seq <= recs[2].seq < answer.seq <= recs[3].seq


async def test_an_approval_rejected_over_websocket_denies_the_call(
    settings: Settings, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with running_gateway(settings) as gw, running_worker(settings, agent=AGENT) as (b, _):
        run_id, req = await _approval_run(b, tmp_path)
        async with ws_connect(http, gw, "bob") as ws:
            await ws.send(
                type="decide", ref="d1", approval_id=req.approval_id, decision="reject",
                comment="not today",
            )  # fmt: skip
            reply = await ws.next_reply()
            assert reply["type"] == "ack" and reply["result"]["created"] is True, reply
        evs = await read_run(b, run_id)
    _the_card(evs, req)
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by, dec.comment) == ("reject", "bob", "not today")
    assert [(r.status, r.summary) for r in of(evs, events.ToolResult)] == [
        ("denied", "denied: not today")
    ]
    assert counted(tmp_path, "delete") == 0
    assert text_of(evs) == "done: denied: not today"  # the model was told
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_while_waiting_for_the_approval_resumes_on_another_worker(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT)
    await doomed.start()
    try:
        run_id, req = await _approval_run(client, tmp_path)
    finally:
        await doomed.kill()
    # Decided while no worker owns the run: stored, and sent to nobody.
    await client.decide(req.approval_id, "approve", "bob", "ok")
    async with running_worker(settings, purge=False, agent=AGENT) as (_, w):
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    _the_card(evs, req)
    # The new owner restored the SDK's RunState from the stored segment and
    # applied the stored decision: no second approval, the tool ran once.
    assert [a.approval_id for a in of(evs, events.ApprovalRequired)] == [req.approval_id]
    assert [d.decision for d in of(evs, events.ApprovalDecided)] == ["approve"]
    assert [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)] == [
        (req.tool_call_id, "ok")
    ]
    assert counted(tmp_path, "delete") == 1
    assert text_of(evs) == "done: deleted 2 rows"
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_while_the_approved_tool_runs_fails_the_run_rather_than_run_it_twice(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    args = ['{"dir": ', json.dumps(str(tmp_path)), ', "n": 2, "hold_s": 600}']
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tool="delete_rows", args=args))
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        await client.decide(req.approval_id, "approve", "bob", "ok")
        await wait_until(_async(lambda: counted(tmp_path, "started") == 1))
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=AGENT):
        evs = await read_run(client, run_id)
    err, end = evs[-2:]
    assert isinstance(err, events.RunError) and (err.code, err.retryable) == (
        "step_interrupted",
        False,
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"
    assert (counted(tmp_path, "started"), counted(tmp_path, "delete")) == (1, 0)


async def test_kill_9_mid_stream_resumes_the_segment_on_another_worker(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(stall_once=str(tmp_path), words=["Hel", "lo"]))
        await wait_event(client, run_id, "text_delta")
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=AGENT) as (_, w):
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    # The dead worker's partial message is retracted; the segment ran again.
    (dead, live) = dict.fromkeys(e.message_id for e in of(evs, events.TextDelta))
    assert [e.message_id for e in of(evs, events.MessageReset)] == [dead]
    assert [e.delta for e in of(evs, events.TextDelta) if e.message_id == dead] == ["thinking"]
    assert [e.delta for e in of(evs, events.TextDelta) if e.message_id == live] == ["Hel", "lo"]
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def _approve(b: Broker, run_id: str) -> events.ApprovalRequired:
    req = await wait_event(b, run_id, "approval_required")
    assert isinstance(req, events.ApprovalRequired)
    await b.decide(req.approval_id, "approve", "bob", "")
    return req


@pytest.mark.parametrize("hold", ["before_tool", "after_tool", "answer"])
async def test_kill_9_around_the_approved_tool_resumes_and_runs_it_once(
    settings: Settings, client: Broker, tmp_path: Path, hold: str
) -> None:
    """Killed mid-stream before the tool call, right after the approved tool
    ran (its tool_result is logged), or during the answer after it: the run
    resumes elsewhere, the tool ran once. (Killed while waiting for the
    approval: test_kill_9_while_waiting_for_the_approval_resumes_on_another_worker.)"""
    spec = _spec(tool="delete_rows", args=_delete_args(tmp_path), hold=hold, gate_dir=str(tmp_path))
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT)
    await doomed.start()
    try:
        _, run_id = await start(client, spec)
        if hold == "before_tool":
            await wait_event(client, run_id, "text_delta")
        else:
            req = await _approve(client, run_id)
            await wait_event(client, run_id, "tool_result")
            if hold == "answer":
                await wait_event(client, run_id, "text_delta")
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, purge=False, agent=AGENT):
        if hold == "before_tool":
            req = await _approve(client, run_id)
        evs = await read_run(client, run_id)
    assert of(evs, events.RunError) == []
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert counted(tmp_path, "delete") == 1  # the approved side effect, once
    _the_card(evs, req)
    assert len(of(evs, events.ApprovalRequired)) == 1
    assert [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)] == [
        (req.tool_call_id, "ok")
    ]  # never retracted
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    full = ("Sending. " if hold == "before_tool" else "") + "done: deleted 2 rows"
    assert _kept_text(evs) == full
    resets = of(evs, events.MessageReset)
    after = "".join(
        d.delta for d in of(evs, events.TextDelta) if not resets or d.seq > resets[-1].seq
    )
    assert after == full


async def test_kill_9_after_a_tool_without_approval_ran_in_the_segment_fails_worker_lost(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The limit: `lookup` (no approval) ran inside the segment the dead
    worker did not finish; running the segment again would run it again."""
    spec = _spec(tool="lookup", args=['{"q": "x"}'], hold="answer", gate_dir=str(tmp_path))
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, worker_lease_s=2.0, **IN_SLOT)
    await doomed.start()
    try:
        _, run_id = await start(client, spec)
        await wait_event(client, run_id, "text_delta")  # the answer after the tool's result
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=AGENT):
        evs = await read_run(client, run_id)
    (result,) = of(evs, events.ToolResult)
    err, end = evs[-2:]
    assert isinstance(err, events.RunError)
    assert (err.code, err.message) == (
        "worker_lost",
        f"the run cannot be resumed: tool_result at seq {result.seq} after the last durable point",
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"


async def test_sdk_failures_become_coded_run_errors(settings: Settings) -> None:
    cases = {
        "loop": (_spec(loop=True), "max_turns_exceeded", False, "Max turns (3) exceeded"),
        "429": (_spec(error="rate_limit"), "model_error", True, "the model provider answered 429"),
        "bug": (_spec(error="boom"), "agent_error", False, "the agent raised RuntimeError"),
    }
    async with running_worker(settings, agent=AGENT) as (b, _):
        runs = {k: (await start(b, spec))[1] for k, (spec, *_) in cases.items()}
        got = {k: await read_run(b, run_id) for k, run_id in runs.items()}
    for k, (_, code, retryable, message) in cases.items():
        err, end = got[k][-2:]
        assert isinstance(err, events.RunError), k
        assert (err.code, err.retryable, err.message) == (code, retryable, message), k
        assert isinstance(end, events.RunEnd) and end.status == "failed", k
    assert len(of(got["loop"], events.ToolResult)) == 3  # one lookup per allowed turn
