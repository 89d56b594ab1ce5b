"""A resumed agent's replay is compared with the log (issue 19, item 1):
text that came out differently is retracted from the first difference and
goes on live; a tool call that came out differently fails the run before
anything acts on it. With real worker processes killed (-9), and a
property test of the comparison itself."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import msgspec
import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from workers.verify import Replay

from .workerkit import (
    DOOMED,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    wait_event,
    wait_until,
)

AGENT = "tests.agents.api_agents:wavering"
_DOOMED = DOOMED


def visible_text(evs: list[events.AnyEvent]) -> str:
    """What a client shows: every message's deltas, less the messages reset."""
    texts: dict[str, list[str]] = {}
    for e in evs:
        if isinstance(e, events.TextDelta):
            texts.setdefault(e.message_id, []).append(e.delta)
        elif isinstance(e, events.MessageReset):
            texts.pop(e.message_id, None)
    return "".join("".join(t) for t in texts.values())


async def _killed_after_the_step(settings: Settings, client: Broker, d: Path, in_: str) -> str:
    doomed = WorkerProcess(settings, d / "a.log", agent=AGENT, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, json.dumps({"dir": str(d), "in": in_}))

        async def worked() -> bool:
            row = await client.store.pool.fetchrow(
                "SELECT done FROM run_steps WHERE run_id = $1 AND name = 'work'", run_id
            )
            return row is not None and bool(row["done"])

        await wait_until(worked)
    finally:
        await doomed.kill()
    (d / "go").touch()
    return run_id


async def test_text_the_replay_says_differently_is_retracted_and_goes_on_live(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    run_id = await _killed_after_the_step(settings, client, tmp_path, "text")
    async with running_worker(settings, purge=False, agent=AGENT):
        evs = await read_run(client, run_id)
    assert of(evs, events.RunError) == []
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    # This process's words, once; the dead one's retracted.
    assert visible_text(evs) == f"process {os.getpid()} here. found 7."
    assert (tmp_path / "work").read_text() == "x"  # the step ran once


async def test_a_tool_call_the_replay_makes_differently_fails_the_run(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    run_id = await _killed_after_the_step(settings, client, tmp_path, "args")
    async with running_worker(settings, purge=False, agent=AGENT):
        evs = await read_run(client, run_id)
    (err,) = of(evs, events.RunError)
    assert (err.code, err.retryable) == ("agent_nondeterministic", False)
    (card,) = of(evs, events.ToolCallStart)
    assert f"tool_args_delta for {card.tool_call_id}" in err.message
    assert "found 7" not in visible_text(evs)  # nothing after the divergence
    assert evs[-1].status == "failed"  # type: ignore[union-attr]


# -- the comparison, over random logs and replays

_words = st.sampled_from(["a ", "b ", "c ", "dd ", "e. "])


@st.composite
def _scripts(draw: st.DrawFn) -> list[events.AnyEvent]:
    """What an agent emits outside its steps: messages of text and
    reasoning, and tool cards, interleaved."""
    out: list[events.AnyEvent] = []
    for i in range(draw(st.integers(1, 8))):
        if draw(st.booleans()):
            cls = events.TextDelta if draw(st.booleans()) else events.ReasoningDelta
            for w in draw(st.lists(_words, min_size=1, max_size=4)):
                out.append(cls(message_id=f"m_{i}", delta=w))
        else:
            c = f"tc_{i}"
            out.append(events.ToolCallStart(tool_call_id=c, tool_name="lookup"))
            out.append(events.ToolArgsDelta(tool_call_id=c, partial_json=draw(_words)))
            out.append(events.ToolCallEnd(tool_call_id=c))
    return out


class _Failed(Exception):
    pass


def _fail(what: str) -> NoReturn:
    raise _Failed(what)


def _client_text(evs: Sequence[events.Event]) -> dict[str, str]:
    """Text and reasoning as a client keeps them, by message (reset: gone)."""
    texts: dict[str, str] = {}
    for e in evs:
        if isinstance(e, events.TextDelta | events.ReasoningDelta):
            texts[e.message_id] = texts.get(e.message_id, "") + e.delta
        elif isinstance(e, events.MessageReset):
            texts.pop(e.message_id, None)
    return texts


@hsettings(max_examples=300, deadline=None)
@given(script=_scripts(), data=st.data())
def test_a_replay_leaves_a_log_a_client_can_apply(
    script: list[events.Event], data: st.DataObject
) -> None:
    """Logged: the script up to a crash (seq 1..k; the last durable point at
    k). Replayed: the same, or with one event changed. Identical: nothing is
    appended. Text changed: the log plus what is appended shows each
    message exactly as the replay said it, once. A tool card changed: the
    comparison fails at or before the first changed card event."""
    k = data.draw(st.integers(1, len(script)), label="crash after")
    logged: list[Any] = [msgspec.structs.replace(e, seq=i + 1) for i, e in enumerate(script[:k])]
    replayed: list[Any] = [msgspec.structs.replace(e) for e in script[:k]]
    how = data.draw(st.sampled_from(["same", "text", "args"]), label="replay")
    changed = [i for i, e in enumerate(replayed) if _changeable(e, how)]
    at = (
        data.draw(st.sampled_from(changed), label="changed at")
        if how != "same" and changed
        else None
    )
    card = ""  # the tool call whose arguments changed
    if at is not None:
        e = replayed[at]
        if isinstance(e, events.TextDelta | events.ReasoningDelta):
            e.delta = e.delta.upper() + "!"
        elif isinstance(e, events.ToolArgsDelta):
            e.partial_json += "!"
            card = e.tool_call_id
    said = _client_text(replayed)  # before the replay: it may give events new ids
    appended: list[events.Event] = []

    async def append(e: events.Event) -> None:
        appended.append(e)

    async def replay() -> None:
        r = Replay(logged, [], run_id="r_x", epoch=2, append=append, fail=_fail)
        for e in replayed:
            if not await r.take(e):
                appended.append(e)
        await r.until(k)

    if card:
        with pytest.raises(_Failed, match=f"tool_args_delta for {card}"):
            asyncio.run(replay())
        return
    asyncio.run(replay())
    if at is None:
        assert appended == []
        return
    assert not [e for e in appended if isinstance(e, events.ToolCallStart | events.ToolArgsDelta)]
    # Each message shows what the replay said, whole and once (under a new
    # id where it was retracted); the ids never collide with a reset one.
    shown = _client_text([*logged, *appended])
    assert sorted(shown.values()) == sorted(said.values())
    reset = {e.message_id for e in appended if isinstance(e, events.MessageReset)}
    assert not reset & {
        e.message_id for e in appended if isinstance(e, events.TextDelta | events.ReasoningDelta)
    }


def _changeable(e: events.Event, how: str) -> bool:
    if how == "text":
        return isinstance(e, events.TextDelta | events.ReasoningDelta)
    return how == "args" and isinstance(e, events.ToolArgsDelta)


async def test_a_tool_result_from_a_step_that_did_not_finish_fails_worker_lost(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The step's tool result was committed, then its worker died before the
    step's row: the step is not run again (its tool would act twice)."""
    agent = "tests.agents.api_agents:reports_inside"
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=agent, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, json.dumps({"dir": str(tmp_path)}))
        await wait_event(client, run_id, "tool_result")
    finally:
        await doomed.kill()
    (tmp_path / "go").touch()
    async with running_worker(settings, purge=False, agent=agent):
        evs = await read_run(client, run_id)
    (err,) = of(evs, events.RunError)
    assert (err.code, err.message) == (
        "worker_lost",
        "the run cannot be resumed: the tool_result at seq 4 came from step 'charge', "
        "which did not finish",
    )
    assert (tmp_path / "acted").read_text() == "x"  # not run again
    assert evs[-1].status == "failed"  # type: ignore[union-attr]
