"""LangGraph Platform stream modes: a projection of a run's log
(`@langchain/langgraph-sdk` `runs.stream` / `runs.joinStream`, PyPI
`langgraph-sdk`; contract in docs/compat.md, "LangGraph").

A thread is a runlog session and a run is a runlog run. Every answer is SSE
with `event:` names: `metadata` first, then per stream mode

| runlog | event (mode) |
|---|---|
| run_start | `metadata` {run_id, thread_id, attempt} |
| text_delta | `messages` (messages-tuple): [AIMessageChunk dict {id: message_id, content}, metadata] |
| reasoning_delta | `messages`: the same message, `additional_kwargs.reasoning_content` |
| tool_call_start / tool_args_delta | `messages`: `tool_call_chunks` [{id, name, args, index}] in the turn's message |
| tool_result | `updates` {"tools": {"messages": [a ToolMessage dict]}} |
| approval_required | `updates` {"__interrupt__": [{id: approval_id, value}]}; undecided: then `end` {status: "interrupted"} and the answer ends |
| tool_call_end, message_reset, status, progress, approval_decided, interrupt_requested | `custom` {type: "runlog.<type>", ...fields} |
| run_error | `error` {error: code, message} |
| run_end | `values` (values mode) then `end` {run_id, status: success / interrupted / error} |

`values` (values mode) is the thread state `{"messages": [...]}` after each
step (a tool result, an approval, the end): the human input, the AI messages
(text, reasoning, parsed tool calls) and the tool messages. It is kept only
when asked for (it holds the run's text).

`metadata`, `error` and `end` go out whatever the modes. The frame that
completes runlog event N carries `id: N` (the cursor a reconnect sends as
`Last-Event-ID`); a filtered-out frame moves the id to the last frame kept.
Message chunks are merged by the client by message id (`AIMessageChunk.concat`:
strings joined, tool-call chunks merged by `index`), so a resumed answer
re-opens nothing but the tool calls open at its cursor (an empty-args chunk
with their id and name, harmless to merge).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from broker import errors, events

from .base import Context, Projection, Wire, json
from .spans import joined

MESSAGES_TUPLE = "messages-tuple"
MODES = frozenset({MESSAGES_TUPLE, "updates", "custom", "values"})
DEFAULT_MODES = ("values",)  # LangGraph's own default
_EVENT_MODE = {
    "messages": MESSAGES_TUPLE,
    "updates": "updates",
    "custom": "custom",
    "values": "values",
}
_END_STATUS = {"completed": "success", "aborted": "interrupted", "failed": "error"}
_HIDDEN = ("run_id", "session_id", "type")  # fields a `custom` payload leaves out
_NODE = "agent"


class UnsupportedStreamMode(errors.InvalidRequest):
    """A stream mode the LangGraph runs API has that runlog does not serve."""


def parse_modes(raw: Iterable[str], default: Iterable[str] = DEFAULT_MODES) -> frozenset[str]:
    """The stream modes asked for (`default` when none), or 400."""
    modes = [m for m in raw if m != ""] or list(default)
    bad = sorted(set(modes) - MODES)
    if bad:
        raise UnsupportedStreamMode(
            f"stream mode {bad[0][:40]!r} is not served",
            hint=f"use one or more of {', '.join(sorted(MODES))}",
        )
    return frozenset(modes)


class LangGraph(Projection):
    def __init__(self, ctx: Context, modes: frozenset[str]) -> None:
        super().__init__(ctx)
        self.modes = modes
        self._meta_sent = False
        self._turn: str | None = None  # the message the turn's tool calls belong to
        self._calls: dict[str, tuple[str, int]] = {}  # tool call -> (its message, index there)
        self._per_message: dict[str, int] = {}  # message -> tool calls in it so far
        self._state = _State(ctx) if "values" in modes else None
        # The `event:` names of the modes not asked for.
        self._dropped = frozenset(e for e, m in _EVENT_MODE.items() if m not in modes)
        # A text delta's frame around its content, for the last (message, step) seen.
        self._text_key: tuple[str, int] | None = None
        self._text_head = self._text_tail = b""

    # -- the Projection interface

    def track(self, ev: events.Event) -> None:
        super().track(ev)
        self._apply(ev)
        if isinstance(ev, events.RunStart):
            self._meta_sent = True  # a resumed answer sends its own, without an id

    def start(self) -> list[Wire]:
        if self.spans.last_seq == 0:
            return []  # run_start's `metadata` comes first (or feed sends one)
        self._meta_sent = True
        out = [self._metadata(None)]
        for span in self.spans.tools.values():
            msg, index = self._calls[span.id]
            out.append(self._chunk(msg, tool={"id": span.id, "name": span.name, "args": "",
                                              "index": index}))  # fmt: skip
        waiting = [a for a in self.spans.pending_approvals.values()
                   if a.approval_id not in self.ctx.decided]  # fmt: skip
        if waiting:
            # Joined while the run waits for a decision: the interrupt again.
            interrupt: dict[str, object] = {"__interrupt__": [self._interrupt(a) for a in waiting]}
            out.append(Wire(json(interrupt), event="updates"))
            out.extend(self._values(interrupt))
            out.append(self._end("interrupted"))
            self.done = True
        return self._keep(out, None)

    def feed(self, ev: events.Event) -> list[Wire]:
        self.spans.advance(ev)
        self._apply(ev)
        out: list[Wire] = []
        if not self._meta_sent:
            self._meta_sent = True
            if isinstance(ev, events.RunStart):
                return [self._metadata(ev.seq)]
            out.append(self._metadata(None))  # a log without run_start still opens with it
        match ev:
            case events.RunStart():
                pass  # its `metadata` went out above (only a malformed log has another)
            case events.TextDelta():
                data = self._text(ev.message_id, ev.delta)
                if not out and "messages" not in self._dropped:
                    return [Wire(data, ev.seq, "messages")]  # what `_keep` would make of it
                out.append(Wire(data, event="messages"))
            case events.ReasoningDelta():
                out.append(self._chunk(ev.message_id, reasoning=ev.delta))
            case events.ToolCallStart():
                msg, index = self._calls[ev.tool_call_id]
                out.append(self._chunk(msg, tool={"id": ev.tool_call_id, "name": ev.tool_name,
                                                  "args": "", "index": index}))  # fmt: skip
            case events.ToolArgsDelta():
                if ev.tool_call_id in self._calls:
                    msg, index = self._calls[ev.tool_call_id]
                    out.append(self._chunk(msg, tool={"id": None, "name": None,
                                                      "args": ev.partial_json, "index": index}))  # fmt: skip
            case events.ToolResult():
                out.append(Wire(json({"tools": {"messages": [self._tool_message(ev)]}}),
                                event="updates"))  # fmt: skip
                out.extend(self._values())
            case events.ApprovalRequired():
                interrupt: dict[str, object] = {"__interrupt__": [self._interrupt(ev)]}
                out.append(Wire(json(interrupt), event="updates"))
                if ev.approval_id not in self.ctx.decided:
                    out.extend(self._values(interrupt))
                    out.append(self._end("interrupted"))
                    self.done = True
            case events.RunError():
                out.append(Wire(json({"error": ev.code, "message": ev.message}), event="error"))
            case events.RunEnd():
                out.extend(self._values())
                out.append(self._end(_END_STATUS.get(ev.status, "error")))
                self.done = True
            case _:
                out.append(Wire(json(_custom(ev)), event="custom"))
        return self._keep(out, ev.seq)

    # -- state

    def _apply(self, ev: events.Event) -> None:
        """What the frames need to know of the log so far (both sides of a cursor)."""
        match ev:
            case events.TextDelta() | events.ReasoningDelta():
                self._turn = ev.message_id
            case events.MessageReset():
                if self._turn == ev.message_id:
                    self._turn = None  # its text is gone: the tool calls get their own message
            case events.ToolCallStart():
                msg = self._turn if self._turn is not None else f"{ev.tool_call_id}.message"
                n = self._per_message.get(msg, 0)
                self._per_message[msg] = n + 1
                self._calls[ev.tool_call_id] = (msg, n)
            case events.ToolResult():
                self._turn = None  # the next model turn is a new message
        if self._state is not None:
            self._state.apply(ev, self._calls)

    # -- frames

    def _keep(self, out: list[Wire], seq: int | None) -> list[Wire]:
        """The frames of the modes asked for; the last one kept carries `seq`."""
        dropped = self._dropped
        if len(out) == 1:  # most events: no list to filter
            w = out[0]
            if w.event in dropped:
                return []
            return out if seq is None else [Wire(w.data, seq, w.event)]
        kept = [w for w in out if w.event not in dropped]
        if kept and seq is not None:
            w = kept[-1]
            kept[-1] = Wire(w.data, seq, w.event)
        return kept

    def _metadata(self, seq: int | None) -> Wire:
        data = {"run_id": self.ctx.run_id, "thread_id": self.ctx.session_id, "attempt": 1}
        return Wire(json(data), seq, "metadata")

    def _end(self, status: str) -> Wire:
        return Wire(json({"run_id": self.ctx.run_id, "status": status}), event="end")

    def _chunk(
        self, message_id: str, *, content: str = "", reasoning: str | None = None,
        tool: dict[str, object] | None = None,
    ) -> Wire:  # fmt: skip
        chunk: dict[str, object] = {
            "type": "AIMessageChunk",
            "id": message_id,
            "content": content,
            "additional_kwargs": {} if reasoning is None else {"reasoning_content": reasoning},
            "response_metadata": {},
            "tool_call_chunks": [] if tool is None else [{**tool, "type": "tool_call_chunk"}],
        }
        meta = {"run_id": self.ctx.run_id, "thread_id": self.ctx.session_id,
                "langgraph_node": _NODE, "langgraph_step": self.spans.step, "tags": []}  # fmt: skip
        return Wire(json([chunk, meta]), event="messages")

    def _text(self, message_id: str, delta: str) -> bytes:
        """`_chunk(message_id, content=delta).data`, byte for byte, without
        building and encoding its dicts for every delta: the frame around the
        content is made once per message and step."""
        key = (message_id, self.spans.step)
        if key != self._text_key:
            blank = self._chunk(message_id).data
            at = blank.index(b'"content":""') + len(b'"content":')  # the first: ids are escaped
            self._text_key, self._text_head, self._text_tail = key, blank[:at], blank[at + 2 :]
        return self._text_head + json(delta) + self._text_tail

    def _tool_message(self, ev: events.ToolResult) -> dict[str, object]:
        return _tool_message(ev, self.spans.tool_names.get(ev.tool_call_id, ""))

    def _interrupt(self, ev: events.ApprovalRequired) -> dict[str, object]:
        value = {
            "type": "tool_approval",
            "approval_id": ev.approval_id,
            "tool_call_id": ev.tool_call_id,
            "tool_name": self.spans.tool_names.get(ev.tool_call_id, ""),
            "args": self.spans.tool_args.get(ev.tool_call_id, ""),
            "summary": ev.summary,
            "expires_at": ev.expires_at,
            "allowed_decisions": ["approve", "reject"],
        }
        return {"id": ev.approval_id, "value": value}

    def _values(self, extra: dict[str, object] | None = None) -> list[Wire]:
        if self._state is None:
            return []
        return [Wire(json({**self._state.snapshot(), **(extra or {})}), event="values")]


def _tool_message(ev: events.ToolResult, name: str) -> dict[str, object]:
    return {
        "type": "tool",
        "id": f"{ev.tool_call_id}.result",
        "tool_call_id": ev.tool_call_id,
        "name": name,
        "content": ev.output if ev.output is not None else ev.summary,
        "status": "success" if ev.status == "ok" else "error",
        "artifact": {"runlog": {"status": ev.status, "summary": ev.summary}},
    }


def _custom(ev: events.Event) -> dict[str, object]:
    fields = msgspec.structs.asdict(ev)
    for k in _HIDDEN:
        fields.pop(k, None)
    return {"type": f"runlog.{type(ev).__struct_config__.tag}", **fields}


class _State:
    """The thread state a `values` frame carries: the run's messages so far.

    An AI message's text and reasoning are kept in their deltas' pieces
    (`spans.joined`), joined into its dict when a frame is made (`snapshot`)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.messages: list[dict[str, object]] = []
        self._ai: dict[str, dict[str, object]] = {}  # message id -> its dict in `messages`
        self._text: dict[str, list[str]] = {}  # message id -> its content's pieces
        self._reasoning: dict[str, list[str]] = {}  # message id -> its reasoning's pieces
        self._args: dict[str, list[str]] = {}  # tool call -> its argument deltas

    def apply(self, ev: events.Event, calls: dict[str, tuple[str, int]]) -> None:
        match ev:
            case events.RunStart():
                self.messages.append({"type": "human", "id": f"{self.ctx.run_id}.input",
                                      "content": ev.input})  # fmt: skip
            case events.TextDelta():
                self._message(ev.message_id)
                self._text[ev.message_id].append(ev.delta)
            case events.ReasoningDelta():
                self._message(ev.message_id)
                self._reasoning.setdefault(ev.message_id, []).append(ev.delta)
            case events.MessageReset():
                if ev.message_id in self._ai:
                    self._text[ev.message_id].clear()
            case events.ToolCallStart():
                tool_calls = self._message(calls[ev.tool_call_id][0])["tool_calls"]
                assert isinstance(tool_calls, list)
                tool_calls.append({"id": ev.tool_call_id, "name": ev.tool_name, "args": {},
                                   "type": "tool_call"})  # fmt: skip
                self._args[ev.tool_call_id] = []
            case events.ToolArgsDelta():
                if ev.tool_call_id in self._args:
                    self._args[ev.tool_call_id].append(ev.partial_json)
            case events.ToolCallEnd():
                self._parse_args(ev.tool_call_id, calls)
            case events.ToolResult():
                self._parse_args(ev.tool_call_id, calls)
                self.messages.append(_tool_message(ev, self._name(ev.tool_call_id, calls)))

    def snapshot(self) -> dict[str, object]:
        for mid, m in self._ai.items():
            m["content"] = joined(self._text[mid])
            if mid in self._reasoning:
                kw = m["additional_kwargs"]
                assert isinstance(kw, dict)
                kw["reasoning_content"] = joined(self._reasoning[mid])
        return {"messages": self.messages}

    def _message(self, message_id: str) -> dict[str, object]:
        m = self._ai.get(message_id)
        if m is None:
            m = {"type": "ai", "id": message_id, "content": "", "additional_kwargs": {},
                 "tool_calls": []}  # fmt: skip
            self._ai[message_id] = m
            self._text[message_id] = []
            self.messages.append(m)
        return m

    def _call(self, tool_call_id: str, calls: dict[str, tuple[str, int]]) -> dict[str, object]:
        msg, index = calls[tool_call_id]
        tool_calls = self._ai[msg]["tool_calls"]
        assert isinstance(tool_calls, list)
        call: dict[str, object] = tool_calls[index]
        return call

    def _name(self, tool_call_id: str, calls: dict[str, tuple[str, int]]) -> str:
        return str(self._call(tool_call_id, calls)["name"]) if tool_call_id in calls else ""

    def _parse_args(self, tool_call_id: str, calls: dict[str, tuple[str, int]]) -> None:
        pieces = self._args.pop(tool_call_id, None)
        if pieces is None or tool_call_id not in calls:
            return
        raw = "".join(pieces)
        try:
            args = msgspec.json.decode(raw) if raw else {}
        except msgspec.DecodeError:
            args = {}  # the model's malformed arguments: the messages mode has the text
        self._call(tool_call_id, calls)["args"] = args if isinstance(args, dict) else {}
