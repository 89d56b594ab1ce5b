"""`scripted`: a deterministic demo agent, the default adapter of `runlog up`.

It needs no network and no key, yet streams like a real model: reasoning,
text, a low-risk tool call whose argument JSON arrives split across chunks,
then a high-risk tool call that needs approval, then a final answer that
depends on the approval's outcome. Tokens are paced at `tokens_per_s`
(0: as fast as possible).

The user's input steers it (case-insensitive whole words, first match wins):

| input | behaviour |
|---|---|
| starts with `echo:` | answers with the rest of the input verbatim (one space after the colon is the separator, not text); no tools |
| contains `fail model` | a few tokens, then a `model_unavailable` error |
| contains `stall` | a few tokens, then silence (for model timeouts) |
| contains `long` | a long text answer (2,000 tokens); no tools |
| contains `no tools` | reasoning and a short text answer; no tools |
| otherwise | search_docs → send_message (approval) → final answer |

Modifiers of the default script: `no approval` skips send_message; `note`
also calls save_note (medium risk, side effects) in the first turn, in
parallel with and before search_docs; `slow tool` makes search_docs take
`slow_tool_s` (the scripted_slow_tool_s setting, 10 s by default; 100 progress
steps).

Which turn it is comes from the conversation (the tool results so far), so
the script resumes correctly after a takeover.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator

import msgspec

from broker.models import SCRIPTED_MODEL
from workers.model import (
    Finish,
    FinishReason,
    ModelError,
    ModelItem,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolArgsChunk,
    ToolCallBegin,
    ToolCallDone,
    Usage,
)

_TOKEN_RE = re.compile(r"\S+\s*|\s+")
_PREAMBLE_RE = re.compile(
    r"^(please\s+)?(tell me (about|how)|what is|what's|explain|how (do|does|can) (i|we|you))\s+",
    re.IGNORECASE,
)
_LONG_WORDS = (
    "runlog keeps every event of a run in order, durable before it is visible, so a late "
    "joiner sees the same history as everyone else and a stop really stops the model. "
).split()


def tokens(text: str) -> list[str]:
    """Split text into word-sized tokens whose concatenation is `text`."""
    return _TOKEN_RE.findall(text)


def echo_text(user_input: str) -> str:
    """What `echo: <text>` answers: <text> as written. The one space after the
    colon separates the keyword from the text (`echo: hi` answers `hi`, not
    ` hi`); anything after it, leading spaces and newlines too, is the text."""
    rest = user_input[len("echo:") :]
    return rest[1:] if rest.startswith(" ") else rest


# Token times are rounded up to this grid, so that the turns of one adapter
# due in the same slot share one timer: at a model's pace (100 runs at 50
# tokens/s) a timer per token was ~9 % of a worker's CPU (cProfile), much of
# it the event loop's heap of timers (a Python `__lt__` per comparison).
_SLOT_S = 0.001


class _Ticks:
    """Sleeps until a loop time, one timer per slot for every sleeper in it."""

    def __init__(self) -> None:
        self._slots: dict[int, list[asyncio.Future[None]]] = {}

    def until(self, when: float) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        slot = math.ceil(when / _SLOT_S)
        sleepers = self._slots.get(slot)
        if sleepers is None:
            sleepers = self._slots[slot] = []
            loop.call_at(slot * _SLOT_S, self._wake, slot)
        # One future per sleeper, not one shared: a cancelled turn cancels
        # only its own.
        sleepers.append(fut)
        return fut

    def _wake(self, slot: int) -> None:
        for fut in self._slots.pop(slot):
            if not fut.done():
                fut.set_result(None)


class _Pacer:
    def __init__(self, tokens_per_s: float, ticks: _Ticks) -> None:
        self._interval = 1.0 / tokens_per_s if tokens_per_s > 0 else 0.0
        self._ticks = ticks
        self._next: float | None = None  # loop time of the next token
        self._n = 0

    async def tick(self) -> None:
        self._n += 1
        if self._interval == 0.0:
            if self._n % 64 == 0:
                await asyncio.sleep(0)  # let other runs breathe
            return
        now = asyncio.get_running_loop().time()
        self._next = (now if self._next is None else self._next) + self._interval
        if self._next > now:
            await self._ticks.until(self._next)
        elif self._next < now - 1.0:
            self._next = now  # far behind (a pause): do not burst


class ScriptedAdapter:
    name = "scripted"
    model = SCRIPTED_MODEL

    def __init__(self, tokens_per_s: float = 50.0, slow_tool_s: float = 10.0) -> None:
        self.tokens_per_s = tokens_per_s
        self.slow_tool_s = slow_tool_s
        self._ticks = _Ticks()

    async def aclose(self) -> None:
        return None

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelItem]:
        # The turn's generator itself: no generator in between per token.
        return _Turn(request, _Pacer(self.tokens_per_s, self._ticks), self.slow_tool_s).play()


class _Turn:
    def __init__(self, request: ModelRequest, pacer: _Pacer, slow_tool_s: float = 10.0) -> None:
        self.pacer = pacer
        self.slow_tool_s = slow_tool_s
        user = [m.content for m in request.messages if m.role == "user"]
        self.input = user[0] if user else ""
        self.lower = self.input.lower()
        self.tool_msgs = [m for m in request.messages if m.role == "tool"]
        self.turn = 1 + sum(1 for m in request.messages if m.role == "assistant")
        self.input_tokens = sum(len(tokens(m.content)) for m in request.messages)
        self.output_tokens = 0
        self.reasoning_tokens = 0
        topic = _PREAMBLE_RE.sub("", " ".join(self.input.split()))[:40].strip(" .?!")
        self.topic = topic or "runlog"

    def _has(self, keyword: str) -> bool:
        return re.search(rf"\b{keyword}\b", self.lower) is not None

    async def play(self) -> AsyncIterator[ModelItem]:
        if self.input.startswith("echo:"):
            async for item in self._text(echo_text(self.input)):
                yield item
            yield self._finish("stop")
            return
        if self._has("fail model"):
            async for item in self._text("Let me think about"):
                yield item
            raise ModelError("model_unavailable", "the scripted model failed", retryable=True)
        if self._has("stall"):
            async for item in self._text("Thinking about"):
                yield item
            await asyncio.sleep(3600)
        if self._has("long"):
            words = [_LONG_WORDS[i % len(_LONG_WORDS)] for i in range(2000)]
            async for item in self._text(" ".join(words)):
                yield item
            yield self._finish("stop")
            return
        if self._has("no tools"):
            async for item in self._reasoning(
                f"The user asks about {self.topic}. No tools are needed; a short answer will do."
            ):
                yield item
            async for item in self._text(self._answer()):
                yield item
            yield self._finish("stop")
            return
        async for item in self._default():
            yield item

    async def _default(self) -> AsyncIterator[ModelItem]:
        names = [m.name for m in self.tool_msgs]
        if not names:
            async for item in self._first_turn():
                yield item
        elif names[-1] != "send_message" and not self._has("no approval"):
            async for item in self._reasoning(
                "The search found three relevant pages. Sending a summary to the team is an "
                "outside action, so it needs someone's approval."
            ):
                yield item
            async for item in self._text(
                "I found three relevant pages. I'll send a short summary to the team."
            ):
                yield item
            args: dict[str, object] = {
                "to": "team@example.com",
                "text": f"Summary of what I found on {self.topic}.",
            }
            async for item in self._calls([("send_message", args)]):
                yield item
            yield self._finish("tool_calls")
        else:
            last = self.tool_msgs[-1].content if names[-1] == "send_message" else ""
            if last.startswith("denied"):
                opening = "Understood: I did not send the message. "
            elif last.startswith("skipped"):
                opening = "Nobody approved in time, so I did not send the message. "
            elif names[-1] == "send_message":
                opening = "Done: the summary was sent to the team. "
            else:
                opening = ""
            async for item in self._text(opening + self._answer()):
                yield item
            yield self._finish("stop")

    async def _first_turn(self) -> AsyncIterator[ModelItem]:
        async for item in self._reasoning(
            f"The user wants to know about {self.topic}. I should check the documentation "
            "before answering, rather than guess."
        ):
            yield item
        async for item in self._text("Let me look that up in the docs."):
            yield item
        search: dict[str, object] = {"query": self.topic, "steps": 3, "delay_ms": 50}
        if self._has("slow tool"):
            delay_ms = max(0, round(self.slow_tool_s * 1000 / 100))
            search = {"query": self.topic, "steps": 100, "delay_ms": delay_ms}
        calls: list[tuple[str, dict[str, object]]] = [("search_docs", search)]
        if self._has("note"):
            calls.insert(0, ("save_note", {"text": f"Looking into {self.topic}."}))
        async for item in self._calls(calls):
            yield item
        yield self._finish("tool_calls")

    def _answer(self) -> str:
        return (
            f"Here is what I know about {self.topic}: it streams events in order, keeps them "
            "durable, and lets anyone in the session watch, stop or approve."
        )

    async def _text(self, text: str) -> AsyncIterator[ModelItem]:
        for tok in tokens(text):
            await self.pacer.tick()
            self.output_tokens += 1
            yield TextChunk(text=tok)

    async def _reasoning(self, text: str) -> AsyncIterator[ModelItem]:
        for tok in tokens(text):
            await self.pacer.tick()
            self.reasoning_tokens += 1
            yield ReasoningChunk(text=tok)

    async def _calls(self, calls: list[tuple[str, dict[str, object]]]) -> AsyncIterator[ModelItem]:
        """Parallel calls: begin all, interleave their argument chunks, end all."""
        ids = [f"call_{self.turn}_{k}" for k in range(len(calls))]
        parts: list[list[str]] = []
        for call_id, (name, args) in zip(ids, calls, strict=True):
            yield ToolCallBegin(id=call_id, name=name)
            raw = msgspec.json.encode(args).decode()
            parts.append([raw[i : i + 7] for i in range(0, len(raw), 7)])
        for i in range(max(len(p) for p in parts)):
            for call_id, chunks in zip(ids, parts, strict=True):
                if i < len(chunks):
                    await self.pacer.tick()
                    self.output_tokens += 1
                    yield ToolArgsChunk(id=call_id, json=chunks[i])
        for call_id in ids:
            yield ToolCallDone(id=call_id)

    def _finish(self, reason: FinishReason) -> Finish:
        usage = Usage(
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens + self.reasoning_tokens,
            reasoning_tokens=self.reasoning_tokens,
        )
        return Finish(reason=reason, usage=usage)
