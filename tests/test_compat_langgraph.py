"""LangGraph Platform runs API (gateway/compat/langgraph.py): the pure
projection, frame by frame."""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest
from langgraph_sdk import get_client

from broker import errors, events
from broker.runtime import Broker
from broker.settings import Settings
from gateway.compat import langgraph_http
from gateway.compat.base import Context, Wire
from gateway.compat.langgraph import LangGraph, UnsupportedStreamMode, parse_modes
from gateway.rest import InvalidRequest

from .gw import RunningGateway, running_gateway, session_with, write_run
from .proxy import CuttingProxy
from .workerkit import of, running_worker, stored, wait_event

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


def test_a_text_delta_frame_is_the_general_message_chunk_byte_for_byte() -> None:
    """A text delta's frame is built around its content once per message and
    step (the replay's hot path): it must be what `_chunk` encodes, also for
    a message id JSON escapes (one that spells the `"content":""` it looks
    for) and for a message that goes on in a later step."""
    tricky = 'm"content":""\\'
    log = _log()[:-1] + [
        events.ToolCallStart(tool_call_id="c3", tool_name="t"),
        events.ToolCallEnd(tool_call_id="c3"),
        events.ToolResult(tool_call_id="c3", status="ok"),
    ] + [events.TextDelta(message_id=m, delta=d) for m, d in (
        ("m3", "m3 again, a step later"), (tricky, 'say "hi"'), (tricky, "\n"), (tricky, ""),
    )] + [_log()[-1]]  # fmt: skip
    for i, e in enumerate(log, 1):
        e.seq = i
    p = _proj(frozenset({"messages-tuple"}))
    checked = 0
    for e in log:
        wires = p.feed(e)
        if isinstance(e, events.TextDelta):
            assert [w.data for w in wires] == [p._chunk(e.message_id, content=e.delta).data]
            checked += 1
    assert checked == 8


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
    assert parse_modes([], ["updates"]) == {"updates"}
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
            assert prefix == full  # (serve_run answers this cursor as the one before)
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


AP1, AP2, AP3 = (f"ap_{c * 22}" for c in "123")


def test_a_runs_input_is_the_last_human_message() -> None:
    inp = msgspec.json.decode(
        b'{"messages": [{"role": "user", "content": "first"}, {"type": "ai", "content": "x"},'
        b' {"type": "human", "content": [{"type": "text", "text": "sec"}, {"type": "image_url"},'
        b' "ond"]}, {"role": "assistant", "content": "y"}]}',
        type=langgraph_http._Input,
    )
    assert langgraph_http.human_text(inp) == "second"
    with pytest.raises(InvalidRequest):
        langgraph_http.human_text(langgraph_http._Input(messages=[]))


@pytest.mark.parametrize(
    ("resume", "decided"),
    [
        (b'"approve"', {AP1: ("approve", "")}),
        (b'{"decision": "reject", "comment": "no"}', {AP1: ("reject", "no")}),
        (b'{"decisions": [{"type": "reject", "message": "no"}]}', {AP1: ("reject", "no")}),
        (b'{"%s": {"decision": "approve"}, "%s": "reject"}' % (AP2.encode(), AP3.encode()),
         {AP2: ("approve", ""), AP3: ("reject", "")}),
    ],
)  # fmt: skip
def test_command_resume_forms(resume: bytes, decided: dict[str, tuple[str, str]]) -> None:
    assert langgraph_http.decisions(msgspec.Raw(resume), [AP1]) == decided


@pytest.mark.parametrize(
    ("resume", "pending", "error"),
    [
        (b'"approve"', [], errors.ApprovalNotFound),  # nothing waits
        (b'"approve"', [AP1, AP2], errors.ApprovalNotFound),  # which one?
        (b'"maybe"', [AP1], InvalidRequest),
        (b'{"decisions": []}', [AP1], InvalidRequest),
        (b'{"decision": "approve", "extra": 1}', [AP1], InvalidRequest),
        (b"[1]", [AP1], InvalidRequest),
    ],
)
def test_command_resume_refused(resume: bytes, pending: list[str], error: type[Exception]) -> None:
    with pytest.raises(error):
        langgraph_http.decisions(msgspec.Raw(resume), pending)


# -- the real clients against real gateways and a real worker

CLIENTS = Path(__file__).resolve().parent / "clients"
PREFIX = "/v1/compat/langgraph"
MODES = ["messages-tuple", "updates", "custom"]

Part = dict[str, Any]


async def _js(gw: RunningGateway, user: str, steps: list[dict[str, Any]], *,
              url: str | None = None, on_part: Callable[[Part], Awaitable[None]] | None = None,
              modes: list[str] | None = MODES, timeout_s: float = 90) -> dict[str, Any]:  # fmt: skip
    """Run tests/clients/langgraph.mjs (the real @langchain/langgraph-sdk);
    `modes` None sends no stream_mode."""
    cfg = {"url": (url or gw.url) + PREFIX, "token": gw.token(user), "modes": modes,
           "steps": steps}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        "node", str(CLIENTS / "langgraph.mjs"), json.dumps(cfg), cwd=CLIENTS,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    result: dict[str, Any] | None = None
    try:
        async with asyncio.timeout(timeout_s):
            async for line in proc.stdout:
                msg = json.loads(line)
                if "part" in msg and on_part is not None:
                    await on_part(msg["part"])
                elif "result" in msg:
                    result = msg["result"]
            err = await proc.stderr.read()
            assert await proc.wait() == 0, err.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert result is not None
    assert result["warnings"] == [] and result["errors"] == [], result
    return result


def _from_log(evs: list[events.AnyEvent]) -> dict[str, dict[str, Any]]:
    """Per message id, what the log says a client must assemble: text,
    reasoning, and the tool calls started in that message's turn."""
    out: dict[str, dict[str, Any]] = {}
    turn: str | None = None
    calls: dict[str, dict[str, Any]] = {}
    for e in evs:
        if isinstance(e, events.TextDelta | events.ReasoningDelta):
            m = out.setdefault(e.message_id, {"content": "", "reasoning": "", "calls": []})
            m["content" if isinstance(e, events.TextDelta) else "reasoning"] += e.delta
            turn = e.message_id
        elif isinstance(e, events.ToolCallStart):
            assert turn is not None
            calls[e.tool_call_id] = {"id": e.tool_call_id, "name": e.tool_name, "args": ""}
            out[turn]["calls"].append(calls[e.tool_call_id])
        elif isinstance(e, events.ToolArgsDelta):
            calls[e.tool_call_id]["args"] += e.partial_json
        elif isinstance(e, events.ToolResult):
            turn = None
    return out


def _assembled(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What MessageTupleManager assembled, in the same shape (raw argument
    text from the merged tool-call chunks; the parsed args checked equal)."""
    out: dict[str, dict[str, Any]] = {}
    for m in result["messages"]:
        calls = [{"id": c["id"], "name": c["name"], "args": raw["args"]}
                 for c, raw in zip(m["tool_calls"], m["tool_args"], strict=True)]  # fmt: skip
        for c, parsed in zip(calls, m["tool_calls"], strict=True):
            assert json.loads(c["args"]) == parsed["args"]
        out[m["id"]] = {"content": m["content"], "reasoning": m["reasoning"], "calls": calls}
    return out


def _ids(result: dict[str, Any]) -> list[int]:
    """The ids the SDK saw, in order, each once where it first appeared (a
    part without an `id:` line inherits the last one)."""
    out: list[int] = []
    for p in result["parts"]:
        if p["id"] is not None and (not out or int(p["id"]) != out[-1]):
            out.append(int(p["id"]))
    return out


async def test_sdk_full_run_and_approval_through_command_resume(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice")
        got = await _js(gw, "alice", [
            {"op": "run", "thread_id": sid, "input": "tell me about runlog"},
            {"op": "resume", "thread_id": sid},
        ])  # fmt: skip
        (run,) = (await b.store.session_info(sid)).runs
        log = await stored(b, run.run_id)
    (asked,) = of(log, events.ApprovalRequired)
    (decided,) = of(log, events.ApprovalDecided)
    # The first answer ends at the approval, natively; the answer to it ends the run.
    assert [i["id"] for i in got["interrupts"]] == [asked.approval_id]
    assert got["interrupts"][0]["value"]["tool_name"] == "send_message"
    assert got["ends"] == [{"run_id": run.run_id, "status": "interrupted"},
                           {"run_id": run.run_id, "status": "success"}]  # fmt: skip
    assert (decided.decision, decided.decided_by) == ("approve", "alice")
    # Both answers tell the SDK their run (Content-Location → onRunCreated).
    assert got["created"] == [{"run_id": run.run_id, "thread_id": sid}] * 2
    # The answer to the approval streams on right after it: no event twice, none missing.
    assert _ids(got) == list(range(1, len(log) + 1))
    assert _assembled(got) == _from_log(log)
    assert "runlog.approval_decided" in [c["type"] for c in got["custom"]]


def _cut_log() -> tuple[list[events.Event], list[events.Event]]:
    """A run written by the test, cut after the second chunk of a tool call's args."""
    before: list[events.Event] = [
        events.RunStart(input="look it up", started_by="alice"),
        *(events.ReasoningDelta(message_id="m1", delta=t) for t in ("Check ", "the ", "docs.")),
        *(events.TextDelta(message_id="m1", delta=t) for t in ("Let ", "me ", "look.")),
        events.ToolCallStart(tool_call_id="c1", tool_name="search_docs"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"que'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='ry":"r'),
    ]
    after: list[events.Event] = [
        events.ToolArgsDelta(tool_call_id="c1", partial_json='unlog"'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json="}"),
        events.ToolCallEnd(tool_call_id="c1"),
        events.ToolResult(tool_call_id="c1", status="ok", summary="3 pages"),
        *(events.TextDelta(message_id="m2", delta=t) for t in ("Found ", "it.")),
        events.RunEnd(status="completed"),
    ]
    return before, after


async def _new_run(b: Broker, sid: str) -> str:
    """The run a client's request just started in the session (waited for)."""
    async with asyncio.timeout(30):
        while not (runs := (await b.store.session_info(sid)).runs):
            await asyncio.sleep(0.05)
    return runs[0].run_id


@pytest.mark.parametrize("sdk", ["js", "python"])
async def test_a_cut_stream_is_resumed_by_the_sdk_itself(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker, sdk: str
) -> None:
    before, after = _cut_log()
    async with running_gateway(settings) as gw:
        proxy = CuttingProxy.in_front_of(gw.url)
        await proxy.start()
        sid = await session_with(http, gw, "alice")
        reached = asyncio.Event()

        async def on_part(part: Part) -> None:
            if part["id"] == str(len(before)):
                reached.set()

        async def write() -> str:
            run_id = await _new_run(broker, sid)
            w = await broker.claim(run_id, "test-writer")
            for e in before:
                await w.append(e)
            await w.flush()
            await reached.wait()  # the client has the cut's last frame: cut here
            proxy.record()
            proxy.partition()
            proxy.heal()
            for e in after:
                await w.append(e)
            await w.flush()
            return run_id

        writer = asyncio.create_task(write())
        try:
            url = f"http://127.0.0.1:{proxy.port}"
            step = {"op": "run", "thread_id": sid, "input": "look it up"}
            if sdk == "js":
                got = await _js(gw, "alice", [step], url=url, on_part=on_part)
            else:
                got = await _py(gw, "alice", [step], url=url, on_part=on_part)
            run_id = await writer
        finally:
            writer.cancel()
            await proxy.stop()
        log = await stored(broker, run_id)
    assert len(log) == len(before) + len(after)
    assert _ids(got) == list(range(1, len(log) + 1))  # nothing lost, nothing twice
    assert _assembled(got) == _from_log(log)
    assert got["ends"] == [{"run_id": run_id, "status": "success"}]
    # It reconnected by itself: a GET of the Location, from the last id it had.
    assert proxy.recorded is not None
    sent = bytes(proxy.recorded).lower()
    path = f"get {PREFIX}/threads/{sid}/runs/{run_id}/stream?".lower().encode()
    assert path in sent and b"stream_mode=messages-tuple" in sent, sent
    assert f"last-event-id: {len(before)}\r\n".encode() in sent, sent


# -- the Python SDK (langgraph_sdk.get_client), in process


async def _py(gw: RunningGateway, user: str, steps: list[dict[str, Any]], *,
              url: str | None = None, on_part: Callable[[Part], Awaitable[None]] | None = None,
              api_key: bool = True) -> dict[str, Any]:  # fmt: skip
    """The steps of tests/clients/langgraph.mjs, with PyPI `langgraph-sdk`,
    authenticated by `x-api-key` (its own header) unless `api_key` is False.
    Messages are merged as @langchain/core merges AIMessageChunks."""
    token = gw.token(user)
    headers = {} if api_key else {"Authorization": f"Bearer {token}"}
    out: dict[str, Any] = {"parts": [], "interrupts": [], "ends": [], "errors": [],
                           "custom": [], "results": [], "warnings": []}  # fmt: skip
    chunks: dict[str, dict[str, Any]] = {}

    async def consume(stream: AsyncIterator[Any]) -> None:
        async for part in stream:
            out["parts"].append({"event": part.event, "id": part.id})
            if on_part is not None:
                await on_part({"event": part.event, "id": part.id})
            if part.event == "messages":
                c, _meta = part.data
                m = chunks.setdefault(c["id"], {"content": "", "reasoning": "", "calls": {}})
                m["content"] += c["content"]
                m["reasoning"] += c["additional_kwargs"].get("reasoning_content", "")
                for tc in c["tool_call_chunks"]:
                    call = m["calls"].setdefault(
                        tc["index"], {"id": None, "name": None, "args": ""}
                    )
                    call["args"] += tc["args"]
                    call.update({k: tc[k] for k in ("id", "name") if tc[k]})
            elif part.event == "updates" and "__interrupt__" in part.data:
                out["interrupts"].extend(part.data["__interrupt__"])
            elif part.event == "custom":
                out["custom"].append(part.data)
            elif part.event == "end":
                out["ends"].append(part.data)
            elif part.event == "error":
                out["errors"].append(part.data)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with get_client(url=(url or gw.url) + PREFIX, api_key=token if api_key else None,
                              headers=headers) as client:  # fmt: skip
            runs: Any = client.runs  # its overloads want literal stream modes
            for step in steps:
                t = step.get("thread_id", "")
                if step["op"] == "run":
                    human = {"role": "user", "content": step["input"]}
                    await consume(runs.stream(t, "runlog", input={"messages": [human]},
                                              stream_mode=MODES))  # fmt: skip
                elif step["op"] == "resume":
                    resume = step.get("resume") or {
                        out["interrupts"][-1]["id"]: {"decision": "approve"}
                    }
                    await consume(runs.stream(t, "runlog", command={"resume": resume},
                                              stream_mode=MODES))  # fmt: skip
                elif step["op"] == "join":
                    await consume(runs.join_stream(t, step["run_id"], stream_mode=MODES,
                                                   last_event_id=step.get("last_event_id")))  # fmt: skip
                elif step["op"] == "get":
                    out["results"].append(await runs.get(t, step["run_id"]))
    out["warnings"] = [str(w.message) for w in caught]
    out["messages"] = [
        {"id": mid, "content": m["content"], "reasoning": m["reasoning"],
         "tool_calls": [{"id": c["id"], "name": c["name"], "args": json.loads(c["args"])}
                        for c in m["calls"].values()],
         "tool_args": [{"id": c["id"], "args": c["args"]} for c in m["calls"].values()]}
        for mid, m in chunks.items()
    ]  # fmt: skip
    assert out["warnings"] == [] and out["errors"] == [], out
    return out


async def test_python_sdk_run_approval_and_a_second_user_on_another_gateway(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with (
        running_worker(settings) as (b, _),
        running_gateway(settings) as gw,
        running_gateway(settings) as gw2,
    ):
        sid = await session_with(http, gw, "alice", bob="viewer")
        # alice: a run, with x-api-key (the Python SDK's own header) ...
        got = await _py(gw, "alice", [{"op": "run", "thread_id": sid, "input": "tell me"}])
        run_id = await _new_run(b, sid)
        # ... which bob, on the other gateway, joins while it waits for alice ...
        waiting = await _js(gw2, "bob", [{"op": "join", "thread_id": sid, "run_id": run_id}])
        # ... who answers it.
        got2 = await _py(gw, "alice", [{"op": "resume", "thread_id": sid, "resume": {
            got["interrupts"][0]["id"]: {"decision": "approve"}}}])  # fmt: skip
        for k in ("parts", "ends", "messages"):
            got[k] += got2[k]
        # bob, on the other gateway, joins the ended run from the start, twice
        # at once: through each SDK.
        steps = [{"op": "join", "thread_id": sid, "run_id": run_id}]
        js, py = await asyncio.gather(
            _js(gw2, "bob", steps), _py(gw2, "bob", [*steps, {"op": "get", "thread_id": sid,
                                                            "run_id": run_id}], api_key=False)
        )  # fmt: skip
        log = await stored(b, run_id)
    (asked,) = of(log, events.ApprovalRequired)
    (decided,) = of(log, events.ApprovalDecided)
    assert (decided.decision, decided.decided_by) == ("approve", "alice")
    assert [e["status"] for e in got["ends"]] == ["interrupted", "success"]
    assert waiting["ends"] == [{"run_id": run_id, "status": "interrupted"}]
    assert [i["id"] for i in waiting["interrupts"]] == [asked.approval_id]
    assert _ids(waiting) == list(range(1, asked.seq + 1))
    assert _ids(got) == list(range(1, len(log) + 1))
    expected = _from_log(log)
    assert _assembled(got) == expected
    # A replay streams the decided approval inline and ends once.
    for joined in (js, py):
        assert _ids(joined) == list(range(1, len(log) + 1))
        assert _assembled(joined) == expected
        assert joined["ends"] == [{"run_id": run_id, "status": "success"}]
        assert [i["id"] for i in joined["interrupts"]] == [decided.approval_id]
    assert py["results"][0]["status"] == "success"


async def test_an_ended_run_joined_from_its_end_and_stopped_runs(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with (
        running_worker(settings, scripted_tokens_per_s=20.0) as (b, _),
        running_gateway(settings) as gw,
    ):
        sid = await session_with(http, gw, "alice", bob="approver")
        # A long answer; bob cancels it from another client once text flows.
        cancelled = asyncio.Event()
        cancels: list[dict[str, Any]] = []

        async def on_part(part: Part) -> None:
            if part["event"] == "messages" and not cancelled.is_set():
                cancelled.set()
                run_id = await _new_run(b, sid)
                cancels.append(await _js(gw, "bob", [
                    {"op": "cancel", "thread_id": sid, "run_id": run_id},
                ]))  # fmt: skip

        got = await _js(gw, "alice", [{"op": "run", "thread_id": sid, "input": "a long answer"}],
                        on_part=on_part)  # fmt: skip
        run_id = await _new_run(b, sid)
        log = await stored(b, run_id)
        # Joined at its end: the end again (a body, so the SDK stops), and its status.
        at_end = await _js(gw, "alice", [
            {"op": "join", "thread_id": sid, "run_id": run_id, "last_event_id": str(len(log))},
            {"op": "get", "thread_id": sid, "run_id": run_id},
        ])  # fmt: skip
        # Joined without stream modes: all of them, `values` (the thread state) too.
        every = await _js(gw, "alice", [{"op": "join", "thread_id": sid, "run_id": run_id}],
                          modes=None)  # fmt: skip
    end = log[-1]
    assert isinstance(end, events.RunEnd) and end.status == "aborted"
    assert {p["event"] for p in every["parts"]} >= {"metadata", "messages", "custom", "values"}
    assert _assembled(every) == _from_log(log)
    state = every["values"][-1]["messages"]
    assert state[0] == {"type": "human", "id": f"{run_id}.input", "content": "a long answer"}
    assert {m["id"]: m["content"] for m in state[1:]} == {
        k: m["content"] for k, m in _from_log(log).items()
    }
    assert end.stop is not None and end.stop.requested_by == "bob"
    assert got["ends"] == [{"run_id": run_id, "status": "interrupted"}]
    assert _assembled(got) == _from_log(log)
    assert len(of(log, events.TextDelta)) < 2000  # stopped well before the end of its text
    assert [p["event"] for p in at_end["parts"]] == ["metadata", "end"]
    assert at_end["ends"] == [{"run_id": run_id, "status": "interrupted"}]
    assert at_end["results"][0]["status"] == "interrupted"


async def test_a_failed_run_is_an_error_then_its_end(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice")
        got = await _js(gw, "alice", [{"op": "run", "thread_id": sid, "input": "fail model"}])
        run_id = await _new_run(b, sid)
        log = await stored(b, run_id)
    (err,) = of(log, events.RunError)
    assert got["run_errors"] == [{"error": err.code, "message": err.message}]
    assert got["ends"] == [{"run_id": run_id, "status": "error"}]
    assert _ids(got) == list(range(1, len(log) + 1))
    assert _assembled(got) == _from_log(log)


async def _post(http: aiohttp.ClientSession, url: str, body: Any, **headers: str
                ) -> tuple[int, Any, dict[str, str]]:  # fmt: skip
    async with http.post(url, json=body, headers=headers) as r:
        ctype = r.headers.get("Content-Type", "")
        data = await r.json() if ctype.startswith("application/json") else await r.read()
        return r.status, data, dict(r.headers)


def _code(data: Any) -> str:
    return str(data["error"]["code"])


async def test_refusals_conflicts_and_the_api_key_header(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        base = gw.url + PREFIX
        alice, bob, eve = (gw.headers(u) for u in ("alice", "bob", "eve"))
        sid = await session_with(http, gw, "alice", bob="viewer")
        # x-api-key is a token here (creating a thread), and only here.
        st, thread, _ = await _post(http, base + "/threads", {}, **{"x-api-key": gw.token("eve")})
        assert (st, thread["status"]) == (200, "idle")
        async with http.get(gw.url + "/v1/sessions", headers={"x-api-key": gw.token("eve")}) as r:
            assert (r.status, _code(await r.json())) == (401, "unauthorized")
        # Stream modes outside the served ones: 400, before any run starts.
        body = {
            "input": {"messages": [{"role": "user", "content": "hi"}]},
            "stream_mode": ["events"],
        }
        st, data, _ = await _post(http, f"{base}/threads/{sid}/runs/stream", body, **alice)
        assert (st, _code(data)) == (400, "invalid_request")
        assert (await b.store.session_info(sid)).runs == []
        # Not a member: nothing to start, read or resume there.
        body["stream_mode"] = MODES
        st, data, _ = await _post(http, f"{base}/threads/{sid}/runs/stream", body, **eve)
        assert (st, _code(data)) == (403, "not_a_member")
        # A viewer follows but does not start.
        st, data, _ = await _post(http, f"{base}/threads/{sid}/runs/stream", body, **bob)
        assert (st, _code(data)) == (403, "forbidden")
        # A run that waits for an approval (started through the native API).
        async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={"input": "tell me"},
                             headers=alice) as r:  # fmt: skip
            run_id = (await r.json())["run_id"]
        asked = await wait_event(b, run_id, "approval_required")
        assert isinstance(asked, events.ApprovalRequired)
        runs = f"{base}/threads/{sid}/runs/{run_id}"
        async with http.get(runs, headers=alice) as r:
            assert (await r.json())["status"] == "running"  # still live: SDKs reconnect
        async with http.get(f"{base}/threads/{sid}", headers=alice) as r:
            assert (await r.json())["status"] == "interrupted"
        # The run is not in another thread, and the viewer cannot stop it.
        other = (await _post(http, base + "/threads", {}, **alice))[1]["thread_id"]
        async with http.get(f"{base}/threads/{other}/runs/{run_id}", headers=alice) as r:
            assert (r.status, _code(await r.json())) == (404, "run_not_found")
        st, data, _ = await _post(http, runs + "/cancel", None, **bob)
        assert (st, _code(data)) == (403, "forbidden")
        st, data, _ = await _post(http, runs + "/cancel?action=rollback", None, **alice)
        assert (st, _code(data)) == (400, "invalid_request")
        # Decided once, as the native API decides: a bare value for the one
        # waiting, a repeat is fine, another answer is 409, a viewer's is 403.
        resume = {"command": {"resume": "reject"}, "stream_mode": ["custom"]}
        st, data, _ = await _post(http, f"{base}/threads/{sid}/runs/stream", resume, **bob)
        assert (st, _code(data)) == (403, "forbidden")
        async with http.post(f"{base}/threads/{sid}/runs/stream", json=resume, headers=alice) as r:
            assert r.status == 200
            assert (
                r.headers["Location"] == f"/threads/{sid}/runs/{run_id}/stream?stream_mode=custom"
            )
            assert r.headers["Content-Location"] == f"/threads/{sid}/runs/{run_id}"
            text = (await r.read()).decode()
        assert text.startswith("event: metadata\n") and f"id: {asked.seq + 1}\n" in text
        assert text.endswith(f'id: {len(await stored(b, run_id))}\nevent: end\n'
                             f'data: {{"run_id":"{run_id}","status":"success"}}\n\n')  # fmt: skip
        again = {"command": {"resume": {asked.approval_id: {"decision": "reject"}}},
                 "stream_mode": ["custom"]}  # fmt: skip
        async with http.post(f"{base}/threads/{sid}/runs/stream", json=again, headers=alice) as r:
            assert r.status == 200
        other_answer = {"command": {"resume": {asked.approval_id: "approve"}}}
        st, data, _ = await _post(http, f"{base}/threads/{sid}/runs/stream", other_answer, **alice)
        assert (st, _code(data)) == (409, "approval_conflict")
        # Nothing waits now: a bare value has nothing to answer.
        st, data, _ = await _post(http, f"{base}/threads/{sid}/runs/stream", resume, **alice)
        assert (st, _code(data)) == (404, "approval_not_found")
        log = await stored(b, run_id)
    decided = of(log, events.ApprovalDecided)
    assert [(d.decision, d.decided_by) for d in decided] == [("reject", "alice")]


async def test_bad_requests_get_coded_errors_and_start_nothing(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice")
        run_id, _ = await write_run(broker, sid, 3)
        t = f"{gw.url}{PREFIX}/threads/{sid}"
        human = {"messages": [{"role": "user", "content": "hi"}]}
        ap = f"ap_{'x' * 22}"
        table: list[tuple[str, str, bytes | None, dict[str, str], int, str]] = [
            ("POST", f"{gw.url}{PREFIX}/threads", b"{", {}, 400, "invalid_request"),
            ("POST", f"{gw.url}{PREFIX}/threads", b'{"metadata": {"title": "a\\u0000"}}', {},
             400, "invalid_request"),
            ("POST", f"{gw.url}{PREFIX}/threads", b'{"thread_id": "mine"}', {}, 400,
             "invalid_request"),
            ("POST", f"{t}/runs/stream", b"[1]", {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", b"{}", {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", json.dumps({"input": {"messages": []}}).encode(), {},
             400, "invalid_request"),
            ("POST", f"{t}/runs/stream", json.dumps({"input": {"messages": [
                {"role": "user", "content": "a\u0000"}]}}).encode(), {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", json.dumps({"input": human, "stream_mode": 3}).encode(),
             {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", json.dumps({"input": human, "stream_mode": "debug"}
                                                    ).encode(), {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", json.dumps({"input": {"messages": [
                {"role": "user", "content": "x" * 40000}]}}).encode(), {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", b'{"command": {"goto": "agent"}}', {}, 400,
             "invalid_request"),
            ("POST", f"{t}/runs/stream", b'{"command": {}}', {}, 400, "invalid_request"),
            ("POST", f"{t}/runs/stream", b'{"command": {"resume": "approve"}}', {}, 404,
             "approval_not_found"),
            ("POST", f"{t}/runs/stream", json.dumps({"command": {"resume": {ap: "approve"}}}
                                                    ).encode(), {}, 403, "not_a_member"),
            ("POST", f"{t}/runs/stream", json.dumps({"command": {"resume": {ap: {
                "decision": "approve", "comment": "\u0000"}}}}).encode(), {}, 400,
             "invalid_request"),
            ("GET", f"{t}/runs/{run_id}/stream", None, {"Last-Event-ID": "x"}, 400,
             "invalid_cursor"),
            ("GET", f"{t}/runs/{run_id}/stream", None, {"Last-Event-ID": "99"}, 400,
             "invalid_cursor"),
            ("GET", f"{t}/runs/{run_id}/stream?stream_mode=events", None, {}, 400,
             "invalid_request"),
            ("GET", f"{t}/runs/r_nope/stream", None, {}, 403, "not_a_member"),
            ("GET", f"{gw.url}{PREFIX}/threads/s_nope", None, {}, 403, "not_a_member"),
            ("GET", f"{t}/runs/{run_id}", None, {"x-api-key": "nope", "Authorization": ""},
             401, "unauthorized"),
        ]  # fmt: skip
        got = []
        for method, url, body, headers, _, _ in table:
            async with http.request(method, url, data=body,
                                    headers={**gw.headers("alice"), **headers}) as r:  # fmt: skip
                got.append((r.status, (await r.json())["error"]["code"]))
        assert got == [(st, code) for *_, st, code in table]
        assert [r.run_id for r in (await broker.store.session_info(sid)).runs] == [run_id]
