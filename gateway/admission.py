"""Connection caps per user and per client address, on one gateway.

Contract:
- Every WebSocket and SSE connection holds one `Ticket`, counted against its
  client address from the start and against its user once the user is known
  (an SSE request: at once; a WebSocket: at the upgrade if it carried a
  token, else when its `auth` message comes). A connection past either cap
  is refused with `too_many_connections` (HTTP 429 + `Retry-After` before a
  stream starts; on an upgraded WebSocket the `disconnect` message and close
  4429), and counts nothing.
- A ticket is released exactly once (its connection does it when CLOSED;
  releasing again is a no-op), so the counts are the connections still held.
- Counts are plain dicts (O(1) per connection), an entry removed when it
  drops to zero: memory follows the connections, not every user ever seen.
- The client address is the peer's (`request.remote`). Only when the peer is
  one of `trusted_proxies` is `X-Forwarded-For` read: from its right end,
  the first address that is not itself a trusted proxy. IPv6 clients count
  per /64 (one host usually holds a whole /64).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from aiohttp import web
from prometheus_client import Counter

from broker import errors
from broker.settings import Settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(spec: str) -> tuple[Network, ...]:
    """`trusted_proxies` ("10.0.0.0/8, 192.0.2.7") as networks; InvalidSetting
    (the process stops before it serves) on a bad one."""
    out = []
    for part in spec.split(","):
        if part.strip():
            try:
                out.append(ipaddress.ip_network(part.strip(), strict=False))
            except ValueError as e:
                raise errors.InvalidSetting(
                    "trusted_proxies", part.strip(), "is not an address or a network (CIDR)"
                ) from e
    return tuple(out)


def _trusted(addr: str, trusted: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in net for net in trusted)


def client_address(peer: str | None, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The address a connection counts against (see the module's docstring)."""
    addr = peer or "unknown"
    if forwarded_for and trusted and _trusted(addr, trusted):
        for hop in reversed(forwarded_for.split(",")):
            addr = hop.strip()
            if not _trusted(addr, trusted):
                break
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return addr[:64]  # not an address (a proxy's junk): counted as it is, bounded
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class Ticket:
    """One connection's place in the counts."""

    __slots__ = ("_admission", "ip", "released", "user")

    def __init__(self, admission: Admission, ip: str, user: str | None) -> None:
        self._admission = admission
        self.ip = ip
        self.user = user
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._admission._release(self)


class Admission:
    def __init__(self, settings: Settings, refused: Counter) -> None:
        self.max_per_user = settings.max_connections_per_user
        self.max_per_ip = settings.max_connections_per_ip
        self.retry_after_s = settings.connection_retry_after_s
        self.trusted = parse_networks(settings.trusted_proxies)
        self._refused = refused
        self.by_user: dict[str, int] = {}
        self.by_ip: dict[str, int] = {}

    def client_ip(self, request: web.Request) -> str:
        return client_address(request.remote, request.headers.get("X-Forwarded-For"), self.trusted)

    def check(self, ip: str, user: str | None) -> None:
        """Raise TooManyConnections if one more connection of `user` from
        `ip` would pass a cap; count nothing."""
        if user is not None and 0 < self.max_per_user <= self.by_user.get(user, 0):
            self._refuse("user", f"user has {self.max_per_user} connections on this gateway")
        if 0 < self.max_per_ip <= self.by_ip.get(ip, 0):
            self._refuse("ip", f"address has {self.max_per_ip} connections on this gateway")

    def admit(self, ip: str, user: str | None) -> Ticket:
        """Count a new connection, or raise TooManyConnections."""
        self.check(ip, user)
        self.by_ip[ip] = self.by_ip.get(ip, 0) + 1
        if user is not None:
            self.by_user[user] = self.by_user.get(user, 0) + 1
        return Ticket(self, ip, user)

    def add_user(self, ticket: Ticket, user: str) -> None:
        """The user of an admitted connection is now known (WebSocket `auth`)."""
        if ticket.user is not None or ticket.released:
            return
        if 0 < self.max_per_user <= self.by_user.get(user, 0):
            self._refuse("user", f"user has {self.max_per_user} connections on this gateway")
        self.by_user[user] = self.by_user.get(user, 0) + 1
        ticket.user = user

    def _refuse(self, reason: str, detail: str) -> None:
        self._refused.labels(reason).inc()
        raise errors.TooManyConnections(
            detail,
            hint="close some connections (one WebSocket carries many subscriptions), "
            "then retry after retry_after_s",
            extra={"retry_after_s": self.retry_after_s},
        )

    def _release(self, ticket: Ticket) -> None:
        _decrement(self.by_ip, ticket.ip)
        if ticket.user is not None:
            _decrement(self.by_user, ticket.user)


def _decrement(counts: dict[str, int], key: str) -> None:
    n = counts[key] - 1
    if n:
        counts[key] = n
    else:
        del counts[key]
