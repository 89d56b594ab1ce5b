"""Disconnect codes: why the server closed a connection and what to do next.

`reconnect` tells the client:
  resume  reconnect (to any gateway) with the cursors it has; nothing is lost
  reauth  get a fresh token, then reconnect and resume
  stop    do not reconnect; fix the request first
Every server-initiated WebSocket close is preceded by
{"type":"disconnect","code":...,"reconnect":...,"cursors":{topic: cursor}}
and uses the close code below; an SSE stream ends with
`event: disconnect` carrying the same object.

The codes, close codes and `reconnect` are broker/codes.py's (the registry's
entries with a close code); this is their view by code. 4429 is both
`rate_limited`'s and `too_many_connections`'s (HTTP 429's meaning): the code
tells them apart, and the message carries retry_after_s.
"""

from __future__ import annotations

from typing import NamedTuple

from broker import codes


class Disconnect(NamedTuple):
    close_code: int
    reconnect: str
    meaning: str


def _of(name: str) -> Disconnect:
    c = codes.get(name)
    assert c.close is not None and c.reconnect is not None, name
    return Disconnect(c.close, c.reconnect, c.on_close or c.meaning)


CODES: dict[str, Disconnect] = {name: _of(name) for name in codes.disconnect_codes()}
