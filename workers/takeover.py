"""What a worker does with a run it took over: its owner's lease ran out,
its process died (`liveness.py`), or it was parked on an approval and is
woken (`worker.py`).

The new owner holds a higher epoch, so the old one, if it is still alive
(paused, partitioned), can append nothing more. Then, in this order:

| the run | outcome |
|---|---|
| a stop was requested | `aborted` here: `interrupt_requested` + `run_end` aborted, with the audit |
| nothing in its log yet (the owner died before `run_start` committed), at most two restarts | `restarted`: executed from the start |
| a not-retryable step or tool call was running | `failed`: executed, and its replay fails it at once (`step_interrupted`, or `tool_interrupted` with the card's `tool_result` error) |
| anything else | `resumed`: the agent (built-in or yours) replays to its last durable point and goes on (`durable.py`), or the replay fails the run when it cannot (a tail it cannot retract, too many takeovers without progress, a replay that differs) |

Every agent is resumed the same way (one engine): the built-in loop is an
agent on `workers.api` (`loop.py`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import NamedTuple

from broker import events
from broker.backend import RunLog, RunStore
from broker.store import Ownership

from .errors import RunFailure
from .metrics import WorkerMetrics

log = logging.getLogger(__name__)

# claim_queued gives epoch 1; restarts of an empty run stop after epoch 3,
# so a run that kills its worker before its first event cannot loop forever.
MAX_RESTART_EPOCH = 3


class TakeoverPlan(NamedTuple):
    outcome: str  # resumed | restarted | aborted | failed
    run: bool  # execute it (resumed: by replay; restarted: from the start)
    stop: tuple[str, int, str] | None
    reason: str = ""  # failed: why it cannot be resumed (its run_error says it)

    async def end(
        self,
        store: RunStore,
        writer: RunLog,
        metrics: WorkerMetrics,
        side_effect_tools: frozenset[str] = frozenset(),
        *,
        turn_step: str = "",
    ) -> None:
        """End the run here (aborted, or failed worker_lost). `turn_step`: the
        stop audit's `step` counts the durable steps of that name (the
        built-in agent's model turns); "": every durable operation."""
        # Fenced by our epoch: if yet another worker took the run meanwhile,
        # StaleEpoch, and its approvals are left to it.
        undecided = {
            a.tool_call_id
            for a in await store.run_approvals(writer.run_id)
            if a.decision is None and a.tool_call_id
        }
        await store.close_run_approvals(writer.run_id, writer.epoch)
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
            # From the log (with the results just given: those calls never
            # ran): the audit must name every side effect.
            at_seq = await writer.flush()
            done = await _side_effects_in_log(store, writer.run_id, side_effect_tools)
            records = await store.load_steps(writer.run_id)
            step = sum(r.name == turn_step for r in records) if turn_step else len(records)
            await writer.append(events.InterruptRequested(requested_by=by, reason=reason))
            audit = events.StopAudit(
                requested_by=by,
                requested_at=at_ms,
                reason=reason,
                at_seq=at_seq,
                step=step,
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


async def plan_takeover(store: RunStore, own: Ownership) -> TakeoverPlan:
    """Stopped → ended aborted here; an empty log → executed from the start
    (a few times); else resumed by replay (which fails it itself if it
    cannot be resumed: `Journal.prepare`)."""
    stop = await store.interrupt_request(own.run_id)
    if stop is not None:
        return TakeoverPlan("aborted", False, stop)
    if own.last_seq == 0:  # died before run_start: again, a few times
        if own.epoch <= MAX_RESTART_EPOCH:
            return TakeoverPlan("restarted", True, None)
        why = "nothing logged, and restarted too often"
        log.warning("run %s: cannot be resumed (%s)", own.run_id, why)
        return TakeoverPlan("failed", False, None, why)
    records = await store.load_steps(own.run_id)
    if records and records[-1].kind == "step" and not records[-1].done:
        # A not-retryable step (or tool) was running: the replay fails the
        # run (`Journal.prepare`), after giving its card a result.
        return TakeoverPlan("failed", True, None)
    return TakeoverPlan("resumed", True, None)


async def _tool_events(
    store: RunStore, run_id: str
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


async def _open_cards_in_log(store: RunStore, run_id: str, among: set[str]) -> list[str]:
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


async def _side_effects_in_log(store: RunStore, run_id: str, tools: frozenset[str]) -> list[str]:
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
