"""Prometheus metrics of a worker, registered on an injected registry.

Label values come from fixed allow-lists (run outcomes, takeover outcomes,
error codes, the names of the tools registered at start), so cardinality is
bounded by configuration, never by input.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .errors import ALL_CODES

_ERROR_LABELS = frozenset(ALL_CODES)

_LATENCY_BUCKETS_S = (
    0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
)  # fmt: skip
_TOOL_BUCKETS_S = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_EVENT_BUCKETS = (1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)

# How a run left this worker: ended (completed/aborted/failed), handed over
# at drain (released), parked on an approval (parked: any worker resumes it
# when it is decided), or taken away (lost: another worker fenced it).
RUN_OUTCOMES = ("completed", "aborted", "failed", "released", "parked", "lost")
TAKEOVER_OUTCOMES = ("resumed", "restarted", "failed", "aborted", "lost_race")
JOB_OUTCOMES = (
    "started", "deferred", "duplicate", "bad", "requeued", "woken", "capped", "yielded",
)  # fmt: skip
APPROVAL_OUTCOMES = ("approve", "reject", "expired")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, tool_names: Iterable[str] = ()) -> None:
        self.registry = registry
        self._tools = frozenset(tool_names)
        self.runs = Counter(
            "runlog_worker_runs_total",
            "Runs that left this worker, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.runs_active = Gauge(
            "runlog_worker_runs_active", "Runs this worker owns now.", registry=registry
        )
        self.jobs = Counter(
            "runlog_worker_jobs_total",
            "Run jobs handled: started, deferred (an earlier run of the session is active), "
            "duplicate (already taken), bad (undecodable), requeued (a lost job sent again), "
            "woken (a parked run resumed for its decision, expiry or stop), capped (its user "
            "has worker_user_max_runs executing), yielded (a run of a user with fewer "
            "executing was taken first).",
            ["outcome"],
            registry=registry,
        )
        self.errors = Counter(
            "runlog_worker_run_errors_total",
            "run_error events emitted, by code.",
            ["code"],
            registry=registry,
        )
        self.time_to_first_event = Histogram(
            "runlog_worker_time_to_first_event_seconds",
            "From run creation to its run_start being committed.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "runlog_worker_time_to_first_token_seconds",
            "From run creation to its first text or reasoning delta.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.time_to_first_tool_card = Histogram(
            "runlog_worker_time_to_first_tool_card_seconds",
            "From run creation to its first tool_call_start.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.events_per_run = Histogram(
            "runlog_worker_events_per_run",
            "Events in a run's log when it ended on this worker.",
            buckets=_EVENT_BUCKETS,
            registry=registry,
        )
        self.abort_propagation = Histogram(
            "runlog_worker_abort_propagation_seconds",
            "From a stop reaching the worker to the model stream (provider connection) "
            "being closed.",
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.partial_persist = Counter(
            "runlog_worker_partial_persist_total",
            "Aborted runs whose partial output (deltas, tool drafts) was kept in the log; "
            "divide by runs_total{outcome=aborted} for the partial persist rate.",
            registry=registry,
        )
        self.stalled_streams = Counter(
            "runlog_worker_stalled_streams_total",
            "Model streams that sent nothing for model_timeout_s.",
            registry=registry,
        )
        self.approvals_waiting = Gauge(
            "runlog_worker_approvals_waiting",
            "Runs on this worker waiting for an approval decision.",
            registry=registry,
        )
        self.approvals = Counter(
            "runlog_worker_approvals_total",
            "Approvals resolved, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.tool_seconds = Histogram(
            "runlog_worker_tool_seconds",
            "Duration of tool calls, by tool (names outside the registry count as 'other').",
            ["tool"],
            buckets=_TOOL_BUCKETS_S,
            registry=registry,
        )
        self.takeovers = Counter(
            "runlog_worker_takeovers_total",
            "Runs whose owner's lease ran out that this worker tried to take over, by outcome.",
            ["outcome"],
            registry=registry,
        )
        for o in RUN_OUTCOMES:
            self.runs.labels(o)
        for o in JOB_OUTCOMES:
            self.jobs.labels(o)
        for code in (*ALL_CODES, "other"):
            self.errors.labels(code)
        for o in APPROVAL_OUTCOMES:
            self.approvals.labels(o)
        for o in TAKEOVER_OUTCOMES:
            self.takeovers.labels(o)

    def tool_label(self, name: str) -> str:
        return name if name in self._tools else "other"

    def error_label(self, code: str) -> str:
        """A registered run_error code as itself; an agent's own AgentError
        code (its choice, unbounded) as `other`, not as a bug of runlog's."""
        return code if code in _ERROR_LABELS else "other"
