"""The agent loop: model turn → events → tools → next turn, until the model
stops; then `run_end`.

Contract (what a run's log looks like when a worker runs it):
- `run_start` is the first event (appended only when the log is empty).
- Each model turn's items become events as they arrive: text →
  `text_delta` (one message_id per turn), reasoning → `reasoning_delta`,
  tool calls → `tool_call_start` (with the tool's risk level),
  `tool_args_delta`..., `tool_call_end`. With `discard_text_before_tools`,
  a turn's text that turns out to be followed by tool calls gets a
  `message_reset`, and later text of that turn a new message_id.
- Then the turn's tools run in order (`toolstep.py`), each ending with a
  `tool_result`; high-risk ones wait for an approval first.
- The run ends with exactly one `run_end`: `completed` (with usage),
  `aborted` (after `interrupt_requested`, with the stop audit) or `failed`
  (after `run_error` with a stable code). Nothing is appended by a worker
  that lost ownership: it just stops (the new owner ends or resumes the run).
- The state is checkpointed at every durable point (`state.py`): after a
  turn that called tools, after each tool result, around approvals. A run
  resumed by a takeover first retracts the dead owner's events after the
  checkpoint (`resume.py`: `message_reset`, `tool_result` skipped), appends
  `status` "resumed", then goes on from the checkpoint: a model turn that
  was in flight is made again, finished tool calls are not. A turn without
  tool calls is not checkpointed: `run_end` follows it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import Literal

from broker import errors, events, ids, models

from . import ending
from .context import Parked, Released, RunContext, Stopped
from .errors import RunFailure
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
    Usage,
)
from .resume import retract
from .state import AgentState, ResumePoint
from .toolstep import append_request, checkpoint, run_tool_call, wait_and_record

log = logging.getLogger(__name__)

Outcome = Literal["completed", "aborted", "failed", "released", "parked", "lost"]


class _Turn:
    """What one model turn produced."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.message_id = ids.new_id("m")
        self.reset_done = False
        self.calls: dict[str, tuple[str, list[str]]] = {}  # id -> (name, argument chunks)
        self.finish: Finish | None = None


class Agent:
    def __init__(self, ctx: RunContext, adapter: ModelAdapter, *, model_name: str) -> None:
        self.ctx = ctx
        self.adapter = adapter
        self.model_name = model_name
        self._first_token = False
        self._first_tool = False
        self._bg: set[asyncio.Task[None]] = set()
        self.state = AgentState()

    async def run(
        self,
        state: AgentState | None = None,
        resume: ResumePoint | None = None,
        *,
        woken: bool = False,
    ) -> Outcome:
        """Execute the run (from the start, or resumed from a checkpoint) and
        end it. Never raises but CancelledError (ownership lost). `woken`: a
        parked run resumed for its decision (no `status` resumed: no worker
        was lost)."""
        ctx = self.ctx
        try:
            try:
                if state is None:
                    await self._begin()
                    await self._loop()
                else:
                    await self._resume(state, resume or ResumePoint(True, None), woken=woken)
                await self._end(events.RunEnd(status="completed", usage=_usage(self.state.usage)))
                return "completed"
            except Stopped:
                await self._end_aborted()
                return "aborted"
            except RunFailure as f:
                await self._end_failed(f)
                return "failed"
            except Parked:
                return "parked"
            except Released:
                return "released"
            except (errors.PayloadTooLarge, errors.InvalidEvent) as e:
                # An event we built was refused before it was queued (e.g. a
                # huge input or tool summary): the writer is intact, so end
                # the run with a code rather than abandon it to a takeover.
                log.error("run %s: event refused: %s", ctx.run.run_id, e.code)
                await self._end_failed(RunFailure("internal"))
                return "failed"
            except Exception as e:
                if isinstance(e, errors.RunlogError):
                    raise
                log.exception("run %s: unexpected error", ctx.run.run_id)
                await self._end_failed(RunFailure("internal"))
                return "failed"
        except (errors.StaleEpoch, errors.RunEnded):
            log.info("run %s: ownership lost; another worker has it", ctx.run.run_id)
            return "lost"
        except errors.RunlogError as e:
            # PostgreSQL unreachable for longer than storage_outage_grace_s
            # (or a read for longer than db_retry_s): stop writing; the lease
            # runs out and another worker ends or resumes the run.
            log.warning("run %s: cannot write (%s); leaving it to a takeover", ctx.run.run_id, e)
            return "lost"

    # -- start and resume

    async def _begin(self) -> None:
        ctx = self.ctx
        run = ctx.run
        ctx.start_clock(0.0)
        self.state = AgentState(trace_id=secrets.token_hex(16))
        if ctx.writer.last_seq == 0:
            await ctx.append(
                events.RunStart(
                    trace_id=self.state.trace_id,
                    model=run.model or self.model_name,
                    started_by=run.started_by,
                    input=run.input,
                )
            )
            self._observe_first_event()
        self.state.messages = self._first_messages()

    def _first_messages(self) -> list[Message]:
        system = self.ctx.settings.system_prompt
        first = [Message(role="system", content=system)] if system else []
        return [*first, Message(role="user", content=self.ctx.run.input)]

    async def _resume(self, state: AgentState, resume: ResumePoint, *, woken: bool) -> None:
        """Continue a run taken over from its checkpoint (`takeover.py`)."""
        ctx = self.ctx
        self.state = state
        ctx.start_clock(state.active_s)
        if not state.messages:  # taken over before its first durable point
            state.messages = self._first_messages()
        ctx.produced_output = state.at_seq > 1 or any(
            isinstance(e, events.TextDelta | events.ReasoningDelta | events.ToolCallStart)
            for e in resume.tail
        )
        # Its first token and card were (or will never be) timed by the first owner.
        self._first_token = self._first_tool = ctx.produced_output
        await retract(ctx.writer, list(resume.tail))
        if not woken:
            await ctx.append(events.Status(code="resumed", summary="resumed by another worker"))
        if state.approval_id and state.pending:
            if not resume.requested:  # the old owner died before it was logged
                await append_request(ctx, state)
            await wait_and_record(ctx, state, logged=resume.decided)
        await self._run_pending()
        await self._loop()

    # -- the loop

    async def _loop(self) -> None:
        ctx = self.ctx
        state = self.state
        # After run_start (kept first), before any model call: the gateway
        # checked this too, but its settings may not be ours.
        if not models.is_allowed(ctx.settings, ctx.run.model, default=self.model_name):
            raise RunFailure("model_not_allowed")
        while True:
            ctx.check_halt()
            if state.step >= ctx.settings.max_steps:
                raise RunFailure("step_limit")
            state.step += 1
            request = ModelRequest(
                messages=list(state.messages),
                tools=ctx.registry.specs(),
                model=ctx.run.model,
                max_tokens=ctx.settings.model_max_tokens,
            )
            turn = _Turn()
            await ctx.guard(
                self._stream_turn(request, turn),
                timeout_s=None,  # the turn times out between items, inside
                code="model_timeout",
                on_cancelled=self._observe_abort,
            )
            if turn.finish is None:
                raise RunFailure("model_malformed", "the model stream ended early", retryable=True)
            u = turn.finish.usage
            state.usage = Usage(
                input_tokens=state.usage.input_tokens + u.input_tokens,
                output_tokens=state.usage.output_tokens + u.output_tokens,
                reasoning_tokens=state.usage.reasoning_tokens + u.reasoning_tokens,
            )
            calls = [
                ToolCall(id=cid, name=name, arguments="".join(chunks) or "{}")
                for cid, (name, chunks) in turn.calls.items()
            ]
            state.messages.append(
                Message(role="assistant", content="".join(turn.text), tool_calls=calls)
            )
            if not calls:
                if turn.finish.reason == "length":
                    await ctx.append(
                        events.Status(code="truncated", summary="the model hit its token limit")
                    )
                return
            state.pending = calls
            await checkpoint(ctx, state)
            await self._run_pending()

    async def _run_pending(self) -> None:
        state = self.state
        while state.pending:
            await run_tool_call(self.ctx, state, state.pending[0])
            state.pending.pop(0)
            state.decided = None
            state.started = ""
            await checkpoint(self.ctx, state)
            self.ctx.check_halt()  # a tool that could not be cancelled has finished

    async def _stream_turn(self, request: ModelRequest, turn: _Turn) -> None:
        timeout_s = self.ctx.settings.model_timeout_s
        loop = asyncio.get_running_loop()
        stream = self.adapter.stream(request)
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
            self.ctx.metrics.stalled_streams.inc()
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
                    await ctx.append(events.TextDelta(message_id=turn.message_id, delta=text))
            case ReasoningChunk(text=text):
                if text:
                    self._token_seen()
                    await ctx.append(events.ReasoningDelta(message_id=turn.message_id, delta=text))
            case ToolCallBegin(id=call_id, name=name):
                if turn.text and ctx.settings.discard_text_before_tools and not turn.reset_done:
                    await ctx.append(events.MessageReset(message_id=turn.message_id))
                    turn.reset_done = True
                    turn.message_id = ids.new_id("m")
                tool = ctx.registry.get(name)
                turn.calls[call_id] = (name, [])
                ctx.opened.append(call_id)
                if not self._first_tool:
                    self._first_tool = True
                    self._observe_since_created(ctx.metrics.time_to_first_tool_card)
                await ctx.append(
                    events.ToolCallStart(
                        tool_call_id=call_id,
                        tool_name=name,
                        risk_level=tool.risk if tool is not None else "low",
                    )
                )
            case ToolArgsChunk(id=call_id, json=partial):
                if partial and call_id in turn.calls:
                    turn.calls[call_id][1].append(partial)
                    await ctx.append(
                        events.ToolArgsDelta(tool_call_id=call_id, partial_json=partial)
                    )
            case ToolCallDone(id=call_id):
                if call_id in turn.calls:
                    await ctx.append(events.ToolCallEnd(tool_call_id=call_id))
            case Finish():
                turn.finish = item

    # -- ending

    def _pending(self) -> list[str]:
        return [c.id for c in self.state.pending]

    async def _end(self, last: events.RunEnd) -> None:
        await ending.close_cards(self.ctx, self._pending())
        await ending.end(self.ctx, last, waiting=bool(self.state.approval_id))

    async def _end_aborted(self) -> None:
        s = self.state
        await ending.end_aborted(
            self.ctx, _usage(s.usage), step=s.step, side_effects=list(s.side_effects),
            waiting=bool(s.approval_id), pending=self._pending(),
        )  # fmt: skip

    async def _end_failed(self, f: RunFailure) -> None:
        s = self.state
        await ending.end_failed(
            self.ctx, f, _usage(s.usage), waiting=bool(s.approval_id), pending=self._pending()
        )

    # -- metrics

    def _token_seen(self) -> None:
        if not self._first_token:
            self._first_token = True
            self._observe_since_created(self.ctx.metrics.time_to_first_token)

    def _observe_since_created(self, histogram: object) -> None:
        created_ms = self.ctx.run.created_at_ms
        histogram.observe(max(0.0, (self.ctx.now_ms() - created_ms) / 1000))  # type: ignore[attr-defined]

    def _observe_first_event(self) -> None:
        async def observe() -> None:
            try:
                await self.ctx.writer.flush()
            except errors.RunlogError:
                return
            self._observe_since_created(self.ctx.metrics.time_to_first_event)

        task = asyncio.create_task(observe())
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _observe_abort(self) -> None:
        stop = self.ctx.signals.stop
        if stop is not None:
            self.ctx.metrics.abort_propagation.observe(time.monotonic() - stop.received_mono)


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


def _usage(u: Usage) -> events.Usage:
    return events.Usage(
        input_tokens=u.input_tokens,
        output_tokens=u.output_tokens,
        reasoning_tokens=u.reasoning_tokens,
    )
