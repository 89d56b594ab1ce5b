"""The private names of nats-py and aiohttp runlog relies on (broker/_nats.py,
gateway/_aio.py): each guard holds on the installed version, each refuses the
import, in one sentence, when its name is gone or reshaped (under `python -O`,
where an `assert` would be gone), and each name does what runlog uses it for,
against a real NATS and a real aiohttp server. README, "Upgrading a dependency"."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tomllib
from importlib import metadata

import aiohttp
import nats
import pytest
from aiohttp import web

from broker import _nats, contract
from broker.sockets import bind_free_port
from gateway import _aio

from .helpers import Stack
from .workerkit import REPO

MODULES = {"nats-py": _nats, "aiohttp": _aio}
IMPORTS = {"nats-py": "broker._nats", "aiohttp": "gateway._aio"}

# For each guard, code that breaks its name the way a release could (gone,
# renamed, reshaped), run before the guarded module is imported.
_NATS = (
    "import nats.aio.client, nats.protocol.command\n"
    "from nats.aio.client import Client\n"
    "from nats.aio.subscription import Subscription\n"
    "_init = Client.__init__\n"
)
_AIO = "from aiohttp import web\nfrom aiohttp.base_protocol import BaseProtocol\n"


def _fresh_client(change: str) -> str:
    # A client whose __init__ leaves that attribute out or another shape.
    return f"def _i(self):\n    _init(self)\n    {change}\nClient.__init__ = _i\n"


BREAKS = {
    "nats-py": {
        "Client._process_msg": "del Client._process_msg",
        "Client._remove_sub": "Client._remove_sub = lambda self, sid: None",
        "Client._send_ping": "del Client._send_ping",
        "Client._send_command": "async def _s(self, cmd): pass\nClient._send_command = _s",
        "Client._flush_pending": "del Client._flush_pending",
        "Client._pongs": _fresh_client("self._pings = self.__dict__.pop('_pongs')"),
        "Client._subs": _fresh_client("self._subs = []"),
        "Client._flush_queue": _fresh_client("del self._flush_queue"),
        "Client._max_pending_size": _fresh_client("self._max_pending_size = None"),
        "Client._pending_data_size": _fresh_client("del self._pending_data_size"),
        "Client._max_payload": _fresh_client("self._max_payload = 1.0"),
        "Client.stats": _fresh_client("self.stats = {'msgs_in': 0}"),
        "Subscription._id": (
            "def _si(self, conn, id=0, *a, **k):\n    self.sid = id\nSubscription.__init__ = _si"
        ),
        "nats.aio.client.PING_PROTO": "nats.aio.client.PING_PROTO = b'PING\\n'",
        "nats.protocol.command.hpub_cmd": (
            "nats.protocol.command.hpub_cmd = lambda subject, reply, payload: b''"
        ),
    },
    "aiohttp": {
        "BaseProtocol._drain_helper": "del BaseProtocol._drain_helper",
        "AppRunner._make_server": "web.AppRunner._make_server = lambda self: None",
        "Server._loop and Server._kwargs": (
            "def _si(self, handler, *, loop=None, **kw):\n    self.loop, self.kw = loop, kw\n"
            "web.Server.__init__ = _si"
        ),
        "RequestHandler._data_received_cb": (
            "web.RequestHandler.data_received = lambda self, data: None"
        ),
        "RequestHandler.handle_error": (
            "web.RequestHandler.handle_error = lambda self, request, status=500, exc=None: None"
        ),
    },
}

CASES = [(dist, name) for dist, names in BREAKS.items() for name in names]


def _import(code: str, module: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-O", "-c", f"{code}\nimport {module}"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        cwd=REPO,
    )


def test_every_guard_holds_and_has_a_break() -> None:
    for dist, module in MODULES.items():
        assert [g.name for g in module.GUARDS] == list(BREAKS[dist]), dist
        assert [g.name for g in module.GUARDS if not g.holds()] == [], dist


def test_the_tested_versions_are_installed_and_pinned() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dist, module in MODULES.items():
        assert metadata.version(dist) == module.TESTED, dist
        assert f"{dist}~={module.TESTED}" in deps, (dist, deps)


def test_the_guarded_modules_import_under_python_O() -> None:
    r = _import("", " ".join(f"{m}," for m in IMPORTS.values()).rstrip(","))
    assert (r.returncode, r.stderr) == (0, "")


@pytest.mark.parametrize(("dist", "name"), CASES, ids=[n for _, n in CASES])
def test_a_broken_name_is_refused_at_import_under_python_O(dist: str, name: str) -> None:
    module = MODULES[dist]
    guard = next(g for g in module.GUARDS if g.name == name)
    r = _import((_NATS if dist == "nats-py" else _AIO) + BREAKS[dist][name], IMPORTS[dist])
    assert r.returncode == 1, (r.stdout, r.stderr)
    tested = module.TESTED
    assert r.stderr.splitlines()[-1] == (
        f"broker.contract.IncompatibleDependency: runlog needs {dist}'s {name} "
        f"({guard.shape}; tested with {dist} {tested}); this {dist} "
        f"{metadata.version(dist)} lacks it or changed it: pin {dist}~={tested}"
    ), r.stderr


def test_the_refusal_names_an_unknown_version() -> None:
    err = contract.incompatible("no-such-dist", "1.2.3", "X._y", "an int")
    assert str(err) == (
        "runlog needs no-such-dist's X._y (an int; tested with no-such-dist 1.2.3); "
        "this no-such-dist (version unknown) lacks it or changed it: pin no-such-dist~=1.2.3"
    )


# -- nats-py, against a real NATS


async def test_nats_private_names_on_a_connected_client(stack: Stack) -> None:
    nc = _nats.Client()
    await nc.connect(stack.nats_url, pending_size=1 << 20)
    other = await nats.connect(stack.nats_url)
    try:
        assert isinstance(nc._flush_queue, asyncio.Queue)  # publish_headed kicks it
        assert (nc._max_pending_size, nc._pending_data_size) == (1 << 20, 0)
        assert nc._max_payload == nc.max_payload > 0
        got: list[bytes] = []
        sub = await nc.subscribe_direct("contract.direct", got.append)
        assert type(sub._id) is int and nc._subs[sub._id] is sub
        # Client._send_ping behind the SUB: the other connection's messages arrive.
        await nc.flush()
        assert nc._pongs == []
        for i in range(3):
            await other.publish("contract.direct", b"m%d" % i)
        await other.flush()
        await _until(lambda: len(got) == 3)
        assert got == [b"m0", b"m1", b"m2"]  # Client._process_msg, in order
        assert nc.stats["in_msgs"] == 3 and nc.stats["in_bytes"] == 6
        # Client._remove_sub: unsubscribe forgets the handler.
        await sub.unsubscribe()
        assert sub._id not in nc._direct and sub._id not in nc._subs
        # publish_headed: nats.protocol.command.hpub_cmd, Client._send_command.
        replies: list[tuple[bytes, bytes, bytes | None]] = []
        rsub = await nc.subscribe_replies("contract.reply", lambda *m: replies.append(m))
        await nc.flush()
        out = nc.stats["out_msgs"]
        await nc.publish_headed("contract.reply", "", b"NATS/1.0\r\nK: v\r\n\r\n", b"body")
        await _until(lambda: len(replies) == 1)
        assert replies == [(b"contract.reply", b"body", b"NATS/1.0\r\nK: v\r\n\r\n")]
        assert nc.stats["out_msgs"] == out + 1
        await rsub.unsubscribe()
        assert rsub._id not in nc._replies
    finally:
        await other.close()
        await nc.close()


async def _until(cond: object, timeout_s: float = 5) -> None:
    assert callable(cond)
    async with asyncio.timeout(timeout_s):
        while not cond():
            await asyncio.sleep(0.01)


# -- aiohttp, against a real aiohttp server


async def test_aiohttp_private_names_on_a_running_server() -> None:
    heard: list[int] = []
    paused = asyncio.Event()
    drained = asyncio.Event()

    async def ws(request: web.Request) -> web.WebSocketResponse:
        sock = web.WebSocketResponse(heartbeat=None)
        await sock.prepare(request)
        _aio.on_data_received(request, lambda: heard.append(1))  # RequestHandler._data_received_cb
        async for _ in sock:
            await sock.send_str("ok")
        return sock

    async def flood(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        t = _aio.transport_of(request)
        assert t is not None
        while not request.protocol.writing_paused:
            t.write(b"x" * 65536)
        paused.set()
        await _aio.drained(request)  # BaseProtocol._drain_helper
        drained.set()
        return resp

    app = web.Application()
    app.add_routes([web.get("/ws", ws), web.get("/flood", flood)])
    runner = _aio.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    # AppRunner._make_server; Server._loop and Server._kwargs reach each RequestHandler.
    assert type(runner.server) is _aio._Server
    sock = bind_free_port()
    port = sock.getsockname()[1]
    await web.SockSite(runner, sock).start()
    try:
        # RequestHandler.handle_error with the runner's max_field_size.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        big = b"b" * (_aio.MAX_HEADER_FIELD_BYTES + 1)
        writer.write(b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + big + b"\r\n\r\n")
        answer = await reader.read()
        writer.close()
        await writer.wait_closed()
        assert answer.split(b" ", 2)[1] == b"431" and b'"code":"headers_too_large"' in answer

        async with (
            aiohttp.ClientSession() as http,
            http.ws_connect(f"ws://127.0.0.1:{port}/ws") as w,
        ):
            await w.send_str("hi")
            assert (await w.receive_str()) == "ok"
            assert heard

        # A client that reads nothing until the server's writes are paused.
        loop = asyncio.get_running_loop()
        with socket.socket() as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.setblocking(False)
            await loop.sock_connect(c, ("127.0.0.1", port))
            await loop.sock_sendall(c, b"GET /flood HTTP/1.1\r\nHost: h\r\n\r\n")
            await asyncio.wait_for(paused.wait(), 10)
            await asyncio.sleep(0.1)
            assert not drained.is_set()  # the handler waits while the client reads nothing
            while not drained.is_set():
                assert await asyncio.wait_for(loop.sock_recv(c, 1 << 20), 10)
    finally:
        await runner.cleanup()
