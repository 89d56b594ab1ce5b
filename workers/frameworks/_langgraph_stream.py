"""LangGraph's stream as AgentContext calls, for workers/frameworks/langgraph.py.

Pure: `StreamMapper.feed` takes one `astream` item -- `(namespace, mode,
payload)` with `stream_mode=["messages", "updates", "custom"]` and
`subgraphs=True` -- and returns the calls to make on the context, as
`(method, args)`. The rules:

- `messages`, an `AIMessageChunk`: its text/reasoning content blocks are deltas
  of the runlog message made for its LangGraph message id; each tool call chunk
  opens a card (keyed by the chunk's index in that message) or appends to its
  arguments. A card's arguments are complete (`tool_end`) at the model's last
  chunk (`chunk_position="last"`: langchain-core's closing chunk may carry
  another id, so this closes every card of the same node task), when the node
  finishes (`updates`), or when the segment ends (`finish`).
- `messages`, a whole `AIMessage` (a node returned it, or a subgraph's node
  without `subgraphs` streaming): shown once (LangGraph message ids already
  streamed are remembered, across segments too), its tool calls as whole cards.
- `messages`, a `ToolMessage`: the `tool_result` of the card made for its
  `tool_call_id` (`error` if the tool failed, `denied` if its approval was not
  given); a result nobody announced gets a card of its own.
- `updates`: a root node that finished is `status("node", name)`.
- `custom` (`get_stream_writer()`): `{label, done, total}` is a `progress`,
  `{code, summary}` a `status`, anything else `status("custom", text)`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, cast

from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage

from broker.events import RiskLevel, ToolStatus

__all__ = ["Emit", "StreamMapper"]

_SUMMARY_CHARS = 200
_STREAMED_KEEP = 1000  # LangGraph message ids remembered against a second emission

Emit = tuple[str, tuple[Any, ...]]  # (AgentContext method, its arguments)


class _Message:
    __slots__ = ("calls", "id", "open", "task")

    def __init__(self, task: str) -> None:
        self.id = ""  # runlog's, made when it first has text
        self.task = task  # the node task that produced it (langgraph_checkpoint_ns)
        self.calls: dict[object, str] = {}  # tool call chunk key -> runlog tool card
        self.open: list[str] = []  # cards whose arguments may still come


class StreamMapper:
    """Turns one segment's `astream` items into AgentContext calls.

    `new_id(kind)` makes runlog ids ("m" messages, "tc" tool cards); `calls` and
    `streamed` carry over from the previous segment (its stored result)."""

    def __init__(
        self,
        new_id: Callable[[str], str],
        *,
        risk: Callable[[str], RiskLevel],
        calls: dict[str, str],
        streamed: list[str],
        denied: set[str],
        node_status: bool = True,
    ) -> None:
        self._new_id = new_id
        self._risk = risk
        self.calls = dict(calls)
        self._streamed = dict.fromkeys(streamed)
        self._denied = denied
        self._node_status = node_status
        self._msgs: dict[str, _Message] = {}
        self.usage = [0, 0, 0]

    @property
    def streamed(self) -> list[str]:
        return list(self._streamed)[-_STREAMED_KEEP:]

    def feed(self, item: Any) -> list[Emit]:
        ns, mode, payload = item
        out: list[Emit] = []
        if mode == "messages":
            msg, meta = payload
            task = str(meta.get("langgraph_checkpoint_ns", "")) if isinstance(meta, dict) else ""
            if isinstance(msg, AIMessageChunk):
                self._chunk(msg, task, out)
            elif isinstance(msg, AIMessage):
                self._whole(msg, task, out)
            elif isinstance(msg, ToolMessage):
                self._tool_message(msg, out)
        elif mode == "updates" and isinstance(payload, dict):
            for node in payload:
                if node.startswith("__"):
                    continue  # __interrupt__: read from the checkpoint afterwards
                # The node's tasks, and the tasks of the subgraphs inside them.
                prefix = "|".join((*ns, node)) + ":"
                self._close(out, functools.partial(_under, prefix))
                if self._node_status and not ns:
                    out.append(("status", ("node", node)))
        elif mode == "custom":
            out.append(_custom(payload))
        return out

    def finish(self) -> list[Emit]:
        """The segment ended: every card's arguments are complete."""
        out: list[Emit] = []
        self._close(out, lambda m: True)
        return out

    # -- messages

    def _message(self, lc_id: str, task: str) -> _Message:
        m = self._msgs.get(lc_id)
        if m is None:
            m = self._msgs[lc_id] = _Message(task)
        return m

    def _content(self, m: _Message, msg: BaseMessage, out: list[Emit]) -> None:
        if (
            isinstance(msg.content, str)
            and not msg.additional_kwargs
            and "model_provider" not in msg.response_metadata
        ):
            # Plain text, nothing a provider translator could read reasoning
            # from: what content_blocks would say, without rebuilding blocks
            # per chunk (a fifth of the worker's CPU in `bench agents`).
            if msg.content:
                out.append(("text", (self._mid(m), msg.content)))
            return
        reasoned = False
        for block in cast(list[dict[str, Any]], msg.content_blocks):
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                out.append(("text", (self._mid(m), block["text"])))
            elif kind == "reasoning" and block.get("reasoning"):
                reasoned = True
                out.append(("reasoning", (self._mid(m), block["reasoning"])))
        extra = msg.additional_kwargs.get("reasoning_content")
        if not reasoned and isinstance(extra, str) and extra:
            out.append(("reasoning", (self._mid(m), extra)))

    def _mid(self, m: _Message) -> str:
        if not m.id:
            m.id = self._new_id("m")
        return m.id

    def _chunk(self, msg: AIMessageChunk, task: str, out: list[Emit]) -> None:
        lc_id = msg.id or f"task:{task}"
        self._streamed[lc_id] = None
        m = self._message(lc_id, task)
        self._content(m, msg, out)
        for tc in msg.tool_call_chunks:
            key: object = tc.get("index")
            if key is None:
                key = tc.get("id")
            card = m.calls.get(key)
            if card is None:
                card = m.calls[key] = self._new_id("tc")
                name = tc.get("name") or "tool"
                if tc.get("id"):
                    self.calls[str(tc["id"])] = card
                m.open.append(card)
                out.append(("tool_start", (card, name, self._risk(name))))
            if tc.get("args") and card in m.open:
                out.append(("tool_args", (card, tc["args"])))
        self._usage(msg)
        if msg.chunk_position == "last":
            # The model's last chunk may carry another id than its first
            # (langchain-core's synthetic closing chunk): close by node task.
            self._close(out, lambda other: other.task == task)

    def _whole(self, msg: AIMessage, task: str, out: list[Emit]) -> None:
        """A message a node returned without streaming it (or a subgraph's)."""
        lc_id = msg.id or ""
        if lc_id and lc_id in self._streamed:
            return
        if lc_id:
            self._streamed[lc_id] = None
        m = _Message(task)
        self._content(m, msg, out)
        for call in msg.tool_calls:
            card = self._new_id("tc")
            if call.get("id"):
                self.calls[str(call["id"])] = card
            out.append(("tool_start", (card, call["name"], self._risk(call["name"]))))
            out.append(("tool_args", (card, json.dumps(call.get("args", {})))))
            out.append(("tool_end", (card,)))
        self._usage(msg)

    def _tool_message(self, msg: ToolMessage, out: list[Emit]) -> None:
        card = self.calls.pop(msg.tool_call_id, "")
        if not card:  # a tool result nobody announced: give it a card of its own
            card = self._new_id("tc")
            name = msg.name or "tool"
            out.append(("tool_start", (card, name, self._risk(name))))
            out.append(("tool_end", (card,)))
        else:
            self._close(out, lambda m: card in m.open, only=card)
        status: ToolStatus = "ok"
        if msg.status == "error":
            status = "error"
        elif card in self._denied:
            status = "denied"
        text = str(msg.text)  # a str subclass (TextAccessor) that msgspec does not encode
        out.append(("tool_result", (card, status, _first_line(text), text)))

    def _close(self, out: list[Emit], which: Callable[[_Message], bool], only: str = "") -> None:
        for m in self._msgs.values():
            if m.open and which(m):
                for card in [c for c in m.open if not only or c == only]:
                    m.open.remove(card)
                    out.append(("tool_end", (card,)))

    def _usage(self, msg: AIMessage) -> None:
        u = msg.usage_metadata
        if not u:
            return
        self.usage[0] += int(u.get("input_tokens", 0) or 0)
        self.usage[1] += int(u.get("output_tokens", 0) or 0)
        details = u.get("output_token_details") or {}
        self.usage[2] += int(details.get("reasoning", 0) or 0)


def _under(prefix: str, m: _Message) -> bool:
    return m.task.startswith(prefix)


def _first_line(text: str) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= _SUMMARY_CHARS else line[: _SUMMARY_CHARS - 1] + "…"


def _custom(payload: Any) -> Emit:
    if isinstance(payload, dict):
        label, done, total = payload.get("label"), payload.get("done"), payload.get("total")
        if isinstance(done, int) and isinstance(total, int) and label is not None:
            return ("progress", (str(label), done, total))
        if isinstance(payload.get("code"), str):
            return ("status", (payload["code"], str(payload.get("summary", ""))))
    text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
    return ("status", ("custom", text[:_SUMMARY_CHARS]))
