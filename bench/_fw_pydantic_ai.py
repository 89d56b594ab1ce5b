"""`bench agents` case `pydantic-ai`: a Pydantic AI agent on its own
`FunctionModel`, whose stream function yields `deltas(n)` (n = the run's
input) as fast as it can; run bare with `agent.run(event_stream_handler=...)`
in the bench process, and by `pydantic_ai_agent` in a worker
(`RUNLOG_AGENT=bench._fw_pydantic_ai:agent`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Mapping

from pydantic_ai import Agent, RunContext, models
from pydantic_ai.messages import (
    AgentStreamEvent,
    ModelMessage,
    ModelRequest,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from workers.frameworks.pydantic_ai import pydantic_ai_agent

from ._agents import deltas

models.ALLOW_MODEL_REQUESTS = False  # offline: no request may reach a real model


async def _stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
    prompt = next(
        p.content
        for m in reversed(messages)
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart)
    )
    for piece in deltas(int(str(prompt))):
        yield piece


_AGENT: Agent[None, str] = Agent(FunctionModel(stream_function=_stream))


async def bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    async def one() -> int:
        k = 0

        async def handle(ctx: RunContext[None], stream: AsyncIterable[AgentStreamEvent]) -> None:
            nonlocal k
            async for ev in stream:
                if isinstance(ev, PartStartEvent) and isinstance(ev.part, TextPart):
                    k += bool(ev.part.content)
                elif isinstance(ev, PartDeltaEvent) and isinstance(ev.delta, TextPartDelta):
                    k += bool(ev.delta.content_delta)

        await _AGENT.run(str(n), event_stream_handler=handle)
        return k

    return sum(await asyncio.gather(*(one() for _ in range(runs))))


agent = pydantic_ai_agent(_AGENT)
