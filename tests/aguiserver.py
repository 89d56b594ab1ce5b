"""A small upstream AG-UI 1.0 server for the adapter tests (no tests here).

Each POST is validated as a `RunAgentInput` (the real `ag_ui.core` model)
and answered by the test's script, `async def script(ex: Exchange)`, whose
events are encoded by `ag_ui.encoder.EventEncoder` (the SDK's own SSE
framing). The server counts what the tests assert on: the requests it got,
the side effects scripts performed, and the streams whose client went away
(the handler is cancelled when the client disconnects).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from ag_ui.core import BaseEvent, RunAgentInput, RunStartedEvent
from ag_ui.encoder import EventEncoder
from aiohttp import web

from broker.sockets import free_port


class Exchange:
    """One POST: its input, and the answer's stream (opened by the first send)."""

    def __init__(self, request: web.Request, inp: RunAgentInput) -> None:
        self.request = request
        self.input = inp
        self.encoder = EventEncoder(accept=request.headers.get("Accept", ""))
        self.response: web.StreamResponse | None = None

    async def _open(self) -> web.StreamResponse:
        if self.response is None:
            self.response = web.StreamResponse(
                headers={"Content-Type": self.encoder.get_content_type()}
            )
            await self.response.prepare(self.request)
        return self.response

    async def send(self, *evs: BaseEvent) -> None:
        resp = await self._open()
        for ev in evs:
            await resp.write(self.encoder.encode(ev).encode())

    async def raw(self, data: bytes) -> None:
        """Bytes as they are (malformed streams)."""
        await (await self._open()).write(data)

    async def started(self) -> None:
        await self.send(RunStartedEvent(thread_id=self.input.thread_id, run_id=self.input.run_id))


Script = Callable[[Exchange], Awaitable[web.StreamResponse | None]]


class Upstream:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.url = ""
        self.requests: list[RunAgentInput] = []
        self.headers: list[dict[str, str]] = []
        self.side_effects = 0
        self.disconnects = 0
        self.gate = asyncio.Event()  # what a script may wait on before going on

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            inp = RunAgentInput.model_validate_json(body)
        except ValueError as e:
            return web.Response(status=422, text=str(e))
        self.requests.append(inp)
        self.headers.append(dict(request.headers))
        ex = Exchange(request, inp)
        try:
            answer = await self.script(ex)
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnects += 1  # the client closed the connection mid-answer
            raise
        if answer is not None:
            return answer
        assert ex.response is not None, "a script sends events or returns a response"
        await ex.response.write_eof()
        return ex.response


@asynccontextmanager
async def serving(script: Script) -> AsyncIterator[Upstream]:
    up = Upstream(script)
    app = web.Application()
    app.router.add_post("/agent", up.handle)
    # handler_cancellation: a client that goes away cancels the script at once,
    # which is how a test sees the worker close the connection.
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    up.url = f"http://127.0.0.1:{port}/agent"
    try:
        yield up
    finally:
        await runner.cleanup()
