"""What can reach a running run from outside, gathered in one place.

`RunSignals` is pure asyncio state (no I/O): the control follower, the lease
keeper, the PostgreSQL checks and the worker's drain all write into it; the
agent loop reads it. `changed` is set on every write, so a waiter wakes up,
clears it, and re-reads the fields.
"""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple


class StopRequest(NamedTuple):
    requested_by: str
    requested_at_ms: int
    reason: str
    received_mono: float  # when this worker learned of it (time.monotonic)


class DecisionInfo(NamedTuple):
    decision: str  # approve | reject | expired
    decided_by: str
    comment: str


class RunSignals:
    def __init__(self) -> None:
        self.stop: StopRequest | None = None
        self.decisions: dict[str, DecisionInfo] = {}
        self.release_waiting = False  # drain: hand runs waiting for approval over
        self.parked_on = ""  # the approval the run was parked on (context.Parked)
        self.drain_end = False  # drain deadline passed: end the run now
        self.changed = asyncio.Event()
        # Set when the agent must leave what it is doing at once (stop or drain end).
        self.halt = asyncio.Event()

    def request_stop(self, requested_by: str, requested_at_ms: int, reason: str) -> None:
        if self.stop is None:  # the first request is the one audited
            self.stop = StopRequest(requested_by, requested_at_ms, reason, time.monotonic())
            self.halt.set()
            self.changed.set()

    def add_decision(self, approval_id: str, info: DecisionInfo) -> None:
        self.decisions.setdefault(approval_id, info)
        self.changed.set()

    def release(self) -> None:
        self.release_waiting = True
        self.changed.set()

    def end_for_drain(self) -> None:
        self.drain_end = True
        self.halt.set()
        self.changed.set()
