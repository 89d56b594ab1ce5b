"""LangGraph graphs as runlog agents: `langgraph_agent(graph)` (docs/agents.md).

Any compiled graph (`StateGraph(...).compile()` without a checkpointer) or a
graph builder runs with runlog's PostgreSQL as its checkpointer
(`AsyncPostgresSaver` over one psycopg pool per process; thread id = the run
id). Its stream (`astream(stream_mode=["messages", "updates", "custom"],
subgraphs=True)`) becomes the run's events (`_langgraph_stream.py`).
`interrupt(value)` in a node is an approval (`ctx.approval`); the decision
resumes the graph with `Command(resume={interrupt id: resume_value(...)})`.

Durability. The graph runs one superstep per `astream` call (LangGraph's
`interrupt_after="*"`; `astream(None)` goes on from the checkpoint), and each
call is a `ctx.step` (`segment-{i}`) whose stored result is what the adapter
needs afterwards: the pending interrupts, which LangGraph tool call is which
runlog tool card, and the superstep's tool results, which are emitted after
its step (each a durable point): a tool result is in the log only once the
superstep that ran the tool is stored. So a takeover replays the stored
segments without running the graph, waits on (or finds) the same approval, and
runs the next superstep from the PostgreSQL checkpoint on the new worker; a
worker killed after a tool result reached the log (during the answer after an
approved tool, say) is resumed at the next superstep. A worker that dies
inside a superstep: that segment runs again from the last checkpoint (`None`
as input, or the same `Command(resume=...)` while the interrupt is still
pending), so a model call in flight is issued again (runlog retracts its
partial text) and its nodes run again (a tool too, unless it waits in
`interrupt()` for its decision), but not the nodes that had finished: LangGraph
applies their saved writes without streaming them, so their tool results are
read from the state at the segment's end. The graph's static
breakpoints (`interrupt_before/after`) are superstep boundaries here, not
pauses; `recursion_limit` counts supersteps since the input or the last resume,
as LangGraph does per invocation.

Stop cancels the agent's task; the cancellation reaches `astream` and through
it the node's model call (closing its connection). Exceptions of the graph end
the run with a coded error: `graph_error`, `graph_recursion_limit`,
`checkpoint_unavailable` (retryable: the checkpoint store cannot be reached).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, cast

import msgspec
import psycopg
from langchain_core.messages import (
    AIMessage,
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
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from broker.events import RiskLevel, ToolStatus
from workers.api import AgentContext, AgentError, Decision

from ._langgraph_stream import Emit, StreamMapper

__all__ = ["Checkpoints", "LangGraphAgent", "langgraph_agent"]

log = logging.getLogger(__name__)

# A list: given a tuple, astream yields bare payloads instead of (ns, mode, payload).
_MODES: list[StreamMode] = ["messages", "updates", "custom"]
_APPROVAL_CHARS = 500
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


class _Result(msgspec.Struct, kw_only=True):
    """A tool result of the superstep, emitted after its step."""

    card: str
    status: ToolStatus
    summary: str
    output: str


class _Segment(msgspec.Struct, kw_only=True):
    interrupts: list[_Interrupt] = []
    done: bool = False  # the graph has no next task
    calls: dict[str, str] = {}  # LangGraph tool call id -> runlog tool card, until its result
    streamed: list[str] = []  # LangGraph message ids already shown
    results: list[_Result] = []


def _as_json(value: Any) -> Any:
    """The value as plain JSON values (pydantic models dumped, others str)."""

    def enc(obj: Any) -> Any:
        dump = getattr(obj, "model_dump", None)
        return dump(mode="json") if callable(dump) else str(obj)

    return msgspec.json.decode(msgspec.json.encode(value, enc_hook=enc))


# -- the checkpointer: runlog's PostgreSQL


class Checkpoints:
    """One psycopg pool per DSN for the process's runs. Each run gets its own
    saver over the pool (a saver serializes its calls behind one lock).

    The checkpoint tables are runlog's migrations' (0011), never the saver's
    `setup()`: opening a pool checks they are there, as recent as the
    installed library's `MIGRATIONS` (`checkpoint_migrations`), and refuses
    with `checkpoint_unavailable` naming `runlog migrate` otherwise."""

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
                dsn, autocommit=True, prepare_threshold=0
            ) as conn:
                # Two statements: a query naming a missing table fails to plan.
                cur = await conn.execute("SELECT to_regclass('checkpoint_migrations')")
                row = await cur.fetchone()
                if row is not None and row[0] is not None:
                    cur = await conn.execute("SELECT max(v) FROM checkpoint_migrations")
                    row = await cur.fetchone()
                else:
                    row = None
            migrated = -1 if row is None or row[0] is None else int(row[0])
            if migrated < len(AsyncPostgresSaver.MIGRATIONS) - 1:
                raise AgentError(
                    "checkpoint_unavailable",
                    "the graph's checkpoint tables are missing or older than the installed"
                    " langgraph-checkpoint-postgres needs: run `runlog migrate`",
                    retryable=True,
                )
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
        except (psycopg.Error, PoolTimeout, OSError) as e:
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
        self._checkpoints = Checkpoints(pool_size)

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
        self._graph: Pregel | None = None  # the graph with this run's saver
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
        since_input = 0  # supersteps since the input or the last resume (LangGraph's count)
        i = 0
        while True:
            if since_input >= self.limit:
                raise AgentError(
                    "graph_recursion_limit",
                    f"recursion limit of {self.limit} supersteps reached",
                )
            self.state = await ctx.step(
                f"segment-{i}", functools.partial(self._segment, i, resume), type=_Segment
            )
            for r in self.state.results:  # each a durable point, after the superstep's
                await ctx.tool_result(r.card, r.status, r.summary, r.output)
            i += 1
            since_input += 1
            if self.state.interrupts:
                resume = {}
                for intr in self.state.interrupts:
                    d = await ctx.approval(intr.summary, tool_call_id=intr.tool_call_id)
                    if not d.approved and intr.tool_call_id:
                        self.denied.add(intr.tool_call_id)
                    resume[intr.id] = self.agent._resume_value(d, intr.value)
                since_input = 0
            elif self.state.done:
                break
            else:
                resume = None

    async def _saver(self) -> AsyncPostgresSaver:
        return await self.agent._checkpoints.saver(self.ctx.settings.database_url)

    async def _segment(self, i: int, resume: dict[str, Any] | None) -> _Segment:
        if self._graph is None:
            self._graph = self.agent.graph.copy(update={"checkpointer": await self._saver()})
        graph = self._graph
        inp: Any = None
        retried = self.retrying
        if self.retrying:
            # The last owner may have run part of this segment: go on from
            # the last checkpoint rather than send the input again.
            snap = await _checked(graph.aget_state(self.config))
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
        results: list[_Result] = []
        try:
            while (item := await _next(stream)) is not _END:
                await self._apply(mapper.feed(item), results)
        finally:
            await stream.aclose()  # cancels the graph's tasks (their model streams) at once
        await self._apply(mapper.finish(), results)
        self.ctx.usage(
            input_tokens=mapper.usage[0],
            output_tokens=mapper.usage[1],
            reasoning_tokens=mapper.usage[2],
        )
        snap = await _checked(graph.aget_state(self.config))
        if retried and mapper.calls:
            # A task the last owner finished is not run again: LangGraph applies
            # its saved writes and streams no messages of it. Its tool results
            # are in the state.
            for msg in _tool_messages(snap.values):
                if msg.tool_call_id in mapper.calls:
                    await self._apply(mapper.feed(((), "messages", (msg, {}))), results)
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
            results=results,
        )

    def _new_id(self, kind: str) -> str:
        return self.ctx.message_id() if kind == "m" else self.ctx.tool_call_id()

    async def _apply(self, emits: list[Emit], results: list[_Result]) -> None:
        for method, args in emits:
            if method == "tool_start":  # (card, name, risk): risk is keyword-only
                await self.ctx.tool_start(args[0], args[1], risk=args[2])
            elif method == "tool_result":
                # Held for after the step: a tool result in the log says the
                # tool ran, and must follow the stored superstep that ran it.
                card, status, summary, output = args
                results.append(_Result(card=card, status=status, summary=summary, output=output))
            else:
                await getattr(self.ctx, method)(*args)

    async def _forget(self) -> None:
        """The run is over: its checkpoints serve nothing more. Best effort
        (never on a stop or a handover: another worker may need them)."""
        if self.agent._keep:
            return
        try:
            await (await self._saver()).adelete_thread(self.ctx.run_id)
        except (AgentError, psycopg.Error, PoolTimeout) as e:
            log.warning("run %s: checkpoints not deleted (%s)", self.ctx.run_id, e)


def _tool_messages(values: Any) -> list[ToolMessage]:
    """The ToolMessages in a graph state's message lists."""
    if not isinstance(values, dict):
        return []
    return [
        m for v in values.values() if isinstance(v, list) for m in v if isinstance(m, ToolMessage)
    ]


_END = object()
_UNREACHABLE = (psycopg.OperationalError, PoolTimeout)  # the checkpoint store, not the graph


async def _next(stream: AsyncGenerator[Any, None]) -> Any:
    """The graph's next item (`_END` after the last); its exceptions as coded
    errors. Ours, raised while an item is handled, never pass here."""
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return _END
    except GraphRecursionError as e:
        raise AgentError("graph_recursion_limit", "the graph's recursion limit") from e
    except _UNREACHABLE as e:
        raise AgentError(
            "checkpoint_unavailable", "the graph's checkpoints cannot be written", retryable=True
        ) from e
    except Exception as e:
        raise AgentError("graph_error", f"the graph raised {type(e).__name__}") from e


async def _checked(aw: Awaitable[Any]) -> Any:
    try:
        return await aw
    except _UNREACHABLE as e:
        raise AgentError(
            "checkpoint_unavailable", "the graph's checkpoints cannot be read", retryable=True
        ) from e


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
