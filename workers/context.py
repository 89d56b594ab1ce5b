"""What one run's execution shares: its writer, signals, clocks and limits.

The run's clock is its time budget (`run_timeout_s`): it does not run while
the run waits for an approval (`pause_clock`), and a resumed run starts it
at the time its last durable point recorded (`durable.py`). What cuts an
agent short — a stop, the drain deadline, the budget — is raced in
`runner.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from broker import events
from broker.backend import RunLog, RunStore
from broker.settings import Settings
from broker.store import RunInfo, retry_transient

from .errors import RunFailure
from .metrics import WorkerMetrics
from .signals import RunSignals
from .tools import ToolRegistry

log = logging.getLogger(__name__)

# Events that are output a client shows (`produced_output`).
_OUTPUT = frozenset(
    {events.TextDelta, events.ReasoningDelta, events.ToolCallStart, events.ToolArgsDelta}
)

T = TypeVar("T")


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
        writer: RunLog,
        run: RunInfo,
        signals: RunSignals,
        store: RunStore,
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
        # A takeover's resume: told "resumed" or "failed" once the replay
        # knows whether the run can go on (the takeovers metric).
        self.on_resume: Callable[[str], None] = lambda outcome: None
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
        if not self.produced_output and type(event) in _OUTPUT:
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


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
