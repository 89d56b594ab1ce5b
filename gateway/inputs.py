"""What the gateway accepts from clients, decided once, at the edge.

* Text fields (REST bodies, WebSocket messages) refuse NUL: PostgreSQL cannot
  store it, and stripping it would store something the client did not send.
  The refusal names the field (`invalid_request` / `invalid_message`). Other
  characters, bidi controls included, are kept as sent: free text may be
  right-to-left, and the console isolates every client string when it shows
  it. User ids are stricter (`broker/ids.py`, `user_id_problem`).
* Counts in a query or header (cursors, limits) are ASCII digits only:
  `str.isdigit` also takes "²" (which `int` refuses) and `int` also takes
  "٣", "+3" and " 3"; one function parses them all.
* Ids are checked against their alphabet and length (`broker/ids.py`) where
  the gateway authorizes a request, before any query.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec

# JSON Schema and Python agree on this pattern; "\x00" (not the character
# itself) keeps the schema and the error message readable.
NO_NUL = r"^[^\x00]*$"

# How msgspec names the pattern in a ValidationError, and what we say instead.
_NUL_RULE = f"matching regex {NO_NUL!r}"


def describe(e: msgspec.ValidationError) -> str:
    """A validation error in words a client can show (never the regex)."""
    return str(e).replace(_NUL_RULE, "without NUL characters")


Text = Annotated[str, msgspec.Meta(max_length=4000, pattern=NO_NUL)]
LongText = Annotated[str, msgspec.Meta(max_length=32000, pattern=NO_NUL)]
ShortText = Annotated[str, msgspec.Meta(max_length=200, pattern=NO_NUL)]
Ref = Annotated[str, msgspec.Meta(max_length=64, pattern=NO_NUL)]
# An approval's call digest (SHA-256, hex), or "" for none given.
Digest = Annotated[str, msgspec.Meta(pattern=r"^(|[0-9a-f]{64})$")]

MAX_COUNT = 2**63 - 1  # PostgreSQL's bigint: cursors are stored as one
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]

_DIGITS = re.compile(r"[0-9]{1,19}")


def parse_count(raw: str) -> int | None:
    """`raw` as a non-negative integer written in ASCII digits (at most
    `MAX_COUNT`), or None if it is anything else."""
    if not _DIGITS.fullmatch(raw):
        return None
    n = int(raw)
    return n if n <= MAX_COUNT else None
