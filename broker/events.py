"""The event contract: every event a run's log can hold.

Each event carries `run_id`, `session_id`, `seq` (1, 2, 3, ... per run, no
hole), `ts` (ms since the epoch, set when the event is appended) and `type`
(the tag of the union below), plus the fields of its type.

Evolution rules (stored events are read back for as long as a run is kept):

1. A new field always has a default, so events stored before it decode.
2. A field's type never changes; a field is never renamed or given a new
   meaning. Retire a field by ignoring it, add a new one beside it; retire a
   value by refusing it in `validate` (appends) while stored ones still decode.
3. A new event type is a new tag; old readers skip tags they do not know
   (`decode_stored` reports them, the gateway passes them through as bytes).
4. Stored events are decoded leniently (unknown fields are ignored); only
   input from clients is decoded with `forbid_unknown_fields`.

The JSON form of an event is produced once, when it is appended, and stored
verbatim: replay and live fan-out send those bytes as they are.
"""

from __future__ import annotations

from typing import Literal, get_args

import msgspec

from . import errors

RiskLevel = Literal["low", "medium", "high"]
ToolStatus = Literal["ok", "error", "denied", "skipped"]
Decision = Literal["approve", "reject"]
RunStatus = Literal["completed", "aborted", "failed"]  # how a run ends: all a run_end may say
# Admitted by run_end.status once, though it is no end, and never written by
# runlog: stored events keep decoding (a field's type never changes), but
# `validate`, which every append goes through, refuses it.
_RetiredRunStatus = Literal["waiting_approval"]
RUN_END_STATUSES: frozenset[str] = frozenset(get_args(RunStatus))


class Event(msgspec.Struct, kw_only=True, tag_field="type", omit_defaults=False):
    run_id: str = ""
    session_id: str = ""
    seq: int = 0
    ts: int = 0


class RunStart(Event, tag="run_start"):
    trace_id: str = ""
    model: str = ""
    started_by: str = ""
    input: str = ""


class TextDelta(Event, tag="text_delta"):
    message_id: str
    delta: str


class ReasoningDelta(Event, tag="reasoning_delta"):
    """Only real model thinking; phase/status text goes in `Status`."""

    message_id: str
    delta: str


class MessageReset(Event, tag="message_reset"):
    """Discard the live text of a turn that turned into tool calls."""

    message_id: str


class Status(Event, tag="status"):
    code: str
    summary: str = ""


class Progress(Event, tag="progress"):
    """In-tool progress; may be dropped for a slow client."""

    label: str = ""
    done: int = 0
    total: int = 0


class ToolCallStart(Event, tag="tool_call_start"):
    tool_call_id: str
    tool_name: str
    risk_level: RiskLevel = "low"


class ToolArgsDelta(Event, tag="tool_args_delta"):
    """`partial_json` is appended to the call's argument text, not a new card."""

    tool_call_id: str
    partial_json: str


class ToolCallEnd(Event, tag="tool_call_end"):
    tool_call_id: str


class ToolResult(Event, tag="tool_result"):
    tool_call_id: str
    status: ToolStatus
    summary: str = ""
    output: str | None = None  # raw output, only when policy allows


class ApprovalRequired(Event, tag="approval_required"):
    approval_id: str
    tool_call_id: str
    summary: str = ""
    expires_at: int = 0  # ms since the epoch
    # SHA-256 (hex) of the tool call shown (workers/binding.py): a decision
    # may carry it back, and is refused (approval_stale) if it changed.
    call_digest: str = ""


class ApprovalDecided(Event, tag="approval_decided"):
    approval_id: str
    decision: Decision | Literal["expired"]
    decided_by: str = ""
    comment: str = ""


class InterruptRequested(Event, tag="interrupt_requested"):
    requested_by: str = ""
    reason: str = ""


class RunError(Event, tag="run_error"):
    code: str
    retryable: bool = False
    message: str = ""


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


class StopAudit(msgspec.Struct, kw_only=True):
    requested_by: str = ""
    requested_at: int = 0  # ms since the epoch
    reason: str = ""
    at_seq: int = 0
    step: int = 0
    side_effects: list[str] = []


class RunEnd(Event, tag="run_end"):
    status: RunStatus | _RetiredRunStatus  # appends: RunStatus only
    usage: Usage | None = None
    stop: StopAudit | None = None


AnyEvent = (
    RunStart
    | TextDelta
    | ReasoningDelta
    | MessageReset
    | Status
    | Progress
    | ToolCallStart
    | ToolArgsDelta
    | ToolCallEnd
    | ToolResult
    | ApprovalRequired
    | ApprovalDecided
    | InterruptRequested
    | RunError
    | RunEnd
)

EVENT_TYPES: frozenset[str] = frozenset(cls.__struct_config__.tag for cls in AnyEvent.__args__)
TERMINAL_TYPES = frozenset({"run_end"})

# Built once: encoders and decoders are reusable and thread-safe.
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode_stored(data: bytes) -> AnyEvent:
    """Decode an event from the log (lenient about unknown fields)."""
    return _decoder.decode(data)


def validate(data: bytes, *, max_bytes: int) -> AnyEvent:
    """Decode untrusted event bytes strictly, mapping every failure to a coded error."""
    if len(data) > max_bytes:
        raise errors.PayloadTooLarge(f"event is {len(data)} bytes; the limit is {max_bytes}")
    try:
        event = _decoder.decode(data)
    except msgspec.ValidationError as e:
        tag = _tag_of(data)
        if tag not in EVENT_TYPES:
            raise errors.UnknownEventType(f"unknown event type {tag!r}") from e
        raise errors.InvalidEvent(str(e)) from e
    except msgspec.DecodeError as e:
        raise errors.InvalidEvent(f"malformed JSON: {e}") from e
    if isinstance(event, RunEnd) and event.status not in RUN_END_STATUSES:
        raise errors.InvalidEvent(
            f"run_end.status {event.status!r} does not end a run; use one of"
            f" {', '.join(sorted(RUN_END_STATUSES))}"
        )
    return event


class _Tagged(msgspec.Struct):
    type: str | None = None


_tag_decoder = msgspec.json.Decoder(_Tagged)


def _tag_of(data: bytes) -> str | None:
    try:
        return _tag_decoder.decode(data).type
    except msgspec.DecodeError:
        return None
