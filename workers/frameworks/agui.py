"""AG-UI upstream: an agent that serves AG-UI 1.0 over HTTP (any language)
runs behind a runlog worker (docs/agents.md, "AG-UI upstream").

    from workers.frameworks.agui import agui_agent
    agent = agui_agent("http://my-agent:8000/agent", headers={"Authorization": "Bearer ..."})

or, with no code, `RUNLOG_AGENT=workers.frameworks.agui:agent` and
`RUNLOG_AGUI_URL=http://my-agent:8000/agent` (`RUNLOG_AGUI_HEADERS`: a JSON
object of extra request headers).

The worker POSTs a `RunAgentInput` (threadId = session id, runId = run id,
messages = the session's conversation + this run's input) and maps the SSE
answer onto the agent API:

| AG-UI | runlog |
|---|---|
| TEXT_MESSAGE_START / _CONTENT / _END, TEXT_MESSAGE_CHUNK | `text` (AG-UI message id → a runlog message id) |
| REASONING_*, REASONING_MESSAGE_CHUNK (and 0.x THINKING_*) | `reasoning` |
| TOOL_CALL_START / _ARGS / _END, TOOL_CALL_CHUNK | `tool_start` / `tool_args` / `tool_end` |
| TOOL_CALL_RESULT | `tool_result` (ok; summary: the content's first line, cut) |
| STEP_STARTED / STEP_FINISHED | `status` step_started / step_finished (summary: the step name) |
| RUN_FINISHED (success) | the run completes; `usage` is added |
| RUN_FINISHED (cancelled) | `status` upstream_cancelled, the run completes |
| RUN_FINISHED (interrupt) | one `approval` per interrupt, then a new POST with `resume[]` |
| RUN_ERROR | `AgentError` upstream_error |
| anything else (CUSTOM, STATE_*, MESSAGES_SNAPSHOT, ACTIVITY_*, RAW, SUBAGENT_*, unknown types) | ignored |

Durability: a POST's answer is read in steps, `segment-<i>`, each stopping
at RUN_FINISHED or at a TOOL_CALL_RESULT (a cut); its stored result
(`Segment`) holds the id maps, the AG-UI messages produced so far (sent back
on the next POST, as an AG-UI client does), and the interrupts or the tool
result it stopped at. That result is emitted after the step (a durable
point), and the next segment reads on from the same stream. A takeover
replays the stored segments and the decided approvals, then goes on on the
new worker: a run waiting for an approval POSTs the resume there (the
upstream gets it once); a run cut after a tool result POSTs the messages so
far, that result included, with no resume (a continuation, as an AG-UI
client that lost its stream sends), and the upstream answers on from there.
A segment cut by a dying worker before any tool result is POSTed again (its
partial text retracted by runlog) unless it answers interrupts: then it is
not retryable unless `idempotent_resume=True` (the upstream would run what
it resumes twice), and the run fails `step_interrupted`. An answer to
interrupts is cut only once each of their calls has its result (until then
the upstream may be running one); not at all if an interrupt names no call.

Stop: the agent's task is cancelled, which closes the HTTP response (the
upstream sees the client go away). Failures are `AgentError`s with the codes
in `CODES`.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from contextlib import aclosing
from typing import Any, Protocol, cast, get_args

import aiohttp
import msgspec
import pydantic
from ag_ui.core import (
    PROTOCOL_VERSION,
    Event,
    EventType,
    Interrupt,
    ReasoningMessageChunkEvent,
    ReasoningMessageContentEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageChunkEvent,
    TextMessageContentEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallChunkEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from broker import codes
from broker.events import RiskLevel, ToolStatus
from workers.adapters.sse import SSEClient, SSEEvent, Timeouts, clean_message
from workers.api import AgentContext, AgentError, ChatMessage, Decision
from workers.model import ModelError

__all__ = ["CODES", "AgUiAgent", "Result", "Segment", "agent", "agui_agent", "default_answer"]

URL_ENV = "RUNLOG_AGUI_URL"
HEADERS_ENV = "RUNLOG_AGUI_HEADERS"

# code -> (retryable, meaning): the upstream_* codes of broker/codes.py;
# documented in docs/agents.md.
CODES: dict[str, tuple[bool, str]] = {
    name: (c.retryable, c.meaning)
    for name, c in codes.CODES.items()
    if name.startswith("upstream_")
}

# What the shared SSE client's codes mean for an upstream.
_FROM_MODEL = {
    "model_unavailable": "upstream_unavailable",
    "model_overloaded": "upstream_unavailable",
    "model_timeout": "upstream_timeout",
    "model_auth": "upstream_auth",
    "model_rate_limited": "upstream_rate_limited",
    "model_bad_request": "upstream_bad_request",
    "model_malformed": "upstream_bad_response",
    "model_stream_error": "upstream_bad_response",
}

_SUMMARY_CHARS = 200
_TOOL_STATUSES: frozenset[str] = frozenset(get_args(ToolStatus))
_CONNECT_S = 10.0

Item = dict[str, Any]  # AG-UI wire JSON (camelCase), as the upstream reads it
Answer = Callable[[Interrupt, Decision], ResumeEntry]


def bad_response(message: str) -> AgentError:
    return AgentError("upstream_bad_response", clean_message(message), retryable=True)


# -- what a segment stores


class Carry(msgspec.Struct, kw_only=True):
    """What one segment hands the next: the id maps (AG-UI id → runlog id) and
    the AG-UI messages this run produced so far."""

    messages: list[Item] = []
    text_ids: dict[str, str] = {}
    reasoning_ids: dict[str, str] = {}
    tool_ids: dict[str, str] = {}
    tool_names: dict[str, str] = {}  # by AG-UI tool call id
    tools_ended: list[str] = []  # AG-UI tool call ids whose card is closed


class Result(msgspec.Struct, kw_only=True):
    """A TOOL_CALL_RESULT a segment stopped at, as its `tool_result`."""

    tool_call_id: str  # runlog's card
    status: ToolStatus
    summary: str
    output: str


class Segment(msgspec.Struct, kw_only=True):
    """The stored result of one part of a POST's answer: what follows it, and
    how it ended: at a tool result (`result`: emitted after the step, and the
    answer goes on in the next segment), or at RUN_FINISHED with the
    interrupts (AG-UI wire JSON; none: the run is done)."""

    carry: Carry
    interrupts: list[Item] = []
    result: Result | None = None


# -- the pure core: AG-UI events in, agent API calls out


class Sink(Protocol):
    """The part of `AgentContext` the translator drives."""

    def message_id(self) -> str: ...
    def tool_call_id(self) -> str: ...
    async def text(self, message_id: str, delta: str) -> None: ...
    async def reasoning(self, message_id: str, delta: str) -> None: ...
    async def tool_start(self, tool_call_id: str, tool_name: str, *, risk: RiskLevel = "low") -> None: ...  # fmt: skip
    async def tool_args(self, tool_call_id: str, partial_json: str) -> None: ...
    async def tool_end(self, tool_call_id: str) -> None: ...
    async def tool_result(self, tool_call_id: str, status: ToolStatus = "ok", summary: str = "", output: str | None = None) -> None: ...  # fmt: skip
    async def status(self, code: str, summary: str = "") -> None: ...
    def usage(self, *, input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0) -> None: ...  # fmt: skip


@functools.cache
def _events() -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(Event)


_KNOWN_TYPES = frozenset(t.value for t in EventType)


class Translator:
    """One POST's stream: `feed(data)` per SSE event, in order, until
    `finished` or `held`; then `segment()`. Raises only `AgentError`. Lenient
    where nothing is lost (an END for an unknown call is ignored), strict
    where it would be (arguments for a call never started are an
    `upstream_bad_response`).

    `cut`: where the stream may be cut into segments. None: nowhere. A
    collection of AG-UI tool call ids: at the first TOOL_CALL_RESULT once each
    of them has its result (empty: at every TOOL_CALL_RESULT). That result is
    then `held` (not sent to the sink) and `go_on()` resumes the feeding."""

    def __init__(
        self,
        sink: Sink,
        carry: Carry,
        *,
        tool_risk: Mapping[str, RiskLevel] | None = None,
        cut: Collection[str] | None = None,
    ) -> None:
        self.sink = sink
        # A copy: a segment that fails leaves the stored carry as it was.
        self.c = msgspec.convert(msgspec.to_builtins(carry), Carry)
        self.tool_risk = tool_risk or {}
        self.cut = None if cut is None else frozenset(cut)
        self.held: Result | None = None
        self.finished: RunFinishedEvent | None = None
        self._ended = set(self.c.tools_ended)
        self._ignored: set[str] = set()  # non-assistant text messages
        self._chunk_text: str | None = None
        self._chunk_reasoning: str | None = None
        self._chunk_tool: str | None = None
        self._thinking: str | None = None
        self._by_id = {m["id"]: m for m in self.c.messages}
        self._calls: dict[str, Item] = {
            call["id"]: call for m in self.c.messages for call in m.get("toolCalls") or ()
        }
        self._answered = {m.get("toolCallId") for m in self.c.messages if m.get("role") == "tool"}

    def go_on(self, cut: Collection[str] | None) -> None:
        """Feed on after a held result, cutting by `cut` from now on."""
        self.held = None
        self.cut = None if cut is None else frozenset(cut)

    async def feed(self, data: str) -> None:
        if self.finished is not None or self.held is not None:
            return
        try:
            raw = json.loads(data)
        except ValueError as e:
            raise bad_response(f"an event that is not JSON ({type(e).__name__})") from e
        if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
            raise bad_response("an event that is not a JSON object with a string type")
        item = self._upgrade(raw)
        if item is None:
            return
        try:
            ev = _events().validate_python(item)
        except pydantic.ValidationError as e:
            errs = e.errors()
            where = f"{'.'.join(map(str, errs[0]['loc']))}: {errs[0]['msg']}" if errs else ""
            raise bad_response(f"invalid {item['type']} event ({where})") from e
        await self.handle(ev)

    def _upgrade(self, raw: Item) -> Item | None:
        """0.x THINKING_* events as their 1.0 REASONING_* equivalent (they carry
        no ids: one key per thinking message); unknown types: None (ignored)."""
        t = raw["type"]
        if t in _KNOWN_TYPES:
            return raw
        if t == "THINKING_TEXT_MESSAGE_START":
            self._thinking = f"thinking:{len(self.c.reasoning_ids)}"
            return {"type": "REASONING_MESSAGE_START", "messageId": self._thinking}
        if t == "THINKING_TEXT_MESSAGE_CONTENT":
            if self._thinking is None:
                self._thinking = f"thinking:{len(self.c.reasoning_ids)}"
            return {"type": "REASONING_MESSAGE_CONTENT", "messageId": self._thinking,
                    "delta": raw.get("delta")}  # fmt: skip
        if t == "THINKING_TEXT_MESSAGE_END":
            self._thinking = None
        return None

    async def handle(self, ev: Any) -> None:
        # A chunk run ends at the first event that is not its kind (AG-UI's rule).
        if not isinstance(ev, TextMessageChunkEvent):
            self._chunk_text = None
        if not isinstance(ev, ReasoningMessageChunkEvent):
            self._chunk_reasoning = None
        if not isinstance(ev, ToolCallChunkEvent) and self._chunk_tool is not None:
            await self._end_tool(self._chunk_tool)
            self._chunk_tool = None
        s = self.sink
        match ev:
            case TextMessageStartEvent():
                self._text_start(ev.message_id, ev.role)
            case TextMessageContentEvent():
                await self._text(ev.message_id, ev.delta)
            case TextMessageChunkEvent():
                mid = ev.message_id or self._chunk_text
                if mid is None:
                    raise bad_response("the first TEXT_MESSAGE_CHUNK has no messageId")
                if mid != self._chunk_text:
                    self._text_start(mid, ev.role)
                    self._chunk_text = mid
                await self._text(mid, ev.delta or "")
            case ReasoningStartEvent() | ReasoningMessageStartEvent():
                self._reasoning_id(ev.message_id)
            case ReasoningMessageContentEvent():
                await s.reasoning(self._reasoning_id(ev.message_id), ev.delta)
            case ReasoningMessageChunkEvent():
                mid = ev.message_id or self._chunk_reasoning
                if mid is None:
                    raise bad_response("the first REASONING_MESSAGE_CHUNK has no messageId")
                self._chunk_reasoning = mid
                await s.reasoning(self._reasoning_id(mid), ev.delta or "")
            case ToolCallStartEvent():
                await self._start_tool(ev.tool_call_id, ev.tool_call_name, ev.parent_message_id)
            case ToolCallArgsEvent():
                await self._args(ev.tool_call_id, ev.delta)
            case ToolCallEndEvent():
                await self._end_tool(ev.tool_call_id)
            case ToolCallChunkEvent():
                await self._tool_chunk(ev)
            case ToolCallResultEvent():
                await self._result(ev)
            case StepStartedEvent():
                await s.status("step_started", ev.step_name)
            case StepFinishedEvent():
                await s.status("step_finished", ev.step_name)
            case RunFinishedEvent():
                self._usage(ev.usage)
                for tid in list(self.c.tool_ids):
                    await self._end_tool(tid)  # AG-UI closes them before; be sure
                if isinstance(ev.outcome, RunFinishedCancelledOutcome):
                    await s.status("upstream_cancelled", "the upstream cancelled its run")
                self.finished = ev
            case RunErrorEvent():
                self._usage(ev.usage)
                what = f"{ev.code}: {ev.message}" if ev.code else ev.message
                raise AgentError("upstream_error", clean_message(what), retryable=False)
            case _:
                pass  # RUN_STARTED, CUSTOM, state, snapshots, activity, raw, subagents

    def segment(self) -> Segment:
        """Where the stream stopped: at a held result, or at its end (raises
        if it ended without RUN_FINISHED or RUN_ERROR)."""
        self.c.tools_ended = sorted(self._ended)
        if self.held is not None:
            return Segment(carry=self.c, result=self.held)
        if self.finished is None:
            raise AgentError(
                "upstream_incomplete",
                "the upstream's stream ended without RUN_FINISHED or RUN_ERROR",
                retryable=True,
            )
        outcome = self.finished.outcome
        interrupts: list[Item] = []
        if isinstance(outcome, RunFinishedInterruptOutcome):
            interrupts = [i.model_dump(by_alias=True, mode="json") for i in outcome.interrupts]
        return Segment(carry=self.c, interrupts=interrupts)

    # -- text and reasoning

    def _text_start(self, mid: str, role: str | None) -> None:
        if role not in (None, "assistant"):
            self._ignored.add(mid)  # an echoed user/system message is no output of the run
            return
        self._text_id(mid)

    def _text_id(self, mid: str) -> str:
        rid = self.c.text_ids.get(mid)
        if rid is None:
            rid = self.c.text_ids[mid] = self.sink.message_id()
        if mid not in self._by_id:
            self._add_message({"id": mid, "role": "assistant", "content": ""})
        return rid

    async def _text(self, mid: str, delta: str) -> None:
        if mid in self._ignored or not delta:
            return
        rid = self._text_id(mid)
        m = self._by_id[mid]
        m["content"] = (m.get("content") or "") + delta
        await self.sink.text(rid, delta)

    def _reasoning_id(self, mid: str) -> str:
        rid = self.c.reasoning_ids.get(mid)
        if rid is None:
            rid = self.c.reasoning_ids[mid] = self.sink.message_id()
        return rid

    # -- tool calls

    async def _start_tool(self, tid: str, name: str, parent: str | None) -> None:
        if tid in self.c.tool_ids:
            return  # re-opened on a resumed answer: the card exists
        rid = self.c.tool_ids[tid] = self.sink.tool_call_id()
        self.c.tool_names[tid] = name
        msg = self._by_id.get(parent) if parent else None
        if msg is None or msg.get("role") != "assistant":
            # As AG-UI's reducer: a call without its message gets one of its own.
            msg = self._add_message({"id": parent or tid, "role": "assistant"})
        call = {"id": tid, "type": "function", "function": {"name": name, "arguments": ""}}
        msg.setdefault("toolCalls", []).append(call)
        self._calls[tid] = call
        await self.sink.tool_start(rid, name, risk=self.tool_risk.get(name, "low"))

    async def _args(self, tid: str, delta: str) -> None:
        rid = self.c.tool_ids.get(tid)
        if rid is None:
            raise bad_response("TOOL_CALL_ARGS for a tool call that was not started")
        if tid in self._ended or not delta:
            return
        self._calls[tid]["function"]["arguments"] += delta
        await self.sink.tool_args(rid, delta)

    async def _end_tool(self, tid: str) -> None:
        rid = self.c.tool_ids.get(tid)
        if rid is None or tid in self._ended:
            return
        self._ended.add(tid)
        await self.sink.tool_end(rid)

    async def _tool_chunk(self, ev: ToolCallChunkEvent) -> None:
        tid = ev.tool_call_id or self._chunk_tool
        if tid is None:
            raise bad_response("the first TOOL_CALL_CHUNK has no toolCallId")
        if tid != self._chunk_tool:
            if self._chunk_tool is not None:
                await self._end_tool(self._chunk_tool)
            if tid not in self.c.tool_ids:
                if not ev.tool_call_name:
                    raise bad_response("the first TOOL_CALL_CHUNK of a call has no toolCallName")
                await self._start_tool(tid, ev.tool_call_name, ev.parent_message_id)
            self._chunk_tool = tid
        await self._args(tid, ev.delta or "")

    async def _result(self, ev: ToolCallResultEvent) -> None:
        tid = ev.tool_call_id
        if tid not in self.c.tool_ids:  # a call we never saw start: give it a card
            await self._start_tool(tid, "tool", None)
        await self._end_tool(tid)
        content = ev.content
        if isinstance(content, str):
            text = content
        else:  # content parts: the text ones
            text = "".join(getattr(p, "text", "") for p in content)
        meta = (ev.metadata or {}).get("runlog")
        status = meta.get("status") if isinstance(meta, dict) else None
        lines = text.strip().splitlines()
        summary = lines[0][:_SUMMARY_CHARS] if lines else ""
        self._add_message({"id": ev.message_id, "role": "tool", "toolCallId": tid,
                           "content": ev.model_dump(by_alias=True, mode="json")["content"]})  # fmt: skip
        self._answered.add(tid)
        result = Result(
            tool_call_id=self.c.tool_ids[tid],
            status=cast(ToolStatus, status) if status in _TOOL_STATUSES else "ok",
            summary=summary,
            output=text,
        )
        if self.cut is not None and self.cut <= self._answered:
            self.held = result
            return
        await self.sink.tool_result(
            result.tool_call_id, result.status, result.summary, result.output
        )

    # -- the rest

    def _add_message(self, m: Item) -> Item:
        self.c.messages.append(m)
        self._by_id[m["id"]] = m
        return m

    def _usage(self, usage: list[TokenUsage] | None) -> None:
        for u in usage or ():
            self.sink.usage(
                input_tokens=u.input_tokens or 0,
                output_tokens=u.output_tokens or 0,
                reasoning_tokens=u.reasoning_tokens or 0,
            )


# -- answering interrupts


def default_answer(interrupt: Interrupt, d: Decision) -> ResumeEntry:
    """runlog's own answer shape (the `responseSchema` runlog's AG-UI
    projection publishes): resolved with {decision, comment}; an expired
    approval cancels the interrupt."""
    if d.decision == "expired":
        return ResumeEntry(interrupt_id=interrupt.id, status="cancelled")
    return ResumeEntry(
        interrupt_id=interrupt.id,
        status="resolved",
        payload={"decision": d.decision, "comment": d.comment},
        metadata={"runlog": {"decided_by": d.decided_by}},
    )


def _timeout_s(expires_at: str | None) -> float | None:
    """An interrupt's expiresAt (ISO 8601) as the approval's timeout."""
    if not expires_at:
        return None
    try:
        t = datetime.datetime.fromisoformat(expires_at)
    except ValueError:
        return None  # unparseable: the approval gets the default expiry
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    left = (t - datetime.datetime.now(datetime.UTC)).total_seconds()
    return max(left, 1.0)


# -- the agent


def _history(ctx: AgentContext, conversation: list[ChatMessage]) -> list[Item]:
    out: list[Item] = [
        {"id": f"{m.run_id}:{m.role}", "role": m.role, "content": m.content} for m in conversation
    ]
    out.append({"id": f"{ctx.run_id}:user", "role": "user", "content": ctx.input})
    return out


class AgUiAgent:
    """An `Agent` (the agent API's async callable) that runs each run on an
    AG-UI 1.0 server. Build it with `agui_agent`."""

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        idempotent_resume: bool = False,
        answer: Answer = default_answer,
        tool_risk: Mapping[str, RiskLevel] | None = None,
    ) -> None:
        self.url = url
        self.headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            **(headers or {}),
        }
        self._redact = tuple((headers or {}).values())
        self.idempotent_resume = idempotent_resume
        self.answer = answer
        self.tool_risk = dict(tool_risk or {})

    async def __call__(self, ctx: AgentContext) -> None:
        history = _history(ctx, await ctx.conversation())
        carry = Carry()
        resume: list[Item] | None = None
        cut: list[str] | None = []  # where the POST's answer may be cut (Translator)
        answer = _Answer()
        i = 0
        try:
            while True:
                body = functools.partial(self._body, ctx, history + carry.messages, resume)
                seg = await ctx.step(
                    f"segment-{i}",
                    functools.partial(self._segment, ctx, answer, body, carry, cut),
                    retryable=resume is None or self.idempotent_resume,
                    type=Segment,
                )
                carry = seg.carry
                i += 1
                if seg.result is not None:
                    # A durable point; what follows is a continuation: after
                    # a takeover, a POST of the messages so far, no resume.
                    r = seg.result
                    await ctx.tool_result(r.tool_call_id, r.status, r.summary, r.output)
                    resume, cut = None, []
                    continue
                await answer.aclose()
                if not seg.interrupts:
                    return
                resume, cut = [], []
                for raw in seg.interrupts:
                    intr = Interrupt.model_validate(raw)
                    d = await ctx.approval(
                        intr.message or intr.reason,
                        tool_call_id=carry.tool_ids.get(intr.tool_call_id or "", ""),
                        timeout_s=_timeout_s(intr.expires_at),
                    )
                    resume.append(self.answer(intr, d).model_dump(by_alias=True, mode="json"))
                    # Cut only once every answered interrupt's call has its
                    # result: until then the upstream may be running one.
                    if cut is not None and intr.tool_call_id:
                        cut.append(intr.tool_call_id)
                    else:
                        cut = None
        finally:
            await answer.aclose()

    def _body(self, ctx: AgentContext, messages: list[Item], resume: list[Item] | None) -> bytes:
        try:
            inp = RunAgentInput.model_validate({
                "threadId": ctx.session_id, "runId": ctx.run_id,
                "protocolVersion": PROTOCOL_VERSION, "messages": messages, "tools": [],
                "state": {}, "context": [], "forwardedProps": {}, "resume": resume,
            })  # fmt: skip
        except pydantic.ValidationError as e:  # an upstream message we echo back is invalid
            raise bad_response(
                f"cannot build the next RunAgentInput ({e.error_count()} errors)"
            ) from e
        return inp.model_dump_json(by_alias=True).encode()

    async def _segment(
        self,
        ctx: AgentContext,
        answer: _Answer,
        body: Callable[[], bytes],
        carry: Carry,
        cut: list[str] | None,
    ) -> Segment:
        """Read the answer being read (this execution's, after a held result)
        or POST `body()`, until RUN_FINISHED or a result to hold."""
        if answer.tr is None:
            s = ctx.settings
            timeouts = Timeouts(
                connect_s=_CONNECT_S, first_byte_s=s.model_timeout_s, read_s=s.model_timeout_s
            )
            answer.open(
                Translator(ctx, carry, tool_risk=self.tool_risk, cut=cut),
                self.url, self.headers, body(), timeouts, self._redact,
            )  # fmt: skip
        else:
            answer.tr.go_on(cut)
        tr, datas = answer.tr, answer.datas
        assert tr is not None and datas is not None
        try:
            async for data in datas:
                await tr.feed(data)
                if tr.finished is not None or tr.held is not None:
                    break
        except ModelError as e:
            code = _FROM_MODEL.get(e.code, "upstream_bad_response")
            raise AgentError(code, "AG-UI upstream: " + e.message, retryable=e.retryable) from e
        return tr.segment()


class _Answer:
    """The upstream's answer to one POST, as it is read: it outlives a
    segment that stopped at a tool result, and the next one reads on."""

    def __init__(self) -> None:
        self.tr: Translator | None = None
        self.datas: AsyncGenerator[str, None] | None = None
        self._http: aiohttp.ClientSession | None = None

    def open(
        self,
        tr: Translator,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        timeouts: Timeouts,
        redact: tuple[str, ...],
    ) -> None:
        # A session per POST: nothing pooled outlives the stream (and a
        # cancelled stream's socket is closed, not returned to a pool).
        self._http = aiohttp.ClientSession()
        client = SSEClient(self._http, timeouts, redact=redact)
        self.tr, self.datas = tr, _datas(client.post(url, headers=headers, body=body))

    async def aclose(self) -> None:
        datas, http = self.datas, self._http
        self.tr = self.datas = self._http = None
        try:
            if datas is not None:
                await datas.aclose()  # closes the response (its socket, if unread)
        finally:
            if http is not None:
                await http.close()


async def _datas(batches: AsyncGenerator[list[SSEEvent], None]) -> AsyncGenerator[str, None]:
    async with aclosing(batches) as b:
        async for batch in b:
            for ev in batch:
                yield ev.data


def agui_agent(
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    idempotent_resume: bool = False,
    answer: Answer = default_answer,
    tool_risk: Mapping[str, RiskLevel] | None = None,
) -> AgUiAgent:
    """The agent that runs every run on the AG-UI server at `url`.

    `headers`: extra request headers (authentication); their values are
    redacted from error messages. `idempotent_resume`: the upstream treats a
    repeated `resume[]` for the same interrupts as one, so a segment that
    answers interrupts may be POSTed again after a takeover. `answer`: how a
    decision answers an interrupt (default: `default_answer`). `tool_risk`:
    risk level by tool name (default low)."""
    return AgUiAgent(
        url, headers=headers, idempotent_resume=idempotent_resume, answer=answer,
        tool_risk=tool_risk,
    )  # fmt: skip


def _from_env(environ: Mapping[str, str]) -> AgUiAgent:
    url = environ.get(URL_ENV, "")
    if not url:
        raise AgentError("upstream_not_configured", f"{URL_ENV} is not set")
    headers: Any = {}
    raw = environ.get(HEADERS_ENV, "")
    if raw:
        try:
            headers = json.loads(raw)
        except ValueError:
            headers = None
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise AgentError("upstream_not_configured", f"{HEADERS_ENV} is not a JSON object of strings")  # fmt: skip
    return AgUiAgent(url, headers=headers)


async def agent(ctx: AgentContext) -> None:
    """`RUNLOG_AGENT=workers.frameworks.agui:agent`: the upstream is
    `RUNLOG_AGUI_URL` (read when a run starts), with `RUNLOG_AGUI_HEADERS`."""
    await _from_env(os.environ)(ctx)
