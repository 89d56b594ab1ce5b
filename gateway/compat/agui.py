"""AG-UI 1.0 (what `@ag-ui/client`'s HttpAgent reads): the projection.

Mapping (docs/compat.md, "AG-UI"; the contract is ../shared/compat/agui.md):

| runlog | AG-UI |
|---|---|
| (every answer's start) | `RUN_STARTED{threadId: session, runId: the input's runId}`, then the spans open at the cursor re-opened with the same ids |
| run_start | `CUSTOM runlog.run_start` |
| text_delta | `TEXT_MESSAGE_START` (first delta) / `TEXT_MESSAGE_CONTENT` / `TEXT_MESSAGE_END` |
| reasoning_delta | `REASONING_START` + `REASONING_MESSAGE_START` / `REASONING_MESSAGE_CONTENT` / `…_END` + `REASONING_END`, messageId `<id>:reasoning` |
| tool_call_start / tool_args_delta / tool_call_end | `TOOL_CALL_START` / `TOOL_CALL_ARGS` / `TOOL_CALL_END` |
| tool_result | `TOOL_CALL_RESULT{messageId: <id>:result, role: tool}` |
| approval_required, undecided | spans closed, `RUN_FINISHED{outcome: interrupt}`: the answer ends |
| approval_required, decided | `CUSTOM runlog.approval_required` |
| approval_decided, status, progress, message_reset, interrupt_requested | `CUSTOM runlog.<type>` |
| run_error | `RUN_ERROR{message, code}` |
| run_end | `RUN_FINISHED{outcome: success \\| cancelled}` (aborted: cancelled), or `RUN_ERROR` (failed) |

The AG-UI event that completes runlog event N carries `metadata.runlog.seq
= N` (the reducer folds it into the message or tool call it changes, so a
client resumes from what it applied); synthesised opens and closes carry no
seq. A reasoning message gets its own id (`<message_id>:reasoning`): the
client appends text into a reasoning message of the same id.
"""

from __future__ import annotations

import datetime
from typing import Any

from broker import events

from .base import Context, Projection, Wire, json
from .spans import Open, Span, Transition

Item = dict[str, Any]

# What `resume[].payload` may carry (published in every interrupt).
RESPONSE_SCHEMA: Item = {
    "type": "object",
    "properties": {
        "decision": {"enum": ["approve", "reject"]},
        "comment": {"type": "string", "maxLength": 4000},
    },
    "additionalProperties": False,
}


def reasoning_id(message_id: str) -> str:
    return message_id + ":reasoning"


def iso_ms(ms: int) -> str:
    """Milliseconds since the epoch as an ISO 8601 UTC instant (what expiresAt is)."""
    t = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AgUi(Projection):
    """`ctx.options["agui_run_id"]`: the runId of the RunAgentInput answered
    (RUN_STARTED and RUN_FINISHED carry it; default: the runlog run id)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.agui_run_id = str(ctx.options.get("agui_run_id") or ctx.run_id)

    # -- the answer's envelope

    def start(self) -> list[Wire]:
        s = self.spans
        meta = {"runlog": {"run_id": self.ctx.run_id, "session_id": self.ctx.session_id,
                           "after": s.last_seq}}  # fmt: skip
        out = [self._item({"type": "RUN_STARTED", **self._ids(), "metadata": meta})]
        for span in s.open_now():
            out += self._open(span)
        if not s.ended:
            waiting = [
                a for a in s.pending_approvals.values() if a.approval_id not in self.ctx.decided
            ]
            if waiting:  # resumed at an approval nobody decided yet: ask again
                out += self._interrupt(waiting, None)
        return out

    # -- one event

    def feed(self, ev: events.Event) -> list[Wire]:
        trans = self.spans.advance(ev)
        seq = ev.seq
        match ev:
            case events.TextDelta():
                out = self._transitions(trans)
                if ev.delta:  # AG-UI refuses an empty delta
                    out.append(self._item({"type": "TEXT_MESSAGE_CONTENT",
                                           "messageId": ev.message_id, "delta": ev.delta}, seq))  # fmt: skip
                return out
            case events.ReasoningDelta():
                out = self._transitions(trans)
                if ev.delta:
                    out.append(self._item({"type": "REASONING_MESSAGE_CONTENT",
                                           "messageId": reasoning_id(ev.message_id),
                                           "delta": ev.delta}, seq))  # fmt: skip
                return out
            case events.ToolCallStart():
                out = self._transitions([t for t in trans if not isinstance(t, Open)])
                out.append(self._item(self._tool_start(ev.tool_call_id, ev.tool_name), seq))
                return out
            case events.ToolArgsDelta():
                if ev.tool_call_id in self.spans.tools:
                    return [self._item({"type": "TOOL_CALL_ARGS", "toolCallId": ev.tool_call_id,
                                        "delta": ev.partial_json}, seq)]  # fmt: skip
                return [self._custom("tool_args_delta", {"tool_call_id": ev.tool_call_id,
                                                         "partial_json": ev.partial_json}, seq)]  # fmt: skip
            case events.ToolCallEnd():
                if trans:  # it was open
                    return [
                        self._item({"type": "TOOL_CALL_END", "toolCallId": ev.tool_call_id}, seq)
                    ]
                return [self._custom("tool_call_end", {"tool_call_id": ev.tool_call_id}, seq)]
            case events.ToolResult():
                out = self._transitions(trans)
                content = ev.output if ev.output is not None else ev.summary
                out.append(self._item({
                    "type": "TOOL_CALL_RESULT", "messageId": ev.tool_call_id + ":result",
                    "toolCallId": ev.tool_call_id, "content": content, "role": "tool",
                }, seq, status=ev.status))  # fmt: skip
                return out
            case events.ApprovalRequired():
                out = self._transitions(trans)
                if ev.approval_id in self.ctx.decided:
                    out.append(self._custom("approval_required", {
                        "approval_id": ev.approval_id, "tool_call_id": ev.tool_call_id,
                        "summary": ev.summary, "expires_at": ev.expires_at,
                    }, seq))  # fmt: skip
                    return out
                return out + self._interrupt([ev], seq)
            case events.ApprovalDecided():
                return [self._custom("approval_decided", {
                    "approval_id": ev.approval_id, "decision": ev.decision,
                    "decided_by": ev.decided_by, "comment": ev.comment,
                }, seq)]  # fmt: skip
            case events.RunStart():
                return [self._custom("run_start", {
                    "run_id": self.ctx.run_id, "trace_id": ev.trace_id, "model": ev.model,
                    "started_by": ev.started_by,
                }, seq)]  # fmt: skip
            case events.Status():
                return [self._custom("status", {"code": ev.code, "summary": ev.summary}, seq)]
            case events.Progress():
                return [self._custom("progress", {"label": ev.label, "done": ev.done,
                                                  "total": ev.total}, seq)]  # fmt: skip
            case events.MessageReset():
                # AG-UI cannot retract streamed text: the app is told, in the extension slot.
                out = self._transitions(trans)
                out.append(self._custom("message_reset", {"message_id": ev.message_id}, seq))
                return out
            case events.InterruptRequested():
                return [self._custom("interrupt_requested", {"requested_by": ev.requested_by,
                                                             "reason": ev.reason}, seq)]  # fmt: skip
            case events.RunError():
                self.done = True
                out = self._transitions(trans)
                out.append(self._item({"type": "RUN_ERROR", "message": ev.message or ev.code,
                                       "code": ev.code}, seq))  # fmt: skip
                return out
            case events.RunEnd():
                self.done = True
                out = self._transitions(trans)
                out.append(self._item(self._finished(ev), seq))
                return out
        return []

    # -- pieces

    def _ids(self) -> Item:
        return {"threadId": self.ctx.session_id, "runId": self.agui_run_id}

    def _item(self, item: Item, seq: int | None = None, **meta: object) -> Wire:
        if seq is not None:
            item["metadata"] = {"runlog": {"seq": seq, **meta}}
        return Wire(json(item), seq)

    def _custom(self, name: str, value: Item, seq: int | None) -> Wire:
        return self._item({"type": "CUSTOM", "name": "runlog." + name, "value": value}, seq)

    def _tool_start(self, tool_call_id: str, name: str) -> Item:
        item: Item = {"type": "TOOL_CALL_START", "toolCallId": tool_call_id, "toolCallName": name}
        if self.spans.last_text_id is not None:
            item["parentMessageId"] = self.spans.last_text_id
        return item

    def _open(self, span: Span) -> list[Wire]:
        if span.kind == "text":
            return [self._item({"type": "TEXT_MESSAGE_START", "messageId": span.id,
                                "role": "assistant"})]  # fmt: skip
        if span.kind == "reasoning":
            rid = reasoning_id(span.id)
            return [self._item({"type": "REASONING_START", "messageId": rid}),
                    self._item({"type": "REASONING_MESSAGE_START", "messageId": rid,
                                "role": "reasoning"})]  # fmt: skip
        return [self._item(self._tool_start(span.id, span.name))]

    def _close(self, span: Span) -> list[Wire]:
        if span.kind == "text":
            return [self._item({"type": "TEXT_MESSAGE_END", "messageId": span.id})]
        if span.kind == "reasoning":
            rid = reasoning_id(span.id)
            return [self._item({"type": "REASONING_MESSAGE_END", "messageId": rid}),
                    self._item({"type": "REASONING_END", "messageId": rid})]  # fmt: skip
        return [self._item({"type": "TOOL_CALL_END", "toolCallId": span.id})]

    def _transitions(self, trans: list[Transition]) -> list[Wire]:
        out: list[Wire] = []
        for t in trans:
            out += self._open(t.span) if isinstance(t, Open) else self._close(t.span)
        return out

    def _interrupt(self, waiting: list[events.ApprovalRequired], seq: int | None) -> list[Wire]:
        """Close what is open, then the terminal interrupt: the answer ends."""
        self.done = True
        out = self._transitions(self.spans.close_all())
        out.append(self._item({"type": "RUN_FINISHED", **self._ids(), "outcome": {
            "type": "interrupt", "interrupts": [self._interrupt_item(a) for a in waiting],
        }}, seq))  # fmt: skip
        return out

    def _interrupt_item(self, a: events.ApprovalRequired) -> Item:
        s = self.spans
        item: Item = {
            "id": a.approval_id,
            "reason": "tool_approval",
            "toolCallId": a.tool_call_id,
            "message": a.summary,
            "responseSchema": RESPONSE_SCHEMA,
            "metadata": {"runlog": {"tool_name": s.tool_names.get(a.tool_call_id, ""),
                                    "arguments": s.tool_args.get(a.tool_call_id, "")}},
        }  # fmt: skip
        if a.expires_at:
            item["expiresAt"] = iso_ms(a.expires_at)
        return item

    def _finished(self, ev: events.RunEnd) -> Item:
        if ev.status == "failed":
            return {"type": "RUN_ERROR", "message": "the run failed", "code": "run_failed"}
        outcome = "cancelled" if ev.status == "aborted" else "success"
        item: Item = {"type": "RUN_FINISHED", **self._ids(), "outcome": {"type": outcome}}
        if ev.usage is not None:
            usage: Item = {"inputTokens": ev.usage.input_tokens,
                           "outputTokens": ev.usage.output_tokens,
                           "reasoningTokens": ev.usage.reasoning_tokens}  # fmt: skip
            rs = self.spans.run_start
            if rs is not None and rs.model:
                usage["model"] = rs.model
            item["usage"] = [usage]
        return item
