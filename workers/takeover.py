"""What a worker does with a run it took over (its owner's lease ran out).

The new owner holds a higher epoch, so the old one, if it is still alive
(paused, partitioned), can append nothing more. Then, in this order:

| the run | outcome |
|---|---|
| nothing in its log yet (the owner died before `run_start` committed), at most two restarts | `restarted`: executed from the start |
| checkpointed while waiting for an approval, and the log after the checkpoint holds only that approval's events | `resumed`: waits for (or finds) the decision, then goes on |
| a stop was requested | `aborted`: `interrupt_requested` + `run_end` aborted, with the audit |
| anything else (it was streaming or running a tool) | `failed`: `run_error` worker_lost (retryable) + `run_end` failed |

A half-streamed model turn cannot be resumed (the provider's stream is
gone), and a tool that may have run must not run twice, hence `failed`.
"""

from __future__ import annotations

from typing import NamedTuple

from broker import approvals, events
from broker.log import RunWriter
from broker.store import Ownership, Store

from .errors import RunFailure
from .metrics import WorkerMetrics
from .signals import DecisionInfo
from .state import AgentState, ResumePoint, decode_state

# claim_queued gives epoch 1; restarts of an empty run stop after epoch 3,
# so a run that kills its worker before its first event cannot loop forever.
_MAX_RESTART_EPOCH = 3


# After the checkpoint: approval_required, approval_decided and a few
# `status` events (one per resume) at most.
_MAX_TAIL = 16


class TakeoverPlan(NamedTuple):
    outcome: str  # resumed | restarted | aborted | failed
    run: bool  # execute it (from `state`, or from the start if None)
    state: AgentState | None
    stop: tuple[str, int, str] | None
    resume: ResumePoint | None

    async def end(
        self,
        store: Store,
        writer: RunWriter,
        metrics: WorkerMetrics,
        side_effect_tools: frozenset[str] = frozenset(),
    ) -> None:
        # Fenced by our epoch: if yet another worker took the run meanwhile,
        # StaleEpoch, and its approvals are left to it.
        await approvals.close_open_for_run(store.pool, writer.run_id, writer.epoch)
        if self.stop is not None:
            by, at_ms, reason = self.stop
            at_seq = writer.last_seq
            # From the log, not the checkpoint: tools may have run after the
            # last checkpoint, and the audit must name every side effect.
            done = await _side_effects_in_log(store, writer.run_id, side_effect_tools)
            await writer.append(events.InterruptRequested(requested_by=by, reason=reason))
            audit = events.StopAudit(
                requested_by=by,
                requested_at=at_ms,
                reason=reason,
                at_seq=at_seq,
                step=self.state.step if self.state else 0,
                side_effects=done,
            )
            await writer.append(events.RunEnd(status="aborted", stop=audit))
        else:
            f = RunFailure("worker_lost")
            metrics.errors.labels(f.code).inc()
            await writer.append(
                events.RunError(code=f.code, retryable=f.retryable, message=f.message)
            )
            await writer.append(events.RunEnd(status="failed"))
        await writer.flush()


async def plan_takeover(store: Store, own: Ownership) -> TakeoverPlan:
    stop = await store.interrupt_request(own.run_id)
    raw = await store.load_checkpoint(own.run_id)
    state = decode_state(raw) if raw else None
    info = await store.get_run(own.run_id)
    if own.last_seq == 0 and own.epoch <= _MAX_RESTART_EPOCH:
        return TakeoverPlan("restarted", True, None, stop, None)
    if (
        state is not None
        and info.status == "waiting_approval"
        and state.approval_id
        and state.pending
        and (resume := await _approval_tail(store, own, state)) is not None
    ):
        return TakeoverPlan("resumed", True, state, stop, resume)
    return TakeoverPlan("aborted" if stop else "failed", False, state, stop, None)


async def _approval_tail(store: Store, own: Ownership, state: AgentState) -> ResumePoint | None:
    """What of the approval made it into the log after the checkpoint; None
    if anything else happened there (then the run cannot be resumed)."""
    if own.last_seq < state.at_seq:
        return None
    tail = await store.run_page(own.run_id, state.at_seq, _MAX_TAIL + 1)
    if len(tail) > _MAX_TAIL or len(tail) != own.last_seq - state.at_seq:
        return None
    requested = False
    decided: DecisionInfo | None = None
    for item in tail:
        ev = events.decode_stored(item.payload)
        if isinstance(ev, events.ApprovalRequired) and ev.approval_id == state.approval_id:
            requested = True
        elif isinstance(ev, events.ApprovalDecided) and ev.approval_id == state.approval_id:
            decided = DecisionInfo(ev.decision, ev.decided_by, ev.comment)
        elif not isinstance(ev, events.Status):
            return None
    if decided is not None and not requested:
        return None
    return ResumePoint(requested, decided)


async def _side_effects_in_log(store: Store, run_id: str, tools: frozenset[str]) -> list[str]:
    """Calls of side-effecting tools that started running: every such call
    except those denied or skipped (a tool that errored may have acted)."""
    started: list[str] = []
    not_run: set[str] = set()
    after = 0
    while True:
        page = await store.run_page(run_id, after, 1000)
        for item in page:
            if item.type == "tool_call_start" or item.type == "tool_result":
                ev = events.decode_stored(item.payload)
                if isinstance(ev, events.ToolCallStart) and ev.tool_name in tools:
                    started.append(ev.tool_call_id)
                elif isinstance(ev, events.ToolResult) and ev.status in ("denied", "skipped"):
                    not_run.add(ev.tool_call_id)
        if len(page) < 1000:
            return [c for c in started if c not in not_run]
        after = page[-1].seq
