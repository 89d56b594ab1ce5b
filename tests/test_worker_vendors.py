"""Vendor adapters through the whole worker: a local fake provider speaks
the OpenAI and Anthropic streaming formats (real NATS + PostgreSQL)."""

from __future__ import annotations

from typing import Literal

import msgspec
import pytest

from broker import events
from broker.settings import Settings
from workers.adapters.anthropic import AnthropicAdapter
from workers.adapters.openai import OpenAIAdapter
from workers.model import ModelAdapter

from .fakes.providers import (
    FakeProvider,
    FakeToolCall,
    Respond,
    anthropic_stream,
    openai_stream,
    tool_call_ids,
)
from .workerkit import of, read_run, running_worker, start, text_of

Vendor = Literal["openai", "anthropic"]


def _adapter(vendor: Vendor, provider: FakeProvider) -> ModelAdapter:
    if vendor == "openai":
        return OpenAIAdapter(provider.url + "/v1", "sk-test", "gpt-4o")
    return AnthropicAdapter(provider.url, "sk-ant-test", "claude-sonnet-4-5")


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_vendor_turns_with_a_tool_call(settings: Settings, vendor: Vendor) -> None:
    call = FakeToolCall("search_docs", '{"query": "leases", "steps": 2, "delay_ms": 0}')
    if vendor == "openai":
        first = openai_stream(reasoning=["Let me ", "check."], text="Looking.", tool_calls=[call])
        second = openai_stream(text=["Leases ", "are renewed."])
    else:
        first = anthropic_stream(thinking=["Let me ", "check."], text="Looking.", tool_calls=[call])
        second = anthropic_stream(text=["Leases ", "are renewed."])
    (call_id,) = tool_call_ids(vendor, [call])
    async with FakeProvider() as provider:
        provider.push(first, second)
        async with running_worker(settings, adapter=_adapter(vendor, provider)) as (b, _):
            _, run_id = await start(b, "how do leases work?")
            evs = await read_run(b, run_id)
        assert len(provider.requests) == 2
        # The second turn carried the tool's result back to the model.
        assert call_id.encode() in provider.requests[1].body
        assert b"docs.example.com" in provider.requests[1].body  # the raw output
    assert "".join(r.delta for r in of(evs, events.ReasoningDelta)) == "Let me check."
    assert text_of(evs) == "Looking.Leases are renewed."
    (begin,) = of(evs, events.ToolCallStart)
    assert (begin.tool_call_id, begin.tool_name, begin.risk_level) == (
        call_id,
        "search_docs",
        "low",
    )
    args = "".join(d.partial_json for d in of(evs, events.ToolArgsDelta))
    assert msgspec.json.decode(args) == {"query": "leases", "steps": 2, "delay_ms": 0}
    assert [r.status for r in of(evs, events.ToolResult)] == ["ok"]
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    assert end.usage is not None and end.usage.input_tokens == 50  # two turns of 25


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [(429, "model_rate_limited", True), (401, "model_auth", False)],
)
async def test_provider_errors_become_run_errors(
    settings: Settings, status: int, code: str, retryable: bool
) -> None:
    async with FakeProvider() as provider:
        provider.push([Respond(status, {"error": {"message": "nope", "type": "x"}})])
        async with running_worker(settings, adapter=_adapter("openai", provider)) as (b, _):
            _, run_id = await start(b, "hello")
            evs = await read_run(b, run_id)
    err, end = evs[-2], evs[-1]
    assert isinstance(err, events.RunError) and (err.code, err.retryable) == (code, retryable)
    assert "sk-test" not in err.message
    assert isinstance(end, events.RunEnd) and end.status == "failed"
