"""AG-UI with the real client: `@ag-ui/client` HttpAgent (tests/clients/agui.mjs,
run with node) against real gateways and a real worker running the scripted
agent. What the client assembles (text, reasoning, tool calls and their
arguments, tool results) must equal the stored log, across an approval
answered through `resume[]`, cuts mid-text and mid tool arguments, a replay
of an ended run, a stop, and a second user on another gateway; the client
must log no warning (no `[ag-ui][enforce]` stripping, nothing unknown)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from broker import events
from broker.runtime import Broker
from broker.settings import Settings

from .gw import RunningGateway, eventually, running_gateway, session_with
from .workerkit import running_worker, stored, wait_event

CLIENT = Path(__file__).parent / "clients" / "agui.mjs"
APPROVE = {"status": "resolved", "payload": {"decision": "approve", "comment": "ok"}}


async def agui(plan: dict[str, Any], timeout_s: float = 120) -> dict[str, Any]:
    """Run one HttpAgent through `plan` (see agui.mjs); its report."""
    proc = await asyncio.create_subprocess_exec(
        "node", str(CLIENT), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=CLIENT.parent,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(json.dumps(plan).encode()), timeout_s)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    report: dict[str, Any] = json.loads(out)
    # The client logs no validation warning and no error.
    assert report["warnings"] == [] and report["errors"] == [], report
    return report


def _plan(g: RunningGateway, user: str, sid: str, *steps: dict[str, Any],
          **extra: Any) -> dict[str, Any]:  # fmt: skip
    return {"base": g.url, "url": f"{g.url}/v1/compat/agui/sessions/{sid}",
            "token": g.token(user), "threadId": sid, "steps": list(steps), **extra}  # fmt: skip


def from_log(evs: list[events.AnyEvent]) -> dict[str, dict[str, Any]]:
    """What a client should assemble, straight from the stored log."""
    out: dict[str, dict[str, Any]] = {"text": {}, "reasoning": {}, "calls": {}, "results": {}}
    for e in evs:
        match e:
            case events.TextDelta():
                out["text"][e.message_id] = out["text"].get(e.message_id, "") + e.delta
            case events.ReasoningDelta():
                out["reasoning"][e.message_id] = out["reasoning"].get(e.message_id, "") + e.delta
            case events.ToolCallStart():
                out["calls"][e.tool_call_id] = [e.tool_name, ""]
            case events.ToolArgsDelta():
                out["calls"][e.tool_call_id][1] += e.partial_json
            case events.ToolResult():
                out["results"][e.tool_call_id] = e.summary
    return out


def from_client(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What the client assembled (agent.messages), checked free of duplicates."""
    ids = [m["id"] for m in messages]
    assert len(ids) == len(set(ids)), ids
    out: dict[str, dict[str, Any]] = {"text": {}, "reasoning": {}, "calls": {}, "results": {}}
    for m in messages:
        if m["role"] == "assistant":
            if m.get("content"):
                out["text"][m["id"]] = m["content"]
            for tc in m.get("toolCalls", []):
                assert tc["id"] not in out["calls"], tc
                out["calls"][tc["id"]] = [tc["function"]["name"], tc["function"]["arguments"]]
        elif m["role"] == "reasoning":
            out["reasoning"][m["id"].removesuffix(":reasoning")] = m["content"]
        elif m["role"] == "tool":
            out["results"][m["toolCallId"]] = m["content"]
    return out


@asynccontextmanager
async def _world(settings: Settings, **worker: Any) -> AsyncIterator[RunningGateway]:
    async with running_worker(settings, **worker), running_gateway(settings) as g:
        yield g


async def test_a_scripted_run_with_an_approval_answered_through_resume(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _world(settings) as g:
        sid = await session_with(http, g, "alice")
        report = await agui(_plan(g, "alice", sid, {"message": "Tell me about runlog"},
                                  {"resume": APPROVE}))  # fmt: skip
        first, second = report["steps"]
        run_id = first["runlogRunId"]
        evs = await stored(broker, run_id)
        (asked,) = [e for e in evs if isinstance(e, events.ApprovalRequired)]
        assert first["outcome"] == "interrupt" and first["failed"] is None
        (interrupt,) = first["interrupts"]
        assert (interrupt["id"], interrupt["reason"], interrupt["toolCallId"]) == (
            asked.approval_id, "tool_approval", asked.tool_call_id)  # fmt: skip
        assert interrupt["metadata"]["runlog"]["tool_name"] == "send_message"
        assert first["cursor"] == asked.seq  # the interrupt completes the approval's event
        assert (second["outcome"], second["failed"], report["pending"]) == ("success", None, [])
        assert second["runlogRunId"] == run_id and second["types"][0] == "RUN_STARTED"
        assert isinstance(evs[-1], events.RunEnd) and second["cursor"] == evs[-1].seq
        # Decided once, through the gateway's decision path, attributed to alice.
        info = await broker.store.approval(asked.approval_id)
        assert (info.decision, info.decided_by, info.comment) == ("approve", "alice", "ok")
        # Text, reasoning, tool calls with their streamed arguments, results:
        # exactly the log's.
        got, want = from_client(report["messages"]), from_log(evs)
        assert want["reasoning"] and want["text"] and len(want["calls"]) == 2
        assert got == want
        assert report["unhandled"] == []


async def test_cuts_mid_text_and_mid_tool_args_resume_with_nothing_lost_or_doubled(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _world(settings) as g:
        sid = await session_with(http, g, "alice")
        report = await agui(_plan(
            g, "alice", sid,
            # Two tool calls with interleaved arguments ("note"), no approval.
            {"message": "Tell me about runlog, note it, no approval",
             "cut": {"type": "TEXT_MESSAGE_CONTENT", "count": 3, "settle": True}},
            {"attach": True, "after": "cursor",
             "cut": {"type": "TOOL_CALL_ARGS", "count": 3, "settle": True}},
            # At once: what the client had not applied yet is dropped (and resent).
            {"attach": True, "lastEventId": "cursor", "cut": {"type": "TEXT_MESSAGE_CONTENT",
                                                              "count": 4}},
            {"attach": True, "after": "cursor"},
        ))  # fmt: skip
        steps = report["steps"]
        for cut in steps[:3]:
            assert cut["failed"] == "terminated" and cut["outcome"] is None, cut
        assert steps[3]["outcome"] == "success" and steps[3]["failed"] is None
        evs = await stored(broker, steps[0]["runlogRunId"])
        cursors = [s["cursor"] for s in steps]
        assert cursors == sorted(cursors) and cursors[-1] == evs[-1].seq, cursors
        # The first cut fell inside the first text message, the second inside
        # the interleaved arguments of two open calls.
        text = [e.seq for e in evs if isinstance(e, events.TextDelta)]
        args = [e.seq for e in evs if isinstance(e, events.ToolArgsDelta)]
        assert (cursors[0], cursors[1]) == (text[2], args[2])
        got, want = from_client(report["messages"]), from_log(evs)
        assert len(want["calls"]) == 2 and got == want


async def test_an_ended_run_is_replayed_whole_and_its_end_again_from_its_end(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _world(settings) as g:
        sid = await session_with(http, g, "alice", bob="viewer")
        first = await agui(_plan(g, "alice", sid, {"message": "echo:hello there"}))
        run_id = first["steps"][0]["runlogRunId"]
        evs = await stored(broker, run_id)
        end = evs[-1].seq
        replay = await agui(_plan(g, "bob", sid, {"attach": True}, {"attach": True, "after": end},
                                  runlogRunId=run_id))  # fmt: skip
        whole, again = replay["steps"]
        assert whole["outcome"] == "success" and whole["cursor"] == end
        assert from_client(replay["messages"]) == from_log(evs) == from_client(first["messages"])
        assert from_log(evs)["text"] == {evs[1].message_id: "hello there"}  # type: ignore[union-attr]
        # The envelope, the message open at the cursor re-opened (same id: no
        # new message) and closed, the end.
        assert (again["types"], again["outcome"], again["cursor"]) == (
            ["RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_END", "RUN_FINISHED"], "success",
            end)  # fmt: skip
        assert from_client(replay["messages"]) == from_log(evs)


async def test_a_stop_ends_the_stream_with_run_finished_cancelled(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _world(settings, scripted_tokens_per_s=100.0) as g:
        sid = await session_with(http, g, "alice")
        client = asyncio.create_task(agui(_plan(g, "alice", sid, {"message": "long"})))
        try:
            await eventually(lambda: g.sample("runlog_gateway_connections", {"kind": "compat"})
                             == 1, what="the client's answer")  # fmt: skip
            (run_id,) = await broker.store.active_runs(sid)
            await wait_event(broker, run_id, "text_delta", count=5)
            async with http.post(f"{g.url}/v1/runs/{run_id}/interrupt", json={"reason": "enough"},
                                 headers=g.headers("alice")) as r:  # fmt: skip
                assert r.status == 202
            report = await asyncio.wait_for(client, 60)
        finally:
            if not client.done():
                client.cancel()
        (step,) = report["steps"]
        assert (step["outcome"], step["failed"]) == ("cancelled", None)
        assert step["types"][-1] == "RUN_FINISHED" and "CUSTOM" in step["types"]
        evs = await stored(broker, run_id)
        end = evs[-1]
        assert isinstance(end, events.RunEnd) and end.status == "aborted"
        assert from_client(report["messages"]) == from_log(evs)


async def test_a_second_user_on_another_gateway_follows_and_answers_the_same_run(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _world(settings) as g, running_gateway(settings) as g2:
        sid = await session_with(http, g, "alice", bob="approver")
        alice = await agui(_plan(g, "alice", sid, {"message": "Tell me about runlog"}))
        run_id = alice["steps"][0]["runlogRunId"]
        # bob, on the other gateway, attaches to the waiting run: the same
        # interrupt; he answers it through the client, and the run goes on.
        bob = await agui(_plan(g2, "bob", sid, {"attach": True}, {"attach": True, "resume": APPROVE},
                               runlogRunId=run_id))  # fmt: skip
        asked, answered = bob["steps"]
        assert asked["outcome"] == "interrupt"
        assert [i["id"] for i in asked["interrupts"]] == [
            i["id"] for i in alice["steps"][0]["interrupts"]]  # fmt: skip
        assert answered["outcome"] == "success"
        aid = asked["interrupts"][0]["id"]
        info = await broker.store.approval(aid)
        assert (info.decision, info.decided_by) == ("approve", "bob")
        # alice answers the same way: a repeat, fine; the other way: 409.
        again = await agui(_plan(g, "alice", sid, {"attach": True, "after": 0},
                                 runlogRunId=run_id))  # fmt: skip
        body = {"threadId": sid, "runId": "x", "messages": [], "tools": [], "context": [],
                "resume": [{"interruptId": aid, "status": "resolved",
                            "payload": {"decision": "reject"}}]}  # fmt: skip
        sse = {**g.headers("alice"), "Accept": "text/event-stream"}
        async with http.post(f"{g.url}/v1/compat/agui/runs/{run_id}", json=body, headers=sse) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (409, "approval_conflict")
        evs = await stored(broker, run_id)
        want = from_log(evs)
        assert from_client(bob["messages"]) == want == from_client(again["messages"])
        assert again["steps"][0]["outcome"] == "success"


async def test_bad_agui_requests_get_coded_errors_and_start_nothing(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as g:
        sid = await session_with(http, g, "alice", bob="viewer")
        base = f"{g.url}/v1/compat/agui"
        sse = {"Accept": "text/event-stream"}
        hello = {"threadId": sid, "runId": "x", "messages": [{"id": "u", "role": "user",
                                                             "content": "hi"}]}  # fmt: skip
        cases: list[tuple[str, str, dict[str, str], Any, int, str]] = [
            ("alice", f"/sessions/{sid}", {}, hello, 400, "invalid_request"),  # no Accept
            ("alice", f"/sessions/{sid}", sse, "{", 400, "invalid_request"),
            ("alice", f"/sessions/{sid}", sse, {"messages": [{"role": "user", "content": 3}]},
             400, "invalid_request"),
            ("alice", f"/sessions/{sid}", sse, {"messages": []}, 400, "invalid_request"),
            ("bob", f"/sessions/{sid}", sse, hello, 403, "forbidden"),  # a viewer starts nothing
            ("mallory", f"/sessions/{sid}", sse, hello, 403, "not_a_member"),
            ("alice", "/runs/r_nope", sse, hello, 403, "not_a_member"),
            ("alice", f"/sessions/{sid}", sse,
             {"resume": [{"interruptId": "ap_" + "x" * 22, "status": "resolved"}]},
             403, "not_a_member"),
            ("alice", f"/sessions/{sid}", sse,
             {"resume": [{"interruptId": "ap_x", "status": "maybe"}]}, 400, "invalid_request"),
        ]  # fmt: skip
        for user, path, headers, body, status, code in cases:
            data = body if isinstance(body, str) else json.dumps(body)
            async with http.post(base + path, data=data,
                                 headers={**g.headers(user), **headers}) as r:  # fmt: skip
                got = (r.status, (await r.json())["error"]["code"])
                assert got == (status, code), (user, path, body, got)
        info = await broker.store.session_info(sid)
        assert info.runs == []  # none of them started a run
        async with http.post(base + f"/sessions/{sid}", json=hello, headers=sse) as r:
            assert r.status == 401
