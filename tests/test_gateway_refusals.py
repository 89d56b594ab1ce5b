"""Requests aiohttp refuses by itself (its HTTP parser, its router) get runlog's error
contract: a JSON body with a stable code, no echo of the request's bytes, one log
line without a traceback; and no response names server versions. In-process and
over a `runlog gateway` process (gateway/main.py's runner)."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from pathlib import Path
from typing import NamedTuple

import aiohttp
import pytest

from broker.settings import Settings

from .gw import eventually, running_gateway, session_with
from .procs import RunlogProcess
from .rawclient import RawHttpResponse, RawWs, http_exchange


class Refused(NamedTuple):
    name: str
    request: bytes
    status: int
    code: str
    echo: bytes  # bytes of the request that must not come back


_H = b"Host: h\r\n"
REFUSED = [
    Refused("long url", b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n" + _H + b"\r\n", 414,
            "uri_too_long", b"aaaaaaaa"),
    Refused("long header", b"GET / HTTP/1.1\r\n" + _H + b"X-Big: " + b"b" * 9000 + b"\r\n\r\n",
            431, "headers_too_large", b"bbbbbbbb"),
    Refused("bad content-length", b"POST /v1/sessions HTTP/1.1\r\n" + _H +
            b"Content-Length: 12abc\r\n\r\n", 400, "bad_request", b"12abc"),
    Refused("two content-lengths", b"POST /v1/sessions HTTP/1.1\r\n" + _H +
            b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nxy", 400, "bad_request",
            b"Content-Length"),
    Refused("bad chunk size", b"POST /v1/sessions HTTP/1.1\r\n" + _H +
            b"Transfer-Encoding: chunked\r\n\r\nzz9\r\nabc\r\n0\r\n\r\n", 400, "bad_request",
            b"zz9"),
    Refused("invalid method", b"G@T / HTTP/1.1\r\n" + _H + b"\r\n", 400, "bad_request", b"G@T"),
    Refused("tls on the http port", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 40,
            400, "bad_request", b"\x16\x03"),
    Refused("bad byte in url", b"GET /x\xffy HTTP/1.1\r\n" + _H + b"\r\n", 400, "bad_request",
            b"x\xffy"),
    Refused("lf in url", b"GET /x\ny HTTP/1.1\r\n" + _H + b"\r\n", 400, "bad_request", b"x\ny"),
    Refused("bad header name", b"GET / HTTP/1.1\r\n" + _H + b"X Y<z>: 1\r\n\r\n", 400,
            "bad_request", b"<z>"),
    Refused("too many headers", b"GET / HTTP/1.1\r\n" + _H +
            b"".join(b"X-H%d: q\r\n" % i for i in range(200)) + b"\r\n", 400, "bad_request",
            b"X-H1"),
]  # fmt: skip


def assert_coded(r: RawHttpResponse, case: Refused) -> None:
    assert (r.status, r.headers.get("content-type")) == (case.status, "application/json"), (
        case.name, r.status, r.body)  # fmt: skip
    err = r.json()["error"]
    assert (set(err), err["code"], err["retryable"]) == (
        {"code", "message", "retryable"}, case.code, False), (case.name, err)  # fmt: skip
    assert case.echo not in r.body, (case.name, r.body)
    assert r.headers["server"] == "runlog", case.name


async def test_parser_refusals_are_coded_in_process(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with running_gateway(settings) as gw:
        for case in REFUSED:
            caplog.clear()
            assert_coded(await http_exchange(gw.port, case.request), case)
            logged = [(r.levelname, r.name, r.getMessage(), r.exc_info) for r in caplog.records
                      if r.name.startswith(("aiohttp", "gateway"))]  # fmt: skip
            assert [(lv, name, exc) for lv, name, _, exc in logged] == [
                ("INFO", "gateway.http", None)], (case.name, logged)  # fmt: skip
            assert logged[0][2].startswith(f"refused a request from 127.0.0.1: {case.code} (")


async def test_parser_refusals_are_coded_by_the_gateway_process(
    settings: Settings, tmp_root: Path
) -> None:
    gw = RunlogProcess("gateway", settings, tmp_root)
    gw.log_path.unlink(missing_ok=True)
    await gw.start()
    try:
        await gw.wait_ready()
        for case in REFUSED:
            assert_coded(await http_exchange(gw.port, case.request), case)
    finally:
        await gw.stop()
    stderr = gw.log_path.read_text(errors="replace").splitlines()
    refused = [line.partition(" INFO ")[2] for line in stderr if "refused" in line]
    codes = [line.split(": ")[2].split(" ")[0] for line in refused]
    assert codes == [case.code for case in REFUSED], stderr
    assert all(
        line.startswith("gateway.http: refused a request from 127.0.0.1:") for line in refused
    )
    assert [line for line in stderr if "Traceback" in line or "ERROR" in line] == []


async def test_405_names_the_allowed_methods(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(settings) as gw:
        for method, path, allow in [
            ("PUT", "/v1/sessions", "GET,HEAD,POST"),
            ("DELETE", "/v1/runs/r_x/interrupt", "POST"),
            ("POST", "/healthz", "GET,HEAD"),
        ]:
            async with http.request(method, gw.url + path) as r:
                assert (r.status, r.headers.get("Allow")) == (405, allow), (method, path)
                err = (await r.json())["error"]
                assert (err["code"], err["retryable"]) == ("method_not_allowed", False)


async def test_a_static_folder_is_refused_with_the_code_of_its_status(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    """aiohttp's own refusal of a folder under /static/ (no listing) is a
    403: its code says forbidden, as the status does."""
    async with running_gateway(settings) as gw:
        for path in ("/static/", "/static"):
            async with http.get(gw.url + path, allow_redirects=False) as r:
                err = (await r.json())["error"]
                assert (r.status, err["code"], err["retryable"]) == (403, "forbidden", False), path


async def test_no_response_names_server_versions(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(settings) as gw:
        for method, path in [("GET", "/healthz"), ("GET", "/nope"), ("PUT", "/v1/sessions"),
                             ("GET", "/v1/sessions"), ("GET", "/"), ("GET", "/metrics")]:  # fmt: skip
            async with http.request(method, gw.url + path) as r:
                assert r.headers.getall("Server") == ["runlog"], (method, path, r.headers)
        ws, head = await RawWs.connect(gw.port, gw.token("alice"))
        try:
            servers = [h for h in head.split(b"\r\n") if h.lower().startswith(b"server:")]
            assert servers == [b"Server: runlog"], head
        finally:
            await ws.close()


async def test_a_client_that_hangs_up_during_the_upgrade_is_not_a_storage_error(
    settings: Settings, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    """The upgrade's 101 written to a socket the client has reset is the
    client's doing: before, each was logged as a warning, "answered
    storage_unavailable" (a ConnectionResetError taken for the store's)."""
    caplog.set_level(logging.DEBUG)
    async with running_gateway(settings) as gw:
        await session_with(http, gw, "alice")  # the user exists; the token is good
        request = (
            "GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Protocol: runlog.v1\r\n"
            f"Authorization: {gw.headers('alice')['Authorization']}\r\n\r\n"
        ).encode()
        for _ in range(10):
            _, w = await asyncio.open_connection("127.0.0.1", gw.port)
            # Closed with a reset right after the request: nothing is read.
            w.get_extra_info("socket").setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
            )
            w.write(request)
            await w.drain()
            w.transport.abort()

        # Every request was handled (a reset seen only after the upgrade is a 101).
        def answered(status: str) -> float:
            labels = {"route": "/v1/ws", "status": status}
            return gw.sample("runlog_gateway_http_requests_total", labels) or 0.0

        await eventually(lambda: sum(answered(c) for c in ("1xx", "4xx", "5xx")) == 10)
        assert answered("5xx") == 0
    logged = [(r.levelname, r.name, r.getMessage()) for r in caplog.records
              if r.levelno >= logging.WARNING and r.name.startswith(("aiohttp", "gateway"))]  # fmt: skip
    assert logged == []
