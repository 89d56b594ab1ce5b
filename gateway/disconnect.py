"""Disconnect codes: why the server closed a connection and what to do next.

`reconnect` tells the client:
  resume  reconnect (to any gateway) with the cursors it has; nothing is lost
  reauth  get a fresh token, then reconnect and resume
  stop    do not reconnect; fix the request first
Every server-initiated WebSocket close is preceded by
{"type":"disconnect","code":...,"reconnect":...,"cursors":{topic: cursor}}
and uses the close code below; an SSE stream ends with
`event: disconnect` carrying the same object.
"""

from __future__ import annotations

from typing import NamedTuple


class Disconnect(NamedTuple):
    close_code: int
    reconnect: str
    meaning: str


CODES: dict[str, Disconnect] = {
    "server_draining": Disconnect(4000, "resume", "this gateway is shutting down"),
    "slow_consumer": Disconnect(4001, "resume", "the client read too slowly; its queue overflowed"),
    "storage_unavailable": Disconnect(4002, "resume", "PostgreSQL unreachable for too long"),
    "unauthorized": Disconnect(4401, "reauth", "missing or invalid token"),
    "token_expired": Disconnect(4402, "reauth", "the token expired during the connection"),
    "auth_timeout": Disconnect(4408, "reauth", "no auth message in time"),
    "token_revoked": Disconnect(4409, "reauth", "the user's tokens were revoked: get a new token"),
    "forbidden": Disconnect(
        4403,
        "stop",
        "not allowed: bad Origin, or your access to the session was removed or "
        "lowered (subscribe again if your role still lets you read)",
    ),
    "rate_limited": Disconnect(4429, "resume", "far too many messages; back off, then resume"),
    # Same close code as rate_limited (both are HTTP 429's meaning); the code
    # tells them apart, and the message carries retry_after_s.
    "too_many_connections": Disconnect(
        4429, "resume", "too many connections for this user or address; retry after retry_after_s"
    ),
    "protocol_error": Disconnect(4400, "stop", "binary frames or repeated malformed messages"),
    "internal": Disconnect(4500, "resume", "unexpected server error; back off, then resume"),
}
