"""The AI SDK UI message stream (gateway/compat/aisdk.py).

Pure projection tests first (no servers; the chunks are also read by the
client's own stream reader in a node subprocess), then the routes with the
real client (`ai`'s AbstractChat + DefaultChatTransport, tests/clients/aisdk.mjs)
against real gateways and a real worker.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from broker import events
from gateway.compat.aisdk import AiSdkProjection
from gateway.compat.base import Context

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
          "messageMetadata": {"runlog": {"status": "waiting_approval", "approval_id": "ap1"}}},
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
