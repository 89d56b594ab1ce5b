"""Who watches a session, gathered from every gateway's announcements (pure:
no I/O, the clock passed in).

Each gateway announces the whole set of users watching a session through it
(`control.Presence`), again every `presence_refresh_s`; an announcement is
kept for its `ttl_s` after it was received, so the viewers of a gateway that
crashed (and never said "none left") leave once it runs out. The watchers of
a session are the union of this gateway's own and the unexpired sets of the
others.
"""

from __future__ import annotations


class PresenceTable:
    """One session's announcements by other gateways: origin -> users."""

    def __init__(self) -> None:
        self._sets: dict[str, tuple[frozenset[str], float]] = {}  # origin -> (users, expires)

    def announce(self, origin: str, users: list[str], ttl_s: float, now: float) -> bool:
        """Take an announcement; whether the users it adds up to changed."""
        before = self.users(now)
        if users:
            self._sets[origin] = (frozenset(users), now + ttl_s)
        else:
            self._sets.pop(origin, None)
        return self.users(now) != before

    def expire(self, now: float) -> bool:
        """Forget what ran out; whether anything did."""
        gone = [o for o, (_, expires) in self._sets.items() if expires <= now]
        for o in gone:
            del self._sets[o]
        return bool(gone)

    def users(self, now: float) -> frozenset[str]:
        out: set[str] = set()
        for users, expires in self._sets.values():
            if expires > now:
                out |= users
        return frozenset(out)


def watching(local: set[str] | frozenset[str], table: PresenceTable, now: float) -> list[str]:
    """Everyone watching, sorted (the order the console shows them in)."""
    return sorted(set(local) | table.users(now))
