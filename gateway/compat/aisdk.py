"""The AI SDK UI message stream (npm `ai`: `useChat`, `AbstractChat` with
`DefaultChatTransport`), projected from a run's log (docs/compat.md).

One run is one assistant message whose id is the run id. Contract of the
projection (what the chunks mean to the client, and why):

- A full answer (cursor 0) opens with `start{messageId: run_id}` and
  `start-step` at `run_start`. The client's `resumeStream()` treats its GET
  as a replay: the first `start` resets the message and the chunks rebuild
  it, so that answer must be the whole run (it is: seq 1 on).
- A continuation (a cursor, or the answer to an approval) opens with
  `start{messageId}` only: it continues the client's message and its current
  step. It re-opens the spans open at the cursor with the same ids
  (`text-start`, `reasoning-start`; a tool call's `tool-input-start` followed
  by its argument text so far, since the client's start resets it).
- Each model turn after a tool result is a new step (`finish-step`,
  `start-step`): the client's `lastAssistantMessageIsComplete...` helpers look
  at the last step only.
- Tools are `dynamic` and `providerExecuted`: runlog runs them, the client's
  `onToolCall` is never asked.
- An undecided `approval_required` ends the answer with the client's native
  interrupt: `tool-approval-request`, `finish-step`,
  `finish{finishReason: "tool-calls"}`. A decided one streams inline with its
  `tool-approval-response`.
- `message_reset` drops the message's text with `reset-step` (which empties
  the current step) and re-sends what else that step held, when the step
  holds only text and reasoning (what runlog's agent loop produces: the reset
  comes before the turn's first tool call); either way a transient
  `data-runlog-message-reset` tells `onData`.
- runlog-only events are transient `data-runlog-*` chunks (they reach
  `onData`, not the message): an unknown `type` fails the client's chat.
  A tool call the log never started gets no tool chunk for the same reason
  (the client fails on a tool call id it has no part for).
- The end: `finish-step`, `finish{finishReason, messageMetadata.runlog}`
  (stop / other / error for completed / aborted / failed). A `run_error` is
  an `error{errorText: "code: message"}` chunk first (the chat's status
  becomes `error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from broker import events

from .base import Context, Projection, Wire, json
from .spans import Close, Open, Span, Transition, joined

Chunk = dict[str, object]

FINISH_REASONS = {"completed": "stop", "aborted": "other", "failed": "error"}
_TOOL: Chunk = {"dynamic": True, "providerExecuted": True}
_json_decoder = msgspec.json.Decoder()


@dataclass
class _Part:
    """A text or reasoning part of the current step, as the client holds it.
    Its text is kept in the deltas' pieces (`spans.joined`)."""

    kind: str
    id: str
    pieces: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return joined(self.pieces)


@dataclass(slots=True)
class _Step:
    new: bool  # this event opens a new step (a turn after a tool result)
    transitions: list[Transition]
    kept: list[_Part] | None = None  # a reset-step's survivors (None: no reset-step)


@dataclass
class _State:
    parts: list[_Part] = field(default_factory=list)  # text and reasoning of the current step
    has_tool: bool = False  # the current step holds a tool call
    resulted: set[str] = field(default_factory=set)  # tool calls with a result
    requested: set[str] = field(default_factory=set)  # approvals the client has a part for


def _data(name: str, data: Mapping[str, object]) -> Chunk:
    return {"type": f"data-runlog-{name}", "data": data, "transient": True}


class AiSdkProjection(Projection):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self._opened = False  # `start` is out
        self._st = _State()
        self._head_id: str | None = None  # the message whose text-delta head is kept
        self._head = b""

    # -- the state change of every event, tracked or fed

    def _apply(self, ev: events.Event) -> _Step:
        st = self._st
        before = self.spans.step
        step = _Step(False, self.spans.advance(ev))
        if self.spans.step > before:
            step.new = before > 0
            st.parts, st.has_tool = [], False
        for t in step.transitions:
            if isinstance(t, Open) and t.span.kind != "tool":
                st.parts.append(_Part(t.span.kind, t.span.id))
        match ev:
            case events.TextDelta() | events.ReasoningDelta():
                st.parts[-1].pieces.append(ev.delta)
            case events.MessageReset():
                kept = [p for p in st.parts if (p.kind, p.id) != ("text", ev.message_id)]
                if len(kept) < len(st.parts) and not st.has_tool:
                    st.parts = step.kept = kept
            case events.ToolCallStart():
                st.has_tool = True
            case events.ToolResult():
                st.resulted.add(ev.tool_call_id)
            case events.ApprovalRequired():
                if ev.tool_call_id in self.spans.tool_names:
                    st.requested.add(ev.approval_id)
            case events.ApprovalDecided():
                self.ctx.decided.add(ev.approval_id)
        return step

    def track(self, ev: events.Event) -> None:
        self._apply(ev)

    # -- the answer

    def start(self) -> list[Wire]:
        if self.spans.last_seq == 0:
            return []  # a full answer: `run_start` opens it
        self._opened = True
        out = [self._start_chunk()]
        for span in self.spans.open_now():
            out += self._reopen(span)
        return [Wire(json(c)) for c in out]

    def feed(self, ev: events.Event) -> list[Wire]:
        if self._opened and self.spans.continues_text(ev):
            # The common case (what the general path below makes of it, and
            # how `_apply` keeps it): one text-delta chunk, the part's text.
            assert isinstance(ev, events.TextDelta)
            self.spans.advance(ev)
            self._st.parts[-1].pieces.append(ev.delta)
            return [Wire(self._text_delta(ev.message_id, ev.delta), ev.seq)]
        step = self._apply(ev)
        out: list[Chunk] = []
        if not self._opened:
            self._opened = True
            out += [self._start_chunk(), {"type": "start-step"}]
        for t in step.transitions:
            if isinstance(t, Close):
                out += self._close(t.span, ev)
        if step.new:
            out += [{"type": "finish-step"}, {"type": "start-step"}]
        for t in step.transitions:
            if isinstance(t, Open) and t.span.kind != "tool":
                out.append({"type": f"{t.span.kind}-start", "id": t.span.id})
        out += self._render(ev, step)
        if not out:
            return []
        wires = [Wire(json(c)) for c in out[:-1]]
        wires.append(Wire(json(out[-1]), ev.seq))
        return wires

    def _text_delta(self, message_id: str, delta: str) -> bytes:
        """`json({"type": "text-delta", "id": message_id, "delta": delta})`,
        byte for byte, its head made once per message."""
        if message_id != self._head_id:
            self._head_id = message_id
            self._head = b'{"type":"text-delta","id":' + json(message_id) + b',"delta":'
        return self._head + json(delta) + b"}"

    def _start_chunk(self) -> Chunk:
        meta = {"run_id": self.ctx.run_id, "session_id": self.ctx.session_id}
        return {"type": "start", "messageId": self.ctx.run_id, "messageMetadata": {"runlog": meta}}

    def _reopen(self, span: Span) -> list[Chunk]:
        if span.kind != "tool":
            return [{"type": f"{span.kind}-start", "id": span.id}]
        out = [_tool_start(span.id, span.name, span.risk_level)]
        if span.args:  # the client's tool-input-start forgets the text so far
            out.append({"type": "tool-input-delta", "toolCallId": span.id,
                        "inputTextDelta": span.args})  # fmt: skip
        return out

    def _close(self, span: Span, ev: events.Event) -> list[Chunk]:
        if span.kind != "tool":
            return [{"type": f"{span.kind}-end", "id": span.id}]
        head: Chunk = {"toolCallId": span.id, "toolName": span.name, **_TOOL}
        if not isinstance(ev, events.ToolCallEnd):
            # The run ended mid-call; its result (skipped) may be out already.
            if span.id in self._st.resulted:
                return []
            return [{"type": "tool-input-error", **head, "input": span.args,
                     "errorText": "the run ended before the tool call's arguments did"}]  # fmt: skip
        try:
            args = _json_decoder.decode(span.args) if span.args.strip() else {}
        except msgspec.DecodeError:
            return [{"type": "tool-input-error", **head, "input": span.args,
                     "errorText": "the tool call's arguments are not JSON"}]  # fmt: skip
        return [{"type": "tool-input-available", **head, "input": args}]

    def _render(self, ev: events.Event, step: _Step) -> list[Chunk]:
        match ev:
            case events.TextDelta():
                return [{"type": "text-delta", "id": ev.message_id, "delta": ev.delta}]
            case events.ReasoningDelta():
                return [{"type": "reasoning-delta", "id": ev.message_id, "delta": ev.delta}]
            case events.MessageReset():
                out = [] if step.kept is None else self._redo_step(step.kept)
                return [*out, _data("message-reset", {"message_id": ev.message_id})]
            case events.Status():
                return [_data("status", {"code": ev.code, "summary": ev.summary})]
            case events.Progress():
                return [_data("progress", {"label": ev.label, "done": ev.done, "total": ev.total})]
            case events.InterruptRequested():
                who = {"requested_by": ev.requested_by, "reason": ev.reason}
                return [_data("interrupt-requested", who)]
            case events.ToolCallStart():
                return [_tool_start(ev.tool_call_id, ev.tool_name, ev.risk_level)]
            case events.ToolArgsDelta():
                if ev.tool_call_id not in self.spans.tools:
                    return []  # no open call to stream into (the client would fail)
                return [{"type": "tool-input-delta", "toolCallId": ev.tool_call_id,
                         "inputTextDelta": ev.partial_json}]  # fmt: skip
            case events.ToolResult():
                return [self._result(ev)]
            case events.ApprovalRequired():
                return self._approval(ev)
            case events.ApprovalDecided():
                return [self._decided(ev)]
            case events.RunError():
                return [{"type": "error", "errorText": f"{ev.code}: {ev.message}"}]
            case events.RunEnd():
                self.done = True
                runlog: Chunk = {"status": ev.status}
                if ev.usage is not None:
                    runlog["usage"] = msgspec.to_builtins(ev.usage)
                if ev.stop is not None:
                    runlog["stop"] = msgspec.to_builtins(ev.stop)
                reason = FINISH_REASONS.get(ev.status, "other")
                return [{"type": "finish-step"}, _finish(reason, runlog)]
        return []  # run_start (the envelope), tool_call_end (its close)

    def _redo_step(self, kept: list[_Part]) -> list[Chunk]:
        """`reset-step` empties the client's current step: send back what the
        step keeps, leaving the open message open."""
        out: list[Chunk] = [{"type": "reset-step"}]
        m = self.spans.message
        for i, p in enumerate(kept):
            out.append({"type": f"{p.kind}-start", "id": p.id})
            if p.text:
                out.append({"type": f"{p.kind}-delta", "id": p.id, "delta": p.text})
            still_open = i == len(kept) - 1 and m is not None and (m.kind, m.id) == (p.kind, p.id)
            if not still_open:
                out.append({"type": f"{p.kind}-end", "id": p.id})
        return out

    def _result(self, ev: events.ToolResult) -> Chunk:
        call = ev.tool_call_id
        if call not in self.spans.tool_names:
            return _data("tool-result", {"tool_call_id": call, "status": ev.status,
                                         "summary": ev.summary})  # fmt: skip
        if ev.status == "ok":
            output = {"status": ev.status, "summary": ev.summary, "output": ev.output}
            return {"type": "tool-output-available", "toolCallId": call, "output": output, **_TOOL}
        if ev.status == "denied":
            return {"type": "tool-output-denied", "toolCallId": call}
        return {"type": "tool-output-error", "toolCallId": call,
                "errorText": ev.summary or ev.status, **_TOOL}  # fmt: skip

    def _approval(self, ev: events.ApprovalRequired) -> list[Chunk]:
        if ev.approval_id in self._st.requested:
            chunk: Chunk = {"type": "tool-approval-request", "approvalId": ev.approval_id,
                            "toolCallId": ev.tool_call_id}  # fmt: skip
            if ev.summary:
                chunk["reason"] = ev.summary
        else:
            chunk = _data("approval-required", {"approval_id": ev.approval_id,
                                                "tool_call_id": ev.tool_call_id,
                                                "summary": ev.summary})  # fmt: skip
        if ev.approval_id in self.ctx.decided:
            return [chunk]
        # Undecided: the answer ends with the client's interrupt; the chat's
        # own answer (POST) continues the run from here.
        self.done = True
        # (The client merges metadata: nothing here that the end would not overwrite.)
        return [
            chunk,
            {"type": "finish-step"},
            _finish("tool-calls", {"status": "waiting_approval"}),
        ]

    def _decided(self, ev: events.ApprovalDecided) -> Chunk:
        if ev.approval_id not in self._st.requested:
            return _data("approval-decided", {"approval_id": ev.approval_id,
                                              "decision": ev.decision})  # fmt: skip
        chunk: Chunk = {"type": "tool-approval-response", "approvalId": ev.approval_id,
                        "approved": ev.decision == "approve", "providerExecuted": True}  # fmt: skip
        reason = "expired" if ev.decision == "expired" else ev.comment
        if reason:
            chunk["reason"] = reason
        return chunk


def _tool_start(call_id: str, name: str, risk_level: str) -> Chunk:
    return {"type": "tool-input-start", "toolCallId": call_id, "toolName": name,
            "toolMetadata": {"runlog": {"risk_level": risk_level}}, **_TOOL}  # fmt: skip


def _finish(reason: str, runlog: Mapping[str, object]) -> Chunk:
    return {"type": "finish", "finishReason": reason, "messageMetadata": {"runlog": runlog}}
