"""Demo tools, one per risk level (the default of the `tools` setting).

They touch nothing outside the process: `send_message` and `save_note` only
pretend, but are marked with side effects, and as not retryable (sent or
saved twice is not the same as once), so stops, approvals and takeovers treat
them as real ones would be.
"""

from __future__ import annotations

import asyncio

import msgspec

from .errors import ToolError
from .tools import Tool, ToolContext, ToolOutput


def _int_arg(args: dict[str, object], name: str, default: int, lo: int, hi: int) -> int:
    value = args.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ToolError(f"argument {name!r} must be an integer")
    return max(lo, min(hi, value))


def _str_arg(args: dict[str, object], name: str) -> str:
    value = args.get(name)
    if not isinstance(value, str) or not value:
        raise ToolError(f"argument {name!r} must be a non-empty string")
    return value


async def search_docs(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    query = _str_arg(args, "query")
    steps = _int_arg(args, "steps", 3, 1, 1000)
    delay_ms = _int_arg(args, "delay_ms", 100, 0, 10_000)
    for i in range(steps):
        await asyncio.sleep(delay_ms / 1000)
        await ctx.progress("searching the docs", i + 1, steps)
    hits = [
        {"title": f"{query.title()}: overview", "url": "https://docs.example.com/overview"},
        {"title": f"Configuring {query}", "url": "https://docs.example.com/config"},
        {"title": f"{query.title()} troubleshooting", "url": "https://docs.example.com/faq"},
    ]
    return ToolOutput(
        summary=f"Found {len(hits)} documents about {query!r}",
        raw=msgspec.json.encode(hits).decode(),
    )


async def save_note(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    text = _str_arg(args, "text")
    await asyncio.sleep(0.01)
    return ToolOutput(summary=f"Saved a note of {len(text)} characters", raw=text)


async def send_message(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    to = _str_arg(args, "to")
    text = _str_arg(args, "text")
    await asyncio.sleep(0.05)
    return ToolOutput(summary=f"Message sent to {to}", raw=f"to={to} chars={len(text)}")


TOOLS = [
    Tool(
        name="search_docs",
        description="Search the product documentation.",
        fn=search_docs,
        parameters={
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "steps": {"type": "integer", "minimum": 1},
                "delay_ms": {"type": "integer", "minimum": 0},
            },
            "required": ["query"],
        },
        risk="low",
        cancellable=True,
        side_effects=False,
    ),
    Tool(
        name="save_note",
        description="Save a note in the session's notebook.",
        fn=save_note,
        parameters={
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
        risk="medium",
        cancellable=False,
        side_effects=True,
        retryable=False,
    ),
    Tool(
        name="send_message",
        description="Send a message to a person outside the session (needs approval).",
        fn=send_message,
        parameters={
            "type": "object",
            "properties": {"to": {"type": "string"}, "text": {"type": "string"}},
            "required": ["to", "text"],
        },
        risk="high",
        cancellable=False,
        side_effects=True,
        retryable=False,
    ),
]
