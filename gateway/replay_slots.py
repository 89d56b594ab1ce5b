"""Turns for catch-up replays: a per-gateway bound on how many run at once,
shared fairly between users.

A catch-up replay reads pages from PostgreSQL (the gateway's small pool) and
encodes them on the event loop; a thousand at once starve every other
request of both. So each page of a replay is read and handed to its
connection's queue inside a turn (`acquire` ... `release`), and at most
`limit` turns run at once.

Contract:
- Below the limit, `acquire` takes a slot at once (no suspension).
- Waiters are served round-robin by user, in order of arrival: a user with k
  waiting replays gets one turn, then every other waiting user gets one,
  before its next. So one user's backlog delays another user's replay by at
  most one turn per user ahead of it, however long that backlog is. Within
  one user, first come first served.
- A waiter cancelled before its turn leaves no trace; one cancelled after its
  turn was granted but before it ran passes the slot on. Every successful
  `acquire` is paired with exactly one `release`.
- `limit` 0: no bound (every turn is granted at once).
- Live delivery never takes a turn: only replays wait here.

A duty cycle (`share` < 1): a bound on turns at once is not a bound on how
much of the event loop and of PostgreSQL they take, since under a flood
turns run back to back. So while others wait, a slot released after a turn
that took t (grant to release, on the loop's clock) rests t·(1 - share)/share
before its next grant: each slot is busy at most `share` of the time, the
rest is left to everyone else (other users' requests, live delivery).
- A turn released while no one waits frees its slot at once: a replay that
  has the gateway to itself never rests.
- Grants stay in the round-robin order above; only their timing changes. A
  resting slot counts in `running`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable


class ReplaySlots:
    def __init__(
        self, limit: int, share: float = 1.0, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.limit = limit
        self.share = share
        self.running = 0  # turns granted and not yet released, or resting after one
        self.waiting = 0  # waiters not yet granted nor cancelled
        self._queues: dict[str, deque[asyncio.Future[float]]] = {}
        self._ring: deque[str] = deque()  # users with a queue, the next one first
        self._clock = clock

    def _now(self) -> float:
        return self._clock() if self._clock else asyncio.get_running_loop().time()

    async def acquire(self, user: str) -> float:
        """Wait for a turn; returns when it was granted (for `release`)."""
        # Invariant (after every grant): running < limit only when no one waits.
        if self.limit <= 0 or self.running < self.limit:
            self.running += 1
            return self._now()
        fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        q = self._queues.get(user)
        if q is None:
            q = self._queues[user] = deque()
            self._ring.append(user)
        q.append(fut)
        self.waiting += 1
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():
                # Left in its queue and skipped when its turn comes (no O(n) removal).
                self.waiting -= 1
            else:
                self.release()  # granted, but the waiter is gone
            raise

    def try_acquire(self) -> float | None:
        """A turn now if a slot is free (then no one waits), else None, never
        a wait: for a read ahead, which must not queue before anyone. A
        grant is paired with one `release`, like `acquire`'s."""
        if self.limit <= 0 or self.running < self.limit:
            self.running += 1
            return self._now()
        return None

    def release(self, granted: float | None = None) -> float:
        """End a turn granted at `granted` (what `acquire` returned); returns
        how long its slot rests before the next grant (0: freed now)."""
        if granted is None or not 0 < self.share < 1 or not self.waiting:
            self._free()
            return 0.0
        rest = max(0.0, self._now() - granted) * (1 - self.share) / self.share
        asyncio.get_running_loop().call_later(rest, self._free)
        return rest

    def _free(self) -> None:
        self.running -= 1
        self._grant()

    def _grant(self) -> None:
        while self._ring and (self.limit <= 0 or self.running < self.limit):
            user = self._ring.popleft()
            q = self._queues[user]
            fut = q.popleft()
            while fut.done() and q:  # cancelled while waiting
                fut = q.popleft()
            if q:
                self._ring.append(user)  # its next replay waits for one round
            else:
                del self._queues[user]
            if fut.done():
                continue
            self.waiting -= 1
            self.running += 1
            fut.set_result(self._now())
