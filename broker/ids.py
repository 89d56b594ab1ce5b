"""Random, unguessable ids: a type prefix and 128 random bits (base64url).

The alphabet [A-Za-z0-9_-] is safe in NATS subject tokens and URLs.
"""

from __future__ import annotations

import re
import secrets

_ID_RE = re.compile(r"^[a-z]{1,3}_[A-Za-z0-9_-]{22}$")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def session_id() -> str:
    return new_id("s")


def run_id() -> str:
    return new_id("r")


def approval_id() -> str:
    return new_id("ap")


def is_valid(value: str) -> bool:
    return bool(_ID_RE.match(value))
