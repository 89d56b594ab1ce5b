"""OpenAI chat completion chunks with `extra.kind` (gateway/compat/openai.py).

The pure projection first (no servers): the exact chunks, and a cut after any
chunk resumed with the last `extra.seq` reassembling the log through the
SDK's own accumulator. Then the real `openai` SDK against real gateways and a
real worker.
"""

from __future__ import annotations

import json
from typing import Any

from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from broker import events
from gateway.compat.base import Context, Wire
from gateway.compat.openai import OpenAIChunks

RUN = "run_t"
T0 = 1_760_000_000_000  # ms: the run's start


def _run(*, error: bool = False) -> list[events.Event]:
    evs: list[events.Event] = [
        events.RunStart(trace_id="tr", model="scripted-demo", started_by="alice", input="hi"),
        events.ReasoningDelta(message_id="m1", delta="Let me "),
        events.ReasoningDelta(message_id="m1", delta="check."),
        events.TextDelta(message_id="m1", delta="Looking "),
        events.TextDelta(message_id="m1", delta="it up."),
        events.Status(code="tool_phase", summary="calling tools"),
        events.ToolCallStart(tool_call_id="c0", tool_name="save_note", risk_level="medium"),
        events.ToolCallStart(tool_call_id="c1", tool_name="search_docs"),
        events.ToolArgsDelta(tool_call_id="c0", partial_json='{"text":'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"query":'),
        events.ToolArgsDelta(tool_call_id="c0", partial_json='"n"}'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='"q"}'),
        events.ToolCallEnd(tool_call_id="c0"),
        events.ToolCallEnd(tool_call_id="c1"),
        events.ToolResult(tool_call_id="c0", status="ok", summary="saved"),
        events.Progress(label="searching", done=1, total=3),
        events.ToolResult(tool_call_id="c1", status="ok", summary="3 pages"),
        events.TextDelta(message_id="m2", delta="Sending."),
        events.ToolCallStart(tool_call_id="c2", tool_name="send_message", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="c2", partial_json='{"to":"t"}'),
        events.ToolCallEnd(tool_call_id="c2"),
        events.ApprovalRequired(
            approval_id="ap1", tool_call_id="c2", summary="send?", expires_at=T0 + 60_000
        ),
        events.ApprovalDecided(approval_id="ap1", decision="approve", decided_by="bob"),
        events.ToolResult(tool_call_id="c2", status="ok", summary="sent"),
        events.MessageReset(message_id="m2"),
        events.InterruptRequested(requested_by="alice", reason="enough"),
    ]
    if error:
        evs.append(events.RunError(code="model_unavailable", retryable=True, message="down"))
        evs.append(events.RunEnd(status="failed"))
    else:
        evs.append(events.TextDelta(message_id="m3", delta="Done."))
        usage = events.Usage(input_tokens=10, output_tokens=7, reasoning_tokens=2)
        evs.append(events.RunEnd(status="completed", usage=usage))
    for i, e in enumerate(evs, 1):
        e.run_id, e.session_id, e.seq, e.ts = RUN, "ses_t", i, T0 + i
    return evs


def _answer(evs: list[events.Event], after: int = 0, usage: bool = True) -> list[Wire]:
    """What the serving layer sends: track up to the cursor, start, feed the rest."""
    p = OpenAIChunks(Context(RUN, "ses_t", options={"include_usage": usage}))
    for e in evs[:after]:
        p.track(e)
    out = p.start()
    for e in evs[after:]:
        assert not p.done
        out.extend(p.feed(e))
    assert p.done
    return out


def _head(choices: list[Any], **more: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-run_t", "object": "chat.completion.chunk", "created": T0 // 1000,
            "model": "scripted-demo", "choices": choices, **more}  # fmt: skip


def _delta(**delta: Any) -> list[Any]:
    return [{"index": 0, "delta": delta, "finish_reason": None}]


def _x(kind: str, seq: int | None, **fields: Any) -> dict[str, Any]:
    tail = {} if seq is None else {"seq": seq}
    return {"extra": {"kind": kind, **fields, **tail, "run_id": RUN}}


def _tool(seq: int, status: str, id: str, name: str, **more: Any) -> dict[str, Any]:
    return _x("tool_call", seq, tool={"id": id, "name": name, "status": status, **more})


def _status(seq: int | None, **status: Any) -> dict[str, Any]:
    return _x("status", seq, status=status)


def test_the_exact_chunks_of_a_run() -> None:
    got = [json.loads(w.data) for w in _answer(_run())]
    calls = lambda **c: _delta(tool_calls=[c])  # noqa: E731
    assert got == [
        _head(_delta(role="assistant", content=""),
              **_status(1, code="run_start", trace_id="tr", model="scripted-demo",
                        started_by="alice")),
        _head(_delta(reasoning_content="Let me "), **_x("reasoning_text", 2, message_id="m1")),
        _head(_delta(reasoning_content="check."), **_x("reasoning_text", 3, message_id="m1")),
        _head(_delta(content="Looking "), **_x("assistant_text", 4, message_id="m1")),
        _head(_delta(content="it up."), **_x("assistant_text", 5, message_id="m1")),
        _head([], **_status(6, code="tool_phase", summary="calling tools")),
        _head(calls(index=0, id="c0", type="function",
                    function={"name": "save_note", "arguments": ""}),
              **_tool(7, "start", "c0", "save_note", risk_level="medium")),
        _head(calls(index=1, id="c1", type="function",
                    function={"name": "search_docs", "arguments": ""}),
              **_tool(8, "start", "c1", "search_docs", risk_level="low")),
        _head(calls(index=0, function={"arguments": '{"text":'}),
              **_tool(9, "arguments", "c0", "save_note")),
        _head(calls(index=1, function={"arguments": '{"query":'}),
              **_tool(10, "arguments", "c1", "search_docs")),
        _head(calls(index=0, function={"arguments": '"n"}'}),
              **_tool(11, "arguments", "c0", "save_note")),
        _head(calls(index=1, function={"arguments": '"q"}'}),
              **_tool(12, "arguments", "c1", "search_docs")),
        _head([], **_tool(13, "ready", "c0", "save_note", arguments='{"text":"n"}')),
        _head([], **_tool(14, "ready", "c1", "search_docs", arguments='{"query":"q"}')),
        _head([], **_x("tool_result", 15, tool={"id": "c0", "name": "save_note", "status": "ok",
                                                 "summary": "saved", "output": None})),
        _head([], **_status(16, code="progress", label="searching", done=1, total=3)),
        _head([], **_x("tool_result", 17, tool={"id": "c1", "name": "search_docs",
                                                 "status": "ok", "summary": "3 pages",
                                                 "output": None})),
        _head(_delta(content="Sending."), **_x("assistant_text", 18, message_id="m2")),
        _head(calls(index=2, id="c2", type="function",
                    function={"name": "send_message", "arguments": ""}),
              **_tool(19, "start", "c2", "send_message", risk_level="high")),
        _head(calls(index=2, function={"arguments": '{"to":"t"}'}),
              **_tool(20, "arguments", "c2", "send_message")),
        _head([], **_tool(21, "ready", "c2", "send_message", arguments='{"to":"t"}')),
        _head([], **_x("confirm_request", 22, confirm={
            "approval_id": "ap1", "tool_call_id": "c2", "tool_name": "send_message",
            "summary": "send?", "expires_at": T0 + 60_000,
            "decide": {"method": "POST", "path": "/v1/runs/run_t/approvals/ap1"}})),
        _head([], **_status(23, code="approval_decided", approval_id="ap1",
                            decision="approve", decided_by="bob", comment="")),
        _head([], **_x("tool_result", 24, tool={"id": "c2", "name": "send_message",
                                                 "status": "ok", "summary": "sent",
                                                 "output": None})),
        _head([], **_status(25, code="message_reset", message_id="m2")),
        _head([], **_status(26, code="interrupt_requested", requested_by="alice",
                            reason="enough")),
        _head(_delta(content="Done."), **_x("assistant_text", 27, message_id="m3")),
        _head([{"index": 0, "delta": {}, "finish_reason": "stop"}],
              **_status(None, code="run_end", run_status="completed")),
        _head([], usage={"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17,
                         "completion_tokens_details": {"reasoning_tokens": 2}},
              **_status(28, code="usage")),
    ]  # fmt: skip


def test_framing_only_the_last_chunk_of_an_event_carries_its_seq() -> None:
    wires = _answer(_run())
    assert all(b"\n" not in w.data and b"\r" not in w.data for w in wires)
    # Wire.seq and extra.seq agree, and each seq is on exactly one chunk.
    assert [w.seq for w in wires] == [json.loads(w.data)["extra"].get("seq") for w in wires]
    assert [w.seq for w in wires if w.seq is not None] == list(range(1, 29))
    assert (wires[-2].seq, wires[-1].seq) == (None, 28)
    # Every chunk is a valid ChatCompletionChunk, `extra` kept as it is.
    for w in wires:
        chunk = ChatCompletionChunk.model_validate_json(w.data)
        assert chunk.model_extra is not None
        assert chunk.model_extra["extra"] == json.loads(w.data)["extra"]


def test_without_include_usage_the_finish_chunk_is_the_last() -> None:
    wires = _answer(_run(), usage=False)
    last = json.loads(wires[-1].data)
    assert (wires[-1].seq, last["choices"][0]["finish_reason"], "usage" in last) == (
        28, "stop", False,
    )  # fmt: skip
    assert last["extra"] == {"kind": "status", "seq": 28, "run_id": RUN,
                             "status": {"code": "run_end", "run_status": "completed"}}  # fmt: skip


def test_a_run_error_is_an_error_frame_and_ends_the_answer() -> None:
    evs = _run(error=True)
    p = OpenAIChunks(Context(RUN, "ses_t"))
    p.start()
    for e in evs[:-2]:
        p.feed(e)
    assert not p.done
    [w] = p.feed(evs[-2])
    assert p.done
    assert (w.seq, json.loads(w.data)) == (27, {"error": {
        "message": "down", "type": "runlog_error", "code": "model_unavailable",
        "retryable": True, "seq": 27, "run_id": RUN}})  # fmt: skip


def test_a_resumed_answer_starts_with_what_is_open_and_resends_nothing() -> None:
    evs = _run()
    assert [json.loads(w.data) for w in _answer(evs, 9)[:2]] == [
        _head([], **_status(None, code="resume", after=9, open=[
            {"type": "tool", "id": "c0", "index": 0, "name": "save_note"},
            {"type": "tool", "id": "c1", "index": 1, "name": "search_docs"}])),
        _head(_delta(tool_calls=[{"index": 1, "function": {"arguments": '{"query":'}}]),
              **_tool(10, "arguments", "c1", "search_docs")),
    ]  # fmt: skip
    first = json.loads(_answer(evs, 4)[0].data)["extra"]["status"]
    assert first == {"code": "resume", "after": 4, "open": [{"type": "text", "id": "m1"}]}
    assert _answer(evs, 0)[0].seq == 1  # from the start: no resume chunk


def _assembled(chunks: list[bytes]) -> tuple[str, str, list[tuple[str, str, str]]]:
    """content, reasoning_content and tool calls as the SDK's accumulator has them."""
    state = ChatCompletionStreamState()
    for data in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate_json(data))
    final = state.get_final_completion()
    msg = final.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    return msg.content or "", msg.to_dict().get("reasoning_content", ""), calls  # type: ignore[return-value]


def _expected(evs: list[events.Event]) -> tuple[str, str, list[tuple[str, str, str]]]:
    text = "".join(e.delta for e in evs if isinstance(e, events.TextDelta))
    thought = "".join(e.delta for e in evs if isinstance(e, events.ReasoningDelta))
    calls = {e.tool_call_id: [e.tool_name, ""] for e in evs if isinstance(e, events.ToolCallStart)}
    for e in evs:
        if isinstance(e, events.ToolArgsDelta):
            calls[e.tool_call_id][1] += e.partial_json
    return text, thought, [(k, n, a) for k, (n, a) in calls.items()]


def test_a_cut_after_any_chunk_resumed_from_the_last_seq_loses_and_doubles_nothing() -> None:
    evs = _run()
    full = _answer(evs)
    want = _expected(evs)
    assert want[0] == "Looking it up.Sending.Done."
    assert _assembled([w.data for w in full]) == want
    for k in range(len(full) + 1):
        seen = full[:k]  # the client got these, then the connection broke
        cursor = max([w.seq for w in seen if w.seq is not None], default=0)
        rest = _answer(evs, cursor) if cursor < len(evs) else []  # the end: nothing to resume
        assert _assembled([w.data for w in seen + rest]) == want, k
        got = [w.seq for w in seen + rest if w.seq is not None]
        assert got == list(range(1, len(evs) + 1)), k
