"""The event contract: round trips, evolution, strict input (without servers,
but for one append through a real writer)."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker import errors, events
from broker.runtime import Broker

SAMPLES: list[events.Event] = [
    events.RunStart(trace_id="t", model="m", started_by="alice"),
    events.TextDelta(message_id="m1", delta="Hello"),
    events.ReasoningDelta(message_id="m1", delta="thinking"),
    events.MessageReset(message_id="m1"),
    events.Status(code="searching", summary="Searching the web"),
    events.Progress(label="download", done=1, total=3),
    events.ToolCallStart(tool_call_id="c1", tool_name="search", risk_level="high"),
    events.ToolArgsDelta(tool_call_id="c1", partial_json='{"q":'),
    events.ToolCallEnd(tool_call_id="c1"),
    events.ToolResult(tool_call_id="c1", status="ok", summary="3 results"),
    events.ApprovalRequired(approval_id="ap_1", tool_call_id="c1", summary="rm", expires_at=1),
    events.ApprovalDecided(approval_id="ap_1", decision="approve", decided_by="bob"),
    events.InterruptRequested(requested_by="alice", reason="stop"),
    events.RunError(code="model_timeout", retryable=True, message="the model timed out"),
    events.RunEnd(
        status="aborted",
        usage=events.Usage(input_tokens=3, output_tokens=5),
        stop=events.StopAudit(requested_by="alice", at_seq=7, side_effects=["c1"]),
    ),
]


def test_every_type_has_a_sample_and_round_trips() -> None:
    tags = {type(e).__struct_config__.tag for e in SAMPLES}
    assert tags == events.EVENT_TYPES
    for e in SAMPLES:
        e.run_id, e.session_id, e.seq, e.ts = "r_x", "s_x", 3, 1700000000000
        data = events.encode(e)
        assert events.validate(data, max_bytes=10_000) == e
        assert msgspec.json.decode(data)["type"] == type(e).__struct_config__.tag


def test_stored_events_decode_across_evolution() -> None:
    # An event stored by a newer version (an extra field) still decodes...
    newer = b'{"type":"text_delta","run_id":"r","session_id":"s","seq":1,"ts":2,'
    newer += b'"message_id":"m","delta":"x","added_later":{"a":1}}'
    assert events.decode_stored(newer) == events.TextDelta(
        run_id="r", session_id="s", seq=1, ts=2, message_id="m", delta="x"
    )
    # ...and one stored before a defaulted field existed gets the default.
    older = b'{"type":"tool_call_start","run_id":"r","seq":1,"tool_call_id":"c","tool_name":"t"}'
    decoded = events.decode_stored(older)
    assert isinstance(decoded, events.ToolCallStart) and decoded.risk_level == "low"
    # A value once admitted and now refused on append still decodes from the log.
    retired = b'{"type":"run_end","run_id":"r","seq":9,"status":"waiting_approval"}'
    assert events.decode_stored(retired) == events.RunEnd(
        run_id="r", seq=9, status="waiting_approval"
    )


async def test_a_run_end_that_is_not_an_end_is_refused_on_append(broker: Broker) -> None:
    session_id = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(session_id, "alice")
    w = await broker.claim(run_id, "events-test")
    await w.append(events.RunStart())
    with pytest.raises(errors.InvalidEvent) as info:
        await w.append(events.RunEnd(status="waiting_approval"))
    assert info.value.code == "invalid_event"
    with pytest.raises(errors.InvalidEvent):
        await w.append_json(b'{"type":"run_end","status":"waiting_approval"}')
    # Nothing was appended and the writer is intact: the run ends properly.
    await w.append(events.RunEnd(status="completed"))
    assert await w.flush() == 2
    assert await broker.store.run_head(run_id) == (2, True)
    assert (await broker.store.get_run(run_id)).status == "completed"


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", "invalid_event"),
        (b"[]", "unknown_event_type"),
        (b'{"type":"run_end","status":"exploded"}', "invalid_event"),
        (b'{"type":"run_end","status":"waiting_approval"}', "invalid_event"),  # not an end
        (b'{"type":"progress","done":"1"}', "invalid_event"),
        (b'{"type":42}', "unknown_event_type"),
    ],
)
def test_invalid_input_has_a_stable_code(data: bytes, code: str) -> None:
    with pytest.raises(errors.RunlogError) as info:
        events.validate(data, max_bytes=1000)
    assert info.value.code == code
    assert info.value.to_dict()["code"] == code


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)))
def test_arbitrary_bytes_never_escape_as_unexpected_errors(data: bytes) -> None:
    try:
        events.validate(data, max_bytes=150)
    except errors.ClientError as e:
        assert e.code in {"invalid_event", "unknown_event_type", "payload_too_large"}


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["type", "message_id", "delta", "seq", "status", "tool_call_id"]),
        st.one_of(st.none(), st.integers(), st.text(max_size=10), st.sampled_from(["text_delta"])),
    )
)
def test_json_objects_validate_or_fail_with_a_code(obj: dict[str, object]) -> None:
    data = msgspec.json.encode(obj)
    try:
        ev = events.validate(data, max_bytes=10_000)
    except errors.ClientError as e:
        assert e.code in {"invalid_event", "unknown_event_type"}
    else:
        assert type(ev).__struct_config__.tag == obj["type"]
