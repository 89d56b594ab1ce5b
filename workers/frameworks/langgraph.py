"""LangGraph graphs as runlog agents: `langgraph_agent(graph)` (docs/agents.md).

Any compiled graph (`StateGraph(...).compile()` without a checkpointer) or a
graph builder runs with runlog's PostgreSQL as its checkpointer
(`AsyncPostgresSaver`, thread id = the run id). Its stream
(`astream(stream_mode=["messages", "updates", "custom"], subgraphs=True)`)
becomes the run's events: model chunks are text/reasoning deltas (one runlog
message per LangGraph message id) and tool cards whose argument text streams as
it comes; a `ToolMessage` is its card's `tool_result`; a root node that
finishes is a `status` (`node`); what a node writes with `get_stream_writer()`
is a `progress` when it looks like `{label, done, total}`, else a `status`.
`interrupt(value)` in a node is an approval; the decision resumes the graph with
`Command(resume=...)`.

Durability. The graph runs one superstep per `astream` call (LangGraph's
`interrupt_after="*"`, then `astream(None)` continues from the checkpoint), and
each call is a `ctx.step` (`segment-{i}`) whose stored result is what the adapter
needs afterwards: the pending interrupts and which LangGraph tool call is which
runlog tool card. So a takeover replays the stored segments without running the
graph, waits on (or finds) the same approval, and runs the next superstep from
the PostgreSQL checkpoint on the new worker. A worker that dies inside a
superstep: that segment runs again, from the last checkpoint (`None` as input,
or the same `Command(resume=...)` while the interrupt is still pending), so
a model call in flight is issued again (runlog retracts its partial text) --
unless a tool result of that superstep is in the log already, which cannot be
retracted (the run fails `worker_lost`). Static breakpoints of the graph
(`interrupt_before/after`) are superstep boundaries here, not pauses.

Stop cancels the agent's task; the cancellation reaches `astream` and through
it the node's model call (closing its connection). Exceptions of the graph end
the run with a coded error (`graph_error`, `graph_recursion_limit`,
`checkpoint_unavailable`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, cast

import msgspec
import psycopg
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import StateGraph
from langgraph.pregel import Pregel
from langgraph.types import Command, StreamMode
from psycopg import AsyncConnection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool

from broker.events import RiskLevel, ToolStatus
from workers.api import AgentContext, AgentError, Decision

__all__ = ["LangGraphAgent", "langgraph_agent"]

log = logging.getLogger(__name__)

# A list: given a tuple, astream yields bare payloads instead of (ns, mode, payload).
_MODES: list[StreamMode] = ["messages", "updates", "custom"]
_SETUP_LOCK_KEY = 0x72756E6C6F675F6C  # pg_advisory_lock: one checkpoint-table migration at a time
_SUMMARY_CHARS = 200
_APPROVAL_CHARS = 500
_STREAMED_KEEP = 1000  # LangGraph message ids remembered against a second emission
_DEFAULT_RECURSION_LIMIT = 25

Risk = Mapping[str, RiskLevel] | Callable[[str], RiskLevel]
_Pool = AsyncConnectionPool[AsyncConnection[DictRow]]


def default_resume_value(decision: Decision, value: Any) -> Any:
    """What `interrupt()` returns in the graph after runlog's decision."""
    return {
        "approved": decision.approved,
        "decision": decision.decision,
        "comment": decision.comment,
        "decided_by": decision.decided_by,
    }


def default_approval_summary(value: Any) -> str:
    """The approval's text from the interrupt's value: a string as is; a dict's
    `summary`/`question`/`description`/`message`; else the value as JSON."""
    if isinstance(value, str):
        return value[:_APPROVAL_CHARS]
    if isinstance(value, dict):
        for key in ("summary", "question", "description", "message"):
            if isinstance(value.get(key), str):
                return str(value[key])[:_APPROVAL_CHARS]
    return json.dumps(value, default=str)[:_APPROVAL_CHARS]


# -- what a segment stores


class _Interrupt(msgspec.Struct, kw_only=True):
    id: str  # LangGraph's interrupt id (the key of Command(resume={id: ...}))
    summary: str
    tool_call_id: str = ""  # runlog's tool card, if the value named a LangGraph tool call
    value: Any = None  # the interrupt's value as JSON (what resume_value gets, live or replayed)


class _Segment(msgspec.Struct, kw_only=True):
    interrupts: list[_Interrupt] = []
    done: bool = False  # the graph has no next task
    calls: dict[str, str] = {}  # LangGraph tool call id -> runlog tool card, until its result
    streamed: list[str] = []  # LangGraph message ids already shown


def _as_json(value: Any) -> Any:
    """The value as plain JSON values (pydantic models dumped, others str)."""

    def enc(obj: Any) -> Any:
        dump = getattr(obj, "model_dump", None)
        return dump(mode="json") if callable(dump) else str(obj)

    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=enc))


# -- the stream, mapped (no I/O: it returns the calls to make on the context)

Emit = tuple[str, tuple[Any, ...]]  # (AgentContext method, its arguments)


class _Message:
    __slots__ = ("calls", "id", "open", "task")

    def __init__(self, task: str) -> None:
        self.id = ""  # runlog's, made when it first has text
        self.task = task  # the node task that produced it (langgraph_checkpoint_ns)
        self.calls: dict[object, str] = {}  # tool call chunk key -> runlog tool card
        self.open: list[str] = []  # cards whose arguments may still come


class StreamMapper:
    """Turns one segment's `astream` items into AgentContext calls.

    `new_id(kind)` makes runlog ids ("m" messages, "tc" tool cards); `calls` and
    `streamed` carry over from the previous segment (its stored result)."""

    def __init__(
        self,
        new_id: Callable[[str], str],
        *,
        risk: Callable[[str], RiskLevel],
        calls: dict[str, str],
        streamed: list[str],
        denied: set[str],
        node_status: bool = True,
    ) -> None:
        self._new_id = new_id
        self._risk = risk
        self.calls = dict(calls)
        self._streamed = dict.fromkeys(streamed)
        self._denied = denied
        self._node_status = node_status
        self._msgs: dict[str, _Message] = {}
        self.usage = [0, 0, 0]

    @property
    def streamed(self) -> list[str]:
        return list(self._streamed)[-_STREAMED_KEEP:]

    def feed(self, item: Any) -> list[Emit]:
        ns, mode, payload = item
        out: list[Emit] = []
        if mode == "messages":
            msg, meta = payload
            task = str(meta.get("langgraph_checkpoint_ns", "")) if isinstance(meta, dict) else ""
            if isinstance(msg, AIMessageChunk):
                self._chunk(msg, task, out)
            elif isinstance(msg, AIMessage):
                self._whole(msg, task, out)
            elif isinstance(msg, ToolMessage):
                self._tool_message(msg, out)
        elif mode == "updates" and isinstance(payload, dict):
            for node in payload:
                if node.startswith("__"):
                    continue  # __interrupt__: read from the checkpoint afterwards
                # The node's tasks, and the tasks of the subgraphs inside them.
                prefix = "|".join((*ns, node)) + ":"
                self._close(out, functools.partial(_under, prefix))
                if self._node_status and not ns:
                    out.append(("status", ("node", node)))
        elif mode == "custom":
            out.append(_custom(payload))
        return out

    def finish(self) -> list[Emit]:
        """The segment ended: every card's arguments are complete."""
        out: list[Emit] = []
        self._close(out, lambda m: True)
        return out

    # -- messages

    def _message(self, lc_id: str, task: str) -> _Message:
        m = self._msgs.get(lc_id)
        if m is None:
            m = self._msgs[lc_id] = _Message(task)
        return m

    def _content(self, m: _Message, msg: BaseMessage, out: list[Emit]) -> None:
        reasoned = False
        for block in cast(list[dict[str, Any]], msg.content_blocks):
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                out.append(("text", (self._mid(m), block["text"])))
            elif kind == "reasoning" and block.get("reasoning"):
                reasoned = True
                out.append(("reasoning", (self._mid(m), block["reasoning"])))
        extra = msg.additional_kwargs.get("reasoning_content")
        if not reasoned and isinstance(extra, str) and extra:
            out.append(("reasoning", (self._mid(m), extra)))

    def _mid(self, m: _Message) -> str:
        if not m.id:
            m.id = self._new_id("m")
        return m.id

    def _chunk(self, msg: AIMessageChunk, task: str, out: list[Emit]) -> None:
        lc_id = msg.id or f"task:{task}"
        self._streamed[lc_id] = None
        m = self._message(lc_id, task)
        self._content(m, msg, out)
        for tc in msg.tool_call_chunks:
            key: object = tc.get("index")
            if key is None:
                key = tc.get("id")
            card = m.calls.get(key)
            if card is None:
                card = m.calls[key] = self._new_id("tc")
                name = tc.get("name") or "tool"
                if tc.get("id"):
                    self.calls[str(tc["id"])] = card
                m.open.append(card)
                out.append(("tool_start", (card, name, self._risk(name))))
            if tc.get("args") and card in m.open:
                out.append(("tool_args", (card, tc["args"])))
        self._usage(msg)
        if msg.chunk_position == "last":
            # The model's last chunk may carry another id than its first
            # (langchain-core's synthetic closing chunk): close by node task.
            self._close(out, lambda other: other.task == task)

    def _whole(self, msg: AIMessage, task: str, out: list[Emit]) -> None:
        """A message a node returned without streaming it (or a subgraph's)."""
        lc_id = msg.id or ""
        if lc_id and lc_id in self._streamed:
            return
        if lc_id:
            self._streamed[lc_id] = None
        m = _Message(task)
        self._content(m, msg, out)
        for call in msg.tool_calls:
            card = self._new_id("tc")
            if call.get("id"):
                self.calls[str(call["id"])] = card
            out.append(("tool_start", (card, call["name"], self._risk(call["name"]))))
            out.append(("tool_args", (card, json.dumps(call.get("args", {})))))
            out.append(("tool_end", (card,)))
        self._usage(msg)

    def _tool_message(self, msg: ToolMessage, out: list[Emit]) -> None:
        card = self.calls.pop(msg.tool_call_id, "")
        if not card:  # a tool result nobody announced: give it a card of its own
            card = self._new_id("tc")
            name = msg.name or "tool"
            out.append(("tool_start", (card, name, self._risk(name))))
            out.append(("tool_end", (card,)))
        else:
            self._close(out, lambda m: card in m.open, only=card)
        status: ToolStatus = "ok"
        if msg.status == "error":
            status = "error"
        elif card in self._denied:
            status = "denied"
        text = msg.text
        out.append(("tool_result", (card, status, _first_line(text), text)))

    def _close(self, out: list[Emit], which: Callable[[_Message], bool], only: str = "") -> None:
        for m in self._msgs.values():
            if m.open and which(m):
                for card in [c for c in m.open if not only or c == only]:
                    m.open.remove(card)
                    out.append(("tool_end", (card,)))

    def _usage(self, msg: AIMessage) -> None:
        u = msg.usage_metadata
        if not u:
            return
        self.usage[0] += int(u.get("input_tokens", 0) or 0)
        self.usage[1] += int(u.get("output_tokens", 0) or 0)
        details = u.get("output_token_details") or {}
        self.usage[2] += int(details.get("reasoning", 0) or 0)


def _under(prefix: str, m: _Message) -> bool:
    return m.task.startswith(prefix)


def _first_line(text: str) -> str:
    line = text.strip().split("\n", 1)[0]
    return line if len(line) <= _SUMMARY_CHARS else line[: _SUMMARY_CHARS - 1] + "…"


def _custom(payload: Any) -> Emit:
    if isinstance(payload, dict):
        label, done, total = payload.get("label"), payload.get("done"), payload.get("total")
        if isinstance(done, int) and isinstance(total, int) and label is not None:
            return ("progress", (str(label), done, total))
        if isinstance(payload.get("code"), str):
            return ("status", (payload["code"], str(payload.get("summary", ""))))
    text = payload if isinstance(payload, str) else json.dumps(payload, default=str)
    return ("status", ("custom", text[:_SUMMARY_CHARS]))


# -- the checkpointer: runlog's PostgreSQL


class _Checkpoints:
    """One psycopg pool per DSN for the process's runs; the checkpoint tables
    are migrated once (under an advisory lock: workers may start together).
    Each run gets its own saver over the pool (a saver serializes its calls
    behind one lock)."""

    def __init__(self, pool_size: int) -> None:
        self._size = pool_size
        self._pools: dict[str, _Pool] = {}
        self._lock = asyncio.Lock()

    async def saver(self, dsn: str) -> AsyncPostgresSaver:
        pool = self._pools.get(dsn)
        if pool is None:
            async with self._lock:
                pool = self._pools.get(dsn) or await self._open(dsn)
        return AsyncPostgresSaver(pool)

    async def _open(self, dsn: str) -> _Pool:
        try:
            async with await psycopg.AsyncConnection.connect(
                dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
            ) as conn:
                await conn.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK_KEY,))
                await AsyncPostgresSaver(conn).setup()  # the lock ends with the session
            pool = AsyncConnectionPool(
                dsn,
                connection_class=AsyncConnection[DictRow],
                min_size=1,
                max_size=self._size,
                open=False,
                name="runlog-langgraph",
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            )
            await pool.open(wait=True)
        except (psycopg.Error, OSError) as e:
            raise AgentError(
                "checkpoint_unavailable",
                "the graph's checkpoints cannot be reached",
                retryable=True,
            ) from e
        self._pools[dsn] = pool
        return pool

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.close()


# -- the agent


class LangGraphAgent:
    """The runlog agent around one graph; made by `langgraph_agent`. Keep one
    per process (it holds the checkpoint pool); `aclose()` closes the pool."""

    def __init__(
        self,
        graph: Pregel,
        *,
        input_key: str | None,
        history: bool,
        make_input: Callable[[AgentContext], Awaitable[Any]] | None,
        config: RunnableConfig | None,
        risk: Risk | None,
        approval_summary: Callable[[Any], str],
        resume_value: Callable[[Decision, Any], Any],
        node_status: bool,
        keep_checkpoints: bool,
        pool_size: int,
    ) -> None:
        self.graph = graph
        self._input_key = input_key
        self._history = history
        self._make_input = make_input
        self._config: dict[str, Any] = dict(config or {})
        self._risk = _risk_fn(risk)
        self._approval_summary = approval_summary
        self._resume_value = resume_value
        self._node_status = node_status
        self._keep = keep_checkpoints
        self._checkpoints = _Checkpoints(pool_size)

    async def aclose(self) -> None:
        await self._checkpoints.aclose()

    async def __call__(self, ctx: AgentContext) -> None:
        await _Run(self, ctx).execute()

    async def input_for(self, ctx: AgentContext) -> Any:
        if self._make_input is not None:
            return await self._make_input(ctx)
        if self._input_key is None:
            return ctx.input
        earlier: list[BaseMessage] = []
        if self._history:
            for m in await ctx.conversation():
                earlier.append(
                    HumanMessage(m.content) if m.role == "user" else AIMessage(m.content)
                )
        return {self._input_key: [*earlier, HumanMessage(ctx.input)]}


def _risk_fn(risk: Risk | None) -> Callable[[str], RiskLevel]:
    if risk is None:
        return lambda name: "low"
    if callable(risk):
        return risk
    table = dict(risk)
    return lambda name: table.get(name, "low")


class _Run:
    """One run of the graph: segments, and approvals between them."""

    def __init__(self, agent: LangGraphAgent, ctx: AgentContext) -> None:
        self.agent = agent
        self.ctx = ctx
        self.state = _Segment()  # as of the last segment
        self.denied: set[str] = set()  # runlog tool cards whose approval was not given
        self.retrying = ctx.resumed  # the first segment run live may be a retry
        cfg = agent._config
        self.limit = int(cfg.get("recursion_limit", _DEFAULT_RECURSION_LIMIT))
        self.config: RunnableConfig = {
            **cfg,  # type: ignore[typeddict-item]
            "configurable": {**cfg.get("configurable", {}), "thread_id": ctx.run_id},
        }

    async def execute(self) -> None:
        try:
            await self._segments()
        except AgentError as e:
            if e.code != "checkpoint_unavailable":
                await self._forget()  # the run fails: nothing will resume it
            raise
        await self._forget()

    async def _segments(self) -> None:
        ctx = self.ctx
        resume: dict[str, Any] | None = None
        i = 0
        while True:
            if i >= self.limit:
                raise AgentError(
                    "graph_recursion_limit",
                    f"recursion limit of {self.limit} supersteps reached",
                )
            self.state = await ctx.step(
                f"segment-{i}", functools.partial(self._segment, i, resume), type=_Segment
            )
            i += 1
            if self.state.interrupts:
                resume = {}
                for intr in self.state.interrupts:
                    d = await ctx.approval(intr.summary, tool_call_id=intr.tool_call_id)
                    if not d.approved and intr.tool_call_id:
                        self.denied.add(intr.tool_call_id)
                    resume[intr.id] = self.agent._resume_value(d, intr.value)
            elif self.state.done:
                break
            else:
                resume = None

    async def _graph(self) -> Pregel:
        saver = await self.agent._checkpoints.saver(self.ctx.settings.database_url)
        return self.agent.graph.copy(update={"checkpointer": saver})

    async def _segment(self, i: int, resume: dict[str, Any] | None) -> _Segment:
        graph = await self._graph()
        inp: Any = None
        if self.retrying:
            # The last owner may have run part of this segment: go on from
            # the last checkpoint rather than send the input again.
            snap = await self._checked(graph.aget_state(self.config))
            pending = {x.id for x in snap.interrupts}
            if i == 0 and snap.created_at is None:
                inp = await self.agent.input_for(self.ctx)
            elif resume is not None and set(resume) <= pending:
                inp = Command(resume=resume)
        elif i == 0:
            inp = await self.agent.input_for(self.ctx)
        elif resume is not None:
            inp = Command(resume=resume)
        self.retrying = False
        mapper = StreamMapper(
            self._new_id,
            risk=self.agent._risk,
            calls=self.state.calls,
            streamed=self.state.streamed,
            denied=self.denied,
            node_status=self.agent._node_status,
        )
        stream = cast(
            AsyncGenerator[Any, None],
            graph.astream(
                inp, self.config, stream_mode=_MODES, subgraphs=True, interrupt_after="*"
            ),
        )
        try:
            async for item in self._items(stream):
                await self._apply(mapper.feed(item))
        finally:
            await stream.aclose()  # cancels the graph's tasks (their model streams) at once
        await self._apply(mapper.finish())
        self.ctx.usage(
            input_tokens=mapper.usage[0],
            output_tokens=mapper.usage[1],
            reasoning_tokens=mapper.usage[2],
        )
        snap = await self._checked(graph.aget_state(self.config))
        interrupts = []
        for x in snap.interrupts:
            value = _as_json(x.value)
            lc_call = value.get("tool_call_id") if isinstance(value, dict) else None
            interrupts.append(
                _Interrupt(
                    id=x.id,
                    summary=self.agent._approval_summary(value),
                    tool_call_id=mapper.calls.get(str(lc_call), "") if lc_call else "",
                    value=value,
                )
            )
        return _Segment(
            interrupts=interrupts,
            done=not snap.next and not interrupts,
            calls=mapper.calls,
            streamed=mapper.streamed,
        )

    def _new_id(self, kind: str) -> str:
        return self.ctx.message_id() if kind == "m" else self.ctx.tool_call_id()

    async def _items(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """The graph's items; its exceptions as coded errors (ours, raised
        while we handle an item, are not the graph's and pass untouched)."""
        while True:
            try:
                item = await anext(stream)
            except StopAsyncIteration:
                return
            except GraphRecursionError as e:
                raise AgentError("graph_recursion_limit", "the graph's recursion limit") from e
            except psycopg.Error as e:
                raise AgentError(
                    "checkpoint_unavailable",
                    "the graph's checkpoints cannot be written",
                    retryable=True,
                ) from e
            except Exception as e:
                raise AgentError("graph_error", f"the graph raised {type(e).__name__}") from e
            yield item

    async def _checked(self, aw: Awaitable[Any]) -> Any:
        try:
            return await aw
        except psycopg.Error as e:
            raise AgentError(
                "checkpoint_unavailable", "the graph's checkpoints cannot be read", retryable=True
            ) from e

    async def _apply(self, emits: list[Emit]) -> None:
        for method, args in emits:
            if method == "tool_start":  # (card, name, risk): risk is keyword-only
                await self.ctx.tool_start(args[0], args[1], risk=args[2])
            else:
                await getattr(self.ctx, method)(*args)

    async def _forget(self) -> None:
        """The run is over: its checkpoints serve nothing more. Best effort
        (never on a stop or a handover: another worker may need them)."""
        if self.agent._keep:
            return
        try:
            saver = await self.agent._checkpoints.saver(self.ctx.settings.database_url)
            await saver.adelete_thread(self.ctx.run_id)
        except (AgentError, psycopg.Error) as e:
            log.warning("run %s: checkpoints not deleted (%s)", self.ctx.run_id, e)


def langgraph_agent(
    graph: Pregel | StateGraph[Any],
    *,
    input_key: str | None = "messages",
    history: bool = True,
    make_input: Callable[[AgentContext], Awaitable[Any]] | None = None,
    config: RunnableConfig | None = None,
    risk: Risk | None = None,
    approval_summary: Callable[[Any], str] = default_approval_summary,
    resume_value: Callable[[Decision, Any], Any] = default_resume_value,
    node_status: bool = True,
    keep_checkpoints: bool = False,
    pool_size: int = 8,
) -> LangGraphAgent:
    """A runlog agent that runs `graph` (compiled without a checkpointer, or
    its builder) for every run.

    - Input: `{input_key: [*earlier turns of the session, HumanMessage(run input)]}`
      (`history=False`: the run's input only); `input_key=None`: the input
      text itself; `make_input(ctx)` for anything else.
    - `config`: merged into every call (`recursion_limit`: supersteps per run,
      default 25); `configurable.thread_id` is the run id.
    - `risk`: tool name -> risk level of its card (a mapping or a function).
    - Approvals: `approval_summary(value)` is the text of the approval an
      `interrupt(value)` asks for (value as JSON); a dict value's
      `tool_call_id` (the LangGraph tool call, `InjectedToolCallId`) attaches it
      to that tool card. `resume_value(decision, value)` is what `interrupt()`
      returns: default `{"approved", "decision", "comment", "decided_by"}`.
    - `node_status`: a `status` (`node`, name) per root node that finishes.
    - `keep_checkpoints`: keep the thread's checkpoints after the run ended
      (default: deleted; a stopped or handed-over run keeps them).
    """
    if isinstance(graph, StateGraph):
        graph = graph.compile()
    if not isinstance(graph, Pregel):
        raise TypeError(f"langgraph_agent needs a compiled graph, not {type(graph).__name__}")
    if graph.checkpointer not in (None, False):
        raise ValueError(
            "compile the graph without a checkpointer: runlog checkpoints it in its PostgreSQL"
        )
    return LangGraphAgent(
        graph,
        input_key=input_key,
        history=history,
        make_input=make_input,
        config=config,
        risk=risk,
        approval_summary=approval_summary,
        resume_value=resume_value,
        node_status=node_status,
        keep_checkpoints=keep_checkpoints,
        pool_size=pool_size,
    )
