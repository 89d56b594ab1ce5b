"""Pydantic AI agents as runlog agents: `pydantic_ai_agent(agent)` (docs/agents.md).

The run's events are the agent's own stream: `Agent.run(event_stream_handler=...)`
hands the handler each node's events in the agent's task, so a stop's
cancellation lands at whatever the run awaits (the model's stream, a tool) and
closes it. Text and thinking parts become `text`/`reasoning` deltas of one
message per model response; a tool call part becomes a tool card whose
argument text streams as it comes, ended once the part is complete; each tool
result (function, output or native tool) becomes its `tool_result`.

Durability. A run is a chain of steps. A segment (`segment-{i}`) is one
`Agent.run` until it ends or defers tool calls that need approval
(`requires_approval=True`; the agent's output types include
`DeferredToolRequests`); its stored result is the message history and the
pending approvals. Each approval is a `ctx.approval`. The decisions then go to
a tools step (`tools-{i}`, not retryable): `Agent.iter` with the stored history
and the `DeferredToolResults`, which runs the approved calls (and tells the
model of the denied ones) and is stopped before the model's next turn; it
stores the history ending in the request the model has not answered yet (the
calls' returns). Their `tool_result`s are emitted after that step, each a
durable point of its own, and the next segment sends the stored request. So,
for a worker killed -9:
- while streaming (a segment's model call or tools without approval): that
  segment runs again from its start on the new owner; its model calls are
  issued again (runlog retracts their partial text) -- unless a tool result of
  that segment is in the log already, which cannot be retracted (the run fails
  `worker_lost`: the tools it ran would run again);
- while an approval is waited on: the stored segments return their histories
  without calling the model, the replay waits on (or finds) the same approval,
  and the tools step runs on the new owner: the approved tool runs once;
- while the approved tool runs (inside the tools step): the run fails
  `step_interrupted` rather than run it twice;
- once the approved tool ran (its result in the log), or while the answer after
  it streams: the new owner replays up to the results (checked against the
  log, neither retracted nor appended again) and runs the next segment, which
  sends the stored request: the answer is asked for again, its partial text
  retracted.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterable, Callable, Mapping
from typing import Any

import msgspec
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import (
    AgentRunResult,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    ToolApproved,
    ToolDenied,
)
from pydantic_ai.exceptions import (
    AgentRunError,
    ConcurrencyLimitExceeded,
    ContentFilterError,
    FallbackExceptionGroup,
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelHTTPError,
    ModelOverloadedError,
    ModelQuotaExceededError,
    ModelRateLimitError,
    ModelRequestRejectedError,
    ModelRequestTimeout,
    ModelServerError,
    ModelTimeoutError,
    ModelUnavailableError,
    RunCancelled,
    RunTimedOut,
    UnexpectedModelBehavior,
    UsageLimitExceeded,
    UserError,
)
from pydantic_ai.messages import (
    AgentStreamEvent,
    BaseToolCallPart,
    BaseToolReturnPart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    NativeToolReturnPart,
    PartDeltaEvent,
    PartEndEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ThinkingPart,
    ThinkingPartDelta,
    ToolCallEvent,
    ToolCallPartDelta,
    ToolResultEvent,
    UserPromptPart,
)
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_graph import End

from broker.events import RiskLevel, ToolStatus
from workers.api import Agent, AgentContext, AgentError, ChatMessage, Decision

__all__ = ["pydantic_ai_agent"]

Summarize = Callable[[BaseToolReturnPart[Any]], str]


class _Pending(msgspec.Struct, frozen=True):
    """A deferred call waiting for its approval."""

    call_id: str  # Pydantic AI's tool_call_id, the key of DeferredToolResults
    card: str  # the runlog tool card the call streamed into
    summary: str  # what the approver reads


class _Result(msgspec.Struct, frozen=True):
    """A tool result of a tools step, emitted after the step."""

    card: str
    status: ToolStatus
    summary: str
    output: str | None = None


class _Segment(msgspec.Struct):
    """A segment's (or a tools step's) stored result."""

    messages: msgspec.Raw  # ModelMessagesTypeAdapter JSON: the whole history so far
    pending: list[_Pending] = []
    results: list[_Result] = []  # a tools step's tool results
    ask: bool = False  # the history ends in a request the model has not answered yet


def pydantic_ai_agent(
    agent: PydanticAgent[Any, Any],
    *,
    deps: Callable[[AgentContext], Any] | None = None,
    usage_limits: UsageLimits | None = None,
    risk: Mapping[str, RiskLevel] | None = None,
    summarize: Summarize | None = None,
) -> Agent:
    """A runlog agent that runs `agent` on each run's input, the session's
    earlier runs as its message history.

    `deps(ctx)` makes the run's dependencies. `risk` maps tool names to the
    risk shown on their cards (default: `high` for tools that require
    approval, else `low`). `summarize(part)` gives a tool result's summary
    for clients (default: the outcome; the tool's output goes in
    `tool_result.output`, shown where `tool_raw_output` allows).
    """

    async def run(ctx: AgentContext) -> None:
        history: msgspec.Raw | None = None
        results: DeferredToolResults | None = None
        pending: list[_Pending] = []
        decided: dict[str, Decision] = {}
        i = 0
        while True:
            segment = _SegmentRun(
                agent, ctx, deps=deps, usage_limits=usage_limits, risk=risk or {},
                summarize=summarize, pending=pending, decided=decided,
            )  # fmt: skip
            if results is None:
                step = functools.partial(segment.run, history)
                seg = await ctx.step(f"segment-{i}", step, type=_Segment)
            else:
                assert history is not None  # decisions follow a segment
                # The decided calls run in a step of their own that ends
                # before the model's next turn; their results are emitted
                # after it, each a durable point of its own.
                step = functools.partial(segment.tools, history, results)
                seg = await ctx.step(f"tools-{i}", step, retryable=False, type=_Segment)
                for r in seg.results:
                    await ctx.tool_result(r.card, r.status, r.summary, r.output)
            history, results, pending, decided = seg.messages, None, seg.pending, {}
            i += 1
            if pending:
                for p in pending:
                    decided[p.call_id] = await ctx.approval(p.summary, tool_call_id=p.card)
                results = _results(decided)
            elif not seg.ask:
                return

    return run


def _results(decided: Mapping[str, Decision]) -> DeferredToolResults:
    approvals: dict[str, bool | ToolApproved | ToolDenied] = {}
    for call_id, d in decided.items():
        if d.approved:
            approvals[call_id] = True
        elif d.decision == "expired":
            approvals[call_id] = ToolDenied("No decision was made in time; the call did not run.")
        else:
            reason = f": {d.comment}" if d.comment else ""
            approvals[call_id] = ToolDenied(f"The call was denied by {d.decided_by}{reason}.")
    return DeferredToolResults(approvals=approvals)


class _SegmentRun:
    """One `Agent.run`, its events mapped onto the run's (see the module doc)."""

    def __init__(
        self,
        agent: PydanticAgent[Any, Any],
        ctx: AgentContext,
        *,
        deps: Callable[[AgentContext], Any] | None,
        usage_limits: UsageLimits | None,
        risk: Mapping[str, RiskLevel],
        summarize: Summarize | None,
        pending: list[_Pending],
        decided: dict[str, Decision],
    ) -> None:
        self.agent = agent
        self.ctx = ctx
        self.deps = deps
        self.usage_limits = usage_limits
        self.risk = risk
        self.summarize = summarize
        self.decided = decided
        # Pydantic AI's tool_call_id -> the card; the calls deferred in the
        # segment before resume here, on the cards they streamed into.
        self.cards: dict[str, str] = {p.call_id: p.card for p in pending}
        self.unended: set[str] = set()  # cards whose arguments may still stream
        self.reported = (0, 0, 0)  # the usage reported so far
        self.collected: list[_Result] | None = None  # a tools step's results, held back

    async def run(self, history: msgspec.Raw | None) -> _Segment:
        """`Agent.run` from the input (no history) or on from the stored
        history, until the run ends or defers calls."""
        ctx = self.ctx
        if history is None:
            prompt: str | None = ctx.input
            messages = _as_messages(await ctx.conversation())
        else:
            # Ending in a request (a tools step's results): Pydantic AI sends it.
            prompt, messages = None, ModelMessagesTypeAdapter.validate_json(bytes(history))
        try:
            result = await self.agent.run(
                prompt,
                message_history=messages,
                conversation_id=ctx.session_id,
                deps=self.deps(ctx) if self.deps is not None else None,
                usage_limits=self.usage_limits,
                event_stream_handler=self.handle,
            )
        except (AgentRunError, UserError, FallbackExceptionGroup) as e:
            raise coded(e) from e
        return await self._ended(result)

    async def tools(self, history: msgspec.Raw, results: DeferredToolResults) -> _Segment:
        """The deferred calls, decided: Pydantic AI runs the approved ones (and
        tells the model of the others); stopped before the model's next turn,
        whose request (the calls' returns) ends the stored history. The tool
        results are collected, not emitted (see `run` of the factory)."""
        ctx = self.ctx
        self.collected = []
        messages = ModelMessagesTypeAdapter.validate_json(bytes(history))
        try:
            async with self.agent.iter(
                None,
                message_history=messages,
                deferred_tool_results=results,
                conversation_id=ctx.session_id,
                deps=self.deps(ctx) if self.deps is not None else None,
                usage_limits=self.usage_limits,
            ) as run:
                node = run.next_node
                while not isinstance(node, End):
                    if PydanticAgent.is_model_request_node(node):
                        self._usage(run.usage)
                        asked = [*run.all_messages(), node.request]
                        out = msgspec.Raw(ModelMessagesTypeAdapter.dump_json(asked))
                        return _Segment(messages=out, results=self.collected, ask=True)
                    if PydanticAgent.is_call_tools_node(node):
                        async with node.stream(run.ctx) as stream:
                            await self._map(stream, None)
                    node = await run.next(node)
                result = run.result
        except (AgentRunError, UserError, FallbackExceptionGroup) as e:
            raise coded(e) from e
        assert result is not None  # the run reached its End
        return await self._ended(result)

    async def _ended(self, result: AgentRunResult[Any]) -> _Segment:
        """The stored result of a run that ended: its output, or the calls it deferred."""
        self._usage(result.usage)
        out = msgspec.Raw(ModelMessagesTypeAdapter.dump_json(result.all_messages()))
        if not isinstance(result.output, DeferredToolRequests):
            return _Segment(messages=out, results=self.collected or [])
        if result.output.calls:
            raise AgentError(
                "deferred_call_unsupported",
                "a tool deferred its call for external execution; runlog resumes only approvals",
            )
        pending = [
            _Pending(call.tool_call_id, await self._card(call, None), _approval_summary(call))
            for call in result.output.approvals
        ]
        return _Segment(messages=out, pending=pending, results=self.collected or [])

    # -- the event stream handler: one call per graph node

    async def handle(
        self, run_ctx: RunContext[Any], stream: AsyncIterable[AgentStreamEvent]
    ) -> None:
        self._usage(run_ctx.usage)  # what the requests before this node used
        await self._map(stream, run_ctx)

    async def _map(
        self, stream: AsyncIterable[AgentStreamEvent], run_ctx: RunContext[Any] | None
    ) -> None:
        ctx = self.ctx
        message_id = ""
        by_index: dict[int, str] = {}  # this response's tool call parts -> cards
        dict_args: set[int] = set()  # parts whose arguments come as dicts, not JSON text

        def mid() -> str:
            nonlocal message_id
            message_id = message_id or ctx.message_id()
            return message_id

        async for ev in stream:
            match ev:
                case PartStartEvent(part=TextPart(content=text)):
                    await ctx.text(mid(), text)
                case PartStartEvent(part=ThinkingPart(content=text)):
                    await ctx.reasoning(mid(), text)
                case PartStartEvent(index=i, part=BaseToolCallPart() as part):
                    if i not in by_index:  # a second start of the same part replaces the first
                        by_index[i] = await self._start(run_ctx, part.tool_name)
                        if isinstance(part.args, str):
                            await ctx.tool_args(by_index[i], part.args)
                        elif part.args:
                            dict_args.add(i)
                case PartStartEvent(part=NativeToolReturnPart() as part):
                    await self._result(part)
                case PartDeltaEvent(delta=TextPartDelta(content_delta=text)):
                    await ctx.text(mid(), text)
                case PartDeltaEvent(delta=ThinkingPartDelta(content_delta=text)):
                    await ctx.reasoning(mid(), text or "")
                case PartDeltaEvent(index=i, delta=ToolCallPartDelta(args_delta=args)):
                    if i in by_index and isinstance(args, str):
                        await ctx.tool_args(by_index[i], args)
                    elif isinstance(args, dict):
                        dict_args.add(i)
                case PartEndEvent(index=i, part=BaseToolCallPart() as part) if i in by_index:
                    # The call's id is final only now (a delta may have replaced it).
                    card = self.cards[part.tool_call_id] = by_index[i]
                    if i in dict_args:
                        await ctx.tool_args(card, part.args_as_json_str())
                    await self._end(card)
                case ToolCallEvent(part=part):
                    card = await self._card(part, run_ctx)
                    await self._end(card)
                case ToolResultEvent(part=part):
                    await self._result(part)
                case _:
                    pass

    def _usage(self, u: RunUsage) -> None:
        """Report what the segment used since the last report: a request's
        usage is counted once it is complete, so a run that fails or is
        stopped later still reports the requests it made."""
        now = (u.input_tokens, u.output_tokens, u.output_reasoning_tokens)
        i, o, r = (a - b for a, b in zip(now, self.reported, strict=True))
        self.reported = now
        if i or o or r:
            self.ctx.usage(input_tokens=i, output_tokens=o, reasoning_tokens=r)

    async def _start(self, run_ctx: RunContext[Any] | None, tool_name: str) -> str:
        card = self.ctx.tool_call_id()
        risk = self.risk.get(tool_name)
        if risk is None:
            tool = run_ctx.tools.get(tool_name) if run_ctx is not None else None
            risk = "high" if tool is not None and tool.kind == "unapproved" else "low"
        await self.ctx.tool_start(card, tool_name, risk=risk)
        self.unended.add(card)
        return card

    async def _card(self, part: BaseToolCallPart[Any], run_ctx: RunContext[Any] | None) -> str:
        """The card of a call, opened (complete) if its parts were not streamed."""
        card = self.cards.get(part.tool_call_id)
        if card is None:
            card = self.cards[part.tool_call_id] = await self._start(run_ctx, part.tool_name)
            await self.ctx.tool_args(card, part.args_as_json_str())
            await self._end(card)
        return card

    async def _end(self, card: str) -> None:
        if card in self.unended:
            self.unended.discard(card)
            await self.ctx.tool_end(card)

    async def _result(self, part: BaseToolReturnPart[Any]) -> None:
        card = self.cards.get(part.tool_call_id)
        if card is None:
            return  # not a call this run showed (it never streamed, nor was it called)
        await self._end(card)
        status, summary = _status(part, self.decided.get(part.tool_call_id))
        if self.summarize is not None and status == "ok":
            summary = self.summarize(part)
        output = part.model_response_str() if status == "ok" else None
        if self.collected is not None:
            self.collected.append(_Result(card, status, summary, output))
        else:
            await self.ctx.tool_result(card, status, summary, output)


def _status(part: BaseToolReturnPart[Any], decision: Decision | None) -> tuple[ToolStatus, str]:
    if decision is not None and not decision.approved:
        if decision.decision == "expired":
            return "skipped", "approval expired"
        by = f" by {decision.decided_by}" if decision.decided_by else ""
        return "denied", f"denied{by}"
    match part.outcome:
        case "success":
            return "ok", ""
        case "denied":
            return "denied", "denied"
        case "interrupted":
            return "skipped", "interrupted"
        case "retried":
            return "error", "invalid call; the model was asked to retry"
        case _:
            return "error", "the tool failed"


def _approval_summary(call: BaseToolCallPart[Any]) -> str:
    args = call.args_as_json_str()
    shown = args if len(args) <= 300 else args[:297] + "..."
    return f"{call.tool_name} wants to run with {shown}"


def _as_messages(conversation: list[ChatMessage]) -> list[ModelMessage]:
    out: list[ModelMessage] = []
    for m in conversation:
        if m.role == "user":
            out.append(ModelRequest(parts=[UserPromptPart(content=m.content)]))
        else:
            out.append(ModelResponse(parts=[TextPart(content=m.content)]))
    return out


# Most specific first: the classes nest (a timeout is a connection error, an
# overload an unavailability, a content filter an unexpected behaviour).
_CODES: tuple[tuple[type[BaseException], str, bool], ...] = (
    (RunTimedOut, "run_timeout", False),
    (RunCancelled, "agent_cancelled", False),
    (UsageLimitExceeded, "usage_limit", False),
    (ConcurrencyLimitExceeded, "model_rate_limited", True),
    (ModelRateLimitError, "model_rate_limited", True),
    (ModelQuotaExceededError, "model_rate_limited", False),
    (ModelOverloadedError, "model_overloaded", True),
    (ModelTimeoutError, "model_timeout", True),
    (ModelRequestTimeout, "model_timeout", True),
    (ModelUnavailableError, "model_unavailable", True),
    (ModelServerError, "model_unavailable", True),
    (ModelConnectionError, "model_unavailable", True),
    (ModelAuthenticationError, "model_auth", False),
    (ModelRequestRejectedError, "model_bad_request", False),
    (ContentFilterError, "model_content_filter", False),
    (UnexpectedModelBehavior, "model_malformed", True),
    (FallbackExceptionGroup, "model_unavailable", True),
    (UserError, "agent_misconfigured", False),
)


def coded(e: BaseException) -> AgentError:
    """The runlog error for a Pydantic AI exception. The message names the
    exception's class only: its text may hold a provider's response body."""
    name = type(e).__name__
    if isinstance(e, ModelHTTPError) and not isinstance(e, tuple(c for c, _, _ in _CODES)):
        s = e.status_code
        if s == 429:
            return AgentError("model_rate_limited", name, retryable=True)
        if s in (401, 403):
            return AgentError("model_auth", name)
        if s >= 500:
            return AgentError("model_unavailable", name, retryable=True)
        return AgentError("model_bad_request", name)
    for cls, code, retryable in _CODES:
        if isinstance(e, cls):
            return AgentError(code, name, retryable=retryable)
    if isinstance(e, ModelAPIError):
        return AgentError("model_unavailable", name, retryable=True)
    return AgentError("pydantic_ai_error", name)
