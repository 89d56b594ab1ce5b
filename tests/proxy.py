"""A small TCP proxy that can cut connections at chosen moments (adversity tests)."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

# How long a held chunk's server connection waits for the reply after the
# chunk is finally forwarded (the server acts on it before replying).
_HELD_REPLY_WAIT_S = 10.0


class CuttingProxy:
    """Forwards 127.0.0.1:<port> to a target. When armed with a marker, the
    next client→server chunk containing it cuts that connection, in one of
    three ways (`arm`'s arguments):

    - forwarded, then both sides closed before the server's reply can reach
      the client: the client cannot know whether the server acted on it;
    - `forward=False`: dropped, both sides closed: the server never sees it
      (a transaction in flight rolls back);
    - `hold_s > 0`: the client side is closed at once, but the chunk reaches
      the server only `hold_s` later, over a server connection kept open
      until then (a transaction in flight keeps its locks meanwhile), and is
      closed once the server replied."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._marker: bytes | None = None
        self._forward = True
        self._hold_s = 0.0
        self.cuts = 0
        self._holding = 0
        self._partitioned = False
        self._writers: set[asyncio.StreamWriter] = set()
        # What clients sent to the server since `record()` (None: not recording).
        self.recorded: bytearray | None = None

    @classmethod
    def in_front_of(cls, url: str) -> CuttingProxy:
        """A proxy to the server of `url` (started with `start`)."""
        u = urlsplit(url)
        return cls(u.hostname or "127.0.0.1", u.port or 5432)

    def route(self, url: str) -> str:
        """`url`, through this (started) proxy."""
        port = urlsplit(url).port or 5432
        return url.replace(f":{port}/", f":{self.port}/", 1)

    def arm(self, marker: bytes, *, forward: bool = True, hold_s: float = 0.0) -> None:
        self._marker = marker
        self._forward = forward
        self._hold_s = hold_s

    @property
    def busy(self) -> bool:
        """A held chunk has not been forwarded and answered yet."""
        return self._holding > 0

    def record(self) -> None:
        """Keep what clients send from now on in `recorded` (from empty)."""
        self.recorded = bytearray()

    def partition(self) -> None:
        """Cut every connection and refuse new ones (accepted, then closed)
        until `heal`: the client side sees its server gone, which stays up
        for everyone else."""
        self._partitioned = True
        for w in list(self._writers):
            w.close()

    def heal(self) -> None:
        self._partitioned = False

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
        if self._partitioned:
            cw.close()
            return
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        self._writers |= {cw, sw}
        cut = asyncio.Event()
        replied = asyncio.Event()

        async def client_to_server() -> None:
            while data := await cr.read(65536):
                if self.recorded is not None:
                    self.recorded += data
                if self._marker is not None and self._marker in data:
                    self._marker = None
                    self.cuts += 1
                    cut.set()
                    if not self._forward:
                        return
                    if self._hold_s <= 0:
                        sw.write(data)
                        await sw.drain()
                        return
                    self._holding += 1
                    try:
                        cw.close()
                        await asyncio.sleep(self._hold_s)
                        sw.write(data)
                        await sw.drain()
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(_HELD_REPLY_WAIT_S):
                                await replied.wait()
                    finally:
                        self._holding -= 1
                    return
                sw.write(data)
                await sw.drain()

        async def server_to_client() -> None:
            while data := await sr.read(65536):
                if cut.is_set():
                    replied.set()
                    await asyncio.Event().wait()  # client_to_server ends the connection
                cw.write(data)
                await cw.drain()

        tasks = [asyncio.create_task(client_to_server()), asyncio.create_task(server_to_client())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in (cw, sw):
            w.close()
            self._writers.discard(w)
