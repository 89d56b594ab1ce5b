"""Approvals, as the journal asks for them (`durable.py`, durable by its
step rows: the one engine of every agent, the built-in loop included):

- `create`: the approval row, fenced by the owner's epoch (a worker that
  lost the run gets StaleEpoch and leaves no approval behind), with the
  digest of the call it guards (`binding.py`);
- `request`: `approval_required`, appended and flushed;
- `wait`: the decision — `wait_decision`: the control message, a poll of
  PostgreSQL every `approval_poll_s`, the expiry, or parking the run after
  `approval_park_after_s` (`context.Parked`); the run's clock paused while it
  waits;
- `record`: `approval_decided`, appended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

from broker import events
from broker.store import DB_ERRORS

from .context import Parked, Released, RunContext, Stopped
from .errors import RunFailure
from .signals import DecisionInfo

log = logging.getLogger(__name__)


class Ask(NamedTuple):
    """What an approval asks: the same in its row and in `approval_required`."""

    approval_id: str
    tool_call_id: str
    summary: str
    expires_at_ms: int
    call_digest: str


async def create(ctx: RunContext, ask: Ask) -> None:
    await ctx.write(
        lambda: ctx.store.create_approval(
            approval_id=ask.approval_id,
            run_id=ctx.run.run_id,
            epoch=ctx.writer.epoch,
            tool_call_id=ask.tool_call_id,
            summary=ask.summary,
            expires_at_ms=ask.expires_at_ms,
            call_digest=ask.call_digest,
        ),
        "approval create",
    )


async def request(ctx: RunContext, ask: Ask) -> None:
    await ctx.append(
        events.ApprovalRequired(
            approval_id=ask.approval_id,
            tool_call_id=ask.tool_call_id,
            summary=ask.summary,
            expires_at=ask.expires_at_ms,
            call_digest=ask.call_digest,
        )
    )
    await ctx.writer.flush()


async def wait(
    ctx: RunContext,
    approval_id: str,
    expires_at_ms: int,
    *,
    clock_changed: Callable[[], None] = lambda: None,
) -> DecisionInfo:
    """The decision (see `wait_decision`), the run's clock paused meanwhile;
    `clock_changed` is called when it pauses and when it runs again."""
    m = ctx.metrics
    ctx.pause_clock()
    clock_changed()
    m.approvals_waiting.inc()
    try:
        decision = await wait_decision(ctx, approval_id, expires_at_ms)
    finally:
        m.approvals_waiting.dec()
        ctx.resume_clock()
        clock_changed()
    m.approvals.labels(decision.decision).inc()
    return decision


async def record(ctx: RunContext, approval_id: str, decision: DecisionInfo) -> None:
    await ctx.append(
        events.ApprovalDecided(
            approval_id=approval_id,
            decision=decision.decision,  # type: ignore[arg-type]
            decided_by=decision.decided_by,
            comment=decision.comment,
        )
    )


async def wait_decision(ctx: RunContext, approval_id: str, expires_at_ms: int) -> DecisionInfo:
    """The decision on `approval_id`: from the control message, a poll of
    PostgreSQL every `approval_poll_s`, or the expiry (stored as `expired`,
    fenced). Raises Stopped, Released or RunFailure(worker_draining) when the
    run is stopped or its worker drains, and Parked once it has waited
    `approval_park_after_s` and a look at PostgreSQL found no decision. The
    journal's approvals (`durable.py`), for every agent, wait
    here."""
    sig = ctx.signals
    store = ctx.store
    w = ctx.writer
    poll_s = ctx.settings.approval_poll_s
    park_after = ctx.settings.approval_park_after_s
    loop = asyncio.get_running_loop()
    parks_at = loop.time() + park_after if park_after >= 0 else None
    next_poll = 0.0  # poll at once: the decision may already be stored
    while True:
        sig.changed.clear()
        if sig.stop is not None:
            raise Stopped()
        if sig.release_waiting:
            raise Released()
        if sig.drain_end:
            raise RunFailure("worker_draining")
        got = sig.decisions.get(approval_id)
        if got is not None:
            return got
        try:
            if ctx.now_ms() >= expires_at_ms:
                # StaleEpoch (not caught here) if the run was taken over.
                info = await store.expire_approval(approval_id, run_id=w.run_id, epoch=w.epoch)
                if info.decision is not None:
                    return DecisionInfo(info.decision, info.decided_by or "system", info.comment)
                next_poll = loop.time() + poll_s  # PostgreSQL's clock is behind ours
            elif loop.time() >= next_poll:
                info = await store.poll_approval(approval_id)
                if info.decision is not None:
                    return DecisionInfo(info.decision, info.decided_by or "", info.comment)
                if parks_at is not None and loop.time() >= parks_at and sig.stop is None:
                    sig.parked_on = approval_id
                    raise Parked()
                next_poll = loop.time() + poll_s
                if parks_at is not None:
                    next_poll = min(next_poll, max(parks_at, loop.time()))
        except DB_ERRORS as e:
            log.warning("approval %s: cannot read its state (%s); retrying", approval_id, e)
            next_poll = loop.time() + poll_s
        until_expiry = (expires_at_ms - ctx.now_ms()) / 1000
        wait_s = max(
            0.01, min(next_poll - loop.time(), until_expiry if until_expiry > 0 else poll_s)
        )
        try:
            async with asyncio.timeout(wait_s):
                await sig.changed.wait()
        except TimeoutError:
            pass
