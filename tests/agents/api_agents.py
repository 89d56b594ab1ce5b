"""Agents written against workers.api, for tests/test_agent_api.py.

Each reads what to do from the run's input (a JSON object) and reports to
the test through files under `dir` (side effects are counted there, so a
test can tell how often a step ran, also across worker processes) or, in
the test's own process, through `GATES` (asyncio events by name).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from workers.api import AgentContext, AgentError

GATES: dict[str, asyncio.Event] = {}
SEEN: dict[str, list[str]] = {}  # what agents noticed, by run id (in-process tests)


def gate(name: str) -> asyncio.Event:
    return GATES.setdefault(name, asyncio.Event())


def _count(directory: str, name: str) -> None:
    with (Path(directory) / name).open("a") as f:
        f.write("x")


def _first_time(path: Path) -> bool:
    """Whether `path` did not exist; it does now."""
    if path.exists():
        return False
    path.write_text("started")
    return True


class Found(msgspec.Struct):
    rows: list[int]


async def scripted(ctx: AgentContext) -> None:
    """Text, a step, a tool card with an approval, a second step: what
    `ctx.input` asks for, e.g. {"dir": "/tmp/x", "words": 40, "delay_s": 0.05}."""
    spec: dict[str, Any] = json.loads(ctx.input)
    directory = spec["dir"]
    m = ctx.message_id()
    await ctx.text(m, "Looking. ")

    async def search() -> Found:
        _count(directory, "search")
        return Found(rows=[1, 2, 3])

    found = await ctx.step("search", search, type=Found)
    ctx.usage(input_tokens=7, output_tokens=3)
    if spec.get("approval"):
        call = ctx.tool_call_id()
        await ctx.tool_start(call, "delete_rows", risk="high")
        await ctx.tool_args(call, '{"rows": ')
        await ctx.tool_args(call, json.dumps(found.rows) + "}")
        await ctx.tool_end(call)
        d = await ctx.approval(f"delete {len(found.rows)} rows?", tool_call_id=call)
        if d.approved:

            async def delete() -> int:
                await asyncio.sleep(spec.get("hold_s", 0))
                _count(directory, "delete")
                return len(found.rows)

            n = await ctx.step("delete", delete, retryable=not spec.get("once"))
            await ctx.tool_result(call, "ok", f"deleted {n} rows")
        else:
            await ctx.tool_result(call, "denied", d.comment or d.decision)
    # A long answer, streamed outside any step: a takeover retracts its part.
    m2 = ctx.message_id()
    for i in range(int(spec.get("words", 3))):
        await ctx.text(m2, f"w{i} ")
        if spec.get("delay_s"):
            await asyncio.sleep(spec["delay_s"])

    async def report() -> str:
        _count(directory, "report")
        return "done"

    await ctx.step("report", report)
    await ctx.text(m2, "end.")


async def stalls(ctx: AgentContext) -> None:
    """Streams a word, then waits on gate(input) (forever unless set); notes
    a cancellation in SEEN."""
    m = ctx.message_id()
    await ctx.text(m, "thinking")
    try:
        await gate(ctx.input).wait()
    except asyncio.CancelledError:
        SEEN.setdefault(ctx.run_id, []).append("cancelled")
        raise
    await ctx.text(m, " done")


async def stubborn(ctx: AgentContext) -> None:
    """Ignores its first cancellation for a second (a badly written agent)."""
    await ctx.text(ctx.message_id(), "la la la")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        SEEN.setdefault(ctx.run_id, []).append("ignored a cancellation")
    await asyncio.sleep(1.0)
    SEEN[ctx.run_id].append("gave up")


async def fails(ctx: AgentContext) -> None:
    """{"code": ...} raises AgentError(code); anything else a KeyError."""
    spec = json.loads(ctx.input)
    await ctx.text(ctx.message_id(), "about to fail")
    if "code" in spec:
        raise AgentError(spec["code"], "the search index is offline", retryable=True)
    raise KeyError("secret-api-key-123")


async def swallows(ctx: AgentContext) -> None:
    """Catches everything while waiting for an approval (also runlog's own
    outcomes), then carries on emitting: runlog's outcome must still win."""
    call = ctx.tool_call_id()
    await ctx.tool_start(call, "deploy", risk="high")
    try:
        await ctx.approval("deploy?", tool_call_id=call)
    except Exception as e:
        SEEN.setdefault(ctx.run_id, []).append(type(e).__name__)
    await ctx.text(ctx.message_id(), "carrying on regardless")


async def swerves(ctx: AgentContext) -> None:
    """Calls a different step on a replay: nondeterministic."""
    spec = json.loads(ctx.input)
    await ctx.step("second" if ctx.resumed else "first", lambda: _noop())
    for i in range(200):
        await ctx.text(ctx.message_id(), f"{i} ")
        await asyncio.sleep(spec.get("delay_s", 0.05))


async def _noop() -> None:
    return None


async def chat(ctx: AgentContext) -> None:
    """Answers with what it remembers of the session."""
    history = await ctx.conversation()
    m = ctx.message_id()
    await ctx.text(m, " | ".join(f"{h.role}:{h.content}" for h in history) or "(nothing)")


async def drifting(ctx: AgentContext) -> None:
    """A tool call whose arguments come out differently on every execution
    (as a real model's may), behind an approval; {"dir": ...}."""
    directory = json.loads(ctx.input)["dir"]
    call = ctx.tool_call_id()
    await ctx.tool_start(call, "restart_worker", risk="high")
    await ctx.tool_args(call, json.dumps({"target": "db", "worker_pid": os.getpid()}))
    await ctx.tool_end(call)
    d = await ctx.approval("restart the db worker?", tool_call_id=call)
    if d.approved:

        async def restart() -> int:
            _count(directory, "restart")
            return os.getpid()

        await ctx.step("restart", restart, retryable=False)
        await ctx.tool_result(call, "ok", "restarted")


async def _wait_file(path: Path) -> None:
    while not await asyncio.to_thread(path.exists):
        await asyncio.sleep(0.02)


async def wavering(ctx: AgentContext) -> None:
    """What its process says comes out differently on a replay (its pid):
    text, or a tool call's arguments (`{"dir": d, "in": "text" | "args"}`),
    then a step, then (once `d/go` exists) a last message. The step ran
    counts in `d/work`."""
    spec = json.loads(ctx.input)
    d = spec["dir"]
    if spec["in"] == "text":
        await ctx.text(ctx.message_id(), f"process {os.getpid()} here. ")
    else:
        call = ctx.tool_call_id()
        await ctx.tool_start(call, "lookup")
        await ctx.tool_args(call, json.dumps({"asked_by": os.getpid()}))
        await ctx.tool_end(call)

    async def work() -> int:
        _count(d, "work")
        return 7

    found = await ctx.step("work", work)
    await _wait_file(Path(d) / "go")
    await ctx.text(ctx.message_id(), f"found {found}.")


async def reports_inside(ctx: AgentContext) -> None:
    """A tool card, then a step that emits its result and waits (forever, in
    the process the test kills) for `d/go`: the result is the first thing in
    the log after the last durable point, the step's row is not there.
    Counts each run of the step in `d/acted`."""
    d = json.loads(ctx.input)["dir"]
    call = ctx.tool_call_id()
    await ctx.tool_start(call, "charge_card")
    await ctx.tool_end(call)
    await ctx.step("quote", lambda: _noop())  # a durable point after the card

    async def act() -> str:
        _count(d, "acted")
        await ctx.tool_result(call, "ok", "charged")
        await _wait_file(Path(d) / "go")
        return "charged"

    await ctx.step("charge", act)
    await ctx.text(ctx.message_id(), "done.")


async def timed(ctx: AgentContext) -> None:
    """Uses 2.5 s of its run time in a step; then, in a second one, hangs the
    first time (it creates the file named by its input: the test kills its
    worker there) and takes 1 s the next."""
    await ctx.step("burn", lambda: asyncio.sleep(2.5))

    async def second() -> None:
        if _first_time(Path(ctx.input)):
            await asyncio.sleep(3600)
        await asyncio.sleep(1.0)

    await ctx.step("second", second)
    await ctx.text(ctx.message_id(), "done")
