"""What one run's execution shares: its writer, signals, clocks and limits.

`RunContext.guard` is the single place where a phase of the run (a model
turn, a tool call) is raced against the things that may cut it short:

- a stop or the drain deadline (`signals.halt`): the phase's task is
  cancelled at once, which for a model turn closes the provider connection;
- the phase's own timeout (model turn: between items, inside the turn; tool:
  `tool_timeout_s`), with its own error code;
- the run's remaining time budget (`run_timeout_s`, which does not run while
  the run waits for an approval), code `run_timeout`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker import events
from broker.log import RunWriter
from broker.settings import Settings
from broker.store import RunInfo, Store, retry_transient

from .errors import RunFailure
from .metrics import WorkerMetrics
from .signals import RunSignals
from .tools import ToolRegistry

log = logging.getLogger(__name__)

T = TypeVar("T")

# After cancelling a phase, how long to wait for it to unwind (a tool that
# swallows cancellation must not hang the stop).
_UNWIND_S = 5.0


class Stopped(Exception):
    """A stop was requested: end the run as aborted."""


class Released(Exception):
    """The worker is draining: hand the (waiting) run over without ending it."""


class Parked(Released):
    """The run waits for an approval without its worker: the execution ends,
    the run is parked on the approval (`RunSignals.parked_on`), and the
    decision, the expiry or a stop wakes it on any worker."""


class RunContext:
    def __init__(
        self,
        *,
        writer: RunWriter,
        run: RunInfo,
        signals: RunSignals,
        store: Store,
        settings: Settings,
        metrics: WorkerMetrics,
        registry: ToolRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = writer
        self.run = run
        self.signals = signals
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.registry = registry
        self.clock = clock
        self.produced_output = False  # content deltas or tool drafts are in the log
        self.resulted: set[str] = set()  # tool calls that got their tool_result
        self.opened: list[str] = []  # tool calls whose tool_call_start was appended
        self._deadline = 0.0  # loop time at which the run timeout fires
        self._paused_remaining: float | None = None

    # -- time

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def start_clock(self, used_s: float) -> None:
        self._deadline = _loop_time() + max(0.0, self.settings.run_timeout_s - used_s)

    def used_s(self) -> float:
        remaining = self._remaining()
        return max(0.0, self.settings.run_timeout_s - remaining)

    def pause_clock(self) -> None:
        self._paused_remaining = self._remaining()

    def resume_clock(self) -> None:
        if self._paused_remaining is not None:
            self._deadline = _loop_time() + self._paused_remaining
            self._paused_remaining = None

    @property
    def clock_paused(self) -> bool:
        return self._paused_remaining is not None

    def remaining_s(self) -> float:
        """What is left of the run's time budget (s)."""
        return self._remaining()

    def _remaining(self) -> float:
        if self._paused_remaining is not None:
            return self._paused_remaining
        return self._deadline - _loop_time()

    # -- the log

    async def append(self, event: events.Event) -> int:
        if isinstance(
            event,
            events.TextDelta | events.ReasoningDelta | events.ToolCallStart | events.ToolArgsDelta,
        ):
            self.produced_output = True
        return await self.writer.append(event)

    async def write(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """A fenced write made on the run's behalf (approval, checkpoint),
        retried while PostgreSQL is unreachable for as long as commits are
        (`storage_outage_grace_s`): fencing decides it once PostgreSQL is back,
        so waiting is safe, and an outage fails no run (DESIGN guarantee 10)."""
        return await retry_transient(call, for_s=self.settings.storage_outage_grace_s, what=what)

    # -- cutting phases short

    def check_halt(self) -> None:
        if self.signals.stop is not None:
            raise Stopped()
        if self.signals.drain_end:
            raise RunFailure("worker_draining")

    async def guard(
        self,
        aw: Awaitable[T],
        *,
        timeout_s: float | None,
        code: str,
        cancellable: bool = True,
        on_cancelled: Callable[[], None] | None = None,
    ) -> T:
        """Run `aw` as a task until it finishes, times out or is halted.

        A halt cancels it only if `cancellable`; otherwise the phase is left
        to finish (within its timeout) and the caller checks the halt after.
        `on_cancelled` runs once a halted phase has fully unwound.
        """
        self.check_halt()
        budget = self._remaining()
        if budget <= 0:
            raise RunFailure("run_timeout")
        if timeout_s is None or timeout_s >= budget:
            limit, limit_code = budget, "run_timeout"
        else:
            limit, limit_code = timeout_s, code
        task = asyncio.ensure_future(aw)
        halt = asyncio.ensure_future(self.signals.halt.wait()) if cancellable else None
        try:
            waiting: set[asyncio.Future[object]] = {task}  # type: ignore[arg-type]
            if halt is not None:
                waiting.add(halt)  # type: ignore[arg-type]
            done, _ = await asyncio.wait(
                waiting, timeout=limit, return_when=asyncio.FIRST_COMPLETED
            )
            if task in done:
                return task.result()
            task.cancel()
            await asyncio.wait({task}, timeout=_UNWIND_S)
            if halt is not None and halt in done:
                if on_cancelled is not None:
                    on_cancelled()
                self.check_halt()
            raise RunFailure(limit_code)
        finally:
            if halt is not None:
                halt.cancel()
            if not task.done():
                task.cancel()
            elif not task.cancelled():
                task.exception()  # retrieved: never "exception was never retrieved"


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
