"""Sim agent-events-v1 (seed S1), the pure projection (gateway/compat/sim.py): no servers."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

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
from .gw import RunningGateway, running_gateway


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
    for c, expected, resumed in cases:
        assert resumed == expected, f"cursor {c}"
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


def test_asking_for_frames_without_negotiating_is_refused_never_downgraded() -> None:
    on = StreamPolicy(True, True)
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

    assert exp(StreamPolicy(True, True), None, None) == (True, True)
    assert exp(StreamPolicy(True, True), False, None) == (False, True)
    assert exp(StreamPolicy(False, True), None, True) == (False, True)
    assert exp(StreamPolicy(False, False), None, None) == (False, False)
    with pytest.raises(sim.FramesNotAllowed) as info:
        exp(StreamPolicy(False, True), True, None)
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
        ("alice", {"title": "x"}, 400, "invalid_request"),
        ("alice", {"include_tool_calls": True}, 200, None),
    ]
    for user, body, status, code in cases:
        async with http.patch(url, json=body, headers=gw.headers(user)) as r:
            assert r.status == status, (user, body, await r.text())
            got = await r.json()
            if code is not None:
                assert got["error"]["code"] == code
    assert got == {"session_id": sid, "include_thinking": True, "include_tool_calls": True,
                   "previous": {"include_thinking": True, "include_tool_calls": False}}  # fmt: skip
    async with http.get(url, headers=gw.headers("bob")) as r:
        info = await r.json()
    assert (info["include_thinking"], info["include_tool_calls"]) == (True, True)
    assert await broker.store.stream_policy(sid) == StreamPolicy(True, True)
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
    assert await broker.store.stream_policy(plain["session_id"]) == StreamPolicy(False, False)
