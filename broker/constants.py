"""Wire names in one place: NATS subjects and streams, Postgres tables.

Subjects carry ids as tokens, so a gateway can subscribe to one run
(`runlog.ev.*.<run_id>`) or to a whole session (`runlog.ev.<session_id>.*`).
"""

from __future__ import annotations

# JetStream streams.
EVENTS_STREAM = "RUNLOG_EVENTS"  # live feed; Postgres is the log, this is the fan-out path
JOBS_STREAM = "RUNLOG_JOBS"  # run requests, a work queue for workers
CONTROL_STREAM = "RUNLOG_CONTROL"  # interrupts and approval decisions, per run

# Subjects.
EVENTS_SUBJECT_PREFIX = "runlog.ev"
JOBS_SUBJECT = "runlog.job.run"
CONTROL_SUBJECT_PREFIX = "runlog.ctl"
# Access changes for every gateway (core NATS, no stream: see control.py).
ACCESS_SUBJECT = "runlog.access"
# Session notices between gateways (core NATS, no stream: presence, runs queued).
NOTICE_SUBJECT_PREFIX = "runlog.notice"

# Headers.
MSG_ID_HEADER = "Nats-Msg-Id"

# Postgres tables.
MIGRATIONS_TABLE = "runlog_migrations"


def events_subject(session_id: str, run_id: str) -> str:
    return f"{EVENTS_SUBJECT_PREFIX}.{session_id}.{run_id}"


def run_events_filter(run_id: str) -> str:
    return f"{EVENTS_SUBJECT_PREFIX}.*.{run_id}"


def session_events_filter(session_id: str) -> str:
    return f"{EVENTS_SUBJECT_PREFIX}.{session_id}.*"


def control_subject(run_id: str) -> str:
    return f"{CONTROL_SUBJECT_PREFIX}.{run_id}"


def notice_subject(session_id: str) -> str:
    return f"{NOTICE_SUBJECT_PREFIX}.{session_id}"
