"""Logs: a client's bytes never forge a line (log injection), and `log_format=json`
writes JSON lines. Through the real formatter, in-process and over `runlog gateway`'s
own stderr."""

from __future__ import annotations

import json
import logging
import re
import sys
import unicodedata
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from broker.settings import Settings
from gateway import auth
from runlog import logformat

from .gw import running_gateway
from .procs import RunlogProcess
from .rawclient import http_exchange

_BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def _unsafe(c: str) -> bool:
    """What must never reach a log line raw: it ends a line somewhere
    (str.splitlines splits on it), rewrites a terminal, or reorders the text."""
    cat = unicodedata.category(c)
    return cat in ("Cc", "Zl", "Zp", "Cs") or c in _BIDI


def assert_one_record(formatted: str, first_line: str) -> None:
    """A record renders as one line; a traceback after it is indented (so a line
    at column 0 always starts a record) and escaped like the message."""
    lines = formatted.split("\n")
    assert lines[0].endswith(first_line), lines[0]
    for line in lines:
        bad = [c for c in line if _unsafe(c)]
        assert not bad, f"raw {bad!r} in {line!r}"
    for line in lines[1:]:
        assert line.startswith("  "), f"a continuation line at column 0: {line!r}"


# A client's value, as sent (percent-encoded in a path) and as the log must show it.
PATH_VALUES = [
    ("%0aFORGED%202026-01-01%2000:00:00,000%20ERROR%20gateway.app:%20forged",
     "\\nFORGED 2026-01-01 00:00:00,000 ERROR gateway.app: forged"),
    ("%0d", "\\r"),
    ("%0d%0a", "\\r\\n"),
    ("%1b[31m", "\\x1b[31m"),
    ("%c2%85", "\\x85"),
    ("%e2%80%a8", "\\u2028"),
    ("%e2%80%ae", "\\u202e"),
    ("%e2%81%a6", "\\u2066"),
]  # fmt: skip

# Raw header bytes (aiohttp decodes them with surrogateescape).
HEADER_VALUES = [
    (b"\xe2\x80\xaeevil", "\\u202eevil"),
    (b"\xe2\x80\xa8evil", "\\u2028evil"),
    (b"\xff\xfe", "\\udcff\\udcfe"),
    (b"\xc2\x85evil", "\\x85evil"),
]


async def _bug(request: web.Request) -> web.Response:
    # A stand-in for any handler bug whose exception text carries a client value.
    raise RuntimeError(f"bug reading User-Agent {request.headers.get('User-Agent', '')}")


async def test_client_values_reach_the_log_escaped(
    settings: Settings, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    fmt = logformat.formatter("text")
    caplog.set_level(logging.INFO)
    async with running_gateway(settings, [web.get(r"/v1/boom/{tail:[\s\S]*}", _bug)]) as gw:
        for sent, shown in PATH_VALUES:
            caplog.clear()
            req = f"GET /v1/boom/x{sent}y HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
            r = await http_exchange(gw.port, req.encode())
            assert r.status == 500
            [rec] = [r for r in caplog.records if r.name.startswith("gateway")]
            assert_one_record(fmt.format(rec), f"unhandled error on GET /v1/boom/x{shown}y")
        for raw, shown in HEADER_VALUES:
            caplog.clear()
            head = b"GET /v1/boom/h HTTP/1.1\r\nHost: h\r\nUser-Agent: " + raw
            r = await http_exchange(gw.port, head + b"\r\nConnection: close\r\n\r\n")
            assert r.status == 500
            [rec] = [r for r in caplog.records if r.name.startswith("gateway")]
            formatted = fmt.format(rec)
            assert_one_record(formatted, "unhandled error on GET /v1/boom/h")
            assert formatted.split("\n")[-1] == f"  RuntimeError: bug reading User-Agent {shown}"

        # A WebSocket message is a client's fault when it is bad: answered, never logged.
        caplog.clear()
        async with http.ws_connect(gw.ws_url, headers=gw.headers("alice")) as ws:
            assert json.loads((await ws.receive()).data)["type"] == "hello"
            for sent, _ in PATH_VALUES:
                bad = "r_" + sent.replace("%0a", "\n").replace("%0d", "\r") + "\u202e\u2028"
                await ws.send_str(json.dumps({"type": "subscribe", "run_id": bad, "after": 0}))
                reply = json.loads((await ws.receive()).data)
                assert reply["type"] == "error", reply
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_text_and_json_formats_escape_every_unsafe_character() -> None:
    """Every character that ends a line, rewrites a terminal or reorders text."""
    unsafe = [chr(c) for c in range(0x110000) if _unsafe(chr(c))]
    logger = logging.getLogger("runlog.test")
    text, js = logformat.formatter("text"), logformat.formatter("json")
    value = "".join(unsafe)
    for rec in (
        logger.makeRecord("runlog.test", logging.WARNING, __file__, 1, "got %s", (value,), None),
        logger.makeRecord("runlog.test", logging.WARNING, __file__, 1, f"got {value}", (), None),
    ):
        line = text.format(rec)
        assert not any(_unsafe(c) for c in line)
        assert line.splitlines() == [line]
        assert line.endswith("got " + "".join(logformat.escape(c) for c in unsafe))
        out = js.format(rec)
        assert out.isascii() and out.splitlines() == [out]
        assert not any(_unsafe(c) for c in json.loads(out)["message"])


def _records(stderr: str) -> list[str]:
    """The stderr of a text-format process, as records (a record and its
    indented continuation lines)."""
    out: list[str] = []
    for line in stderr.split("\n")[:-1]:
        if line.startswith("  ") and out:
            out[-1] += "\n" + line
        else:
            out.append(line)
    return out


_RECORD_START = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR) \S+: "
)

# Requests that reach the gateway's log (today or before a fix): an internal
# error on a path, and refusals by aiohttp's own parser.
_LOGGED_REQUESTS = [
    b"GET /v1/sessions/%00%0aFORGED HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n",
    b"GET /v1/runs/%00%0d%0aFORGED%e2%80%ae/events HTTP/1.1\r\nAuthorization: Bearer {token}\r\n\r\n",
    b"GET /" + b"a%0a" * 3000 + b" HTTP/1.1\r\nHost: h\r\n\r\n",
    b"POST /v1/sessions HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n\x1b[2J\r\n\r\n",
    b"GET /\n2026-01-01 00:00:00,000 ERROR forged HTTP/1.1\r\nHost: h\r\n\r\n",
]


def _requests(settings: Settings) -> list[bytes]:
    token = auth.mint(settings, "alice").encode()
    return [
        r.replace(b"{token}", token).replace(
            b"\r\n\r\n", b"\r\nHost: h\r\nConnection: close\r\n\r\n", 1
        )
        if b"{token}" in r
        else r
        for r in _LOGGED_REQUESTS
    ]


async def test_gateway_process_stderr_is_one_line_per_record(
    settings: Settings, tmp_root: Path
) -> None:
    gw = RunlogProcess("gateway", settings, tmp_root)
    gw.log_path.unlink(missing_ok=True)
    await gw.start()
    try:
        await gw.wait_ready()
        for req in _requests(settings):
            r = await http_exchange(gw.port, req)
            assert r.status < 600
    finally:
        await gw.stop()
    stderr = gw.log_path.read_text(errors="surrogateescape")
    forged = [line for line in stderr.split("\n") if line.startswith(("FORGED", "2026-01-01"))]
    assert forged == []
    for record in _records(stderr):
        assert _RECORD_START.match(record), f"not a record: {record!r}"
        assert_one_record(record, "")


async def test_log_format_json_writes_json_lines(settings: Settings, tmp_root: Path) -> None:
    gw = RunlogProcess("gateway", settings, tmp_root, RUNLOG_LOG_FORMAT="json")
    gw.log_path.unlink(missing_ok=True)
    await gw.start()
    try:
        await gw.wait_ready()
        for req in _requests(settings):
            await http_exchange(gw.port, req)
    finally:
        await gw.stop()
    lines = gw.log_path.read_text().split("\n")
    assert lines[-1] == ""
    records = [json.loads(line) for line in lines[:-1]]
    for rec in records:
        assert {"ts", "level", "logger", "message"} <= rec.keys(), rec
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", rec["ts"]), rec
    messages = [(r["level"], r["logger"], r["message"]) for r in records]
    assert (
        "INFO",
        "runlog.gateway",
        f"gateway listening on http://127.0.0.1:{gw.port}",
    ) in messages
    assert messages[-1] == ("INFO", "runlog.gateway", "gateway stopped")

    # A refusal is one record too (a port that is no number: asyncpg's
    # ValueError, a traceback, before tests/test_cli.py), with its code.
    bad = RunlogProcess("gateway", settings, tmp_root, RUNLOG_LOG_FORMAT="json",
                        RUNLOG_DATABASE_URL="postgresql://nobody@127.0.0.1:x/x")  # fmt: skip
    bad.log_path.unlink(missing_ok=True)
    await bad.start()
    assert await bad.wait() == 2
    lines = bad.log_path.read_text().split("\n")
    assert lines[-1] == ""
    [rec] = [json.loads(line) for line in lines[:-1]]
    assert (rec["level"], rec["logger"], rec["code"]) == ("ERROR", "runlog", "invalid_setting"), rec
    assert "exc_info" not in rec, rec


def test_a_traceback_is_inside_the_one_json_object() -> None:
    # What `runlog` logs for a bug or an unforeseen failure (cli.py's last except).
    try:
        raise ValueError("unforeseen\nsecond line")
    except ValueError:
        exc = sys.exc_info()
    logger = logging.getLogger("runlog")
    rec = logger.makeRecord("runlog", logging.ERROR, __file__, 1, "runlog x failed", (), exc)
    out = logformat.formatter("json").format(rec)
    assert out.splitlines() == [out]
    obj = json.loads(out)
    assert (obj["level"], obj["message"]) == ("ERROR", "runlog x failed")
    assert obj["exc_info"].startswith("Traceback (most recent call last):\n"), obj
    assert obj["exc_info"].endswith("\nValueError: unforeseen\nsecond line"), obj


def test_unknown_log_format_is_refused_in_one_line() -> None:
    import subprocess

    p = subprocess.run(
        [sys.executable, "-m", "runlog.cli", "gateway", "--log-format", "xml"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2
    assert p.stderr == "runlog: error [bad_request]: log_format must be text or json, not 'xml'\n"
