"""Gateway metrics, on an injected registry (labels from fixed allow-lists)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

CONN_KINDS = ("ws", "sse", "compat")
ACCESS_CODES = ("forbidden", "token_revoked")
ACCESS_VIAS = ("message", "recheck", "subscribe")
REFUSAL_REASONS = ("user", "ip")
_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)  # fmt: skip


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.connections = Gauge(
            "runlog_gateway_connections", "Open client connections.", ["kind"], registry=registry
        )
        # Frames are counted on the hottest path (once per client per event),
        # so as plain ints, exported by a collector: no lock, no label lookup.
        # Direct: written at once by the fan-out; queued: by the writer task.
        self.frames_direct: dict[str, int] = dict.fromkeys(CONN_KINDS, 0)
        self.frames_queued: dict[str, int] = dict.fromkeys(CONN_KINDS, 0)
        registry.register(_FramesCollector(self.frames_direct, self.frames_queued))
        # Counted once per live batch, like the frames below: plain ints.
        self.events_fanned_out = PlainCounter(
            "runlog_gateway_events_fanned_out",
            "Events put into client send queues (one per event per subscriber).",
            registry,
        )
        self.slow_disconnects = Counter(
            "runlog_gateway_slow_client_disconnects_total",
            "Clients disconnected because their send queue passed its bound.",
            ["kind"],
            registry=registry,
        )
        self.coalesced = Counter(
            "runlog_gateway_coalesced_events_total",
            "Delta events merged into the previous one for a lagging client.",
            registry=registry,
        )
        self.dropped = Counter(
            "runlog_gateway_dropped_progress_events_total",
            "Progress events skipped for a lagging client.",
            registry=registry,
        )
        # Label values: the issuers of trusted_issuers only, never a token's `iss`.
        self.jwks_loads = Counter(
            "runlog_gateway_jwks_loads_total",
            "JWKS fetches of the trusted issuers, by issuer and outcome (ok, error: the last "
            "good keys are kept).",
            ["issuer", "outcome"],
            registry=registry,
        )
        self.topics = Gauge(
            "runlog_gateway_topics", "Runs and sessions this gateway follows.", registry=registry
        )
        # Read when scraped (set_function): nothing on the hot path.
        self.subscriptions = Gauge(
            "runlog_gateway_subscriptions",
            "Client subscriptions the hub feeds (WebSocket subscriptions and SSE streams).",
            registry=registry,
        )
        self.send_queue_bytes = Gauge(
            "runlog_gateway_send_queue_bytes",
            "Bytes queued for clients or being written to their sockets, over all connections.",
            registry=registry,
        )
        self.replayed = Counter(
            "runlog_gateway_replayed_events_total",
            "Events sent from PostgreSQL to catch a subscriber up.",
            registry=registry,
        )
        self.pending_overflows = Counter(
            "runlog_gateway_catchup_buffer_overflows_total",
            "Catching-up subscribers whose buffer of live batches overflowed (they re-read "
            "from PostgreSQL instead).",
            registry=registry,
        )
        self.commit_to_send_seconds = PlainHistogram(
            "runlog_gateway_commit_to_queue_seconds",
            "From commit (as stamped by the appender) to the event entering client queues.",
            _LATENCY_BUCKETS_S,
            registry,
        )
        self.ws_errors = Counter(
            "runlog_gateway_client_errors_total",
            "Error replies sent to clients, by code.",
            ["code"],
            registry=registry,
        )
        self.requests = Counter(
            "runlog_gateway_http_requests_total",
            "HTTP requests by route and status class.",
            ["route", "status"],
            registry=registry,
        )
        self.access_ended = Counter(
            "runlog_gateway_access_ended_total",
            "Client streams ended because access ended, by code (forbidden: member removed or "
            "demoted; token_revoked) and by what found it (message, recheck, subscribe).",
            ["code", "via"],
            registry=registry,
        )
        self.connections_refused = Counter(
            "runlog_gateway_connections_refused_total",
            "WebSocket and SSE connections refused with too_many_connections, by the cap "
            "reached: user (max_connections_per_user) or ip (max_connections_per_ip).",
            ["reason"],
            registry=registry,
        )
        # Read when scraped (set_function, from the gateway's ReplaySlots).
        self.replays_running = Gauge(
            "runlog_gateway_replays_running",
            "Catch-up replay turns running now, or resting after one (replay_loop_share); at "
            "most max_concurrent_replays.",
            registry=registry,
        )
        self.replays_waiting = Gauge(
            "runlog_gateway_replays_waiting",
            "Catch-up replays waiting for their turn (round-robin between users).",
            registry=registry,
        )
        for k in CONN_KINDS:
            self.connections.labels(k)
            self.slow_disconnects.labels(k)
        for code in ACCESS_CODES:
            for via in ACCESS_VIAS:
                self.access_ended.labels(code, via)
        for reason in REFUSAL_REASONS:
            self.connections_refused.labels(reason)


class _FramesCollector(Collector):
    def __init__(self, direct: dict[str, int], queued: dict[str, int]) -> None:
        self.direct = direct
        self.queued = queued

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "runlog_gateway_frames_sent",
            "Frames written to clients (WebSocket frames or SSE writes), by path: "
            "direct (straight to a socket that keeps up) or queued (by the writer task).",
            labels=["kind", "path"],
        )
        for kind in self.direct:
            family.add_metric([kind, "direct"], self.direct[kind])
            family.add_metric([kind, "queued"], self.queued[kind])
        yield family


class PlainCounter(Collector):
    """A counter without labels as a plain int (no lock: one event loop
    updates it), for the per-batch live path; exported as `<name>_total`."""

    def __init__(self, name: str, doc: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.doc = doc
        self.value = 0
        registry.register(self)

    def inc(self, n: int = 1) -> None:
        self.value += n

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.doc, value=self.value)


class PlainHistogram(Collector):
    """A histogram without labels as plain ints and a float (no lock, no
    per-bucket objects: prometheus_client's `observe` was ~2 µs per live
    batch, a few % of a delivery's cost). Same buckets, same exposition
    (`_bucket{le}` cumulative, `_count`, `_sum`)."""

    def __init__(
        self, name: str, doc: str, buckets: tuple[float, ...], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.doc = doc
        self.bounds = list(buckets)
        self.counts = [0] * (len(buckets) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        registry.register(self)

    def observe(self, v: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (le).
        self.counts[bisect.bisect_left(self.bounds, v)] += 1
        self.sum += v

    def collect(self) -> Iterator[HistogramMetricFamily]:
        cumulative, buckets = 0, []
        for bound, n in zip([*self.bounds, float("inf")], self.counts, strict=True):
            cumulative += n
            buckets.append((_le(bound), cumulative))
        yield HistogramMetricFamily(self.name, self.doc, buckets=buckets, sum_value=self.sum)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(float(bound))
