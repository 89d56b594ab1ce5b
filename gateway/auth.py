"""Bearer tokens (JWT, HS256 via PyJWT) and the role rules.

Roles per session: owner, approver, viewer.

| action                          | owner | approver | viewer |
|---------------------------------|:-----:|:--------:|:------:|
| read / subscribe                |   ✓   |    ✓     |   ✓    |
| start a run                     |   ✓   |    ✓     |        |
| interrupt a run                 |   ✓   |    ✓     |        |
| decide an approval              |   ✓   |    ✓     |        |
| add a member / change its role  |   ✓   |          |        |

Any authenticated user may create a session (and becomes its owner).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jwt

from broker import errors, ids
from broker.settings import Settings
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


def mint(settings: Settings, user: str, ttl_s: float | None = None) -> str:
    now = int(time.time())
    ttl = settings.token_ttl_s if ttl_s is None else ttl_s
    claims = {"sub": user, "iat": now, "exp": now + int(ttl), "iss": settings.jwt_issuer}
    return jwt.encode(claims, settings.jwt_secret, algorithm="HS256")


def verify(settings: Settings, token: str) -> Principal:
    try:
        claims = jwt.decode(
            token,
            settings.jwt_secret,
            algorithms=_ALGORITHMS,
            issuer=settings.jwt_issuer,
            options={"require": ["sub", "exp", "iss"]},
        )
    except jwt.ExpiredSignatureError as e:
        raise errors.TokenExpired("the token has expired", hint="get a new token") from e
    except jwt.PyJWTError as e:
        raise errors.Unauthorized(f"invalid token: {type(e).__name__}") from e
    sub = claims.get("sub")
    problem = ids.user_id_problem(sub) if isinstance(sub, str) else "not a string"
    if problem is not None or not isinstance(sub, str):
        raise errors.Unauthorized(f"invalid token: bad subject ({problem})")
    iat = claims.get("iat")
    issued_at = float(iat) if isinstance(iat, int | float) else 0.0
    return Principal(user=sub, expires_at=float(claims["exp"]), issued_at=issued_at)


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
