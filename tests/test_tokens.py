"""Token lifetime: `iat` required, `exp - iat` capped by jwt_max_ttl_s, a small
clock skew (jwt_leeway_s) allowed — the same answer on REST, SSE and the
WebSocket auth message; and `mint` (so `runlog token`) never makes a token the
gateway would refuse."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import jwt
import pytest
import pytest_asyncio

from broker import errors
from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth

from .gw import RunningGateway, running_gateway

DAY_S = 86400  # jwt_max_ttl_s's default
LEEWAY_S = 30  # jwt_leeway_s's default


@dataclass(frozen=True)
class Case:
    name: str
    iat: int | None  # relative to now; None: no iat claim
    exp: int  # relative to now
    code: str | None  # None: accepted
    says: str = ""  # part of the refusal's message


CASES = [
    Case("no iat", None, 600, "unauthorized", "iat"),
    Case("iat in the future", 120, 720, "unauthorized", "issued in the future"),
    Case("iat in the future within the leeway", 10, 600, None),
    Case("ttl over the cap", 0, DAY_S + 1, "unauthorized", "over the cap"),
    Case("10-year token", 0, 10 * 365 * DAY_S, "unauthorized", "over the cap"),
    Case("ttl at the cap", 0, DAY_S, None),
    Case("expired within the leeway", -600, -10, None),
    Case("expired past the leeway", -600, -(LEEWAY_S + 90), "token_expired"),
]


def _token(settings: Settings, case: Case, user: str) -> str:
    now = int(time.time())
    claims: dict[str, Any] = {"sub": user, "exp": now + case.exp, "iss": settings.jwt_issuer}
    if case.iat is not None:
        claims["iat"] = now + case.iat
    return jwt.encode(claims, settings.jwt_secret, algorithm="HS256")


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


def _check_refusal(case: Case, status: int, err: dict[str, Any]) -> None:
    assert case.code is not None
    assert (status, err["code"]) == (401, case.code), err
    assert case.says in err["message"], err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_rest(case: Case, gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    tok = _token(gw.settings, case, "tess")
    async with http.get(gw.url + "/v1/sessions", headers={"Authorization": f"Bearer {tok}"}) as r:
        body = await r.json()
        if case.code is None:
            assert r.status == 200, body
            assert body == {"sessions": [], "next_before": None}
        else:
            assert r.status == 401, body
            _check_refusal(case, r.status, body["error"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_sse(
    case: Case, gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await broker.store.create_session("tess")
    tok = _token(gw.settings, case, "tess")
    headers = {"Authorization": f"Bearer {tok}", "Accept": "text/event-stream"}
    async with http.get(f"{gw.url}/v1/sessions/{sid}/events", headers=headers) as r:
        if case.code is None:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            prelude = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
            assert b": connected" in prelude
        else:
            assert r.status == 401, "accepted"  # before reading: a stream does not end
            _check_refusal(case, r.status, (await r.json())["error"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_websocket_auth_message(
    case: Case, gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    tok = _token(gw.settings, case, "tess")
    async with http.ws_connect(gw.ws_url) as ws:
        assert json.loads((await ws.receive(timeout=10)).data)["type"] == "hello"
        await ws.send_str(json.dumps({"type": "auth", "ref": "a", "token": tok}))
        reply = json.loads((await ws.receive(timeout=10)).data)
        if case.code is None:
            assert reply == {"type": "authenticated", "ref": "a", "user": "tess"}
            # Still open: an accepted token does not end the connection at once.
            await ws.send_str(json.dumps({"type": "ping", "ref": "p"}))
            assert json.loads((await ws.receive(timeout=10)).data)["type"] == "pong"
        else:
            assert reply["type"] == "error" and reply["ref"] == "a", reply
            _check_refusal(case, 401, reply)


def test_verify_keeps_issued_at(settings: Settings) -> None:
    now = int(time.time())
    claims = {"sub": "ann", "iat": now - 5, "exp": now + 60, "iss": settings.jwt_issuer}
    p = auth.verify(settings, jwt.encode(claims, settings.jwt_secret, algorithm="HS256"))
    assert (p.user, p.issued_at, p.expires_at) == ("ann", now - 5, now + 60)


def test_mint_refuses_a_ttl_over_the_cap(settings: Settings) -> None:
    with pytest.raises(errors.RunlogError) as info:
        auth.mint(settings, "ann", ttl_s=DAY_S + 1)
    assert info.value.code == "token_ttl_too_long"
    assert "jwt_max_ttl_s" in info.value.detail
    p = auth.verify(settings, auth.mint(settings, "ann", ttl_s=DAY_S))
    assert p.expires_at - p.issued_at == DAY_S


@pytest.mark.parametrize("ttl_s", ["-5", "0", "0.5", "nan"])
async def test_runlog_token_refuses_a_lifetime_below_a_second(tmp_path: Any, ttl_s: str) -> None:
    # -5 minted a token expired at birth, which jwt_leeway_s kept working ~25 s.
    # (auth.mint itself takes any lifetime: tests mint expired tokens with it.)
    code, out, err = await _runlog_token("--user", "ann", "--ttl-s", ttl_s,
                                         "--data-dir", str(tmp_path))  # fmt: skip
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"runlog: error [bad_request]: a token must live at least 1 s; asked for {float(ttl_s)} s"
    ]


async def _runlog_token(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "token", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_runlog_token_cannot_mint_what_the_gateway_refuses(tmp_path: Any) -> None:
    code, out, err = await _runlog_token("--user", "ann", "--ttl-s", str(DAY_S + 1),
                                         "--data-dir", str(tmp_path))  # fmt: skip
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        f"runlog: error [token_ttl_too_long]: a token may live at most {DAY_S} s "
        f"(jwt_max_ttl_s); asked for {DAY_S + 1} s"
    ]
