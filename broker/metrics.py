"""Prometheus metrics of the log, registered on an injected registry.

Nothing registers at import time: a process builds one `BrokerMetrics` on its
registry (tests build their own, so they never collide). Label values come
from fixed allow-lists.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)

_LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)  # fmt: skip
_BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

FLUSH_ERROR_KINDS = ("connection", "deadlock", "other")
GAP_FILL_REASONS = ("gap", "position_check", "overflow")
# Statuses of runs that have not ended (the ended ones are counted by outcome
# in runlog_worker_runs_total; counting them here would scan the whole table).
UNFINISHED_STATUSES = ("queued", "running", "waiting_approval")


class BrokerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        # Every runlog process (gateway, worker) has exactly one BrokerMetrics
        # on the registry it serves at /metrics. prometheus_client adds the
        # process_* (CPU, resident memory, open fds) and python_info
        # collectors only to its global registry, which we never use, so add
        # them here: a gateway's memory and CPU are what sizing is about.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        self.events_appended = Counter(
            "runlog_events_appended_total",
            "Events committed to PostgreSQL by this process.",
            registry=registry,
        )
        self.commit_seconds = Histogram(
            "runlog_append_commit_seconds",
            "Time of one append transaction (a micro-batch across runs).",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.append_latency_seconds = Histogram(
            "runlog_append_latency_seconds",
            "From an event's append call to its commit (the oldest event of each batch).",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.batch_events = Histogram(
            "runlog_append_batch_events",
            "Events per append transaction.",
            buckets=_BATCH_BUCKETS,
            registry=registry,
        )
        self.flush_errors = Counter(
            "runlog_append_flush_errors_total",
            "Append transactions that failed and were retried, by kind.",
            ["kind"],
            registry=registry,
        )
        self.fenced = Counter(
            "runlog_append_fenced_total",
            "Appends refused because the writer's epoch was stale (ownership lost).",
            registry=registry,
        )
        self.pending_events = Gauge(
            "runlog_append_pending_events",
            "Events appended but not yet committed.",
            registry=registry,
        )
        self.published_messages = Counter(
            "runlog_publish_messages_total",
            "Live-feed messages acknowledged by JetStream.",
            registry=registry,
        )
        self.publish_retries = Counter(
            "runlog_publish_retries_total",
            "Live-feed publishes retried after a failure (after commit).",
            registry=registry,
        )
        self.publish_dropped = Counter(
            "runlog_publish_dropped_total",
            "Live-feed messages dropped because the publish backlog was full "
            "(subscribers fill the gap from PostgreSQL).",
            registry=registry,
        )
        self.publish_backlog = Gauge(
            "runlog_publish_backlog_messages",
            "Committed batches waiting to be published.",
            registry=registry,
        )
        self.publish_lag_seconds = Histogram(
            "runlog_publish_lag_seconds",
            "From commit to JetStream acknowledgement of the live-feed message.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.gap_fills = Counter(
            "runlog_subscribe_gap_fills_total",
            "Reads from PostgreSQL by subscriptions to fill a gap in the live feed, by reason.",
            ["reason"],
            registry=registry,
        )
        self.control_send_failures = Counter(
            "runlog_control_send_failures_total",
            "Jobs, interrupts or decisions stored in PostgreSQL whose JetStream send failed "
            "(workers reconcile from PostgreSQL).",
            registry=registry,
        )
        self.runs_unfinished = Gauge(
            "runlog_runs_unfinished",
            "Runs not ended yet, by status, as counted in PostgreSQL every "
            "runs_sample_interval_s (a global figure: every process reports it; use max).",
            ["status"],
            registry=registry,
        )
        for status in UNFINISHED_STATUSES:
            self.runs_unfinished.labels(status)
        for kind in FLUSH_ERROR_KINDS:
            self.flush_errors.labels(kind)
        for reason in GAP_FILL_REASONS:
            self.gap_fills.labels(reason)
