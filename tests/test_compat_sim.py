"""Sim agent-events-v1 (seed S1), the pure projection (gateway/compat/sim.py): no servers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from unittest.mock import ANY

import aiohttp
import pytest
import pytest_asyncio

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from broker.store import StreamPolicy
from gateway.compat import sim
from gateway.compat.base import Context

from .compat_logs import RUN, SESSION, answer, frames, numbered, resume_cases, scripted_log
from .gw import RunningGateway, eventually, running_gateway
from .seedclients import SimClient, SimState, decide, expected, interrupt, native_events, recorded
from .workerkit import running_worker, stored, wait_event


def _proj(
    negotiated: bool = True, thinking: bool = False, tools: bool = False
) -> sim.SimProjection:
    opts = {"negotiated": negotiated, "include_thinking": thinking, "include_tool_calls": tools}
    return sim.SimProjection(Context(RUN, SESSION, options=dict(opts)))


FINAL = {"event": "final", "data": {"success": True, "runId": RUN, "status": "completed",
                                    "output": {"content": "Done: sent."}}}  # fmt: skip


def _tool(phase: str, cid: str, name: str, **status: str) -> dict[str, Any]:
    return {"blockId": RUN, "event": "tool", "phase": phase, "id": cid, "name": name, **status}


def test_negotiated_with_both_policies_exact_frames() -> None:
    assert frames(answer(_proj(thinking=True, tools=True), scripted_log())) == [
        ({"blockId": "m1", "event": "thinking", "data": "Check "}, 2),
        ({"blockId": "m1", "event": "thinking", "data": "docs."}, 3),
        ({"blockId": "m1", "chunk": "Let me "}, 4),
        ({"blockId": "m1", "chunk": "look."}, 5),
        ({"blockId": "m1", "event": "chunk_reset"}, 6),
        (_tool("start", "c1", "search_docs"), 7),
        (_tool("end", "c1", "search_docs", status="success"), 12),
        ({"blockId": "m2", "chunk": "I found "}, 14),
        ({"blockId": "m2", "chunk": "three."}, 15),
        (_tool("start", "c2", "send_message"), 16),
        (_tool("end", "c2", "send_message", status="cancelled"), 21),
        ({"blockId": "m3", "chunk": "Done: "}, 22),
        ({"blockId": "m3", "chunk": "sent."}, 23),
        (FINAL, 24),
    ]


def test_negotiated_without_policies_streams_text_only() -> None:
    got = frames(answer(_proj(), scripted_log()))
    assert got == [
        ({"blockId": "m1", "chunk": "Let me "}, 4),
        ({"blockId": "m1", "chunk": "look."}, 5),
        ({"blockId": "m1", "event": "chunk_reset"}, 6),
        ({"blockId": "m2", "chunk": "I found "}, 14),
        ({"blockId": "m2", "chunk": "three."}, 15),
        ({"blockId": "m3", "chunk": "Done: "}, 22),
        ({"blockId": "m3", "chunk": "sent."}, 23),
        (FINAL, 24),
    ]


@pytest.mark.parametrize(("thinking", "tools"), [(True, False), (False, True)])
def test_each_policy_gates_its_own_frames(thinking: bool, tools: bool) -> None:
    got = [f for f, _ in frames(answer(_proj(thinking=thinking, tools=tools), scripted_log()))]
    kinds = {f.get("event", "chunk") for f in got}
    assert kinds == {"chunk", "chunk_reset", "final", "thinking" if thinking else "tool"}


def test_legacy_gets_only_settled_final_turn_text_whatever_the_options() -> None:
    """Without negotiation: no live text, no reset, no thinking, no tools;
    the final turn's text (m3: after the last tool activity) at the end, its
    chunks carrying no seq (they belong to run_end, whose final carries it)."""
    got = frames(answer(_proj(negotiated=False, thinking=True, tools=True), scripted_log()))
    assert got == [({"blockId": "m3", "chunk": "Done: sent."}, None), (FINAL, 24)]


def _short(*middle: events.Event, end: events.Event) -> list[events.Event]:
    return numbered([events.RunStart(), *middle, end])


def test_legacy_text_of_an_aborted_run_is_kept_and_a_reset_message_dropped() -> None:
    evs = _short(
        events.TextDelta(message_id="a", delta="gone"),
        events.MessageReset(message_id="a"),
        events.TextDelta(message_id="b", delta="kept "),
        events.TextDelta(message_id="c", delta="too"),
        end=events.RunEnd(status="aborted"),
    )
    final = {"event": "final", "data": {"success": False, "runId": RUN, "status": "aborted",
                                        "output": {"content": "kept too"}}}  # fmt: skip
    assert frames(answer(_proj(negotiated=False), evs)) == [
        ({"blockId": "b", "chunk": "kept "}, None),
        ({"blockId": "c", "chunk": "too"}, None),
        (final, 6),
    ]


def test_an_error_ends_the_answer_with_no_text_and_no_final() -> None:
    evs = _short(
        events.TextDelta(message_id="a", delta="Let me"),
        events.RunError(code="model_unavailable", message="the model failed", retryable=True),
        end=events.RunEnd(status="failed"),
    )
    err = {"event": "error", "error": "the model failed", "code": "model_unavailable"}
    p = _proj(negotiated=False)
    assert (frames(answer(p, evs)), p.done) == ([(err, 3)], True)
    assert frames(answer(_proj(), evs)) == [({"blockId": "a", "chunk": "Let me"}, 2), (err, 3)]


def test_an_answer_after_the_error_ends_with_the_error_again_never_final() -> None:
    """A client cut between `error` and `[DONE]` (or asking for the terminal
    answer of a failed run) resumes after the error: it gets the error again,
    at run_end's seq."""
    evs = _short(
        events.RunError(code="model_unavailable", message="the model failed"),
        end=events.RunEnd(status="failed"),
    )
    err = {"event": "error", "error": "the model failed", "code": "model_unavailable"}
    for negotiated in (True, False):
        p = _proj(negotiated=negotiated)
        assert (frames(answer(p, evs, after=2)), p.done) == ([(err, 3)], True)


def test_an_unknown_tool_status_and_a_nameless_tool_are_never_sent() -> None:
    evs = _short(
        events.ToolCallStart(tool_call_id="c", tool_name="t"),
        events.ToolResult(tool_call_id="c", status="timeout"),  # type: ignore[arg-type]
        events.ToolResult(tool_call_id="never-started", status="ok"),
        end=events.RunEnd(status="completed"),
    )
    got = [f for f, _ in frames(answer(_proj(tools=True), evs))]
    assert got[:-1] == [_tool("start", "c", "t")]


@pytest.mark.parametrize(
    ("negotiated", "thinking", "tools"),
    [(True, True, True), (True, False, False), (False, False, False)],
)
def test_resume_from_every_cursor(negotiated: bool, thinking: bool, tools: bool) -> None:
    """Nothing lost, nothing doubled: an answer from cursor c is exactly what
    the full answer sent after its last item with a seq <= c."""
    cases = resume_cases(lambda: _proj(negotiated, thinking, tools), scripted_log())
    for c, want, resumed in cases:
        assert resumed == want, f"cursor {c}"
    assert len(cases) == len(scripted_log()) + 1


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("agent-events-v1", True),
        ("Agent-Events-V1", True),
        (" other , agent-events-v1 ", True),
        ("agent-events-v2", False),
        ("", False),
        (None, False),
    ],
)
def test_negotiation_header(value: str | None, ok: bool) -> None:
    assert sim.negotiated(value) is ok


def _policy(thinking: bool, tool_calls: bool) -> StreamPolicy:
    return StreamPolicy(include_thinking=thinking, include_tool_calls=tool_calls)


def test_asking_for_frames_without_negotiating_is_refused_never_downgraded() -> None:
    on = _policy(True, True)
    for thinking, tools in [(True, None), (None, True), (True, False)]:
        with pytest.raises(sim.ProtocolNotNegotiated) as info:
            sim.exposure(False, thinking, tools, on)
        assert (info.value.code, info.value.http_status) == ("stream_protocol_required", 400)
    # Not asking is no error: such a client gets settled text, whatever the policy.
    assert sim.exposure(False, None, False, on) == {
        "negotiated": False, "include_thinking": False, "include_tool_calls": False}  # fmt: skip


def test_the_policy_decides_and_a_request_may_only_narrow_it() -> None:
    def exp(policy: StreamPolicy, thinking: bool | None, tools: bool | None) -> tuple[object, ...]:
        o = sim.exposure(True, thinking, tools, policy)
        return o["include_thinking"], o["include_tool_calls"]

    assert exp(_policy(True, True), None, None) == (True, True)
    assert exp(_policy(True, True), False, None) == (False, True)
    assert exp(_policy(False, True), None, True) == (False, True)
    assert exp(_policy(False, False), None, None) == (False, False)
    with pytest.raises(sim.FramesNotAllowed) as info:
        exp(_policy(False, True), True, None)
    assert (info.value.code, info.value.http_status) == ("frames_not_allowed", 403)


# -- the per-session policies over the native REST


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings, sse_heartbeat_s=0.5) as g:
        yield g


async def test_policies_set_at_creation_and_changed_by_owners_only_audited(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with http.post(gw.url + "/v1/sessions", json={"include_thinking": True},
                         headers=gw.headers("alice")) as r:  # fmt: skip
        assert r.status == 201
        created = await r.json()
    sid = created["session_id"]
    assert (created["include_thinking"], created["include_tool_calls"]) == (True, False)
    async with http.post(f"{gw.url}/v1/sessions/{sid}/members",
                         json={"user_id": "bob", "role": "approver"},
                         headers=gw.headers("alice")) as r:  # fmt: skip
        assert r.status == 201
    url = f"{gw.url}/v1/sessions/{sid}"
    cases: list[tuple[str, object, int, str | None]] = [
        ("bob", {"include_tool_calls": True}, 403, "forbidden"),
        ("mallory", {"include_tool_calls": True}, 403, "not_a_member"),
        ("alice", {}, 400, "invalid_request"),
        ("alice", {"include_tool_calls": "yes"}, 400, "invalid_request"),
        ("alice", {"titel": "x"}, 400, "invalid_request"),
        ("alice", {"include_tool_calls": True}, 200, None),
    ]
    for user, body, status, code in cases:
        async with http.patch(url, json=body, headers=gw.headers(user)) as r:
            assert r.status == status, (user, body, await r.text())
            got = await r.json()
            if code is not None:
                assert got["error"]["code"] == code
    assert got == {"session_id": sid, "title": "", "run_policy": "enqueue",
                   "include_thinking": True, "include_tool_calls": True, "archived_at": None,
                   "previous": {"title": "", "run_policy": "enqueue", "include_thinking": True,
                                "include_tool_calls": False, "archived_at": None}}  # fmt: skip
    async with http.get(url, headers=gw.headers("bob")) as r:
        info = await r.json()
    assert (info["include_thinking"], info["include_tool_calls"]) == (True, True)
    assert await broker.store.stream_policy(sid) == _policy(True, True)
    rows = await broker.store.pool.fetch(
        "SELECT actor, detail FROM audit WHERE session_id = $1 AND action = 'set_stream_policy'",
        sid,
    )
    assert [(r["actor"], json.loads(r["detail"])) for r in rows] == [
        ("alice", {"include_thinking": True, "include_tool_calls": True,
                   "previous": {"include_thinking": True, "include_tool_calls": False}})
    ]  # fmt: skip
    # Defaults: off.
    async with http.post(gw.url + "/v1/sessions", json={}, headers=gw.headers("alice")) as r:
        plain = await r.json()
    assert await broker.store.stream_policy(plain["session_id"]) == _policy(False, False)


# -- served, against real gateways and a real worker, with the seed's client rules

# Workers run with discard_text_before_tools, so that the log has message_reset.


@pytest_asyncio.fixture(loop_scope="session")
async def gw2(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings, sse_heartbeat_s=0.5) as g:
        yield g


async def _session(http: aiohttp.ClientSession, gw: RunningGateway, *, thinking: bool,
                   tools: bool) -> str:  # fmt: skip
    """alice's session with bob as approver and vic as viewer."""
    body = {"include_thinking": thinking, "include_tool_calls": tools}
    async with http.post(gw.url + "/v1/sessions", json=body, headers=gw.headers("alice")) as r:
        assert r.status == 201
        sid: str = (await r.json())["session_id"]
    for user, role in (("bob", "approver"), ("vic", "viewer")):
        async with http.post(f"{gw.url}/v1/sessions/{sid}/members",
                             json={"user_id": user, "role": role},
                             headers=gw.headers("alice")) as r:  # fmt: skip
            assert r.status == 201
    return sid


def _projected(broker_events: list[events.AnyEvent], rid: str, sid: str,
               **opts: bool) -> list[tuple[str, int | None]]:  # fmt: skip
    """The frames the pure projection makes of the stored log, then [DONE]."""
    proj = sim.SimProjection(Context(rid, sid, options=dict(opts)))
    return expected(answer(proj, broker_events), b"data: [DONE]\n\n")


def _final_turn_text(evs: list[events.AnyEvent]) -> str:
    last_tool = max(i for i, e in enumerate(evs) if isinstance(e, events.ToolResult))
    return "".join(e.delta for e in evs[last_tool:] if isinstance(e, events.TextDelta))


def _kept_text(evs: list[events.AnyEvent]) -> str:
    reset = {e.message_id for e in evs if isinstance(e, events.MessageReset)}
    return "".join(e.delta for e in evs if isinstance(e, events.TextDelta)
                   and e.message_id not in reset)  # fmt: skip


async def test_sim_full_run_with_an_approval_decided_over_rest(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    """Negotiated, both policies on: alice chats on one gateway, bob follows on
    another; the approval (no S1 frame) is found and decided through runlog's
    REST, and the stream goes on. Both see exactly the projection of the
    stored log, and the seed's guards accept every frame."""
    sid = await _session(http, gw, thinking=True, tools=True)
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        alice = SimClient(http, gw.token("alice"))
        chat = asyncio.create_task(alice.chat(gw.url, sid, {"input": "tell me about runlog"}))
        await eventually(lambda: alice.run_id is not None, 30, "the chat answer's headers")
        rid = alice.run_id
        assert rid is not None
        bob = SimClient(http, gw2.token("bob"))
        follow = asyncio.create_task(bob.stream(gw2.url, rid))
        ap = await wait_event(broker, rid, "approval_required")
        assert isinstance(ap, events.ApprovalRequired)
        approval = ap.approval_id
        # S1 names no approval: the native REST does (bob reads it there).
        page = await native_events(http, gw2.url, gw2.token("bob"), rid)
        assert [e["approval_id"] for e in page if e["type"] == "approval_required"] == [approval]
        # The streams stay open while the run waits, kept alive by heartbeat comments.
        await eventually(lambda: ": hb" in alice.comments and ": hb" in bob.comments, 30, "hb")
        assert not chat.done() and not follow.done()
        assert await decide(http, gw2.url, gw2.token("bob"), rid, approval, "approve") == (
            201, {"approval": ANY, "created": True})  # fmt: skip
        status, body = await decide(http, gw.url, gw.token("alice"), rid, approval, "reject")
        assert (status, body["error"]["code"]) == (409, "approval_conflict")
        assert await chat == (200, None) and await follow == (200, None)
        log = await stored(broker, rid)
    want = _projected(log, rid, sid, negotiated=True, include_thinking=True,
                      include_tool_calls=True)  # fmt: skip
    assert recorded(alice.frames) == want and recorded(bob.frames) == want
    s = alice.state
    assert (s.unknown, s.done, s.error, s.resets) == ([], True, None, 2)
    assert s.text == _kept_text(log) == _final_turn_text(log)
    assert s.thinking == "".join(e.delta for e in log if isinstance(e, events.ReasoningDelta))
    assert s.tools == {
        (rid, "call_1_0"): {"name": "search_docs", "phase": "end", "status": "success"},
        (rid, "call_2_0"): {"name": "send_message", "phase": "end", "status": "success"},
    }
    assert s.final == {"success": True, "runId": rid, "status": "completed",
                       "output": {"content": _final_turn_text(log)}}  # fmt: skip
    assert bob.state == alice.state


async def test_sim_cut_and_resumed_on_either_gateway_nothing_lost_or_doubled(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    sid = await _session(http, gw, thinking=True, tools=True)
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        c = SimClient(http, gw.token("alice"))
        await c.chat(gw.url, sid, {"input": "tell me about runlog, no approval"}, cut_after=5)
        assert c.run_id is not None and 0 < c.cursor and not c.state.done
        cuts = 1
        while not c.state.done:
            base = (gw2 if cuts % 2 else gw).url
            assert await c.stream(base, c.run_id, cut_after=4) == (200, None)
            cuts += 1
        log = await stored(broker, c.run_id)
    full = _projected(log, c.run_id, sid, negotiated=True, include_thinking=True,
                      include_tool_calls=True)  # fmt: skip
    # What the client kept is the full answer, once (the frames it dropped
    # after its last id, when cut, came again on the resume).
    whole = SimState()
    for data, _ in full[:-1]:
        whole.apply(json.loads(data))
    whole.done = True
    assert c.state == whole and cuts > 10
    assert c.state.text == _final_turn_text(log) and c.state.resets == 1


async def test_sim_legacy_client_gets_settled_final_turn_text_only(
    gw: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    """Without the header (and not asking for frames): no live text, no reset,
    no thinking or tool frame even though the session allows them; the final
    turn's text, settled, then final and [DONE]."""
    sid = await _session(http, gw, thinking=True, tools=True)
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        c = SimClient(http, gw.token("alice"), negotiate=False)
        assert await c.chat(gw.url, sid, {"input": "tell me about runlog, no approval"}) == (
            200, None)  # fmt: skip
        assert c.run_id is not None
        log = await stored(broker, c.run_id)
    assert recorded(c.frames) == _projected(log, c.run_id, sid, negotiated=False)
    assert (c.state.kinds, c.state.unknown) == (["chunk", "final"], [])
    assert c.state.text == _final_turn_text(log) != ""
    assert c.frames[0].id is None and c.frames[1].id == len(log)


async def test_sim_an_ended_run_replayed_and_its_terminal_answer(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    sid = await _session(http, gw, thinking=False, tools=False)
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        c = SimClient(http, gw.token("alice"))
        await c.chat(gw.url, sid, {"input": "tell me about runlog, no approval"})
        assert c.run_id is not None
        log = await stored(broker, c.run_id)
    replay = SimClient(http, gw2.token("vic"))  # a viewer, on the other gateway
    assert await replay.stream(gw2.url, c.run_id) == (200, None)
    assert recorded(replay.frames) == recorded(c.frames) == _projected(
        log, c.run_id, sid, negotiated=True)  # fmt: skip
    assert {"thinking", "tool"}.isdisjoint(replay.state.kinds)  # the policy is off
    # From its end: the terminal answer again (final, [DONE]), never a 204.
    end = SimClient(http, gw2.token("vic"))
    end.cursor = len(log)
    assert await end.stream(gw2.url, c.run_id) == (200, None)
    assert (end.state.kinds, end.state.final) == (["final"], c.state.final)


async def test_sim_stop_through_runlog_interrupt(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, settings: Settings
) -> None:
    """A negotiated and a legacy client watch a run that stalls; alice stops
    it with runlog's interrupt: final{aborted} and [DONE] on both, the legacy
    one getting the text produced so far, settled, before it."""
    sid = await _session(http, gw, thinking=False, tools=False)
    async with running_worker(settings, discard_text_before_tools=True) as (broker, _):
        live = SimClient(http, gw.token("alice"))
        chat = asyncio.create_task(live.chat(gw.url, sid, {"input": "stall"}))
        await eventually(lambda: live.state.text != "", 30, "the first chunks")
        assert live.run_id is not None
        legacy = SimClient(http, gw2.token("vic"), negotiate=False)
        watch = asyncio.create_task(legacy.stream(gw2.url, live.run_id))
        assert await interrupt(http, gw2.url, gw2.token("bob"), live.run_id) == 202
        assert await chat == (200, None) and await watch == (200, None)
        log = await stored(broker, live.run_id)
    text = "".join(e.delta for e in log if isinstance(e, events.TextDelta))
    final = {"success": False, "runId": live.run_id, "status": "aborted",
             "output": {"content": text}}  # fmt: skip
    assert (live.state.text, live.state.final, live.state.done) == (text, final, True)
    assert (legacy.state.kinds, legacy.state.text, legacy.state.final) == (
        ["chunk", "final"], text, final)  # fmt: skip


async def test_sim_policy_gates_and_unnegotiated_requests_for_frames_refused(
    gw: RunningGateway, http: aiohttp.ClientSession, settings: Settings, broker: Broker
) -> None:
    sid = await _session(http, gw, thinking=False, tools=False)
    plain = SimClient(http, gw.token("alice"), negotiate=False)
    # Asking for frames without negotiating: 400, and no run is started.
    for body in ({"input": "x", "includeThinking": True}, {"input": "x", "includeToolCalls": True}):
        status, err = await plain.chat(gw.url, sid, body)
        assert (status, err["error"]["code"]) == (400, "stream_protocol_required")
    assert (await broker.store.session_info(sid)).runs == []
    neg = SimClient(http, gw.token("alice"))
    status, err = await neg.chat(gw.url, sid, {"input": "x", "includeThinking": True})
    assert (status, err["error"]["code"]) == (403, "frames_not_allowed")
    assert (await broker.store.session_info(sid)).runs == []
    async with running_worker(settings, discard_text_before_tools=True):
        assert await neg.chat(gw.url, sid, {"input": "tell me about runlog, no approval"}) == (
            200, None)  # fmt: skip
    rid = neg.run_id
    assert rid is not None
    assert {"thinking", "tool"}.isdisjoint(neg.state.kinds)  # both policies off
    # The owner turns thinking on: a new answer has thinking frames, no tool frames.
    async with http.patch(f"{gw.url}/v1/sessions/{sid}", json={"include_thinking": True},
                          headers=gw.headers("alice")) as r:  # fmt: skip
        assert r.status == 200
    again = SimClient(http, gw.token("vic"))
    assert await again.stream(gw.url, rid) == (200, None)
    assert "thinking" in again.state.kinds and "tool" not in again.state.kinds
    narrowed = SimClient(http, gw.token("vic"))
    assert await narrowed.stream(gw.url, rid, params={"includeThinking": "false"}) == (200, None)
    assert "thinking" not in narrowed.state.kinds
    # The stream refuses what the policy forbids, and un-negotiated asks.
    status, err = await again.stream(gw.url, rid, params={"includeToolCalls": "true"})
    assert (status, err["error"]["code"]) == (403, "frames_not_allowed")
    status, err = await plain.stream(gw.url, rid, params={"includeThinking": "true"})
    assert (status, err["error"]["code"]) == (400, "stream_protocol_required")
    status, err = await plain.stream(gw.url, rid, params={"includeThinking": "yes"})
    assert (status, err["error"]["code"]) == (400, "invalid_request")
    # A viewer may follow but not chat; a stranger may do neither.
    status, err = await SimClient(http, gw.token("vic")).chat(gw.url, sid, {"input": "x"})
    assert (status, err["error"]["code"]) == (403, "forbidden")
    status, err = await SimClient(http, gw.token("mallory")).stream(gw.url, rid)
    assert (status, err["error"]["code"]) == (403, "not_a_member")
