"""The agent API: run your own agent as a runlog worker (docs/agents.md).

An agent is an async callable taking an `AgentContext`, registered by import
path (setting `agent = "module:attr"`); every run of the deployment executes
it. runlog owns the log (seq, ownership, batching, run_start and the one
run_end), stop, approvals and takeovers; the agent emits what it does and
wraps whatever must happen once in `ctx.step`.

Contract (public and stable; additions only):
- Events: `text`, `reasoning`, `reset`, `tool_start`, `tool_args`,
  `tool_end`, `tool_result`, `status`, `progress` append one event each
  (empty deltas are ignored); `usage` adds to the usage in run_end.
- `step(name, fn)` runs `fn()` once per run and stores its result with the
  log position; `approval(summary)` asks for a decision once per run. Both
  are matched by call order (and name) when the run is replayed.
- Replay: a run taken over from a dead worker calls the agent again from the
  top (`resumed` True). Until it passes its last stored step, steps return
  what they stored without calling `fn`, and events are dropped: they are in
  the log already. What the dead worker appended after its last step is
  retracted (`workers/resume.py`), and the agent goes on live from there.
  So: side effects belong in steps, and the code between steps must call the
  same steps in the same order given the same results.
- Stop: the agent's task is cancelled (CancelledError at its current await)
  and has `agent_stop_grace_s` to unwind; the run then ends `aborted` with
  the stop audit whatever the agent does. Never shield the cancellation of a
  model call: it is what closes the provider's connection.
- Failure: `AgentError(code)` → run_error with that code; any other
  exception → run_error `agent_error` (the traceback goes to the worker log).
- Lifetime: an agent object with an `aclose()` coroutine method (a pool, a
  client) has it awaited once when its worker closes.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, TypeVar, overload

import msgspec

from broker import events
from broker.events import RiskLevel, ToolStatus
from broker.settings import Settings

if TYPE_CHECKING:
    from .context import RunContext

T = TypeVar("T")

__all__ = ["Agent", "AgentContext", "AgentError", "ChatMessage", "Decision"]

_CODE_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")


class AgentError(Exception):
    """Ends the run `failed` with `run_error{code, retryable, message}`.

    `code` is yours to choose (`[a-z][a-z0-9_]{0,63}`); clients see it, so
    keep it stable. `message` is shown to clients: no secrets."""

    def __init__(self, code: str, message: str = "", *, retryable: bool = False) -> None:
        if not _CODE_RE.fullmatch(code):
            raise ValueError(f"error code {code!r} must match [a-z][a-z0-9_]{{0,63}}")
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message
        self.retryable = retryable


class Decision(NamedTuple):
    """An approval's outcome, decided once for every member and every worker."""

    decision: Literal["approve", "reject", "expired"]
    decided_by: str
    comment: str

    @property
    def approved(self) -> bool:
        return self.decision == "approve"


class ChatMessage(NamedTuple):
    """One message of the session's earlier runs (`AgentContext.conversation`)."""

    role: Literal["user", "assistant"]
    content: str
    run_id: str


Agent = Callable[["AgentContext"], Awaitable[None]]


class RunJournal(Protocol):
    """What an AgentContext uses of the run's journal (workers/durable.py's
    `Journal`, which imports this module: a Protocol, so this module does not
    import it back). Not part of the agent API."""

    @property
    def ctx(self) -> RunContext: ...

    async def conversation(self) -> list[ChatMessage]: ...

    def new_id(self, prefix: str) -> str: ...

    async def emit(self, event: events.Event) -> None: ...

    def add_usage(self, input_tokens: int, output_tokens: int, reasoning_tokens: int) -> None: ...

    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        retryable: bool,
        cancellable: bool = ...,
        tool_call_id: str = ...,
        type: Any = ...,
    ) -> Any: ...

    async def approval(
        self, summary: str, *, tool_call_id: str, timeout_s: float | None
    ) -> Decision: ...


class AgentContext:
    """What a run's agent sees of runlog. Made by the worker, one per run."""

    def __init__(self, journal: RunJournal, *, resumed: bool) -> None:
        self._j = journal
        run = journal.ctx.run
        self.run_id: str = run.run_id
        self.session_id: str = run.session_id
        self.input: str = run.input
        self.model: str = run.model
        self.started_by: str = run.started_by
        self.settings: Settings = journal.ctx.settings
        self.resumed = resumed

    # -- the run's conversation

    async def conversation(self) -> list[ChatMessage]:
        """The session's earlier ended runs, oldest first (at most 50): each
        run's input, then its text that was not reset. This run's own input
        is `input`, not part of it."""
        return await self._j.conversation()

    # -- ids that a replay gives again

    def message_id(self) -> str:
        return self._j.new_id("m")

    def tool_call_id(self) -> str:
        return self._j.new_id("tc")

    # -- events

    async def text(self, message_id: str, delta: str) -> None:
        if delta:
            await self._j.emit(events.TextDelta(message_id=message_id, delta=delta))

    async def reasoning(self, message_id: str, delta: str) -> None:
        """Only real model thinking; say what the agent is doing with `status`."""
        if delta:
            await self._j.emit(events.ReasoningDelta(message_id=message_id, delta=delta))

    async def reset(self, message_id: str) -> None:
        """Clients discard the message's text so far."""
        await self._j.emit(events.MessageReset(message_id=message_id))

    async def tool_start(
        self, tool_call_id: str, tool_name: str, *, risk: RiskLevel = "low"
    ) -> None:
        await self._j.emit(
            events.ToolCallStart(tool_call_id=tool_call_id, tool_name=tool_name, risk_level=risk)
        )

    async def tool_args(self, tool_call_id: str, partial_json: str) -> None:
        """Appended to the call's argument text."""
        if partial_json:
            await self._j.emit(
                events.ToolArgsDelta(tool_call_id=tool_call_id, partial_json=partial_json)
            )

    async def tool_end(self, tool_call_id: str) -> None:
        """The call's arguments are complete."""
        await self._j.emit(events.ToolCallEnd(tool_call_id=tool_call_id))

    async def tool_result(
        self,
        tool_call_id: str,
        status: ToolStatus = "ok",
        summary: str = "",
        output: str | None = None,
    ) -> None:
        """`output` reaches clients only where `tool_raw_output` allows."""
        if not self.settings.tool_raw_output:
            output = None
        await self._j.emit(
            events.ToolResult(
                tool_call_id=tool_call_id, status=status, summary=summary, output=output
            )
        )

    async def status(self, code: str, summary: str = "") -> None:
        await self._j.emit(events.Status(code=code, summary=summary))

    async def progress(self, label: str, done: int, total: int) -> None:
        await self._j.emit(events.Progress(label=label, done=done, total=total))

    def usage(
        self, *, input_tokens: int = 0, output_tokens: int = 0, reasoning_tokens: int = 0
    ) -> None:
        self._j.add_usage(input_tokens, output_tokens, reasoning_tokens)

    # -- durable operations

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        retryable: bool = True,
        cancellable: bool = True,
        tool_call_id: str = "",
    ) -> Any: ...

    @overload
    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        retryable: bool = True,
        cancellable: bool = True,
        tool_call_id: str = "",
        type: type[T],
    ) -> T: ...

    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        retryable: bool = True,
        cancellable: bool = True,
        tool_call_id: str = "",
        type: Any = None,
    ) -> Any:
        """`await fn()` once per run; its result (JSON-encodable by msgspec)
        is stored, and a replay returns it (decoded as `type` if given, else
        as plain JSON values) without calling `fn`. `retryable=False`: if the
        worker dies while `fn` runs, the run fails `step_interrupted` rather
        than calling it again. `cancellable=False`: a stop (or the drain
        deadline) waits for `fn` to return before cutting the agent short
        (the run's time limit still cancels it). `tool_call_id`: the step runs
        that tool call; if the worker dies while a not-retryable one runs,
        its card gets `tool_result` error and the run fails
        `tool_interrupted`."""
        return await self._j.step(
            name,
            fn,
            retryable=retryable,
            cancellable=cancellable,
            tool_call_id=tool_call_id,
            type=type,
        )

    async def approval(
        self, summary: str, *, tool_call_id: str = "", timeout_s: float | None = None
    ) -> Decision:
        """Ask the session's approvers; wait for their decision (or expiry
        after `timeout_s`, default `approval_timeout_s`). Asked once per run:
        a replay gets the same approval."""
        return await self._j.approval(summary, tool_call_id=tool_call_id, timeout_s=timeout_s)


def stable_id(prefix: str, *parts: object) -> str:
    """A runlog id (`ids.is_valid`) derived from `parts`: the same parts give
    the same id on every worker."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return f"{prefix}_{base64.urlsafe_b64encode(digest).decode()[:22]}"


def encode_result(value: object) -> bytes:
    try:
        return msgspec.json.encode(value)
    except (TypeError, msgspec.EncodeError) as e:
        raise TypeError(f"a step's result must be JSON-encodable by msgspec: {e}") from e


def journal_of(ctx: AgentContext) -> RunJournal:
    """The run's journal behind `ctx`, for runlog's own agent (the built-in
    loop, workers/loop.py), which reads what the API does not show: the run's
    signals, metrics and clock. Not part of the agent API (not in `__all__`)."""
    return ctx._j
