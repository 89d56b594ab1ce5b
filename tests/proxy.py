"""A small TCP proxy that can cut connections at chosen moments (adversity tests)."""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to a target. When armed with a marker, the
    next client→server chunk containing it is forwarded, then both sides are
    closed before the server's reply can reach the client: the client cannot
    know whether the server acted on it."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self.cuts = 0
        self._writers: set[asyncio.StreamWriter] = set()

    def arm(self, marker: bytes) -> None:
        self._marker = marker

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            await self._server.wait_closed()

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self._writers |= {cw, sw}
        cut = asyncio.Event()

        async def client_to_server() -> None:
            while data := await cr.read(65536):
                sw.write(data)
                await sw.drain()
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    self.cuts += 1
                    cut.set()
                    return

        async def server_to_client() -> None:
            while data := await sr.read(65536):
                if cut.is_set():
                    return
                cw.write(data)
                await cw.drain()

        tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for w in (cw, sw):
            w.close()
            self._writers.discard(w)
