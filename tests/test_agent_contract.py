"""The contract every agent adapter keeps, one test body run against each: the
agent API (workers/api.py), LangGraph, the OpenAI Agents SDK, Pydantic AI and
a remote AG-UI agent (workers/frameworks/), each with its real library,
offline, on the session's NATS and PostgreSQL.

- A stop (runlog's interrupt) cancels what the agent awaits, closing the model's
  stream or the upstream connection; the run ends `aborted` with the stop's
  audit, and what streamed before it is kept.
- A tool call is one card: its start (name, risk), its arguments as they
  streamed, its end and its result, under one tool_call_id; the model sees
  the result and the run completes (the frameworks that stream tool calls).

An adapter's own behaviour (its event mapping, usage, errors, takeovers) is
tested in its own file (tests/test_agent_<adapter>.py); each `Adapter` below
says what differs in the contract (inputs, the text expected, how to see that
the model's stream was closed) and checks what only it shows (`extra`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from ag_ui.core import TextMessageContentEvent, TextMessageStartEvent

from broker import events
from broker.settings import Settings

from .agents import api_agents, lg_agent, oa_agent
from .aguiserver import Exchange, Upstream, serving
from .workerkit import of, read_run, running_worker, start, text_of, wait_event, wait_until

Check = Callable[[list[events.AnyEvent]], None]


def _nothing(evs: list[events.AnyEvent]) -> None:
    pass


@dataclasses.dataclass
class Adapter:
    """One adapter's part of the contract, for one test (`tmp`: its folder,
    `tag`: a name of its own for gates and what the agent saw)."""

    agent: str
    tmp: Path
    tag: str
    stop_input: str
    stop_text: str  # what streamed before the stop, kept
    stopped: Callable[[str], bool]  # (run id) the model's stream / upstream was closed
    stop_extra: Check = _nothing
    tool_input: str | None = None  # None: not in the tool-call contract
    tool_args: list[str] = dataclasses.field(default_factory=list)
    tool_result: tuple[str, str | None] = ("ok", None)  # (status, summary; None: any)
    tool_text: str = ""
    tool_extra: Check = _nothing


def _json(**kw: object) -> str:
    return json.dumps(kw)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# -- each adapter's part (the agents are tests/agents/*.py)


def _api(tmp: Path, tag: str) -> Adapter:
    return Adapter(
        agent="tests.agents.api_agents:stalls",
        tmp=tmp,
        tag=tag,
        stop_input="never",
        stop_text="",  # the agent's text is not this contract's: only the stop is
        stopped=lambda run_id: api_agents.SEEN.get(run_id) == ["cancelled"],
    )


def _langgraph(tmp: Path, tag: str) -> Adapter:
    def stop_extra(evs: list[events.AnyEvent]) -> None:
        assert not lg_agent.gate(tag).is_set()  # the model never went on

    def tool_extra(evs: list[events.AnyEvent]) -> None:
        # A tool result follows the superstep that ran the tool (its step stored),
        # so it comes after that superstep's own status.
        assert [type(e).__name__ for e in evs] == [
            "RunStart", "TextDelta", "TextDelta", "TextDelta",
            "ToolCallStart", "ToolArgsDelta", "ToolArgsDelta", "ToolCallEnd", "Status",
            "Progress", "Progress", "Status", "ToolResult",
            "TextDelta", "TextDelta", "TextDelta", "TextDelta", "Status", "RunEnd",
        ]  # fmt: skip
        assert [(p.label, p.done, p.total) for p in of(evs, events.Progress)] == [
            ("searching", 1, 2),
            ("searching", 2, 2),
        ]
        first, second = dict.fromkeys(e.message_id for e in of(evs, events.TextDelta))
        assert first != second
        assert [s.summary for s in of(evs, events.Status)] == ["llm", "tools", "llm"]
        assert evs[-1].usage == events.Usage(input_tokens=10, output_tokens=9)  # type: ignore[union-attr]

    return Adapter(
        agent="tests.agents.lg_agent:agent",
        tmp=tmp,
        tag=tag,
        stop_input=_json(dir=str(tmp), say="Hello world", gate=tag),
        stop_text="Hello",
        stopped=lambda run_id: lg_agent.SEEN.get(tag) == ["CancelledError"],
        stop_extra=stop_extra,
        tool_input=_json(dir=str(tmp), say="Let me look.", tool="lookup"),
        tool_args=['{"q": ', '"otters"}'],
        tool_result=("ok", "found 3 otters"),
        tool_text="Let me look.Done: found 3 otters.",
        tool_extra=tool_extra,
    )


def _openai_agents(tmp: Path, tag: str) -> Adapter:
    def tool_extra(evs: list[events.AnyEvent]) -> None:
        kinds = (events.ToolCallStart, events.ToolArgsDelta, events.ToolCallEnd, events.ToolResult)
        assert [type(e).__name__ for e in evs if isinstance(e, kinds)] == [
            "ToolCallStart", "ToolArgsDelta", "ToolArgsDelta", "ToolArgsDelta", "ToolCallEnd",
            "ToolResult",
        ]  # fmt: skip
        assert evs[-1].usage == events.Usage(input_tokens=16, output_tokens=4)  # type: ignore[union-attr]

    pieces = ['{"q"', ': "wea', 'ther"}']
    return Adapter(
        agent="tests.agents.oa_agent:agent",
        tmp=tmp,
        tag=tag,
        stop_input=_json(stall=tag),
        stop_text="",
        stopped=lambda run_id: oa_agent.SEEN.get(tag) == ["CancelledError"],
        tool_input=_json(tool="lookup", args=pieces),
        tool_args=pieces,
        tool_result=("ok", "found weather"),
        tool_text="done: found weather",  # the model's second call saw the output
        tool_extra=tool_extra,
    )


def _pydantic_ai(tmp: Path, tag: str) -> Adapter:
    def stop_extra(evs: list[events.AnyEvent]) -> None:
        assert [type(e).__name__ for e in evs] == [
            "RunStart",
            "TextDelta",
            "InterruptRequested",
            "RunEnd",
        ]

    def tool_extra(evs: list[events.AnyEvent]) -> None:
        assert [type(e).__name__ for e in evs] == [
            "RunStart", "ToolCallStart", "ToolArgsDelta", "ToolArgsDelta", "ToolCallEnd",
            "ToolResult", "TextDelta", "RunEnd",
        ]  # fmt: skip
        (result,) = of(evs, events.ToolResult)
        assert result.output is None  # raw output: tool_raw_output is off

    return Adapter(
        agent="tests.agents.pa_agent:agent",
        tmp=tmp,
        tag=tag,
        stop_input=_json(do="hang", dir=str(tmp)),
        stop_text="Working",
        # The cancellation reached the model's stream at the await it was blocked on.
        stopped=lambda run_id: _read(tmp / "closed") == "CancelledError",
        stop_extra=stop_extra,
        tool_input=_json(do="lookup"),
        tool_args=['{"city": ', '"Paris"}'],
        tool_text="lookup: sunny in Paris",  # the model got the tool's return
        tool_extra=tool_extra,
    )


async def _generates_until_the_client_goes(ex: Exchange) -> None:
    await ex.started()
    await ex.send(
        TextMessageStartEvent(message_id="a1", role="assistant"),
        TextMessageContentEvent(message_id="a1", delta="Working on it "),
    )
    await asyncio.Event().wait()


def _agui(tmp: Path, tag: str, upstream: Upstream) -> Adapter:
    return Adapter(
        agent="tests.agents.agui_agent:agent",
        tmp=tmp,
        tag=tag,
        stop_input="a long task",
        stop_text="Working on it ",
        stopped=lambda run_id: upstream.disconnects == 1,  # the upstream connection closed
    )


ADAPTERS = ["api", "langgraph", "openai-agents", "pydantic-ai", "agui"]


@pytest_asyncio.fixture(params=ADAPTERS, loop_scope="session")
async def adapter(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Adapter]:
    tag = f"contract-{secrets.token_hex(4)}"
    match request.param:
        case "api":
            yield _api(tmp_path, tag)
        case "langgraph":
            try:
                yield _langgraph(tmp_path, tag)
            finally:
                # The in-process agent keeps a pool for the process; a test gives it back.
                await lg_agent.agent.aclose()
        case "openai-agents":
            yield _openai_agents(tmp_path, tag)
        case "pydantic-ai":
            yield _pydantic_ai(tmp_path, tag)
        case "agui":
            async with serving(_generates_until_the_client_goes) as up:
                # The module-level agent's upstream, as RUNLOG_AGUI_URL gives it.
                monkeypatch.setenv("RUNLOG_AGUI_URL", up.url)
                yield _agui(tmp_path, tag, up)


async def test_a_stop_closes_the_models_stream_and_ends_the_run_aborted(
    settings: Settings, adapter: Adapter
) -> None:
    async with running_worker(settings, agent=adapter.agent) as (b, _):
        _, run_id = await start(b, adapter.stop_input)
        await wait_event(b, run_id, "text_delta")
        assert not adapter.stopped(run_id)
        assert await b.interrupt(run_id, "alice", "enough") is True

        async def stopped() -> bool:
            return adapter.stopped(run_id)

        await wait_until(stopped, timeout_s=10)
        evs = await read_run(b, run_id, timeout_s=30)
    (intr,) = of(evs, events.InterruptRequested)
    end = evs[-1]
    assert evs.index(intr) == len(evs) - 2  # the last before the end
    assert (intr.requested_by, intr.reason) == ("alice", "enough")
    assert isinstance(end, events.RunEnd) and end.status == "aborted" and end.stop is not None
    assert (end.stop.requested_by, end.stop.reason) == ("alice", "enough")
    if adapter.stop_text:
        assert text_of(evs) == adapter.stop_text  # what was produced is kept
    adapter.stop_extra(evs)


# The agent API's tool calls are the agent's own events (tests/test_agent_api.py),
# the AG-UI agent's its upstream's (tests/test_agent_agui.py).
@pytest.mark.parametrize("adapter", ["langgraph", "openai-agents", "pydantic-ai"], indirect=True)
async def test_a_tool_call_streams_its_arguments_then_its_result(
    settings: Settings, adapter: Adapter
) -> None:
    assert adapter.tool_input is not None
    async with running_worker(settings, agent=adapter.agent) as (b, _):
        _, run_id = await start(b, adapter.tool_input)
        evs = await read_run(b, run_id)
    (card,) = of(evs, events.ToolCallStart)
    assert (card.tool_name, card.risk_level) == ("lookup", "low")
    mine = [e for e in evs if getattr(e, "tool_call_id", None) == card.tool_call_id]
    assert [type(e).__name__ for e in mine] == [
        "ToolCallStart", *["ToolArgsDelta"] * len(adapter.tool_args), "ToolCallEnd", "ToolResult",
    ]  # fmt: skip
    assert {e.tool_call_id for e in evs if hasattr(e, "tool_call_id")} == {card.tool_call_id}
    assert [a.partial_json for a in of(evs, events.ToolArgsDelta)] == adapter.tool_args
    (result,) = of(evs, events.ToolResult)
    status, summary = adapter.tool_result
    assert result.status == status
    if summary is not None:
        assert result.summary == summary
    assert text_of(evs) == adapter.tool_text
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    adapter.tool_extra(evs)
