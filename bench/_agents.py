"""The agents and the workload of `bench agents`, importable by a `runlog
worker` process (`RUNLOG_AGENT=bench._agents:agent`, cwd = the repo).

Every case streams the same text: `deltas(n)`, n word-sized pieces whose
concatenation the scripted adapter's tokenizer splits back into exactly the
same n pieces, so the built-in loop (input `builtin_input(n)`, the scripted
adapter's `echo:` script) and the API agent (input `api_input(n, mode)`)
append the same text deltas. Both yield to the event loop once every 64
deltas, as the scripted adapter's pacer does at `tokens_per_s=0`.

`resume_agent` (input `resume_input(n, gate)`) is the takeover of the
replay-verification item (bench/_verify.py): `deltas(n)` outside any step,
one step, a text delta, then it waits for the file `gate` to exist.
"""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path
from typing import Literal

import msgspec

from workers.adapters.scripted import tokens
from workers.api import AgentContext

from ._lib import TOKENS

Mode = Literal["text", "step", "steps"]

_WORDS = tuple(t.strip() for t in TOKENS if t.strip())
_YIELD_EVERY = 64  # the scripted adapter's pacer at tokens_per_s=0
_GATE_POLL_S = 0.01


class Spec(msgspec.Struct, forbid_unknown_fields=True):
    """An API agent run's input: `events` text deltas, emitted
    - "text": with `ctx.text`, outside any step;
    - "step": all inside one `ctx.step`;
    - "steps": inside one `ctx.step` per `per_step` deltas."""

    events: int
    mode: Mode = "text"
    per_step: int = 10


class ResumeSpec(msgspec.Struct, forbid_unknown_fields=True):
    """`resume_agent`'s input: `events` text deltas, then a step, then one
    more delta; then it waits until the file `gate` exists."""

    events: int
    gate: str


def deltas(n: int) -> list[str]:
    """n pieces of text; the last one has no trailing space."""
    out = [_WORDS[i % len(_WORDS)] + " " for i in range(n)]
    if out:
        out[-1] = out[-1].rstrip()
    return out


def builtin_input(n: int) -> str:
    """The built-in loop's input: the scripted adapter answers `echo:<text>`
    with `tokens(<text>)`, n text deltas and no tool."""
    text = "".join(deltas(n))
    assert tokens(text) == deltas(n), "the scripted tokenizer would not give the same deltas"
    return "echo:" + text


def api_input(n: int, mode: Mode, per_step: int = 10) -> str:
    return msgspec.json.encode(Spec(events=n, mode=mode, per_step=per_step)).decode()


def resume_input(n: int, gate: str) -> str:
    return msgspec.json.encode(ResumeSpec(events=n, gate=gate)).decode()


async def _emit(ctx: AgentContext, message_id: str, pieces: list[str], start: int) -> None:
    for i, piece in enumerate(pieces, start + 1):
        if i % _YIELD_EVERY == 0:
            await asyncio.sleep(0)
        await ctx.text(message_id, piece)


async def agent(ctx: AgentContext) -> None:
    spec = msgspec.json.decode(ctx.input, type=Spec)
    pieces = deltas(spec.events)
    m = ctx.message_id()
    if spec.mode == "text":
        await _emit(ctx, m, pieces, 0)
    elif spec.mode == "step":
        await ctx.step("answer", lambda: _emit(ctx, m, pieces, 0))
    else:
        k = max(1, spec.per_step)
        for start in range(0, len(pieces), k):
            await ctx.step(
                "part", functools.partial(_emit, ctx, m, pieces[start : start + k], start)
            )


async def _nothing() -> None:
    return None


async def resume_agent(ctx: AgentContext) -> None:
    """Killed while it waits at the gate, then resumed: the replay emits the
    deltas again (each compared with the log's) and passes the step; the
    delta after it is the resumed run's first live event."""
    spec = msgspec.json.decode(ctx.input, type=ResumeSpec)
    await _emit(ctx, ctx.message_id(), deltas(spec.events), 0)
    await ctx.step("durable", _nothing)
    await ctx.text(ctx.message_id(), "live")
    gate = Path(spec.gate)
    while not await asyncio.to_thread(gate.exists):
        await asyncio.sleep(_GATE_POLL_S)
