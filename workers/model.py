"""The model adapter interface: one vendor stream in, normalized items out.

An adapter turns a provider's streaming response into `ModelItem`s. The agent
loop turns items into log events; vendor event names never leave the adapter.

Contract:
- `stream()` is an async generator. Cancelling the task that iterates it (or
  calling `aclose()`) must close the provider connection at once, so that
  generation (and billing) stops: adapters hold the HTTP response in an
  `async with` and never shield it.
- Reasoning items come only from real model thinking (`reasoning_content`,
  `thinking_delta`); adapters never turn status text into reasoning.
- Tool calls: `ToolCallBegin` once per call (with a stable id), then any
  number of `ToolArgsChunk` (argument JSON, appended), then `ToolCallDone`.
  Parallel calls may interleave; ids tell them apart.
- The stream ends with exactly one `Finish` (reason, usage) unless it raises.
- Failures raise `ModelError` with a stable code (see below); malformed
  chunks are failures, never crashes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec

# -- what the agent loop sends


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    name: str
    arguments: str  # JSON text


class Message(msgspec.Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = []
    tool_call_id: str = ""  # for role "tool"
    name: str = ""  # tool name, for role "tool"


class ToolSpec(msgspec.Struct, kw_only=True):
    name: str
    description: str = ""
    parameters: dict[str, object] = {}  # JSON Schema


class ModelRequest(msgspec.Struct, kw_only=True):
    messages: list[Message]
    tools: list[ToolSpec] = []
    model: str = ""
    max_tokens: int = 1024


# -- what adapters yield


class TextChunk(msgspec.Struct, kw_only=True, tag="text"):
    text: str


class ReasoningChunk(msgspec.Struct, kw_only=True, tag="reasoning"):
    text: str


class ToolCallBegin(msgspec.Struct, kw_only=True, tag="tool_begin"):
    id: str
    name: str


class ToolArgsChunk(msgspec.Struct, kw_only=True, tag="tool_args"):
    id: str
    json: str


class ToolCallDone(msgspec.Struct, kw_only=True, tag="tool_done"):
    id: str


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


FinishReason = Literal["stop", "tool_calls", "length", "content_filter", "other"]


class Finish(msgspec.Struct, kw_only=True, tag="finish"):
    reason: FinishReason
    usage: Usage = msgspec.field(default_factory=Usage)


ModelItem = TextChunk | ReasoningChunk | ToolCallBegin | ToolArgsChunk | ToolCallDone | Finish


class ModelError(Exception):
    """A model call failed. Codes (stable, documented in docs/workers.md):

    model_unavailable   connection refused/reset, DNS, 5xx          retryable
    model_rate_limited  429                                          retryable
    model_overloaded    provider says overloaded (e.g. 529)          retryable
    model_timeout       no byte within the model timeout             retryable
    model_auth          401/403                                      not retryable
    model_bad_request   other 4xx                                    not retryable
    model_stream_error  an error event inside the stream             per provider
    model_malformed     a chunk we cannot parse, or a truncated stream  retryable
    """

    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable


class ModelAdapter(Protocol):
    name: str

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelItem]: ...
