"""What a worker does with a run it took over (its owner's lease ran out).

The new owner holds a higher epoch, so the old one, if it is still alive
(paused, partitioned), can append nothing more. Then, in this order:

| the run | outcome |
|---|---|
| nothing in its log yet (the owner died before `run_start` committed), at most two restarts | `restarted`: executed from the start |
| checkpointed while waiting for an approval, and the log after the checkpoint holds only that approval's events | `resumed`: waits for (or finds) the decision, then goes on |
| a stop was requested | `aborted`: `interrupt_requested` + `run_end` aborted, with the audit |
| the log after its checkpoint (or after `run_start`, with none) can be retracted, and fewer than `agent_max_resumes` takeovers since that checkpoint | `resumed`: the tail retracted, then on from the checkpoint (`agent.py`) — or `failed` with `tool_interrupted` if a tool that is not retryable had started |
| anything else (a `tool_result` after the checkpoint, too many resumes, an unreadable checkpoint) | `failed`: `run_error` worker_lost (retryable) + `run_end` failed |

The tail (`resume.py`) is the dead owner's work in flight: text of a model
turn it was streaming (`message_reset`), tool cards it opened (`tool_result`
skipped). A `tool_result` there means a tool ran whose result the checkpoint
does not hold (the owner died between the two writes): it must not run
again and cannot be fed to the model, hence `failed`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

from broker import approvals, errors, events
from broker.log import RunWriter
from broker.store import Ownership, Store

from .errors import RunFailure
from .metrics import WorkerMetrics
from .resume import read_tail, unretractable
from .signals import DecisionInfo
from .state import AgentState, ResumePoint, decode_state, encode_state

log = logging.getLogger(__name__)

# claim_queued gives epoch 1; restarts of an empty run stop after epoch 3,
# so a run that kills its worker before its first event cannot loop forever.
MAX_RESTART_EPOCH = 3


# After the checkpoint: approval_required, approval_decided and a few
# `status` events (one per resume) at most.
_MAX_TAIL = 16


class TakeoverPlan(NamedTuple):
    outcome: str  # resumed | restarted | aborted | failed
    run: bool  # execute it (from `state`, or from the start if None)
    state: AgentState | None
    stop: tuple[str, int, str] | None
    resume: ResumePoint | None
    reason: str = ""  # failed: why it cannot be resumed (its run_error says it)

    async def end(
        self,
        store: Store,
        writer: RunWriter,
        metrics: WorkerMetrics,
        side_effect_tools: frozenset[str] = frozenset(),
    ) -> None:
        # Fenced by our epoch: if yet another worker took the run meanwhile,
        # StaleEpoch, and its approvals are left to it.
        undecided = {
            a.tool_call_id
            for a in await approvals.open_for_run(store.pool, writer.run_id)
            if a.decision is None and a.tool_call_id
        }
        await approvals.close_open_for_run(store.pool, writer.run_id, writer.epoch)
        # A card whose call waited for its approval never ran: it gets its
        # result before the end, as when the run ends itself. (A card whose
        # tool may have started is left as the log has it.)
        for call_id in await _open_cards_in_log(store, writer.run_id, undecided):
            await writer.append(
                events.ToolResult(
                    tool_call_id=call_id, status="skipped", summary="not run: the run ended"
                )
            )
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
            why = f": {self.reason}" if self.reason else ""
            f = RunFailure("worker_lost", f"the run cannot be resumed{why}")
            metrics.errors.labels(f.code).inc()
            await writer.append(
                events.RunError(code=f.code, retryable=f.retryable, message=f.message)
            )
            await writer.append(events.RunEnd(status="failed"))
        await writer.flush()


async def plan_takeover(store: Store, own: Ownership, *, max_resumes: int = 3) -> TakeoverPlan:
    """`max_resumes`: setting `agent_max_resumes`."""
    stop = await store.interrupt_request(own.run_id)
    raw = await store.load_checkpoint(own.run_id)
    state = decode_state(raw) if raw else None
    info = await store.get_run(own.run_id)
    if own.last_seq == 0 and own.epoch <= MAX_RESTART_EPOCH:
        return TakeoverPlan("restarted", True, None, stop, None)
    if (
        state is not None
        and info.status == "waiting_approval"
        and state.approval_id
        and state.pending
        and (resume := await _approval_tail(store, own, state)) is not None
    ):
        return TakeoverPlan("resumed", True, state, stop, resume)
    if stop:
        return TakeoverPlan("aborted", False, state, stop, None)
    if own.last_seq == 0:
        why = "nothing logged, and restarted too often"
    elif raw and state is None:
        why = "its checkpoint cannot be read"
    else:
        plan = await _resume_plan(store, own, state, max_resumes)
        if isinstance(plan, TakeoverPlan):
            return plan
        why = plan
    log.warning("run %s: cannot be resumed (%s)", own.run_id, why)
    return TakeoverPlan("failed", False, state, stop, None, why)


async def _resume_plan(
    store: Store, own: Ownership, state: AgentState | None, max_resumes: int
) -> TakeoverPlan | str:
    """Resume from the checkpoint (`state`, or none: from `run_start`) if the
    tail after it can be retracted, counting the resume in the checkpoint;
    else why not."""
    if state is None:
        head = await store.run_page(own.run_id, 0, 1)
        start = events.decode_stored(head[0].payload) if head else None
        if not isinstance(start, events.RunStart):
            return "its log does not begin with run_start"
        state = AgentState(at_seq=start.seq, trace_id=start.trace_id)
    if state.approval_id:
        # A run checkpointed waiting: only the approval rule may resume it;
        # a tail other than that approval's events is no state of ours.
        return "an approval wait with other events after it"
    if own.last_seq < state.at_seq:
        return f"its log ends at seq {own.last_seq}, before its checkpoint"
    if state.resumes >= max_resumes:
        return f"{state.resumes} takeovers since its last checkpoint"
    tail = await read_tail(store, own.run_id, state.at_seq)
    if (why := unretractable(tail)) is not None:
        return why
    state.resumes += 1
    if not await store.save_checkpoint(own.run_id, own.epoch, encode_state(state), "running"):
        raise errors.StaleEpoch(f"run {own.run_id}: taken over again meanwhile")
    # A tool that must not run twice had started: the resumed run fails it
    # (tool_interrupted), after retracting the tail like any resumed run.
    outcome = "failed" if state.started else "resumed"
    return TakeoverPlan(outcome, True, state, None, ResumePoint(False, None, tuple(tail)))


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


async def _tool_events(
    store: Store, run_id: str
) -> AsyncIterator[events.ToolCallStart | events.ToolResult]:
    """The run's tool cards opened and tool results, in log order."""
    after = 0
    while True:
        page = await store.run_page(run_id, after, 1000)
        for item in page:
            if item.type == "tool_call_start" or item.type == "tool_result":
                ev = events.decode_stored(item.payload)
                if isinstance(ev, events.ToolCallStart | events.ToolResult):
                    yield ev
        if len(page) < 1000:
            return
        after = page[-1].seq


async def _open_cards_in_log(store: Store, run_id: str, among: set[str]) -> list[str]:
    """The tool cards of `among` the log opened and never gave a result."""
    if not among:
        return []
    opened: dict[str, None] = {}
    async for ev in _tool_events(store, run_id):
        if isinstance(ev, events.ToolCallStart):
            opened[ev.tool_call_id] = None
        else:
            opened.pop(ev.tool_call_id, None)
    return [c for c in opened if c in among]


async def _side_effects_in_log(store: Store, run_id: str, tools: frozenset[str]) -> list[str]:
    """Calls of side-effecting tools that started running: every such call
    except those denied or skipped (a tool that errored may have acted)."""
    started: list[str] = []
    not_run: set[str] = set()
    async for ev in _tool_events(store, run_id):
        if isinstance(ev, events.ToolCallStart) and ev.tool_name in tools:
            started.append(ev.tool_call_id)
        elif isinstance(ev, events.ToolResult) and ev.status in ("denied", "skipped"):
            not_run.add(ev.tool_call_id)
    return [c for c in started if c not in not_run]
