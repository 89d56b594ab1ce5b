"""OpenAI chat completion chunks with `extra.kind` (seed S3, FDR-009): a projection.

Every chunk is `{"id": "chatcmpl-<run_id>", "object": "chat.completion.chunk",
"created": <run start, s>, "model": <run model>, "choices": [...], "extra":
{"kind", ..., "seq", "run_id"}}`, so any OpenAI-compatible parser takes it,
and `extra` carries what the format has no place for:

- `delta.content` is the run's text, `delta.reasoning_content` ONLY real
  model thinking (`reasoning_delta`), never status or tool text.
- Tool calls ride the standard `delta.tool_calls`, so the SDK's accumulator
  assembles them. A call's `index` is its place among the run's tool calls
  (0, 1, 2, ... in start order), the same in every answer: a client that
  resumes keeps what it assembled and appends to it. runlog runs the tools
  itself, so `finish_reason` is always "stop", never "tool_calls".
- status, progress, tool ends and results, approvals, stops and resets are
  `choices: []` chunks whose `extra` says what happened (`kind` is one of
  status, tool_call, tool_result, confirm_request, reasoning_text,
  assistant_text).
- `extra.seq` is the cursor. Only the last chunk of an event carries it;
  the chunks this module makes up (the `resume` status at the start of a
  resumed answer, the finish chunk before the usage chunk) carry none.
- `run_end`: a `finish_reason: "stop"` chunk, then, when the request asked
  for `stream_options.include_usage`, a `choices: []` chunk with `usage`.
  The serving layer then writes `data: [DONE]`.
- `run_error`: the frame is `{"error": {...}}` (the SDK raises `APIError`
  with it) and the answer ends there.
- A resumed answer re-sends nothing from before its cursor (every chunk
  already carries the envelope, and re-sending a tool call's id or name would
  double them in any accumulator, which concatenates strings). It starts
  with one `status` chunk, code `resume`, listing what is open at the cursor,
  for a client that renders from `extra`.
- Approvals are not in the protocol: `approval_required` is a
  `confirm_request` chunk naming the native decision endpoint, and the same
  answer goes on once someone decides there. Nothing here ends an answer but
  the run's end or error.
"""

from __future__ import annotations

from broker import events

from .base import Context, Projection, Wire, json

OBJECT = b"chat.completion.chunk"

_D = dict[str, object]


class OpenAIChunks(Projection):
    """Options (`Context.options`): `include_usage` (bool): the request's
    `stream_options.include_usage`."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.include_usage = bool(ctx.options.get("include_usage", False))
        self.index: dict[str, int] = {}  # tool_call_id -> its index among the run's calls
        self._first_ts = 0
        self._head = b""  # the chunk's opening, up to `"choices":`, built once
        self._tail = b',"run_id":' + json(ctx.run_id) + b"}}"
        # A delta's chunk around its text and seq, for the last (kind, message) seen.
        self._around_key: tuple[str, str] | None = None
        self._around = (b"", b"", b"")

    # -- Projection

    def track(self, ev: events.Event) -> None:
        super().track(ev)
        self._note(ev)

    def start(self) -> list[Wire]:
        if self.spans.last_seq == 0:
            return []
        open_ = [
            {"type": sp.kind, "id": sp.id, "index": self.index[sp.id], "name": sp.name}
            if sp.kind == "tool"
            else {"type": sp.kind, "id": sp.id}
            for sp in self.spans.open_now()
        ]
        status = {"code": "resume", "after": self.spans.last_seq, "open": open_}
        return [Wire(self._chunk(b"[]", b'"status","status":' + json(status), None))]

    def feed(self, ev: events.Event) -> list[Wire]:
        self.spans.advance(ev)
        self._note(ev)
        seq = ev.seq
        match ev:
            case events.RunStart():
                status: _D = {
                    "code": "run_start",
                    "trace_id": ev.trace_id,
                    "model": ev.model,
                    "started_by": ev.started_by,
                }
                return [
                    self._wire(
                        _delta(b'{"role":"assistant","content":""}'),
                        "status",
                        {"status": status},
                        seq,
                    )
                ]
            case events.TextDelta():
                return [self._message_delta("assistant_text", b"content", ev)]
            case events.ReasoningDelta():
                return [self._message_delta("reasoning_text", b"reasoning_content", ev)]
            case events.ToolCallStart():
                call: _D = {
                    "index": self.index[ev.tool_call_id],
                    "id": ev.tool_call_id,
                    "type": "function",
                    "function": {"name": ev.tool_name, "arguments": ""},
                }
                tool: _D = {
                    "id": ev.tool_call_id,
                    "name": ev.tool_name,
                    "status": "start",
                    "risk_level": ev.risk_level,
                }
                return [self._wire(_delta(_tool_calls(call)), "tool_call", {"tool": tool}, seq)]
            case events.ToolArgsDelta():
                call = {
                    "index": self.index[ev.tool_call_id],
                    "function": {"arguments": ev.partial_json},
                }
                tool = {
                    "id": ev.tool_call_id,
                    "name": self._name(ev.tool_call_id),
                    "status": "arguments",
                }
                return [self._wire(_delta(_tool_calls(call)), "tool_call", {"tool": tool}, seq)]
            case events.ToolCallEnd():
                tool = {
                    "id": ev.tool_call_id,
                    "name": self._name(ev.tool_call_id),
                    "status": "ready",
                    "arguments": self.spans.tool_args.get(ev.tool_call_id, ""),
                }
                return [self._wire(b"[]", "tool_call", {"tool": tool}, seq)]
            case events.ToolResult():
                tool = {
                    "id": ev.tool_call_id,
                    "name": self._name(ev.tool_call_id),
                    "status": ev.status,
                    "summary": ev.summary,
                    "output": ev.output,
                }
                return [self._wire(b"[]", "tool_result", {"tool": tool}, seq)]
            case events.ApprovalRequired():
                path = f"/v1/runs/{self.ctx.run_id}/approvals/{ev.approval_id}"
                confirm = {
                    "approval_id": ev.approval_id,
                    "tool_call_id": ev.tool_call_id,
                    "tool_name": self._name(ev.tool_call_id),
                    "summary": ev.summary,
                    "expires_at": ev.expires_at,
                    "decide": {"method": "POST", "path": path},
                }
                return [self._wire(b"[]", "confirm_request", {"confirm": confirm}, seq)]
            case events.RunError():
                self.done = True
                error = {
                    "message": ev.message or ev.code,
                    "type": "runlog_error",
                    "code": ev.code,
                    "retryable": ev.retryable,
                    "seq": seq,
                    "run_id": self.ctx.run_id,
                }
                return [Wire(json({"error": error}), seq)]
            case events.RunEnd():
                self.done = True
                return self._end(ev)
            case _:
                status = _status(ev)
                return [self._wire(b"[]", "status", {"status": status}, seq)]

    # -- chunks

    def _end(self, ev: events.RunEnd) -> list[Wire]:
        status: _D = {"code": "run_end", "run_status": ev.status}
        if ev.stop is not None:
            status["stop"] = ev.stop
        finish = b'[{"index":0,"delta":{},"finish_reason":"stop"}]'
        last = None if self.include_usage else ev.seq
        out = [self._wire(finish, "status", {"status": status}, last)]
        if self.include_usage:
            u = ev.usage or events.Usage()
            usage = {
                "prompt_tokens": u.input_tokens,
                "completion_tokens": u.output_tokens,
                "total_tokens": u.input_tokens + u.output_tokens,
                "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            }
            extra = b'"status","status":{"code":"usage"}'
            out.append(Wire(self._chunk(b"[]", extra, ev.seq, json(usage)), ev.seq))
        return out

    def _wire(self, choices: bytes, kind: str, fields: dict[str, object], seq: int | None) -> Wire:
        return Wire(self._chunk(choices, _extra(kind, fields), seq), seq)

    def _message_delta(
        self, kind: str, field: bytes, ev: events.TextDelta | events.ReasoningDelta
    ) -> Wire:
        """`self._wire(_delta({field: ev.delta}), kind, {"message_id": ...}, ev.seq)`,
        byte for byte, with what surrounds the delta and the seq made once
        per message (deltas are the replay's hot path)."""
        key = (kind, ev.message_id)
        if key != self._around_key:
            whole = self._chunk(_delta(b'{"' + field + b'":""}'),
                                _extra(kind, {"message_id": ev.message_id}), 0)  # fmt: skip
            at = len(self._head) + len(b'[{"index":0,"delta":{"') + len(field) + len(b'":')
            seq_at = len(whole) - len(self._tail) - 1  # the 0
            self._around_key = key
            self._around = (whole[:at], whole[at + 2 : seq_at], self._tail)
        before, between, after = self._around
        return Wire(b"%b%b%b%d%b" % (before, json(ev.delta), between, ev.seq, after), ev.seq)

    def _chunk(self, choices: bytes, extra: bytes, seq: int | None, usage: bytes = b"") -> bytes:
        """A chunk from its `choices` JSON, the inside of `extra` after
        `"kind":` and, for the last chunk of a run, its `usage` JSON."""
        if not self._head:
            rs = self.spans.run_start
            created = (rs.ts if rs is not None else self._first_ts) // 1000
            model = rs.model if rs is not None else ""
            self._head = b"".join(
                (
                    b'{"id":',
                    json("chatcmpl-" + self.ctx.run_id),
                    b',"object":"',
                    OBJECT,
                    b'","created":',
                    str(created).encode(),
                    b',"model":',
                    json(model),
                    b',"choices":',
                )
            )
        cursor = b"" if seq is None else b',"seq":' + str(seq).encode()
        usage = b',"usage":' + usage if usage else b""
        return b"".join(
            (self._head, choices, usage, b',"extra":{"kind":', extra, cursor, self._tail)
        )

    def _note(self, ev: events.Event) -> None:
        if not self._first_ts:
            self._first_ts = ev.ts
        if isinstance(ev, events.ToolCallStart | events.ToolArgsDelta):
            self.index.setdefault(ev.tool_call_id, len(self.index))

    def _name(self, tool_call_id: str) -> str:
        return self.spans.tool_names.get(tool_call_id, "")


def _extra(kind: str, fields: dict[str, object]) -> bytes:
    """The inside of a chunk's `extra` after `"kind":`."""
    return json(kind) + b"," + json(fields)[1:-1]


def _delta(delta: bytes) -> bytes:
    return b'[{"index":0,"delta":' + delta + b',"finish_reason":null}]'


def _tool_calls(call: dict[str, object]) -> bytes:
    return b'{"tool_calls":[' + json(call) + b"]}"


def _status(ev: events.Event) -> dict[str, object]:
    """A runlog-only event as `extra.status`: its code (a `status` event's
    own, else the event type) and its fields."""
    match ev:
        case events.Status():
            return {"code": ev.code, "summary": ev.summary}
        case events.Progress():
            return {"code": "progress", "label": ev.label, "done": ev.done, "total": ev.total}
        case events.ApprovalDecided():
            return {
                "code": "approval_decided",
                "approval_id": ev.approval_id,
                "decision": ev.decision,
                "decided_by": ev.decided_by,
                "comment": ev.comment,
            }
        case events.InterruptRequested():
            return {
                "code": "interrupt_requested",
                "requested_by": ev.requested_by,
                "reason": ev.reason,
            }
        case events.MessageReset():
            return {"code": "message_reset", "message_id": ev.message_id}
    return {"code": type(ev).__struct_config__.tag}
