"""The agent's state, checkpointed in PostgreSQL at every durable point.

Stored in `runs.checkpoint` (msgspec JSON) under the owner's epoch (a run's
`run_end` commit clears it). Evolution rules as for events: new fields get
defaults, types never change, so a checkpoint written by an older worker
resumes on a newer one.

Durable points (each records `at_seq`, the seq the log was flushed to; a
takeover retracts what follows it and goes on from there, `takeover.py`):
- a model turn that called tools completed (`pending` = its calls);
- a tool call's result was logged (`pending` popped);
- an approval is about to be asked for (status `waiting_approval`), and was
  decided (`decided`: a resumed run does not ask again);
- a tool that is not retryable is about to start (`started`).
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from broker import events

from .model import Message, ToolCall, Usage
from .signals import DecisionInfo

CHECKPOINT_VERSION = 1


class DecidedCall(msgspec.Struct, kw_only=True):
    """The decision an approval took for the call `call_id` (pending[0])."""

    call_id: str
    decision: str  # approve | reject | expired
    decided_by: str = ""
    comment: str = ""

    def info(self) -> DecisionInfo:
        return DecisionInfo(self.decision, self.decided_by, self.comment)


class AgentState(msgspec.Struct, kw_only=True):
    version: int = CHECKPOINT_VERSION
    # Empty: checkpointed by a takeover before the first durable point (the
    # first model turn was in flight); the run's input makes them anew.
    messages: list[Message] = []
    step: int = 0  # model turns taken
    usage: Usage = msgspec.field(default_factory=Usage)
    # Tool calls of the current turn still to run; while waiting for an
    # approval, the first one is the call waiting.
    pending: list[ToolCall] = []
    approval_id: str = ""
    approval_expires_at: int = 0  # ms since the epoch
    approval_summary: str = ""
    # Last seq of the run's log when the checkpoint was written (for an
    # approval: just before approval_required): what follows is the tail a
    # takeover retracts (or cannot, and fails the run).
    at_seq: int = 0
    side_effects: list[str] = []  # tool calls with side effects that started
    active_s: float = 0.0  # run time used so far (the run timeout's budget)
    trace_id: str = ""
    decided: DecidedCall | None = None  # the approval decision for pending[0]
    started: str = ""  # a not-retryable call that started: never run again
    resumes: int = 0  # takeovers since the last durable point (agent_max_resumes)


class ResumePoint(NamedTuple):
    """For a takeover: what of the awaited approval is already in the log,
    and the dead owner's events after the checkpoint, to retract."""

    requested: bool  # approval_required
    decided: DecisionInfo | None  # approval_decided
    tail: tuple[events.AnyEvent, ...] = ()


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AgentState)


def encode_state(state: AgentState) -> bytes:
    return _encoder.encode(state)


def decode_state(data: bytes) -> AgentState | None:
    """None if the checkpoint cannot be read (the run is then ended, not resumed)."""
    try:
        return _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
