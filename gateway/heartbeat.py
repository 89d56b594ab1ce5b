"""The WebSocket heartbeat: one sweep per gateway, not a timer per connection.

aiohttp's own (`WebSocketResponse(heartbeat=...)`) keeps, per connection, a
ping timer, a pong timer and, at every ping, a task writing the ping frame:
~2 KiB of an idle connection's ~20 (docs/performance.md "idle"). Here one
timer serves every connection, in two alternating phases half of
`ws_heartbeat_s` apart:

- ping: a connection that sent nothing since the last ping phase (so for
  `ws_heartbeat_s`, or half of it after a ping) gets a ping frame;
- check: a connection pinged half a period ago that has sent nothing since
  (its pong is late) is dead: `Pulse.dead` cuts it.

The semantics of `ws_heartbeat_s` stay aiohttp's: a quiet connection is
pinged every `ws_heartbeat_s`, and closed when the pong has not come back
within half of that; any byte from the client counts as a pong (aiohttp's
rule too), so a client that pings or sends on its own is never pinged. A
dead peer is cut at most 2.5 times `ws_heartbeat_s` after its last byte (1.5 times
with aiohttp's timers, which are aligned on each connection's last byte).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol


class Pulse(Protocol):
    """What the sweep needs of a connection."""

    heard: bool  # set when bytes came in; the sweep clears it
    pinged: bool  # a ping went out and nothing has come back since

    def ping(self) -> None:
        """Write a ping frame (if the socket still takes data frames)."""

    def dead(self) -> None:
        """The pong is late: cut the connection."""


class Heartbeat:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._conns: set[Pulse] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._ping_phase = True
        self._closed = False

    def add(self, conn: Pulse) -> None:
        conn.heard = True  # its upgrade request, just now
        conn.pinged = False
        self._conns.add(conn)
        if self._timer is None and not self._closed:
            self._arm()

    def discard(self, conn: Pulse) -> None:
        self._conns.discard(conn)

    def close(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.interval_s / 2, self._tick)

    def _tick(self) -> None:
        ping, self._ping_phase = self._ping_phase, not self._ping_phase
        for c in sweep(list(self._conns), ping):
            self._conns.discard(c)  # cut: its handler's end discards it too
        self._timer = None
        if self._conns and not self._closed:
            self._arm()


def sweep(conns: Sequence[Pulse], ping_phase: bool) -> list[Pulse]:
    """One phase over `conns` (see the module's docstring); the ones found dead."""
    dead: list[Pulse] = []
    for c in conns:
        if c.pinged:
            if c.heard:
                c.pinged = c.heard = False
            elif not ping_phase:
                c.dead()
                dead.append(c)
        elif ping_phase:
            if c.heard:
                c.heard = False
            else:
                c.pinged = True
                c.ping()
    return dead
