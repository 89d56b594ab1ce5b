"""`bench agents` case `agui`: an AG-UI upstream in the bench process that
answers each POSTed `RunAgentInput` (n = its last user message) with
RUN_STARTED, one assistant message of n TEXT_MESSAGE_CONTENT events
(`deltas(n)`), RUN_FINISHED, encoded by `ag_ui.encoder.EventEncoder` and
written as fast as it can; read bare by a minimal AG-UI client in the bench
process (aiohttp, SSE lines, each event validated as `ag_ui.core.Event`: the
SDK has no client of its own), and by the AG-UI adapter in a worker
(`RUNLOG_AGENT=workers.frameworks.agui:agent`, `RUNLOG_AGUI_URL` = the
upstream).

The upstream runs on an event loop in a thread of its own, so that its CPU
(`Upstream.cpu_s`, that thread's clock) can be told apart from the bare
client's, which runs on the bench's loop in the same process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pydantic
from ag_ui.core import (
    Event,
    EventType,
    RunAgentInput,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    UserMessage,
)
from ag_ui.encoder import EventEncoder
from aiohttp import web

from broker.sockets import free_port

from ._agents import deltas

AGENT = "workers.frameworks.agui:agent"
_EVENTS: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(Event)


async def _answer(request: web.Request) -> web.StreamResponse:
    inp = RunAgentInput.model_validate_json(await request.read())
    user = [m for m in inp.messages if m.role == "user"][-1]
    pieces = deltas(int(str(user.content)))
    enc = EventEncoder(accept=request.headers.get("Accept", ""))
    resp = web.StreamResponse(headers={"Content-Type": enc.get_content_type()})
    await resp.prepare(request)

    async def send(ev: Any) -> None:
        await resp.write(enc.encode(ev).encode())

    m = "m1"
    await send(RunStartedEvent(thread_id=inp.thread_id, run_id=inp.run_id))
    await send(TextMessageStartEvent(message_id=m, role="assistant"))
    for piece in pieces:
        await send(TextMessageContentEvent(message_id=m, delta=piece))
    await send(TextMessageEndEvent(message_id=m))
    await send(RunFinishedEvent(thread_id=inp.thread_id, run_id=inp.run_id))
    await resp.write_eof()
    return resp


class Upstream:
    """The upstream server on its own thread and loop (see the module doc)."""

    def __init__(self) -> None:
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agui-upstream")
        self._runner: web.AppRunner | None = None

    def cpu_s(self) -> float:
        """The upstream thread's CPU time so far."""
        assert self._thread.ident is not None
        return time.clock_gettime(time.pthread_getcpuclockid(self._thread.ident))

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/agent", _answer)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port, backlog=1024).start()
        self.url = f"http://127.0.0.1:{port}/agent"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _call(self, coro: Any) -> None:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    @classmethod
    @contextlib.asynccontextmanager
    async def serving(cls) -> AsyncIterator[Upstream]:
        up = cls()
        up._thread.start()
        try:
            await up._call(up._start())
            yield up
        finally:
            with contextlib.suppress(Exception):
                await up._call(up._stop())
            up._loop.call_soon_threadsafe(up._loop.stop)
            await asyncio.to_thread(up._thread.join)
            up._loop.close()


async def bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    url = str(settings["agui_url"])
    headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}

    async def one(http: aiohttp.ClientSession) -> int:
        inp = RunAgentInput(
            thread_id=uuid.uuid4().hex, run_id=uuid.uuid4().hex,
            messages=[UserMessage(id="u1", content=str(n))],
        )  # fmt: skip
        k = 0
        data: list[bytes] = []
        async with http.post(url, data=inp.model_dump_json(by_alias=True), headers=headers) as r:
            r.raise_for_status()
            async for line in r.content:
                line = line.rstrip(b"\r\n")
                if line.startswith(b"data:"):
                    data.append(line[5:].lstrip())
                elif not line and data:
                    ev = _EVENTS.validate_json(b"\n".join(data))
                    k += ev.type == EventType.TEXT_MESSAGE_CONTENT
                    data = []
        return k

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        return sum(await asyncio.gather(*(one(http) for _ in range(runs))))
