"""`Broker`: the log as one process uses it — store, bus, appender, metrics.

Constructing it does no I/O; `Broker.connect` connects, makes sure the
JetStream streams exist and starts the appender; `close` commits and
publishes what is pending, then disconnects.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from .bus import Bus
from .log import Appender, RunWriter
from .metrics import BrokerMetrics
from .settings import Settings
from .store import Ownership, Store
from .subscribe import Subscription


class Broker:
    def __init__(self, store: Store, bus: Bus, settings: Settings, metrics: BrokerMetrics) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.metrics = metrics
        self.appender = Appender(store, bus, settings, metrics)

    @classmethod
    async def connect(
        cls,
        settings: Settings,
        *,
        registry: CollectorRegistry | None = None,
        name: str = "runlog",
        stream_replicas: int = 1,
    ) -> Broker:
        metrics = BrokerMetrics(registry if registry is not None else CollectorRegistry())
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
        return broker

    async def close(self) -> None:
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
