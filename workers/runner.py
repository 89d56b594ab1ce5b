"""Executes a run with an agent written against `workers.api`, and ends it.

The agent runs as one task, raced against what may cut it short: a stop or
the drain deadline (the task is cancelled and gets `agent_stop_grace_s` to
unwind) and the run's time budget (`run_timeout_s`, paused while an
approval is waited for). Then exactly one ending, as for the built-in loop
(`agent.py`): `completed`, `aborted` (interrupt_requested + the stop audit)
or `failed` (run_error with a code); tool cards left without a result get
`tool_result skipped` first. Nothing is appended by a worker that lost the
run: it just stops.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import secrets
from collections.abc import Awaitable

from broker import errors, events
from broker.store import Ownership, Store

from . import ending
from .agent import Outcome
from .api import Agent, AgentContext, AgentError
from .context import Parked, Released, RunContext, Stopped
from .durable import Journal
from .errors import RunFailure
from .takeover import MAX_RESTART_EPOCH, TakeoverPlan

log = logging.getLogger(__name__)


async def run_agent(
    ctx: RunContext, agent: Agent, *, resumed: bool, woken: bool = False
) -> Outcome:
    """Execute (or, after a takeover, resume) the run; never raises but
    CancelledError (ownership lost). `woken`: a parked run resumed for its
    decision."""
    run_id = ctx.run.run_id
    journal: Journal | None = None
    try:
        try:
            ctx.start_clock(0.0)
            journal = await Journal.load(ctx)
            if ctx.writer.last_seq == 0:
                await ctx.append(
                    events.RunStart(
                        trace_id=secrets.token_hex(16),
                        model=ctx.run.model,
                        started_by=ctx.run.started_by,
                        input=ctx.run.input,
                    )
                )
            elif resumed:
                await journal.prepare(announce=not woken)
            # Stopped before it began (a queued run cancelled): the agent is never called.
            ctx.check_halt()
            await _race(ctx, journal, agent(AgentContext(journal, resumed=resumed)))
            journal.finish()
            await ending.close_cards(ctx)
            last = events.RunEnd(status="completed", usage=_usage(journal))
            await ending.end(ctx, last, waiting=_waiting(journal))
            return "completed"
        except Stopped:
            step = journal.idx if journal is not None else 0
            await ending.end_aborted(
                ctx, _usage(journal), step=step, side_effects=[], waiting=_waiting(journal)
            )
            return "aborted"
        except RunFailure as f:
            await ending.end_failed(ctx, f, _usage(journal), waiting=_waiting(journal))
            return "failed"
        except Parked:
            return "parked"
        except Released:
            return "released"
    except (errors.StaleEpoch, errors.RunEnded):
        log.info("run %s: ownership lost; another worker has it", run_id)
        return "lost"
    except errors.RunlogError as e:
        log.warning("run %s: cannot write (%s); leaving it to a takeover", run_id, e)
        return "lost"


async def _race(ctx: RunContext, journal: Journal, coro: Awaitable[None]) -> None:
    task = asyncio.ensure_future(coro)
    halt = asyncio.ensure_future(ctx.signals.halt.wait())
    ours = False  # we cancelled the task
    try:
        while True:
            journal.clock_changed.clear()
            clock = asyncio.ensure_future(journal.clock_changed.wait())
            remaining = None if ctx.clock_paused else ctx.remaining_s()
            try:
                done, _ = await asyncio.wait(
                    {task, halt, clock},
                    timeout=max(0.0, remaining) if remaining is not None else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                clock.cancel()
            if task in done:
                break
            if halt in done or not done:  # stopped, drain deadline, or out of time
                ours = True
                task.cancel()
                await asyncio.wait({task}, timeout=ctx.settings.agent_stop_grace_s)
                if not task.done():
                    log.warning("run %s: the agent ignored its cancellation", ctx.run.run_id)
                if journal.fatal is None:
                    ctx.check_halt()
                    raise RunFailure("run_timeout")
                break
    finally:
        halt.cancel()
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: never "exception was never retrieved"
    if journal.fatal is not None:
        raise journal.fatal
    if task.cancelled():
        if ours:  # cut short by us, and the agent swallowed nothing of ours
            ctx.check_halt()
            raise RunFailure("run_timeout")
        raise RunFailure("agent_error", "the agent cancelled itself")
    e = task.exception()
    if e is None:
        return
    if isinstance(e, AgentError):
        raise RunFailure(e.code, e.message or e.code, retryable=e.retryable)
    log.error("run %s: the agent raised", ctx.run.run_id, exc_info=e)
    raise RunFailure("agent_error", f"the agent raised {type(e).__name__}")


def _waiting(journal: Journal | None) -> bool:
    return journal is not None and bool(journal.open_approval)


def _usage(journal: Journal | None) -> events.Usage:
    u = journal.usage if journal is not None else [0, 0, 0]
    return events.Usage(input_tokens=u[0], output_tokens=u[1], reasoning_tokens=u[2])


# -- registration and takeover


def load_agent(path: str) -> Agent:
    """The agent at `module:attr` (setting `agent`); BadAgent if there is none."""
    module_name, _, attr = path.strip().partition(":")
    if not module_name or not attr:
        raise errors.BadAgent(f"agent {path!r} must look like module:attr")
    try:
        value = getattr(importlib.import_module(module_name), attr)
    except ImportError as e:
        raise errors.BadAgent(
            f"agent {path!r}: cannot import {module_name}: {e}",
            hint="run from the folder that holds the module, or install it; an adapter's "
            "framework comes with its extra, e.g. pip install 'runlog[langgraph]'",
        ) from e
    except AttributeError as e:
        raise errors.BadAgent(f"agent {path!r}: {module_name} has no {attr}") from e
    if not callable(value):
        raise errors.BadAgent(f"agent {path!r} is a {type(value).__name__}, not a callable")
    return value


async def plan_agent_takeover(store: Store, own: Ownership) -> TakeoverPlan:
    """A run of an API agent taken over: stopped → ended aborted here; an
    empty log → executed from the start; else resumed by replay (which fails
    it itself if its tail cannot be retracted: `Journal.prepare`)."""
    stop = await store.interrupt_request(own.run_id)
    if stop is not None:
        return TakeoverPlan("aborted", False, None, stop, None)
    if own.last_seq == 0:  # died before run_start: again, a few times
        ok = own.epoch <= MAX_RESTART_EPOCH
        return TakeoverPlan("restarted" if ok else "failed", ok, None, None, None)
    return TakeoverPlan("resumed", True, None, None, None)
