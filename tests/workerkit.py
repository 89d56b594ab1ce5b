"""Helpers for the worker tests (no tests here): workers in-process or as
`runlog worker` subprocesses, against the real NATS and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from broker import events
from broker.constants import JOBS_STREAM
from broker.runtime import Broker
from broker.settings import Settings
from workers.adapters.scripted import ScriptedAdapter
from workers.builtin_tools import TOOLS as BUILTIN_TOOLS
from workers.model import Message, ModelAdapter, ModelRequest, TextChunk
from workers.tools import Tool, ToolContext, ToolOutput
from workers.worker import Worker

REPO = Path(__file__).resolve().parent.parent

# Fast, but not so short that a slow, noisy machine loses leases by accident.
WORKER_DEFAULTS: dict[str, Any] = {
    "scripted_tokens_per_s": 0.0,
    "worker_lease_s": 3.0,
    "worker_reaper_interval_s": 0.5,
    "worker_liveness_grace_s": 1.0,
    "worker_stale_queued_s": 3600.0,  # runs other tests left queued stay theirs
    "worker_enqueue_retry_s": 0.2,
    "approval_timeout_s": 60.0,
    "approval_poll_s": 0.2,
    "drain_timeout_s": 2.0,
}


# A worker whose runs wait for their approvals in their slots (never parked:
# approval_park_after_s < 0), so a kill, a pause or a drain meets a run
# waiting, as with a park delay or in the moment before a run parks.
IN_SLOT: dict[str, Any] = {"approval_park_after_s": -1.0}
# The settings of a worker process a test kills: a short lease (takeovers
# come quickly) and runs that wait in their slots (IN_SLOT).
DOOMED: dict[str, Any] = {"worker_lease_s": 2.0, **IN_SLOT}


def worker_settings(settings: Settings, **overrides: Any) -> Settings:
    return dataclasses.replace(settings, **{**WORKER_DEFAULTS, **overrides})


async def purge_jobs(broker: Broker) -> None:
    """Drop job messages earlier tests left unconsumed (they ran no worker),
    and retire the runs they left unended (a test's runs end with it): a
    worker of this test would take them over, resume them, and count it."""
    await broker.bus.js.purge_stream(JOBS_STREAM)
    await broker.store.pool.execute(
        "UPDATE runs SET ended_at = now(), status = 'failed', owner_epoch = owner_epoch + 1,"
        " lease_until = NULL WHERE ended_at IS NULL"
    )


@asynccontextmanager
async def running_worker(
    settings: Settings,
    *,
    concurrency: int = 16,
    adapter: ModelAdapter | None = None,
    purge: bool = True,
    **overrides: Any,
) -> AsyncIterator[tuple[Broker, Worker]]:
    s = worker_settings(settings, **overrides)
    registry = CollectorRegistry()
    b = await Broker.connect(s, registry=registry, name="test-worker")
    w = Worker(b, s, concurrency=concurrency, registry=registry, adapter=adapter)
    try:
        if purge:
            await purge_jobs(b)
        await w.start()
        yield b, w
    finally:
        await w.close()
        await b.close()


async def start(broker: Broker, input: str, user: str = "alice") -> tuple[str, str]:
    session_id = await broker.store.create_session(user)
    await broker.store.add_member(session_id, "bob", "approver", user)
    await broker.store.add_member(session_id, "carol", "approver", user)
    run_id = await broker.start_run(session_id, user, input=input)
    return session_id, run_id


async def read_run(broker: Broker, run_id: str, timeout_s: float = 60.0) -> list[events.AnyEvent]:
    """Every event of the run, waiting for its run_end."""
    sub = await broker.subscribe(run_id=run_id, after=0)
    got = []
    try:
        async with asyncio.timeout(timeout_s):
            async for batch in sub:
                got.extend(batch)
    finally:
        await sub.close()
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    return [events.decode_stored(e.payload) for e in got]


async def wait_event(
    broker: Broker, run_id: str, type_: str, timeout_s: float = 60.0, *, count: int = 1
) -> events.AnyEvent:
    """The `count`-th event of type `type_` in the run (waiting for it)."""
    sub = await broker.subscribe(run_id=run_id, after=0)
    seen = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for batch in sub:
                for e in batch:
                    if e.type == type_:
                        seen += 1
                        if seen == count:
                            return events.decode_stored(e.payload)
    finally:
        await sub.close()
    raise AssertionError(f"run {run_id} ended without {count} {type_} event(s)")


async def stored(broker: Broker, run_id: str) -> list[events.AnyEvent]:
    """The run's log as PostgreSQL has it now, checked contiguous."""
    page = await broker.store.run_page(run_id, 0, 100000)
    assert [e.seq for e in page] == list(range(1, len(page) + 1))
    return [events.decode_stored(e.payload) for e in page]


def of(evs: list[events.AnyEvent], cls: type[Any]) -> list[Any]:
    return [e for e in evs if isinstance(e, cls)]


def text_of(evs: list[events.AnyEvent]) -> str:
    return "".join(e.delta for e in of(evs, events.TextDelta))


async def scripted_text(input: str) -> str:
    """What the scripted model answers to `input` (as fast as it can)."""
    stream = ScriptedAdapter(tokens_per_s=0).stream(
        ModelRequest(messages=[Message(role="user", content=input)])
    )
    return "".join([item.text async for item in stream if isinstance(item, TextChunk)])


async def wait_until(pred: Any, timeout_s: float = 30.0, interval_s: float = 0.05) -> None:
    async with asyncio.timeout(timeout_s):
        while not await pred():
            await asyncio.sleep(interval_s)


class WorkerProcess:
    """`python -m runlog.cli worker` as a child process, settings by RUNLOG_* env."""

    def __init__(self, settings: Settings, log_path: Path, **overrides: Any) -> None:
        s = worker_settings(settings, **overrides)
        env = dict(os.environ)
        for f in dataclasses.fields(Settings):
            if f.name.startswith(
                ("worker_", "scripted_", "approval_", "drain_", "agent")
            ) or f.name in (
                "nats_url",
                "database_url",
            ):
                env["RUNLOG_" + f.name.upper()] = str(getattr(s, f.name))
        env["RUNLOG_LOG_LEVEL"] = "info"
        self.env = env
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, concurrency: int = 4, timeout_s: float = 60.0) -> None:
        log = self.log_path.open("wb")  # the child writes to it; we close our copy
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlog.cli", "worker", "--concurrency", str(concurrency),
            cwd=REPO, env=self.env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        async with asyncio.timeout(timeout_s):
            while b"ready" not in self.log_path.read_bytes():
                if self.proc.returncode is not None:
                    raise AssertionError(self.output())
                await asyncio.sleep(0.05)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
                self.proc.kill()
            await self.proc.wait()

    async def terminate(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(timeout_s):
            return await self.proc.wait()


# -- tools that count their executions (setting `tools`, in-process or in a
# `runlog worker` subprocess): a takeover must not run a finished call again.

TOOL_LOG_ENV = "RUNLOG_TEST_TOOL_LOG"  # the file each execution adds a line to


def tool_runs(path: Path) -> list[str]:
    """One "<tool> <tool_call_id>" per execution started, in order."""
    return path.read_text().splitlines() if path.exists() else []


def _record(name: str, ctx: ToolContext) -> bool:
    """Log one execution of `name`; whether it is its first."""
    path = Path(os.environ[TOOL_LOG_ENV])
    first = not any(r.startswith(f"{name} ") for r in tool_runs(path))
    with path.open("a") as f:
        f.write(f"{name} {ctx.tool_call_id}\n")
    return first


async def _counted_search(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    if _record("search_docs", ctx):  # the first execution hangs: the test kills its worker
        await ctx.progress("searching the docs", 1, 2)
        await asyncio.sleep(3600)
    return ToolOutput("Found 3 documents", raw="[]")


async def _counted_note(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    _record("save_note", ctx)
    return ToolOutput("Saved a note", raw="saved")


_SEARCH = Tool(name="search_docs", description="search (counted)", fn=_counted_search)
# search_docs may run again; save_note (a write) must not.
COUNTED_TOOLS = [
    _SEARCH,
    Tool(
        name="save_note", description="save (counted)", fn=_counted_note, risk="medium",
        side_effects=True, retryable=False,
    ),
]  # fmt: skip


def _log_line(line: str) -> None:
    with Path(os.environ[TOOL_LOG_ENV]).open("a") as f:
        f.write(line + "\n")


async def _counted_send(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    _log_line(f"send_message {ctx.run_id} {ctx.tool_call_id}")  # one line per execution
    return ToolOutput(f"Message sent to {args.get('to')}", raw="sent")


async def _instant_search(args: dict[str, object], ctx: ToolContext) -> ToolOutput:
    return ToolOutput("Found 3 documents", raw="[]")


# The built-in tools, with send_message (needs approval) counting its
# executions by run ("send_message <run_id> <tool_call_id>" per line) and
# search_docs answering at once.
_BUILTIN = {t.name: t for t in BUILTIN_TOOLS}
COUNTED_SEND_TOOLS = [
    *(t for t in BUILTIN_TOOLS if t.name not in ("send_message", "search_docs")),
    dataclasses.replace(_BUILTIN["search_docs"], fn=_instant_search),
    dataclasses.replace(_BUILTIN["send_message"], fn=_counted_send),
]

# search_docs as a write that must not run twice.
FRAGILE_TOOLS = [dataclasses.replace(_SEARCH, side_effects=True, retryable=False)]


async def killed_while_waiting(
    settings: Settings,
    client: Broker,
    log_path: Path,
    input: str = "send the report",
    env: dict[str, str] | None = None,
) -> tuple[str, events.ApprovalRequired]:
    """A run started on a worker process (DOOMED: it waits in its slot) that
    is killed with SIGKILL once the run asks for its approval: the run's id
    and its approval_required."""
    doomed = WorkerProcess(settings, log_path, **DOOMED)
    doomed.env.update(env or {})
    await doomed.start()
    try:
        _, run_id = await start(client, input)
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
    finally:
        await doomed.kill()
    return run_id, req
