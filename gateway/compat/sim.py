"""Sim `agent-events-v1` (seed S1): the public chat SSE of Sim, from the log.

Frames (one JSON object per `data:` line, then the literal `[DONE]`):

| runlog | frame |
|---|---|
| text_delta | `{blockId: message_id, chunk}` |
| message_reset | `{blockId: message_id, event: "chunk_reset"}` |
| reasoning_delta | `{blockId: message_id, event: "thinking", data}`: `include_thinking` only |
| tool_call_start | `{blockId: run_id, event: "tool", phase: "start", id, name}`: `include_tool_calls` only |
| tool_result | `{…, phase: "end", id, name, status}` (ok→success, error→error, denied and skipped→cancelled) |
| run_error | `{event: "error", error, code}`; the answer ends (an answer from after it: the error again, at run_end) |
| run_end | `{event: "final", data: {success, runId, status, output: {content}}}`; the answer ends |

Everything else (run_start, status, progress, tool arguments, tool_call_end,
approvals, interrupt requests) has no frame: S1 never carries tool
arguments or results, and approvals are answered through runlog's REST.
An undecided approval keeps the answer open (heartbeats) until it is
decided there.

Two cadences, chosen by the client (`negotiated`, the request header
`X-Sim-Stream-Protocol: agent-events-v1`):

- negotiated: answer text streams live, each delta as it was committed, and
  a `message_reset` retracts its message with `chunk_reset`. Thinking and
  tool frames appear only when the session's policy allows them
  (`include_thinking`, `include_tool_calls`; options of the same names).
- not negotiated ("legacy"): only *settled final-turn text*, i.e. the text
  that can never be retracted: the messages written after the run's last
  tool activity (a `tool_call_start` or `tool_result` discards what was
  buffered: that text belonged to an intermediate turn), minus reset ones,
  sent as one chunk per message when the run ends completed or aborted,
  right before `final`. A failed run sends no text, only its error. No
  thinking or tool frame is ever sent to such a client.

`final.data.output.content` is that settled final-turn text in both
cadences. Only the last frame of an event carries its seq (the legacy text
chunks belong to `run_end`, whose `final` carries the seq). A resumed answer
needs no envelope: chunks append per block, so `start()` sends nothing.
"""

from __future__ import annotations

from broker import errors, events
from broker.store import StreamPolicy

from .base import Context, Projection, Wire, json

PROTOCOL_HEADER = "X-Sim-Stream-Protocol"
PROTOCOL_V1 = "agent-events-v1"

# runlog's tool_result status -> Sim's ToolCallEndStatus. A status missing
# here is never sent: the client would reject the frame (or settle the chip
# on a guess); without an end frame the chip settles at `final`.
TOOL_STATUS = {"ok": "success", "error": "error", "denied": "cancelled", "skipped": "cancelled"}


def negotiated(header_value: str | None) -> bool:
    """Whether the request declared agent-events-v1 (comma-separated tokens,
    any case, as proxies may fold or re-case them)."""
    if not header_value:
        return False
    return PROTOCOL_V1 in (t.strip().lower() for t in header_value.split(","))


class SimProjection(Projection):
    """Options: `negotiated`, `include_thinking`, `include_tool_calls` (bools:
    the effective exposure, already checked against the session's policy)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        o = ctx.options
        self.negotiated = bool(o.get("negotiated", False))
        self.thinking = self.negotiated and bool(o.get("include_thinking", False))
        self.tools = self.negotiated and bool(o.get("include_tool_calls", False))
        # The text written since the run's last tool activity, per message in
        # the order they began: the final turn's text if nothing follows.
        self.settled: dict[str, list[str]] = {}
        self.error: events.RunError | None = None  # the run's, once seen

    def track(self, ev: events.Event) -> None:
        super().track(ev)
        self._settle(ev)

    def start(self) -> list[Wire]:
        return []

    def feed(self, ev: events.Event) -> list[Wire]:
        self.spans.advance(ev)
        self._settle(ev)
        seq = ev.seq
        match ev:
            case events.TextDelta(message_id=mid, delta=delta):
                if self.negotiated and delta:
                    return [Wire(json({"blockId": mid, "chunk": delta}), seq)]
            case events.MessageReset(message_id=mid):
                if self.negotiated:
                    return [Wire(json({"blockId": mid, "event": "chunk_reset"}), seq)]
            case events.ReasoningDelta(message_id=mid, delta=delta):
                if self.thinking and delta:
                    return [Wire(json({"blockId": mid, "event": "thinking", "data": delta}), seq)]
            case events.ToolCallStart(tool_call_id=cid, tool_name=name):
                if self.tools and cid and name:
                    return [Wire(json(self._tool("start", cid, name)), seq)]
            case events.ToolResult(tool_call_id=cid, status=status):
                name = self.spans.tool_names.get(cid, "")
                sim_status = TOOL_STATUS.get(status)
                if self.tools and cid and name and sim_status is not None:
                    return [Wire(json({**self._tool("end", cid, name), "status": sim_status}), seq)]
            case events.ApprovalDecided(approval_id=aid):
                self.ctx.decided.add(aid)
            case events.RunError():
                self.done = True
                return [Wire(self._error_frame(ev), seq)]
            case events.RunEnd(status=status):
                self.done = True
                if self.error is not None:
                    # An error is never followed by `final`: an answer that
                    # starts after it (the terminal answer of a failed run)
                    # ends with the error again.
                    return [Wire(self._error_frame(self.error), seq)]
                out = []
                if not self.negotiated and status in ("completed", "aborted"):
                    out = [
                        Wire(json({"blockId": mid, "chunk": text}))
                        for mid, text in self._settled_text()
                    ]
                data = {
                    "success": status == "completed",
                    "runId": self.ctx.run_id,
                    "status": status,
                    "output": {"content": "".join(t for _, t in self._settled_text())},
                }
                return [*out, Wire(json({"event": "final", "data": data}), seq)]
        return []

    def _tool(self, phase: str, cid: str, name: str) -> dict[str, object]:
        return {"blockId": self.ctx.run_id, "event": "tool", "phase": phase, "id": cid,
                "name": name}  # fmt: skip

    def _error_frame(self, ev: events.RunError) -> bytes:
        return json({"event": "error", "error": ev.message or ev.code, "code": ev.code})

    def _settle(self, ev: events.Event) -> None:
        match ev:
            case events.RunError():
                self.error = ev
            case events.TextDelta(message_id=mid, delta=delta):
                if delta:
                    self.settled.setdefault(mid, []).append(delta)
            case events.MessageReset(message_id=mid):
                self.settled.pop(mid, None)
            case events.ToolCallStart() | events.ToolResult():
                self.settled.clear()

    def _settled_text(self) -> list[tuple[str, str]]:
        return [(mid, "".join(parts)) for mid, parts in self.settled.items() if parts]


# -- what a request may see (checked at the edge: pure, before and after the policy read)


class ProtocolNotNegotiated(errors.ClientError):
    """Frames asked for without `X-Sim-Stream-Protocol: agent-events-v1`:
    refused, never silently downgraded to text."""

    code = "stream_protocol_required"


class FramesNotAllowed(errors.Forbidden):
    """Frames asked for that the session's policy does not expose."""

    code = "frames_not_allowed"


def check_request(negotiated: bool, thinking: bool | None, tool_calls: bool | None) -> None:
    """Before any query: a request asking for thinking or tool frames must
    have negotiated the protocol."""
    if (thinking is True or tool_calls is True) and not negotiated:
        raise ProtocolNotNegotiated(
            "includeThinking and includeToolCalls require the request header "
            f"{PROTOCOL_HEADER}: {PROTOCOL_V1}, which declares that the client understands "
            "agent-event frames",
            hint=f"send {PROTOCOL_HEADER}: {PROTOCOL_V1}, or do not ask for frames",
        )


def exposure(
    negotiated: bool, thinking: bool | None, tool_calls: bool | None, policy: StreamPolicy
) -> dict[str, object]:
    """The projection's options: each kind of frame when the session's policy
    allows it and the request did not turn it off (`False`); asking (`True`)
    for what the policy does not allow is refused."""
    check_request(negotiated, thinking, tool_calls)
    for asked, allowed, name in ((thinking, policy.include_thinking, "include_thinking"),
                                 (tool_calls, policy.include_tool_calls, "include_tool_calls")):  # fmt: skip
        if asked is True and not allowed:
            raise FramesNotAllowed(
                f"this session's policy {name} is off",
                hint="an owner may turn it on: PATCH /v1/sessions/{id}",
            )
    return {
        "negotiated": negotiated,
        "include_thinking": negotiated and policy.include_thinking and thinking is not False,
        "include_tool_calls": negotiated and policy.include_tool_calls and tool_calls is not False,
    }
