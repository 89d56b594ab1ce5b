"""The merge of a stream's history with its live feed, as pure decisions (no
I/O): what `Subscription` (subscribe.py) and the gateway's hub members
(gateway/hub.py) decide when a page or a live batch arrives.

A reader is at a position (the last it delivered: a run's `seq`, a
session's `cursor`). Pages from the log store (backend.LogStore) are the
truth: a page holds every event after the position that exists, in order,
so it skips a pruned run's hole by itself. A live batch (backend.LiveBus)
is a contiguous run of positions `first..last` that may be late, missing,
duplicated or reordered. So, for each batch, `place` says:

- STALE: everything in it was delivered already (a duplicate, or read from
  a page meanwhile): drop it;
- HOLE: it starts past the next position, so something between is missing
  from the live feed (or pruned): deliver nothing of it, read a page from
  the position (a batch is published after its events commit, so the page
  holds them, or shows the hole is one of pruned positions);
- otherwise the index of its first undelivered event: deliver from there.

Delivering only from `place` and pages keeps every event exactly once and
in order: a position is delivered when it is the next one (batch) or when
the store says it is the next that exists (page), and never again since the
position only grows.

While a reader reads history it holds the live batches that arrive in a
`LiveBuffer` (bounded; past its bound a batch is dropped and the buffer
marked overflowed: the hole it leaves is found like any other). At the head
of the history, `settle` says which held batches continue the stream and
whether a hole was met before the end (then: read a page again, and settle
again); with no hole the reader switches to live.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

B = TypeVar("B")

STALE = -1  # `place`: every position of the batch was delivered already
HOLE = -2  # `place`: the batch starts past the next position: read a page first


def place(position: int, first: int, last: int) -> int:
    """Where the batch of positions `first..last` stands for a reader that
    delivered up to `position`: STALE, HOLE, or the index (0-based) of the
    batch's first position not delivered yet. An empty batch (last < first)
    is STALE."""
    if last <= position or last < first:
        return STALE
    if first > position + 1:
        return HOLE
    return position + 1 - first


def settle(
    position: int, batches: Iterable[tuple[B, int, int]]
) -> tuple[list[tuple[B, int]], int, bool]:
    """Held batches `(batch, first, last)`, in arrival order, for a reader at
    `position` reaching the head of its history: (the batches to deliver
    with the index to deliver each from, the position after them, whether a
    hole stopped it: then the batches after the hole are not looked at, and
    the reader reads a page before going live)."""
    out: list[tuple[B, int]] = []
    for batch, first, last in batches:
        at = place(position, first, last)
        if at == STALE:
            continue
        if at == HOLE:
            return out, position, True
        out.append((batch, at))
        position = last
    return out, position, False


class LiveBuffer(Generic[B]):
    """Live batches held, in arrival order, while a reader reads history;
    bounded by the events they hold (`max_events`) and their number
    (`max_batches`). With `first_always`, an empty buffer takes a batch
    however large (so a hole can end); without it, a batch over the bound
    is dropped even then. A dropped batch sets `overflowed` (cleared by
    `clear`), and nothing else is lost: its positions are read from pages."""

    __slots__ = ("_batches", "events", "first_always", "max_batches", "max_events", "overflowed")

    def __init__(
        self, max_events: int, *, max_batches: int | None = None, first_always: bool = True
    ) -> None:
        self.max_events = max_events
        self.max_batches = max_batches
        self.first_always = first_always
        self._batches: deque[tuple[B, int]] = deque()
        self.events = 0  # held, over every batch
        self.overflowed = False

    def put(self, batch: B, n_events: int) -> bool:
        """Hold `batch` (of `n_events` events) unless over the bound; whether it was held."""
        n = self.events + n_events
        if (
            (n > self.max_events and not (self.first_always and not self._batches))
            or (self.max_batches is not None and len(self._batches) >= self.max_batches)
        ):  # fmt: skip
            self.overflowed = True
            return False
        self._batches.append((batch, n_events))
        self.events = n
        return True

    def popleft(self) -> B:
        batch, n = self._batches.popleft()
        self.events -= n
        return batch

    def take(self) -> list[B]:
        """Every held batch, oldest first; the buffer is empty after (`overflowed` stays)."""
        out = [b for b, _ in self._batches]
        self._batches.clear()
        self.events = 0
        return out

    def clear(self) -> None:
        self._batches.clear()
        self.events = 0
        self.overflowed = False

    def __len__(self) -> int:
        return len(self._batches)

    def __bool__(self) -> bool:
        return bool(self._batches)
