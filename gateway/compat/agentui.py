"""AgentUiEvent (seed S0): the camelCase events of a fetch + ReadableStream
front end, from the log.

Every frame is one JSON object on a `data:` line with `type` and `runId`,
plus `seq` (the runlog seq it completes: the cursor for
`GET …/runs/{id}/events?after=seq`). Each runlog event is exactly one frame:

| runlog | AgentUiEvent |
|---|---|
| run_start | `run_start{runId, traceId, sessionId}` |
| text_delta | `text_delta{runId, messageId, delta}` |
| tool_call_start | `tool_call_start{runId, toolCallId, toolName, riskLevel}` |
| tool_args_delta | `tool_args_delta{runId, toolCallId, partialJson}` (appended per toolCallId) |
| approval_required | `approval_required{runId, approvalId, toolCallId, summary, expiresAt}` |
| run_error | `run_error{runId, code, retryable, message}` |
| run_end | `run_end{runId, status}` (completed / aborted / failed); the answer ends |

and, outside the seed's union (its parser ignores types it does not know),
the extensions:

| runlog | extension |
|---|---|
| message_reset | `text_reset{runId, messageId}`: drop that message's text |
| reasoning_delta | `reasoning_delta{runId, messageId, delta}` |
| status | `status{runId, code, summary}` |
| progress | `progress{runId, label, done, total}` |
| tool_call_end | `tool_call_end{runId, toolCallId}` |
| tool_result | `tool_result{runId, toolCallId, status, summary}` (+ `output` when stored) |
| approval_decided | `approval_decided{runId, approvalId, decision, decidedBy, comment}` |
| interrupt_requested | `interrupt_requested{runId, requestedBy, reason}` |

The seed's `run_end.status` `waiting_approval` is never sent: an undecided
approval keeps the answer open (heartbeat comments) until it is decided
through runlog's REST, then the run streams on. A resumed answer is just the
missing events (the seed: a reconnect only fills in events), so `start()`
sends nothing.
"""

from __future__ import annotations

from broker import events

from .base import Projection, Wire, json


class AgentUiProjection(Projection):
    def start(self) -> list[Wire]:
        return []

    def feed(self, ev: events.Event) -> list[Wire]:
        self.spans.advance(ev)
        body = self._frame(ev)
        if body is None:
            return []
        if isinstance(ev, events.ApprovalDecided):
            self.ctx.decided.add(ev.approval_id)
        if isinstance(ev, events.RunEnd):
            self.done = True
        body["seq"] = ev.seq  # last, as in every frame (a fresh dict: no copy needed)
        return [Wire(json(body), ev.seq)]

    def _frame(self, ev: events.Event) -> dict[str, object] | None:
        r = self.ctx.run_id
        match ev:
            case events.RunStart(trace_id=trace):
                return {"type": "run_start", "runId": r, "traceId": trace,
                        "sessionId": self.ctx.session_id}  # fmt: skip
            case events.TextDelta(message_id=mid, delta=delta):
                return {"type": "text_delta", "runId": r, "messageId": mid, "delta": delta}
            case events.MessageReset(message_id=mid):
                return {"type": "text_reset", "runId": r, "messageId": mid}
            case events.ReasoningDelta(message_id=mid, delta=delta):
                return {"type": "reasoning_delta", "runId": r, "messageId": mid, "delta": delta}
            case events.Status(code=code, summary=summary):
                return {"type": "status", "runId": r, "code": code, "summary": summary}
            case events.Progress(label=label, done=done, total=total):
                return {"type": "progress", "runId": r, "label": label, "done": done,
                        "total": total}  # fmt: skip
            case events.ToolCallStart(tool_call_id=cid, tool_name=name, risk_level=risk):
                return {"type": "tool_call_start", "runId": r, "toolCallId": cid,
                        "toolName": name, "riskLevel": risk}  # fmt: skip
            case events.ToolArgsDelta(tool_call_id=cid, partial_json=part):
                return {"type": "tool_args_delta", "runId": r, "toolCallId": cid,
                        "partialJson": part}  # fmt: skip
            case events.ToolCallEnd(tool_call_id=cid):
                return {"type": "tool_call_end", "runId": r, "toolCallId": cid}
            case events.ToolResult(tool_call_id=cid, status=status, summary=summary, output=out):
                res: dict[str, object] = {"type": "tool_result", "runId": r, "toolCallId": cid,
                                          "status": status, "summary": summary}  # fmt: skip
                if out is not None:
                    res["output"] = out
                return res
            case events.ApprovalRequired(approval_id=aid, tool_call_id=cid):
                return {"type": "approval_required", "runId": r, "approvalId": aid,
                        "toolCallId": cid, "summary": ev.summary,
                        "expiresAt": ev.expires_at}  # fmt: skip
            case events.ApprovalDecided(approval_id=aid, decision=decision):
                return {"type": "approval_decided", "runId": r, "approvalId": aid,
                        "decision": decision, "decidedBy": ev.decided_by,
                        "comment": ev.comment}  # fmt: skip
            case events.InterruptRequested(requested_by=by, reason=reason):
                return {"type": "interrupt_requested", "runId": r, "requestedBy": by,
                        "reason": reason}  # fmt: skip
            case events.RunError(code=code, retryable=retryable, message=message):
                return {"type": "run_error", "runId": r, "code": code, "retryable": retryable,
                        "message": message}  # fmt: skip
            case events.RunEnd(status=status):
                return {"type": "run_end", "runId": r, "status": status}
        return None
