"""An OpenAI Agents SDK agent for tests/test_agent_openai_agents.py, run by
in-process workers and by `runlog worker` processes
(`RUNLOG_AGENT=tests.agents.oa_agent:agent`).

Its model (`ScriptModel`, the SDK's `Model` interface, offline) plays what the
run's input asks for, a JSON object:
  {"words": ["Hel", "lo"], "gate": "g1", "reasoning": "hmm"}  text (waits on
      GATES["g1"] after the first word), reasoning first;
  {"tool": "lookup" | "whoami" | "delete_rows", "args": ["{\\"q\\"", ...]}  one function call,
      its arguments streamed in those pieces; the next call answers
      "done: <the tool's output>";
  {"echo": true}  answers with its input, as JSON [role, content] pairs;
  {"stall": "tag"}  one word, then waits forever (records how its stream ended);
  {"stall_once": dir, "words": [...]}  the first call (of any process) stalls, later
      ones stream the words;
  {"error": "rate_limit" | "boom"}, {"loop": true}  fails / calls lookup forever;
  {"tool": ..., "hold": point, "gate_dir": dir}  the model waits for the file
      dir/go (a gate across processes: a worker to be killed waits there for
      good) at that point: "before_tool" after "Sending. " and before the
      call, "after_tool" before its answer, "answer" in the middle of it
      (after "done: ").
Side effects are counted in files under the spec's "dir" (across processes);
in-process tests also see `SEEN` (what the model noticed, by tag).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import openai
from agents import Agent, RunContextWrapper, function_tool, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.model_settings import ModelSettings
from agents.models.interface import Model, ModelTracing
from agents.tool import Tool
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseTextDeltaEvent,
    ResponseUsage,
)
from openai.types.responses.response_prompt_param import ResponsePromptParam
from openai.types.responses.response_reasoning_item import Summary
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails

from workers.frameworks.openai_agents import openai_agents_agent

set_tracing_disabled(True)  # nothing of the tests goes to OpenAI's trace endpoint

GATES: dict[str, asyncio.Event] = {}
SEEN: dict[str, list[str]] = {}


def gate(name: str) -> asyncio.Event:
    return GATES.setdefault(name, asyncio.Event())


def count(directory: str, name: str) -> None:
    with (Path(directory) / name).open("a") as f:
        f.write("x")


def counted(directory: Path, name: str) -> int:
    p = directory / name
    return len(p.read_text()) if p.exists() else 0


# -- the tools


@function_tool
async def lookup(q: str) -> str:
    """Look q up."""
    return f"found {q}"


@function_tool
async def whoami(wrapper: RunContextWrapper[dict[str, str]]) -> str:
    """Who started the run (from the SDK context the adapter's factory made)."""
    return wrapper.context["user"]


@function_tool(needs_approval=True)
async def delete_rows(dir: str, n: int, hold_s: float = 0.0) -> str:
    """Delete n rows (the test counts it in dir), taking hold_s to do it."""
    count(dir, "started")
    await asyncio.sleep(hold_s)
    count(dir, "delete")
    return f"deleted {n} rows"


# -- the model


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def _spec(items: str | list[TResponseInputItem]) -> dict[str, Any]:
    if isinstance(items, str):
        return dict(json.loads(items))
    users = [_get(i, "content") for i in items if _get(i, "role") == "user"]
    return dict(json.loads(users[-1]))


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(str(_get(part, "text") or "") for part in content or [])


def _usage(i: int, o: int, r: int = 0) -> ResponseUsage:
    return ResponseUsage(
        input_tokens=i,
        output_tokens=o,
        total_tokens=i + o,
        input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=r),
    )


def _completed(output: list[ResponseOutputItem], usage: ResponseUsage) -> ResponseCompletedEvent:
    response = Response(
        id="resp_test", created_at=0, model="script", object="response", output=output,
        tool_choice="auto", tools=[], top_p=None, parallel_tool_calls=False,
        status="completed", usage=usage,
    )  # fmt: skip
    return ResponseCompletedEvent(type="response.completed", response=response, sequence_number=0)


def _message_events(index: int, words: list[str]) -> list[Any]:
    msg = ResponseOutputMessage(
        id="msg_test", type="message", role="assistant", status="in_progress", content=[]
    )
    added = ResponseOutputItemAddedEvent(
        type="response.output_item.added", item=msg, output_index=index, sequence_number=0
    )
    deltas = [
        ResponseTextDeltaEvent(
            type="response.output_text.delta",
            item_id="msg_test",
            output_index=index,
            content_index=0,
            delta=w,
            logprobs=[],
            sequence_number=0,
        )
        for w in words
    ]
    text = ResponseOutputText(type="output_text", text="".join(words), annotations=[], logprobs=[])
    done_msg = msg.model_copy(update={"status": "completed", "content": [text]})
    done = ResponseOutputItemDoneEvent(
        type="response.output_item.done", item=done_msg, output_index=index, sequence_number=0
    )
    return [added, *deltas, done]


class ScriptModel(Model):
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
        raise NotImplementedError("the adapter streams")

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
        spec = _spec(input)
        outputs = [
            str(_get(i, "output"))
            for i in (input if isinstance(input, list) else [])
            if _get(i, "type") == "function_call_output"
        ]
        if "error" in spec:
            raise _error(spec["error"])
        if "stall" in spec:
            async for e in _stall(spec["stall"]):
                yield e
            return
        if "stall_once" in spec and not counted(Path(spec["stall_once"]), "stalled"):
            count(spec["stall_once"], "stalled")
            async for e in _stall("once"):
                yield e
            return
        hold = spec.get("hold")
        if spec.get("loop") or ("tool" in spec and not outputs):
            name = "lookup" if spec.get("loop") else spec["tool"]
            pieces = spec.get("args", ['{"q": "x"}'])
            before: list[ResponseOutputItem] = []
            if hold == "before_tool":
                text = _message_events(0, ["Sending. "])
                for e in text:
                    yield e
                before.append(text[-1].item)
                await _wait_for_go(spec)
            for e in _call_events(name, pieces, len(outputs), before):
                yield e
            return
        if outputs and hold == "after_tool":
            await _wait_for_go(spec)
        if spec.get("echo"):  # what the model was given, as [role, content] pairs
            said = [[_get(i, "role"), _text(_get(i, "content"))] for i in input if _get(i, "role")]
            words = [json.dumps(said)]
        elif outputs:
            words = ["done: ", outputs[-1]] if hold == "answer" else [f"done: {outputs[-1]}"]
        else:
            words = list(spec.get("words", ["ok"]))
        out: list[ResponseOutputItem] = []
        index = 0
        if "reasoning" in spec:
            r = ResponseReasoningItem(
                id="rs_test",
                type="reasoning",
                summary=[Summary(text=spec["reasoning"], type="summary_text")],
            )
            yield ResponseOutputItemAddedEvent(
                type="response.output_item.added",
                item=r.model_copy(update={"summary": []}),
                output_index=0,
                sequence_number=0,
            )
            yield ResponseReasoningSummaryTextDeltaEvent(
                type="response.reasoning_summary_text.delta", item_id="rs_test", output_index=0,
                summary_index=0, delta=spec["reasoning"], sequence_number=0,
            )  # fmt: skip
            yield ResponseOutputItemDoneEvent(
                type="response.output_item.done", item=r, output_index=0, sequence_number=0
            )
            out.append(r)
            index = 1
        events = _message_events(index, words)
        for i, e in enumerate(events):
            yield e
            if i == 1 and "gate" in spec:  # the first word is out: wait for the test
                await gate(spec["gate"]).wait()
            if i == 1 and outputs and hold == "answer":
                await _wait_for_go(spec)
        out.append(events[-1].item)
        yield _completed(out, _usage(11, len(words), 2 if "reasoning" in spec else 0))


async def _wait_for_go(spec: dict[str, Any]) -> None:
    while not (Path(spec["gate_dir"]) / "go").exists():
        await asyncio.sleep(0.05)


def _call_events(
    name: str, pieces: list[str], n: int, said: list[ResponseOutputItem] | None = None
) -> list[Any]:
    """A function call at the output index after what the response `said`."""
    call_id = f"call_{n}"
    index = len(said or [])
    fc = ResponseFunctionToolCall(
        id=f"fc_{n}", call_id=call_id, type="function_call", name=name, arguments="",
        status="in_progress",
    )  # fmt: skip
    done = fc.model_copy(update={"arguments": "".join(pieces), "status": "completed"})
    return [
        ResponseOutputItemAddedEvent(
            type="response.output_item.added", item=fc, output_index=index, sequence_number=0
        ),
        *[
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta",
                item_id=f"fc_{n}",
                output_index=index,
                delta=p,
                sequence_number=0,
            )
            for p in pieces
        ],
        ResponseOutputItemDoneEvent(
            type="response.output_item.done", item=done, output_index=index, sequence_number=0
        ),
        _completed([*(said or []), done], _usage(5, 3)),
    ]


async def _stall(tag: str) -> AsyncIterator[Any]:
    seen = SEEN.setdefault(tag, [])
    events = _message_events(0, ["thinking"])
    try:
        for e in events[:2]:
            yield e
        await asyncio.Event().wait()  # a model that never finishes
    except BaseException as e:  # how the stream ended: CancelledError / GeneratorExit
        seen.append(type(e).__name__)
        raise


def _error(kind: str) -> Exception:
    if kind == "rate_limit":
        response = httpx2.Response(429, request=httpx2.Request("POST", "http://model.invalid/v1"))
        return openai.RateLimitError("slow down", response=response, body=None)
    return RuntimeError("the model exploded")


MODEL = ScriptModel()
agent = openai_agents_agent(
    Agent(name="helper", instructions="Help.", model=MODEL, tools=[lookup, whoami, delete_rows]),
    max_turns=3,
    context=lambda ctx: {"user": ctx.started_by},
)
