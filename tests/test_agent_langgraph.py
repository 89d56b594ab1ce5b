"""The LangGraph adapter (workers/frameworks/langgraph.py) with the real
library, offline: a graph of tests/agents/lg_agent.py (a langchain-core chat
model that streams what the run's input asks for, a ToolNode, `interrupt()`),
checkpointed in runlog's PostgreSQL, in-process and in `runlog worker`
processes killed mid-run.

The stop and tool-call tests every adapter shares are tests/test_agent_contract.py's."""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from langchain_core.messages import AIMessage, AIMessageChunk, ToolMessage
from langchain_core.messages.tool import tool_call_chunk

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from workers.frameworks._langgraph_stream import StreamMapper

from .agents import lg_agent
from .gw import running_gateway, ws_connect
from .helpers import sample
from .workerkit import (
    DOOMED,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    text_of,
    wait_event,
    wait_until,
)

AGENT = "tests.agents.lg_agent:agent"
_DOOMED = DOOMED


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def _checkpoint_pool() -> AsyncIterator[None]:
    """The in-process agent keeps a pool for the process; a test gives it back."""
    yield
    await lg_agent.agent.aclose()


def _spec(d: Path, **kw: object) -> str:
    return json.dumps({"dir": str(d), **kw})


def _deleted(d: Path) -> list[str]:
    p = d / "deleted"
    return p.read_text().split() if p.exists() else []


async def _checkpoints(b: Broker, run_id: str) -> int:
    n: int = await b.store.pool.fetchval(
        "SELECT count(*) FROM checkpoints WHERE thread_id = $1", run_id
    )
    return n


async def _tool_writes(b: Broker, run_id: str) -> bool:
    """Whether LangGraph saved a ToolMessage write of the run (a finished tools task)."""
    n: int = await b.store.pool.fetchval(
        "SELECT count(*) FROM checkpoint_writes WHERE thread_id = $1 AND channel = 'messages'"
        " AND task_path LIKE '%tools%'",
        run_id,
    )
    return n > 0


def _card(evs: list[events.AnyEvent], tool_name: str) -> list[tuple[str, Any]]:
    """The events of the run's one `tool_name` card, as (type, detail)."""
    (start_,) = [e for e in of(evs, events.ToolCallStart) if e.tool_name == tool_name]
    call = start_.tool_call_id
    out: list[tuple[str, Any]] = []
    for e in evs:
        if getattr(e, "tool_call_id", None) != call:
            continue
        if isinstance(e, events.ToolCallStart):
            out.append(("start", e.risk_level))
        elif isinstance(e, events.ToolArgsDelta):
            out.append(("args", e.partial_json))
        elif isinstance(e, events.ToolCallEnd):
            out.append(("end", None))
        elif isinstance(e, events.ToolResult):
            out.append(("result", (e.status, e.summary)))
        elif isinstance(e, events.ApprovalRequired):
            out.append(("approval", e.summary))
    return out


def _async(pred: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return pred()

    return check


def _kept_text(evs: list[events.AnyEvent]) -> str:
    """The run's text without the messages it reset."""
    reset = {e.message_id for e in of(evs, events.MessageReset)}
    return "".join(d.delta for d in of(evs, events.TextDelta) if d.message_id not in reset)


# -- streaming


async def test_tokens_reach_a_subscriber_as_the_model_produces_them(
    settings: Settings, tmp_path: Path
) -> None:
    name = "tokens-" + secrets.token_hex(4)
    hold = lg_agent.gate(name)
    async with running_worker(settings, agent=AGENT) as (b, _):
        _, run_id = await start(b, _spec(tmp_path, say="Hello brave new world", gate=name))
        first = await wait_event(b, run_id, "text_delta")
        # The model waits for `hold` after its first chunk: this delta is live.
        assert isinstance(first, events.TextDelta) and first.delta == "Hello"
        assert not hold.is_set()
        hold.set()
        evs = await read_run(b, run_id)
        left = await _checkpoints(b, run_id)
    assert text_of(evs) == "Hello brave new world"
    assert len({e.message_id for e in of(evs, events.TextDelta)}) == 1
    assert [(s.code, s.summary) for s in of(evs, events.Status)] == [("node", "llm")]
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    assert end.usage == events.Usage(input_tokens=5, output_tokens=4)
    assert left == 0  # an ended run's checkpoints are deleted


async def test_the_sessions_earlier_runs_are_the_graphs_history(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _):
        session_id, first = await start(b, _spec(tmp_path, say="One."))
        await read_run(b, first)
        second = await b.start_run(
            session_id, "alice", input=_spec(tmp_path, say="Two", count=True)
        )
        evs = await read_run(b, second)
    # The earlier run's input and answer, then this run's input.
    assert text_of(evs) == "Two [3]"
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


# -- approvals


async def test_an_approval_decided_through_rest_resumes_the_graph(
    settings: Settings, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _), running_gateway(settings) as gw:
        _, run_id = await start(b, _spec(tmp_path, say="On it.", tool="delete"))
        req = await wait_event(b, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        assert _deleted(tmp_path) == []
        async with http.post(
            f"{gw.url}/v1/runs/{run_id}/approvals/{req.approval_id}",
            json={"decision": "approve", "comment": "go ahead"},
            headers=gw.headers("bob"),
        ) as r:
            assert r.status == 201, await r.text()  # created: the first decision
        evs = await read_run(b, run_id)
    assert _deleted(tmp_path) == [run_id]
    assert _card(evs, "delete_rows") == [
        ("start", "high"),
        ("args", '{"ids": '),
        ("args", "[1, 2]}"),
        ("end", None),
        ("approval", "delete rows [1, 2]?"),
        ("result", ("ok", "deleted 2 rows")),
    ]
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by, dec.comment) == ("approve", "bob", "go ahead")
    assert text_of(evs) == "On it.Done: deleted 2 rows."
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_a_rejection_through_the_websocket_resumes_the_graph_without_the_effect(
    settings: Settings, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _), running_gateway(settings) as gw:
        _, run_id = await start(b, _spec(tmp_path, say="On it.", tool="delete"))
        req = await wait_event(b, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        async with ws_connect(http, gw, "carol") as ws:
            await ws.send(
                type="decide", ref="d1", approval_id=req.approval_id,
                decision="reject", comment="not today",
            )  # fmt: skip
            reply = await ws.next_reply()
        assert reply["type"] == "ack" and reply["result"]["created"], reply
        evs = await read_run(b, run_id)
    assert _deleted(tmp_path) == []
    results = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
    assert [(r.status, r.summary) for r in results] == [
        ("denied", "not deleted (reject: not today)")
    ]
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.decision, dec.decided_by) == ("reject", "carol")
    assert text_of(evs) == "On it.Done: not deleted (reject: not today)."
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_while_waiting_for_approval_resumes_the_graph_elsewhere(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, say="On it.", tool="delete"))
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
    finally:
        await doomed.kill()
    await client.decide(req.approval_id, "approve", "bob", "ok")
    async with running_worker(settings, agent=AGENT, purge=False) as (_, w):
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    assert _deleted(tmp_path) == [run_id]  # the approved effect, exactly once
    assert [s.code for s in of(evs, events.Status)] == ["node", "resumed", "node", "node"]
    assert len(of(evs, events.ApprovalRequired)) == 1
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.approval_id, dec.decision) == (req.approval_id, "approve")
    results = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
    assert [(r.status, r.summary) for r in results] == [("ok", "deleted 2 rows")]
    assert text_of(evs) == "On it.Done: deleted 2 rows."
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_mid_stream_reissues_the_model_call_elsewhere(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    words = " ".join(f"w{i}" for i in range(30))
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    doomed.env[lg_agent.HANG_AFTER] = "5"  # streams 5 words, then waits to be killed
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, say=words, count=True))
        await wait_event(client, run_id, "text_delta", count=5)
    finally:
        await doomed.kill()
    async with running_worker(settings, agent=AGENT, purge=False) as (_, w):
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    (reset,) = of(evs, events.MessageReset)
    dead = [e.delta for e in of(evs, events.TextDelta) if e.message_id == reset.message_id]
    assert dead == ["w0", " w1", " w2", " w3", " w4"]  # what the dead worker streamed
    kept = {e.message_id for e in of(evs, events.TextDelta)} - {reset.message_id}
    assert len(kept) == 1
    assert [s.code for s in of(evs, events.Status)] == ["resumed", "node"]
    # The model call, issued again from the checkpoint (not with the input sent twice).
    assert _kept_text(evs) == words + " [1]"
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def _approve(b: Broker, run_id: str) -> events.ApprovalRequired:
    req = await wait_event(b, run_id, "approval_required")
    assert isinstance(req, events.ApprovalRequired)
    await b.decide(req.approval_id, "approve", "bob", "")
    return req


@pytest.mark.parametrize("hold", ["before_tool", "after_tool", "answer"])
async def test_kill_9_around_the_approved_tool_resumes_and_runs_it_once(
    settings: Settings, client: Broker, tmp_path: Path, hold: str
) -> None:
    """Killed mid-stream before the tool call, right after the approved tool
    ran (its tool_result is logged), or during the answer after it: the run
    resumes elsewhere, the tool ran once. (Killed while waiting for the
    approval: test_kill_9_while_waiting_for_approval_resumes_the_graph_elsewhere.)"""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, say="On it.", tool="delete", hold=hold))
        if hold == "before_tool":
            await wait_event(client, run_id, "text_delta")
        else:
            req = await _approve(client, run_id)
            await wait_event(client, run_id, "tool_result")
            if hold == "answer":
                await wait_event(client, run_id, "text_delta", count=3)  # "Done:"
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, agent=AGENT, purge=False):
        if hold == "before_tool":
            req = await _approve(client, run_id)
        evs = await read_run(client, run_id)
    assert of(evs, events.RunError) == []
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert _deleted(tmp_path) == [run_id]  # the approved effect, exactly once
    assert len(of(evs, events.ApprovalRequired)) == 1
    assert [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)] == [
        (req.tool_call_id, "ok")
    ]  # never retracted
    assert [s.code for s in of(evs, events.Status)].count("resumed") == 1
    assert _kept_text(evs) == "On it.Done: deleted 2 rows."
    resets = of(evs, events.MessageReset)
    after = "".join(
        d.delta for d in of(evs, events.TextDelta) if not resets or d.seq > resets[-1].seq
    )
    assert after == ("Done: deleted 2 rows." if hold == "answer" else "On it.Done: deleted 2 rows.")


async def test_kill_9_during_the_answer_after_a_tool_without_approval_resumes(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """`lookup` has no approval: its result, appended after its superstep was
    stored, is a durable point too; the answer's superstep runs again."""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, say="On it.", tool="lookup", hold="answer"))
        await wait_event(client, run_id, "text_delta", count=3)  # "Done:"
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, agent=AGENT, purge=False):
        evs = await read_run(client, run_id)
    assert of(evs, events.RunError) == []
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert [(r.status, r.summary) for r in of(evs, events.ToolResult)] == [("ok", "found 3 otters")]
    assert len(of(evs, events.Progress)) == 2  # the tool ran once
    (reset,) = of(evs, events.MessageReset)
    after = [d.delta for d in of(evs, events.TextDelta) if d.seq > reset.seq]
    assert "".join(after) == "Done: found 3 otters."


async def test_kill_9_while_the_approved_tool_runs_runs_its_superstep_again(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """LangGraph's own durability: the superstep that was running is run
    again from its checkpoint, the tool with it (after its interrupt(), with
    the stored decision): its side effect happened twice."""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(
            client, _spec(tmp_path, say="On it.", tool="delete", hold="in_tool")
        )
        req = await _approve(client, run_id)
        await wait_until(_async(lambda: len(_deleted(tmp_path)) == 1))
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, agent=AGENT, purge=False):
        evs = await read_run(client, run_id)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert _deleted(tmp_path) == [run_id, run_id]
    assert len(of(evs, events.ApprovalRequired)) == 1
    assert [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)] == [
        (req.tool_call_id, "ok")
    ]


async def test_kill_9_while_a_node_beside_the_tools_runs_keeps_the_tools_result(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """`lookup` finished (LangGraph saved its writes) while `audit`, in the
    same superstep, still runs: the superstep runs again without `lookup`,
    whose result LangGraph applies from its writes and does not stream again.
    The result is read from the graph's state instead, and `lookup` ran once."""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(
            client, _spec(tmp_path, say="Let me look.", tool="lookup", audit=True)
        )
        await wait_event(client, run_id, "progress", count=2)
        await wait_until(lambda: _tool_writes(client, run_id))
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, agent=AGENT, purge=False):
        evs = await read_run(client, run_id)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    assert len(of(evs, events.Progress)) == 2  # lookup ran once
    (card,) = of(evs, events.ToolCallStart)
    assert [(r.tool_call_id, r.status, r.summary) for r in of(evs, events.ToolResult)] == [
        (card.tool_call_id, "ok", "found 3 otters")
    ]
    assert _kept_text(evs) == "Let me look.Done: found 3 otters."


# -- stop and failures


async def test_a_graph_exception_is_a_coded_run_error(settings: Settings, tmp_path: Path) -> None:
    async with running_worker(settings, agent=AGENT) as (b, _):
        _, run_id = await start(b, _spec(tmp_path, fail=True))
        evs = await read_run(b, run_id)
        left = await _checkpoints(b, run_id)
    err, end = evs[-2], evs[-1]
    assert isinstance(err, events.RunError)
    assert (err.code, err.retryable, err.message) == (
        "graph_error",
        False,
        "the graph raised RuntimeError",
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"
    assert left == 0


# -- the stream mapping (no servers)


def _mapper(calls: dict[str, str] | None = None, streamed: list[str] | None = None) -> StreamMapper:
    n = iter(range(100))
    return StreamMapper(
        lambda kind: f"{kind}{next(n)}",
        risk=lambda name: "medium" if name == "rm" else "low",
        calls=calls or {},
        streamed=streamed or [],
        denied={"tc9"},
    )


def _msg(msg: Any, task: str = "llm:1", ns: tuple[str, ...] = ()) -> Any:
    return (ns, "messages", (msg, {"langgraph_checkpoint_ns": task}))


def test_the_closing_chunk_ends_the_tool_cards_of_its_node_task_only() -> None:
    m = _mapper()
    tc = tool_call_chunk(name="rm", args="{", id="call_a", index=0)
    assert m.feed(_msg(AIMessageChunk(content="", id="p1", tool_call_chunks=[tc]))) == [
        ("tool_start", ("tc0", "rm", "medium")),
        ("tool_args", ("tc0", "{")),
    ]
    other = tool_call_chunk(name="ls", args="{}", id="call_b", index=0)
    m.feed(_msg(AIMessageChunk(content="", id="q1", tool_call_chunks=[other]), task="llm:2"))
    # langchain-core's closing chunk carries its own id, not the provider's.
    last = AIMessageChunk(content="", id="lc_run--x", chunk_position="last")
    assert m.feed(_msg(last)) == [("tool_end", ("tc0",))]
    assert m.feed(((), "updates", {"llm": {}})) == [
        ("tool_end", ("tc1",)),
        ("status", ("node", "llm")),
    ]
    assert m.calls == {"call_a": "tc0", "call_b": "tc1"}


def test_whole_messages_and_tool_messages_map_once() -> None:
    m = _mapper(calls={"call_z": "tc9"}, streamed=["seen1"])
    assert m.feed(_msg(AIMessage(content="again", id="seen1"))) == []
    whole = AIMessage(
        content="Sub says", id="s2", tool_calls=[{"name": "ls", "args": {"d": 1}, "id": "call_c"}]
    )
    assert m.feed(_msg(whole, ns=("agent:1",))) == [
        ("text", ("m0", "Sub says")),
        ("tool_start", ("tc1", "ls", "low")),
        ("tool_args", ("tc1", '{"d": 1}')),
        ("tool_end", ("tc1",)),
    ]
    assert m.feed(_msg(ToolMessage(content="x\ny", tool_call_id="call_c"))) == [
        ("tool_result", ("tc1", "ok", "x", "x\ny")),
    ]
    assert m.feed(_msg(ToolMessage(content="no", tool_call_id="call_z"))) == [
        ("tool_result", ("tc9", "denied", "no", "no")),
    ]
    assert m.calls == {}
    assert m.streamed == ["seen1", "s2"]


def test_custom_writes_are_progress_or_status() -> None:
    m = _mapper()
    assert m.feed(((), "custom", {"label": "rows", "done": 3, "total": 9})) == [
        ("progress", ("rows", 3, 9))
    ]
    assert m.feed(((), "custom", {"code": "fetching", "summary": "page 2"})) == [
        ("status", ("fetching", "page 2"))
    ]
    assert m.feed((("sub:1",), "custom", {"x": 1})) == [("status", ("custom", '{"x": 1}'))]
