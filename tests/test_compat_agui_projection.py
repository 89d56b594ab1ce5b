"""The AG-UI projection (gateway/compat/agui.py), pure: no servers.

A small model of what `@ag-ui/client` does with the events (its verifier's
rules, per answer, and its reducer: a repeated START reuses the message or
tool call) checks that an answer cut after ANY frame and resumed from the
client's applied cursor assembles exactly what one uncut answer does."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker import events as ev
from gateway.compat.agui import AgUi, iso_ms
from gateway.compat.base import Context

AP = "ap_" + "A" * 22
EXPIRES = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def _run() -> list[ev.Event]:
    evs: list[ev.Event] = [
        ev.RunStart(trace_id="t", model="scripted", started_by="alice"),
        ev.ReasoningDelta(message_id="m1", delta="think "),
        ev.ReasoningDelta(message_id="m1", delta="more"),
        ev.TextDelta(message_id="m1", delta="Let "),
        ev.TextDelta(message_id="m1", delta="me look"),
        ev.ToolCallStart(tool_call_id="c_note", tool_name="save_note", risk_level="medium"),
        ev.ToolCallStart(tool_call_id="c_search", tool_name="search_docs"),
        ev.ToolArgsDelta(tool_call_id="c_note", partial_json='{"text"'),
        ev.ToolArgsDelta(tool_call_id="c_search", partial_json='{"query"'),
        ev.ToolArgsDelta(tool_call_id="c_note", partial_json=':"x"}'),
        ev.ToolArgsDelta(tool_call_id="c_search", partial_json=':"y"}'),
        ev.ToolCallEnd(tool_call_id="c_note"),
        ev.ToolCallEnd(tool_call_id="c_search"),
        ev.Status(code="tools", summary="running tools"),
        ev.Progress(label="search", done=1, total=3),
        ev.ToolResult(tool_call_id="c_note", status="ok", summary="saved"),
        ev.ToolResult(tool_call_id="c_search", status="ok", summary="3 pages"),
        ev.ReasoningDelta(message_id="m2", delta="ok"),
        ev.TextDelta(message_id="m2", delta="I'll send"),
        ev.ToolCallStart(tool_call_id="c_send", tool_name="send_message", risk_level="high"),
        ev.ToolArgsDelta(tool_call_id="c_send", partial_json='{"to":'),
        ev.ToolArgsDelta(tool_call_id="c_send", partial_json='"team"}'),
        ev.ToolCallEnd(tool_call_id="c_send"),
        ev.ApprovalRequired(
            approval_id=AP, tool_call_id="c_send", summary="send it?", expires_at=EXPIRES
        ),
        ev.ApprovalDecided(approval_id=AP, decision="approve", decided_by="bob"),
        ev.ToolResult(tool_call_id="c_send", status="ok", summary="sent"),
        ev.TextDelta(message_id="m3", delta="Done"),
        ev.TextDelta(message_id="m3", delta=""),  # an empty delta: nothing on the wire
        ev.TextDelta(message_id="m3", delta="."),
        ev.RunEnd(
            status="completed", usage=ev.Usage(input_tokens=5, output_tokens=9, reasoning_tokens=3)
        ),
    ]
    for i, e in enumerate(evs):
        e.seq = i + 1
        e.run_id, e.session_id = "r_x", "s_x"
    return evs


APPROVAL_SEQ = 24


def answer(
    evs: list[ev.Event], after: int, decided: set[str]
) -> list[tuple[dict[str, Any], int | None]]:
    """What the serving layer does: track to the cursor, start, feed until done."""
    p = AgUi(Context("r_x", "s_x", options={"agui_run_id": "ag-1"}, decided=set(decided)))
    for e in evs[:after]:
        p.track(e)
    out = p.start()
    if not p.done:
        for e in evs[after:]:
            out += p.feed(e)
            if p.done:
                break
    return [(json.loads(w.data), w.seq) for w in out]


class Client:
    """The client's reducer (what ends up in agent.messages) and, per answer,
    its verifier; `cursor` is the seq of what it applied."""

    def __init__(self) -> None:
        self.messages: dict[str, dict[str, Any]] = {}
        self.cursor = 0
        self.outcomes: list[dict[str, Any]] = []
        self.customs: list[str] = []

    def answer(self, items: list[tuple[dict[str, Any], int | None]]) -> None:
        self._verified: set[tuple[str, str]] = set()
        self._ended = False
        for i, (item, seq) in enumerate(items):
            self.apply(item, first=i == 0)
            if seq is not None:
                assert item["metadata"]["runlog"]["seq"] == seq
                self.cursor = seq
            else:
                assert "seq" not in item.get("metadata", {}).get("runlog", {}), item

    def apply(self, e: dict[str, Any], *, first: bool) -> None:
        t = e["type"]
        open_ = self._verified
        assert not self._ended, f"{t} after the run finished"
        assert (t == "RUN_STARTED") == first, f"first event must be RUN_STARTED, got {t}"
        match t:
            case "TEXT_MESSAGE_START":
                assert ("text", e["messageId"]) not in open_
                open_.add(("text", e["messageId"]))
                self.messages.setdefault(e["messageId"], {"role": "assistant", "content": ""})
            case "TEXT_MESSAGE_CONTENT":
                assert ("text", e["messageId"]) in open_ and e["delta"]
                self.messages[e["messageId"]]["content"] += e["delta"]
            case "TEXT_MESSAGE_END":
                open_.remove(("text", e["messageId"]))
            case "REASONING_START":
                assert ("rspan", e["messageId"]) not in open_
                open_.add(("rspan", e["messageId"]))
            case "REASONING_MESSAGE_START":
                assert ("rspan", e["messageId"]) in open_
                open_.add(("reasoning", e["messageId"]))
                self.messages.setdefault(e["messageId"], {"role": "reasoning", "content": ""})
            case "REASONING_MESSAGE_CONTENT":
                assert ("reasoning", e["messageId"]) in open_ and e["delta"]
                self.messages[e["messageId"]]["content"] += e["delta"]
            case "REASONING_MESSAGE_END":
                open_.remove(("reasoning", e["messageId"]))
            case "REASONING_END":
                assert ("reasoning", e["messageId"]) not in open_
                open_.remove(("rspan", e["messageId"]))
            case "TOOL_CALL_START":
                assert ("tool", e["toolCallId"]) not in open_
                open_.add(("tool", e["toolCallId"]))
                calls = [m.setdefault("toolCalls", {}) for m in self.messages.values()
                         if e["toolCallId"] in m.get("toolCalls", {})]  # fmt: skip
                if not calls:
                    parent = self.messages.setdefault(e.get("parentMessageId", e["toolCallId"]),
                                                      {"role": "assistant", "content": ""})  # fmt: skip
                    parent.setdefault("toolCalls", {})[e["toolCallId"]] = {
                        "name": e["toolCallName"], "arguments": ""}  # fmt: skip
            case "TOOL_CALL_ARGS":
                assert ("tool", e["toolCallId"]) in open_
                for m in self.messages.values():
                    if e["toolCallId"] in m.get("toolCalls", {}):
                        m["toolCalls"][e["toolCallId"]]["arguments"] += e["delta"]
            case "TOOL_CALL_END":
                open_.remove(("tool", e["toolCallId"]))
            case "TOOL_CALL_RESULT":
                self.messages.setdefault(e["messageId"], {
                    "role": "tool", "toolCallId": e["toolCallId"], "content": e["content"]})  # fmt: skip
            case "RUN_FINISHED" | "RUN_ERROR":
                if t == "RUN_FINISHED":
                    assert not open_, f"RUN_FINISHED with {open_} open"
                    assert (e["threadId"], e["runId"]) == ("s_x", "ag-1")
                self.outcomes.append(e)
                self._ended = True
            case "RUN_STARTED":
                assert (e["threadId"], e["runId"]) == ("s_x", "ag-1")
            case "CUSTOM":
                assert e["name"].startswith("runlog.")
                self.customs.append(e["name"])
            case _:
                raise AssertionError(f"unexpected event type {t}")


def _assembled(items: list[tuple[dict[str, Any], int | None]]) -> Client:
    c = Client()
    c.answer(items)
    return c


EXPECTED_MESSAGES = {
    "m1:reasoning": {"role": "reasoning", "content": "think more"},
    "m1": {"role": "assistant", "content": "Let me look", "toolCalls": {
        "c_note": {"name": "save_note", "arguments": '{"text":"x"}'},
        "c_search": {"name": "search_docs", "arguments": '{"query":"y"}'}}},
    "c_note:result": {"role": "tool", "toolCallId": "c_note", "content": "saved"},
    "c_search:result": {"role": "tool", "toolCallId": "c_search", "content": "3 pages"},
    "m2:reasoning": {"role": "reasoning", "content": "ok"},
    "m2": {"role": "assistant", "content": "I'll send", "toolCalls": {
        "c_send": {"name": "send_message", "arguments": '{"to":"team"}'}}},
    "c_send:result": {"role": "tool", "toolCallId": "c_send", "content": "sent"},
    "m3": {"role": "assistant", "content": "Done."},
}  # fmt: skip


def test_one_answer_assembles_the_log() -> None:
    c = _assembled(answer(_run(), 0, {AP}))
    assert c.messages == EXPECTED_MESSAGES
    assert list(c.messages) == list(EXPECTED_MESSAGES)  # in the log's order
    assert c.outcomes == [{
        "type": "RUN_FINISHED", "threadId": "s_x", "runId": "ag-1",
        "outcome": {"type": "success"},
        "usage": [{"inputTokens": 5, "outputTokens": 9, "reasoningTokens": 3,
                   "model": "scripted"}],
        "metadata": {"runlog": {"seq": 30}}}]  # fmt: skip
    assert c.customs == ["runlog.run_start", "runlog.status", "runlog.progress",
                         "runlog.approval_required", "runlog.approval_decided"]  # fmt: skip
    assert c.cursor == 30


@pytest.mark.parametrize("decided", [True, False], ids=["decided", "undecided"])
def test_a_cut_after_any_frame_resumes_to_the_same_messages(decided: bool) -> None:
    evs = _run()
    full = answer(evs, 0, {AP} if decided else set())
    for cut in range(len(full)):
        c = Client()
        c.answer(full[: cut + 1])  # the body ends right after this frame
        while not c.outcomes or c.outcomes[-1]["outcome"]["type"] == "interrupt":
            if c.outcomes:  # the interrupt: the client answers it, the run goes on
                c.outcomes.clear()
            c.answer(answer(evs, c.cursor, {AP} if c.cursor >= APPROVAL_SEQ or decided else set()))
        assert c.messages == EXPECTED_MESSAGES, cut
        assert list(c.messages) == list(EXPECTED_MESSAGES), cut
        assert c.cursor == 30


def test_an_undecided_approval_ends_the_answer_with_the_interrupt() -> None:
    items = answer(_run(), 0, set())
    last, seq = items[-1]
    assert seq == APPROVAL_SEQ
    assert last == {
        "type": "RUN_FINISHED", "threadId": "s_x", "runId": "ag-1",
        "outcome": {"type": "interrupt", "interrupts": [{
            "id": AP, "reason": "tool_approval", "toolCallId": "c_send", "message": "send it?",
            "responseSchema": {"type": "object", "properties": {
                "decision": {"enum": ["approve", "reject"]},
                "comment": {"type": "string", "maxLength": 4000}},
                "additionalProperties": False},
            "metadata": {"runlog": {"tool_name": "send_message", "arguments": '{"to":"team"}'}},
            "expiresAt": "2026-01-01T00:00:00.000Z"}]},
        "metadata": {"runlog": {"seq": APPROVAL_SEQ}}}  # fmt: skip
    # Resumed at the approval while it is still undecided: asked again, at once.
    again = answer(_run(), APPROVAL_SEQ, set())
    assert [(i["type"], s) for i, s in again] == [("RUN_STARTED", None), ("RUN_FINISHED", None)]
    assert again[1][0]["outcome"] == last["outcome"]


def test_the_envelope_reopens_the_spans_open_at_the_cursor_with_the_same_ids() -> None:
    evs = _run()
    items = answer(evs, 9, {AP})  # both tool calls open, with some args
    assert [i for i, _ in items[:3]] == [
        {"type": "RUN_STARTED", "threadId": "s_x", "runId": "ag-1",
         "metadata": {"runlog": {"run_id": "r_x", "session_id": "s_x", "after": 9}}},
        {"type": "TOOL_CALL_START", "toolCallId": "c_note", "toolCallName": "save_note",
         "parentMessageId": "m1"},
        {"type": "TOOL_CALL_START", "toolCallId": "c_search", "toolCallName": "search_docs",
         "parentMessageId": "m1"},
    ]  # fmt: skip
    assert items[3] == ({"type": "TOOL_CALL_ARGS", "toolCallId": "c_note", "delta": ':"x"}',
                         "metadata": {"runlog": {"seq": 10}}}, 10)  # fmt: skip
    reasoning = answer(evs, 2, {AP})
    assert [(i["type"], i.get("messageId")) for i, _ in reasoning[:3]] == [
        ("RUN_STARTED", None), ("REASONING_START", "m1:reasoning"),
        ("REASONING_MESSAGE_START", "m1:reasoning")]  # fmt: skip


def _end(**fields: Any) -> list[ev.Event]:
    evs: list[ev.Event] = [ev.TextDelta(message_id="m", delta="hi"), *fields["tail"]]
    for i, e in enumerate(evs):
        e.seq = i + 1
    return evs


def test_stop_error_and_failure_end_the_answer_in_agui_terms() -> None:
    stopped = answer(_end(tail=[ev.InterruptRequested(requested_by="alice", reason="enough"),
                                ev.RunEnd(status="aborted")]), 0, set())  # fmt: skip
    assert [(i["type"], i.get("name")) for i, _ in stopped] == [
        ("RUN_STARTED", None), ("TEXT_MESSAGE_START", None), ("TEXT_MESSAGE_CONTENT", None),
        ("CUSTOM", "runlog.interrupt_requested"), ("TEXT_MESSAGE_END", None),
        ("RUN_FINISHED", None)]  # fmt: skip
    assert stopped[-1][0]["outcome"] == {"type": "cancelled"}
    failed = answer(_end(tail=[ev.RunError(code="model_unavailable", message="down"),
                               ev.RunEnd(status="failed")]), 0, set())  # fmt: skip
    assert failed[-2:] == [
        ({"type": "TEXT_MESSAGE_END", "messageId": "m"}, None),
        ({"type": "RUN_ERROR", "message": "down", "code": "model_unavailable",
          "metadata": {"runlog": {"seq": 2}}}, 2)]  # fmt: skip
    # Resumed after the error: the failed end.
    after_error = answer(_end(tail=[ev.RunError(code="x"), ev.RunEnd(status="failed")]), 2, set())
    assert [i["type"] for i, _ in after_error] == ["RUN_STARTED", "RUN_ERROR"]
    assert after_error[-1][0]["code"] == "run_failed"


def test_runlog_only_events_go_to_custom_and_a_reset_closes_the_message() -> None:
    items = answer(_end(tail=[ev.MessageReset(message_id="m"),
                              ev.ToolArgsDelta(tool_call_id="gone", partial_json="{}"),
                              ev.ToolCallEnd(tool_call_id="gone"),
                              ev.RunEnd(status="completed")]), 0, set())  # fmt: skip
    assert [(i["type"], i.get("name"), s) for i, s in items] == [
        ("RUN_STARTED", None, None), ("TEXT_MESSAGE_START", None, None),
        ("TEXT_MESSAGE_CONTENT", None, 1), ("TEXT_MESSAGE_END", None, None),
        ("CUSTOM", "runlog.message_reset", 2), ("CUSTOM", "runlog.tool_args_delta", 3),
        ("CUSTOM", "runlog.tool_call_end", 4), ("RUN_FINISHED", None, 5)]  # fmt: skip


def test_iso_ms() -> None:
    assert iso_ms(EXPIRES + 5) == "2026-01-01T00:00:00.005Z"
