"""Tools the agent may call, and the registry that holds them.

A tool is a named async function with a JSON Schema for its arguments and a
risk level:

- `low` and `medium` tools run as soon as the model calls them;
- `high` tools wait for a human approval first (see docs/workers.md).

Contract of `fn(args, ctx)`: `args` is the decoded JSON object the model sent
(validated only as "an object"; check the rest yourself); it returns a
`ToolOutput`; it may `await ctx.progress(label, done, total)` any number of
times; it raises `workers.errors.ToolError` for a failure whose message is
safe to show. A tool marked `cancellable` must tolerate being cancelled at
any await (a stop cancels it at once); a tool that is not cancellable is left
to finish (within the tool timeout) before the run stops. `side_effects`
marks tools that change something outside the run: the stop audit lists the
calls of such tools that had started.

`retryable` says whether a call may run again when its worker died while it
ran (a takeover resumes the run, docs/workers.md): a tool that is safe to
repeat (reads, idempotent writes) keeps the default; mark non-idempotent
side-effecting tools (send, pay, append) `retryable=False` — an interrupted
call of such a tool is never run again: the run fails `tool_interrupted`.
Calls that finished (their `tool_result` is durable) never run again either
way.

Tools are registered by import path (setting `tools`: comma-separated
`module:attr`, each attribute a Tool or a list of Tools).
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, Protocol

from broker.events import RiskLevel

from .model import ToolSpec


class ToolOutput:
    """What a tool returns: `summary` reaches clients; `raw` reaches the model
    (and clients only when the `tool_raw_output` setting allows)."""

    __slots__ = ("raw", "status", "summary")

    def __init__(self, summary: str, raw: str = "", status: Literal["ok", "error"] = "ok") -> None:
        self.status = status
        self.summary = summary
        self.raw = raw


class ToolContext(Protocol):
    run_id: str
    tool_call_id: str

    async def progress(self, label: str, done: int, total: int) -> None: ...


ToolFn = Callable[[dict[str, object], ToolContext], Awaitable[ToolOutput]]


@dataclass(frozen=True, kw_only=True)
class Tool:
    name: str
    description: str
    fn: ToolFn
    parameters: dict[str, object] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    risk: RiskLevel = "low"
    cancellable: bool = True
    side_effects: bool = False
    retryable: bool = True

    def spec(self) -> ToolSpec:
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def approval_summary(self, arguments: str) -> str:
        """The line an approver reads."""
        shown = arguments if len(arguments) <= 300 else arguments[:297] + "..."
        return f"{self.name} wants to run with {shown}"


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, tool: Tool) -> None:
        if tool.name in self._tools:
            raise ValueError(f"two tools are named {tool.name!r}")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def names(self) -> list[str]:
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        return [t.spec() for t in self._tools.values()]


def load_tools(paths: str) -> ToolRegistry:
    """Build a registry from `module:attr` paths (comma-separated)."""
    registry = ToolRegistry()
    for path in (p.strip() for p in paths.split(",")):
        if not path:
            continue
        module_name, _, attr = path.partition(":")
        if not attr:
            raise ValueError(f"tool path {path!r} must look like module:attr")
        value = getattr(importlib.import_module(module_name), attr)
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            if not isinstance(item, Tool):
                raise ValueError(f"{path} holds {type(item).__name__}, not a Tool")
            registry.add(item)
    return registry
