"""LangGraph Platform runs API (gateway/compat/langgraph.py): the pure
projection, frame by frame."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker import events
from gateway.compat.base import Context, Wire
from gateway.compat.langgraph import LangGraph, UnsupportedStreamMode, parse_modes

ALL = frozenset({"messages-tuple", "updates", "custom"})


def _log() -> list[events.Event]:
    """A scripted run's shape: reasoning, text, a tool call with split args,
    its result, a second turn whose call needs approval, the final answer."""
    evs: list[events.Event] = [
        events.RunStart(input="tell me about runlog"),
        events.ReasoningDelta(message_id="m1", delta="I should "),
        events.ReasoningDelta(message_id="m1", delta="look."),
        events.TextDelta(message_id="m1", delta="Let me "),
        events.TextDelta(message_id="m1", delta="look."),
        events.ToolCallStart(tool_call_id="c1", tool_name="search_docs"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"query'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='":"x"}'),
        events.ToolCallEnd(tool_call_id="c1"),
        events.Progress(label="search", done=1, total=1),
        events.ToolResult(tool_call_id="c1", status="ok", summary="3 pages"),
        events.TextDelta(message_id="m2", delta="Sending."),
        events.ToolCallStart(tool_call_id="c2", tool_name="send_message", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="c2", partial_json='{"to":"t"}'),
        events.ToolCallEnd(tool_call_id="c2"),
        events.ApprovalRequired(approval_id="ap1", tool_call_id="c2", summary="send it"),
        events.ApprovalDecided(approval_id="ap1", decision="approve", decided_by="bob"),
        events.ToolResult(tool_call_id="c2", status="ok", summary="sent"),
        events.TextDelta(message_id="m3", delta="Done."),
        events.RunEnd(status="completed"),
    ]
    for i, e in enumerate(evs, 1):
        e.run_id, e.session_id, e.seq = "r1", "s1", i
    return evs


def _proj(modes: frozenset[str] = ALL, decided: set[str] | None = None) -> LangGraph:
    return LangGraph(Context("r1", "s1", decided=set(decided or ())), modes)


def _answer(log: list[events.Event], cursor: int, modes: frozenset[str] = ALL,
            decided: set[str] | None = None) -> list[Wire]:  # fmt: skip
    p = _proj(modes, decided)
    for e in log[:cursor]:
        p.track(e)
    out = p.start()
    for e in log[cursor:]:
        if p.done:
            break
        out.extend(p.feed(e))
    return out


def _frames(wires: list[Wire]) -> list[tuple[str | None, int | None, Any]]:
    return [(w.event, w.seq, json.loads(w.data)) for w in wires]


def _meta(step: int) -> dict[str, Any]:
    return {"run_id": "r1", "thread_id": "s1", "langgraph_node": "agent",
            "langgraph_step": step, "tags": []}  # fmt: skip


def _chunk(mid: str, content: str = "", *, reasoning: str | None = None,
           tool: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "type": "AIMessageChunk", "id": mid, "content": content,
        "additional_kwargs": {} if reasoning is None else {"reasoning_content": reasoning},
        "response_metadata": {},
        "tool_call_chunks": [] if tool is None else [{**tool, "type": "tool_call_chunk"}],
    }  # fmt: skip


def test_every_frame_of_a_run_with_a_decided_approval() -> None:
    got = _frames(_answer(_log(), 0, decided={"ap1"}))
    tool1 = {"type": "tool", "id": "c1.result", "tool_call_id": "c1", "name": "search_docs",
             "content": "3 pages", "status": "success",
             "artifact": {"runlog": {"status": "ok", "summary": "3 pages"}}}  # fmt: skip
    tool2 = {**tool1, "id": "c2.result", "tool_call_id": "c2", "name": "send_message",
             "content": "sent", "artifact": {"runlog": {"status": "ok", "summary": "sent"}}}  # fmt: skip
    interrupt = {"id": "ap1", "value": {
        "type": "tool_approval", "approval_id": "ap1", "tool_call_id": "c2",
        "tool_name": "send_message", "args": '{"to":"t"}', "summary": "send it",
        "expires_at": 0, "allowed_decisions": ["approve", "reject"]}}  # fmt: skip
    assert got == [
        ("metadata", 1, {"run_id": "r1", "thread_id": "s1", "attempt": 1}),
        ("messages", 2, [_chunk("m1", reasoning="I should "), _meta(1)]),
        ("messages", 3, [_chunk("m1", reasoning="look."), _meta(1)]),
        ("messages", 4, [_chunk("m1", "Let me "), _meta(1)]),
        ("messages", 5, [_chunk("m1", "look."), _meta(1)]),
        (
            "messages",
            6,
            [
                _chunk("m1", tool={"id": "c1", "name": "search_docs", "args": "", "index": 0}),
                _meta(1),
            ],
        ),
        (
            "messages",
            7,
            [
                _chunk("m1", tool={"id": None, "name": None, "args": '{"query', "index": 0}),
                _meta(1),
            ],
        ),
        (
            "messages",
            8,
            [_chunk("m1", tool={"id": None, "name": None, "args": '":"x"}', "index": 0}), _meta(1)],
        ),
        ("custom", 9, {"type": "runlog.tool_call_end", "seq": 9, "ts": 0, "tool_call_id": "c1"}),
        (
            "custom",
            10,
            {
                "type": "runlog.progress",
                "seq": 10,
                "ts": 0,
                "label": "search",
                "done": 1,
                "total": 1,
            },
        ),
        ("updates", 11, {"tools": {"messages": [tool1]}}),
        ("messages", 12, [_chunk("m2", "Sending."), _meta(2)]),
        (
            "messages",
            13,
            [
                _chunk("m2", tool={"id": "c2", "name": "send_message", "args": "", "index": 0}),
                _meta(2),
            ],
        ),
        (
            "messages",
            14,
            [
                _chunk("m2", tool={"id": None, "name": None, "args": '{"to":"t"}', "index": 0}),
                _meta(2),
            ],
        ),
        ("custom", 15, {"type": "runlog.tool_call_end", "seq": 15, "ts": 0, "tool_call_id": "c2"}),
        ("updates", 16, {"__interrupt__": [interrupt]}),
        (
            "custom",
            17,
            {
                "type": "runlog.approval_decided",
                "seq": 17,
                "ts": 0,
                "approval_id": "ap1",
                "decision": "approve",
                "decided_by": "bob",
                "comment": "",
            },
        ),
        ("updates", 18, {"tools": {"messages": [tool2]}}),
        ("messages", 19, [_chunk("m3", "Done."), _meta(3)]),
        ("end", 20, {"run_id": "r1", "status": "success"}),
    ]


def test_an_undecided_approval_ends_the_answer_interrupted() -> None:
    p = _proj()
    log = _log()
    out: list[Wire] = p.start()
    for e in log[:16]:
        assert not p.done
        out.extend(p.feed(e))
    assert p.done
    assert [(w.event, w.seq) for w in out[-2:]] == [("updates", None), ("end", 16)]
    assert json.loads(out[-1].data) == {"run_id": "r1", "status": "interrupted"}
    assert list(json.loads(out[-2].data)) == ["__interrupt__"]


def test_joined_while_an_approval_waits_the_interrupt_again() -> None:
    log = _log()
    got = _frames(_answer(log, 16))
    assert [(e, s) for e, s, _ in got] == [("metadata", None), ("updates", None), ("end", None)]
    assert got[1][2]["__interrupt__"][0]["id"] == "ap1"
    # The answer to the approval (decided now) streams on right after it.
    assert [(e, s) for e, s, _ in _frames(_answer(log, 16, decided={"ap1"}))] == [
        ("metadata", None), ("custom", 17), ("updates", 18), ("messages", 19), ("end", 20)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("modes", "names"),
    [
        ({"messages-tuple"}, ["metadata"] + ["messages"] * 11 + ["end"]),
        ({"updates"}, ["metadata", "updates", "updates", "updates", "end"]),
        ({"custom"}, ["metadata", "custom", "custom", "custom", "custom", "end"]),
    ],
)
def test_each_mode_alone(modes: set[str], names: list[str]) -> None:
    got = _answer(_log(), 0, frozenset(modes), decided={"ap1"})
    assert [w.event for w in got] == names
    # Every frame kept completes one event, in order: no id is lost or repeated.
    seqs = [w.seq or 0 for w in got]
    assert seqs == sorted(set(seqs)) and 0 not in seqs


def test_a_filtered_frame_hands_its_id_to_the_last_frame_kept() -> None:
    log = _log()[:16]  # up to the undecided approval: [__interrupt__, end]
    got = _answer(log, 0, frozenset({"messages-tuple"}))
    assert [(w.event, w.seq) for w in got[-2:]] == [("messages", 14), ("end", 16)]


def test_values_mode_carries_the_thread_state_after_each_step() -> None:
    got = _frames(_answer(_log(), 0, frozenset({"values"}), decided={"ap1"}))
    assert [(e, s) for e, s, _ in got] == [
        ("metadata", 1), ("values", 11), ("values", 18), ("values", None), ("end", 20)
    ]  # fmt: skip
    final = got[3][2]["messages"]
    assert [(m["type"], m["id"]) for m in final] == [
        ("human", "r1.input"), ("ai", "m1"), ("tool", "c1.result"), ("ai", "m2"),
        ("tool", "c2.result"), ("ai", "m3"),
    ]  # fmt: skip
    assert final[1] == {"type": "ai", "id": "m1", "content": "Let me look.",
                        "additional_kwargs": {"reasoning_content": "I should look."},
                        "tool_calls": [{"id": "c1", "name": "search_docs", "args": {"query": "x"},
                                        "type": "tool_call"}]}  # fmt: skip
    # An undecided approval: the state with the interrupt, then the end.
    cut = _frames(_answer(_log()[:16], 0, frozenset({"values"})))
    assert [(e, s) for e, s, _ in cut] == [("metadata", 1), ("values", 11), ("values", None),
                                           ("end", 16)]  # fmt: skip
    assert cut[2][2]["__interrupt__"][0]["id"] == "ap1"


def test_stream_modes_outside_the_served_ones_are_refused() -> None:
    assert parse_modes([]) == {"values"}
    assert parse_modes(["messages-tuple", "updates"]) == {"messages-tuple", "updates"}
    for bad in ("messages", "events", "debug", "tasks", "checkpoints"):
        with pytest.raises(UnsupportedStreamMode) as e:
            parse_modes(["updates", bad])
        assert (e.value.code, e.value.http_status) == ("invalid_request", 400)


def _assemble(wires: list[Wire]) -> dict[str, Any]:
    """What a client builds from the frames, merging as @langchain/core's
    AIMessageChunk.concat does (strings joined; tool-call chunks by index,
    id and name kept from the chunk that has them)."""
    msgs: dict[str, dict[str, Any]] = {}
    other: list[tuple[str | None, Any]] = []
    for w in wires:
        if w.event != "messages":
            if w.event != "metadata":
                other.append((w.event, json.loads(w.data)))
            continue
        chunk, _ = json.loads(w.data)
        m = msgs.setdefault(chunk["id"], {"content": "", "reasoning": "", "calls": {}})
        m["content"] += chunk["content"]
        m["reasoning"] += chunk["additional_kwargs"].get("reasoning_content", "")
        for tc in chunk["tool_call_chunks"]:
            call = m["calls"].setdefault(tc["index"], {"id": None, "name": None, "args": ""})
            call["args"] += tc["args"]
            for k in ("id", "name"):
                call[k] = tc[k] or call[k]
    return {"messages": msgs, "other": other}


@pytest.mark.parametrize("modes", [ALL, frozenset({"messages-tuple"}), frozenset({"values"})])
def test_resumed_from_every_cursor_nothing_lost_or_doubled(modes: frozenset[str]) -> None:
    log = _log()
    full = _answer(log, 0, modes, decided={"ap1"})
    for cursor in range(len(log) + 1):
        # What a client got up to the cursor (the frames of events 1..cursor) ...
        seen = [w for w in full if w.seq is not None and w.seq <= cursor]
        prefix = full[: full.index(seen[-1]) + 1] if seen else []
        if cursor == len(log):
            assert prefix == full
            continue
        resumed = _answer(log, cursor, modes, decided={"ap1"})
        start = _proj(modes, {"ap1"})
        for e in log[:cursor]:
            start.track(e)
        opened = start.start()
        # ... then the resumed answer: its own start, then exactly the rest.
        assert resumed == opened + full[len(prefix) :], cursor
        assert [w.event for w in opened[:1]] == ["metadata"] or cursor == 0
        assert _assemble(prefix + resumed) == _assemble(full), cursor
