"""Raw-socket clients for tests that need to misbehave: stop reading, read
later, send frames no library would. A small receive buffer makes "not
reading" fill the path quickly, so bounds are reached with little data."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from typing import Any

import psutil

_KEY = "dGhlIHNhbXBsZSBub25jZQ=="
OP_TEXT, OP_CLOSE = 0x1, 0x8


async def _open(port: int, rcvbuf: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A loopback connection whose client end takes little from the socket."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    # A small limit: the reader stops taking data from the socket at 2x it.
    return await asyncio.open_connection(sock=sock, limit=16 * 1024)


class _Raw:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @property
    def local_port(self) -> int:
        port: int = self.writer.get_extra_info("sockname")[1]
        return port

    def server_side_open(self, server_port: int) -> bool:
        """Whether the server's end of this connection is still open. The
        gateways of these tests run in the test's process, so their sockets
        are this process's; checked without reading, which would drain them."""
        for c in psutil.Process().net_connections(kind="tcp"):
            if c.laddr and c.raddr and c.laddr.port == server_port:
                if c.raddr.port == self.local_port and c.status != psutil.CONN_CLOSE:
                    return True
        return False

    async def rest(self) -> bytes:
        """Whatever arrives until the server ends the connection. aiohttp
        closes right after its close frame when its reader was waiting, so
        our answering close frame may meet a reset: that is an end too."""
        try:
            return await self.reader.read()
        except ConnectionResetError:
            return b""

    async def closed_by_server(self) -> bool:
        """Read (and drop) everything until the server ends the connection."""
        try:
            while await self.reader.read(1 << 20):
                pass
        except ConnectionError:
            pass
        return True

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


class RawWs(_Raw):
    @classmethod
    async def connect(
        cls, port: int, token: str, *, rcvbuf: int = 4096, extra_headers: str = ""
    ) -> tuple[RawWs, bytes]:
        """Upgrade to a WebSocket; returns the client and the response head."""
        reader, writer = await _open(port, rcvbuf)
        writer.write(
            f"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {_KEY}\r\nSec-WebSocket-Version: 13\r\n{extra_headers}"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        return cls(reader, writer), head

    async def send_frame(self, opcode: int, payload: bytes) -> None:
        """A masked client frame (zero mask key: the payload goes as it is)."""
        n = len(payload)
        if n < 126:
            head = bytes([0x80 | opcode, 0x80 | n])
        else:
            head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
        self.writer.write(head + b"\0\0\0\0" + payload)
        await self.writer.drain()

    async def send(self, **msg: Any) -> None:
        await self.send_frame(OP_TEXT, json.dumps(msg).encode())

    async def frame(self) -> tuple[int, bytes]:
        """The next server frame: (opcode, payload). IncompleteReadError at EOF."""
        b0, b1 = await self.reader.readexactly(2)
        assert not b1 & 0x80, "server frames are never masked"
        assert not b0 & 0x70, "no RSV bits: nothing is compressed"
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await self.reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await self.reader.readexactly(8), "big")
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def message(self) -> dict[str, Any]:
        op, data = await self.frame()
        assert op == OP_TEXT, (op, data[:80])
        m: dict[str, Any] = json.loads(data)
        return m

    async def read_to_end(self) -> tuple[list[dict[str, Any]], int | None]:
        """Every text message until the close frame; answer it as a client
        does; then the server must close the socket (EOF) with nothing after
        its close frame. Returns (messages, close code)."""
        out: list[dict[str, Any]] = []
        while True:
            op, data = await self.frame()
            if op == OP_CLOSE:
                code = int.from_bytes(data[:2], "big") if len(data) >= 2 else None
                with contextlib.suppress(ConnectionError):
                    await self.send_frame(OP_CLOSE, data[:2])
                assert await self.rest() == b"", "nothing may follow a close frame"
                return out, code
            assert op == OP_TEXT, op
            out.append(json.loads(data))


class RawSse(_Raw):
    @classmethod
    async def connect(cls, port: int, path: str, token: str, *, rcvbuf: int = 4096) -> RawSse:
        reader, writer = await _open(port, rcvbuf)
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode()
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"chunked" in head.lower(), head
        return cls(reader, writer)

    async def read_to_end(self) -> list[dict[str, str]]:
        """Every SSE frame (as its fields) until the chunked body ends; the
        server must then close the socket or keep it for the next request."""
        body = b""
        while True:
            size_line = await self.reader.readuntil(b"\r\n")
            size = int(size_line.strip(), 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                break
            body += chunk[:-2]
        frames = []
        for raw in body.split(b"\n\n"):
            fields: dict[str, str] = {}
            for line in raw.split(b"\n"):
                if not line or line.startswith(b":"):
                    continue
                k, _, v = line.decode().partition(": ")
                fields[k] = v
            if "id" in fields or "event" in fields:
                frames.append(fields)
        return frames


class RawHttpResponse:
    """One HTTP/1.x response read off a raw socket (status, headers, body)."""

    def __init__(self, raw: bytes) -> None:
        head, _, self.body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split(" ")[1])
        self.headers: dict[str, str] = {}
        for line in lines:
            k, _, v = line.partition(":")
            self.headers[k.strip().lower()] = v.strip()

    def json(self) -> Any:
        return json.loads(self.body)


async def http_exchange(port: int, data: bytes, timeout_s: float = 10) -> RawHttpResponse:
    """Send exactly `data` (a request no client library would write) and read
    the answer until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return RawHttpResponse(raw)
