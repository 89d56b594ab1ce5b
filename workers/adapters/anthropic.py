"""Anthropic Messages streaming (POST /v1/messages with stream=true).

Normalization beyond the `workers.model` contract:
- Only client `tool_use` blocks become tool calls; server tools
  (`server_tool_use`, web search results, ...) run at Anthropic and are
  skipped, as are `redacted_thinking` and `signature_delta`.
- A tool call with no argument text gets `{}`, so arguments always parse.
- `Usage.input_tokens` counts cached input too (input + cache writes + cache
  reads), to mean the same as OpenAI's `prompt_tokens`.
- Event types we do not know are ignored (Anthropic adds them over time).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncGenerator
from contextlib import aclosing

import aiohttp
import msgspec

from workers.model import (
    Finish,
    FinishReason,
    ModelItem,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolArgsChunk,
    ToolCallBegin,
    ToolCallDone,
    Usage,
)

from .sse import ErrorInfo, SSEClient, SSEEvent, Timeouts, malformed, stream_error

# -- request (what we send)


class _Text(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class _ToolUse(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, object]


class _ToolResult(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str


_Block = _Text | _ToolUse | _ToolResult


class _Message(msgspec.Struct):
    role: str
    content: list[_Block]


class _Tool(msgspec.Struct, omit_defaults=True):
    name: str
    input_schema: dict[str, object]
    description: str = ""


class _Request(msgspec.Struct, omit_defaults=True):
    model: str
    max_tokens: int
    messages: list[_Message]
    stream: bool
    system: str = ""
    tools: list[_Tool] = []


_EMPTY_SCHEMA: dict[str, object] = {"type": "object", "properties": {}}
_ENCODER = msgspec.json.Encoder()


def _tool_input(arguments: str) -> dict[str, object]:
    # `input` must be an object; arguments the model got wrong are replayed
    # as {} (the tool result already told the model what went wrong).
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def encode_request(request: ModelRequest, model: str) -> bytes:
    system: list[str] = []
    messages: list[_Message] = []

    def add(role: str, blocks: list[_Block]) -> None:
        # Consecutive turns of one role are merged: all tool results for an
        # assistant turn must arrive in the single user message after it.
        if not blocks:
            return
        if messages and messages[-1].role == role:
            messages[-1].content.extend(blocks)
        else:
            messages.append(_Message(role=role, content=blocks))

    for m in request.messages:
        if m.role == "system":
            system.append(m.content)
        elif m.role == "tool":
            add("user", [_ToolResult(tool_use_id=m.tool_call_id, content=m.content)])
        elif m.role == "assistant":
            blocks: list[_Block] = [_Text(m.content)] if m.content else []
            blocks += [_ToolUse(c.id, c.name, _tool_input(c.arguments)) for c in m.tool_calls]
            add("assistant", blocks)
        elif m.content:
            add("user", [_Text(m.content)])
    body = _Request(
        model=request.model or model,
        max_tokens=request.max_tokens,
        messages=messages,
        stream=True,
        system="\n\n".join(s for s in system if s),
        tools=[_Tool(t.name, t.parameters or _EMPTY_SCHEMA, t.description) for t in request.tools],
    )
    return _ENCODER.encode(body)


# -- events (what we parse): one Struct per event type, decoded by the SSE
# event name. Lenient: unknown fields ignored, nullable fields optional.


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _MessageInfo(msgspec.Struct):
    id: str | None = None
    usage: _Usage | None = None


class _MessageStart(msgspec.Struct):
    message: _MessageInfo | None = None


class _ContentBlock(msgspec.Struct):
    type: str = ""
    id: str | None = None
    name: str | None = None
    text: str | None = None
    thinking: str | None = None


class _BlockStart(msgspec.Struct):
    index: int
    content_block: _ContentBlock


class _BlockDeltaBody(msgspec.Struct):
    type: str = ""
    text: str | None = None
    thinking: str | None = None
    partial_json: str | None = None


class _BlockDelta(msgspec.Struct):
    index: int
    delta: _BlockDeltaBody


class _BlockStop(msgspec.Struct):
    index: int


class _MessageDeltaBody(msgspec.Struct):
    stop_reason: str | None = None


class _MessageDelta(msgspec.Struct):
    delta: _MessageDeltaBody | None = None
    usage: _Usage | None = None


class _ErrorEvent(msgspec.Struct):
    error: ErrorInfo | None = None


class _TypeOnly(msgspec.Struct):
    type: str = ""


_DECODERS: dict[str, msgspec.json.Decoder] = {
    "message_start": msgspec.json.Decoder(_MessageStart),
    "content_block_start": msgspec.json.Decoder(_BlockStart),
    "content_block_delta": msgspec.json.Decoder(_BlockDelta),
    "content_block_stop": msgspec.json.Decoder(_BlockStop),
    "message_delta": msgspec.json.Decoder(_MessageDelta),
    "error": msgspec.json.Decoder(_ErrorEvent),
}
_TYPE_ONLY = msgspec.json.Decoder(_TypeOnly)

_REASONS: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "refusal": "content_filter",
}


class _ToolBlock:
    __slots__ = ("args_seen", "id")

    def __init__(self, id: str) -> None:
        self.id = id
        self.args_seen = False


class EventDecoder:
    """The pure core: one SSE event in, items out. Raises only ModelError.

    `feed()` per event until `done` (message_stop); then `end()`.
    """

    def __init__(self, id_prefix: str = "", redact: tuple[str, ...] = ()) -> None:
        self._id_prefix = id_prefix or secrets.token_hex(6)
        self._redact = redact
        # index → open tool_use block, or None for a block we skip
        self._blocks: dict[int, _ToolBlock | None] = {}
        self._begun: set[str] = set()  # ids handed out in ToolCallBegin
        self._stop_reason: str | None = None
        self._input = _Usage()
        self._output_tokens = 0
        self.done = False

    def feed_event(self, ev: SSEEvent) -> list[ModelItem]:
        return self.feed(ev.event, ev.data)

    def feed(self, event: str, data: str) -> list[ModelItem]:
        try:
            if event not in _DECODERS and event == "message":
                # A proxy that drops `event:` lines: the type is in the data.
                event = _TYPE_ONLY.decode(data).type
            if event == "message_stop":
                self.done = True
                return []
            decoder = _DECODERS.get(event)
            if decoder is None:
                return []  # ping and event types added after this code
            ev = decoder.decode(data)
        except msgspec.DecodeError as e:
            raise malformed(f"undecodable {event} event: {e}") from e
        items: list[ModelItem] = []
        match ev:
            case _BlockDelta(index=index, delta=d):
                self._delta(index, d, items)
            case _BlockStart(index=index, content_block=b):
                self._start(index, b, items)
            case _BlockStop(index=index):
                self._stop(index, items)
            case _MessageStart(message=m):
                if m is not None and m.usage is not None:
                    self._take_usage(m.usage)
            case _MessageDelta(delta=d, usage=u):
                if d is not None and d.stop_reason:
                    self._stop_reason = d.stop_reason
                if u is not None:
                    self._take_usage(u)
            case _ErrorEvent(error=err):
                raise stream_error(err or ErrorInfo(), self._redact)
        return items

    def end(self) -> list[ModelItem]:
        """The closing items: any open calls' `ToolCallDone`, then `Finish`."""
        if not self.done and self._stop_reason is None:
            raise malformed("stream ended before message_stop")
        items: list[ModelItem] = []
        for index in sorted(self._blocks):
            self._stop(index, items)
        u = self._input
        usage = Usage(
            input_tokens=(u.input_tokens or 0)
            + (u.cache_creation_input_tokens or 0)
            + (u.cache_read_input_tokens or 0),
            output_tokens=self._output_tokens,
        )
        reason = _REASONS.get(self._stop_reason or "", "other")
        items.append(Finish(reason=reason, usage=usage))
        return items

    def _take_usage(self, u: _Usage) -> None:
        # message_start carries the input side; message_delta the (cumulative)
        # output and, in newer API versions, a final input count too.
        for field in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            value = getattr(u, field)
            if value is not None:
                setattr(self._input, field, value)
        if u.output_tokens is not None:
            self._output_tokens = u.output_tokens

    def _start(self, index: int, b: _ContentBlock, items: list[ModelItem]) -> None:
        if index in self._blocks:
            raise malformed(f"content block {index} started twice")
        if b.type == "tool_use":
            if not b.name:
                raise malformed(f"tool_use block {index} has no name")
            # None sent, or reused by another block: ids must tell calls apart.
            block_id = b.id if b.id and b.id not in self._begun else ""
            block = _ToolBlock(block_id or f"toolu_{self._id_prefix}_{len(self._begun)}")
            self._begun.add(block.id)
            self._blocks[index] = block
            items.append(ToolCallBegin(id=block.id, name=b.name))
            return
        self._blocks[index] = None
        if b.type == "text" and b.text:
            items.append(TextChunk(text=b.text))
        elif b.type == "thinking" and b.thinking:
            items.append(ReasoningChunk(text=b.thinking))

    def _delta(self, index: int, d: _BlockDeltaBody, items: list[ModelItem]) -> None:
        if d.type == "text_delta":
            if d.text:
                items.append(TextChunk(text=d.text))
        elif d.type == "thinking_delta":
            if d.thinking:
                items.append(ReasoningChunk(text=d.thinking))
        elif d.type == "input_json_delta":
            if index not in self._blocks:
                raise malformed(f"input_json_delta for unknown block {index}")
            block = self._blocks[index]
            if block is not None and d.partial_json:
                block.args_seen = True
                items.append(ToolArgsChunk(id=block.id, json=d.partial_json))
        # signature_delta, citations_delta and newer delta types: nothing to show.

    def _stop(self, index: int, items: list[ModelItem]) -> None:
        block = self._blocks.pop(index, None)
        if block is not None:
            if not block.args_seen:
                items.append(ToolArgsChunk(id=block.id, json="{}"))
            items.append(ToolCallDone(id=block.id))


class AnthropicAdapter:
    """`stream()` POSTs {base_url}/v1/messages, e.g. base_url
    "https://api.anthropic.com". Call `aclose()` when done (it closes the
    session only if the adapter created it)."""

    name = "anthropic"

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        anthropic_version: str = "2023-06-01",
        *,
        session: aiohttp.ClientSession | None = None,
        connect_timeout_s: float = 10.0,
        first_byte_timeout_s: float = 60.0,
        read_timeout_s: float = 300.0,
    ) -> None:
        self._url = base_url.rstrip("/") + "/v1/messages"
        self.model = model  # the default; a request may name another
        self._redact = (api_key,) if api_key else ()
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "x-api-key": api_key,
            "anthropic-version": anthropic_version,
        }
        self._http = SSEClient(
            session,
            Timeouts(connect_timeout_s, first_byte_timeout_s, read_timeout_s),
            redact=self._redact,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelItem, None]:
        body = encode_request(request, self.model)
        items = self._http.items(
            self._url, headers=self._headers, body=body, decoder=EventDecoder(redact=self._redact)
        )
        async with aclosing(items) as it:
            async for item in it:
                yield item
