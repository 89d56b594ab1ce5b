"""Trusted issuers (issue 21, item 1): tokens of OIDC providers verified from
their JWKS, on REST, SSE and the WebSocket (header and `auth` message).

Real processes on loopback: an oidc-provider-mock process (RS256 ID tokens
from its authorization-code flow) and a JWKS server of the test's own
(aiohttp) for ES256 / EdDSA issuers, key rotation, an outage and the CVE
pattern (GHSA-g6vg-wj8f-48cj: one `kid`, two issuers). The gateway's setting
for the provider is the one docs/quickstart-oidc.md shows."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import jwt
import pytest
import pytest_asyncio
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from broker import control, errors
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import bind_free_port
from gateway import access, issuers

from .gw import RunningGateway, running_gateway

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "docs" / "quickstart-oidc.md"
PrivateKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
TRANSPORTS = ("rest", "sse", "ws_header", "ws_auth")


# -- keys and tokens


@dataclass
class Signer:
    key: PrivateKey
    alg: str
    kid: str | None

    def jwk(self) -> dict[str, Any]:
        algo = jwt.get_algorithm_by_name(self.alg)
        data: dict[str, Any] = json.loads(algo.to_jwk(self.key.public_key()))
        if self.kid is not None:
            data["kid"] = self.kid
        return data

    def pem(self) -> str:
        return (
            self.key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )

    def token(self, iss: str, aud: str, sub: str = "alice", exp_in: int = 600,
              **extra: Any) -> str:  # fmt: skip
        now = int(time.time())
        claims = {"iss": iss, "aud": aud, "sub": sub, "iat": now, "exp": now + exp_in, **extra}
        headers = {"kid": self.kid} if self.kid is not None else None
        return jwt.encode(claims, self.key, algorithm=self.alg, headers=headers)


_RSA = rsa.generate_private_key(public_exponent=65537, key_size=2048)  # shared: slow to make


def rs(kid: str | None = "r1") -> Signer:
    return Signer(_RSA, "RS256", kid)


def es(kid: str | None = "e1") -> Signer:
    return Signer(ec.generate_private_key(ec.SECP256R1()), "ES256", kid)


def ed(kid: str | None = "d1") -> Signer:
    return Signer(ed25519.Ed25519PrivateKey.generate(), "EdDSA", kid)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hand_signed(header: dict[str, Any], claims: dict[str, Any], sign: Any) -> str:
    """A JWT put together by hand (what PyJWT refuses to make)."""
    h = _b64(json.dumps(header).encode())
    c = _b64(json.dumps(claims).encode())
    return f"{h}.{c}.{_b64(sign(f'{h}.{c}'.encode()))}"


def claims_of(iss: str, aud: str, sub: str = "alice") -> dict[str, Any]:
    now = int(time.time())
    return {"iss": iss, "aud": aud, "sub": sub, "iat": now, "exp": now + 600}


# -- a JWKS server


@dataclass
class Jwks:
    """JWKS documents served at /<name>, with a count of the requests of each."""

    url: str = ""
    docs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    hits: dict[str, int] = field(default_factory=dict)
    down: bool = False

    def of(self, name: str) -> str:
        return f"{self.url}/{name}"

    async def handle(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.hits[name] = self.hits.get(name, 0) + 1
        if self.down or name not in self.docs:
            return web.Response(status=503)
        return web.json_response({"keys": self.docs[name]})


@pytest_asyncio.fixture(loop_scope="session")
async def jwks() -> AsyncIterator[Jwks]:
    server = Jwks()
    app = web.Application()
    app.router.add_get("/{name}", server.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = bind_free_port()
    server.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    await web.SockSite(runner, sock).start()
    try:
        yield server
    finally:
        await runner.cleanup()


def issuer(name: str, jwks: Jwks, algs: list[str], **more: Any) -> dict[str, Any]:
    return {"issuer": f"https://{name}.example", "audience": f"aud-{name}",
            "jwks_url": jwks.of(name), "algorithms": algs, "user_prefix": f"{name}:", **more}  # fmt: skip


# -- what each transport answers


async def answer(gw: RunningGateway, http: aiohttp.ClientSession, transport: str,
                 token: str) -> tuple[int, str, str]:  # fmt: skip
    """(status, error code or "", user) of a request carrying `token`."""
    auth = {"Authorization": f"Bearer {token}"}
    if transport == "rest":
        async with http.post(gw.url + "/v1/sessions", json={"title": "t"}, headers=auth) as r:
            body = await r.json()
            if r.status != 201:
                return r.status, body["error"]["code"], body["error"]["message"]
        async with http.get(f"{gw.url}/v1/sessions/{body['session_id']}", headers=auth) as r:
            [owner] = (await r.json())["members"]
            return 201, "", owner["user_id"]
    if transport == "sse":
        url = f"{gw.url}/v1/sessions/s_{'0' * 26}/events"
        async with http.get(url, headers={**auth, "Accept": "text/event-stream"}) as r:
            body = await r.json()
            return r.status, body["error"]["code"], body["error"]["message"]
    if transport == "ws_header":
        try:
            async with http.ws_connect(gw.ws_url, headers=auth) as ws:
                hello = json.loads((await ws.receive(timeout=10)).data)
                return 101, "", hello["user"]
        except aiohttp.WSServerHandshakeError as e:
            return e.status, "", ""
    async with http.ws_connect(gw.ws_url) as ws:
        assert json.loads((await ws.receive(timeout=10)).data)["type"] == "hello"
        await ws.send_str(json.dumps({"type": "auth", "ref": "a", "token": token}))
        reply = json.loads((await ws.receive(timeout=10)).data)
        if reply["type"] == "authenticated":
            return 101, "", reply["user"]
        return 401, reply["code"], reply["message"]


def accepted(got: tuple[int, str, str], user: str) -> bool:
    return got[0] in (101, 201) and got[2] == user


# -- the provider process


@dataclass
class Provider:
    base: str
    proc: asyncio.subprocess.Process

    async def id_token(self, http: aiohttp.ClientSession, client_id: str, sub: str) -> str:
        """An ID token through the authorization-code flow (the provider takes
        any client id and secret, and signs in `sub` from its form)."""
        redirect = "http://127.0.0.1/callback"
        query = {"client_id": client_id, "redirect_uri": redirect, "response_type": "code",
                 "scope": "openid email", "state": "s1"}  # fmt: skip
        async with http.post(self.base + "/oauth2/authorize", params=query,
                             data={"sub": sub}, allow_redirects=False) as r:  # fmt: skip
            assert r.status == 302, await r.text()
            code = parse_qs(urlsplit(r.headers["Location"]).query)["code"][0]
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": redirect,
                "client_id": client_id, "client_secret": "any"}  # fmt: skip
        async with http.post(self.base + "/oauth2/token", data=form) as r:
            assert r.status == 200, await r.text()
            token: str = (await r.json())["id_token"]
        return token


@pytest_asyncio.fixture(loop_scope="session")
async def provider() -> AsyncIterator[Provider]:
    exe = Path(sys.executable).parent / "oidc-provider-mock"
    proc = await asyncio.create_subprocess_exec(
        str(exe), "-p", "0", env={**os.environ, "NO_COLOR": "1"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    base = ""
    try:
        async with asyncio.timeout(30):
            while line := await proc.stderr.readline():
                if found := re.search(rb"running on (http://127\.0\.0\.1:\d+)", line):
                    base = found.group(1).decode()
                    break
        assert base, "oidc-provider-mock ended before serving"
        drain = asyncio.create_task(proc.stderr.read())  # it logs every request
        try:
            yield Provider(base, proc)
        finally:
            proc.terminate()
            await proc.wait()
            await drain
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def quickstart_setting() -> list[dict[str, Any]]:
    """The trusted_issuers JSON of docs/quickstart-oidc.md (its `runs in` block)."""
    text = QUICKSTART.read_text()
    m = re.search(r"<!-- runs in tests/test_issuers\.py[^>]*-->\n```json\n(.*?)```", text, re.S)
    assert m, "docs/quickstart-oidc.md has no trusted_issuers block for this test"
    setting: list[dict[str, Any]] = json.loads(m.group(1))
    return setting


async def test_provider_tokens_on_every_transport(
    provider: Provider, settings: Settings, http: aiohttp.ClientSession
) -> None:
    # The quickstart's setting, pointed at this provider instead of Keycloak.
    [kc] = quickstart_setting()
    async with http.get(provider.base + "/.well-known/openid-configuration") as r:
        discovery = await r.json()
    kc.update(issuer=discovery["issuer"], jwks_url=discovery["jwks_uri"])
    async with running_gateway(settings, trusted_issuers=json.dumps([kc])) as gw:
        token = await provider.id_token(http, kc["audience"], "alice@example.com")
        assert jwt.get_unverified_header(token)["alg"] == "RS256"
        user = kc["user_prefix"] + "alice@example.com"
        for transport in TRANSPORTS:
            if transport == "sse":  # a session of the user's own, streamed
                continue
            got = await answer(gw, http, transport, token)
            assert accepted(got, user), (transport, got)
        async with http.post(gw.url + "/v1/sessions", json={"title": "t"},
                             headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
            sid = (await r.json())["session_id"]
        sse = {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"}
        async with http.get(f"{gw.url}/v1/sessions/{sid}/events", headers=sse) as r:
            assert r.status == 200
            assert b": connected" in await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
        # Another client id is another audience: refused.
        other = await provider.id_token(http, "someone-else", "alice@example.com")
        assert (await answer(gw, http, "rest", other))[:2] == (401, "unauthorized")
        assert gw.sample("runlog_gateway_jwks_loads_total",
                         {"issuer": kc["issuer"], "outcome": "ok"}) == 1  # fmt: skip


async def test_es256_and_eddsa_issuers_and_prefixes(
    jwks: Jwks, settings: Settings, http: aiohttp.ClientSession
) -> None:
    e, d = es(), ed()
    jwks.docs.update(ec=[e.jwk()], ed=[d.jwk()])
    trusted = [issuer("ec", jwks, ["ES256"]), issuer("ed", jwks, ["EdDSA"])]
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted)) as gw:
        for name, signer in (("ec", e), ("ed", d)):
            tok = signer.token(f"https://{name}.example", f"aud-{name}")
            for transport in ("rest", "ws_header", "ws_auth"):
                got = await answer(gw, http, transport, tok)
                assert accepted(got, f"{name}:alice"), (name, transport, got)
        # alice of `ec` and alice of `ed` are two users.
        ec_alice = {"Authorization": "Bearer " + e.token("https://ec.example", "aud-ec")}
        ed_alice = {"Authorization": "Bearer " + d.token("https://ed.example", "aud-ed")}
        async with http.post(gw.url + "/v1/sessions", json={"title": "t"}, headers=ec_alice) as r:
            sid = (await r.json())["session_id"]
        async with http.get(f"{gw.url}/v1/sessions/{sid}", headers=ed_alice) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (403, "not_a_member")
        # runlog's own tokens still work beside them.
        assert accepted(await answer(gw, http, "rest", gw.token("alice")), "alice")


async def test_revocation_caps_and_refresh_use_the_qualified_user(
    jwks: Jwks, settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    a, b = es("q1"), es("q1")
    jwks.docs.update(qa=[a.jwk()], qb=[b.jwk()])
    trusted = [issuer("qa", jwks, ["ES256"]), issuer("qb", jwks, ["ES256"])]
    sub = f"carol-{uuid.uuid4().hex[:8]}"  # revoked below: a name no other test uses
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted),
                               max_connections_per_user=1) as gw:  # fmt: skip
        ta = a.token("https://qa.example", "aud-qa", sub=sub)
        tb = b.token("https://qb.example", "aud-qb", sub=sub)
        # One connection each: the cap is per qualified user, so two of them fit.
        async with http.ws_connect(gw.ws_url, headers={"Authorization": f"Bearer {ta}"}) as wa:
            assert json.loads((await wa.receive(timeout=10)).data)["user"] == f"qa:{sub}"
            async with http.ws_connect(gw.ws_url, headers={"Authorization": f"Bearer {tb}"}) as wb:
                assert json.loads((await wb.receive(timeout=10)).data)["user"] == f"qb:{sub}"
                # A refresh with the other issuer's token is another user: refused.
                await wa.send_str(json.dumps({"type": "auth", "ref": "r", "token": tb}))
                reply = json.loads((await wa.receive(timeout=10)).data)
                assert (reply["type"], reply["code"]) == ("error", "forbidden"), reply
                await wa.send_str(json.dumps({"type": "auth", "ref": "r2", "token": ta}))
                reply = json.loads((await wa.receive(timeout=10)).data)
                assert reply == {"type": "authenticated", "ref": "r2", "user": f"qa:{sub}"}
        not_before = await broker.store.revoke_tokens(f"qa:{sub}", "test")
        assert await access.send(broker.bus,
                                 control.TokensRevoked(user_id=f"qa:{sub}", not_before=not_before))  # fmt: skip
        async with asyncio.timeout(10):
            while (await answer(gw, http, "rest", ta))[1] != "token_revoked":
                await asyncio.sleep(0.05)
        assert accepted(await answer(gw, http, "rest", tb), f"qb:{sub}")  # another user


async def test_rotation_overlap_then_the_old_key_is_refused(
    jwks: Jwks, settings: Settings, http: aiohttp.ClientSession
) -> None:
    # No refresh during the test: every fetch here is one a fresh kid caused
    # (no cool-down, so that each fresh kid may cause one).
    old, new = es("old"), es("new")
    jwks.docs["rot"] = [old.jwk()]
    trusted = [issuer("rot", jwks, ["ES256"], refresh_s=300, refetch_cooldown_s=0)]
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted)) as gw:
        iss, aud = "https://rot.example", "aud-rot"
        assert accepted(await answer(gw, http, "rest", old.token(iss, aud)), "rot:alice")
        jwks.docs["rot"] = [old.jwk(), new.jwk()]
        # The first token of the new key waits for one fetch, and is accepted.
        for transport in ("ws_auth", "rest", "ws_header"):
            got = await answer(gw, http, transport, new.token(iss, aud))
            assert accepted(got, "rot:alice"), (transport, got)
            assert accepted(await answer(gw, http, transport, old.token(iss, aud)), "rot:alice")
        assert jwks.hits["rot"] == 2
        # So does the first one on the other ways in: ?access_token= on SSE, x-api-key.
        old_auth = {"Authorization": "Bearer " + old.token(iss, aud)}
        async with http.post(gw.url + "/v1/sessions", json={"title": "t"}, headers=old_auth) as r:
            sid = (await r.json())["session_id"]
        sse, lg = es("fresh-sse"), es("fresh-langgraph")
        jwks.docs["rot"].append(sse.jwk())
        url = f"{gw.url}/v1/sessions/{sid}/events?access_token={sse.token(iss, aud)}"
        async with http.get(url, headers={"Accept": "text/event-stream"}) as r:
            assert r.status == 200, await r.text()
            assert b": connected" in await asyncio.wait_for(r.content.readuntil(b"\n\n"), 10)
        jwks.docs["rot"].append(lg.jwk())
        api_key = {"x-api-key": lg.token(iss, aud)}
        async with http.post(
            gw.url + "/v1/compat/langgraph/threads", json={}, headers=api_key
        ) as r:
            assert r.status == 200, await r.text()
        assert jwks.hits["rot"] == 4
        # The old key leaves the JWKS: refused once the next fetch saw it gone.
        newest = es("newest")
        jwks.docs["rot"] = [new.jwk(), newest.jwk()]
        assert accepted(await answer(gw, http, "rest", newest.token(iss, aud)), "rot:alice")
        assert jwks.hits["rot"] == 5
        for transport in TRANSPORTS:
            got = await answer(gw, http, transport, old.token(iss, aud))
            assert got[0] == 401 and got[1] in ("unauthorized", ""), (transport, got)
        assert accepted(await answer(gw, http, "ws_auth", new.token(iss, aud)), "rot:alice")


async def test_provider_down_keeps_the_cached_keys(
    jwks: Jwks, settings: Settings, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    k = rs("down1")
    jwks.docs["down"] = [k.jwk()]
    trusted = [issuer("down", jwks, ["RS256"], refresh_s=0.2)]
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted)) as gw:
        tok = k.token("https://down.example", "aud-down")
        assert accepted(await answer(gw, http, "rest", tok), "down:alice")
        errors_seen = {"issuer": "https://down.example", "outcome": "error"}
        with caplog.at_level(logging.WARNING, logger="gateway.issuers"):
            jwks.down = True
            try:
                async with asyncio.timeout(5):
                    while not gw.sample("runlog_gateway_jwks_loads_total", errors_seen):
                        await asyncio.sleep(0.05)
                for transport in TRANSPORTS:
                    if transport != "sse":
                        assert accepted(await answer(gw, http, transport, tok), "down:alice")
            finally:
                jwks.down = False
        lines = [r.getMessage() for r in caplog.records if r.name == "gateway.issuers"]
        assert lines and all("did not load (HTTP 503); keeping its 1 key(s)" in m for m in lines)
        assert not any(k.jwk()["n"][:20] in m or tok in m for m in lines)


async def test_the_same_kid_at_two_issuers_never_crosses(
    jwks: Jwks, settings: Settings, http: aiohttp.ClientSession
) -> None:
    # CVE-2026-49998's pattern: a cache keyed by kid alone let A's key sign as B.
    a, b = es("k1"), es("k1")
    jwks.docs.update(a=[a.jwk()], b=[b.jwk()])
    trusted = [issuer("a", jwks, ["ES256"]), issuer("b", jwks, ["ES256"])]
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted)) as gw:
        for signer_name, signer in (("a", a), ("b", b)):
            for iss in ("a", "b"):
                for aud in ("a", "b"):
                    tok = signer.token(f"https://{iss}.example", f"aud-{aud}")
                    got = await answer(gw, http, "rest", tok)
                    if signer_name == iss == aud:
                        assert accepted(got, f"{iss}:alice"), got
                    else:
                        assert got[:2] == (401, "unauthorized"), (signer_name, iss, aud, got)


async def test_an_unknown_kid_flood_fetches_once_per_cooldown(
    jwks: Jwks, settings: Settings, http: aiohttp.ClientSession
) -> None:
    k = es("real")
    jwks.docs["flood"] = [k.jwk()]
    trusted = [issuer("flood", jwks, ["ES256"])]
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted)) as gw:
        assert jwks.hits["flood"] == 1  # at start
        iss, aud = "https://flood.example", "aud-flood"
        tokens = [es(f"made-up-{i}").token(iss, aud) for i in range(60)]
        got = await asyncio.gather(*(answer(gw, http, "rest", t) for t in tokens[:40]))
        got += [await answer(gw, http, "ws_auth", t) for t in tokens[40:]]
        assert all(g[:2] == (401, "unauthorized") for g in got), got
        assert jwks.hits["flood"] == 2  # one refetch for the whole flood
        assert accepted(await answer(gw, http, "rest", k.token(iss, aud)), "flood:alice")


# -- algorithm confusion and other refusals, on every transport


@dataclass
class Confusion:
    gw: RunningGateway
    rsa: Signer
    evil: Signer


@pytest_asyncio.fixture(loop_scope="session")
async def confusion(jwks: Jwks, settings: Settings) -> AsyncIterator[Confusion]:
    good, evil = rs("c1"), Signer(rsa.generate_private_key(65537, 2048), "RS256", "c1")
    jwks.docs.update(conf=[good.jwk()], evil=[evil.jwk()])
    trusted = [issuer("conf", jwks, ["RS256"])]
    async with running_gateway(settings, trusted_issuers=json.dumps(trusted)) as gw:
        yield Confusion(gw, good, evil)


def _refusals(c: Confusion, jwks: Jwks) -> dict[str, tuple[str, str, str]]:
    """name: (token, code, part of the message)."""
    iss, aud = "https://conf.example", "aud-conf"
    pem = c.rsa.pem().encode()
    claims = claims_of(iss, aud)
    # fmt: off
    return {
        "rsa public key as hs256 secret": (
            hand_signed({"alg": "HS256", "typ": "JWT", "kid": "c1"}, claims,
                        lambda m: hmac.new(pem, m, hashlib.sha256).digest()),
            "unauthorized", "algorithm not allowed",
        ),
        "alg none": (
            hand_signed({"alg": "none", "typ": "JWT"}, claims, lambda m: b""),
            "unauthorized", "algorithm not allowed",
        ),
        "jku x5u jwk headers": (
            jwt.encode(claims, c.evil.key, algorithm="RS256", headers={
                "kid": "c1", "jku": jwks.of("evil"), "x5u": jwks.of("evil"), "jwk": c.evil.jwk()}),
            "unauthorized", "InvalidSignatureError",
        ),
        "runlog's secret for a trusted iss": (
            jwt.encode(claims, c.gw.settings.jwt_secret, algorithm="HS256"),
            "unauthorized", "algorithm not allowed",
        ),
        "wrong aud": (c.rsa.token(iss, "aud-other"), "unauthorized", "InvalidAudienceError"),
        "no aud": (jwt.encode({k: v for k, v in claims.items() if k != "aud"}, c.rsa.key,
                              algorithm="RS256", headers={"kid": "c1"}),
                   "unauthorized", "'aud'"),
        "expired": (c.rsa.token(iss, aud, exp_in=-3600), "token_expired", "expired"),
        "unlisted issuer": (
            c.rsa.token("https://unlisted.example", aud), "unauthorized", "not trusted"
        ),
        "bad user id": (c.rsa.token(iss, aud, sub="a\u202eb"), "unauthorized", "bad subject"),
    }
    # fmt: on


REFUSALS = ["rsa public key as hs256 secret", "alg none", "jku x5u jwk headers",
            "runlog's secret for a trusted iss", "wrong aud", "no aud", "expired",
            "unlisted issuer", "bad user id"]  # fmt: skip


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", REFUSALS)
async def test_refused_with_a_stable_code(
    case: str, transport: str, confusion: Confusion, jwks: Jwks, http: aiohttp.ClientSession
) -> None:
    token, code, says = _refusals(confusion, jwks)[case]
    evil_before = jwks.hits.get("evil", 0)
    status, got_code, message = await answer(confusion.gw, http, transport, token)
    if transport == "ws_header":  # refused before the upgrade: 401, body unread
        assert status == 401
    else:
        assert (status, got_code) == (401, code), message
        assert says in message
    assert jwks.hits.get("evil", 0) == evil_before  # jku / x5u never fetched


# -- the setting, without servers


def _settings(value: object) -> Settings:
    if isinstance(value, dict):
        value = [value]
    text = value if isinstance(value, str) else json.dumps(value)
    return Settings(trusted_issuers=text)


def _one(**over: Any) -> dict[str, Any]:
    return {"issuer": "https://idp.example", "audience": "runlog", "algorithms": ["RS256"],
            "jwks_url": "https://idp.example/jwks", **over}  # fmt: skip


BAD = {
    "alg none": (_one(algorithms=["none"]), "'none' is not an allowed algorithm"),
    "hs256": (_one(algorithms=["RS256", "HS256"]), "never none or HS*"),
    "unknown alg": (_one(algorithms=["XS1"]), "'XS1' is not an allowed algorithm"),
    "no algorithm": (_one(algorithms=[]), "allows no algorithm"),
    "url and keys": (_one(keys=[rs().pem()]), "either `jwks_url` or `keys`"),
    "neither": (_one(jwks_url=""), "either `jwks_url` or `keys`"),
    "plain http": (_one(jwks_url="http://idp.example/jwks"), "use https://"),
    "own issuer": (_one(issuer="runlog"), "runlog's own jwt_issuer"),
    "no audience": (_one(audience=""), "no `audience`"),
    "unknown field": (_one(audiences=["x"]), "unknown field"),
    "private jwk": (_one(jwks_url="", keys=[{**rs().jwk(), "d": "c2VjcmV0"}]), "private"),
    "not pem": (_one(jwks_url="", keys=["-----BEGIN PUBLIC KEY-----\nAAAA"]), "not a PEM"),
    "no fitting alg": (_one(jwks_url="", keys=[es().pem()]), "fits none of the algorithms"),
    "not json": ("[{", "is not JSON"),
    "an object": (json.dumps(_one()), "is not a list of issuers"),
    "no such file": ("/nonexistent/issuers.toml", "cannot be read"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_an_unusable_setting_is_one_line(case: str) -> None:
    value, says = BAD[case]
    with pytest.raises(errors.InvalidSetting) as info:
        issuers.configured(_settings(value))
    assert info.value.code == "invalid_setting"
    assert says in info.value.detail and "\n" not in info.value.detail
    assert info.value.detail.startswith("RUNLOG_TRUSTED_ISSUERS / --trusted-issuers: ")
    assert "c2VjcmV0" not in info.value.detail  # no key material


def test_duplicate_issuers_are_refused() -> None:
    with pytest.raises(errors.InvalidSetting, match="listed twice"):
        issuers.configured(_settings([_one(), _one()]))


def test_inline_pem_and_jwk_keys_kidless_tried_in_order(tmp_path: Path) -> None:
    one, two, three = rs(None), es(None), ed("d7")
    path = tmp_path / "issuers.toml"
    keys = ", ".join(json.dumps(k) for k in (one.pem(), two.pem()))
    path.write_text(
        '[[issuers]]\nissuer = "https://inline.example"\naudience = "runlog"\n'
        'algorithms = ["RS256", "ES256", "EdDSA"]\nroles_claim = "runlog_roles"\n'
        f"keys = [{keys}]\n"
    )
    v = issuers.Issuers(Settings(trusted_issuers=str(path))).load()
    iss, aud = "https://inline.example", "runlog"
    assert v.verify(one.token(iss, aud)).user == "alice"
    p = v.verify(two.token(iss, aud, runlog_roles={"s_1": "viewer"}))
    assert (p.user, p.issuer, p.roles) == ("alice", iss, {"s_1": "viewer"})
    # A token with a kid the issuer does not have: its kid-less keys.
    assert v.verify(Signer(two.key, "ES256", "k9").token(iss, aud)).user == "alice"
    with pytest.raises(errors.Unauthorized, match="runlog_roles"):
        v.verify(two.token(iss, aud, runlog_roles={"s_1": "admin"}))
    with pytest.raises(errors.Unauthorized, match="no key of its issuer has its kid"):
        v.verify(three.token(iss, aud))  # not one of its keys
    jwk_only = issuers.Issuers(_settings([_one(jwks_url="", keys=[three.jwk()],
                                               algorithms=["EdDSA"], user_claim="email")])).load()  # fmt: skip
    tok = three.token("https://idp.example", "runlog", email="ann@example.com")
    assert jwk_only.verify(tok).user == "ann@example.com"
    with pytest.raises(errors.Unauthorized, match="'email'"):
        jwk_only.verify(three.token("https://idp.example", "runlog"))


def test_no_issuers_is_runlogs_own_tokens_only() -> None:
    s = Settings()
    v = issuers.Issuers(s).load()
    tok = jwt.encode(claims_of("elsewhere", "x"), s.jwt_secret, algorithm="HS256")
    with pytest.raises(errors.Unauthorized) as info:
        v.verify(tok)
    assert info.value.detail == "invalid token: InvalidIssuerError"  # auth.verify's, as before


# -- runlog issuers check


async def _runlog(*args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_runlog_issuers_check(jwks: Jwks) -> None:
    jwks.docs["chk"] = [rs("r7").jwk(), es("e7").jwk(), {"kty": "oct", "k": "c2VjcmV0"}]
    trusted = [issuer("chk", jwks, ["RS256", "PS256", "ES256"]),
               issuer("gone", jwks, ["ES256"])]  # fmt: skip
    code, out, err = await _runlog("issuers", "check", "--trusted-issuers", json.dumps(trusted))
    assert code == 1, err
    assert out.splitlines() == [
        f"https://chk.example ({jwks.of('chk')}): 3 key(s), audience 'aud-chk', user chk:<sub>",
        "  kid 'r7': RSA 2048 bits, RS256",
        "  kid 'r7': RSA 2048 bits, PS256",
        "  kid 'e7': EC P-256, ES256",
        f"https://gone.example ({jwks.of('gone')}): error: HTTP 503",
    ]
    assert "c2VjcmV0" not in out + err
    code, out, err = await _runlog("issuers", "check", "--trusted-issuers",
                                   json.dumps([_one(algorithms=["HS256"])]))  # fmt: skip
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "runlog: error [invalid_setting]: RUNLOG_TRUSTED_ISSUERS / --trusted-issuers: 'HS256' is "
        "not an allowed algorithm: one of RS256, RS384, RS512, PS256, ES256, ES384, EdDSA (never "
        "none or HS*: an issuer's public key is no HMAC secret) (issuer 'https://idp.example')"
    ]
    code, out, _ = await _runlog("issuers", "check")
    assert code == 0 and out.startswith("no trusted issuers")


def test_uuid_kids_are_opaque() -> None:
    # A kid is any string: never parsed, never a URL.
    k = es(str(uuid.uuid4()))
    v = issuers.Issuers(_settings([_one(jwks_url="", keys=[k.jwk()], algorithms=["ES256"])])).load()
    assert v.verify(k.token("https://idp.example", "runlog")).user == "alice"


async def test_runlog_gateway_refuses_an_hmac_issuer_before_serving(settings: Settings) -> None:
    bad = json.dumps([_one(algorithms=["HS256"])])
    code, out, err = await _runlog("gateway", "--trusted-issuers", bad, "--gateway-port", "0",
                                   "--nats-url", settings.nats_url,
                                   "--database-url", settings.database_url)  # fmt: skip
    assert (code, out) == (2, "")
    [line] = err.splitlines()
    assert line.startswith("runlog: error [invalid_setting]: RUNLOG_TRUSTED_ISSUERS")
    assert "'HS256' is not an allowed algorithm" in line


async def test_runlog_up_refuses_an_unusable_setting_before_starting(tmp_path: Path) -> None:
    code, out, err = await _runlog("up", "--data-dir", str(tmp_path),
                                   "--trusted-issuers", json.dumps([_one(jwks_url="ftp://x/")]))  # fmt: skip
    assert (code, out) == (2, "")
    assert err.splitlines() == [
        "runlog: error [invalid_setting]: RUNLOG_TRUSTED_ISSUERS / --trusted-issuers: 'ftp://x/' "
        "is not an http(s) URL (issuer 'https://idp.example')"
    ]
    assert not (tmp_path / "pg").exists()  # nothing started


async def test_a_large_jwks_is_read_whole_and_an_oversized_one_refused(jwks: Jwks) -> None:
    k = es("big")
    jwks.docs["big"] = [{**k.jwk(), "x-padding": "a" * 300_000}]  # many reads of the body
    jwks.docs["huge"] = [{**k.jwk(), "x-padding": "a" * 1_100_000}]
    big = issuers.IssuerConfig(issuer="https://big.example", audience="a",
                               algorithms=["ES256"], jwks_url=jwks.of("big"))  # fmt: skip
    huge = issuers.IssuerConfig(issuer="https://huge.example", audience="a",
                                algorithms=["ES256"], jwks_url=jwks.of("huge"))  # fmt: skip
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        [key] = await issuers.fetch_jwks(http, big)
        assert (key.kid, key.algorithm) == ("big", "ES256")
        with pytest.raises(issuers.JwksError, match="over 1048576 bytes"):
            await issuers.fetch_jwks(http, huge)
