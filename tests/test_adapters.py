"""Model adapters against a real local fake provider (no HTTP mocks), plus the
pure cores (SSE parser, chunk decoders) under hypothesis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.adapters.anthropic import AnthropicAdapter, EventDecoder
from workers.adapters.openai import ChunkDecoder, OpenAIAdapter
from workers.adapters.sse import SSEEvent, SSEParser
from workers.model import (
    Finish,
    Message,
    ModelError,
    ModelItem,
    ModelRequest,
    ReasoningChunk,
    TextChunk,
    ToolArgsChunk,
    ToolCall,
    ToolCallBegin,
    ToolCallDone,
    ToolSpec,
    Usage,
)

from .fakes.providers import (
    SSE,
    Disconnect,
    FakeProvider,
    FakeToolCall,
    Raw,
    Respond,
    Script,
    Sleep,
    anthropic_stream,
    openai_stream,
    rechunk,
    slow_tokens,
    tool_call_ids,
)

Vendor = Literal["openai", "anthropic"]
VENDORS: list[Vendor] = ["openai", "anthropic"]
KEY = "sk-test-0123456789abcdef"
REQUEST = ModelRequest(messages=[Message(role="user", content="hi")])
FAST = settings(max_examples=300, deadline=None, database=None)

WEATHER = FakeToolCall("get_weather", '{"city": "Paris", "unit": "celsius"}', pieces=4)
TIME = FakeToolCall("get_time", '{"tz": "Europe/Paris"}', pieces=3)


# -- helpers


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[FakeProvider]:
    async with FakeProvider() as p:
        yield p


Adapter = OpenAIAdapter | AnthropicAdapter
MakeAdapter = Callable[..., Adapter]


@pytest_asyncio.fixture
async def make(provider: FakeProvider) -> AsyncIterator[MakeAdapter]:
    made: list[Adapter] = []

    def build(vendor: Vendor, url: str | None = None, **kw: Any) -> Adapter:
        base = url or provider.url
        adapter: Adapter
        if vendor == "openai":
            adapter = OpenAIAdapter(base + "/v1", KEY, "gpt-4o", **kw)
        else:
            adapter = AnthropicAdapter(base, KEY, "claude-sonnet-4-5", **kw)
        made.append(adapter)
        return adapter

    yield build
    for a in made:
        await a.aclose()


def stream_for(vendor: Vendor, **kw: Any) -> Script:
    if vendor == "openai":
        return openai_stream(**kw)
    if "reasoning" in kw:
        kw["thinking"] = kw.pop("reasoning")
    return anthropic_stream(**kw)


async def collect(adapter: Adapter, request: ModelRequest = REQUEST) -> list[ModelItem]:
    async with aclosing(adapter.stream(request)) as items:
        return [item async for item in items]


async def failure(adapter: Adapter, request: ModelRequest = REQUEST) -> ModelError:
    with pytest.raises(ModelError) as info:
        await collect(adapter, request)
    return info.value


@dataclass
class Summary:
    text: str = ""
    reasoning: str = ""
    calls: dict[str, tuple[str, str]] = field(default_factory=dict)  # id → (name, args)
    arg_pieces: dict[str, list[str]] = field(default_factory=dict)
    finish: Finish | None = None


def check_contract(items: Sequence[ModelItem]) -> Summary:
    """The `workers.model` contract, asserted; returns the stream condensed."""
    s = Summary()
    open_calls: set[str] = set()
    done: set[str] = set()
    for i, item in enumerate(items):
        assert s.finish is None, f"item after Finish: {item}"
        match item:
            case TextChunk(text=t):
                assert t
                s.text += t
            case ReasoningChunk(text=t):
                assert t
                s.reasoning += t
            case ToolCallBegin(id=cid, name=name):
                assert cid and name and cid not in s.calls, item
                s.calls[cid] = (name, "")
                s.arg_pieces[cid] = []
                open_calls.add(cid)
            case ToolArgsChunk(id=cid, json=piece):
                assert cid in open_calls, item
                name, args = s.calls[cid]
                s.calls[cid] = (name, args + piece)
                s.arg_pieces[cid].append(piece)
            case ToolCallDone(id=cid):
                assert cid in open_calls, item
                open_calls.remove(cid)
                done.add(cid)
            case Finish():
                assert i == len(items) - 1
                s.finish = item
    assert s.finish is not None, "no Finish"
    assert not open_calls, f"calls never done: {open_calls}"
    return s


# -- SSE parser (pure)


def test_sse_fields_comments_and_multiline_data() -> None:
    p = SSEParser()
    stream = (
        b": keep-alive\n"
        b"event: delta\ndata: one\ndata:two\ndata\n\n"
        b'id: 7\nretry: 100\nunknown: x\ndata: {"a": 1}\n\n'
        b"\n\n"  # blank lines alone dispatch nothing
        b"data: last\n\n"
    )
    assert p.feed(stream) == [
        SSEEvent("delta", "one\ntwo\n", ""),
        SSEEvent("message", '{"a": 1}', "7"),
        SSEEvent("message", "last", "7"),
    ]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_sse_line_endings(eol: bytes) -> None:
    stream = eol.join([b"\xef\xbb\xbfevent: e", b"data: a", b"data: b", b"", b"data: c", b"", b""])
    expected = [SSEEvent("e", "a\nb", ""), SSEEvent("message", "c", "")]
    assert SSEParser().feed(stream) == expected
    one_by_one = SSEParser()
    events = [e for i in range(len(stream)) for e in one_by_one.feed(stream[i : i + 1])]
    assert events == expected


def test_sse_crlf_split_across_chunks_is_one_line_end() -> None:
    p = SSEParser()
    events = []
    for chunk in (b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n", b"data: c\r\n\r\n"):
        events += p.feed(chunk)
    assert events == [SSEEvent("message", "a\nb", ""), SSEEvent("message", "c", "")]


def test_sse_utf8_split_mid_character() -> None:
    data = "data: héllo 世界 🎉\n\n".encode()
    p = SSEParser()
    events = [e for i in range(len(data)) for e in p.feed(data[i : i + 1])]
    assert events == [SSEEvent("message", "héllo 世界 🎉", "")]


def test_sse_finish_keeps_complete_lines_drops_a_cut_one() -> None:
    p = SSEParser()
    assert p.feed(b"data: [DONE]\n") == []
    assert p.finish() == [SSEEvent("message", "[DONE]", "")]
    p = SSEParser()
    assert p.feed(b'data: {"a":1}\n\ndata: {"cut') == [SSEEvent("message", '{"a":1}', "")]
    assert p.finish() == []


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: " + b"x" * 200],  # a partial line, too long already
        [b"data: " + b"x" * 100, b"x" * 100],  # grown across chunks
        [b"data: " + b"x" * 200 + b"\n\n"],  # a complete line
        [b"data: " + b"x" * 40 + b"\n"] * 5,  # many lines of one event
    ],
)
def test_sse_size_limits(chunks: list[bytes]) -> None:
    p = SSEParser(max_event_bytes=128)
    with pytest.raises(ModelError) as info:
        for c in chunks:
            p.feed(c)
    assert info.value.code == "model_malformed" and info.value.retryable


@FAST
@given(st.lists(st.binary(max_size=64), max_size=20))
def test_sse_parser_arbitrary_bytes_raise_only_model_error(chunks: list[bytes]) -> None:
    p = SSEParser(max_event_bytes=48)
    try:
        for c in chunks:
            for ev in p.feed(c):
                assert isinstance(ev.data, str) and isinstance(ev.event, str)
        p.finish()
    except ModelError as e:
        assert e.code == "model_malformed"


_sse_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]))


@FAST
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["", "delta", "ping"]), st.lists(_sse_text, min_size=1, max_size=3)
        ),
        max_size=6,
    ),
    st.sampled_from(["\n", "\r\n", "\r"]),
    st.lists(st.integers(min_value=0, max_value=400), max_size=10),
)
def test_sse_any_split_gives_the_same_events(
    frames: list[tuple[str, list[str]]], eol: str, cuts: list[int]
) -> None:
    text = ""
    for event, lines in frames:
        text += f"event: {event}{eol}" if event else ""
        text += "".join(f"data: {line}{eol}" for line in lines) + eol
    data = text.encode()
    expected = [SSEEvent(e or "message", "\n".join(lines), "") for e, lines in frames]
    assert SSEParser().feed(data) == expected
    p, events, start = SSEParser(), [], 0
    for cut in [*sorted({min(c, len(data)) for c in cuts}), len(data)]:
        events += p.feed(data[start:cut])
        start = cut
    assert events + p.finish() == expected


# -- chunk decoders (pure), under arbitrary input

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


def _weighted(*choices: tuple[int, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    """One of `choices`, picked in proportion to its weight."""
    table = [s for weight, s in choices for _ in range(weight)]
    return st.integers(0, len(table) - 1).flatmap(lambda i: table[i])


Maybe = Callable[[st.SearchStrategy[Any]], st.SearchStrategy[Any]]


def _nullable(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return _weighted((4, strategy), (1, st.none()))


def _noisy(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return _weighted((4, strategy), (1, st.none()), (1, _json))


# Each structure comes clean (well-typed, to reach deep paths) or noisy (any
# field may hold any JSON): mostly clean, so whole valid streams are common.


def _obj(maybe: Maybe, fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    # Clean objects have every field (null stands for absent); noisy ones drop any.
    if maybe is _noisy:
        return st.fixed_dictionaries({}, optional=fields)
    return st.fixed_dictionaries(fields)


def _oai_chunk(maybe: Maybe) -> st.SearchStrategy[Any]:
    name = st.sampled_from(["f", "g", ""] if maybe is _noisy else ["f", "g"])
    function = _obj(maybe, {"name": maybe(name), "arguments": maybe(st.text(max_size=6))})
    tool = _obj(
        maybe,
        {
            "index": maybe(st.integers(min_value=-1, max_value=2)),
            "id": maybe(st.sampled_from(["a", "b", "call_1", ""])),
            "function": maybe(function),
        },
    )
    text = maybe(_weighted((1, st.none()), (1, st.text(max_size=6))))
    delta = _obj(
        maybe,
        {
            "content": text,
            "reasoning_content": text,
            "reasoning": _weighted((3, st.none()), (1, _json)),
            "refusal": _weighted((5, st.none()), (1, text)),
            "tool_calls": maybe(st.lists(tool, max_size=3)),
        },
    )
    reason = _weighted((5, st.none()), (1, st.sampled_from(["stop", "tool_calls", "length", "x"])))
    choice = _obj(
        maybe,
        {
            "index": maybe(st.integers(min_value=0, max_value=1)),
            "delta": maybe(delta),
            "finish_reason": maybe(reason),
        },
    )
    usage = _obj(
        maybe,
        {
            "prompt_tokens": maybe(st.integers(0, 10**6)),
            "completion_tokens": maybe(st.integers(0, 10**6)),
        },
    )
    return _obj(maybe, {"choices": maybe(st.lists(choice, max_size=2)), "usage": maybe(usage)})


_oai_finish = st.sampled_from(["stop", "tool_calls", "length", "x"]).map(
    lambda r: json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": r}]})
)
_oai_data = _weighted(
    (40, _oai_chunk(_nullable).map(json.dumps)),
    (2, _oai_chunk(_noisy).map(json.dumps)),
    (1, _oai_finish),
    (1, st.fixed_dictionaries({"error": _json}).map(json.dumps)),
    (1, st.text(max_size=20)),
    (1, st.just("[DONE]")),
)
_oai_event = st.tuples(_weighted((30, st.just("message")), (1, st.just("error"))), _oai_data)
# Mostly stream-shaped: chunks, then maybe a finish chunk and [DONE].
_oai_stream = st.tuples(
    st.lists(_oai_event, max_size=10),
    st.sampled_from([("F", "[DONE]"), ("F",), ("[DONE]",), ()]),
    _oai_finish,
).map(lambda t: t[0] + [("message", t[2] if e == "F" else e) for e in t[1]])


@FAST
@given(_oai_stream)
def test_openai_decoder_any_chunks_give_model_error_or_a_valid_stream(
    events: list[tuple[str, str]],
) -> None:
    decoder = ChunkDecoder(id_prefix="x")
    items: list[ModelItem] = []
    try:
        for event, data in events:
            items += decoder.feed(data, event)
            if decoder.done:
                break
        items += decoder.end()
    except ModelError:
        return
    check_contract(items)


def _ant(kind: str, body: st.SearchStrategy[Any]) -> st.SearchStrategy[tuple[str, str]]:
    return body.map(lambda b: (kind, json.dumps({"type": kind, **b})))


def _ant_event(maybe: Maybe) -> st.SearchStrategy[tuple[str, str]]:
    block = st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "thinking", "tool_use", "server_tool_use", "new"])},
        optional={
            "id": maybe(st.sampled_from(["t1", "t2", ""])),
            "name": maybe(st.sampled_from(["f", "g", ""] if maybe is _noisy else ["f", "g"])),
            "text": maybe(st.text(max_size=4)),
            "thinking": maybe(st.text(max_size=4)),
        },
    )
    kinds = ["text_delta", "thinking_delta", "input_json_delta", "signature_delta", "new"]
    delta = st.fixed_dictionaries(
        {"type": st.sampled_from(kinds)},
        optional={
            "text": maybe(st.text(max_size=4)),
            "thinking": maybe(st.text(max_size=4)),
            "partial_json": maybe(st.text(max_size=4)),
        },
    )
    index = st.integers(min_value=0, max_value=2)
    if maybe is _noisy:
        index = maybe(index)
    stop = st.fixed_dictionaries({"stop_reason": maybe(st.sampled_from(["end_turn", "tool_use"]))})
    usage = st.fixed_dictionaries({"output_tokens": maybe(st.integers(0, 10**6))})
    return _weighted(
        (
            3,
            _ant(
                "content_block_start",
                st.fixed_dictionaries({"index": index, "content_block": block}),
            ),
        ),
        (5, _ant("content_block_delta", st.fixed_dictionaries({"index": index, "delta": delta}))),
        (2, _ant("content_block_stop", st.fixed_dictionaries({"index": index}))),
        (
            1,
            _ant(
                "message_delta",
                st.fixed_dictionaries({"delta": maybe(stop), "usage": maybe(usage)}),
            ),
        ),
    )


_ant_any = _weighted(
    (40, _ant_event(_nullable)),
    (2, _ant_event(_noisy)),
    (1, st.just(("message_stop", '{"type": "message_stop"}'))),
    (
        1,
        st.tuples(
            st.sampled_from(
                ["message_start", "ping", "error", "new", "message", "content_block_delta"]
            ),
            _weighted((3, _json.map(json.dumps)), (1, st.text(max_size=20))),
        ),
    ),
)
_ant_end = [
    ("message_delta", '{"type": "message_delta", "delta": {"stop_reason": "end_turn"}}'),
    ("message_stop", '{"type": "message_stop"}'),
]
# Mostly stream-shaped: events, then maybe the closing pair.
_ant_stream = st.tuples(st.lists(_ant_any, max_size=12), st.sampled_from([2, 1, 0])).map(
    lambda t: t[0] + _ant_end[: t[1]]
)


@FAST
@given(_ant_stream)
def test_anthropic_decoder_any_events_give_model_error_or_a_valid_stream(
    events: list[tuple[str, str]],
) -> None:
    decoder = EventDecoder(id_prefix="x")
    items: list[ModelItem] = []
    try:
        for event, data in events:
            items += decoder.feed(event, data)
            if decoder.done:
                break
        items += decoder.end()
    except ModelError:
        return
    check_contract(items)


# -- OpenAI over HTTP


async def test_openai_text_exact(provider: FakeProvider, make: MakeAdapter) -> None:
    provider.push(
        openai_stream(text=["Hel", "lo", " wörld"], usage=Usage(input_tokens=9, output_tokens=3))
    )
    items = await collect(make("openai"))
    assert items == [
        TextChunk(text="Hel"),
        TextChunk(text="lo"),
        TextChunk(text=" wörld"),
        Finish(reason="stop", usage=Usage(input_tokens=9, output_tokens=3)),
    ]


@pytest.mark.parametrize("field_name", ["reasoning_content", "reasoning"])
async def test_openai_reasoning_text_and_a_tool_call_exact(
    provider: FakeProvider, make: MakeAdapter, field_name: str
) -> None:
    call = FakeToolCall("get_weather", ['{"ci', 'ty": "Par', 'is"}'], id="call_abc")
    usage = Usage(input_tokens=30, output_tokens=20, reasoning_tokens=12)
    provider.push(
        openai_stream(
            reasoning=["Think", "ing"],
            text=["Sure"],
            tool_calls=[call],
            usage=usage,
            reasoning_field=field_name,
        )
    )
    assert await collect(make("openai")) == [
        ReasoningChunk(text="Think"),
        ReasoningChunk(text="ing"),
        TextChunk(text="Sure"),
        ToolCallBegin(id="call_abc", name="get_weather"),
        ToolArgsChunk(id="call_abc", json='{"ci'),
        ToolArgsChunk(id="call_abc", json='ty": "Par'),
        ToolArgsChunk(id="call_abc", json='is"}'),
        ToolCallDone(id="call_abc"),
        Finish(reason="tool_calls", usage=usage),
    ]


@pytest.mark.parametrize("interleave", [False, True])
async def test_openai_parallel_tool_calls(
    provider: FakeProvider, make: MakeAdapter, interleave: bool
) -> None:
    provider.push(
        openai_stream(text="Checking.", tool_calls=[WEATHER, TIME], interleave=interleave)
    )
    items = await collect(make("openai"))
    s = check_contract(items)
    ids = tool_call_ids("openai", [WEATHER, TIME])
    assert s.calls == {
        ids[0]: ("get_weather", WEATHER.full_arguments),
        ids[1]: ("get_time", TIME.full_arguments),
    }
    assert s.arg_pieces == {ids[0]: WEATHER.chunks(), ids[1]: TIME.chunks()}
    assert len(WEATHER.chunks()) == 4  # split mid-token
    assert s.text == "Checking."
    assert s.finish == Finish(reason="tool_calls", usage=Usage(input_tokens=25, output_tokens=17))
    second_begins = items.index(ToolCallBegin(id=ids[1], name="get_time"))
    first_args_end = max(
        i for i, it in enumerate(items) if it == ToolArgsChunk(id=ids[0], json=WEATHER.chunks()[-1])
    )
    assert (second_begins < first_args_end) == interleave


async def test_openai_missing_ids_get_stable_unique_ones(
    provider: FakeProvider, make: MakeAdapter
) -> None:
    provider.push(openai_stream(tool_calls=[WEATHER, TIME], omit_tool_ids=True, interleave=True))
    s = check_contract(await collect(make("openai")))
    assert len(s.calls) == 2
    assert all(cid.startswith("call_") for cid in s.calls)
    assert sorted(name for name, _ in s.calls.values()) == ["get_time", "get_weather"]
    assert {args for _, args in s.calls.values()} == {WEATHER.full_arguments, TIME.full_arguments}


async def test_openai_calls_in_one_chunk_without_index_or_arguments(
    provider: FakeProvider, make: MakeAdapter
) -> None:
    # Gemini-style: whole calls in one delta, no `index`, finish_reason "stop".
    chunk = {
        "choices": [
            {
                "delta": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "a",
                            "type": "function",
                            "function": {"name": "f", "arguments": '{"x":1}'},
                        },
                        {"id": "b", "type": "function", "function": {"name": "g"}},
                    ],
                },
                "finish_reason": "stop",
            }
        ]
    }
    provider.push([SSE(json.dumps(chunk)), SSE("[DONE]")])
    assert await collect(make("openai")) == [
        ToolCallBegin(id="a", name="f"),
        ToolArgsChunk(id="a", json='{"x":1}'),
        ToolCallBegin(id="b", name="g"),
        ToolCallDone(id="a"),
        ToolArgsChunk(id="b", json="{}"),  # no arguments → "{}"
        ToolCallDone(id="b"),
        Finish(reason="tool_calls", usage=Usage()),
    ]


async def test_openai_unknown_fields_comments_and_extra_choices_ignored(
    provider: FakeProvider, make: MakeAdapter
) -> None:
    odd = {
        "id": "x",
        "x_future": {"nested": [1, 2]},
        "choices": [
            {"index": 1, "delta": {"content": "other choice"}},
            {
                "index": 0,
                "delta": {"content": "ok", "audio": {"id": "a"}, "annotations": []},
                "content_filter_results": {"hate": {"filtered": False}},
                "logprobs": None,
                "finish_reason": None,
            },
        ],
        "usage": None,
    }
    script = openai_stream(text=["a"])
    provider.push(
        [Raw(b": OPENROUTER PROCESSING\n\n"), script[0], SSE(json.dumps(odd)), *script[1:]]
    )
    s = check_contract(await collect(make("openai")))
    assert s.text == "oka"


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("size", [1, 7, 64])
async def test_rechunked_bytes_give_the_same_items(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor, size: int
) -> None:
    script = stream_for(
        vendor, reasoning=["pensé ", "🤔"], text=["héllo ", "世界"], tool_calls=[WEATHER]
    )
    provider.push(script, rechunk(script, size, gap_s=0.001 if size == 7 else 0.0))
    adapter = make(vendor)
    whole = await collect(adapter)
    assert await collect(adapter) == whole
    assert check_contract(whole).text == "héllo 世界"


@pytest.mark.parametrize(
    ("wire", "reason", "calls"),
    [
        ("stop", "stop", []),
        ("length", "length", []),
        ("content_filter", "content_filter", []),
        ("something_new", "other", []),
        ("stop", "tool_calls", [WEATHER]),  # servers that say "stop" after calls
        ("length", "length", [WEATHER]),
    ],
)
async def test_openai_finish_reasons(
    provider: FakeProvider, make: MakeAdapter, wire: str, reason: str, calls: list[FakeToolCall]
) -> None:
    provider.push(openai_stream(text="x", tool_calls=calls, finish_reason=wire))
    s = check_contract(await collect(make("openai")))
    assert s.finish is not None and s.finish.reason == reason


async def test_openai_usage_and_end_without_done(provider: FakeProvider, make: MakeAdapter) -> None:
    provider.push(openai_stream(text="x", usage=Usage(input_tokens=3, output_tokens=1), done=False))
    provider.push(openai_stream(text="x", usage=None))
    adapter = make("openai")
    assert (await collect(adapter))[-1] == Finish(
        reason="stop", usage=Usage(input_tokens=3, output_tokens=1)
    )
    assert (await collect(adapter))[-1] == Finish(reason="stop", usage=Usage())


async def test_openai_error_chunk_mid_stream(provider: FakeProvider, make: MakeAdapter) -> None:
    error = {
        "error": {
            "message": "The server had an error while processing your request. Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    provider.push([*openai_stream(text=["a", "b"])[:2], SSE(json.dumps(error))])
    provider.push(
        [
            *openai_stream(text=["a"])[:2],
            SSE(json.dumps({"error": {"message": "bad", "type": "invalid_request_error"}})),
        ]
    )
    provider.push([SSE("upstream gone", event="error")])
    provider.push([SSE('{"detail": "upstream gone"}', event="error")])
    adapter = make("openai")
    e = await failure(adapter)
    assert (e.code, e.retryable) == ("model_stream_error", True)
    assert "Sorry about that" in e.message
    e = await failure(adapter)
    assert (e.code, e.retryable) == ("model_stream_error", False)
    for _ in range(2):
        e = await failure(adapter)
        assert e.code == "model_stream_error" and "upstream gone" in e.message


# -- Anthropic over HTTP


async def test_anthropic_thinking_text_and_tools_exact(
    provider: FakeProvider, make: MakeAdapter
) -> None:
    weather = FakeToolCall("get_weather", ['{"ci', 'ty": "Par', 'is"}'], id="toolu_01A")
    now = FakeToolCall("now", [], id="toolu_01B")  # no arguments at all
    provider.push(
        anthropic_stream(
            thinking=["Let me", " think"],
            text=["Hi", "!"],
            tool_calls=[weather, now],
            usage=Usage(input_tokens=100, output_tokens=42),
            cache_read_tokens=50,
        )
    )
    assert await collect(make("anthropic")) == [
        ReasoningChunk(text="Let me"),
        ReasoningChunk(text=" think"),
        TextChunk(text="Hi"),
        TextChunk(text="!"),
        ToolCallBegin(id="toolu_01A", name="get_weather"),
        ToolArgsChunk(id="toolu_01A", json='{"ci'),
        ToolArgsChunk(id="toolu_01A", json='ty": "Par'),
        ToolArgsChunk(id="toolu_01A", json='is"}'),
        ToolCallDone(id="toolu_01A"),
        ToolCallBegin(id="toolu_01B", name="now"),
        ToolArgsChunk(id="toolu_01B", json="{}"),
        ToolCallDone(id="toolu_01B"),
        Finish(reason="tool_calls", usage=Usage(input_tokens=150, output_tokens=42)),
    ]


async def test_anthropic_interleaved_tool_blocks(provider: FakeProvider, make: MakeAdapter) -> None:
    provider.push(anthropic_stream(tool_calls=[WEATHER, TIME], interleave=True))
    s = check_contract(await collect(make("anthropic")))
    ids = tool_call_ids("anthropic", [WEATHER, TIME])
    assert s.calls == {
        ids[0]: ("get_weather", WEATHER.full_arguments),
        ids[1]: ("get_time", TIME.full_arguments),
    }
    assert s.arg_pieces[ids[0]] == WEATHER.chunks()


async def test_anthropic_unknown_events_blocks_and_deltas_ignored(
    provider: FakeProvider, make: MakeAdapter
) -> None:
    def ev(kind: str, body: dict[str, Any], event: str | None = "") -> SSE:
        return SSE(json.dumps({"type": kind, **body}), event=kind if event == "" else event)

    script = anthropic_stream(text=["a"])
    extra: Script = [
        ev(
            "content_block_start",
            {
                "index": 5,
                "content_block": {
                    "type": "server_tool_use",
                    "id": "srvtoolu_1",
                    "name": "web_search",
                    "input": {},
                },
            },
        ),
        ev(
            "content_block_delta",
            {"index": 5, "delta": {"type": "input_json_delta", "partial_json": '{"q":'}},
        ),
        ev("content_block_stop", {"index": 5}),
        ev(
            "content_block_start",
            {"index": 6, "content_block": {"type": "redacted_thinking", "data": "EmwKAhgB"}},
        ),
        ev("content_block_stop", {"index": 6}),
        ev(
            "content_block_start",
            {"index": 7, "content_block": {"type": "text", "text": "", "citations": []}},
        ),
        ev(
            "content_block_delta",
            {"index": 7, "delta": {"type": "citations_delta", "citation": {"x": 1}}},
        ),
        ev(
            "content_block_delta",
            {"index": 7, "delta": {"type": "text_delta", "text": "b"}},
            event=None,
        ),
        ev("content_block_stop", {"index": 7}),
        ev("message_annotation", {"anything": [1]}),
        SSE('{"type": "ping"}', event="ping"),
    ]
    provider.push(script[:-2] + extra + script[-2:])
    items = await collect(make("anthropic"))
    s = check_contract(items)
    assert s.text == "ab" and s.calls == {}


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
        ("pause_turn", "other"),
    ],
)
async def test_anthropic_stop_reasons(
    provider: FakeProvider, make: MakeAdapter, wire: str, reason: str
) -> None:
    provider.push(anthropic_stream(text="x", stop_reason=wire))
    s = check_contract(await collect(make("anthropic")))
    assert s.finish is not None and s.finish.reason == reason


@pytest.mark.parametrize(
    ("error_type", "code", "retryable"),
    [
        ("overloaded_error", "model_overloaded", True),
        ("api_error", "model_stream_error", True),
        ("invalid_request_error", "model_stream_error", False),
    ],
)
async def test_anthropic_error_event_mid_stream(
    provider: FakeProvider, make: MakeAdapter, error_type: str, code: str, retryable: bool
) -> None:
    error = {"type": "error", "error": {"type": error_type, "message": "Overloaded"}}
    provider.push([*anthropic_stream(text=["a", "b"])[:4], SSE(json.dumps(error), event="error")])
    e = await failure(make("anthropic"))
    assert (e.code, e.retryable) == (code, retryable)
    assert "Overloaded" in e.message


# -- failures, both vendors

_HTTP_ERRORS = [
    (400, "invalid_request_error", "model_bad_request", False),
    (401, "authentication_error", "model_auth", False),
    (403, "permission_error", "model_auth", False),
    (404, "not_found_error", "model_bad_request", False),
    (408, "timeout", "model_timeout", True),
    (429, "rate_limit_error", "model_rate_limited", True),
    (500, "api_error", "model_unavailable", True),
    (503, "api_error", "model_unavailable", True),
    (529, "overloaded_error", "model_overloaded", True),
]


def error_body(
    vendor: Vendor, error_type: str, message: str, code: str | None = None
) -> dict[str, Any]:
    if vendor == "openai":
        return {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": "req_011CS",
    }


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize(("status", "error_type", "code", "retryable"), _HTTP_ERRORS)
async def test_http_errors(
    provider: FakeProvider,
    make: MakeAdapter,
    vendor: Vendor,
    status: int,
    error_type: str,
    code: str,
    retryable: bool,
) -> None:
    provider.push([Respond(status, error_body(vendor, error_type, "provider says no"))])
    e = await failure(make(vendor))
    assert (e.code, e.retryable) == (code, retryable)
    assert e.message == f"HTTP {status}: provider says no"


@pytest.mark.parametrize("vendor", VENDORS)
async def test_http_error_messages_never_carry_keys(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    echo = f"Incorrect API key provided: {KEY}. Also sk-proj-abcdef***wxyz."
    provider.push([Respond(401, error_body(vendor, "invalid_api_key", echo))])
    provider.push([Respond(502, "<html>bad gateway\n</html>", content_type="text/html")])
    adapter = make(vendor)
    e = await failure(adapter)
    assert e.code == "model_auth" and KEY not in str(e) and "sk-proj" not in str(e)
    assert "Incorrect API key provided" in e.message
    e = await failure(adapter)
    assert (e.code, e.message) == ("model_unavailable", "HTTP 502: <html>bad gateway </html>")


async def test_openai_out_of_quota_is_not_retryable(
    provider: FakeProvider, make: MakeAdapter
) -> None:
    body = error_body(
        "openai", "insufficient_quota", "You exceeded your current quota", "insufficient_quota"
    )
    provider.push([Respond(429, body)])
    e = await failure(make("openai"))
    assert (e.code, e.retryable) == ("model_rate_limited", False)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_malformed_chunk(provider: FakeProvider, make: MakeAdapter, vendor: Vendor) -> None:
    script = stream_for(vendor, text=["a", "b"])
    if vendor == "openai":
        cut = SSE('{"choices": [{"delta": {"content": "x"')
        wrong_type = SSE('{"choices": {"not": "a list"}}')
    else:
        cut = SSE('{"type": "content_block_delta", "index": 0, "del', event="content_block_delta")
        wrong_type = SSE('{"index": "zero", "delta": 5}', event="content_block_delta")
    provider.push([*script[:3], cut, *script[3:]], [*script[:3], wrong_type, *script[3:]])
    adapter = make(vendor)
    for _ in range(2):
        e = await failure(adapter)
        assert (e.code, e.retryable) == ("model_malformed", True)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_truncated_stream(provider: FakeProvider, make: MakeAdapter, vendor: Vendor) -> None:
    script = stream_for(vendor, text=["a", "b"], tool_calls=[WEATHER])
    # Cut before the finish: OpenAI's finish chunk is 3rd from the end, Anthropic's message_delta 2nd.
    cut = -3 if vendor == "openai" else -2
    provider.push(script[:cut], [*script[:cut], Raw(b'data: {"choi')])
    adapter = make(vendor)
    for _ in range(2):
        items: list[ModelItem] = []
        with pytest.raises(ModelError) as info:
            async with aclosing(adapter.stream(REQUEST)) as stream:
                async for item in stream:
                    items.append(item)
        assert (info.value.code, info.value.retryable) == ("model_malformed", True)
        assert TextChunk(text="a") in items  # what came before the cut was delivered


@pytest.mark.parametrize("vendor", VENDORS)
async def test_connection_cut_mid_stream(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    provider.push([*stream_for(vendor, text=["a", "b"])[:3], Sleep(0.01), Disconnect()])
    provider.push([Disconnect()])  # before any response byte
    adapter = make(vendor)
    for _ in range(2):
        e = await failure(adapter)
        assert (e.code, e.retryable) == ("model_unavailable", True)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_connection_refused(make: MakeAdapter, vendor: Vendor) -> None:
    async with FakeProvider() as gone:
        url = gone.url
    e = await failure(make(vendor, url=url))
    assert (e.code, e.retryable) == ("model_unavailable", True)
    assert "127.0.0.1" not in e.message


@pytest.mark.parametrize("vendor", VENDORS)
async def test_first_byte_and_idle_timeouts(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    provider.push([Sleep(10)])  # no headers at all
    provider.push([*stream_for(vendor, text=["a", "b"])[:2], Sleep(10)])  # silence mid-stream
    adapter = make(vendor, first_byte_timeout_s=0.3, read_timeout_s=0.3)
    loop = asyncio.get_running_loop()
    for _ in range(2):
        t0 = loop.time()
        e = await failure(adapter)
        assert (e.code, e.retryable) == ("model_timeout", True)
        assert loop.time() - t0 < 5
    for rec in provider.requests:  # and the timed-out connection was dropped
        await rec.wait_closed(2.0)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_not_an_event_stream(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    provider.push([Respond(200, {"id": "chatcmpl-1", "choices": []})])
    provider.push([Respond(200, error_body(vendor, "api_error", "boom"))])
    adapter = make(vendor)
    e = await failure(adapter)
    assert (e.code, e.retryable) == ("model_malformed", True)
    e = await failure(adapter)
    assert e.code == "model_stream_error" and "boom" in e.message


@pytest.mark.parametrize("vendor", VENDORS)
async def test_oversized_line(provider: FakeProvider, make: MakeAdapter, vendor: Vendor) -> None:
    provider.push([*stream_for(vendor, text="a")[:1], Raw(b"data: " + b"x" * ((1 << 20) + 10))])
    e = await failure(make(vendor))
    assert (e.code, e.retryable) == ("model_malformed", True)


# -- stop means stop: the provider sees its connection closed


@pytest.mark.parametrize("vendor", VENDORS)
async def test_cancel_closes_the_provider_connection(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    provider.push(slow_tokens(vendor, 1000, rate_per_s=100))
    adapter = make(vendor)
    got: list[ModelItem] = []
    three = asyncio.Event()

    async def consume() -> None:
        async with aclosing(adapter.stream(REQUEST)) as stream:
            async for item in stream:
                got.append(item)
                if len(got) == 3:
                    three.set()

    task = asyncio.create_task(consume())
    async with asyncio.timeout(10):
        await three.wait()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    rec = provider.requests[0]
    closed_at = await rec.wait_closed(2.0)
    print(f"\n{vendor}: provider saw the close {(closed_at - t0) * 1000:.1f} ms after cancel")
    assert rec.closed_by_client and not rec.finished
    assert closed_at - t0 < 2.0
    assert got[:3] == [TextChunk(text="tok0 "), TextChunk(text="tok1 "), TextChunk(text="tok2 ")]


@pytest.mark.parametrize("vendor", VENDORS)
async def test_aclose_and_break_close_the_provider_connection(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    provider.push(
        slow_tokens(vendor, 1000, rate_per_s=200), slow_tokens(vendor, 1000, rate_per_s=200)
    )
    adapter = make(vendor)
    loop = asyncio.get_running_loop()

    stream = adapter.stream(REQUEST)
    assert await anext(stream) == TextChunk(text="tok0 ")
    t0 = loop.time()
    await stream.aclose()
    closed_at = await provider.requests[0].wait_closed(2.0)
    print(f"\n{vendor}: aclose → close seen in {(closed_at - t0) * 1000:.1f} ms")

    async with aclosing(adapter.stream(REQUEST)) as stream:
        async for item in stream:
            if item == TextChunk(text="tok2 "):
                t0 = loop.time()
                break
    closed_at = await provider.requests[1].wait_closed(2.0)
    print(f"{vendor}: break → close seen in {(closed_at - t0) * 1000:.1f} ms")
    assert closed_at - t0 < 2.0


@pytest.mark.parametrize("vendor", VENDORS)
async def test_completed_streams_reuse_the_connection(
    provider: FakeProvider, make: MakeAdapter, vendor: Vendor
) -> None:
    provider.push(stream_for(vendor, text="one"), stream_for(vendor, text="two"))
    async with aiohttp.ClientSession() as session:
        adapter = make(vendor, session=session)
        assert check_contract(await collect(adapter)).text == "one"
        assert check_contract(await collect(adapter)).text == "two"
        await adapter.aclose()
        assert not session.closed  # a session we passed in stays ours
    first, second = provider.requests
    assert first.finished and second.finished and not first.closed_by_client
    assert first.peer == second.peer


# -- what the adapters send

CONVERSATION = ModelRequest(
    messages=[
        Message(role="system", content="Be brief."),
        Message(role="user", content="Weather in Paris and the time?"),
        Message(
            role="assistant",
            content="Checking.",
            tool_calls=[
                ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}'),
                ToolCall(id="c2", name="get_time", arguments="not json"),
            ],
        ),
        Message(role="tool", tool_call_id="c1", name="get_weather", content="18C"),
        Message(role="tool", tool_call_id="c2", name="get_time", content="12:00"),
        Message(role="assistant", tool_calls=[ToolCall(id="c3", name="get_time", arguments="{}")]),
        Message(role="tool", tool_call_id="c3", name="get_time", content="12:01"),
        Message(role="user", content="Thanks"),
    ],
    tools=[
        ToolSpec(
            name="get_weather",
            description="Current weather",
            parameters={
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        ),
        ToolSpec(name="get_time"),
    ],
    max_tokens=256,
)


async def test_openai_request_body(provider: FakeProvider, make: MakeAdapter) -> None:
    provider.push(openai_stream(text="ok"), openai_stream(text="ok"))
    await collect(make("openai"), CONVERSATION)
    await collect(
        make("openai", max_tokens_param="max_tokens"),
        ModelRequest(messages=[Message(role="user", content="x")], model="o3"),
    )
    rec, rec2 = provider.requests
    assert (rec.method, rec.path) == ("POST", "/v1/chat/completions")
    assert rec.headers["Authorization"] == f"Bearer {KEY}"
    assert rec.headers["Content-Type"] == "application/json"
    assert rec.headers["Accept"] == "text/event-stream"
    assert rec.json == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris and the time?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        "type": "function",
                    },
                    {
                        "id": "c2",
                        "function": {"name": "get_time", "arguments": "not json"},
                        "type": "function",
                    },
                ],
            },
            {"role": "tool", "content": "18C", "tool_call_id": "c1"},
            {"role": "tool", "content": "12:00", "tool_call_id": "c2"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "c3",
                        "function": {"name": "get_time", "arguments": "{}"},
                        "type": "function",
                    }
                ],
            },
            {"role": "tool", "content": "12:01", "tool_call_id": "c3"},
            {"role": "user", "content": "Thanks"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "get_time",
                    "description": "",
                    "parameters": {"type": "object", "properties": {}},
                },
            },
        ],
        "max_completion_tokens": 256,
    }
    assert rec2.json == {
        "model": "o3",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 1024,
    }


async def test_anthropic_request_body(provider: FakeProvider, make: MakeAdapter) -> None:
    provider.push(anthropic_stream(text="ok"))
    await collect(make("anthropic"), CONVERSATION)
    rec = provider.requests[0]
    assert (rec.method, rec.path) == ("POST", "/v1/messages")
    assert rec.headers["x-api-key"] == KEY
    assert rec.headers["anthropic-version"] == "2023-06-01"
    assert "Authorization" not in rec.headers
    assert rec.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 256,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Weather in Paris and the time?"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {
                        "type": "tool_use",
                        "id": "c1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                    {"type": "tool_use", "id": "c2", "name": "get_time", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "18C"},
                    {"type": "tool_result", "tool_use_id": "c2", "content": "12:00"},
                ],
            },
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "c3", "name": "get_time", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c3", "content": "12:01"},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
        "stream": True,
        "system": "Be brief.",
        "tools": [
            {
                "name": "get_weather",
                "input_schema": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
                "description": "Current weather",
            },
            {"name": "get_time", "input_schema": {"type": "object", "properties": {}}},
        ],
    }
