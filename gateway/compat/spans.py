"""Open spans of a run's stream: the bookkeeping every projection shares.

A span is a text message, a reasoning message or a tool call as the wire
formats see them: opened by its first event, closed when the formats need it
closed. Rules (the same for every format, so they are decided here once):

- At most one message span (text or reasoning) is open at a time. A delta of
  another message, or of the other kind, closes it first.
- A message span also closes before a tool call starts, a tool result, an
  approval, a message reset of that message, the end and an error.
- A tool-call span opens at `tool_call_start` and closes at `tool_call_end`;
  several may be open at once (in start order). The end and an error close
  every span still open.
- `step` counts model turns as the AI SDK's steps see them: a text or
  reasoning delta after a tool result opens a new step.

`Spans.advance(event)` applies one event and returns the transitions it
causes, in wire order: the closes first, then the open, and the event itself
is the caller's to render after them. `Spans.open_now()` lists what is open
(for re-opening at the start of a resumed answer: message first, then tool
calls in start order). Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from broker import events

Kind = Literal["text", "reasoning", "tool"]


def joined(pieces: list[str]) -> str:
    """The text of a message or of a tool call's arguments, kept as its
    deltas' pieces, left as one piece (so the next join starts from it).
    Text that grows by deltas is kept so everywhere because `s = s + delta`
    on an attribute or a dict value copies all of `s` every time: quadratic
    in a long message."""
    if len(pieces) > 1:
        pieces[:] = ["".join(pieces)]
    return pieces[0] if pieces else ""


@dataclass
class Span:
    kind: Kind
    id: str  # message_id, or tool_call_id
    name: str = ""  # a tool call's tool name
    risk_level: str = "low"
    arg_pieces: list[str] = field(default_factory=list)  # its argument deltas so far

    @property
    def args(self) -> str:
        """A tool call's argument text so far."""
        return joined(self.arg_pieces)


@dataclass(frozen=True)
class Open:
    span: Span


@dataclass(frozen=True)
class Close:
    span: Span


Transition = Open | Close


@dataclass
class Spans:
    message: Span | None = None  # the open text or reasoning message
    tools: dict[str, Span] = field(default_factory=dict)  # open tool calls, in start order
    tool_names: dict[str, str] = field(default_factory=dict)  # every tool call seen: id -> name
    # Every tool call's argument deltas (`tool_args` joins them): argument
    # text grows by deltas, like a message's (`base.joined`).
    arg_pieces: dict[str, list[str]] = field(default_factory=dict)
    last_text_id: str | None = None  # the last text message (a tool call's parent)
    pending_approvals: dict[str, events.ApprovalRequired] = field(default_factory=dict)
    run_start: events.RunStart | None = None
    step: int = 0  # model turns opened so far (0 before the first delta)
    _after_tool_result: bool = False
    last_seq: int = 0
    ended: bool = False

    def continues_text(self, ev: events.Event) -> bool:
        """Whether `ev` is another text delta of the open text message: the
        common case, which opens, closes and changes nothing (`advance`
        returns no transition for it); formats answer it first."""
        m = self.message
        return (
            m is not None
            and type(ev) is events.TextDelta
            and m.kind == "text"
            and m.id == ev.message_id
        )

    def advance(self, ev: events.Event) -> list[Transition]:
        self.last_seq = ev.seq
        if self.continues_text(ev):  # the `match` below would come to the same: nothing
            assert isinstance(ev, events.TextDelta)
            self.last_text_id = ev.message_id
            return []
        out: list[Transition] = []
        match ev:
            case events.RunStart():
                self.run_start = ev
            case events.TextDelta() | events.ReasoningDelta():
                kind: Kind = "text" if isinstance(ev, events.TextDelta) else "reasoning"
                m = self.message
                if m is None or m.kind != kind or m.id != ev.message_id:
                    self._close_message(out)
                    if self.step == 0 or self._after_tool_result:
                        self.step += 1
                        self._after_tool_result = False
                    self.message = Span(kind, ev.message_id)
                    out.append(Open(self.message))
                if kind == "text":
                    self.last_text_id = ev.message_id
            case events.MessageReset():
                if self.message is not None and self.message.id == ev.message_id:
                    self._close_message(out)
            case events.ToolCallStart():
                self._close_message(out)
                span = Span("tool", ev.tool_call_id, name=ev.tool_name, risk_level=ev.risk_level)
                self.tools[ev.tool_call_id] = span
                self.tool_names[ev.tool_call_id] = ev.tool_name
                self.arg_pieces[ev.tool_call_id] = []
                out.append(Open(span))
            case events.ToolArgsDelta():
                open_call = self.tools.get(ev.tool_call_id)
                if open_call is not None:
                    open_call.arg_pieces.append(ev.partial_json)
                self.arg_pieces.setdefault(ev.tool_call_id, []).append(ev.partial_json)
            case events.ToolCallEnd():
                ended_call = self.tools.pop(ev.tool_call_id, None)
                if ended_call is not None:
                    out.append(Close(ended_call))
            case events.ToolResult():
                self._close_message(out)
                self._after_tool_result = True
            case events.ApprovalRequired():
                self._close_message(out)
                self.pending_approvals[ev.approval_id] = ev
            case events.ApprovalDecided():
                self.pending_approvals.pop(ev.approval_id, None)
            case events.RunEnd() | events.RunError():
                self._close_all(out)
                self.ended = True
        return out

    @property
    def tool_args(self) -> dict[str, str]:
        """Every tool call's full arguments so far (made when read)."""
        return {call: joined(pieces) for call, pieces in self.arg_pieces.items()}

    def open_now(self) -> list[Span]:
        """The spans open now, in the order a resumed answer re-opens them."""
        return ([self.message] if self.message is not None else []) + list(self.tools.values())

    def close_all(self) -> list[Transition]:
        """Close everything still open (a response that ends here, e.g. at an
        undecided approval: its spans are re-opened by the next answer)."""
        out: list[Transition] = []
        self._close_all(out)
        return out

    def _close_message(self, out: list[Transition]) -> None:
        if self.message is not None:
            out.append(Close(self.message))
            self.message = None

    def _close_all(self, out: list[Transition]) -> None:
        self._close_message(out)
        for span in self.tools.values():
            out.append(Close(span))
        self.tools.clear()
