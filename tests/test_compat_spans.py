"""The span bookkeeping every projection shares (gateway/compat/spans.py): pure."""

from __future__ import annotations

from broker import events
from gateway.compat.spans import Close, Open, Spans


def _run() -> list[events.Event]:
    evs: list[events.Event] = [
        events.RunStart(input="hi"),
        events.ReasoningDelta(message_id="m1", delta="think"),
        events.TextDelta(message_id="m1", delta="Hel"),
        events.TextDelta(message_id="m1", delta="lo"),
        events.ToolCallStart(tool_call_id="c1", tool_name="search"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"q":'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='"x"}'),
        events.ToolCallEnd(tool_call_id="c1"),
        events.ApprovalRequired(approval_id="ap1", tool_call_id="c1"),
        events.ApprovalDecided(approval_id="ap1", decision="approve"),
        events.ToolResult(tool_call_id="c1", status="ok"),
        events.TextDelta(message_id="m2", delta="done"),
        events.RunEnd(status="completed"),
    ]
    for i, e in enumerate(evs, 1):
        e.seq = i
    return evs


def _render(t: Open | Close) -> str:
    return f"{type(t).__name__.lower()} {t.span.kind} {t.span.id}"


def test_transitions_of_a_run_in_wire_order() -> None:
    s = Spans()
    got = [[_render(t) for t in s.advance(e)] for e in _run()]
    assert got == [
        [],
        ["open reasoning m1"],
        ["close reasoning m1", "open text m1"],
        [],
        ["close text m1", "open tool c1"],
        [],
        [],
        ["close tool c1"],
        [],
        [],
        [],
        ["open text m2"],
        ["close text m2"],
    ]
    assert (s.ended, s.step, s.last_text_id, s.tool_args) == (True, 2, "m2", {"c1": '{"q":"x"}'})


def test_what_is_open_at_each_cursor() -> None:
    evs = _run()
    opened = []
    for cursor in range(len(evs) + 1):
        s = Spans()
        for e in evs[:cursor]:
            s.advance(e)
        opened.append([(sp.kind, sp.id, sp.args) for sp in s.open_now()])
    assert opened == [
        [], [], [("reasoning", "m1", "")], [("text", "m1", "")], [("text", "m1", "")],
        [("tool", "c1", "")], [("tool", "c1", '{"q":')], [("tool", "c1", '{"q":"x"}')],
        [], [], [], [], [("text", "m2", "")], [],
    ]  # fmt: skip


def test_pending_approvals_and_a_reset_message() -> None:
    s = Spans()
    s.advance(events.TextDelta(message_id="m", delta="a", seq=1))
    assert [_render(t) for t in s.advance(events.MessageReset(message_id="m", seq=2))] == [
        "close text m"
    ]
    s.advance(events.ApprovalRequired(approval_id="ap", tool_call_id="c", seq=3))
    assert list(s.pending_approvals) == ["ap"]
    s.advance(events.ApprovalDecided(approval_id="ap", decision="reject", seq=4))
    assert (s.pending_approvals, s.last_seq) == ({}, 4)


def test_an_error_closes_every_open_span() -> None:
    s = Spans()
    s.advance(events.ToolCallStart(tool_call_id="a", tool_name="x", seq=1))
    s.advance(events.ToolCallStart(tool_call_id="b", tool_name="y", seq=2))
    got = [_render(t) for t in s.advance(events.RunError(code="boom", seq=3))]
    assert (got, s.open_now(), s.ended) == (["close tool a", "close tool b"], [], True)
