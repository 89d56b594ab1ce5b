"""Messages that cross processes besides events: run jobs and control.

Every one is recorded in PostgreSQL before it is sent (the run row, the
interrupt columns, the approval decision), so JetStream only has to make it
fast: a worker that missed a message finds the same fact in PostgreSQL when
it takes or resumes the run.

Subjects: jobs on `runlog.job.run` (JOBS stream, a work queue); control on
`runlog.ctl.<run_id>` (CONTROL stream), so the owner of a run can follow
just that run's control messages, from the start of the stream.

Access changes (a member removed or demoted, a user's tokens revoked) go to
every gateway on `runlog.access`, core NATS with no stream: each is recorded
in PostgreSQL first, and a gateway that missed one (it was disconnected at
that moment) finds it at its next access re-check (`access_recheck_s`).

Session notices go between gateways on `runlog.notice.<session_id>`, core
NATS, to the gateways that have clients watching that session (they are
not part of the log): `Presence` (who watches a session through one
gateway, refreshed every `presence_refresh_s` and forgotten after `ttl_s`)
and `RunQueued` (a run that waits for earlier runs of its session; the run
row in PostgreSQL is the fact, so a lost notice only delays the news until
the run starts).
"""

from __future__ import annotations

import msgspec

from .events import Decision as DecisionValue


class RunJob(msgspec.Struct, kw_only=True):
    """Ask a worker to execute a run that is `queued` in PostgreSQL."""

    run_id: str
    session_id: str
    requested_at: int  # ms since the epoch
    # A parked run to wake (its approval was decided, or a stop requested):
    # not `queued`, but `parked_on` (Store.claim_parked).
    wake: bool = False


class Interrupt(msgspec.Struct, kw_only=True, tag="interrupt", tag_field="kind"):
    run_id: str
    requested_by: str
    reason: str = ""
    requested_at: int = 0  # ms since the epoch


class Decision(msgspec.Struct, kw_only=True, tag="decision", tag_field="kind"):
    run_id: str
    approval_id: str
    decision: DecisionValue
    decided_by: str
    comment: str = ""
    decided_at: int = 0  # ms since the epoch


ControlMessage = Interrupt | Decision


class MemberChanged(msgspec.Struct, kw_only=True, tag="member", tag_field="kind"):
    """A member lost access to a session: removed (`role` None) or demoted."""

    session_id: str
    user_id: str
    role: str | None  # the new role; None: removed
    previous_role: str
    origin: str = ""  # the gateway that sent it (it applied it already)


class TokensRevoked(msgspec.Struct, kw_only=True, tag="revoked", tag_field="kind"):
    """Tokens of `user_id` issued before `not_before` are revoked."""

    user_id: str
    not_before: float  # s since the epoch
    origin: str = ""


AccessChange = MemberChanged | TokensRevoked


class Presence(msgspec.Struct, kw_only=True, tag="presence", tag_field="kind"):
    """Everyone who watches `session_id` through the gateway `origin` now (the
    whole set, so a repeat or a reordering is harmless; empty: none left)."""

    session_id: str
    origin: str
    users: list[str]
    ttl_s: float  # forget this set ttl_s after it was received unless it is sent again
    hello: bool = False  # the gateway just began to follow the session: answer with yours


class RunQueued(msgspec.Struct, kw_only=True, tag="queued", tag_field="kind"):
    """A run was created behind earlier unended runs of its session."""

    session_id: str
    run_id: str
    started_by: str
    input: str = ""  # its first QUEUED_INPUT_CHARS characters
    created_at: int = 0  # ms since the epoch


SessionNotice = Presence | RunQueued
QUEUED_INPUT_CHARS = 1000

_encoder = msgspec.json.Encoder()
_job_decoder = msgspec.json.Decoder(RunJob)
_control_decoder = msgspec.json.Decoder(ControlMessage)
_access_decoder = msgspec.json.Decoder(AccessChange)
_notice_decoder = msgspec.json.Decoder(SessionNotice)


def encode(
    msg: RunJob | Interrupt | Decision | MemberChanged | TokensRevoked | Presence | RunQueued,
) -> bytes:
    return _encoder.encode(msg)


def decode_job(data: bytes) -> RunJob:
    return _job_decoder.decode(data)


def decode_control(data: bytes) -> ControlMessage:
    return _control_decoder.decode(data)


def decode_access(data: bytes) -> AccessChange:
    return _access_decoder.decode(data)


def decode_notice(data: bytes) -> SessionNotice:
    return _notice_decoder.decode(data)
