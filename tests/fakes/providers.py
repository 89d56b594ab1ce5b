"""A fake model provider: a real local aiohttp server that plays scripts.

    async with FakeProvider() as provider:
        provider.push(openai_stream(text=["Hel", "lo"]))
        adapter = OpenAIAdapter(provider.url + "/v1", "sk-test", "gpt-4o")
        ...
        rec = provider.requests[0]          # what the adapter sent
        await rec.wait_closed()             # the client hung up mid-stream

Each request takes the next queued script (a list of steps) whatever its
path; with none queued it gets a 500. Response headers go out lazily, with
the first byte-producing step, so a script that starts with `Sleep` tests
the first-byte timeout. The provider notices a client that hangs up
mid-stream within about `poll_s` (it polls the transport while a step sleeps,
and a write to a closed socket fails), and records when: that is what
"stop means stop" tests assert on.

The builders (`openai_stream`, `anthropic_stream`, `slow_tokens`) render a
compact description into the vendors' wire format, field for field as the
real APIs send it (ids, envelopes, nulls, usage objects, pings, signatures).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from multidict import CIMultiDict

from workers.model import Usage

# -- script steps


@dataclass(frozen=True)
class SSE:
    """One SSE frame: `event:` (if given), one `data:` line per line, blank line."""

    data: str
    event: str | None = None


@dataclass(frozen=True)
class Raw:
    """Bytes written as they are (one write; split frames, bad framing, ...)."""

    data: bytes


@dataclass(frozen=True)
class Sleep:
    """Pause, watching for the client to hang up."""

    seconds: float


@dataclass(frozen=True)
class Respond:
    """A whole non-streaming response (an HTTP error, a JSON body); first step only."""

    status: int
    body: Any = None  # bytes/str sent as they are; anything else as JSON
    content_type: str = "application/json"
    headers: dict[str, str] | None = None


@dataclass(frozen=True)
class Disconnect:
    """Close the connection abruptly, without ending the response."""


Step = SSE | Raw | Sleep | Respond | Disconnect
Script = list[Step]


def frame(step: SSE) -> bytes:
    head = f"event: {step.event}\n" if step.event is not None else ""
    lines = "".join(f"data: {line}\n" for line in step.data.split("\n"))
    return (head + lines + "\n").encode()


def rechunk(script: Script, size: int, gap_s: float = 0.0) -> Script:
    """The same bytes cut every `size` bytes (mid-line, mid-UTF-8 sequence),
    with an optional pause between pieces so the client reads them apart."""
    out: Script = []
    pending = bytearray()

    def flush() -> None:
        for i in range(0, len(pending), size):
            if out and gap_s:
                out.append(Sleep(gap_s))
            out.append(Raw(bytes(pending[i : i + size])))
        pending.clear()

    for step in script:
        if isinstance(step, SSE):
            pending += frame(step)
        elif isinstance(step, Raw):
            pending += step.data
        else:
            flush()
            out.append(step)
    flush()
    return out


# -- the server


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: CIMultiDict[str]
    body: bytes
    peer: Any  # (host, port) of the client socket: equal ports mean a reused connection
    started_at: float  # loop.time()
    finished: bool = False  # the script ran to its end
    closed_at: float | None = None  # loop.time() the client was seen gone mid-stream
    _closed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def closed_by_client(self) -> bool:
        return self.closed_at is not None

    def mark_closed(self) -> None:
        if self.closed_at is None:
            self.closed_at = asyncio.get_running_loop().time()
            self._closed.set()

    async def wait_closed(self, timeout_s: float = 5.0) -> float:
        """loop.time() at which the provider saw the client hang up."""
        async with asyncio.timeout(timeout_s):
            await self._closed.wait()
        assert self.closed_at is not None
        return self.closed_at


class FakeProvider:
    def __init__(self, *, poll_s: float = 0.001) -> None:
        self._poll_s = poll_s
        self._scripts: collections.deque[Script] = collections.deque()
        self._runner: web.AppRunner | None = None
        self._stopping = False
        self._arrived = asyncio.Condition()
        self.requests: list[RecordedRequest] = []
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def push(self, *scripts: Script) -> None:
        self._scripts.extend(scripts)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # handler_cancellation: a client hang-up cancels the handler at once,
        # even in the middle of a step.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self._stopping = True  # sleeping scripts end at once
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeProvider:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def wait_requests(self, n: int = 1, timeout_s: float = 5.0) -> RecordedRequest:
        """The n-th request (1-based), once it has arrived."""
        async with asyncio.timeout(timeout_s), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= n)
        return self.requests[n - 1]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        rec = RecordedRequest(
            method=request.method,
            path=request.path,
            headers=CIMultiDict(request.headers),
            body=await request.read(),
            peer=request.transport.get_extra_info("peername") if request.transport else None,
            started_at=loop.time(),
        )
        async with self._arrived:
            self.requests.append(rec)
            self._arrived.notify_all()
        if not self._scripts:
            error = {"error": {"message": "FakeProvider: no script queued", "type": "fake"}}
            return web.json_response(error, status=500)
        script = self._scripts.popleft()
        resp: web.StreamResponse | None = None
        try:
            for step in script:
                if isinstance(step, Respond):
                    return _respond(step)
                if isinstance(step, Sleep):
                    if await self._sleep(request, step.seconds):
                        rec.mark_closed()
                        return resp or web.Response()
                    continue
                if isinstance(step, Disconnect):
                    if request.transport is not None:
                        request.transport.close()
                    return resp or web.Response()
                if resp is None:
                    resp = web.StreamResponse(
                        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
                    )
                    await resp.prepare(request)
                await resp.write(frame(step) if isinstance(step, SSE) else step.data)
            if resp is None:
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
            await resp.write_eof()
            rec.finished = True
            return resp
        except ConnectionError:  # a write found the socket closed
            rec.mark_closed()
            return resp or web.Response()
        except asyncio.CancelledError:
            if not self._stopping:
                rec.mark_closed()
            raise

    async def _sleep(self, request: web.Request, seconds: float) -> bool:
        """Sleep; True as soon as the client is gone."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while not self._stopping:
            transport = request.transport
            if transport is None or transport.is_closing():
                return True
            left = end - loop.time()
            if left <= 0:
                return False
            await asyncio.sleep(min(self._poll_s, left))
        return False


def _respond(step: Respond) -> web.Response:
    body = step.body
    if not isinstance(body, bytes | str):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    return web.Response(
        status=step.status, body=body, content_type=step.content_type, headers=step.headers
    )


# -- compact descriptions → vendor wire formats

DEFAULT_USAGE = Usage(input_tokens=25, output_tokens=17)


@dataclass(frozen=True)
class FakeToolCall:
    name: str
    arguments: str | Sequence[str]  # full JSON text (split in `pieces`), or the exact pieces
    id: str = ""  # "" → a vendor-looking id derived from the name and position
    pieces: int = 3

    def chunks(self) -> list[str]:
        if not isinstance(self.arguments, str):
            return list(self.arguments)
        text, n = self.arguments, max(1, self.pieces)
        # Even cuts land mid-key and mid-value, as real streams do.
        cuts = [len(text) * i // n for i in range(n + 1)]
        return [text[a:b] for a, b in itertools.pairwise(cuts) if b > a]

    @property
    def full_arguments(self) -> str:
        return "".join(self.chunks())


def _b62(seed: str, n: int) -> str:
    alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    digest = int.from_bytes(hashlib.sha256(seed.encode()).digest(), "big")
    out = []
    for _ in range(n):
        digest, r = divmod(digest, 62)
        out.append(alphabet[r])
    return "".join(out)


def tool_call_ids(
    vendor: Literal["openai", "anthropic"], calls: Sequence[FakeToolCall]
) -> list[str]:
    """The ids the builders put on the wire for `calls`."""
    prefix, n = ("call_", 24) if vendor == "openai" else ("toolu_01", 22)
    return [c.id or prefix + _b62(f"{vendor}:{i}:{c.name}", n) for i, c in enumerate(calls)]


def _pieces(value: str | Sequence[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _tool_steps(calls: Sequence[list[Step]], interleave: bool) -> list[Step]:
    """Each call's steps in turn, or round-robin when `interleave`."""
    if not interleave:
        return [s for c in calls for s in c]
    out: list[Step] = []
    for i in range(max((len(c) for c in calls), default=0)):
        out += [c[i] for c in calls if i < len(c)]
    return out


def openai_stream(
    *,
    text: str | Sequence[str] = (),
    reasoning: str | Sequence[str] = (),
    tool_calls: Sequence[FakeToolCall] = (),
    usage: Usage | None = DEFAULT_USAGE,
    finish_reason: str | None = None,  # default: "tool_calls" with calls, else "stop"
    model: str = "gpt-4o-2024-08-06",
    interleave: bool = False,  # parallel calls' chunks round-robin (vLLM-style)
    reasoning_field: str = "reasoning_content",  # or "reasoning" (OpenRouter, Ollama)
    omit_tool_ids: bool = False,
    done: bool = True,  # end with `data: [DONE]`
    pace_s: float = 0.0,  # pause before each content chunk
) -> Script:
    """A chat.completion.chunk stream as api.openai.com sends it with
    stream_options.include_usage: a role chunk, content chunks, a finish
    chunk, a usage chunk with empty choices, then [DONE]."""
    cid = "chatcmpl-" + _b62(f"{text}{reasoning}{tool_calls}", 29)
    created = int(time.time())

    def chunk(delta: dict[str, Any] | None, finish: str | None = None) -> SSE:
        choices = (
            []
            if delta is None
            else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        body = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": "fp_f33640a400",
            "choices": choices,
            "usage": None,
            "obfuscation": _b62(f"{cid}{delta}", 6),
        }
        return SSE(_dumps(body))

    def paced(step: SSE) -> list[Step]:
        return [Sleep(pace_s), step] if pace_s else [step]

    steps: Script = [chunk({"role": "assistant", "content": "", "refusal": None})]
    for piece in _pieces(reasoning):
        steps += paced(chunk({"content": None, reasoning_field: piece}))
    for piece in _pieces(text):
        steps += paced(chunk({"content": piece}))
    per_call: list[list[Step]] = []
    for i, (call, call_id) in enumerate(
        zip(tool_calls, tool_call_ids("openai", tool_calls), strict=True)
    ):
        head: dict[str, Any] = {"index": i, "id": call_id, "type": "function"}
        if omit_tool_ids:
            del head["id"]
        head["function"] = {"name": call.name, "arguments": ""}
        this = paced(chunk({"tool_calls": [head]}))
        for piece in call.chunks():
            this += paced(chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}))
        per_call.append(this)
    steps += _tool_steps(per_call, interleave)
    steps.append(chunk({}, finish_reason or ("tool_calls" if tool_calls else "stop")))
    if usage is not None:
        final = json.loads(chunk(None).data)
        final["usage"] = {
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.input_tokens + usage.output_tokens,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": usage.reasoning_tokens,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }
        steps.append(SSE(_dumps(final)))
    if done:
        steps.append(SSE("[DONE]"))
    return steps


def anthropic_stream(
    *,
    text: str | Sequence[str] = (),
    thinking: str | Sequence[str] = (),
    tool_calls: Sequence[FakeToolCall] = (),
    usage: Usage = DEFAULT_USAGE,
    cache_read_tokens: int = 0,  # reported apart from input_tokens, as Anthropic does
    stop_reason: str | None = None,  # default: "tool_use" with calls, else "end_turn"
    model: str = "claude-sonnet-4-5-20250929",
    interleave: bool = False,  # tool blocks open together, deltas round-robin (not real Anthropic)
    pace_s: float = 0.0,
) -> Script:
    """A Messages stream as api.anthropic.com sends it: message_start, a ping,
    one content block per kind (thinking with its signature, text, each
    tool_use), message_delta with stop_reason and usage, message_stop."""
    msg_id = "msg_01" + _b62(f"{text}{thinking}{tool_calls}", 22)

    def ev(kind: str, body: dict[str, Any]) -> SSE:
        return SSE(_dumps({"type": kind, **body}), event=kind)

    def paced(step: SSE) -> list[Step]:
        return [Sleep(pace_s), step] if pace_s else [step]

    in_usage = {
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cache_read_tokens,
    }
    steps: Script = [
        ev(
            "message_start",
            {
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {
                        **in_usage,
                        "cache_creation": {
                            "ephemeral_5m_input_tokens": 0,
                            "ephemeral_1h_input_tokens": 0,
                        },
                        "output_tokens": 1,
                        "service_tier": "standard",
                    },
                }
            },
        )
    ]
    index = 0
    pinged = False

    def block(start: dict[str, Any], deltas: list[dict[str, Any]]) -> list[Step]:
        nonlocal index, pinged
        i, index = index, index + 1
        out: list[Step] = [ev("content_block_start", {"index": i, "content_block": start})]
        if not pinged:  # the real API pings right after the first block opens
            out.append(SSE('{"type": "ping"}', event="ping"))
            pinged = True
        for d in deltas:
            out += paced(ev("content_block_delta", {"index": i, "delta": d}))
        out.append(ev("content_block_stop", {"index": i}))
        return out

    if thinking:
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _pieces(thinking)]
        deltas.append({"type": "signature_delta", "signature": "Eq" + _b62(msg_id, 40)})
        steps += block({"type": "thinking", "thinking": "", "signature": ""}, deltas)
    if text:
        deltas = [{"type": "text_delta", "text": p} for p in _pieces(text)]
        steps += block({"type": "text", "text": ""}, deltas)
    per_call: list[list[Step]] = []
    for call, call_id in zip(tool_calls, tool_call_ids("anthropic", tool_calls), strict=True):
        deltas = [{"type": "input_json_delta", "partial_json": ""}]
        deltas += [{"type": "input_json_delta", "partial_json": p} for p in call.chunks()]
        per_call.append(
            block({"type": "tool_use", "id": call_id, "name": call.name, "input": {}}, deltas)
        )
    if interleave:
        # Open every block first, then round-robin the deltas, then stop all.
        starts = [c[0] for c in per_call]
        stops = [c[-1] for c in per_call]
        middles = [
            [s for s in c[1:-1] if not (isinstance(s, SSE) and s.event == "ping")] for c in per_call
        ]
        pings = [s for c in per_call for s in c if isinstance(s, SSE) and s.event == "ping"]
        steps += starts + pings + _tool_steps(middles, True) + stops
    else:
        steps += _tool_steps(per_call, False)
    steps.append(
        ev(
            "message_delta",
            {
                "delta": {
                    "stop_reason": stop_reason or ("tool_use" if tool_calls else "end_turn"),
                    "stop_sequence": None,
                },
                "usage": {**in_usage, "output_tokens": usage.output_tokens},
            },
        )
    )
    steps.append(ev("message_stop", {}))
    return steps


def slow_tokens(
    vendor: Literal["openai", "anthropic"], n: int, rate_per_s: float, **kwargs: Any
) -> Script:
    """`n` text tokens "tok0 ", "tok1 ", ... at `rate_per_s`: for stop tests."""
    text = [f"tok{i} " for i in range(n)]
    build = openai_stream if vendor == "openai" else anthropic_stream
    return build(text=text, pace_s=1.0 / rate_per_s, **kwargs)
