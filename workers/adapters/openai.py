"""OpenAI Chat Completions streaming, and the many servers that copy it
(vLLM, Ollama, DeepSeek, OpenRouter, LiteLLM, ...).

Normalization beyond the `workers.model` contract:
- `delta.reasoning_content` (DeepSeek, vLLM) or else `delta.reasoning`
  (OpenRouter, Ollama, newer vLLM) is reasoning; `delta.refusal` is text.
- A tool call whose provider sent no id gets `call_<random>_<index>`, the
  same for all its items and unique across streams.
- A tool call with no argument text gets `{}`, so arguments always parse.
- `finish_reason` "stop" after tool calls (Gemini-compatible servers) is
  reported as "tool_calls"; unknown reasons as "other".
- `Finish` waits for the usage chunk (sent after the finish_reason chunk)
  until `[DONE]`, or the end of the body if the server never sends `[DONE]`.
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
    Message,
    ModelError,
    ModelItem,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolArgsChunk,
    ToolCallBegin,
    ToolCallDone,
    Usage,
)

from .sse import ErrorInfo, SSEClient, SSEEvent, Timeouts, clean_message, malformed, stream_error

# -- request (what we send)


class _FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class _ToolCall(msgspec.Struct):
    id: str
    function: _FunctionCall
    type: str = "function"


class _Message(msgspec.Struct, omit_defaults=True):
    role: str
    content: str | None = None  # omitted for an assistant turn that only calls tools
    tool_calls: list[_ToolCall] | None = None
    tool_call_id: str | None = None


class _Function(msgspec.Struct):
    name: str
    description: str
    parameters: dict[str, object]


class _Tool(msgspec.Struct):
    function: _Function
    type: str = "function"


class _StreamOptions(msgspec.Struct):
    include_usage: bool


class _Request(msgspec.Struct, omit_defaults=True):
    model: str
    messages: list[_Message]
    stream: bool
    stream_options: _StreamOptions
    tools: list[_Tool] = []
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


_EMPTY_SCHEMA: dict[str, object] = {"type": "object", "properties": {}}
_ENCODER = msgspec.json.Encoder()


def _message(m: Message) -> _Message:
    if m.role == "tool":
        return _Message(role="tool", content=m.content, tool_call_id=m.tool_call_id)
    if m.role == "assistant" and m.tool_calls:
        calls = [
            _ToolCall(id=c.id, function=_FunctionCall(c.name, c.arguments)) for c in m.tool_calls
        ]
        return _Message(role="assistant", content=m.content or None, tool_calls=calls)
    return _Message(role=m.role, content=m.content)


def encode_request(
    request: ModelRequest, model: str, max_tokens_param: str = "max_completion_tokens"
) -> bytes:
    body = _Request(
        model=request.model or model,
        messages=[_message(m) for m in request.messages],
        stream=True,
        stream_options=_StreamOptions(include_usage=True),
        tools=[
            _Tool(_Function(t.name, t.description, t.parameters or _EMPTY_SCHEMA))
            for t in request.tools
        ],
    )
    # o-series models reject `max_tokens`; older compatible servers only know it.
    if max_tokens_param == "max_tokens":
        body.max_tokens = request.max_tokens
    else:
        body.max_completion_tokens = request.max_tokens
    return _ENCODER.encode(body)


# -- response chunks (what we parse). Lenient: unknown fields are ignored and
# everything a compatible server might send as null is optional.


class _FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCallDelta(msgspec.Struct):
    index: int | None = None
    id: str | None = None
    function: _FunctionDelta | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: object = None  # a string where used; other shapes are ignored
    refusal: str | None = None
    tool_calls: list[_ToolCallDelta] | None = None


class _Choice(msgspec.Struct):
    index: int | None = 0
    delta: _Delta | None = None
    finish_reason: str | None = None


class _TokenDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_tokens_details: _TokenDetails | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: ErrorInfo | str | None = None


_CHUNK = msgspec.json.Decoder(_Chunk)

_REASONS: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "length",
    "content_filter": "content_filter",
}


class _Call:
    __slots__ = ("args_seen", "id", "name", "pending")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.pending: list[str] = []  # argument text received before the name
        self.args_seen = False


class ChunkDecoder:
    """The pure core: one SSE event's data in, items out. Raises only ModelError.

    `feed()` per event until `done`; then (or at end of body) `end()`.
    """

    def __init__(self, id_prefix: str = "", redact: tuple[str, ...] = ()) -> None:
        self._id_prefix = id_prefix or secrets.token_hex(6)
        self._redact = redact
        self._calls: dict[int, _Call] = {}  # open calls by index
        self._ids: dict[str, int] = {}  # provider id → index, for servers that omit indexes
        self._last_index = 0
        self._begun: set[str] = set()  # ids handed out in ToolCallBegin
        self._had_calls = False
        self._reason: str | None = None
        self._usage = Usage()
        self.done = False  # [DONE] seen

    def feed_event(self, ev: SSEEvent) -> list[ModelItem]:
        return self.feed(ev.data, ev.event)

    def feed(self, data: str, event: str = "message") -> list[ModelItem]:
        if data.strip() == "[DONE]":
            self.done = True
            return []
        try:
            chunk = _CHUNK.decode(data)
        except msgspec.DecodeError as e:
            if event == "error":
                raise self._error_event(data) from e
            raise malformed(f"undecodable chunk: {e}") from e
        if chunk.error is not None:
            if isinstance(chunk.error, str):
                chunk.error = ErrorInfo(message=chunk.error)
            raise stream_error(chunk.error, self._redact)
        if event == "error":
            raise self._error_event(data)
        if chunk.usage is not None:
            u = chunk.usage
            details = u.completion_tokens_details
            self._usage = Usage(
                input_tokens=u.prompt_tokens or 0,
                output_tokens=u.completion_tokens or 0,
                reasoning_tokens=(details.reasoning_tokens or 0) if details else 0,
            )
        items: list[ModelItem] = []
        if self._reason is not None or not chunk.choices:
            return items  # after finish_reason only usage matters
        for choice in chunk.choices:
            if choice.index:
                continue  # we ask for one choice; ignore any others
            d = choice.delta
            if d is not None:
                reasoning = d.reasoning_content or (
                    d.reasoning if isinstance(d.reasoning, str) else None
                )
                if reasoning:
                    items.append(ReasoningChunk(text=reasoning))
                if d.content:
                    items.append(TextChunk(text=d.content))
                if d.refusal:
                    items.append(TextChunk(text=d.refusal))
                if d.tool_calls:
                    for tc in d.tool_calls:
                        self._tool_delta(tc, items)
            if choice.finish_reason:
                self._reason = choice.finish_reason
                self._close_calls(items)
            break
        return items

    def end(self) -> list[ModelItem]:
        """The closing items: any open calls' `ToolCallDone`, then `Finish`."""
        if self._reason is None and not self.done:
            raise malformed("stream ended before finish_reason")
        items: list[ModelItem] = []
        self._close_calls(items)
        reason: FinishReason = _REASONS.get(self._reason or "", "other")
        if self._had_calls and reason in ("stop", "other"):
            reason = "tool_calls"
        items.append(Finish(reason=reason, usage=self._usage))
        return items

    def _error_event(self, data: str) -> ModelError:
        # `event: error` (some proxies) with a body of no known shape: the
        # provider failed mid-stream; its text is all we have.
        return ModelError("model_stream_error", clean_message(data, self._redact), retryable=True)

    def _index(self, tc: _ToolCallDelta) -> int:
        if tc.index is not None:
            return tc.index
        if tc.id and tc.id not in self._ids:
            return max(self._calls, default=-1) + 1
        if tc.id:
            return self._ids[tc.id]
        return self._last_index

    def _tool_delta(self, tc: _ToolCallDelta, items: list[ModelItem]) -> None:
        index = self._index(tc)
        self._last_index = index
        call = self._calls.get(index)
        if call is None:
            call = self._calls[index] = _Call()
            self._had_calls = True
        if tc.id and not call.id and not call.name:
            call.id = tc.id
            self._ids[tc.id] = index
        fn = tc.function
        if fn is None:
            return
        if fn.name and not call.name:
            call.name = fn.name
            if not call.id or call.id in self._begun:
                # None sent, or reused by another call: ids must tell calls apart.
                call.id = f"call_{self._id_prefix}_{index}"
            self._begun.add(call.id)
            items.append(ToolCallBegin(id=call.id, name=call.name))
            for piece in call.pending:
                items.append(ToolArgsChunk(id=call.id, json=piece))
            call.pending.clear()
        if fn.arguments:
            call.args_seen = True
            if call.name:
                items.append(ToolArgsChunk(id=call.id, json=fn.arguments))
            else:
                call.pending.append(fn.arguments)

    def _close_calls(self, items: list[ModelItem]) -> None:
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.name:
                raise malformed(f"tool call {index} has no function name")
            if not call.args_seen:
                items.append(ToolArgsChunk(id=call.id, json="{}"))
            items.append(ToolCallDone(id=call.id))
        self._calls.clear()


class OpenAIAdapter:
    """`stream()` POSTs {base_url}/chat/completions. `base_url` includes the
    version path, e.g. "https://api.openai.com/v1". Call `aclose()` when done
    (it closes the session only if the adapter created it)."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str,
        model: str,
        *,
        session: aiohttp.ClientSession | None = None,
        connect_timeout_s: float = 10.0,
        first_byte_timeout_s: float = 60.0,
        read_timeout_s: float = 300.0,
        max_tokens_param: str = "max_completion_tokens",
    ) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self.model = model  # the default; a request may name another
        self._max_tokens_param = max_tokens_param
        self._redact = (api_key,) if api_key else ()
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        if api_key:  # local servers (Ollama, vLLM) often need none
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._http = SSEClient(
            session,
            Timeouts(connect_timeout_s, first_byte_timeout_s, read_timeout_s),
            redact=self._redact,
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelItem, None]:
        body = encode_request(request, self.model, self._max_tokens_param)
        items = self._http.items(
            self._url, headers=self._headers, body=body, decoder=ChunkDecoder(redact=self._redact)
        )
        async with aclosing(items) as it:
            async for item in it:
                yield item
