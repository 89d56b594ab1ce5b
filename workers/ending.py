"""The one way a run ends, for the built-in loop (`agent.py`) and agents of
the agent API (`runner.py`): exactly one `run_end`, after

- `tool_result skipped` for every tool card still without a result;
- `run_error` (failed) or `interrupt_requested` + the stop audit (aborted);
- closing the approval the run waits on, if any, before `run_end` is
  visible: a late decision then gets approval_expired. Fenced: if another
  worker owns the run now, StaleEpoch (and the caller stops).
"""

from __future__ import annotations

from collections.abc import Iterable

from broker import events

from .context import RunContext
from .errors import RunFailure


async def close_cards(ctx: RunContext, pending: Iterable[str] = ()) -> None:
    """Every tool card gets its result: `pending` calls (not yet opened) and
    the cards opened so far that the run ends before are skipped."""
    for call_id in dict.fromkeys([*pending, *ctx.opened]):
        if call_id not in ctx.resulted:
            ctx.resulted.add(call_id)
            await ctx.append(
                events.ToolResult(
                    tool_call_id=call_id, status="skipped", summary="not run: the run ended"
                )
            )


async def end(ctx: RunContext, last: events.RunEnd, *, waiting: bool) -> None:
    """Append `last` (the run_end) and commit; `waiting`: an approval is open."""
    if waiting:
        await ctx.write(
            lambda: ctx.store.close_run_approvals(ctx.run.run_id, ctx.writer.epoch),
            "approval close",
        )
    await ctx.append(last)
    await ctx.writer.flush()
    ctx.metrics.events_per_run.observe(ctx.writer.last_seq)


async def end_failed(
    ctx: RunContext,
    f: RunFailure,
    usage: events.Usage,
    *,
    waiting: bool,
    pending: Iterable[str] = (),
) -> None:
    await close_cards(ctx, pending)
    ctx.metrics.errors.labels(ctx.metrics.error_label(f.code)).inc()
    await ctx.append(events.RunError(code=f.code, retryable=f.retryable, message=f.message))
    await end(ctx, events.RunEnd(status="failed", usage=usage), waiting=waiting)


async def end_aborted(
    ctx: RunContext,
    usage: events.Usage,
    *,
    step: int,
    side_effects: list[str],
    waiting: bool,
    pending: Iterable[str] = (),
) -> None:
    stop = ctx.signals.stop
    assert stop is not None
    await close_cards(ctx, pending)
    at_seq = ctx.writer.last_seq
    await ctx.append(events.InterruptRequested(requested_by=stop.requested_by, reason=stop.reason))
    audit = events.StopAudit(
        requested_by=stop.requested_by,
        requested_at=stop.requested_at_ms,
        reason=stop.reason,
        at_seq=at_seq,
        step=step,
        side_effects=side_effects,
    )
    await end(ctx, events.RunEnd(status="aborted", usage=usage, stop=audit), waiting=waiting)
    if ctx.produced_output:
        ctx.metrics.partial_persist.inc()
