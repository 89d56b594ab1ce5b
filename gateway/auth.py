"""Bearer tokens (JWT via PyJWT: runlog's own HS256 ones here, those of the
trusted issuers in issuers.py) and the role rules.

Roles per session: owner, approver, viewer.

| action                          | owner | approver | viewer |
|---------------------------------|:-----:|:--------:|:------:|
| read / subscribe                |   ✓   |    ✓     |   ✓    |
| start a run                     |   ✓   |    ✓     |        |
| interrupt a run                 |   ✓   |    ✓     |        |
| decide an approval              |   ✓   |    ✓     |        |
| add or remove a member / role   |   ✓   |          |        |
| rename, set policies, archive   |   ✓   |          |        |

Any authenticated user may create a session (and becomes its owner).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any

import jwt

from broker import errors, ids
from broker.settings import DEV_JWT_SECRET, Settings
from broker.store import Store

READ = frozenset({"owner", "approver", "viewer"})
ACT = frozenset({"owner", "approver"})
MANAGE = frozenset({"owner"})

_ALGORITHMS = ["HS256"]


@dataclass(frozen=True)
class Principal:
    user: str
    expires_at: float  # s since the epoch
    issued_at: float = 0.0  # s since the epoch (`iat`)
    # The trusted issuer's `iss` ("": runlog's own, jwt_issuer). `user` is
    # already qualified by that issuer's user_prefix.
    issuer: str = ""
    # {session id: role} from the issuer's roles_claim: parsed and kept, not
    # applied yet (roles come from member rows).
    roles: dict[str, str] = field(default_factory=dict)


def mint(settings: Settings, user: str, ttl_s: float | None = None) -> str:
    """A token for `user`, living `ttl_s` (default token_ttl_s); TokenTtlTooLong
    over jwt_max_ttl_s, since no gateway would accept it."""
    ttl = settings.token_ttl_s if ttl_s is None else ttl_s
    if ttl > settings.jwt_max_ttl_s:
        raise errors.TokenTtlTooLong(
            f"a token may live at most {_secs(settings.jwt_max_ttl_s)} s (jwt_max_ttl_s); "
            f"asked for {_secs(ttl)} s"
        )
    now = int(time.time())
    claims = {"sub": user, "iat": now, "exp": now + int(ttl), "iss": settings.jwt_issuer}
    return jwt.encode(claims, settings.jwt_secret, algorithm="HS256")


def verify(settings: Settings, token: str) -> Principal:
    """The token's principal, or 401: signed with jwt_secret (HS256), issued by
    jwt_issuer, with `sub`, `iat` and `exp`; `exp` not past and `iat` not in
    the future (each give or take jwt_leeway_s, for clock skew); a lifetime
    `exp - iat` of at most jwt_max_ttl_s, so a leaked token is worth a bounded
    time whatever its issuer asked for. (Tokens of the trusted issuers are
    gateway/issuers.py's, which checks them the same way.)"""
    claims = decode(
        settings, token, settings.jwt_secret, _ALGORITHMS, issuer=settings.jwt_issuer,
        require=["sub", "exp", "iss", "iat"],
    )  # fmt: skip
    return principal_of(settings, claims, claims.get("sub"))


def decode(
    settings: Settings, token: str, key: object, algorithms: list[str], *, issuer: str,
    require: list[str], audience: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """PyJWT's decode with explicit algorithms, issuer (and audience), its
    errors told as 401s with stable codes (token_expired, else unauthorized)."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            key,  # type: ignore[arg-type]
            algorithms=algorithms,
            issuer=issuer,
            audience=audience,
            leeway=settings.jwt_leeway_s,
            options={"require": require},
        )
    except jwt.ExpiredSignatureError as e:
        raise errors.TokenExpired("the token has expired", hint="get a new token") from e
    except jwt.MissingRequiredClaimError as e:
        raise errors.Unauthorized(f"invalid token: no {e.claim!r} claim") from e
    except jwt.ImmatureSignatureError as e:
        raise errors.Unauthorized(
            "invalid token: issued in the future (iat or nbf later than now + jwt_leeway_s)",
            hint="check the issuer's clock",
        ) from e
    except jwt.PyJWTError as e:
        raise errors.Unauthorized(f"invalid token: {type(e).__name__}") from e
    return claims


def principal_of(
    settings: Settings, claims: dict[str, Any], user: object, *, prefix: str = "",
    issuer: str = "", roles: dict[str, str] | None = None,
) -> Principal:  # fmt: skip
    """The principal of verified `claims` whose user id is `prefix` + `user`:
    a valid user id, numeric `iat` and `exp`, a lifetime within jwt_max_ttl_s."""
    iat, exp = claims["iat"], claims["exp"]
    uid = prefix + user if isinstance(user, str) else None
    problem = ids.user_id_problem(uid) if uid is not None else "not a string"
    if problem is not None or uid is None:
        raise errors.Unauthorized(f"invalid token: bad subject ({problem})")
    # PyJWT takes numeric strings too; we do not.
    if not _is_number(iat) or not _is_number(exp):
        raise errors.Unauthorized("invalid token: iat and exp must be numbers")
    lifetime = float(exp) - float(iat)
    if lifetime > settings.jwt_max_ttl_s:
        raise errors.Unauthorized(
            f"invalid token: its lifetime (exp - iat = {_secs(lifetime)} s) is over the cap "
            f"of {_secs(settings.jwt_max_ttl_s)} s (jwt_max_ttl_s)",
            hint="get a shorter-lived token",
        )
    return Principal(
        user=uid, expires_at=float(exp), issued_at=float(iat), issuer=issuer, roles=roles or {}
    )


def _is_number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _secs(x: float) -> str:
    return str(int(x)) if x == int(x) else str(x)


def secret_is_public(settings: Settings) -> bool:
    return settings.jwt_secret in ("", DEV_JWT_SECRET)


def check_secret(settings: Settings) -> None:
    """InsecureSecret if this gateway would take tokens anyone can mint from
    anywhere but this machine. On loopback only, the default is the
    development convenience it is documented as."""
    if not secret_is_public(settings) or _loopback_only(settings.gateway_host):
        return
    what = "empty" if not settings.jwt_secret else "the public development default"
    raise errors.InsecureSecret(
        f"jwt_secret is {what} and gateway_host {settings.gateway_host} is not loopback-only, "
        "so anyone could mint tokens: set RUNLOG_JWT_SECRET (or --jwt-secret) to a long random "
        "string, e.g. `openssl rand -hex 32`, or listen on 127.0.0.1"
    )


def _loopback_only(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name (it may resolve anywhere) or all interfaces ("")
        return False


def bearer(header: str | None) -> str | None:
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def require_role(
    store: Store, session_id: str, user: str, allowed: frozenset[str], action: str
) -> str:
    """The user's role in the session, if it allows `action`; else a coded error.
    A non-member learns nothing about whether the session exists."""
    # A malformed id is answered as an unknown session, without a query.
    valid = ids.is_valid(session_id, ids.SESSION)
    role = await store.member_role(session_id, user) if valid else None
    if role is None:
        raise errors.NotAMember(f"you are not a member of session {session_id[:64]!r}")
    if role not in allowed:
        raise errors.Forbidden(f"role {role!r} may not {action}")
    return role


def origin_allowed(settings: Settings, origin: str | None, own: set[str]) -> bool:
    if origin is None:
        return True  # not a browser: the token is the only credential
    allowed = {o.strip().rstrip("/") for o in settings.allowed_origins.split(",") if o.strip()}
    if "*" in allowed:
        return True
    return origin.rstrip("/") in allowed | own
