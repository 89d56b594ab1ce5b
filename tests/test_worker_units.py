"""Pure parts of the worker, without servers: the scripted agent, the tool
registry, the adapter factory."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
import pytest

from broker import errors
from broker.settings import Settings
from workers.adapters.factory import make_adapter
from workers.adapters.scripted import ScriptedAdapter, _Ticks, tokens
from workers.model import (
    Finish,
    Message,
    ModelError,
    ModelItem,
    ModelRequest,
    TextChunk,
    ToolArgsChunk,
    ToolCall,
    ToolCallBegin,
    ToolCallDone,
)
from workers.tools import Tool, ToolOutput, load_tools


async def _turn(messages: list[Message]) -> list[ModelItem]:
    adapter = ScriptedAdapter(tokens_per_s=0)
    return [item async for item in adapter.stream(ModelRequest(messages=messages))]


def test_tokens_rebuild_the_text() -> None:
    for text in ["", "a", "  lead and trail  ", "<b>x</b>\n\ny\tz", "échos — ünïcode"]:
        assert "".join(tokens(text)) == text


async def test_scripted_default_script_turn_by_turn() -> None:
    user = Message(role="user", content="tell me about leases")
    first = await _turn([user])
    begins = [i for i in first if isinstance(i, ToolCallBegin)]
    assert [b.name for b in begins] == ["search_docs"]
    args = "".join(i.json for i in first if isinstance(i, ToolArgsChunk))
    assert msgspec.json.decode(args)["query"] == "leases"
    assert isinstance(first[-1], Finish) and first[-1].reason == "tool_calls"
    assert isinstance(first[-2], ToolCallDone)

    call = ToolCall(id=begins[0].id, name="search_docs", arguments=args)
    history = [
        user,
        Message(role="assistant", tool_calls=[call]),
        Message(role="tool", content="[]", tool_call_id=call.id, name="search_docs"),
    ]
    second = await _turn(history)
    assert [i.name for i in second if isinstance(i, ToolCallBegin)] == ["send_message"]

    send = ToolCall(id="call_2_0", name="send_message", arguments="{}")
    for outcome, phrase in [
        ("Message sent", "the summary was sent"),
        ("denied: no", "I did not send"),
        ("skipped: approval expired", "Nobody approved in time"),
    ]:
        final = await _turn(
            [
                *history,
                Message(role="assistant", tool_calls=[send]),
                Message(role="tool", content=outcome, tool_call_id=send.id, name="send_message"),
            ]
        )
        text = "".join(i.text for i in final if isinstance(i, TextChunk))
        assert phrase in text
        assert isinstance(final[-1], Finish) and final[-1].reason == "stop"


async def test_scripted_keywords() -> None:
    echo = await _turn([Message(role="user", content="echo: <i>hi</i>")])
    assert "".join(i.text for i in echo if isinstance(i, TextChunk)) == "<i>hi</i>"  # no separator
    for given, answer in [
        ("echo:hi", "hi"),
        ("echo:  two spaces", " two spaces"),
        ("echo:\n x", "\n x"),
    ]:
        echo = await _turn([Message(role="user", content=given)])
        assert "".join(i.text for i in echo if isinstance(i, TextChunk)) == answer, given
    install = await _turn([Message(role="user", content="how do I install it? no tools")])
    assert isinstance(install[-1], Finish)  # "install" is not the keyword "stall"
    with pytest.raises(ModelError) as info:
        await _turn([Message(role="user", content="please fail model")])
    assert (info.value.code, info.value.retryable) == ("model_unavailable", True)


async def test_scripted_paced_turns_share_timers_and_a_stop_stops_only_its_own() -> None:
    """Paced turns of one adapter sleep on shared per-slot timers: every token
    still comes no earlier than its schedule (the n-th, from 0, (n + 1) /
    tokens_per_s after the turn started), and cancelling one turn mid-sleep leaves the others sleeping in
    the same slots to finish (a shared future would cancel them all)."""
    rate = 200.0
    adapter = ScriptedAdapter(tokens_per_s=rate)
    loop = asyncio.get_running_loop()
    request = ModelRequest(messages=[Message(role="user", content="echo: " + "a " * 20)])

    async def play() -> list[float]:
        times = []
        async for item in adapter.stream(request):
            if isinstance(item, TextChunk):
                times.append(loop.time())
        return times

    start = loop.time()
    turns = [asyncio.create_task(play()) for _ in range(5)]
    victim = asyncio.create_task(play())
    await asyncio.sleep(0.03)  # all of them sleeping between tokens
    victim.cancel()
    done = await asyncio.wait_for(asyncio.gather(*turns), 30)
    with pytest.raises(asyncio.CancelledError):
        await victim
    for times in done:
        assert len(times) == 20
        for n, t in enumerate(times):
            assert t >= start + (n + 1) / rate, (n, t - start)


async def test_ticks_sleepers_of_one_slot_are_cancelled_one_by_one() -> None:
    loop = asyncio.get_running_loop()
    ticks = _Ticks()
    when = loop.time() + 0.02
    a, b, c = ticks.until(when), ticks.until(when), ticks.until(when + 0.0001)
    a.cancel()
    await asyncio.wait_for(asyncio.gather(b, c), 10)
    assert loop.time() >= when and a.cancelled()


def test_load_tools_by_import_path() -> None:
    reg = load_tools("workers.builtin_tools:TOOLS, tests.test_worker_units:EXTRA")
    assert reg.names() == ["search_docs", "save_note", "send_message", "extra"]
    assert {reg.get(n).risk for n in reg.names()} == {"low", "medium", "high"}  # type: ignore[union-attr]
    assert reg.specs()[0].parameters["required"] == ["query"]
    with pytest.raises(ValueError, match="module:attr"):
        load_tools("workers.builtin_tools")
    with pytest.raises(ValueError, match="two tools"):
        load_tools("workers.builtin_tools:TOOLS,workers.builtin_tools:TOOLS")
    with pytest.raises(ValueError, match="not a Tool"):
        load_tools("workers.builtin_tools:search_docs")


async def _extra(args: dict[str, object], ctx: object) -> ToolOutput:
    return ToolOutput("extra ran")


EXTRA = Tool(name="extra", description="a test tool", fn=_extra)


def test_adapter_factory() -> None:
    base = Settings.from_env({})
    assert make_adapter(base).name == "scripted"
    with pytest.raises(errors.ClientError) as info:
        make_adapter(dataclasses.replace(base, model_adapter="nope"))
    assert info.value.hint
