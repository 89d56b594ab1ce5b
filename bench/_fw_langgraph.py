"""`bench agents` case `langgraph`: a one-node graph (`llm`: a langchain-core
chat model that streams `deltas(n)`, n = the run's input, as fast as it can),
run bare with `astream` (the adapter's stream modes, no checkpointer) in the
bench process, and by `langgraph_agent` in a worker
(`RUNLOG_AGENT=bench._fw_langgraph:agent`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import StreamMode

from workers.frameworks.langgraph import langgraph_agent

from ._agents import deltas

_MODES: list[StreamMode] = ["messages", "updates", "custom"]  # the adapter's


class Chunks(BaseChatModel):
    """Streams `deltas(n)`, n = the last human message, one chunk each."""

    @property
    def _llm_type(self) -> str:
        return "runlog-bench-chunks"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("streams only")

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        last = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
        for piece in deltas(int(last.text)):
            yield ChatGenerationChunk(message=AIMessageChunk(content=piece))


def build() -> StateGraph[Any]:
    model = Chunks()

    async def llm(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    b = StateGraph(MessagesState)
    b.add_node("llm", llm)
    b.add_edge(START, "llm")
    b.add_edge("llm", END)
    return b


_GRAPH = build().compile()


async def bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    async def one() -> int:
        k = 0
        inp = {"messages": [HumanMessage(str(n))]}
        async for _ns, mode, payload in _GRAPH.astream(inp, stream_mode=_MODES, subgraphs=True):
            if mode == "messages" and isinstance(payload[0], AIMessageChunk):
                k += bool(payload[0].text)
        return k

    return sum(await asyncio.gather(*(one() for _ in range(runs))))


agent = langgraph_agent(build())
