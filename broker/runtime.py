"""`Broker`: the log as one process uses it — store, bus, appender, metrics.

Constructing it does no I/O; `Broker.connect` connects, makes sure the
JetStream streams exist and starts the appender; `close` commits and
publishes what is pending, then disconnects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable

import nats.errors
from prometheus_client import CollectorRegistry

from . import control, errors
from .approvals import ApprovalInfo
from .bus import Bus
from .census import RunCensus
from .log import Appender, RunWriter
from .metrics import BrokerMetrics
from .settings import Settings
from .store import Ownership, Store
from .subscribe import Subscription

log = logging.getLogger(__name__)


class Broker:
    def __init__(self, store: Store, bus: Bus, settings: Settings, metrics: BrokerMetrics) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.metrics = metrics
        self.appender = Appender(store, bus, settings, metrics)
        self.census = RunCensus(store, metrics, settings.runs_sample_interval_s)

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        name: str = "runlog",
        stream_replicas: int | None = None,
    ) -> Broker:
        """`stream_replicas` overrides the `stream_replicas` setting (tests)."""
        metrics = BrokerMetrics(registry if registry is not None else CollectorRegistry())
        if stream_replicas is None:
            stream_replicas = settings.stream_replicas
        store = await Store.connect(settings.database_url, settings)
        try:
            bus = await Bus.connect(settings.nats_url, settings, name=name)
        except BaseException:
            await store.close()
            raise
        try:
            await bus.ensure_streams(replicas=stream_replicas)
        except BaseException:
            await bus.close()
            await store.close()
            raise
        broker = cls(store, bus, settings, metrics)
        await broker.appender.start()
        broker.census.start()
        return broker

    async def close(self) -> None:
        await self.census.close()
        await self.appender.close()
        await self.bus.close()
        await self.store.close()

    def writer(self, ownership: Ownership) -> RunWriter:
        return self.appender.writer(ownership)

    async def claim(self, run_id: str, owner_id: str, lease_s: float = 30.0) -> RunWriter:
        """Take ownership of a run (fencing every earlier writer) and return its writer."""
        return self.writer(await self.store.claim_run(run_id, owner_id, lease_s))

    async def subscribe(
        self, *, run_id: str | None = None, session_id: str | None = None, after: int = 0
    ) -> Subscription:
        sub = Subscription(
            self.store,
            self.bus,
            self.settings,
            self.metrics,
            run_id=run_id,
            session_id=session_id,
            after=after,
        )
        return await sub.start()

    # -- commands (used by gateways; recorded in PostgreSQL first, then sent)

    async def start_run(
        self, session_id: str, started_by: str, *, input: str = "", model: str = ""
    ) -> str:
        """Create a run (applying the session's run policy) and enqueue it for
        workers. Returns its id at once; `run_start` will be its first event."""
        run_id, _ = await self.queue_run(session_id, started_by, input=input, model=model)
        return run_id

    async def queue_run(
        self, session_id: str, started_by: str, *, input: str = "", model: str = ""
    ) -> tuple[str, list[str]]:
        """`start_run`, also returning the session's runs that had not ended
        when it was created, oldest first: it starts once they have."""
        run_id, active = await self.store.create_run_checked(
            session_id, started_by, input=input, model=model
        )
        if active and await self.store.session_run_policy(session_id) == "interrupt":
            for other in active:
                await self.interrupt(other, started_by, "superseded by a new run")
        await self._send(
            self.bus.enqueue_job(
                control.RunJob(run_id=run_id, session_id=session_id, requested_at=_now_ms())
            )
        )
        return run_id, active

    async def interrupt(self, run_id: str, requested_by: str, reason: str = "") -> bool:
        """Record a stop request and send it to the run's owner. Returns whether
        this was the first request (a repeat changes nothing)."""
        first = await self.store.request_interrupt(run_id, requested_by, reason)
        await self._send(
            self.bus.publish_control(
                control.Interrupt(
                    run_id=run_id, requested_by=requested_by, reason=reason,
                    requested_at=_now_ms(),
                )
            )
        )  # fmt: skip
        await self._wake(run_id)
        return first

    async def decide(
        self,
        approval_id: str,
        decision: str,
        decided_by: str,
        comment: str = "",
        call_digest: str = "",
    ) -> tuple[ApprovalInfo, bool]:
        """Store a decision (first one wins) and its audit row in one transaction,
        then send it to the run's owner. A repeat stores and audits nothing."""
        info, created = await self.store.decide_approval(
            approval_id, decision, decided_by, comment, call_digest
        )
        if info.decision in ("approve", "reject"):
            # Sent again on a repeat too: harmless (deduplicated), and it helps
            # if the first send was lost.
            await self._send(
                self.bus.publish_control(
                    control.Decision(
                        run_id=info.run_id, approval_id=approval_id,
                        decision=info.decision,  # type: ignore[arg-type]
                        decided_by=info.decided_by or decided_by, comment=info.comment,
                        decided_at=info.decided_at_ms or _now_ms(),
                    )
                )
            )  # fmt: skip
        if info.decision is not None:
            await self._wake(info.run_id)
        return info, created

    async def _wake(self, run_id: str) -> None:
        """A parked run (waiting for an approval without a worker) has
        something to act on: ask any worker to resume it. Lost, the workers'
        reapers find it anyway (Store.ready_parked_runs)."""
        try:
            session_id = await self.store.parked_session(run_id)
        except errors.StorageError as e:
            log.warning("run %s: cannot tell whether it is parked (%s)", run_id, e.code)
            return
        if session_id is not None:
            await self._send(
                self.bus.enqueue_job(
                    control.RunJob(
                        run_id=run_id, session_id=session_id, requested_at=_now_ms(), wake=True
                    )
                )
            )

    async def _send(self, publish: Awaitable[None]) -> None:
        """Send a message whose fact is already in PostgreSQL. A failure is logged,
        not raised: workers also find the fact in PostgreSQL (reconciliation)."""
        try:
            await publish
        except (nats.errors.Error, OSError, TimeoutError) as e:
            self.metrics.control_send_failures.inc()
            log.warning("control message not sent (PostgreSQL has it): %s", e)


def _now_ms() -> int:
    return int(time.time() * 1000)
