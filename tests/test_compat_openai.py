"""OpenAI chat completion chunks with `extra.kind` (gateway/compat/openai.py).

The pure projection first (no servers): the exact chunks, and a cut after any
chunk resumed with the last `extra.seq` reassembling the log through the
SDK's own accumulator. Then the real `openai` SDK against real gateways and a
real worker.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import httpx2
import pytest
from openai import (
    APIConnectionError,
    APIError,
    AsyncOpenAI,
    AsyncStream,
    AuthenticationError,
    BadRequestError,
    DefaultAsyncHttpxClient,
    PermissionDeniedError,
)
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from gateway.compat.base import Context, Wire
from gateway.compat.openai import OpenAIChunks

from .gw import RunningGateway, eventually, running_gateway, session_with, write_run
from .proxy import CuttingProxy
from .workerkit import running_worker, stored, wait_event

RUN = "run_t"
T0 = 1_760_000_000_000  # ms: the run's start


def _run(*, error: bool = False) -> list[events.Event]:
    evs: list[events.Event] = [
        events.RunStart(trace_id="tr", model="scripted-demo", started_by="alice", input="hi"),
        events.ReasoningDelta(message_id="m1", delta="Let me "),
        events.ReasoningDelta(message_id="m1", delta="check."),
        events.TextDelta(message_id="m1", delta="Looking "),
        events.TextDelta(message_id="m1", delta="it up."),
        events.Status(code="tool_phase", summary="calling tools"),
        events.ToolCallStart(tool_call_id="c0", tool_name="save_note", risk_level="medium"),
        events.ToolCallStart(tool_call_id="c1", tool_name="search_docs"),
        events.ToolArgsDelta(tool_call_id="c0", partial_json='{"text":'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"query":'),
        events.ToolArgsDelta(tool_call_id="c0", partial_json='"n"}'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='"q"}'),
        events.ToolCallEnd(tool_call_id="c0"),
        events.ToolCallEnd(tool_call_id="c1"),
        events.ToolResult(tool_call_id="c0", status="ok", summary="saved"),
        events.Progress(label="searching", done=1, total=3),
        events.ToolResult(tool_call_id="c1", status="ok", summary="3 pages"),
        events.TextDelta(message_id="m2", delta="Sending."),
        events.ToolCallStart(tool_call_id="c2", tool_name="send_message", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="c2", partial_json='{"to":"t"}'),
        events.ToolCallEnd(tool_call_id="c2"),
        events.ApprovalRequired(
            approval_id="ap1", tool_call_id="c2", summary="send?", expires_at=T0 + 60_000
        ),
        events.ApprovalDecided(approval_id="ap1", decision="approve", decided_by="bob"),
        events.ToolResult(tool_call_id="c2", status="ok", summary="sent"),
        events.MessageReset(message_id="m2"),
        events.InterruptRequested(requested_by="alice", reason="enough"),
    ]
    if error:
        evs.append(events.RunError(code="model_unavailable", retryable=True, message="down"))
        evs.append(events.RunEnd(status="failed"))
    else:
        evs.append(events.TextDelta(message_id="m3", delta="Done."))
        usage = events.Usage(input_tokens=10, output_tokens=7, reasoning_tokens=2)
        evs.append(events.RunEnd(status="completed", usage=usage))
    for i, e in enumerate(evs, 1):
        e.run_id, e.session_id, e.seq, e.ts = RUN, "ses_t", i, T0 + i
    return evs


def _answer(evs: list[events.Event], after: int = 0, usage: bool = True) -> list[Wire]:
    """What the serving layer sends: track up to the cursor, start, feed the rest."""
    p = OpenAIChunks(Context(RUN, "ses_t", options={"include_usage": usage}))
    for e in evs[:after]:
        p.track(e)
    out = p.start()
    for e in evs[after:]:
        assert not p.done
        out.extend(p.feed(e))
    assert p.done
    return out


def _head(choices: list[Any], **more: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-run_t", "object": "chat.completion.chunk", "created": T0 // 1000,
            "model": "scripted-demo", "choices": choices, **more}  # fmt: skip


def _delta(**delta: Any) -> list[Any]:
    return [{"index": 0, "delta": delta, "finish_reason": None}]


def _x(kind: str, seq: int | None, **fields: Any) -> dict[str, Any]:
    tail = {} if seq is None else {"seq": seq}
    return {"extra": {"kind": kind, **fields, **tail, "run_id": RUN}}


def _tool(seq: int, status: str, id: str, name: str, **more: Any) -> dict[str, Any]:
    return _x("tool_call", seq, tool={"id": id, "name": name, "status": status, **more})


def _status(seq: int | None, **status: Any) -> dict[str, Any]:
    return _x("status", seq, status=status)


def test_the_exact_chunks_of_a_run() -> None:
    got = [json.loads(w.data) for w in _answer(_run())]
    calls = lambda **c: _delta(tool_calls=[c])  # noqa: E731
    assert got == [
        _head(_delta(role="assistant", content=""),
              **_status(1, code="run_start", trace_id="tr", model="scripted-demo",
                        started_by="alice")),
        _head(_delta(reasoning_content="Let me "), **_x("reasoning_text", 2, message_id="m1")),
        _head(_delta(reasoning_content="check."), **_x("reasoning_text", 3, message_id="m1")),
        _head(_delta(content="Looking "), **_x("assistant_text", 4, message_id="m1")),
        _head(_delta(content="it up."), **_x("assistant_text", 5, message_id="m1")),
        _head([], **_status(6, code="tool_phase", summary="calling tools")),
        _head(calls(index=0, id="c0", type="function",
                    function={"name": "save_note", "arguments": ""}),
              **_tool(7, "start", "c0", "save_note", risk_level="medium")),
        _head(calls(index=1, id="c1", type="function",
                    function={"name": "search_docs", "arguments": ""}),
              **_tool(8, "start", "c1", "search_docs", risk_level="low")),
        _head(calls(index=0, function={"arguments": '{"text":'}),
              **_tool(9, "arguments", "c0", "save_note")),
        _head(calls(index=1, function={"arguments": '{"query":'}),
              **_tool(10, "arguments", "c1", "search_docs")),
        _head(calls(index=0, function={"arguments": '"n"}'}),
              **_tool(11, "arguments", "c0", "save_note")),
        _head(calls(index=1, function={"arguments": '"q"}'}),
              **_tool(12, "arguments", "c1", "search_docs")),
        _head([], **_tool(13, "ready", "c0", "save_note", arguments='{"text":"n"}')),
        _head([], **_tool(14, "ready", "c1", "search_docs", arguments='{"query":"q"}')),
        _head([], **_x("tool_result", 15, tool={"id": "c0", "name": "save_note", "status": "ok",
                                                 "summary": "saved", "output": None})),
        _head([], **_status(16, code="progress", label="searching", done=1, total=3)),
        _head([], **_x("tool_result", 17, tool={"id": "c1", "name": "search_docs",
                                                 "status": "ok", "summary": "3 pages",
                                                 "output": None})),
        _head(_delta(content="Sending."), **_x("assistant_text", 18, message_id="m2")),
        _head(calls(index=2, id="c2", type="function",
                    function={"name": "send_message", "arguments": ""}),
              **_tool(19, "start", "c2", "send_message", risk_level="high")),
        _head(calls(index=2, function={"arguments": '{"to":"t"}'}),
              **_tool(20, "arguments", "c2", "send_message")),
        _head([], **_tool(21, "ready", "c2", "send_message", arguments='{"to":"t"}')),
        _head([], **_x("confirm_request", 22, confirm={
            "approval_id": "ap1", "tool_call_id": "c2", "tool_name": "send_message",
            "summary": "send?", "expires_at": T0 + 60_000,
            "decide": {"method": "POST", "path": "/v1/runs/run_t/approvals/ap1"}})),
        _head([], **_status(23, code="approval_decided", approval_id="ap1",
                            decision="approve", decided_by="bob", comment="")),
        _head([], **_x("tool_result", 24, tool={"id": "c2", "name": "send_message",
                                                 "status": "ok", "summary": "sent",
                                                 "output": None})),
        _head([], **_status(25, code="message_reset", message_id="m2")),
        _head([], **_status(26, code="interrupt_requested", requested_by="alice",
                            reason="enough")),
        _head(_delta(content="Done."), **_x("assistant_text", 27, message_id="m3")),
        _head([{"index": 0, "delta": {}, "finish_reason": "stop"}],
              **_status(None, code="run_end", run_status="completed")),
        _head([], usage={"prompt_tokens": 10, "completion_tokens": 7, "total_tokens": 17,
                         "completion_tokens_details": {"reasoning_tokens": 2}},
              **_status(28, code="usage")),
    ]  # fmt: skip


def test_a_delta_chunk_is_the_general_chunk_byte_for_byte() -> None:
    """A text or reasoning delta's chunk is built around its text and seq
    once per message (the replay's hot path): it must be what the general
    path encodes, for text and ids JSON escapes, seqs of any length, and
    both kinds in turn."""
    from gateway.compat import openai as chunks

    p = OpenAIChunks(Context(RUN, "ses_t"))
    p.feed(_run()[0])
    cases = [(events.TextDelta, "m1", "a", 9), (events.TextDelta, "m1", 'say "hi"\n', 10),
             (events.ReasoningDelta, "m1", "", 11), (events.TextDelta, 'm"2\\', "\u2028", 99999),
             (events.ReasoningDelta, 'm"2\\', "ok", 100000)]  # fmt: skip
    for typ, mid, text, seq in cases:
        ev = typ(message_id=mid, delta=text, seq=seq)
        kind, field = (("assistant_text", "content") if typ is events.TextDelta
                       else ("reasoning_text", "reasoning_content"))  # fmt: skip
        general = p._wire(chunks._delta(chunks.json({field: text})), kind,
                          {"message_id": mid}, seq)  # fmt: skip
        assert p.feed(ev) == [general]


def test_framing_only_the_last_chunk_of_an_event_carries_its_seq() -> None:
    wires = _answer(_run())
    assert all(b"\n" not in w.data and b"\r" not in w.data for w in wires)
    # Wire.seq and extra.seq agree, and each seq is on exactly one chunk.
    assert [w.seq for w in wires] == [json.loads(w.data)["extra"].get("seq") for w in wires]
    assert [w.seq for w in wires if w.seq is not None] == list(range(1, 29))
    assert (wires[-2].seq, wires[-1].seq) == (None, 28)
    # Every chunk is a valid ChatCompletionChunk, `extra` kept as it is.
    for w in wires:
        chunk = ChatCompletionChunk.model_validate_json(w.data)
        assert chunk.model_extra is not None
        assert chunk.model_extra["extra"] == json.loads(w.data)["extra"]


def test_without_include_usage_the_finish_chunk_is_the_last() -> None:
    wires = _answer(_run(), usage=False)
    last = json.loads(wires[-1].data)
    assert (wires[-1].seq, last["choices"][0]["finish_reason"], "usage" in last) == (
        28, "stop", False,
    )  # fmt: skip
    assert last["extra"] == {"kind": "status", "seq": 28, "run_id": RUN,
                             "status": {"code": "run_end", "run_status": "completed"}}  # fmt: skip


def test_a_run_error_is_an_error_frame_and_ends_the_answer() -> None:
    evs = _run(error=True)
    p = OpenAIChunks(Context(RUN, "ses_t"))
    p.start()
    for e in evs[:-2]:
        p.feed(e)
    assert not p.done
    [w] = p.feed(evs[-2])
    assert p.done
    assert (w.seq, json.loads(w.data)) == (27, {"error": {
        "message": "down", "type": "runlog_error", "code": "model_unavailable",
        "retryable": True, "seq": 27, "run_id": RUN}})  # fmt: skip


def test_a_resumed_answer_starts_with_what_is_open_and_resends_nothing() -> None:
    evs = _run()
    assert [json.loads(w.data) for w in _answer(evs, 9)[:2]] == [
        _head([], **_status(None, code="resume", after=9, open=[
            {"type": "tool", "id": "c0", "index": 0, "name": "save_note"},
            {"type": "tool", "id": "c1", "index": 1, "name": "search_docs"}])),
        _head(_delta(tool_calls=[{"index": 1, "function": {"arguments": '{"query":'}}]),
              **_tool(10, "arguments", "c1", "search_docs")),
    ]  # fmt: skip
    first = json.loads(_answer(evs, 4)[0].data)["extra"]["status"]
    assert first == {"code": "resume", "after": 4, "open": [{"type": "text", "id": "m1"}]}
    assert _answer(evs, 0)[0].seq == 1  # from the start: no resume chunk


def _assembled(chunks: list[bytes]) -> tuple[str, str, list[tuple[str, str, str]]]:
    """content, reasoning_content and tool calls as the SDK's accumulator has them."""
    state = ChatCompletionStreamState()
    for data in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate_json(data))
    final = state.get_final_completion()
    msg = final.choices[0].message
    calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
    return msg.content or "", msg.to_dict().get("reasoning_content", ""), calls  # type: ignore[return-value]


def _expected(evs: Sequence[events.Event]) -> tuple[str, str, list[tuple[str, str, str]]]:
    text = "".join(e.delta for e in evs if isinstance(e, events.TextDelta))
    thought = "".join(e.delta for e in evs if isinstance(e, events.ReasoningDelta))
    calls = {e.tool_call_id: [e.tool_name, ""] for e in evs if isinstance(e, events.ToolCallStart)}
    for e in evs:
        if isinstance(e, events.ToolArgsDelta):
            calls[e.tool_call_id][1] += e.partial_json
    return text, thought, [(k, n, a) for k, (n, a) in calls.items()]


def test_a_cut_after_any_chunk_resumed_from_the_last_seq_loses_and_doubles_nothing() -> None:
    evs = _run()
    full = _answer(evs)
    want = _expected(evs)
    assert want[0] == "Looking it up.Sending.Done."
    assert _assembled([w.data for w in full]) == want
    for k in range(len(full) + 1):
        seen = full[:k]  # the client got these, then the connection broke
        cursor = max([w.seq for w in seen if w.seq is not None], default=0)
        rest = _answer(evs, cursor) if cursor < len(evs) else []  # the end: nothing to resume
        assert _assembled([w.data for w in seen + rest]) == want, k
        got = [w.seq for w in seen + rest if w.seq is not None]
        assert got == list(range(1, len(evs) + 1)), k


# -- the real SDK (`openai`, max_retries=0) against real gateways and a real worker


class _Tap(httpx2.AsyncHTTPTransport):
    """The HTTP transport, keeping each response body as the SDK reads it
    (so a test sees the heartbeats and framing lines the SDK parsed)."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytearray] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        resp = await super().handle_async_request(request)
        body = bytearray()
        self.bodies.append(body)
        return httpx2.Response(resp.status_code, headers=resp.headers,
                               stream=_Recorded(resp.stream, body), extensions=resp.extensions)  # fmt: skip


class _Recorded(httpx2.AsyncByteStream):
    def __init__(self, inner: Any, into: bytearray) -> None:
        self.inner, self.into = inner, into

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for part in self.inner:
            self.into += part
            yield part

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def _sdk(base: str, token: str) -> AsyncIterator[tuple[AsyncOpenAI, _Tap]]:
    tap = _Tap()
    client = AsyncOpenAI(base_url=base, api_key=token, max_retries=0,
                         http_client=DefaultAsyncHttpxClient(transport=tap))  # fmt: skip
    try:
        yield client, tap
    finally:
        await client.close()


def _on_session(gw: RunningGateway, sid: str) -> str:
    return f"{gw.url}/v1/compat/openai/sessions/{sid}"


def _on_run(url: str, run_id: str) -> str:
    return f"{url}/v1/compat/openai/runs/{run_id}"


def _ask(text: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]


ASK = _ask("hello")  # what an attaching client sends: required by the SDK, ignored


class _Reader:
    """One client's view: the SDK's accumulator fed every chunk of every
    answer (a resumed answer appends to it), and every `extra` seen."""

    def __init__(self) -> None:
        self.state = ChatCompletionStreamState()
        self.extras: list[dict[str, Any]] = []

    @property
    def cursor(self) -> int:
        return max([x["seq"] for x in self.extras if "seq" in x], default=0)

    def take(self, chunk: ChatCompletionChunk) -> dict[str, Any]:
        self.state.handle_chunk(chunk)
        assert chunk.model_extra is not None
        x: dict[str, Any] = chunk.model_extra["extra"]
        self.extras.append(x)
        return x

    async def read(self, stream: AsyncStream[ChatCompletionChunk]) -> None:
        async for chunk in stream:
            self.take(chunk)

    def assembled(self) -> tuple[str, str, list[tuple[str, str, str]]]:
        msg = self.state.get_final_completion().choices[0].message
        calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
        return msg.content or "", msg.to_dict().get("reasoning_content", ""), calls  # type: ignore[return-value]

    def seqs(self) -> list[int]:
        return [x["seq"] for x in self.extras if "seq" in x]


async def _log(b: Broker, run_id: str) -> list[events.AnyEvent]:
    await wait_event(b, run_id, "run_end")
    return await stored(b, run_id)


def _assert_framing(body: bytes) -> None:
    """What the SDK's decoder survives: `data:` lines and comments, LF only;
    never an `id:` or `retry:` line."""
    assert b"\r" not in body
    fields = {line.split(b":", 1)[0] for line in body.split(b"\n") if line}
    assert fields <= {b"data", b""}, fields  # b"": a comment (": hb")


async def test_a_full_run_with_an_approval_decided_through_runlog_while_the_stream_waits(
    settings: Settings, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(
        settings, sse_heartbeat_s=0.2
    ) as gw:  # fmt: skip
        sid = await session_with(http, gw, "alice", bob="approver")
        reader = _Reader()
        decisions: list[int] = []

        async def decide(confirm: dict[str, Any], body: bytearray, at: int) -> None:
            # The stream stays open through the wait: heartbeats, then the decision.
            await eventually(lambda: body[at:].count(b": hb\n\n") >= 2, 30, "two heartbeats")
            assert confirm["decide"]["method"] == "POST"
            async with http.post(gw.url + confirm["decide"]["path"], json={"decision": "approve"},
                                 headers=gw.headers("bob")) as r:  # fmt: skip
                decisions.append(r.status)

        async with _sdk(_on_session(gw, sid), gw.token("alice")) as (client, tap):
            stream = await client.chat.completions.create(
                model="", messages=_ask("Tell me about approvals"), stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            run_id = stream.response.headers["x-runlog-run-id"]
            deciding: list[asyncio.Task[None]] = []
            async for chunk in stream:
                x = reader.take(chunk)
                if x["kind"] == "confirm_request":
                    body = tap.bodies[0]
                    deciding.append(asyncio.create_task(decide(x["confirm"], body, len(body))))
            await asyncio.gather(*deciding)
        log = await _log(b, run_id)
        assert decisions == [201]
        # reasoning_content is exactly the reasoning deltas: no status or tool text.
        assert reader.assembled() == _expected(log)
        assert reader.seqs() == list(range(1, len(log) + 1))
        _, thought, calls = reader.assembled()
        assert thought and [n for _, n, _ in calls] == ["search_docs", "send_message"]
        kinds = [x["kind"] for x in reader.extras]
        assert kinds.count("confirm_request") == 1 and kinds[-2:] == ["status", "status"]
        assert [x["status"]["code"] for x in reader.extras[-2:]] == ["run_end", "usage"]
        final = reader.state.get_final_completion()
        end = log[-1]
        assert isinstance(end, events.RunEnd) and end.usage is not None
        assert final.choices[0].finish_reason == "stop"
        assert final.usage is not None
        assert (final.usage.prompt_tokens, final.usage.completion_tokens) == (
            end.usage.input_tokens, end.usage.output_tokens,
        )  # fmt: skip
        assert final.id == f"chatcmpl-{run_id}" and final.model == "scripted-demo"
        decided = [x for x in reader.extras if x["kind"] == "status"
                   and x["status"]["code"] == "approval_decided"]  # fmt: skip
        assert [(d["status"]["decision"], d["status"]["decided_by"]) for d in decided] == [
            ("approve", "bob")
        ]
        [body] = tap.bodies
        _assert_framing(bytes(body))
        assert body.endswith(b"data: [DONE]\n\n")
        assert not [r for r in caplog.records if r.name.startswith("openai")
                    and r.levelno >= logging.WARNING]  # fmt: skip


async def test_a_cut_mid_tool_args_resumed_elsewhere_from_the_last_extra_seq(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings, scripted_tokens_per_s=20.0) as (b, _), \
            running_gateway(settings) as gw_a, running_gateway(settings) as gw_b:  # fmt: skip
        sid = await session_with(http, gw_a, "alice")
        proxy = CuttingProxy.in_front_of(gw_a.url)
        await proxy.start()
        reader = _Reader()
        try:
            url = f"http://127.0.0.1:{proxy.port}"
            async with _sdk(url + f"/v1/compat/openai/sessions/{sid}", gw_a.token("alice")) as (
                client, _,
            ):  # fmt: skip
                stream = await client.chat.completions.create(
                    model="", messages=_ask("no approval please"), stream=True
                )
                run_id = stream.response.headers["x-runlog-run-id"]
                with pytest.raises(APIConnectionError):
                    async for chunk in stream:
                        x = reader.take(chunk)
                        if x["kind"] == "tool_call" and x["tool"]["status"] == "arguments":
                            proxy.partition()  # mid tool args: the body is cut
        finally:
            await proxy.stop()
        cut_at, seen = reader.cursor, len(reader.extras)
        args_seen = [x for x in reader.extras if x["kind"] == "tool_call"]
        assert args_seen and args_seen[-1]["tool"]["status"] == "arguments"
        # Resume on the other gateway, the cursor in Last-Event-ID.
        async with _sdk(_on_run(gw_b.url, run_id), gw_b.token("alice")) as (client, _):
            stream = await client.chat.completions.create(
                model="", messages=ASK, stream=True,
                extra_headers={"Last-Event-ID": str(cut_at)},
            )  # fmt: skip
            await reader.read(stream)
        log = await _log(b, run_id)
        assert cut_at < len(log)
        end = log[-1]  # the cut did not stop the run
        assert isinstance(end, events.RunEnd) and end.status == "completed"
        resumed = reader.extras[seen]["status"]
        assert (resumed["code"], resumed["after"]) == ("resume", cut_at)
        assert reader.seqs() == list(range(1, len(log) + 1))  # nothing lost, nothing doubled
        assert reader.assembled() == _expected(log)


async def test_an_ended_run_through_the_sdk_stream_helper_and_every_cursor_channel(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings) as (b, _), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice", carol="viewer")
        run_id = await b.start_run(sid, "alice", input="no approval please")
        log = await _log(b, run_id)
        async with _sdk(_on_run(gw.url, run_id), gw.token("carol")) as (client, tap):
            async with client.chat.completions.stream(
                model="", messages=ASK, stream_options={"include_usage": True}
            ) as s:
                async for _ in s:
                    pass
                final = await s.get_final_completion()
            msg = final.choices[0].message
            calls = [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls or []]
            assert (msg.content, msg.to_dict()["reasoning_content"], calls) == _expected(log)
            assert final.choices[0].finish_reason == "stop" and final.usage is not None
            _assert_framing(bytes(tap.bodies[0]))
            # The cursor from each channel the SDK can send; the largest wins.
            firsts = []
            for header, query, body in (({"Last-Event-ID": "5"}, None, None),
                                        (None, {"after": 5}, None),
                                        (None, None, {"runlog": {"after": 5}}),
                                        (None, {"after": 2}, {"runlog": {"after": 5}})):  # fmt: skip
                r = _Reader()
                stream = await client.chat.completions.create(
                    model="", messages=ASK, stream=True, extra_headers=header, extra_query=query,
                    extra_body=body,
                )  # fmt: skip
                await r.read(stream)
                firsts.append((r.extras[0]["status"], r.seqs()[0], r.seqs()[-1]))
            resume = {"code": "resume", "after": 5, "open": firsts[0][0]["open"]}
            assert firsts == [(resume, 6, len(log))] * 4
            # From the end of an ended run: the terminal answer again.
            r = _Reader()
            await r.read(await client.chat.completions.create(
                model="", messages=ASK, stream=True, extra_query={"after": len(log)}))  # fmt: skip
            assert [x["status"]["code"] for x in r.extras] == ["resume", "run_end"]
            assert r.state.get_final_completion().choices[0].finish_reason == "stop"


async def test_a_stop_through_runlog_interrupt_ends_the_stream_with_the_partial_answer(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings, scripted_tokens_per_s=100.0) as (b, _), \
            running_gateway(settings) as gw:  # fmt: skip
        sid = await session_with(http, gw, "alice")
        reader = _Reader()
        async with _sdk(_on_session(gw, sid), gw.token("alice")) as (client, _):
            stream = await client.chat.completions.create(
                model="", messages=_ask("a long story"), stream=True
            )
            stopped: list[int] = []
            async for chunk in stream:
                x = reader.take(chunk)
                if x["kind"] == "assistant_text" and not stopped:
                    async with http.post(f"{gw.url}/v1/runs/{x['run_id']}/interrupt",
                                         json={"reason": "enough"},
                                         headers=gw.headers("alice")) as r:  # fmt: skip
                        stopped.append(r.status)
        run_id = reader.extras[0]["run_id"]
        log = await _log(b, run_id)
        assert stopped == [202]
        end = log[-1]
        assert isinstance(end, events.RunEnd) and end.status == "aborted"
        codes = [x["status"]["code"] for x in reader.extras if x["kind"] == "status"]
        assert codes[-2:] == ["interrupt_requested", "run_end"]
        assert reader.extras[-1]["status"]["run_status"] == "aborted"
        assert reader.extras[-1]["status"]["stop"]["requested_by"] == "alice"
        assert reader.state.get_final_completion().choices[0].finish_reason == "stop"
        assert reader.assembled() == _expected(log)
        assert 0 < len(reader.assembled()[0]) < 2000  # partial: the long answer was cut short


async def test_a_second_user_on_another_gateway_follows_the_same_run(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings, scripted_tokens_per_s=100.0) as (b, _), \
            running_gateway(settings) as gw_a, running_gateway(settings) as gw_b:  # fmt: skip
        sid = await session_with(http, gw_a, "alice", carol="viewer")
        alice, carol = _Reader(), _Reader()
        async with _sdk(_on_session(gw_a, sid), gw_a.token("alice")) as (ca, _):
            stream = await ca.chat.completions.create(
                model="", messages=_ask("no approval please"), stream=True
            )
            run_id = stream.response.headers["x-runlog-run-id"]
            async with _sdk(_on_run(gw_b.url, run_id), gw_b.token("carol")) as (cc, _):
                joined = await cc.chat.completions.create(model="", messages=ASK, stream=True)
                await asyncio.gather(alice.read(stream), carol.read(joined))
        log = await _log(b, run_id)
        assert alice.assembled() == carol.assembled() == _expected(log)
        assert alice.seqs() == carol.seqs() == list(range(1, len(log) + 1))


async def test_refusals_come_as_the_sdk_s_errors_and_start_nothing(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_worker(settings), running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice")
        async with _sdk(_on_session(gw, sid), gw.token("alice")) as (client, _):
            with pytest.raises(BadRequestError) as bad:
                await client.chat.completions.create(model="", messages=_ask("hi"))
            assert (bad.value.code, bad.value.status_code) == ("invalid_request", 400)
            with pytest.raises(BadRequestError) as bad:
                await client.chat.completions.create(
                    model="", messages=[{"role": "system", "content": "x"}], stream=True
                )
            assert bad.value.code == "invalid_request"
        async with http.get(f"{gw.url}/v1/sessions/{sid}", headers=gw.headers("alice")) as r:
            assert (await r.json())["runs"] == []
        async with _sdk(_on_session(gw, sid), gw.token("mallory")) as (client, _):
            with pytest.raises(PermissionDeniedError) as denied:
                await client.chat.completions.create(model="", messages=_ask("hi"), stream=True)
            assert denied.value.code == "not_a_member"
        async with _sdk(_on_session(gw, sid), "not-a-token") as (client, _):
            with pytest.raises(AuthenticationError):
                await client.chat.completions.create(model="", messages=_ask("hi"), stream=True)
        # A failed run: the error frame is the SDK's APIError, with runlog's code.
        async with _sdk(_on_session(gw, sid), gw.token("alice")) as (client, _):
            stream = await client.chat.completions.create(
                model="", messages=_ask("please fail model"), stream=True
            )
            reader = _Reader()
            with pytest.raises(APIError) as failed:
                await reader.read(stream)
        assert failed.value.code == "model_unavailable"
        assert isinstance(failed.value.body, dict)
        assert failed.value.body["seq"] == reader.cursor + 1


async def test_bad_requests_get_coded_errors_before_anything_starts(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as gw:
        sid = await session_with(http, gw, "alice")
        run_id, _ = await write_run(broker, sid, 3)
        new, join = _on_session(gw, sid) + "/chat/completions", _on_run(gw.url, run_id)
        join += "/chat/completions"
        user = [{"role": "user", "content": "hi"}]
        image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        rows: list[tuple[str, Any, dict[str, str], int, str]] = [
            (new, b"{not json", {}, 400, "invalid_request"),
            (new, {"stream": True, "messages": image}, {}, 400, "invalid_request"),
            (new, {"stream": True, "messages": [{"role": "user", "content": "a\u0000b"}]}, {},
             400, "invalid_request"),
            (new, {"stream": "yes", "messages": user}, {}, 400, "invalid_request"),
            (new, {"stream": True, "messages": user, "model": "gpt-x"}, {}, 400,
             "model_not_allowed"),
            (new, {"stream": True, "messages": "x" * (settings.max_message_bytes + 1)}, {},
             413, "payload_too_large"),
            (join, {"stream": True, "messages": [], "runlog": {"after": -1}}, {}, 400,
             "invalid_request"),
            (join, {"stream": True, "messages": [], "runlog": {"cursor": 1}}, {}, 400,
             "invalid_request"),
            (join, {"stream": True, "messages": []}, {"Last-Event-ID": "²"}, 400,
             "invalid_cursor"),
            (join + "?after=99", {"stream": True, "messages": []}, {}, 400, "invalid_cursor"),
        ]  # fmt: skip
        got = []
        for url, body, headers, _, _ in rows:
            kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
            async with http.post(url, headers={**gw.headers("alice"), **headers}, **kw) as r:
                got.append((r.status, (await r.json())["error"]["code"]))
        assert got == [(status, code) for *_, status, code in rows]
        async with http.get(f"{gw.url}/v1/sessions/{sid}", headers=gw.headers("alice")) as r:
            assert [run["run_id"] for run in (await r.json())["runs"]] == [run_id]
