"""No token reaches a log line or /metrics (issue 21, item 0): every way a
bearer token reaches the gateway is driven, at log level debug, in both log
formats, with a valid token and with a bad one carrying a marker, and neither
appears anywhere in the process's output nor in its /metrics.

Found so far: a WebSocket offering only `bearer.<jwt>` (without `runlog.v1`)
was accepted and aiohttp logged `Client protocols ['bearer.eyJ…'] don't
overlap…` with the whole token, at WARNING. It is refused now (400
`bad_request`, before the upgrade), as docs/protocol.md says the subprotocol
goes next to `runlog.v1`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker.settings import Settings
from gateway import auth

from .procs import RunlogProcess

MARKER = "MARKERxq7zv"  # in the bad token: no valid token could hide it


async def _drive(base: str, valid: str, bad: str) -> dict[str, int]:
    """Every authentication path, with each token; the statuses seen (so the
    test knows each path was taken)."""
    seen: dict[str, int] = {}
    ws_url = base.replace("http", "ws", 1) + "/v1/ws"
    async with aiohttp.ClientSession() as http:
        for name, tok in (("valid", valid), ("bad", bad)):
            bearer = {"Authorization": f"Bearer {tok}"}
            sse = {"Accept": "text/event-stream"}
            for how, method, path, kw in (
                ("rest header", "GET", "/v1/sessions", {"headers": bearer}),
                ("rest query", "GET", "/v1/sessions", {"params": {"access_token": tok}}),
                ("sse header", "GET", "/v1/runs/r_nope/events", {"headers": {**bearer, **sse}}),
                ("sse query", "GET", "/v1/runs/r_nope/events",
                 {"headers": sse, "params": {"access_token": tok}}),
                ("langgraph x-api-key", "GET", "/v1/compat/langgraph/threads/t_nope",
                 {"headers": {"x-api-key": tok}}),
                ("openai header", "POST", "/v1/compat/openai/sessions/s_nope/chat/completions",
                 {"headers": bearer, "json": {"messages": [{"role": "user", "content": "hi"}]}}),
            ):  # fmt: skip
                async with http.request(method, base + path, **kw) as r:
                    seen[f"{how} {name}"] = r.status
            ws_kw: tuple[tuple[str, dict[str, Any]], ...] = (
                ("ws header", {"headers": {"Authorization": f"Bearer {tok}"}}),
                ("ws query", {"params": {"access_token": tok}}),
                ("ws subprotocol", {"protocols": ("runlog.v1", f"bearer.{tok}")}),
                ("ws subprotocol alone", {"protocols": (f"bearer.{tok}",)}),
                ("ws auth message", {"protocols": ("runlog.v1",)}),
            )
            for how, kw in ws_kw:
                try:
                    async with http.ws_connect(ws_url, **kw) as ws:
                        if how == "ws auth message":
                            await ws.send_json({"type": "auth", "token": tok})
                        await ws.send_json({"type": "subscribe", "topic": "run:r_nope"})
                        async for msg in ws:
                            if msg.type != aiohttp.WSMsgType.TEXT or '"error"' in msg.data:
                                break
                            if '"subscribed"' in msg.data or '"disconnect"' in msg.data:
                                break
                        seen[f"{how} {name}"] = 101
                except aiohttp.WSServerHandshakeError as e:
                    seen[f"{how} {name}"] = e.status
        async with http.get(base + "/metrics") as r:
            seen["metrics"] = r.status
            metrics = await r.text()
            assert valid not in metrics and MARKER not in metrics
    return seen


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_no_token_reaches_the_log_or_the_metrics(
    settings: Settings, tmp_root: Path, log_format: str
) -> None:
    valid = auth.mint(settings, "alice")
    head, _, sig = valid.rpartition(".")
    bad = f"{head}.{MARKER}{sig[len(MARKER) :]}"  # a bad signature
    gw = RunlogProcess(
        "gateway", settings, tmp_root, RUNLOG_LOG_FORMAT=log_format, RUNLOG_LOG_LEVEL="debug"
    )
    gw.log_path.unlink(missing_ok=True)
    await gw.start()
    try:
        await gw.wait_ready()
        seen = await _drive(gw.url, valid, bad)
    finally:
        await gw.stop()
    out = gw.log_path.read_text(errors="replace")
    assert "gateway stopped" in out  # the log was written, at debug
    for secret, what in (
        (valid, "the valid token"),
        (sig, "its signature"),
        (MARKER, "the bad one"),
    ):
        lines = [line for line in out.splitlines() if secret in line]
        assert lines == [], f"{what} in the log: {lines[:3]}"
    # Each path was taken: the valid token got past authentication, the bad
    # one not (a query token outside a stream is refused either way).
    for path in ("rest header", "sse header", "sse query", "langgraph x-api-key", "openai header"):
        assert seen[f"{path} valid"] not in (401, 500) and seen[f"{path} bad"] == 401, (path, seen)
    assert seen["rest query valid"] == seen["rest query bad"] == 401, seen
    assert seen["ws header valid"] == seen["ws subprotocol valid"] == 101, seen
    assert seen["ws query valid"] == seen["ws auth message valid"] == 101, seen
    assert seen["ws subprotocol alone valid"] == seen["ws subprotocol alone bad"] == 400, seen
    assert seen["ws header bad"] == seen["ws query bad"] == seen["ws subprotocol bad"] == 401, seen
    assert seen["metrics"] == 200, seen
