"""`bench agents` case `openai-agents`: an Agents SDK agent whose `Model`
streams one message of `deltas(n)` (n = the run's input) as Responses API
events, as fast as it can; run bare with `Runner.run_streamed` in the bench
process, and by `openai_agents_agent` in a worker
(`RUNLOG_AGENT=bench._fw_openai_agents:agent`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from agents import Agent, Runner, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.stream_events import RawResponsesStreamEvent
from agents.tool import Tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from workers.frameworks.openai_agents import openai_agents_agent

from ._agents import deltas

set_tracing_disabled(True)  # offline: nothing goes to a trace endpoint


def _n(input: str | list[TResponseInputItem]) -> int:
    """n: the last user message (the session's earlier runs come before it)."""
    if isinstance(input, str):
        return int(input)
    users: list[Any] = [i for i in input if dict(i).get("role") == "user"]
    content = users[-1]["content"]
    return int(content if isinstance(content, str) else content[0]["text"])


class Chunks(Model):
    """Streams one assistant message of `deltas(n)`, a delta event each."""

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> ModelResponse:
        raise NotImplementedError("streams only")

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: ResponsePromptParam | None,
    ) -> AsyncIterator[TResponseStreamEvent]:
        pieces = deltas(_n(input))
        msg = ResponseOutputMessage(
            id="msg_bench", type="message", role="assistant", status="in_progress", content=[]
        )
        yield ResponseOutputItemAddedEvent(
            type="response.output_item.added", item=msg, output_index=0, sequence_number=0
        )
        for piece in pieces:
            yield ResponseTextDeltaEvent(
                type="response.output_text.delta", item_id="msg_bench", output_index=0,
                content_index=0, delta=piece, logprobs=[], sequence_number=0,
            )  # fmt: skip
        text = ResponseOutputText(
            type="output_text", text="".join(pieces), annotations=[], logprobs=[]
        )
        done = msg.model_copy(update={"status": "completed", "content": [text]})
        yield ResponseOutputItemDoneEvent(
            type="response.output_item.done", item=done, output_index=0, sequence_number=0
        )
        usage = ResponseUsage(
            input_tokens=1, output_tokens=len(pieces), total_tokens=1 + len(pieces),
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        )  # fmt: skip
        response = Response(
            id="resp_bench", created_at=0, model="bench", object="response", output=[done],
            tool_choice="auto", tools=[], top_p=None, parallel_tool_calls=False,
            status="completed", usage=usage,
        )  # fmt: skip
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


_AGENT = Agent(name="bench", instructions="Answer.", model=Chunks())


async def bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    async def one() -> int:
        k = 0
        result = Runner.run_streamed(_AGENT, str(n))
        async for ev in result.stream_events():
            k += isinstance(ev, RawResponsesStreamEvent) and isinstance(
                ev.data, ResponseTextDeltaEvent
            )
        return k

    return sum(await asyncio.gather(*(one() for _ in range(runs))))


agent = openai_agents_agent(_AGENT)
