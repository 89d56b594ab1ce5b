"""Follow one run's control messages (interrupts, decisions) from JetStream.

Each owned run gets an ordered, ephemeral consumer on `runlog.ctl.<run_id>`
that starts at the beginning of the CONTROL stream, so a stop or decision
sent before this worker took the run (or while it was down) still arrives.
Every control fact is also in PostgreSQL, which the agent checks when the
run starts or resumes and while it waits (see `agent.py`): losing this feed
delays a stop or a decision, it never loses one.
"""

from __future__ import annotations

import logging

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from broker import control
from broker.bus import Bus
from broker.constants import CONTROL_STREAM, control_subject

from .signals import DecisionInfo, RunSignals

log = logging.getLogger(__name__)


class ControlFollower:
    def __init__(self, bus: Bus, run_id: str, signals: RunSignals) -> None:
        self._bus = bus
        self._run_id = run_id
        self._signals = signals
        self._sub: JetStreamContext.PushSubscription | None = None

    async def start(self) -> None:
        try:
            self._sub = await self._bus.js.subscribe(
                control_subject(self._run_id),
                stream=CONTROL_STREAM,
                cb=self._on_msg,
                ordered_consumer=True,
                deliver_policy=api.DeliverPolicy.ALL,
                inactive_threshold=30.0,
            )
        except (nats.errors.Error, OSError, TimeoutError) as e:
            # PostgreSQL still carries every stop and decision (polled).
            log.warning("run %s: cannot follow control messages: %s", self._run_id, e)

    async def close(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except (nats.errors.Error, OSError, TimeoutError):
                pass

    async def _on_msg(self, msg: Msg) -> None:
        try:
            m = control.decode_control(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.error("run %s: undecodable control message", self._run_id)
            return
        if m.run_id != self._run_id:
            return
        match m:
            case control.Interrupt():
                self._signals.request_stop(m.requested_by, m.requested_at, m.reason)
            case control.Decision():
                self._signals.add_decision(
                    m.approval_id, DecisionInfo(m.decision, m.decided_by, m.comment)
                )
