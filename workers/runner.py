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
from typing import Literal

from broker import errors, events

from . import ending
from .api import Agent, AgentContext, AgentError
from .context import Parked, Released, RunContext, Stopped
from .durable import Journal
from .errors import RunFailure

log = logging.getLogger(__name__)

Outcome = Literal["completed", "aborted", "failed", "released", "parked", "lost"]


async def run_agent(
    ctx: RunContext, agent: Agent, *, resumed: bool, woken: bool = False, model: str = ""
) -> Outcome:
    """Execute (or, after a takeover, resume) the run; never raises but
    CancelledError (ownership lost). `woken`: a parked run resumed for its
    decision. `model`: the model run_start names when the run asks for none
    (the built-in agent's default)."""
    run_id = ctx.run.run_id
    journal: Journal | None = None
    try:
        try:
            journal = await Journal.load(ctx)
            ctx.start_clock(journal.used_s())
            if ctx.writer.last_seq == 0:
                await ctx.append(
                    events.RunStart(
                        trace_id=secrets.token_hex(16),
                        model=ctx.run.model or model,
                        started_by=ctx.run.started_by,
                        input=ctx.run.input,
                    )
                )
                _observe_first_event(ctx)
            elif resumed:
                try:
                    await journal.prepare(announce=not woken)
                except RunFailure:
                    ctx.on_resume("failed")
                    raise
                ctx.on_resume("resumed")
            # Stopped before it began (a queued run cancelled): the agent is never called.
            ctx.check_halt()
            await _race(ctx, journal, agent(AgentContext(journal, resumed=resumed)))
            journal.finish()
            await ending.close_cards(ctx)
            last = events.RunEnd(status="completed", usage=_usage(journal))
            await ending.end(ctx, last, waiting=_waiting(journal))
            return "completed"
        except Stopped:
            step, side_effects = 0, []
            if journal is not None:
                step = journal.idx if journal.turns is None else journal.turns
                side_effects = list(journal.side_effects)
            await ending.end_aborted(
                ctx, _usage(journal), step=step, side_effects=side_effects,
                waiting=_waiting(journal),
            )  # fmt: skip
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
    out_of_time = False
    try:
        while True:
            # Stopped or past the drain deadline (unless a step that must not
            # be cut short runs: the halt waits for it), or out of time.
            if (halt.done() and not journal.uncancellable) or out_of_time:
                ours = True
                task.cancel()
                await asyncio.wait({task}, timeout=ctx.settings.agent_stop_grace_s)
                if not task.done():
                    log.warning("run %s: the agent ignored its cancellation", ctx.run.run_id)
                if journal.fatal is None:
                    ctx.check_halt()
                    raise RunFailure("run_timeout")
                break
            journal.clock_changed.clear()
            clock = asyncio.ensure_future(journal.clock_changed.wait())
            remaining = None if ctx.clock_paused else ctx.remaining_s()
            try:
                done, _ = await asyncio.wait(
                    {task, clock} if halt.done() else {task, halt, clock},
                    timeout=max(0.0, remaining) if remaining is not None else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                clock.cancel()
            if task in done:
                break
            out_of_time = not done
    except asyncio.CancelledError:
        # We are cancelled (ownership lost, the worker closing): the agent
        # must not go on without us — it might act (a tool, a model call)
        # for a run that is not ours any more.
        task.cancel()
        raise
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
    if isinstance(e, RunFailure):  # the built-in agent's own codes (loop.py)
        raise e
    log.error("run %s: the agent raised", ctx.run.run_id, exc_info=e)
    raise RunFailure("agent_error", f"the agent raised {type(e).__name__}")


_background: set[asyncio.Task[None]] = set()


def _observe_first_event(ctx: RunContext) -> None:
    """Time from the run's creation to its first event's commit (in the
    background: the run does not wait for it)."""

    async def observe() -> None:
        try:
            await ctx.writer.flush()
        except errors.RunlogError:
            return
        created_ms = ctx.run.created_at_ms
        ctx.metrics.time_to_first_event.observe(max(0.0, (ctx.now_ms() - created_ms) / 1000))

    task = asyncio.create_task(observe())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _waiting(journal: Journal | None) -> bool:
    return journal is not None and bool(journal.open_approval)


def _usage(journal: Journal | None) -> events.Usage:
    u = journal.usage if journal is not None else [0, 0, 0]
    return events.Usage(input_tokens=u[0], output_tokens=u[1], reasoning_tokens=u[2])


# -- registration


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
