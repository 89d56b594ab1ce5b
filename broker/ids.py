"""Random, unguessable ids: a type prefix and 128 random bits (base64url).

The alphabet [A-Za-z0-9_-] is safe in NATS subject tokens and URLs.

Ids and user ids that come from clients are checked here, once, before any
query: a malformed id is answered exactly as an unknown one (so the two cannot
be told apart) and never reaches PostgreSQL, which refuses NUL outright.
"""

from __future__ import annotations

import re
import secrets
import unicodedata

SESSION, RUN, APPROVAL = "s", "r", "ap"

# fullmatch, not match + "$": "$" also matches before a trailing newline.
_ID_RE = re.compile(r"[a-z]{1,3}_[A-Za-z0-9_-]{22}")

USER_ID_MAX_CHARS = 200


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def session_id() -> str:
    return new_id(SESSION)


def run_id() -> str:
    return new_id(RUN)


def approval_id() -> str:
    return new_id(APPROVAL)


def is_valid(value: str, prefix: str | None = None) -> bool:
    """Whether `value` has the form of an id (of type `prefix`, if given)."""
    if not _ID_RE.fullmatch(value):
        return False
    return prefix is None or value.startswith(prefix + "_")


def user_id_problem(value: str) -> str | None:
    """What is wrong with `value` as a user id, or None if nothing is.

    A user id is shown to other users (members, `decided_by`, `started_by`),
    so it must read as what it is: 1..200 printable characters (Unicode's
    definition: no control, format, surrogate, private-use or unassigned
    character and no separator but the ASCII space), not starting or ending
    with a space. That refuses NUL, the bidi overrides and isolates
    (U+202A-U+202E, U+2066-U+2069), which make a name display reversed, and
    the zero-width characters (U+200B-U+200D, U+2060, U+FEFF), which make two
    names look the same.
    """
    if not 1 <= len(value) <= USER_ID_MAX_CHARS:
        return f"a user id is 1 to {USER_ID_MAX_CHARS} characters"
    if value != value.strip(" "):
        return "a user id does not start or end with a space"
    for ch in value:
        if not ch.isprintable():
            name = unicodedata.name(ch, "") or unicodedata.category(ch)
            return f"a user id has no control or invisible characters (U+{ord(ch):04X} {name})"
    return None
