"""An OpenAI Agents SDK agent as a runlog agent (docs/agents.md, "OpenAI Agents SDK").

    from agents import Agent, function_tool
    from workers.frameworks.openai_agents import openai_agents_agent

    agent = openai_agents_agent(Agent(name="helper", tools=[...]))

Each run executes `Runner.run_streamed` and maps its stream onto the log:
raw Responses API events give `text_delta`/`reasoning_delta` (one message per
model response, as the built-in loop does) and tool cards (`tool_call_start`,
one `tool_args_delta` per argument delta, `tool_call_end`); the run items give
`tool_result` (tool outputs, handoffs) and `status` (`handoff`); each
response's usage goes to `ctx.usage`.

Durability. The SDK's run is cut into segments, each one `ctx.step` whose
stored result is the serialized `RunState` it ended in:
- `segment-{i}` runs from the input (or a stored state) until the run ends or
  is interrupted by tools with `needs_approval`;
- each interruption becomes `ctx.approval` (on the tool's card);
- `tools-{i}` resumes the state with the decisions applied
  (`RunState.approve`/`reject`) and stops after the approved tools have run
  (`cancel(mode="after_turn")`), before the next model call. It is not
  retryable: a worker dying while an approved tool runs fails the run
  `step_interrupted` instead of running the tool twice.
A takeover replays the stored segments and decisions and goes on from the
last stored state, on any worker. What is not durable: the segment in flight
(its model calls are made again, and tools without approval that it ran are
run again: runlog fails such a takeover `worker_lost` once a `tool_result` of
that segment is in the log).

Stop: the task's cancellation reaches `stream_events`, which cancels the SDK's
run task and with it the model's stream (the HTTP response is closed); this
module waits for that task to settle before unwinding.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, cast

import msgspec
import openai
from agents import (
    Agent as SdkAgent,
)
from agents import (
    AgentsException,
    InputGuardrailTripwireTriggered,
    MaxTurnsExceeded,
    ModelBehaviorError,
    OutputGuardrailTripwireTriggered,
    RunConfig,
    Runner,
    RunResultStreaming,
    RunState,
    UserError,
)
from agents.items import HandoffOutputItem, ToolApprovalItem, ToolCallItem, ToolCallOutputItem
from agents.models.multi_provider import MultiProvider
from agents.stream_events import RawResponsesStreamEvent, RunItemStreamEvent, StreamEvent
from openai.types.responses import (
    ResponseCompletedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseReasoningSummaryTextDeltaEvent,
    ResponseReasoningTextDeltaEvent,
    ResponseRefusalDeltaEvent,
    ResponseTextDeltaEvent,
)

from broker.events import RiskLevel, ToolStatus
from workers.api import Agent, AgentContext, AgentError, Decision

__all__ = ["openai_agents_agent"]

_SUMMARY_CHARS = 200
_OUTPUT_CHARS = 8000  # well inside max_event_bytes however the text escapes


class _Pending(msgspec.Struct):
    """One interruption: a tool call waiting for its approval."""

    call_id: str  # the SDK's (the model's) call id
    tool_call_id: str  # runlog's card
    tool_name: str
    arguments: str


class _Segment(msgspec.Struct):
    """What a segment step stores."""

    state: dict[str, Any] | None = None  # RunState.to_json() to go on from; None: run over
    pending: list[_Pending] = []
    cards: dict[str, str] = {}  # SDK call id → runlog tool_call_id, cards without a result


def openai_agents_agent(
    agent: SdkAgent[Any],
    *,
    max_turns: int = 10,
    run_config: RunConfig | None = None,
    context: Callable[[AgentContext], Any] | None = None,
    risk: Mapping[str, RiskLevel] | None = None,
) -> Agent:
    """A runlog agent running `agent` with `Runner.run_streamed`.

    `max_turns`: the SDK's bound on the run's turns (the `RunState` keeps
    counting across approvals; exceeding it fails the run `max_turns_exceeded`).
    `run_config`: passed to every segment; if given, its model provider is
    yours to close (without one, each run gets a `MultiProvider`, closed when
    the run ends). `context`: called once per execution of a run, returns the
    SDK run context its tools see (`RunContextWrapper.context`); a mapping is
    stored with the `RunState` (a resume on another worker gets the stored
    copy), anything else is not stored: the resuming execution's own is used.
    `risk`: tool name → risk level of its card; tools not named are `high` if
    they have `needs_approval`, else `low`.
    """
    risks = dict(risk or {})

    async def run(ctx: AgentContext) -> None:
        provider = MultiProvider() if run_config is None else None
        config = RunConfig(model_provider=provider) if provider is not None else run_config
        assert config is not None
        try:
            sdk_context = context(ctx) if context is not None else None
            await _Run(ctx, agent, config, max_turns, sdk_context, risks).run()
        finally:
            if provider is not None:
                await provider.aclose()

    return run


class _Run:
    def __init__(
        self,
        ctx: AgentContext,
        agent: SdkAgent[Any],
        config: RunConfig,
        max_turns: int,
        context: Any,
        risks: dict[str, RiskLevel],
    ) -> None:
        self.ctx = ctx
        self.agent = agent
        self.config = config
        self.max_turns = max_turns
        self.context = context
        self.risks = risks

    async def run(self) -> None:
        ctx = self.ctx
        history = await ctx.conversation()
        items: list[Any] = [{"role": m.role, "content": m.content} for m in history]
        items.append({"role": "user", "content": ctx.input})

        async def first() -> _Segment:
            return await self._segment(items, {}, after_turn=False)

        seg: _Segment = await ctx.step("segment-0", first, type=_Segment)
        i = 0
        while seg.state is not None:
            i += 1
            decisions = [
                await ctx.approval(_approval_summary(p), tool_call_id=p.tool_call_id)
                for p in seg.pending
            ]
            seg = await self._next(i, seg, decisions)

    async def _next(self, i: int, seg: _Segment, decisions: list[Decision]) -> _Segment:
        assert seg.state is not None
        state_json = seg.state

        async def resume() -> _Segment:
            state = await self._restore(state_json)
            decided = _apply(state, seg.pending, decisions)
            return await self._segment(
                state, seg.cards, after_turn=bool(seg.pending), decided=decided
            )

        if seg.pending:
            return await self.ctx.step(f"tools-{i}", resume, retryable=False, type=_Segment)
        return await self.ctx.step(f"segment-{i}", resume, type=_Segment)

    async def _restore(self, state_json: dict[str, Any]) -> RunState[Any, SdkAgent[Any]]:
        # A mapping context comes back from the state; anything else was
        # stored empty (_unstored) and is this execution's own.
        own = None if isinstance(self.context, Mapping) else self.context
        try:
            return await RunState.from_json(self.agent, state_json, context_override=own)
        except (AgentsException, ValueError, TypeError) as e:
            # The agent's definition changed under a stored run (a tool or
            # agent renamed): the state cannot be resumed.
            raise AgentError("agent_state_incompatible", type(e).__name__) from e

    async def _segment(
        self,
        start: list[Any] | RunState[Any, SdkAgent[Any]],
        cards: dict[str, str],
        *,
        after_turn: bool,
        decided: dict[str, ToolStatus] | None = None,
    ) -> _Segment:
        result = Runner.run_streamed(
            self.agent,
            start,
            context=None if isinstance(start, RunState) else self.context,  # a state has its own
            max_turns=self.max_turns,
            run_config=self.config,
        )
        if after_turn:
            # Run the approved (and rejected) calls, stop before the next model call.
            result.cancel(mode="after_turn")
        mapper = _Mapper(self.ctx, result, dict(cards), decided or {}, self.risks)
        # An async generator (mypy sees AsyncIterator): closed explicitly below.
        stream = cast(AsyncGenerator[StreamEvent, None], result.stream_events())
        try:
            while True:
                try:
                    event = await anext(stream)
                except StopAsyncIteration:
                    break
                except Exception as e:
                    coded = _coded(e)
                    if coded is e:
                        raise
                    raise coded from e
                await mapper.on(event)
        except BaseException:
            # Before closing the stream: closing it un-cancelled waits for the
            # whole run (the model's stream included) to end.
            result.cancel()
            raise
        finally:
            await stream.aclose()
            await _settle(result)
        return await mapper.finish(over=not after_turn)


class _Mapper:
    """The SDK's stream events → runlog events, for one segment."""

    def __init__(
        self,
        ctx: AgentContext,
        result: RunResultStreaming,
        cards: dict[str, str],
        decided: dict[str, ToolStatus],
        risks: dict[str, RiskLevel],
    ) -> None:
        self.ctx = ctx
        self.result = result
        self.cards = cards
        self.decided = decided
        self.risks = risks
        self.message_id = ""  # of the model response streaming now
        self.by_index: dict[int, str] = {}  # output_index → tool_call_id, this response
        self.streamed_args: set[str] = set()

    async def on(self, event: StreamEvent) -> None:
        if isinstance(event, RawResponsesStreamEvent):
            await self._raw(event.data)
        elif isinstance(event, RunItemStreamEvent):
            await self._item(event)

    async def _raw(self, data: Any) -> None:
        ctx = self.ctx
        match data:
            case ResponseTextDeltaEvent() | ResponseRefusalDeltaEvent():
                await ctx.text(self._message(), data.delta)
            case ResponseReasoningSummaryTextDeltaEvent() | ResponseReasoningTextDeltaEvent():
                await ctx.reasoning(self._message(), data.delta)
            case ResponseOutputItemAddedEvent(item=ResponseFunctionToolCall() as call):
                tc = await self._open(call.call_id, call.name)
                self.by_index[data.output_index] = tc
                await self._args(tc, call.arguments)
            case ResponseFunctionCallArgumentsDeltaEvent():
                if data.output_index in self.by_index:
                    await self._args(self.by_index[data.output_index], data.delta)
            case ResponseOutputItemDoneEvent(item=ResponseFunctionToolCall() as call):
                if data.output_index in self.by_index:
                    tc = self.by_index.pop(data.output_index)
                    if tc not in self.streamed_args:  # a provider that sends them whole
                        await self._args(tc, call.arguments)
                    await ctx.tool_end(tc)
            case ResponseCompletedEvent(response=response):
                if response.usage is not None:
                    u = response.usage
                    ctx.usage(
                        input_tokens=u.input_tokens,
                        output_tokens=u.output_tokens,
                        reasoning_tokens=u.output_tokens_details.reasoning_tokens,
                    )
                self.message_id = ""
                self.by_index.clear()

    async def _item(self, event: RunItemStreamEvent) -> None:
        item = event.item
        if isinstance(item, ToolCallItem) and event.name == "tool_called":
            # Tools the raw stream showed no call for (hosted tools, some providers).
            call_id = _call_id(item.raw_item)
            if call_id and call_id not in self.cards:
                tc = await self._open(call_id, _name(item.raw_item))
                await self._args(tc, str(getattr(item.raw_item, "arguments", "") or ""))
                await self.ctx.tool_end(tc)
        elif isinstance(item, ToolCallOutputItem):
            tc = self.cards.pop(_call_id(item.raw_item), "")
            if tc:
                out = str(item.output)
                status = self.decided.get(_call_id(item.raw_item), "ok")
                await self.ctx.tool_result(
                    tc, status, _cut(out, _SUMMARY_CHARS), _cut(out, _OUTPUT_CHARS)
                )
        elif isinstance(item, HandoffOutputItem):
            a, b = item.source_agent.name, item.target_agent.name
            tc = self.cards.pop(_call_id(item.raw_item), "")
            if tc:
                await self.ctx.tool_result(tc, "ok", f"handed off to {b}")
            await self.ctx.status("handoff", f"{a} → {b}")

    def _message(self) -> str:
        if not self.message_id:
            self.message_id = self.ctx.message_id()
        return self.message_id

    async def _open(self, call_id: str, name: str) -> str:
        tc = self.ctx.tool_call_id()
        self.cards[call_id] = tc
        await self.ctx.tool_start(tc, name, risk=self._risk(name))
        return tc

    async def _args(self, tc: str, delta: str) -> None:
        if delta:
            self.streamed_args.add(tc)
            await self.ctx.tool_args(tc, delta)

    def _risk(self, name: str) -> RiskLevel:
        if name in self.risks:
            return self.risks[name]
        for tool in self.result.current_agent.tools:
            if getattr(tool, "name", None) == name:
                return "high" if getattr(tool, "needs_approval", False) is not False else "low"
        return "low"

    async def finish(self, *, over: bool) -> _Segment:
        """The segment's stored result, once the stream has ended; `over`: the
        run ends here unless interrupted (a `tools-` segment stops after its turn)."""
        result = self.result
        pending = []
        for item in result.interruptions:
            call_id = _call_id(item.raw_item)
            tc = self.cards.get(call_id)
            if tc is None:  # interrupted before its call was streamed to us
                tc = await self._open(call_id, item.name or "tool")
                await self._args(tc, item.arguments or "")
                await self.ctx.tool_end(tc)
            pending.append(_Pending(call_id, tc, item.name or "tool", item.arguments or ""))
        if not pending and (over or result.final_output is not None):
            return _Segment()  # over: nothing to resume from
        state = result.to_state().to_json(context_serializer=_unstored)
        return _Segment(state=state, pending=pending, cards=self.cards)


def _apply(
    state: RunState[Any, SdkAgent[Any]], pending: list[_Pending], decisions: list[Decision]
) -> dict[str, ToolStatus]:
    """Apply runlog's decisions to the restored state; the card status each call gets."""
    items: dict[str, ToolApprovalItem] = {
        _call_id(i.raw_item): i for i in state.get_interruptions()
    }
    statuses: dict[str, ToolStatus] = {}
    for p, d in zip(pending, decisions, strict=True):
        item = items.get(p.call_id)
        if item is None:
            raise AgentError("agent_state_incompatible", f"no interruption for call {p.call_id}")
        if d.approved:
            state.approve(item)
            statuses[p.call_id] = "ok"
        elif d.decision == "expired":
            state.reject(item, rejection_message="the approval expired; the call did not run")
            statuses[p.call_id] = "skipped"
        else:
            reason = d.comment or "the approver rejected this call"
            state.reject(item, rejection_message=f"denied: {reason}")
            statuses[p.call_id] = "denied"
    return statuses


async def _settle(result: RunResultStreaming) -> None:
    """Make sure the SDK's run task is over (and with it the model's stream)
    before the segment unwinds: `stream_events` cancelled at its queue wait
    cancels the task but does not wait for it."""
    task = result.run_loop_task
    if task is None or task.done():
        return
    result.cancel()
    await asyncio.wait((task,))


def _coded(e: Exception) -> Exception:
    """An exception out of the SDK's run → the run's coded error."""
    for err in (e, e.__cause__):
        if isinstance(err, AgentError):
            return err  # raised by a tool of yours, passed through by the SDK
    match e:
        case MaxTurnsExceeded():
            return AgentError("max_turns_exceeded", str(e))
        case InputGuardrailTripwireTriggered() | OutputGuardrailTripwireTriggered():
            return AgentError("guardrail_tripped", type(e).__name__)
        case ModelBehaviorError():
            return AgentError("model_behavior_error", "the model's output could not be used")
        case UserError():
            return AgentError("agent_misconfigured", type(e).__name__)
        case openai.APIStatusError():
            return AgentError(
                "model_error",
                f"the model provider answered {e.status_code}",
                retryable=e.status_code == 429 or e.status_code >= 500,
            )
        case openai.APIConnectionError():  # timeouts too
            return AgentError("model_unavailable", type(e).__name__, retryable=True)
        case AgentsException():
            return AgentError("agents_sdk_error", type(e).__name__)
    return e  # not the SDK's: runlog reports agent_error, the traceback in the log


def _unstored(context: Any) -> dict[str, Any]:
    """What a RunState stores of a context that is not a mapping (mappings are
    stored as they are): nothing, the resuming execution passes its own."""
    return {}


def _call_id(raw: Any) -> str:
    if isinstance(raw, Mapping):
        return str(raw.get("call_id") or raw.get("id") or "")
    return str(getattr(raw, "call_id", None) or getattr(raw, "id", None) or "")


def _name(raw: Any) -> str:
    if isinstance(raw, Mapping):
        return str(raw.get("name") or raw.get("type") or "tool")
    return str(getattr(raw, "name", None) or getattr(raw, "type", None) or "tool")


def _approval_summary(p: _Pending) -> str:
    return _cut(f"{p.tool_name}({p.arguments})", 500)


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"
