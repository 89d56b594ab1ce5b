"""The AI SDK UI message stream (gateway/compat/aisdk.py).

Pure projection tests first (no servers; the chunks are also read by the
client's own stream reader in a node subprocess), then the routes with the
real client (`ai`'s AbstractChat + DefaultChatTransport, tests/clients/aisdk.mjs)
against real gateways and a real worker.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from broker import events
from broker.settings import Settings
from gateway.compat.aisdk import AiSdkProjection
from gateway.compat.base import Context

from .gw import RunningGateway, running_gateway, session_with
from .workerkit import of, running_worker, stored, text_of, wait_event

CLIENTS = Path(__file__).parent / "clients"
AI_DIST = CLIENTS / "node_modules" / "ai" / "dist" / "index.js"

Chunk = dict[str, Any]
TOOL = {"dynamic": True, "providerExecuted": True}
START_META = {"runlog": {"run_id": "r1", "session_id": "s1"}}


def node(request: dict[str, Any], timeout_s: float = 60) -> dict[str, Any]:
    proc = subprocess.run(
        ["node", str(CLIENTS / "aisdk.mjs")],
        input=json.dumps(request), capture_output=True, text=True, timeout=timeout_s,
        cwd=CLIENTS, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def scripted_run() -> list[events.Event]:
    """The shape of the scripted agent's default run: reasoning and text, a
    low-risk tool call with split arguments, then a turn with a high-risk
    call that needs approval, then the final answer."""
    evs: list[events.Event] = [
        events.RunStart(input="tell me about x"),
        events.ReasoningDelta(message_id="m1", delta="Check "),
        events.ReasoningDelta(message_id="m1", delta="docs."),
        events.TextDelta(message_id="m1", delta="Let me "),
        events.TextDelta(message_id="m1", delta="look."),
        events.ToolCallStart(tool_call_id="c1", tool_name="search_docs"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"query'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='":"x"}'),
        events.ToolCallEnd(tool_call_id="c1"),
        events.ToolResult(tool_call_id="c1", status="ok", summary="3 pages"),
        events.TextDelta(message_id="m2", delta="Sending."),
        events.ToolCallStart(tool_call_id="c2", tool_name="send_message", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="c2", partial_json='{"to":"t"}'),
        events.ToolCallEnd(tool_call_id="c2"),
        events.ApprovalRequired(approval_id="ap1", tool_call_id="c2", summary="send it?"),
        events.ApprovalDecided(approval_id="ap1", decision="approve", decided_by="u1"),
        events.ToolResult(tool_call_id="c2", status="ok", summary="sent"),
        events.TextDelta(message_id="m3", delta="Done."),
        events.RunEnd(status="completed", usage=events.Usage(input_tokens=3, output_tokens=9)),
    ]
    for i, e in enumerate(evs, 1):
        e.run_id, e.session_id, e.seq = "r1", "s1", i
    return evs


def answer(
    evs: list[events.Event], cursor: int = 0, decided: tuple[str, ...] = ()
) -> tuple[list[tuple[Chunk, int | None]], bool]:
    """(chunk, seq) pairs of one answer from `cursor`, and whether it ended."""
    p = AiSdkProjection(Context("r1", "s1", decided=set(decided)))
    for e in evs[:cursor]:
        p.track(e)
    out = [(json.loads(w.data), w.seq) for w in p.start()]
    for e in evs[cursor:]:
        out += [(json.loads(w.data), w.seq) for w in p.feed(e)]
        if p.done:
            break
    return out, p.done


def chunks(pairs: list[tuple[Chunk, int | None]]) -> list[Chunk]:
    return [c for c, _ in pairs]


def test_a_full_run_chunk_by_chunk() -> None:
    evs = scripted_run()
    got, done = answer(evs, decided=("ap1",))
    tool_meta = {"runlog": {"risk_level": "low"}}
    assert got == [
        ({"type": "start", "messageId": "r1", "messageMetadata": START_META}, None),
        ({"type": "start-step"}, 1),
        ({"type": "reasoning-start", "id": "m1"}, None),
        ({"type": "reasoning-delta", "id": "m1", "delta": "Check "}, 2),
        ({"type": "reasoning-delta", "id": "m1", "delta": "docs."}, 3),
        ({"type": "reasoning-end", "id": "m1"}, None),
        ({"type": "text-start", "id": "m1"}, None),
        ({"type": "text-delta", "id": "m1", "delta": "Let me "}, 4),
        ({"type": "text-delta", "id": "m1", "delta": "look."}, 5),
        ({"type": "text-end", "id": "m1"}, None),
        ({"type": "tool-input-start", "toolCallId": "c1", "toolName": "search_docs",
          "toolMetadata": tool_meta, **TOOL}, 6),
        ({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"query'}, 7),
        ({"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '":"x"}'}, 8),
        ({"type": "tool-input-available", "toolCallId": "c1", "toolName": "search_docs",
          **TOOL, "input": {"query": "x"}}, 9),
        ({"type": "tool-output-available", "toolCallId": "c1",
          "output": {"status": "ok", "summary": "3 pages", "output": None}, **TOOL}, 10),
        ({"type": "finish-step"}, None),
        ({"type": "start-step"}, None),
        ({"type": "text-start", "id": "m2"}, None),
        ({"type": "text-delta", "id": "m2", "delta": "Sending."}, 11),
        ({"type": "text-end", "id": "m2"}, None),
        ({"type": "tool-input-start", "toolCallId": "c2", "toolName": "send_message",
          "toolMetadata": {"runlog": {"risk_level": "high"}}, **TOOL}, 12),
        ({"type": "tool-input-delta", "toolCallId": "c2", "inputTextDelta": '{"to":"t"}'}, 13),
        ({"type": "tool-input-available", "toolCallId": "c2", "toolName": "send_message",
          **TOOL, "input": {"to": "t"}}, 14),
        ({"type": "tool-approval-request", "approvalId": "ap1", "toolCallId": "c2",
          "reason": "send it?"}, 15),
        ({"type": "tool-approval-response", "approvalId": "ap1", "approved": True,
          "providerExecuted": True}, 16),
        ({"type": "tool-output-available", "toolCallId": "c2",
          "output": {"status": "ok", "summary": "sent", "output": None}, **TOOL}, 17),
        ({"type": "finish-step"}, None),
        ({"type": "start-step"}, None),
        ({"type": "text-start", "id": "m3"}, None),
        ({"type": "text-delta", "id": "m3", "delta": "Done."}, 18),
        ({"type": "text-end", "id": "m3"}, None),
        ({"type": "finish-step"}, None),
        ({"type": "finish", "finishReason": "stop", "messageMetadata": {"runlog": {
            "status": "completed",
            "usage": {"input_tokens": 3, "output_tokens": 9, "reasoning_tokens": 0}}}}, 19),
    ]  # fmt: skip
    assert done


def test_an_undecided_approval_ends_the_answer_with_the_native_interrupt() -> None:
    got, done = answer(scripted_run())  # ap1 undecided when the answer began
    assert got[-3:] == [
        ({"type": "tool-approval-request", "approvalId": "ap1", "toolCallId": "c2",
          "reason": "send it?"}, None),
        ({"type": "finish-step"}, None),
        ({"type": "finish", "finishReason": "tool-calls",
          "messageMetadata": {"runlog": {"status": "waiting_approval"}}},
         15),
    ]  # fmt: skip
    assert done


def test_the_answer_to_an_approval_continues_the_message() -> None:
    """The chat's approval POST is answered from right after the
    approval_required: `start` (same message id), no new step, then the rest."""
    got, done = answer(scripted_run(), cursor=15, decided=("ap1",))
    assert [(c["type"], s) for c, s in got] == [
        ("start", None),
        ("tool-approval-response", 16),
        ("tool-output-available", 17),
        ("finish-step", None), ("start-step", None),
        ("text-start", None), ("text-delta", 18), ("text-end", None),
        ("finish-step", None), ("finish", 19),
    ]  # fmt: skip
    assert got[0][0] == {"type": "start", "messageId": "r1", "messageMetadata": START_META}
    assert done


def test_a_continuation_reopens_the_spans_open_at_its_cursor() -> None:
    evs = scripted_run()
    # Mid text: the text part re-opens with its id, then the rest of it.
    got, _ = answer(evs, cursor=4, decided=("ap1",))
    assert chunks(got)[:4] == [
        {"type": "start", "messageId": "r1", "messageMetadata": START_META},
        {"type": "text-start", "id": "m1"},
        {"type": "text-delta", "id": "m1", "delta": "look."},
        {"type": "text-end", "id": "m1"},
    ]
    # Mid tool arguments: the call re-opens with its arguments so far (the
    # client's tool-input-start forgets them), then the rest.
    got, _ = answer(evs, cursor=7, decided=("ap1",))
    assert chunks(got)[:5] == [
        {"type": "start", "messageId": "r1", "messageMetadata": START_META},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "search_docs",
         "toolMetadata": {"runlog": {"risk_level": "low"}}, **TOOL},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '{"query'},
        {"type": "tool-input-delta", "toolCallId": "c1", "inputTextDelta": '":"x"}'},
        {"type": "tool-input-available", "toolCallId": "c1", "toolName": "search_docs", **TOOL,
         "input": {"query": "x"}},
    ]  # fmt: skip


def test_every_seq_is_carried_once_by_the_last_chunk_of_its_event() -> None:
    evs = scripted_run()
    for cursor in range(len(evs)):
        got, _ = answer(evs, cursor, decided=("ap1",))
        seqs = [s for _, s in got if s is not None]
        assert seqs == list(range(cursor + 1, len(evs) + 1))
        assert got[-1][1] == len(evs)  # the answer ends on the run's last seq


def _assemble(chunk_list: list[Chunk], message: object = None) -> dict[str, Any]:
    out = node({"mode": "assemble", "chunks": chunk_list, "message": message})
    assert (out["invalid"], out["errors"], out["warnings"]) == ([], [], [])
    return out


def _parts(message: dict[str, Any]) -> list[tuple[str, str]]:
    """A message's parts as (type, text or tool state)."""
    return [(p["type"], p.get("text", p.get("state", ""))) for p in message["parts"]]


def test_the_client_assembles_the_log_from_any_cursor() -> None:
    """The client's own reader (readUIMessageStream): the full answer is the
    message of the log; an answer continued from any cursor, read onto the
    message as it was there, gives the same text, reasoning and tools."""
    evs = scripted_run()
    full = _assemble(chunks(answer(evs, decided=("ap1",))[0]))["message"]
    assert full["id"] == "r1"
    assert _parts(full) == [
        ("step-start", ""), ("reasoning", "Check docs."), ("text", "Let me look."),
        ("dynamic-tool", "output-available"),
        ("step-start", ""), ("text", "Sending."), ("dynamic-tool", "output-available"),
        ("step-start", ""), ("text", "Done."),
    ]  # fmt: skip
    tools = [p for p in full["parts"] if p["type"] == "dynamic-tool"]
    assert [(t["toolCallId"], t["input"], t["output"]["summary"]) for t in tools] == [
        ("c1", {"query": "x"}, "3 pages"), ("c2", {"to": "t"}, "sent")
    ]  # fmt: skip
    assert tools[1]["approval"] == {"id": "ap1", "requestReason": "send it?", "approved": True}
    assert full["metadata"]["runlog"]["status"] == "completed"
    for cursor in (2, 4, 7, 13, 15):
        before = _assemble(chunks(answer(evs[:cursor], decided=("ap1",))[0]))["message"]
        rest = _assemble(chunks(answer(evs, cursor, decided=("ap1",))[0]), before)["message"]
        merged = [(t, x) for t, x in _parts(rest)]
        text = "".join(x for t, x in merged if t == "text")
        assert (text, [t for t, _ in merged].count("step-start")) == (
            "Let me look.Sending.Done.",
            3,
        ), cursor
        assert [p["input"] for p in rest["parts"] if p["type"] == "dynamic-tool"] == [
            {"query": "x"}, {"to": "t"}
        ]  # fmt: skip


def test_the_approval_round_trip_in_the_client() -> None:
    """The interrupted answer leaves the tool part `approval-requested`; the
    continuation (after the chat's answer) completes the same message."""
    evs = scripted_run()
    first, done = answer(evs)
    assert done
    msg = _assemble(chunks(first))["message"]
    assert msg["parts"][-1]["state"] == "approval-requested"
    assert msg["parts"][-1]["approval"] == {"id": "ap1", "requestReason": "send it?"}
    rest = _assemble(chunks(answer(evs, cursor=15, decided=("ap1",))[0]), msg)["message"]
    assert _parts(rest) == _parts(_assemble(chunks(answer(evs, decided=("ap1",))[0]))["message"])


def _numbered(evs: list[events.Event]) -> list[events.Event]:
    for i, e in enumerate(evs, 1):
        e.run_id, e.session_id, e.seq = "r1", "s1", i
    return evs


def reset_run() -> list[events.Event]:
    return _numbered([
        events.RunStart(),
        events.ReasoningDelta(message_id="m1", delta="hmm"),
        events.TextDelta(message_id="m1", delta="draft"),
        events.MessageReset(message_id="m1"),
        events.ToolCallStart(tool_call_id="c1", tool_name="t"),
        events.ToolCallEnd(tool_call_id="c1"),
        events.ToolResult(tool_call_id="c1", status="ok"),
        events.TextDelta(message_id="m2", delta="final"),
        events.RunEnd(status="completed"),
    ])  # fmt: skip


def test_a_message_reset_drops_that_text_and_keeps_the_rest_of_the_step() -> None:
    evs = reset_run()
    got, _ = answer(evs)
    assert [s for _, s in got][7:14] == [None, None, None, None, None, 4, 5]
    assert chunks(got)[7:14] == [
        {"type": "text-end", "id": "m1"},
        {"type": "reset-step"},
        {"type": "reasoning-start", "id": "m1"},
        {"type": "reasoning-delta", "id": "m1", "delta": "hmm"},
        {"type": "reasoning-end", "id": "m1"},
        {"type": "data-runlog-message-reset", "data": {"message_id": "m1"}, "transient": True},
        {"type": "tool-input-start", "toolCallId": "c1", "toolName": "t",
         "toolMetadata": {"runlog": {"risk_level": "low"}}, **TOOL},
    ]  # fmt: skip
    for cursor in (0, 2, 3):  # the same message from a cursor before the reset
        msg = _assemble(chunks(answer(evs)[0]))["message"]
        if cursor:
            before = _assemble(chunks(answer(evs[:cursor])[0]))["message"]
            msg = _assemble(chunks(answer(evs, cursor)[0]), before)["message"]
        assert [(t, x) for t, x in _parts(msg) if t != "dynamic-tool"] == [
            ("step-start", ""), ("reasoning", "hmm"), ("step-start", ""), ("text", "final")
        ], cursor  # fmt: skip


def test_a_text_delta_of_the_open_message_is_the_general_path_byte_for_byte() -> None:
    """The common case (another delta of the open text message) has its own
    short path, and its chunk is built around the delta once per message:
    every answer, from every cursor, must be byte for byte what the general
    path makes (here forced by telling the projection no event continues
    the open text), resets, steps and ids JSON escapes included."""
    tricky = 'm"id":\\'
    evs = _numbered([
        events.RunStart(),
        events.TextDelta(message_id="m0", delta="kept "),
        events.TextDelta(message_id="m0", delta="by the reset"),
        events.TextDelta(message_id="m1", delta="a"),
        events.TextDelta(message_id="m1", delta='say "hi"\n'),
        events.ReasoningDelta(message_id="m1", delta="hmm"),
        events.TextDelta(message_id="m1", delta="b"),
        events.TextDelta(message_id="m1", delta="c"),
        events.MessageReset(message_id="m1"),
        events.TextDelta(message_id="m1", delta="again"),
        events.ToolCallStart(tool_call_id="c1", tool_name="t"),
        events.ToolResult(tool_call_id="c1", status="ok"),
        events.TextDelta(message_id=tricky, delta="x"),
        events.TextDelta(message_id=tricky, delta=""),
        events.TextDelta(message_id="m1", delta="late"),
        events.MessageReset(message_id="m1"),
        events.RunEnd(status="completed"),
    ])  # fmt: skip

    def wires(cursor: int, general: bool) -> list[tuple[bytes, int | None]]:
        p = AiSdkProjection(Context("r1", "s1"))
        if general:
            p.spans.continues_text = lambda ev: False  # type: ignore[method-assign]
        for e in evs[:cursor]:
            p.track(e)
        out = p.start()
        for e in evs[cursor:]:
            out += p.feed(e)
        return [(w.data, w.seq) for w in out]

    for cursor in range(len(evs)):
        assert wires(cursor, general=False) == wires(cursor, general=True), cursor


def side_run() -> list[events.Event]:
    return _numbered([
        events.RunStart(),
        events.Status(code="thinking", summary="planning"),
        events.ToolCallStart(tool_call_id="c1", tool_name="slow"),
        events.ToolCallEnd(tool_call_id="c1"),
        events.Progress(label="fetch", done=1, total=3),
        events.InterruptRequested(requested_by="u2", reason="enough"),
        events.ToolResult(tool_call_id="c1", status="skipped", summary="not run: the run ended"),
        events.RunEnd(status="aborted", stop=events.StopAudit(requested_by="u2", at_seq=5)),
    ])  # fmt: skip


def test_runlog_only_events_are_transient_data_parts() -> None:
    evs = side_run()
    got = chunks(answer(evs)[0])
    assert [c for c in got if c["type"].startswith("data-")] == [
        {"type": "data-runlog-status", "data": {"code": "thinking", "summary": "planning"},
         "transient": True},
        {"type": "data-runlog-progress", "data": {"label": "fetch", "done": 1, "total": 3},
         "transient": True},
        {"type": "data-runlog-interrupt-requested",
         "data": {"requested_by": "u2", "reason": "enough"}, "transient": True},
    ]  # fmt: skip
    assert got[-3] == {"type": "tool-output-error", "toolCallId": "c1",
                       "errorText": "not run: the run ended", **TOOL}  # fmt: skip
    assert got[-1]["finishReason"] == "other"
    assert got[-1]["messageMetadata"]["runlog"]["stop"]["requested_by"] == "u2"
    msg = _assemble(got)["message"]
    assert [(t, x) for t, x in _parts(msg)] == [
        ("step-start", ""),
        ("dynamic-tool", "output-error"),
    ]


def failed_run() -> list[events.Event]:
    return _numbered([
        events.RunStart(),
        events.TextDelta(message_id="m1", delta="a"),
        events.ToolCallStart(tool_call_id="c1", tool_name="t"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"x'),
        events.ToolCallStart(tool_call_id="c2", tool_name="u"),
        events.ToolResult(tool_call_id="c1", status="skipped"),
        events.RunError(code="model_timeout", message="the model stalled"),
        events.RunEnd(status="failed"),
    ])  # fmt: skip


def test_a_stop_mid_arguments_and_a_failed_run() -> None:
    evs = failed_run()
    got = chunks(answer(evs)[0])
    # c1 has its result; c2 never finished its arguments.
    assert got[-5:] == [
        {"type": "tool-output-error", "toolCallId": "c1", "errorText": "skipped", **TOOL},
        {"type": "tool-input-error", "toolCallId": "c2", "toolName": "u", **TOOL, "input": "",
         "errorText": "the run ended before the tool call's arguments did"},
        {"type": "error", "errorText": "model_timeout: the model stalled"},
        {"type": "finish-step"},
        {"type": "finish", "finishReason": "error",
         "messageMetadata": {"runlog": {"status": "failed"}}},
    ]  # fmt: skip


def unknown_call_run() -> list[events.Event]:
    return _numbered([
        events.RunStart(),
        events.ToolArgsDelta(tool_call_id="zz", partial_json="{}"),
        events.ApprovalRequired(approval_id="ap", tool_call_id="zz"),
        events.ApprovalDecided(approval_id="ap", decision="expired"),
        events.ToolResult(tool_call_id="zz", status="skipped"),
        events.RunEnd(status="completed"),
    ])  # fmt: skip


def test_no_tool_chunk_for_a_call_the_log_never_started() -> None:
    """An approval or result for an unknown tool call would fail the chat
    (it has no part for it): a data part instead."""
    evs = unknown_call_run()
    got = chunks(answer(evs, decided=("ap",))[0])
    assert [c["type"] for c in got] == [
        "start", "start-step", "data-runlog-approval-required", "data-runlog-approval-decided",
        "data-runlog-tool-result", "finish-step", "finish",
    ]  # fmt: skip
    _assemble(got)


def _client_chunk_types() -> set[str]:
    """The `type` literals of the client's UI message chunk union, read from
    the installed package's dist."""
    src = AI_DIST.read_text()
    start = src.index("const uiMessageChunkSchema = lazySchema(")
    end = src.index("function isDataUIMessageChunk", start)
    block = src[start:end]
    # steering-message's nested parts are not chunk types
    nested = block.index('type: z$1.literal("steering-message")')
    nested_end = block.index("})]))", nested)
    block = block[:nested] + block[nested_end:]
    return set(re.findall(r'type: z\$1\.literal\("([a-z-]+)"\)', block))


def test_nothing_unknown_to_the_clients_chunk_union() -> None:
    known = _client_chunk_types()
    assert {"start", "finish", "text-delta", "tool-approval-request", "reset-step"} <= known
    sent: set[str] = set()
    for evs in (scripted_run(), reset_run(), side_run(), failed_run(), unknown_call_run()):
        for cursor in range(len(evs)):
            for decided in ((), ("ap1",), ("ap",)):
                sent |= {c["type"] for c in chunks(answer(evs, cursor, decided)[0])}
    unknown = {t for t in sent if t not in known and not t.startswith("data-")}
    assert unknown == set()


# -- the routes, with the real client against real gateways and a real worker

PREFIX = "/v1/compat/ai-sdk"


async def chat(gw: RunningGateway, user: str, api: str, steps: list[dict[str, Any]],
               **opts: Any) -> dict[str, Any]:  # fmt: skip
    """One node process: an AbstractChat driven through `steps` (aisdk.mjs)."""
    req = {"mode": "chat", "base": gw.url, "token": gw.token(user), "api": api,
           "steps": steps, **opts}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        "node", str(CLIENTS / "aisdk.mjs"), cwd=CLIENTS,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        async with asyncio.timeout(120):
            out, err = await proc.communicate(json.dumps(req).encode())
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()[-4000:]
    got: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return got


def log_message(evs: list[events.AnyEvent]) -> dict[str, Any]:
    """What the chat's assistant message must hold, read from the log."""
    args: dict[str, str] = {}
    names: dict[str, str] = {}
    for e in evs:
        if isinstance(e, events.ToolCallStart):
            names[e.tool_call_id], args[e.tool_call_id] = e.tool_name, ""
        elif isinstance(e, events.ToolArgsDelta):
            args[e.tool_call_id] += e.partial_json
    reset = {e.message_id for e in of(evs, events.MessageReset)}
    return {
        "id": evs[0].run_id,
        "text": "".join(e.delta for e in of(evs, events.TextDelta) if e.message_id not in reset),
        "reasoning": "".join(e.delta for e in of(evs, events.ReasoningDelta)),
        "tools": [(c, names[c], json.loads(a)) for c, a in args.items()],
    }


def chat_message(m: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": m["id"],
        "text": m["text"],
        "reasoning": m["reasoning"],
        "tools": [(t["toolCallId"], t["toolName"], t["input"]) for t in m["tools"]],
    }


def clean(out: dict[str, Any]) -> None:
    """The client reported no validation error and logged no warning."""
    assert (out["errors"], out["warnings"], out["error"]) == ([], [], None)


async def test_a_full_run_with_an_approval_through_the_chat(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    """A session-keyed chat sends a message (a new run), the answer stops at
    the approval (the chat's native interrupt), `addToolApprovalResponse` +
    `sendAutomaticallyWhen` answer it, and the message ends equal to the log."""
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice", bob="approver")
        out = await chat(gw, "alice", f"{PREFIX}/sessions/{sid}", [
            {"do": "send", "text": "tell me about runlog"}, {"do": "settle"},
            {"do": "approve", "approved": True, "reason": "fine"},
        ], sessionReconnect=True, lastOnly=True)  # fmt: skip
        clean(out)
        (msg,) = out["messages"]
        evs = await stored(b, msg["id"])
        assert chat_message(msg) == log_message(evs)
        assert msg["text"].startswith("Let me look that up in the docs.")
        assert [(t["toolName"], t["state"]) for t in msg["tools"]] == [
            ("search_docs", "output-available"), ("send_message", "output-available")
        ]  # fmt: skip
        (req,) = of(evs, events.ApprovalRequired)
        assert msg["tools"][1]["approval"] == {"id": req.approval_id, "requestReason": req.summary,
                                               "approved": True, "reason": "fine"}  # fmt: skip
        (dec,) = of(evs, events.ApprovalDecided)
        assert (dec.decision, dec.decided_by, dec.comment) == ("approve", "alice", "fine")
        assert msg["steps"] == 3 and msg["metadata"]["runlog"]["status"] == "completed"
        assert [f["finishReason"] for f in out["finishes"]] == ["tool-calls", "stop"]
        assert [(r["method"], r["url"].removeprefix(gw.url)) for r in out["requests"]] == [
            ("POST", f"{PREFIX}/sessions/{sid}"), ("POST", f"{PREFIX}/sessions/{sid}")
        ]  # fmt: skip
        assert out["statuses"] == [200, 200]
        assert {h["x-vercel-ai-ui-message-stream"] for h in out["headers"]} == {"v1"}


async def _start_run(http: aiohttp.ClientSession, gw: RunningGateway, sid: str, text: str) -> str:
    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={"input": text},
                         headers=gw.headers("alice")) as r:  # fmt: skip
        assert r.status == 202, await r.text()
        run_id: str = (await r.json())["run_id"]
    return run_id


async def _frames(http: aiohttp.ClientSession, gw: RunningGateway, path: str,
                  headers: dict[str, str] | None = None) -> tuple[int, bytes]:  # fmt: skip
    async with http.get(gw.url + path, headers={**gw.headers("alice"), **(headers or {})}) as r:
        return r.status, await r.read()


def _chunks_of(body: bytes) -> list[tuple[int | None, Any]]:
    """(id, data) of each SSE frame (data: a chunk, or "[DONE]")."""
    out: list[tuple[int | None, Any]] = []
    for frame in body.decode().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in frame.split("\n") if ": " in line
                      and not line.startswith(":"))  # fmt: skip
        if "data" in fields:
            data = fields["data"]
            seq = int(fields["id"]) if "id" in fields else None
            out.append((seq, data if data == "[DONE]" else json.loads(data)))
    return out


async def test_a_cut_mid_stream_resumes_with_nothing_lost_or_doubled(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    """`resumeStream()` after a cut replays the run into the same message:
    a live run cut mid text, an ended one cut mid tool arguments."""
    async with running_worker(settings, scripted_tokens_per_s=300.0) as (b, _), \
            running_gateway(settings) as gw:  # fmt: skip
        sid = await session_with(http, gw, "alice")
        live = await _start_run(http, gw, sid, "a long answer please")
        out = await chat(gw, "alice", f"{PREFIX}/runs", [
            {"do": "cut", "after": 4000}, {"do": "resume"}, {"do": "resume"},
        ], chatId=live)  # fmt: skip
        assert [s["status"] for s in out["log"][1:]] == ["error", "ready"]
        assert (out["errors"], out["warnings"]) == (["terminated"], [])
        evs = await stored(b, live)
        (msg,) = out["messages"]
        assert chat_message(msg) == log_message(evs)
        assert len(msg["text"]) > 4000  # the cut was mid text, long before the end

        ended = await _start_run(http, gw, sid, "tell me about runlog, no approval")
        await wait_event(b, ended, "run_end")
        status, body = await _frames(http, gw, f"{PREFIX}/runs/{ended}/stream")
        assert status == 200
        # Cut inside the second tool-input-delta frame.
        at = [m.start() for m in re.finditer(rb'"type":"tool-input-delta"', body)][1]
        out = await chat(gw, "alice", f"{PREFIX}/runs", [
            {"do": "cut", "after": at + 10}, {"do": "resume"}, {"do": "resume"},
        ], chatId=ended)  # fmt: skip
        assert (out["errors"], out["warnings"]) == (["terminated"], [])
        (msg,) = out["messages"]
        assert chat_message(msg) == log_message(await stored(b, ended))
        assert msg["tools"][0]["state"] == "output-available"


async def test_an_ended_run_replayed_continued_and_asked_from_its_end(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice")
        run_id = await _start_run(http, gw, sid, "tell me about runlog, no approval")
        await wait_event(b, run_id, "run_end")
        evs = await stored(b, run_id)
        head = evs[-1].seq
        # A fresh chat attaches to the run: the whole message.
        out = await chat(gw, "alice", f"{PREFIX}/runs", [{"do": "resume"}], chatId=run_id)
        clean(out)
        (msg,) = out["messages"]
        assert chat_message(msg) == log_message(evs)
        assert [f["finishReason"] for f in out["finishes"]] == ["stop"]
        # The whole stream: start first, every seq once in order, [DONE] last.
        status, body = await _frames(http, gw, f"{PREFIX}/runs/{run_id}/stream")
        frames = _chunks_of(body)
        assert (status, frames[0][1]["type"], frames[0][1]["messageId"]) == (200, "start", run_id)
        assert [s for s, _ in frames if s is not None] == list(range(1, head + 1))
        assert frames[-1] == (None, "[DONE]")
        # From a cursor (Last-Event-ID or ?after): a continuation, opening with start.
        k = head - 3
        for headers, query in (({"Last-Event-ID": str(k)}, ""), ({}, f"?after={k}")):
            status, body = await _frames(http, gw, f"{PREFIX}/runs/{run_id}/stream{query}",
                                         headers)  # fmt: skip
            frames = _chunks_of(body)
            assert frames[0][1]["type"] == "start"
            assert [s for s, _ in frames if s is not None] == list(range(k + 1, head + 1))
        # From its end: 204, the client's "no active stream".
        for query in (f"?after={head}", f"?after={head + 5}"):
            assert (await _frames(http, gw, f"{PREFIX}/runs/{run_id}/stream{query}"))[0] == 204
        assert (await _frames(http, gw, f"{PREFIX}/sessions/{sid}/stream"))[0] == 204
        out = await chat(gw, "alice", f"{PREFIX}/sessions/{sid}", [{"do": "resume"}],
                         sessionReconnect=True)  # fmt: skip
        assert (out["messages"], out["statuses"], out["status"]) == ([], [204], "ready")


async def test_a_stop_is_runlogs_interrupt_and_a_closed_chat_stops_nothing(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings, scripted_tokens_per_s=100.0) as (b, _), \
            running_gateway(settings) as gw:  # fmt: skip
        sid = await session_with(http, gw, "alice")
        run_id = await _start_run(http, gw, sid, "a long answer please")
        # The session's stream is its active run's, replayed whole.
        async with http.get(f"{gw.url}{PREFIX}/sessions/{sid}/stream",
                            headers=gw.headers("alice")) as r:  # fmt: skip
            first = await r.content.readuntil(b"\n\n")
        assert json.loads(first.removeprefix(b"data: "))["messageId"] == run_id
        out = await chat(gw, "alice", f"{PREFIX}/runs", [
            {"do": "resume-bg"}, {"do": "wait", "text": 40}, {"do": "stop"},
            {"do": "run-status"}, {"do": "interrupt"}, {"do": "resume"},
        ], chatId=run_id)  # fmt: skip
        clean(out)
        assert [s.get("status") for s in out["log"][2:5]] == ["ready", "running", 202]
        assert out["finishes"][0]["isAbort"] is True
        evs = await stored(b, run_id)
        assert evs[-1].status == "aborted"  # type: ignore[union-attr]
        (msg,) = out["messages"]
        assert chat_message(msg) == log_message(evs)
        assert msg["metadata"]["runlog"]["status"] == "aborted"
        assert out["finishes"][-1]["finishReason"] == "other"
        assert {"type": "data-runlog-interrupt-requested",
                "data": {"requested_by": "alice", "reason": "enough"}} in out["data"]  # fmt: skip


async def test_another_user_on_another_gateway_follows_and_answers_the_same_run(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    """Alice's chat on one gateway stops at the approval; Bob's chat on
    another attaches to the run, approves through his chat, and sees it to
    the end; Alice's next attach replays the same message."""
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw1, \
            running_gateway(settings) as gw2:  # fmt: skip
        sid = await session_with(http, gw1, "alice", bob="approver")
        first = await chat(gw1, "alice", f"{PREFIX}/sessions/{sid}", [
            {"do": "send", "text": "tell me about runlog"}, {"do": "settle"},
        ], sessionReconnect=True)  # fmt: skip
        clean(first)
        (waiting,) = first["messages"]
        assert waiting["tools"][-1]["state"] == "approval-requested"
        run_id = waiting["id"]
        bob = await chat(gw2, "bob", f"{PREFIX}/runs", [
            {"do": "resume"}, {"do": "approve", "approved": False, "reason": "not now"},
        ], chatId=run_id)  # fmt: skip
        clean(bob)
        assert [(r["method"], r["url"].removeprefix(gw2.url)) for r in bob["requests"]] == [
            ("GET", f"{PREFIX}/runs/{run_id}/stream"), ("POST", f"{PREFIX}/runs")
        ]  # fmt: skip
        alice = await chat(gw1, "alice", f"{PREFIX}/runs", [{"do": "resume"}], chatId=run_id)
        clean(alice)
        evs = await stored(b, run_id)
        (dec,) = of(evs, events.ApprovalDecided)
        assert (dec.decision, dec.decided_by, dec.comment) == ("reject", "bob", "not now")
        assert "I did not send the message" in text_of(evs)
        (bob_msg,), (alice_msg,) = bob["messages"], alice["messages"]
        assert chat_message(bob_msg) == chat_message(alice_msg) == log_message(evs)
        assert bob_msg["parts"] == alice_msg["parts"]
        assert bob_msg["tools"][-1]["state"] == alice_msg["tools"][-1]["state"] == "output-denied"


async def test_a_conflicting_answer_is_409_and_a_viewer_cannot_answer(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice", bob="approver", vic="viewer")
        out = await chat(gw, "alice", f"{PREFIX}/sessions/{sid}", [
            {"do": "send", "text": "tell me about runlog"}, {"do": "settle"},
            {"do": "decide-as", "token": gw.token("bob"), "decision": "reject"},
            {"do": "approve", "approved": True},
        ])  # fmt: skip
        assert out["log"][2]["status"] == 201
        assert (out["statuses"], out["status"]) == ([200, 409], "error")
        assert "approval_conflict" in out["error"]
        run_id = out["messages"][0]["id"]
        await wait_event(b, run_id, "run_end")
        (dec,) = of(await stored(b, run_id), events.ApprovalDecided)
        assert (dec.decision, dec.decided_by) == ("reject", "bob")
        # The same answer again is a repeat, not a conflict: the rest streams.
        (req,) = of(await stored(b, run_id), events.ApprovalRequired)
        tool = {"type": "dynamic-tool", "toolCallId": req.tool_call_id, "toolName": "send_message",
                "state": "approval-responded",
                "approval": {"id": req.approval_id, "approved": False}}  # fmt: skip
        body = {"id": run_id, "trigger": "submit-message", "messageId": run_id,
                "messages": [{"id": run_id, "role": "assistant", "parts": [tool]}]}  # fmt: skip
        async with http.post(f"{gw.url}{PREFIX}/runs", json=body, headers=gw.headers("bob")) as r:
            frames = _chunks_of(await r.read())
            assert (r.status, r.headers["x-vercel-ai-ui-message-stream"]) == (200, "v1")
        assert [c["type"] for _, c in frames[:3]] == [
            "start", "tool-approval-response", "tool-output-denied"
        ]  # fmt: skip
        assert frames[1][0] == req.seq + 1 and frames[-1] == (None, "[DONE]")
        async with http.post(f"{gw.url}{PREFIX}/runs", json=body, headers=gw.headers("vic")) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (403, "forbidden")
        # Nothing to answer: no approval answered, or no new user message.
        body["messages"][0]["parts"] = [{"type": "text", "text": "hi"}]
        async with http.post(f"{gw.url}{PREFIX}/runs", json=body, headers=gw.headers("bob")) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_request")
        user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
        for messages, trigger in (
            ([user, body["messages"][0]], "submit-message"),
            ([user], "regenerate-message"),
            ([], "submit-message"),
        ):
            async with http.post(
                f"{gw.url}{PREFIX}/sessions/{sid}",
                headers=gw.headers("bob"),
                json={"messages": messages, "trigger": trigger},
            ) as r:
                assert (r.status, (await r.json())["error"]["code"]) == (400, "invalid_request")
        assert len((await b.store.session_info(sid)).runs) == 1  # and nothing started


async def test_text_the_worker_resets_leaves_the_chats_message(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    """With discard_text_before_tools, a turn's text before its tool calls
    gets a message_reset: the chat's message drops it (reset-step), live and
    replayed, and keeps that step's reasoning."""
    async with running_worker(settings, discard_text_before_tools=True) as (b, _), \
            running_gateway(settings) as gw:  # fmt: skip
        sid = await session_with(http, gw, "alice")
        out = await chat(gw, "alice", f"{PREFIX}/sessions/{sid}", [
            {"do": "send", "text": "tell me about runlog, no approval"}, {"do": "settle"},
        ], sessionReconnect=True)  # fmt: skip
        clean(out)
        (live,) = out["messages"]
        evs = await stored(b, live["id"])
        assert len(of(evs, events.MessageReset)) == 1
        replay = await chat(gw, "alice", f"{PREFIX}/runs", [{"do": "resume"}], chatId=live["id"])
        clean(replay)
        for msg in (live, replay["messages"][0]):
            assert chat_message(msg) == log_message(evs)
            assert "Let me look that up" not in msg["text"]
            assert msg["parts"][:3] == ["step-start", "reasoning", "dynamic-tool"]
        assert {
            "type": "data-runlog-message-reset",
            "data": {"message_id": of(evs, events.MessageReset)[0].message_id},
        } in out["data"]
