"""Trusted token issuers (OIDC providers: Keycloak, Auth0, Okta, ...) beside
runlog's own HS256 one.

The trusted_issuers setting lists them (docs/security.md, "Trusted issuers"):
each with its exact `iss`, the `aud` it must carry, its public keys (a JWKS URL
or inline PEM/JWK keys), the algorithms allowed (asymmetric only: an HMAC
secret is not a public key), the claim giving the user id and a prefix for it.
A token whose `iss` is runlog's own jwt_issuer, or any token when no issuer is
listed, is auth.verify's, exactly as before.

Keys are cached per issuer and `kid`, never by `kid` alone: two issuers may
publish the same `kid`, and a key of one must never verify a token of the other
(GHSA-g6vg-wj8f-48cj, CVE-2026-49998). The issuer is picked by the token's
`iss`, then only that issuer's keys are tried, and the signature check
verifies `iss` and `aud` again.

Verification is synchronous, from the cache (no I/O per request). A JWKS is
fetched at start, every `refresh_s`, and when a token names a `kid` its issuer
does not have: such a fetch happens at most once per `refetch_cooldown_s` per
issuer (a client inventing `kid`s cannot make the gateway fetch per request),
and the request that caused it (and any other meanwhile) awaits that one fetch,
bounded by `fetch_timeout_s`, before its token is checked: the first token of a
freshly rotated key is accepted. A JWKS that fails to load keeps the last good
keys, counts runlog_gateway_jwks_loads_total{outcome="error"} and logs one line
(no token, no key). A token without `kid` is tried against its issuer's keys
in their order; a token with a `kid` against that issuer's keys of that `kid`,
else its keys without one. `jku`, `x5u` and `jwk` headers are never read.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
import tomllib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt
import msgspec
from aiohttp import web
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from prometheus_client import Counter

from broker import errors, ids
from broker.settings import Settings

from . import auth

log = logging.getLogger(__name__)

SETTING = "trusted_issuers"
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA")
# Which key each algorithm takes: (kty, curves; empty: any).
_KEY_OF: dict[str, tuple[str, tuple[str, ...]]] = {
    "RS256": ("RSA", ()), "RS384": ("RSA", ()), "RS512": ("RSA", ()), "PS256": ("RSA", ()),
    "ES256": ("EC", ("P-256",)), "ES384": ("EC", ("P-384",)),
    "EdDSA": ("OKP", ("Ed25519", "Ed448")),
}  # fmt: skip
_JWKS_MAX_BYTES = 1 << 20
_JWKS_MAX_KEYS = 100


class IssuerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One entry of trusted_issuers (times in s)."""

    issuer: str  # the exact `iss`
    audience: str  # the `aud` its tokens must carry
    algorithms: list[str]  # a subset of ALGORITHMS
    jwks_url: str = ""  # or `keys`
    keys: list[str | dict[str, Any]] = []  # inline public keys: PEM text or JWK objects
    user_claim: str = "sub"
    user_prefix: str = ""  # prepended to the user id: alice of two issuers are two users
    roles_claim: str = ""  # a claim {session id: role}, kept in the Principal
    refresh_s: float = 300.0  # the JWKS is fetched again this often
    refetch_cooldown_s: float = 60.0  # at most one fetch for an unknown kid per this
    fetch_timeout_s: float = 5.0


@dataclass(frozen=True)
class Key:
    """A public key, bound to one algorithm (a JWK allowed for two algorithms
    is two Keys)."""

    kid: str | None
    jwk: jwt.PyJWK
    data: dict[str, Any]  # the public JWK

    @property
    def algorithm(self) -> str:
        return self.jwk.algorithm_name

    def describe(self) -> str:
        data = self.data
        curve = f" {data['crv']}" if "crv" in data else ""
        bits = (
            f" {self.jwk.key.key_size} bits" if isinstance(self.jwk.key, rsa.RSAPublicKey) else ""
        )
        return f"kid {self.kid!r}: {data['kty']}{curve}{bits}, {self.algorithm}"


class JwksError(Exception):
    """A JWKS that could not be used; the message says why, with no key in it."""


# -- the setting


def configured(settings: Settings) -> list[IssuerConfig]:
    """The trusted issuers of `settings`, checked; InvalidSetting (one line,
    naming the issuer, never a key) for anything unusable. The setting is a
    JSON list, or the path of a .json file holding one or of a .toml file of
    [[issuers]] tables."""
    raw = settings.trusted_issuers.strip()
    if not raw:
        return []
    data: Any
    if raw.startswith(("[", "{")):
        source = "(JSON)"
        try:
            data = msgspec.json.decode(raw)
        except msgspec.DecodeError as e:
            raise errors.InvalidSetting(SETTING, source, f"is not JSON: {e}") from None
    else:
        source, path = raw, Path(raw)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            why = f"cannot be read ({type(e).__name__}): give a JSON list or a .json/.toml file"
            raise errors.InvalidSetting(SETTING, source, why) from None
        try:
            if path.suffix == ".toml":
                data = tomllib.loads(text).get("issuers", [])
            else:
                data = msgspec.json.decode(text)
        except (tomllib.TOMLDecodeError, msgspec.DecodeError) as e:
            raise errors.InvalidSetting(SETTING, source, f"does not parse: {e}") from None
    try:
        configs = msgspec.convert(data, list[IssuerConfig])
    except msgspec.ValidationError as e:
        raise errors.InvalidSetting(SETTING, source, f"is not a list of issuers: {e}") from None
    seen: set[str] = set()
    for c in configs:
        _check(settings, c, seen)
    return configs


def _check(settings: Settings, c: IssuerConfig, seen: set[str]) -> None:
    def bad(why: str, value: str = c.issuer) -> errors.InvalidSetting:
        where = "" if value == c.issuer else f" (issuer {c.issuer!r})"
        return errors.InvalidSetting(SETTING, value, why + where)

    if not c.issuer:
        raise bad("is no issuer: `issuer` is the exact `iss` of its tokens")
    if c.issuer == settings.jwt_issuer:
        raise bad("is runlog's own jwt_issuer: give trusted issuers another `iss`")
    if c.issuer in seen:
        raise bad("is listed twice")
    seen.add(c.issuer)
    if not c.audience:
        raise bad("has no `audience`: the `aud` its tokens must carry for this deployment")
    if not c.algorithms:
        raise bad("allows no algorithm: list some of " + ", ".join(ALGORITHMS))
    for a in c.algorithms:
        if a not in ALGORITHMS:
            never = a.lower() == "none" or a.upper().startswith("HS")
            why = " (never none or HS*: an issuer's public key is no HMAC secret)" if never else ""
            raise bad(f"is not an allowed algorithm: one of {', '.join(ALGORITHMS)}{why}", a)
    if bool(c.jwks_url) == bool(c.keys):
        raise bad("needs either `jwks_url` or `keys` (inline public keys), not both or neither")
    if c.jwks_url:
        _check_url(c.jwks_url, bad)
    for i, k in enumerate(c.keys):
        try:
            if not inline_keys(k, c.algorithms):
                raise JwksError(f"fits none of the algorithms {c.algorithms}")
        except JwksError as e:
            raise bad(f"is not a usable public key: {e}", f"keys[{i}]") from None
    if not c.user_claim:
        raise bad("has an empty `user_claim` (default: sub)")
    if c.user_prefix and ids.user_id_problem(c.user_prefix + "x") is not None:
        raise bad("is not a user id prefix (printable, no leading space)", c.user_prefix)
    if not (c.refresh_s > 0 and c.refetch_cooldown_s >= 0 and c.fetch_timeout_s > 0):
        raise bad("needs refresh_s > 0, refetch_cooldown_s >= 0 and fetch_timeout_s > 0")


def _check_url(url: str, bad: Callable[[str, str], errors.InvalidSetting]) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise bad("is not an http(s) URL", url)
    if parts.scheme == "http":
        host = parts.hostname
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise bad("is plain http to another host: use https:// (anyone on the path could "
                      "swap the keys)", url)  # fmt: skip


# -- keys


def jwk_keys(data: object, algorithms: list[str]) -> list[Key]:
    """The Keys a JWK gives for `algorithms` (none if it is not for signing,
    or for none of them). JwksError if it is a private or symmetric key."""
    if not isinstance(data, dict) or not isinstance(data.get("kty"), str):
        raise JwksError("a JWK is an object with a `kty`")
    if data["kty"] == "oct" or "d" in data:
        raise JwksError("a private or symmetric key: give public keys only")
    if data.get("use", "sig") != "sig":
        return []
    ops = data.get("key_ops")
    if isinstance(ops, list) and "verify" not in ops:
        return []
    kid = data.get("kid")
    kid = kid if isinstance(kid, str) else None
    out = []
    for a in algorithms:
        kty, curves = _KEY_OF[a]
        if data["kty"] != kty or (curves and data.get("crv") not in curves):
            continue
        if data.get("alg", a) != a:
            continue
        try:
            out.append(Key(kid, jwt.PyJWK(data, algorithm=a), data))
        except jwt.PyJWTError as e:  # its message would show the key: the type only
            raise JwksError(f"a JWK that does not load ({type(e).__name__})") from None
    return out


def inline_keys(value: str | dict[str, Any], algorithms: list[str]) -> list[Key]:
    """An inline key: a JWK object or a PEM public key (no kid)."""
    if isinstance(value, dict):
        return jwk_keys(value, algorithms)
    try:
        key = serialization.load_pem_public_key(value.encode())
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise JwksError("not a PEM public key (BEGIN PUBLIC KEY)") from None
    data: Any
    if isinstance(key, rsa.RSAPublicKey):
        data = RSAAlgorithm.to_jwk(key, as_dict=True)
    elif isinstance(key, ec.EllipticCurvePublicKey):
        data = ECAlgorithm.to_jwk(key, as_dict=True)
    elif isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        data = OKPAlgorithm.to_jwk(key, as_dict=True)
    else:
        raise JwksError(f"a {type(key).__name__}: RSA, EC or Ed25519/Ed448 only")
    return jwk_keys(data, algorithms)


async def fetch_jwks(http: aiohttp.ClientSession, c: IssuerConfig) -> list[Key]:
    """The usable keys of the issuer's JWKS; JwksError why not."""
    try:
        async with asyncio.timeout(c.fetch_timeout_s):
            async with http.get(c.jwks_url, headers={"Accept": "application/json"}) as r:
                if r.status != 200:
                    raise JwksError(f"HTTP {r.status}")
                body = b""
                while chunk := await r.content.read(65536):
                    body += chunk
                    if len(body) > _JWKS_MAX_BYTES:
                        break
    except TimeoutError:
        raise JwksError(f"no answer within {c.fetch_timeout_s:g} s") from None
    except aiohttp.ClientError as e:
        raise JwksError(f"unreachable ({type(e).__name__})") from None
    if len(body) > _JWKS_MAX_BYTES:
        raise JwksError(f"over {_JWKS_MAX_BYTES} bytes")
    try:
        data = msgspec.json.decode(body)
    except msgspec.DecodeError:
        raise JwksError("not JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("keys"), list):
        raise JwksError("not a JWKS (an object with a `keys` list)")
    keys: list[Key] = []
    for item in data["keys"][:_JWKS_MAX_KEYS]:
        try:
            keys.extend(jwk_keys(item, c.algorithms))
        except JwksError:
            continue  # one odd key does not spoil the others
    if not keys:
        raise JwksError(f"no key usable with {', '.join(c.algorithms)}")
    return keys


# -- the cache and the verifier


class _Issuer:
    """One issuer's keys (its part of the cache: (issuer, kid) → keys) and fetches."""

    def __init__(self, config: IssuerConfig) -> None:
        self.config = config
        self.by_kid: dict[str, list[Key]] = {}
        self.kidless: list[Key] = []
        self.all: list[Key] = []
        self.fetch: asyncio.Task[None] | None = None
        self.last_refetch = float("-inf")  # monotonic s of the last unknown-kid fetch
        if config.keys:
            self.use([k for v in config.keys for k in inline_keys(v, config.algorithms)])

    def use(self, keys: list[Key]) -> None:
        by_kid: dict[str, list[Key]] = {}
        for k in keys:
            if k.kid is not None:
                by_kid.setdefault(k.kid, []).append(k)
        self.by_kid, self.all = by_kid, keys
        self.kidless = [k for k in keys if k.kid is None]

    def candidates(self, kid: object, alg: str) -> list[Key]:
        if isinstance(kid, str):
            keys = self.by_kid.get(kid) or self.kidless
        else:
            keys = self.all
        return [k for k in keys if k.algorithm == alg]


ISSUERS: web.AppKey[Issuers] = web.AppKey("issuers")


class Issuers:
    """Every token's verifier: runlog's own (auth.verify) and the trusted
    issuers'. Constructed without I/O; `load` reads the setting (a file,
    perhaps) and its inline keys, `start` loads it and the JWKS and keeps them
    fresh, `close` stops. Until loaded, only runlog's own tokens verify."""

    def __init__(
        self, settings: Settings, loads: Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.settings = settings
        self._issuers: dict[str, _Issuer] = {}
        self._loads = loads
        self._clock = clock
        self._http: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def load(self) -> Issuers:
        """Read trusted_issuers (InvalidSetting if unusable); returns self."""
        self._issuers = {c.issuer: _Issuer(c) for c in configured(self.settings)}
        if self._loads is not None:
            for iss in self._issuers:
                for outcome in ("ok", "error"):
                    self._loads.labels(iss, outcome)
        return self

    @property
    def names(self) -> list[str]:
        return list(self._issuers)

    async def start(self) -> None:
        self.load()
        remote = [i for i in self._issuers.values() if i.config.jwks_url]
        if not remote:
            return
        # A connection per fetch: a pooled one would sit open between refreshes.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        await asyncio.gather(*(f for i in remote if (f := self._refetch(i, force=True))))
        for i in remote:
            self._tasks.append(
                asyncio.create_task(self._refresh(i), name=f"jwks:{i.config.issuer}")
            )

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        for i in self._issuers.values():
            if i.fetch is not None:
                i.fetch.cancel()
        await asyncio.gather(
            *self._tasks,
            *(i.fetch for i in self._issuers.values() if i.fetch),
            return_exceptions=True,
        )
        self._tasks.clear()
        if self._http is not None:
            await self._http.close()

    async def _refresh(self, i: _Issuer) -> None:
        while True:
            await asyncio.sleep(i.config.refresh_s)
            f = self._refetch(i, force=True)
            if f is not None:
                await f

    def _refetch(self, i: _Issuer, *, force: bool = False) -> asyncio.Future[None] | None:
        """The issuer's fetch in flight, else a new one if `force` or the
        cool-down allows (else None). Never raises: a failure keeps the keys."""
        if i.fetch is not None and not i.fetch.done():
            return asyncio.shield(i.fetch)
        if self._http is None or not i.config.jwks_url:
            return None
        if not force:
            now = self._clock()
            if now - i.last_refetch < i.config.refetch_cooldown_s:
                return None
            i.last_refetch = now
        i.fetch = asyncio.get_running_loop().create_task(self._load(i), name="jwks-fetch")
        return asyncio.shield(i.fetch)

    async def _load(self, i: _Issuer) -> None:
        assert self._http is not None
        c = i.config
        try:
            keys = await fetch_jwks(self._http, c)
        except Exception as e:  # JwksError, or what no request should see
            e = e if isinstance(e, JwksError) else JwksError(type(e).__name__)
            self._count(c.issuer, "error")
            log.warning("JWKS of issuer %s from %s did not load (%s); keeping its %d key(s)",
                        c.issuer, c.jwks_url, e, len(i.all))  # fmt: skip
            return
        i.use(keys)
        self._count(c.issuer, "ok")

    def _count(self, issuer: str, outcome: str) -> None:
        if self._loads is not None:
            self._loads.labels(issuer, outcome).inc()

    def _issuer_of(self, token: str) -> tuple[_Issuer, dict[str, Any]] | None:
        """The listed issuer the token claims (unverified: only to pick the
        keys), with its header; None if it claims none of them."""
        if not self._issuers:
            return None
        try:
            header = jwt.get_unverified_header(token)
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            return None
        iss = claims.get("iss")
        i = self._issuers.get(iss) if isinstance(iss, str) else None
        return (i, header) if i is not None else None

    def keys_ready(self, token: str) -> Awaitable[None] | None:
        """What to await before `verify(token)`: the fetch of its issuer's JWKS
        when the token names a kid the cache lacks (joined if in flight,
        started if the cool-down allows); None when there is nothing to wait
        for (the common case: no I/O, no task)."""
        found = self._issuer_of(token)
        if found is None:
            return None
        i, header = found
        kid = header.get("kid")
        if not isinstance(kid, str) or kid in i.by_kid:
            return None
        return self._refetch(i)

    async def ready(self, token: str) -> None:
        f = self.keys_ready(token)
        if f is not None:
            await f

    def verify(self, token: str) -> auth.Principal:
        """The token's principal, or 401 (token_expired, else unauthorized)."""
        found = self._issuer_of(token)
        if found is None:
            if self._issuers and not self._own_or_unparsed(token):
                raise errors.Unauthorized(
                    "invalid token: its issuer is not trusted here",
                    hint="the `iss` must be jwt_issuer or one of trusted_issuers",
                )
            return auth.verify(self.settings, token)
        i, header = found
        c = i.config
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in c.algorithms:
            raise errors.Unauthorized(
                f"invalid token: algorithm not allowed for its issuer (allowed: "
                f"{', '.join(c.algorithms)})"
            )
        kid = header.get("kid")
        keys = i.candidates(kid, alg)
        if not keys:
            self._refetch(i)  # the next try may find it (at most once per cool-down)
            raise errors.Unauthorized(
                "invalid token: no key of its issuer has its kid",
                hint="if the issuer just rotated its keys, retry in a moment",
            )
        require = ["exp", "iat", "iss", "aud", c.user_claim]
        claims: dict[str, Any] | None = None
        for k in keys:
            try:
                claims = auth.decode(self.settings, token, k.jwk, [alg], issuer=c.issuer,
                                     audience=c.audience, require=require)  # fmt: skip
                break
            except errors.Unauthorized as e:
                if not isinstance(e.__cause__, jwt.InvalidSignatureError):
                    raise
        if claims is None:
            if not isinstance(kid, str):
                self._refetch(i)
            raise errors.Unauthorized("invalid token: InvalidSignatureError")
        return auth.principal_of(
            self.settings, claims, claims.get(c.user_claim), prefix=c.user_prefix,
            issuer=c.issuer, roles=_roles(claims, c.roles_claim),
        )  # fmt: skip

    def _own_or_unparsed(self, token: str) -> bool:
        try:
            iss = jwt.decode(token, options={"verify_signature": False}).get("iss")
        except jwt.PyJWTError:
            return True  # auth.verify tells what is wrong with it
        return iss == self.settings.jwt_issuer


def _roles(claims: dict[str, Any], name: str) -> dict[str, str]:
    """The roles claim: {session id: owner|approver|viewer}; 401 if malformed."""
    if not name or name not in claims:
        return {}
    value = claims[name]
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and v in auth.READ for k, v in value.items()
    ):
        raise errors.Unauthorized(
            f"invalid token: {name!r} is not an object of session id to owner, approver or viewer"
        )
    return dict(value)


def check(settings: Settings) -> None:
    """InvalidSetting now (before serving) if trusted_issuers is unusable."""
    configured(settings)


async def report(settings: Settings, out: Callable[[str], None]) -> bool:
    """`runlog issuers check`: each issuer's keys (fetched), printed; whether
    every one loaded."""
    configs = configured(settings)
    if not configs:
        out(f"no trusted issuers (trusted_issuers is empty): only runlog's own HS256 tokens "
            f"(iss {settings.jwt_issuer!r}) are accepted")  # fmt: skip
        return True
    ok = True
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        for c in configs:
            where = c.jwks_url or "inline keys"
            try:
                keys = await fetch_jwks(http, c) if c.jwks_url else _Issuer(c).all
            except JwksError as e:
                out(f"{c.issuer} ({where}): error: {e}")
                ok = False
                continue
            out(f"{c.issuer} ({where}): {len(keys)} key(s), audience {c.audience!r}, "
                f"user {c.user_prefix}<{c.user_claim}>")  # fmt: skip
            for k in keys:
                out("  " + k.describe())
    return ok
