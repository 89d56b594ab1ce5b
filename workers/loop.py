"""The built-in agent: a model adapter and the tool registry, run as an agent
on `workers.api` — one engine: the same steps, approvals and replay as any
agent (`durable.py`), the same ending (`runner.py`).

Contract (what a run's log looks like when a worker runs it):
- Each model turn is a step (`model`; the last one, without tool calls, is
  not recorded: `run_end` follows at once): its items become events as they
  arrive, live, once: text → `text_delta` (one message_id per turn),
  reasoning → `reasoning_delta`, tool calls → `tool_call_start` (with the
  tool's risk level), `tool_args_delta`..., `tool_call_end`. With
  `discard_text_before_tools`, a turn's text that turns out to be followed
  by tool calls gets a `message_reset`, and later text of that turn a new
  message_id. The step stores the turn's text, tool calls and usage: a
  resumed run never calls the model again for a turn that finished.
- Then the turn's calls, in order: an unknown tool or arguments that are
  not a JSON object get `tool_result` error; a high-risk tool first waits
  for an approval bound to the call (`ctx.approval(tool_call_id=...)`):
  rejected → `denied`, expired → `skipped`; a call that may run is a step
  (`tool <name>`, retryable as the tool is), and its `tool_result` — a
  durable point — follows the step. A worker that dies while a
  not-retryable tool runs leaves it to the new owner to fail the run
  `tool_interrupted` (its card gets `tool_result` error "interrupted").
- The run ends (`runner.py`) with exactly one `run_end`: `completed` (with
  usage), `aborted` (the stop audit's `step` is the model turns taken, its
  `side_effects` the calls of side-effecting tools that started) or
  `failed` (`step_limit`, `model_*`, `tool_timeout`, `run_timeout`, ...).
- A stop cancels the model stream at once (closing the provider's
  connection) and a cancellable tool (`tool_result` error "cancelled: the
  run was stopped"); a tool that is not cancellable is left to finish (its
  step is not cut short), then the run stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec

from broker import errors, models

from .api import AgentContext, Decision, journal_of
from .context import RunContext
from .durable import Journal
from .errors import RunFailure, ToolError
from .model import (
    Finish,
    Message,
    ModelAdapter,
    ModelError,
    ModelItem,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolArgsChunk,
    ToolCall,
    ToolCallBegin,
    ToolCallDone,
)
from .tools import Tool, ToolOutput, ToolRegistry

log = logging.getLogger(__name__)

MODEL_STEP = "model"


class _TurnDone(msgspec.Struct, kw_only=True):
    """What a model turn's step stores."""

    text: str = ""
    calls: list[ToolCall] = []
    finish: str = "stop"


class _ToolDone(msgspec.Struct, kw_only=True):
    """What a tool call's step stores (the result, as the log and the model get it)."""

    status: str
    summary: str
    raw: str = ""


def _has_calls(turn: _TurnDone) -> bool:
    return bool(turn.calls)


class BuiltinAgent:
    """The agent of a deployment without the `agent` setting."""

    def __init__(self, adapter: ModelAdapter, registry: ToolRegistry, *, model_name: str) -> None:
        self.adapter = adapter
        self.registry = registry
        self.model_name = model_name

    async def __call__(self, ctx: AgentContext) -> None:
        await _Run(self, ctx).run()


class _Turn:
    """One model turn as it streams."""

    def __init__(self, message_id: str) -> None:
        self.text: list[str] = []
        self.message_id = message_id
        self.reset_done = False
        self.calls: dict[str, tuple[str, list[str]]] = {}  # id -> (name, argument chunks)
        self.finish: Finish | None = None


class _Run:
    def __init__(self, agent: BuiltinAgent, ctx: AgentContext) -> None:
        self.agent = agent
        self.ctx = ctx
        # Part of runlog, the loop reads what the API does not show: the
        # run's signals, metrics and clock.
        journal = journal_of(ctx)
        if not isinstance(journal, Journal):  # a worker's AgentContext always holds one
            raise TypeError(f"the built-in agent needs a worker's journal, not {journal!r}")
        self.journal = journal
        self.rc: RunContext = self.journal.ctx
        self.messages: list[Message] = []
        # A resumed run's first token and card were timed by its first owner.
        self._first_token = self._first_tool = ctx.resumed

    async def run(self) -> None:
        ctx, rc, j = self.ctx, self.rc, self.journal
        if not models.is_allowed(rc.settings, ctx.model, default=self.agent.model_name):
            raise RunFailure("model_not_allowed")
        system = rc.settings.system_prompt
        self.messages = [Message(role="system", content=system)] if system else []
        self.messages.append(Message(role="user", content=ctx.input))
        j.turns = 0
        while True:
            if j.turns >= rc.settings.max_steps:
                raise RunFailure("step_limit")
            j.turns += 1
            # A turn without tool calls is not recorded: run_end follows at
            # once (a worker lost in between has it made again).
            turn = await j.step(
                MODEL_STEP, self._model_turn, retryable=True, type=_TurnDone, keep=_has_calls
            )
            self.messages.append(
                Message(role="assistant", content=turn.text, tool_calls=turn.calls)
            )
            if not turn.calls:
                return
            for call in turn.calls:
                await self._call(call)

    # -- a model turn

    async def _model_turn(self) -> _TurnDone:
        rc = self.rc
        request = ModelRequest(
            messages=list(self.messages),
            tools=self.agent.registry.specs(),
            model=rc.run.model,
            max_tokens=rc.settings.model_max_tokens,
        )
        turn = _Turn(self.ctx.message_id())
        try:
            await self._stream(request, turn)
        except asyncio.CancelledError:
            self._observe_abort()  # the stream is closed: the provider saw it
            raise
        finish = turn.finish
        if finish is None:
            raise RunFailure("model_malformed", "the model stream ended early", retryable=True)
        u = finish.usage
        self.ctx.usage(
            input_tokens=u.input_tokens,
            output_tokens=u.output_tokens,
            reasoning_tokens=u.reasoning_tokens,
        )
        calls = [
            ToolCall(id=cid, name=name, arguments="".join(chunks) or "{}")
            for cid, (name, chunks) in turn.calls.items()
        ]
        if not calls and finish.reason == "length":
            await self.ctx.status("truncated", "the model hit its token limit")
        return _TurnDone(text="".join(turn.text), calls=calls, finish=finish.reason)

    async def _stream(self, request: ModelRequest, turn: _Turn) -> None:
        timeout_s = self.rc.settings.model_timeout_s
        loop = asyncio.get_running_loop()
        stream = self.agent.adapter.stream(request)
        try:
            async with contextlib.aclosing(stream):  # type: ignore[type-var]
                async with asyncio.timeout(None) as cm:
                    idle = _IdleTimer(cm, timeout_s)
                    try:
                        async for item in stream:
                            idle.last = loop.time()
                            await self._on_item(item, turn)
                            if turn.finish is not None:
                                break
                    finally:
                        idle.cancel()
        except TimeoutError:
            self.rc.metrics.stalled_streams.inc()
            raise RunFailure("model_timeout") from None
        except ModelError as e:
            raise RunFailure(e.code, e.message, retryable=e.retryable) from None

    async def _on_item(self, item: ModelItem, turn: _Turn) -> None:
        ctx = self.ctx
        match item:
            case TextChunk(text=text):
                if text:
                    turn.text.append(text)
                    self._token_seen()
                    await ctx.text(turn.message_id, text)
            case ReasoningChunk(text=text):
                if text:
                    self._token_seen()
                    await ctx.reasoning(turn.message_id, text)
            case ToolCallBegin(id=call_id, name=name):
                if turn.text and self.rc.settings.discard_text_before_tools and not turn.reset_done:
                    await ctx.reset(turn.message_id)
                    turn.reset_done = True
                    turn.message_id = ctx.message_id()
                tool = self.agent.registry.get(name)
                turn.calls[call_id] = (name, [])
                if not self._first_tool:
                    self._first_tool = True
                    self._observe_since_created(self.rc.metrics.time_to_first_tool_card)
                await ctx.tool_start(call_id, name, risk=tool.risk if tool is not None else "low")
            case ToolArgsChunk(id=call_id, json=partial):
                if partial and call_id in turn.calls:
                    turn.calls[call_id][1].append(partial)
                    await ctx.tool_args(call_id, partial)
            case ToolCallDone(id=call_id):
                if call_id in turn.calls:
                    await ctx.tool_end(call_id)
            case Finish():
                turn.finish = item

    # -- a tool call

    async def _call(self, call: ToolCall) -> None:
        tool = self.agent.registry.get(call.name)
        if tool is None:
            return await self._result(call, "error", f"unknown tool {call.name!r}")
        try:
            args = msgspec.json.decode(call.arguments or "{}")
        except msgspec.DecodeError:
            args = None
        if not isinstance(args, dict):
            return await self._result(call, "error", "the arguments are not a JSON object")
        if tool.risk == "high":
            decided = await self.ctx.approval(
                tool.approval_summary(call.arguments), tool_call_id=call.id
            )
            if not decided.approved:
                return await self._refused(call, decided)
        if tool.side_effects:
            self.journal.side_effects.append(call.id)
        done = await self.ctx.step(
            f"tool {tool.name}",
            lambda: self._execute(call, tool, args),
            retryable=tool.retryable,
            cancellable=tool.cancellable,
            tool_call_id=call.id,
            type=_ToolDone,
        )
        await self._result(call, done.status, done.summary, raw=done.raw)

    async def _refused(self, call: ToolCall, decided: Decision) -> None:
        if decided.decision == "reject":
            by = f" by {decided.decided_by}" if decided.decided_by else ""
            reason = decided.comment or "the approver rejected this call"
            await self._result(call, "denied", f"denied{by}", model_text=f"denied: {reason}")
        else:
            await self._result(
                call, "skipped", "approval expired", model_text="skipped: approval expired"
            )

    async def _execute(self, call: ToolCall, tool: Tool, args: dict[str, object]) -> _ToolDone:
        """The tool call's step: the tool runs (once per run, unless retryable
        and its worker died), within `tool_timeout_s`."""
        rc = self.rc
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(rc.settings.tool_timeout_s):
                out = await tool.fn(args, _ToolCtx(self.ctx, call.id))
        except ToolError as e:
            out = ToolOutput(e.message, status="error")
        except TimeoutError:
            await self.ctx.tool_result(call.id, "error", "timed out")
            raise RunFailure("tool_timeout") from None
        except asyncio.CancelledError:
            # Cut short by a stop, the drain deadline or the run's time limit.
            sig = rc.signals
            why = (
                "cancelled: the run was stopped"
                if sig.stop is not None
                else "cancelled"
                if sig.drain_end
                else "timed out"
            )
            await self.ctx.tool_result(call.id, "error", why)
            raise
        except (RunFailure, errors.StaleEpoch, errors.RunEnded, errors.StorageError):
            # Runlog's outcomes, not the tool's failure: the run is lost (or
            # failing), and the journal acts on it (durable._OURS).
            raise
        except Exception:
            log.exception("tool %s failed", tool.name)
            out = ToolOutput(f"{tool.name} failed", status="error")
        finally:
            rc.metrics.tool_seconds.labels(rc.metrics.tool_label(tool.name)).observe(
                time.monotonic() - t0
            )
        return _ToolDone(status=out.status, summary=out.summary, raw=out.raw)

    async def _result(
        self, call: ToolCall, status: str, summary: str, *, raw: str = "", model_text: str = ""
    ) -> None:
        await self.ctx.tool_result(call.id, status, summary, raw or None)  # type: ignore[arg-type]
        if not model_text:
            model_text = (raw or summary) if status == "ok" else f"{status}: {summary}"
        self.messages.append(
            Message(role="tool", content=model_text, tool_call_id=call.id, name=call.name)
        )

    # -- metrics

    def _token_seen(self) -> None:
        if not self._first_token:
            self._first_token = True
            self._observe_since_created(self.rc.metrics.time_to_first_token)

    def _observe_since_created(self, histogram: object) -> None:
        rc = self.rc
        histogram.observe(max(0.0, (rc.now_ms() - rc.run.created_at_ms) / 1000))  # type: ignore[attr-defined]

    def _observe_abort(self) -> None:
        stop = self.rc.signals.stop
        if stop is not None:
            self.rc.metrics.abort_propagation.observe(time.monotonic() - stop.received_mono)


class _ToolCtx:
    def __init__(self, ctx: AgentContext, tool_call_id: str) -> None:
        self._ctx = ctx
        self.run_id = ctx.run_id
        self.tool_call_id = tool_call_id

    async def progress(self, label: str, done: int, total: int) -> None:
        await self._ctx.progress(label, done, total)


class _IdleTimer:
    """Expires a timeout scope once `timeout_s` pass with no item (`last` is
    set per item): one timer per `timeout_s` instead of a reschedule — a
    timer cancelled and another made — per item, which was a tenth of a
    streaming worker's CPU."""

    __slots__ = ("_cm", "_handle", "_loop", "_timeout_s", "last")

    def __init__(self, cm: asyncio.Timeout, timeout_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._cm = cm
        self._timeout_s = timeout_s
        self.last = self._loop.time()
        self._handle = self._loop.call_at(self.last + timeout_s, self._check)

    def _check(self) -> None:
        due = self.last + self._timeout_s
        if self._loop.time() >= due:
            self._cm.reschedule(self._loop.time())  # the scope times out now
        else:
            self._handle = self._loop.call_at(due, self._check)

    def cancel(self) -> None:
        self._handle.cancel()
