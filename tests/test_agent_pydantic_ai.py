"""The Pydantic AI adapter (workers/frameworks/pydantic_ai.py) with the real
library: a Pydantic AI agent on its own `FunctionModel` (tests/agents/pa_agent.py)
run by runlog workers, in-process and as `runlog worker` processes.

The stop and tool-call tests every adapter shares are tests/test_agent_contract.py's."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from pydantic_ai.exceptions import (
    ModelHTTPError,
    ModelRateLimitError,
    RunTimedOut,
    UnexpectedModelBehavior,
    UsageLimitExceeded,
    UserError,
)

from broker import events, ids, steps
from broker.runtime import Broker
from broker.settings import Settings
from workers.frameworks.pydantic_ai import coded

from .agents import pa_agent
from .gw import running_gateway, ws_connect
from .helpers import sample
from .workerkit import (
    DOOMED,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    stored,
    text_of,
    wait_event,
    wait_until,
)

AGENT = "tests.agents.pa_agent:agent"
_DOOMED = DOOMED


def _input(**kw: object) -> str:
    return json.dumps(kw)


def _types(evs: list[events.AnyEvent]) -> list[str]:
    return [type(e).__name__ for e in evs]


def _async(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()

    return check


def _kept_text(evs: list[events.AnyEvent]) -> str:
    """The run's text without the messages it reset."""
    reset = {e.message_id for e in of(evs, events.MessageReset)}
    return "".join(d.delta for d in of(evs, events.TextDelta) if d.message_id not in reset)


async def test_tokens_reach_a_subscriber_while_the_model_streams(settings: Settings) -> None:
    g = ids.new_id("g")
    async with running_worker(settings, agent=AGENT) as (b, _):
        _, run_id = await start(b, _input(do="answer", gate=g))
        first = await wait_event(b, run_id, "text_delta")
        # The model is still waiting for the gate: what the subscriber got was streamed.
        assert isinstance(first, events.TextDelta) and first.delta == "Hello"
        assert text_of(await stored(b, run_id)) == "Hello"
        pa_agent.gate(g).set()
        evs = await read_run(b, run_id)
    assert _types(evs) == ["RunStart", "ReasoningDelta", "TextDelta", "TextDelta", "RunEnd"]
    (thought,) = of(evs, events.ReasoningDelta)
    assert thought.delta == "Let me think."
    assert text_of(evs) == "Hello world"
    assert {e.message_id for e in of(evs, events.TextDelta)} == {thought.message_id}
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    # FunctionModel's own estimate of the request and the streamed answer.
    assert end.usage == events.Usage(input_tokens=50, output_tokens=6)


async def test_the_sessions_earlier_runs_are_the_message_history(settings: Settings) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _):
        session_id, first = await start(b, _input(do="lookup"))
        await read_run(b, first)
        second = await b.start_run(session_id, "alice", input=_input(do="history"))
        evs = await read_run(b, second)
    assert text_of(evs) == 'user: {"do": "lookup"}\nmodel: lookup: sunny in Paris\n'


async def _approval_run(b: Broker, d: Path) -> tuple[str, events.ApprovalRequired]:
    _, run_id = await start(b, _input(do="send", dir=str(d)))
    req = await wait_event(b, run_id, "approval_required")
    assert isinstance(req, events.ApprovalRequired)
    return run_id, req


def _check_card(evs: list[events.AnyEvent], req: events.ApprovalRequired) -> None:
    (card,) = of(evs, events.ToolCallStart)  # opened once, never again on the resume
    assert (card.tool_name, card.risk_level) == ("send_report", "high")
    assert req.tool_call_id == card.tool_call_id
    assert req.summary == 'send_report wants to run with {"to":"bob"}'
    assert len(of(evs, events.ToolCallEnd)) == 1


async def test_an_approval_through_rest_runs_the_tool(
    settings: Settings, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _), running_gateway(settings) as gw:
        run_id, req = await _approval_run(b, tmp_path)
        assert not (tmp_path / "sent").exists()
        async with http.post(
            f"{gw.url}/v1/runs/{run_id}/approvals/{req.approval_id}",
            json={"decision": "approve", "comment": "go"},
            headers=gw.headers("bob"),
        ) as r:
            assert r.status == 201, await r.text()
        evs = await read_run(b, run_id)
        recs = await steps.load(b.store, run_id)
    _check_card(evs, req)
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by, dec.comment) == ("approve", "bob", "go")
    (result,) = of(evs, events.ToolResult)
    assert (result.tool_call_id, result.status) == (req.tool_call_id, "ok")
    assert text_of(evs) == "send_report: sent to bob"
    assert (tmp_path / "sent").read_text() == "x"
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    # The approved call ran in a step of its own, stopped before the model's
    # next turn; its result is a durable point after it, the answer the next segment's.
    assert [(r.name, r.done) for r in recs] == [
        ("segment-0", True),
        ("approval", True),
        ("tools-1", True),
        ("runlog:tool_result", True),
        ("segment-2", True),
    ]
    (answer,) = of(evs, events.TextDelta)
    assert recs[2].seq < result.seq == recs[3].seq < answer.seq <= recs[4].seq


async def test_a_rejection_through_websocket_reaches_the_model(
    settings: Settings, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _), running_gateway(settings) as gw:
        run_id, req = await _approval_run(b, tmp_path)
        async with ws_connect(http, gw, "bob") as ws:
            await ws.send(type="decide", ref="d1", approval_id=req.approval_id,
                          decision="reject", comment="not now")  # fmt: skip
            reply = await ws.next_reply()
            assert reply["type"] == "ack" and reply["result"]["created"] is True, reply
        evs = await read_run(b, run_id)
    _check_card(evs, req)
    (result,) = of(evs, events.ToolResult)
    assert (result.tool_call_id, result.status, result.summary) == (
        req.tool_call_id, "denied", "denied by bob",
    )  # fmt: skip
    # Pydantic AI gave the model the denial (ToolDenied), and the tool never ran.
    assert text_of(evs) == "send_report: The call was denied by bob: not now."
    assert not (tmp_path / "sent").exists()
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_an_expired_approval_skips_the_call(settings: Settings, tmp_path: Path) -> None:
    async with running_worker(settings, agent=AGENT, approval_timeout_s=0.5) as (b, _):
        run_id, req = await _approval_run(b, tmp_path)
        evs = await read_run(b, run_id)
    _check_card(evs, req)
    (dec,) = of(evs, events.ApprovalDecided)
    assert dec.decision == "expired"
    (result,) = of(evs, events.ToolResult)
    assert (result.status, result.summary) == ("skipped", "approval expired")
    assert text_of(evs) == "send_report: No decision was made in time; the call did not run."
    assert not (tmp_path / "sent").exists()
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_while_waiting_for_approval_resumes_on_another_worker(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        run_id, req = await _approval_run(client, tmp_path)
    finally:
        await doomed.kill()
    # Decided while no worker owns the run: stored, and sent to nobody.
    await client.decide(req.approval_id, "approve", "bob", "ok")
    async with running_worker(settings, purge=False, agent=AGENT) as (_, w):
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    _check_card(evs, req)
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.approval_id, dec.decision, dec.decided_by) == (req.approval_id, "approve", "bob")
    (result,) = of(evs, events.ToolResult)
    assert (result.tool_call_id, result.status) == (req.tool_call_id, "ok")
    assert text_of(evs) == "send_report: sent to bob"
    assert (tmp_path / "sent").read_text() == "x"  # the approved side effect, once
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_mid_stream_issues_the_model_call_again_and_retracts_its_text(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _input(do="await_file", dir=str(tmp_path)))
        partial = await wait_event(client, run_id, "text_delta")
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, purge=False, agent=AGENT) as (_, w):
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert _types(evs) == [
        "RunStart", "TextDelta", "MessageReset", "Status", "TextDelta", "TextDelta", "RunEnd",
    ]  # fmt: skip
    assert isinstance(partial, events.TextDelta)
    (reset,) = of(evs, events.MessageReset)
    assert reset.message_id == partial.message_id  # the dead owner's partial answer
    again = of(evs, events.TextDelta)[1:]
    assert "".join(e.delta for e in again) == "Hello world"
    assert partial.message_id not in {e.message_id for e in again}
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def _approve(b: Broker, run_id: str) -> events.ApprovalRequired:
    req = await wait_event(b, run_id, "approval_required")
    assert isinstance(req, events.ApprovalRequired)
    await b.decide(req.approval_id, "approve", "bob", "")
    return req


# Where a kill -9 lands, by the `hold` of pa_agent's "send" (its model waits
# there for good in the doomed worker), and the answer the run must end with.
_KILL_POINTS = {
    "before_tool": "Sending. send_report: sent to bob",  # mid-stream, before the call
    "after_tool": "send_report: sent to bob",  # the tool ran, its tool_result is logged
    "answer": "send_report: sent to bob",  # during the answer after the tool ran
}


@pytest.mark.parametrize("hold", list(_KILL_POINTS))
async def test_kill_9_around_the_approved_tool_resumes_and_runs_it_once(
    settings: Settings, client: Broker, tmp_path: Path, hold: str
) -> None:
    """The other kill point, waiting for the approval, is
    test_kill_9_while_waiting_for_approval_resumes_on_another_worker."""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _input(do="send", dir=str(tmp_path), hold=hold))
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
    assert (tmp_path / "sent").read_text() == "x"  # the approved side effect, once
    _check_card(evs, req)
    assert len(of(evs, events.ApprovalRequired)) == 1
    assert [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)] == [
        (req.tool_call_id, "ok")
    ]  # never retracted
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    answer = _KILL_POINTS[hold]
    assert _kept_text(evs) == answer
    resets = of(evs, events.MessageReset)
    after = [d for d in of(evs, events.TextDelta) if not resets or d.seq > resets[-1].seq]
    assert "".join(d.delta for d in after) == answer


async def test_kill_9_while_the_approved_tool_runs_fails_the_run_rather_than_run_it_twice(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _input(do="send", dir=str(tmp_path), hold="in_tool"))
        await _approve(client, run_id)
        await wait_until(_async((tmp_path / "started").exists))
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, purge=False, agent=AGENT):
        evs = await read_run(client, run_id)
    err, end = evs[-2:]
    assert isinstance(err, events.RunError)
    assert (err.code, err.retryable, err.message) == (
        "step_interrupted", False, "step 'tools-1' was running"
    )  # fmt: skip
    assert isinstance(end, events.RunEnd) and end.status == "failed"
    assert (tmp_path / "started").read_text() == "x"
    assert not (tmp_path / "sent").exists()


async def test_kill_9_after_a_tool_without_approval_ran_in_the_segment_fails_worker_lost(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The limit: `lookup` (no approval) ran inside the segment the dead
    worker did not finish; running the segment again would run it again."""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _input(do="lookup", dir=str(tmp_path), hold="answer"))
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


@pytest.mark.parametrize(
    ("attr", "do", "code", "retryable", "usage"),
    [
        # UnexpectedModelBehavior: two requests (the answer, then its retry), no text.
        (
            "agent",
            "think_only",
            "model_malformed",
            True,
            events.Usage(input_tokens=100, output_tokens=2),
        ),
        # UsageLimitExceeded: the second request would pass request_limit=1.
        ("limited", "lookup", "usage_limit", False, events.Usage(input_tokens=50, output_tokens=6)),
    ],
)
async def test_a_framework_exception_becomes_a_coded_run_error(
    settings: Settings, attr: str, do: str, code: str, retryable: bool, usage: events.Usage
) -> None:
    async with running_worker(settings, agent=f"tests.agents.pa_agent:{attr}") as (b, _):
        _, run_id = await start(b, _input(do=do))
        evs = await read_run(b, run_id)
    err, end = evs[-2], evs[-1]
    assert isinstance(err, events.RunError) and (err.code, err.retryable) == (code, retryable)
    assert isinstance(end, events.RunEnd) and end.status == "failed"
    assert end.usage == usage  # the requests made before the failure are counted


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (ModelHTTPError(429, "m"), "model_rate_limited", True),
        (ModelHTTPError(503, "m"), "model_unavailable", True),
        (ModelHTTPError(401, "m"), "model_auth", False),
        (ModelHTTPError(422, "m"), "model_bad_request", False),
        (ModelRateLimitError("m", "slow down"), "model_rate_limited", True),
        (UnexpectedModelBehavior("bad", body="secret body"), "model_malformed", True),
        (UsageLimitExceeded("too much"), "usage_limit", False),
        (RunTimedOut("late"), "run_timeout", False),
        (UserError("no DeferredToolRequests"), "agent_misconfigured", False),
    ],
)
def test_pydantic_ai_errors_map_to_codes(exc: BaseException, code: str, retryable: bool) -> None:
    e = coded(exc)
    assert (e.code, e.retryable) == (code, retryable)
    assert e.message == type(exc).__name__  # never the provider's text
