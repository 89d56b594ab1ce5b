"""One tool call: approval (for high-risk tools), execution, result.

Approval, step by step (every step survives the worker's death):

1. the approval row is created in PostgreSQL (id, expiry);
2. what was appended so far is flushed, and the agent state is checkpointed
   under the owner's epoch (run status `waiting_approval`), recording the
   seq the log ends at;
3. `approval_required` is appended and flushed;
4. the worker waits for the decision: the control message, a poll of
   PostgreSQL every `approval_poll_s`, or the expiry;
5. `approval_decided` is appended and flushed, then the decision is
   checkpointed (`decided`; status back to `running`);
6. approve → the tool runs; reject → tool_result `denied`; expired →
   tool_result `skipped` ("approval expired"). The run goes on either way.

A takeover finds the checkpoint and what the log holds after its seq: only
`approval_required` and `approval_decided` (and `status`) there means steps
3-5 were in flight, and the run resumes: the request is appended if missing,
the logged decision is used if present (never written twice), else it waits.
After step 5 the decision comes from the checkpoint: nobody is asked again.

Execution: a tool that is not `retryable` is checkpointed as `started` just
before it runs, so a takeover never runs it again (the run fails
`tool_interrupted`); a retryable one interrupted by its worker's death runs
again on the new owner. Each result is logged, flushed, then checkpointed
(`checkpoint`), so a call whose result is durable never runs twice.
"""

from __future__ import annotations

import logging
import time

import msgspec

from broker import errors, events, ids

from . import approving
from .binding import call_digest
from .context import Released, RunContext, Stopped
from .errors import RunFailure, ToolError
from .model import Message, ToolCall
from .signals import DecisionInfo
from .state import AgentState, DecidedCall, encode_state
from .tools import Tool, ToolOutput


class _ToolCtx:
    def __init__(self, ctx: RunContext, tool_call_id: str) -> None:
        self._ctx = ctx
        self.run_id = ctx.run.run_id
        self.tool_call_id = tool_call_id

    async def progress(self, label: str, done: int, total: int) -> None:
        await self._ctx.append(events.Progress(label=label, done=done, total=total))


log = logging.getLogger(__name__)


async def run_tool_call(
    ctx: RunContext, state: AgentState, call: ToolCall, decided: DecisionInfo | None = None
) -> None:
    """Run one call of `state.pending`; its result is appended to the log and
    to the conversation. Raises Stopped, Released or RunFailure."""
    if state.started == call.id:
        # It started on a worker that died (a takeover resumed the run), and
        # it must not run twice: whether it acted is unknown.
        await _result(ctx, state, call, "error", "interrupted: its worker stopped while it ran")
        raise RunFailure("tool_interrupted")
    if decided is None and state.decided is not None and state.decided.call_id == call.id:
        decided = state.decided.info()  # decided before a takeover: not asked again
    tool = ctx.registry.get(call.name)
    if tool is None:
        await _result(ctx, state, call, "error", f"unknown tool {call.name!r}")
        return
    try:
        args = msgspec.json.decode(call.arguments or "{}")
    except msgspec.DecodeError:
        args = None
    if not isinstance(args, dict):
        await _result(ctx, state, call, "error", "the arguments are not a JSON object")
        return
    if tool.risk == "high" and decided is None:
        decided = await request_approval(ctx, state, call, tool)
    if decided is not None and decided.decision == "reject":
        by = f" by {decided.decided_by}" if decided.decided_by else ""
        reason = decided.comment or "the approver rejected this call"
        await _result(ctx, state, call, "denied", f"denied{by}", model_text=f"denied: {reason}")
        return
    if decided is not None and decided.decision == "expired":
        await _result(
            ctx, state, call, "skipped", "approval expired", model_text="skipped: approval expired"
        )
        return
    await _execute(ctx, state, call, tool, args)


async def _execute(
    ctx: RunContext, state: AgentState, call: ToolCall, tool: Tool, args: dict[str, object]
) -> None:
    ctx.check_halt()  # stopped since the last phase: the tool never starts
    # Durable before acting: the commit either fails with StaleEpoch (we lost
    # the run: the tool must not run) or makes the call part of the log, so a
    # takeover sees it and never restarts the run into calling it again.
    await ctx.writer.flush()
    ctx.check_halt()
    if tool.side_effects:
        state.side_effects.append(call.id)
    if not tool.retryable:
        state.started = call.id
        await checkpoint(ctx, state)
    t0 = time.monotonic()
    try:
        out = await ctx.guard(
            tool.fn(args, _ToolCtx(ctx, call.id)),
            timeout_s=ctx.settings.tool_timeout_s,
            code="tool_timeout",
            cancellable=tool.cancellable,
        )
    except ToolError as e:
        out = ToolOutput(e.message, status="error")
    except RunFailure as f:
        summary = "timed out" if f.code in ("tool_timeout", "run_timeout") else "cancelled"
        await _result(ctx, state, call, "error", summary)
        raise
    except Stopped:
        await _result(ctx, state, call, "error", "cancelled: the run was stopped")
        raise
    except (errors.RunlogError, Released):
        raise
    except Exception:
        log.exception("tool %s failed", tool.name)
        out = ToolOutput(f"{tool.name} failed", status="error")
    finally:
        ctx.metrics.tool_seconds.labels(ctx.metrics.tool_label(tool.name)).observe(
            time.monotonic() - t0
        )
    await _result(ctx, state, call, out.status, out.summary, raw=out.raw)


async def _result(
    ctx: RunContext,
    state: AgentState,
    call: ToolCall,
    status: events.ToolStatus,
    summary: str,
    *,
    raw: str = "",
    model_text: str = "",
) -> None:
    output = raw if (ctx.settings.tool_raw_output and raw) else None
    ctx.resulted.add(call.id)
    await ctx.append(
        events.ToolResult(tool_call_id=call.id, status=status, summary=summary, output=output)
    )
    if not model_text:
        model_text = (raw or summary) if status == "ok" else f"{status}: {summary}"
    state.messages.append(
        Message(role="tool", content=model_text, tool_call_id=call.id, name=call.name)
    )


# -- approvals


async def request_approval(
    ctx: RunContext, state: AgentState, call: ToolCall, tool: Tool
) -> DecisionInfo:
    s = ctx.settings
    state.approval_id = ids.approval_id()
    state.approval_expires_at = ctx.now_ms() + int(s.approval_timeout_s * 1000)
    state.approval_summary = tool.approval_summary(call.arguments)
    # Fenced by the epoch like every write of ours: a worker that lost the run
    # meanwhile gets StaleEpoch here and leaves no approval behind.
    await approving.create(ctx, _ask(state, call))
    # The checkpoint records where the log ends before approval_required, so
    # a takeover can tell what of the approval made it into the log.
    await checkpoint(ctx, state, "waiting_approval")
    await append_request(ctx, state)
    return await wait_and_record(ctx, state)


async def append_request(ctx: RunContext, state: AgentState) -> None:
    await approving.request(ctx, _ask(state, state.pending[0]))


def _ask(state: AgentState, call: ToolCall) -> approving.Ask:
    return approving.Ask(
        state.approval_id,
        call.id,
        state.approval_summary,
        state.approval_expires_at,
        call_digest(call.name, call.arguments),
    )


async def checkpoint(ctx: RunContext, state: AgentState, status: str = "running") -> None:
    """A durable point: flush the log, then store `state` as of that seq
    (fenced by the epoch: StaleEpoch if another worker owns the run)."""
    w = ctx.writer
    state.at_seq = await w.flush()
    state.active_s = ctx.used_s()
    state.resumes = 0
    data = encode_state(state)
    if not await ctx.write(
        lambda: ctx.store.save_checkpoint(w.run_id, w.epoch, data, status), "checkpoint"
    ):
        raise errors.StaleEpoch(f"run {w.run_id}: ownership lost at a checkpoint")


async def wait_and_record(
    ctx: RunContext, state: AgentState, logged: DecisionInfo | None = None
) -> DecisionInfo:
    """Wait for the decision on `state.approval_id` and log it — unless
    `logged`: a takeover found it already in the log."""
    if logged is not None:
        decision = logged
    else:
        decision = await approving.wait(ctx, state.approval_id, state.approval_expires_at)
        await approving.record(ctx, state.approval_id, decision)
    state.approval_id = ""
    state.decided = DecidedCall(
        call_id=state.pending[0].id,
        decision=decision.decision,
        decided_by=decision.decided_by,
        comment=decision.comment,
    )
    await checkpoint(ctx, state)
    return decision
