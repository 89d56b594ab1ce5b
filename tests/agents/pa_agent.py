"""A Pydantic AI agent run through the adapter, for tests/test_agent_pydantic_ai.py
(in-process and as `runlog worker --agent tests.agents.pa_agent:agent`).

Its model is Pydantic AI's own `FunctionModel`; the run's input (a JSON object)
says what the model streams:

- {"do": "answer", "gate": g}: a thought, "Hello", then (once the test sets
  `gate(g)`, in-process) " world";
- {"do": "lookup"}: a call of `lookup` whose arguments stream in two pieces,
  then an answer quoting what the tool returned;
- {"do": "send", "dir": d}: the same with `send_report`, which requires
  approval; its side effect appends to `d/sent`. With "hold": the model
  waits for the file `d/go` (a gate across processes: a worker to be killed
  waits there for good) at that point: "before_tool" after "Sending. " and
  before the call, "after_tool" before its answer, "answer" in the middle of
  its answer (after "send_report: "), and "in_tool": the tool itself, after
  appending to `d/started` and before its side effect;
- {"do": "await_file", "dir": d}: "Hello", then (once the file `d/go` exists:
  a gate across processes) " world";
- {"do": "hang", "dir": d}: "Working", then waits forever; how its stream was
  closed (the exception's name) goes to `d/closed`;
- {"do": "think_only"}: a thought and never an answer (Pydantic AI gives up:
  `UnexpectedModelBehavior`);
- {"do": "history"}: the message history it was given, one line per message
  before this run's prompt ("user: ..." or "model: ...").

After a tool returned, the model answers "<tool>: <what the model got>".
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import DeferredToolRequests, RunContext, models
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    TextPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import (
    AgentInfo,
    DeltaThinkingCalls,
    DeltaThinkingPart,
    DeltaToolCall,
    DeltaToolCalls,
    FunctionModel,
)
from pydantic_ai.usage import UsageLimits

from workers.frameworks.pydantic_ai import pydantic_ai_agent

# What Pydantic AI's testing docs recommend: no request may reach a real model.
models.ALLOW_MODEL_REQUESTS = False

GATES: dict[str, asyncio.Event] = {}


def gate(name: str) -> asyncio.Event:
    return GATES.setdefault(name, asyncio.Event())


def _spec(messages: Sequence[ModelMessage]) -> dict[str, Any]:
    """The run's input: the last JSON user prompt (earlier runs' come before
    it, Pydantic AI's retry prompts after it)."""
    for m in reversed(messages):
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart) and str(p.content).startswith("{"):
                    spec: dict[str, Any] = json.loads(str(p.content))
                    return spec
    raise AssertionError("no user prompt")


def _append(directory: str, name: str, text: str) -> None:
    with (Path(directory) / name).open("a") as f:
        f.write(text)


def _call(name: str, pieces: list[str]) -> list[DeltaToolCalls]:
    first: DeltaToolCalls = {0: DeltaToolCall(name=name, tool_call_id=f"call_{name}")}
    return [first, *({0: DeltaToolCall(json_args=p)} for p in pieces)]


async def _stream(
    messages: list[ModelMessage], info: AgentInfo
) -> AsyncIterator[str | DeltaToolCalls | DeltaThinkingCalls]:
    spec = _spec(messages)
    hold = spec.get("hold")
    last = messages[-1]
    returned = [p for p in last.parts if isinstance(p, ToolReturnPart)]
    if returned:
        if hold == "after_tool":
            await _wait_for_go(spec)
        name, got = returned[0].tool_name, returned[0].model_response_str()
        if hold == "answer":
            yield f"{name}: "
            await _wait_for_go(spec)
            yield got
        else:
            yield f"{name}: {got}"
        return
    match spec["do"]:
        case "answer":
            yield {0: DeltaThinkingPart(content="Let me think.")}
            yield "Hello"
            await gate(spec["gate"]).wait()
            yield " world"
        case "await_file":
            yield "Hello"
            await _wait_for_go(spec)
            yield " world"
        case "lookup":
            for d in _call("lookup", ['{"city": ', '"Paris"}']):
                yield d
        case "send":
            if hold == "before_tool":
                yield "Sending. "
                await _wait_for_go(spec)
            for d in _call("send_report", ['{"to": ', '"bob"}']):
                yield d
        case "hang":
            yield "Working"
            try:
                await asyncio.Event().wait()
            except BaseException as e:
                _append(spec["dir"], "closed", type(e).__name__)
                raise
        case "think_only":
            yield {0: DeltaThinkingPart(content="hmm")}
        case "history":
            yield "".join(f"{line}\n" for line in _lines(messages[:-1]))


async def _wait_for_go(spec: dict[str, Any]) -> None:
    while not (Path(spec["dir"]) / "go").exists():
        await asyncio.sleep(0.05)


def _lines(messages: list[ModelMessage]) -> list[str]:
    out = []
    for m in messages:
        for p in m.parts:
            if isinstance(p, UserPromptPart):
                out.append(f"user: {p.content}")
            elif isinstance(p, TextPart):
                out.append(f"model: {p.content}")
    return out


base: PydanticAgent[None, str | DeferredToolRequests] = PydanticAgent(
    FunctionModel(stream_function=_stream), output_type=[str, DeferredToolRequests]
)


@base.tool_plain
def lookup(city: str) -> str:
    return f"sunny in {city}"


@base.tool(requires_approval=True)
def send_report(ctx: RunContext[None], to: str) -> str:
    spec = _spec(ctx.messages)
    if spec.get("hold") == "in_tool":
        _append(spec["dir"], "started", "x")
        while not (Path(spec["dir"]) / "go").exists():  # a thread of Pydantic AI's
            time.sleep(0.05)
    _append(spec["dir"], "sent", "x")
    return f"sent to {to}"


agent = pydantic_ai_agent(base)
limited = pydantic_ai_agent(base, usage_limits=UsageLimits(request_limit=1))
