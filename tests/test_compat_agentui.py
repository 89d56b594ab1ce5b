"""AgentUiEvent (seed S0), the pure projection (gateway/compat/agentui.py): no servers."""

from __future__ import annotations

from broker import events
from gateway.compat.agentui import AgentUiProjection
from gateway.compat.base import Context

from .compat_logs import RUN, SESSION, answer, frames, numbered, resume_cases, scripted_log


def _proj() -> AgentUiProjection:
    return AgentUiProjection(Context(RUN, SESSION))


def test_exact_frames_of_a_run() -> None:
    r = RUN
    expected: list[dict[str, object]] = [
        {"type": "run_start", "runId": r, "traceId": "t1", "sessionId": SESSION},
        {"type": "reasoning_delta", "runId": r, "messageId": "m1", "delta": "Check "},
        {"type": "reasoning_delta", "runId": r, "messageId": "m1", "delta": "docs."},
        {"type": "text_delta", "runId": r, "messageId": "m1", "delta": "Let me "},
        {"type": "text_delta", "runId": r, "messageId": "m1", "delta": "look."},
        {"type": "text_reset", "runId": r, "messageId": "m1"},
        {"type": "tool_call_start", "runId": r, "toolCallId": "c1", "toolName": "search_docs",
         "riskLevel": "low"},
        {"type": "tool_args_delta", "runId": r, "toolCallId": "c1", "partialJson": '{"query"'},
        {"type": "tool_args_delta", "runId": r, "toolCallId": "c1", "partialJson": ':"x"}'},
        {"type": "tool_call_end", "runId": r, "toolCallId": "c1"},
        {"type": "progress", "runId": r, "label": "search", "done": 1, "total": 3},
        {"type": "tool_result", "runId": r, "toolCallId": "c1", "status": "ok",
         "summary": "3 pages", "output": "raw"},
        {"type": "status", "runId": r, "code": "thinking", "summary": "turn 2"},
        {"type": "text_delta", "runId": r, "messageId": "m2", "delta": "I found "},
        {"type": "text_delta", "runId": r, "messageId": "m2", "delta": "three."},
        {"type": "tool_call_start", "runId": r, "toolCallId": "c2", "toolName": "send_message",
         "riskLevel": "high"},
        {"type": "tool_args_delta", "runId": r, "toolCallId": "c2", "partialJson": "{}"},
        {"type": "tool_call_end", "runId": r, "toolCallId": "c2"},
        {"type": "approval_required", "runId": r, "approvalId": "ap1", "toolCallId": "c2",
         "summary": "send?", "expiresAt": 123},
        {"type": "approval_decided", "runId": r, "approvalId": "ap1", "decision": "approve",
         "decidedBy": "bob", "comment": ""},
        {"type": "tool_result", "runId": r, "toolCallId": "c2", "status": "denied",
         "summary": "no"},
        {"type": "text_delta", "runId": r, "messageId": "m3", "delta": "Done: "},
        {"type": "text_delta", "runId": r, "messageId": "m3", "delta": "sent."},
        {"type": "run_end", "runId": r, "status": "completed"},
    ]  # fmt: skip
    p = _proj()
    got = frames(answer(p, scripted_log()))
    # One frame per event, each carrying its seq (in `id:` and in the JSON).
    assert got == [({**f, "seq": i}, i) for i, f in enumerate(expected, 1)]
    assert p.done


def test_an_error_is_followed_by_the_end_and_an_interrupt_is_an_extension() -> None:
    evs = numbered([
        events.RunStart(trace_id="t"),
        events.InterruptRequested(requested_by="bob", reason="enough"),
        events.RunError(code="model_timeout", retryable=True, message="no tokens"),
        events.RunEnd(status="failed"),
    ])  # fmt: skip
    p = _proj()
    got = [f for f, _ in frames(answer(p, evs))]
    assert got[1:] == [
        {"type": "interrupt_requested", "runId": RUN, "requestedBy": "bob", "reason": "enough",
         "seq": 2},
        {"type": "run_error", "runId": RUN, "code": "model_timeout", "retryable": True,
         "message": "no tokens", "seq": 3},
        {"type": "run_end", "runId": RUN, "status": "failed", "seq": 4},
    ]  # fmt: skip
    assert p.done


def test_an_approval_does_not_end_the_answer() -> None:
    evs = scripted_log()[:19]  # up to approval_required, undecided
    p = _proj()
    got = answer(p, evs)
    assert (got[-1].seq, p.done) == (19, False)


def test_resume_from_every_cursor() -> None:
    """Only the missing events: an answer from cursor c is exactly what the
    full answer sent after seq c."""
    cases = resume_cases(_proj, scripted_log())
    for c, expected, resumed in cases:
        assert resumed == expected, f"cursor {c}"
        assert [w.seq for w in resumed] == list(range(c + 1, len(scripted_log()) + 1))
