"""The agent's state, as checkpointed in PostgreSQL while a run waits.

Stored in `runs.checkpoint` (msgspec JSON) under the owner's epoch. Evolution
rules as for events: new fields get defaults, types never change, so a
checkpoint written by an older worker resumes on a newer one.
"""

from __future__ import annotations

from typing import NamedTuple

import msgspec

from .model import Message, ToolCall, Usage
from .signals import DecisionInfo

CHECKPOINT_VERSION = 1


class AgentState(msgspec.Struct, kw_only=True):
    version: int = CHECKPOINT_VERSION
    messages: list[Message] = []
    step: int = 0  # model turns taken
    usage: Usage = msgspec.field(default_factory=Usage)
    # Tool calls of the current turn still to run; while waiting for an
    # approval, the first one is the call waiting.
    pending: list[ToolCall] = []
    approval_id: str = ""
    approval_expires_at: int = 0  # ms since the epoch
    approval_summary: str = ""
    # Last seq of the run's log when the checkpoint was written (just before
    # approval_required): a takeover resumes only if what follows it is the
    # approval's own events.
    at_seq: int = 0
    side_effects: list[str] = []  # tool calls with side effects that started
    active_s: float = 0.0  # run time used so far (the run timeout's budget)
    trace_id: str = ""


class ResumePoint(NamedTuple):
    """For a takeover: what of the awaited approval is already in the log."""

    requested: bool  # approval_required
    decided: DecisionInfo | None  # approval_decided


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
