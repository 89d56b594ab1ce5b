"""A LangGraph graph run by runlog's LangGraph adapter, for
tests/test_agent_langgraph.py (in the test's process and in `runlog worker`
subprocesses: `RUNLOG_AGENT=tests.agents.lg_agent:agent`).

A ReAct-shaped graph: `llm` (a langchain-core chat model that streams what the
run's input asks for) → `tools` (a ToolNode) → `llm` ... The input is a JSON
object (the last human message: earlier ones are the session's earlier
runs), e.g. {"say": "Hello there", "tool": "delete", "dir": "/tmp/x"}:

- `say`: the first reply's words, one chunk each (in a process with
  LG_AGENT_HANG_AFTER=n in its environment, the model hangs after n chunks);
- `tool`: "lookup" (arguments streamed in two chunks, progress written
  through the stream writer) or "delete" (asks for approval with
  `interrupt()`, then deletes: appends to `dir`/deleted, which the tests count);
- `gate`: after the first chunk, wait for `GATES[gate]` (in-process tests);
  the model notes in `SEEN[gate]` that its stream was cancelled or closed;
- `count`: the first reply ends with how many messages the model was given;
- `fail`: the model raises;
- `audit`: the tools run beside a node `audit` (the same superstep), which
  waits for the file `dir`/go;
- `hold`: the model waits for the file `dir`/go (a gate across processes: a
  worker to be killed waits there for good) at that point: "before_tool"
  after its words and before its tool call, "after_tool" before its answer to
  a tool result, "answer" after that answer's first chunk; "in_tool": in
  `delete_rows`, right after its side effect.
After a tool result the model answers "Done: <result>."
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessageChunk, BaseMessage, HumanMessage, ToolMessage
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.config import get_stream_writer
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode
from langgraph.types import interrupt

from workers.frameworks.langgraph import langgraph_agent

HANG_AFTER = "LG_AGENT_HANG_AFTER"  # env: the model stops after that many chunks, for good
GATES: dict[str, asyncio.Event] = {}
SEEN: dict[str, list[str]] = {}


def gate(name: str) -> asyncio.Event:
    return GATES.setdefault(name, asyncio.Event())


def _spec(messages: Sequence[BaseMessage]) -> dict[str, Any]:
    """This run's input: the last human message (earlier ones are the session's)."""
    last = next(m for m in reversed(messages) if isinstance(m, HumanMessage))
    spec: dict[str, Any] = json.loads(last.text)
    return spec


class ScriptedChat(BaseChatModel):
    """Streams the reply the run's input asks for (see the module doc)."""

    @property
    def _llm_type(self) -> str:
        return "runlog-test-scripted"

    def _generate(self, *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError("streams only")

    async def _astream(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> AsyncIterator[ChatGenerationChunk]:
        spec = _spec(messages)
        name = spec.get("gate", "")
        hang_after = int(os.environ.get(HANG_AFTER, "0"))
        answering = isinstance(messages[-1], ToolMessage)
        try:
            for i, chunk in enumerate(_reply(spec, messages)):
                if hang_after and i == hang_after:
                    await asyncio.Event().wait()  # a worker that is about to be killed
                if _holds(spec.get("hold"), answering, i, chunk):
                    while not (Path(spec["dir"]) / "go").exists():
                        await asyncio.sleep(0.05)
                yield ChatGenerationChunk(message=chunk)
                if i == 0 and name:
                    await gate(name).wait()
        except (asyncio.CancelledError, GeneratorExit) as e:
            SEEN.setdefault(name, []).append(type(e).__name__)
            raise


def _holds(hold: str | None, answering: bool, i: int, chunk: AIMessageChunk) -> bool:
    match hold:
        case "before_tool":
            return (
                not answering
                and bool(chunk.tool_call_chunks)
                and chunk.tool_call_chunks[0]["name"] is not None
            )
        case "after_tool":
            return answering and i == 0
        case "answer":
            return answering and i == 1
    return False


def _reply(spec: dict[str, Any], messages: list[BaseMessage]) -> list[AIMessageChunk]:
    last = messages[-1]
    if spec.get("fail"):
        raise RuntimeError("the model broke")
    if isinstance(last, ToolMessage):
        words = f"Done: {last.text}.".split(" ")
        tool_chunks: list[tuple[str, str]] = []
    else:
        words = str(spec.get("say", "Hello")).split(" ")
        if spec.get("count"):  # how many messages the model was given
            words.append(f"[{len(messages)}]")
        tool_chunks = {
            "lookup": [('{"q": ', "lookup"), ('"otters"}', "")],
            "delete": [('{"ids": ', "delete_rows"), ("[1, 2]}", "")],
        }.get(spec.get("tool", ""), [])
    out = [AIMessageChunk(content=w if i == 0 else " " + w) for i, w in enumerate(words)]
    for args, tool_name in tool_chunks:
        tc = tool_call_chunk(args=args, index=0, name=tool_name or None)
        tc["id"] = f"call_{tool_name}" if tool_name else None
        out.append(AIMessageChunk(content="", tool_call_chunks=[tc]))
    out[-1].usage_metadata = {"input_tokens": 5, "output_tokens": len(out), "total_tokens": 0}
    return out


@tool
def lookup(q: str) -> str:
    """Look something up."""
    write = get_stream_writer()
    write({"label": "searching", "done": 1, "total": 2})
    write({"label": "searching", "done": 2, "total": 2})
    return f"found 3 {q}"


@tool
def delete_rows(
    ids: list[int],
    tool_call_id: Annotated[str, InjectedToolCallId],
    state: Annotated[dict[str, Any], InjectedState],
    config: RunnableConfig,
) -> str:
    """Delete rows, once a human approved it."""
    decision = interrupt({"summary": f"delete rows {ids}?", "tool_call_id": tool_call_id})
    if not decision["approved"]:
        return f"not deleted ({decision['decision']}: {decision['comment']})"
    spec = _spec(state["messages"])
    with (Path(spec["dir"]) / "deleted").open("a") as f:
        f.write(config["configurable"]["thread_id"] + "\n")
    if spec.get("hold") == "in_tool":
        while not (Path(spec["dir"]) / "go").exists():  # in a thread of LangGraph's
            time.sleep(0.05)
    return f"deleted {len(ids)} rows"


def build_graph() -> StateGraph[Any]:
    model = ScriptedChat()

    async def llm(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def route(state: MessagesState) -> str | list[str]:
        last = state["messages"][-1]
        if not getattr(last, "tool_calls", None):
            return END
        return ["tools", "audit"] if _spec(state["messages"]).get("audit") else "tools"

    async def audit(state: MessagesState) -> dict[str, Any]:
        """Beside the tools, in their superstep: waits for `dir`/go."""
        while not (Path(_spec(state["messages"])["dir"]) / "go").exists():
            await asyncio.sleep(0.05)
        return {}

    b = StateGraph(MessagesState)
    b.add_node("llm", llm)
    b.add_node("tools", ToolNode([lookup, delete_rows]))
    b.add_node("audit", audit)
    b.add_edge(START, "llm")
    b.add_conditional_edges("llm", route, ["tools", "audit", END])
    b.add_edge("tools", "llm")
    b.add_edge("audit", "llm")
    return b


agent = langgraph_agent(build_graph(), risk={"delete_rows": "high"})
