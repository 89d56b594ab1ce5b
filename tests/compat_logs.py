"""Stored logs for the pure projection tests of the seed formats (no tests here)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from broker import events
from gateway.compat.base import Projection, Wire

RUN, SESSION = "r_" + "R" * 22, "s_" + "S" * 22


def numbered(evs: list[events.Event]) -> list[events.Event]:
    for i, e in enumerate(evs, 1):
        e.seq, e.run_id, e.session_id = i, RUN, SESSION
    return evs


def scripted_log() -> list[events.Event]:
    """What the scripted agent writes for the default input (with
    discard_text_before_tools): reasoning, text retracted before a tool, a
    tool with streamed args, progress and status, a second turn whose tool
    needs an approval, and the final answer."""
    return numbered([
        events.RunStart(trace_id="t1", model="scripted", started_by="alice", input="hi"),
        events.ReasoningDelta(message_id="m1", delta="Check "),
        events.ReasoningDelta(message_id="m1", delta="docs."),
        events.TextDelta(message_id="m1", delta="Let me "),
        events.TextDelta(message_id="m1", delta="look."),
        events.MessageReset(message_id="m1"),
        events.ToolCallStart(tool_call_id="c1", tool_name="search_docs", risk_level="low"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"query"'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json=':"x"}'),
        events.ToolCallEnd(tool_call_id="c1"),
        events.Progress(label="search", done=1, total=3),
        events.ToolResult(tool_call_id="c1", status="ok", summary="3 pages", output="raw"),
        events.Status(code="thinking", summary="turn 2"),
        events.TextDelta(message_id="m2", delta="I found "),
        events.TextDelta(message_id="m2", delta="three."),
        events.ToolCallStart(tool_call_id="c2", tool_name="send_message", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="c2", partial_json="{}"),
        events.ToolCallEnd(tool_call_id="c2"),
        events.ApprovalRequired(approval_id="ap1", tool_call_id="c2", summary="send?",
                                expires_at=123),
        events.ApprovalDecided(approval_id="ap1", decision="approve", decided_by="bob"),
        events.ToolResult(tool_call_id="c2", status="denied", summary="no"),
        events.TextDelta(message_id="m3", delta="Done: "),
        events.TextDelta(message_id="m3", delta="sent."),
        events.RunEnd(status="completed", usage=events.Usage(input_tokens=5, output_tokens=9)),
    ])  # fmt: skip


def answer(proj: Projection, evs: Sequence[events.Event], after: int = 0) -> list[Wire]:
    """What an answer from cursor `after` sends (as the serving layer drives it)."""
    for e in evs[:after]:
        proj.track(e)
    out = proj.start()
    for e in evs[after:]:
        if proj.done:
            break
        out += proj.feed(e)
    return out


def frames(wires: list[Wire]) -> list[tuple[dict[str, Any], int | None]]:
    return [(json.loads(w.data), w.seq) for w in wires]


def resume_cases(
    make: Callable[[], Projection], evs: list[events.Event]
) -> list[tuple[int, list[Wire], list[Wire]]]:
    """For every cursor c: (c, what the full answer sends after the last item
    whose seq is at most c, what an answer resumed from c sends)."""
    full = answer(make(), evs)
    out = []
    for c in range(len(evs) + 1):
        cut = 0
        for i, w in enumerate(full):
            if w.seq is not None and w.seq <= c:
                cut = i + 1
        out.append((c, full[cut:], answer(make(), evs, c)))
    return out
