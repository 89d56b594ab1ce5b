"""The merge of history and live (broker/merge.py), as properties over random
interleavings: pages, live batches lost, duplicated and reordered, and runs
pruned (holes of a session's cursors) before or while a reader follows.

Three levels, each without a server:
- `place`, `settle` and `LiveBuffer` against their definitions;
- a reader built from them the way the hub's members are (catch up by pages
  while holding live batches, settle, live; a hole sends it back to pages),
  over a random history of commits, deliveries and prunes;
- the real `Subscription` over the memory backends, with a faulty bus.

What every reader must show: each position at most once, in increasing
order; none delivered while an existing position before it is missing (a
hole is filled from the store, or is pruned positions, before anything
after it); and in the end every position the store holds after the cursor.
"""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from broker import events
from broker.backend import LiveBus, LogStore
from broker.backend_memory import MemoryBus, MemoryLog
from broker.merge import HOLE, STALE, LiveBuffer, place, settle
from broker.metrics import BrokerMetrics
from broker.settings import Settings
from broker.subscribe import Subscription

# -- place, settle, LiveBuffer against their definitions


@given(st.integers(0, 50), st.integers(1, 60), st.integers(0, 8))
def test_place_is_the_first_undelivered_position_or_stale_or_hole(
    position: int, first: int, extra: int
) -> None:
    last = first + extra
    fresh = [p for p in range(first, last + 1) if p > position]
    at = place(position, first, last)
    if not fresh:
        assert at == STALE
    elif fresh[0] != position + 1:
        assert at == HOLE
    else:
        assert at >= 0 and first + at == position + 1
        assert list(range(first + at, last + 1)) == fresh


def test_an_empty_batch_is_stale() -> None:
    assert place(3, 5, 4) == STALE


_spans = st.lists(st.tuples(st.integers(1, 40), st.integers(0, 5)), max_size=12)


@given(st.integers(0, 30), _spans)
def test_settle_delivers_what_continues_and_stops_at_the_first_hole(
    position: int, spans: list[tuple[int, int]]
) -> None:
    batches = [(i, first, first + extra) for i, (first, extra) in enumerate(spans)]
    go, end, hole = settle(position, batches)
    # The definition, one batch at a time.
    pos, want, want_hole = position, [], False
    for i, first, last in batches:
        if last <= pos:
            continue
        if first > pos + 1:
            want_hole = True
            break
        want.append((i, pos + 1 - first))
        pos = last
    assert (go, end, hole) == (want, pos, want_hole)
    delivered = [p for i, at in go for p in range(batches[i][1] + at, batches[i][2] + 1)]
    assert delivered == list(range(position + 1, end + 1))  # exactly once, in order, no gap


@given(
    st.integers(1, 20),
    st.none() | st.integers(1, 6),
    st.booleans(),
    st.lists(st.integers(1, 12), max_size=20),
)
def test_a_live_buffer_holds_within_its_bounds_and_says_when_it_dropped(
    max_events: int, max_batches: int | None, first_always: bool, sizes: list[int]
) -> None:
    buf: LiveBuffer[int] = LiveBuffer(
        max_events, max_batches=max_batches, first_always=first_always
    )
    held = []
    for i, n in enumerate(sizes):
        if buf.put(i, n):
            held.append(i)
        assert buf.events == sum(sizes[j] for j in held)
        assert buf.events <= max_events or (first_always and len(held) == 1)
        assert max_batches is None or len(buf) <= max_batches
    assert buf.overflowed == (len(held) < len(sizes))
    if held:
        assert buf.popleft() == held[0]
    assert buf.take() == held[1:] and not buf and buf.events == 0
    buf.clear()
    assert not buf.overflowed


# -- a reader made of the core, over a random history


@dataclasses.dataclass
class History:
    """A stream's truth: batches of positions, committed in order, some pruned."""

    sizes: list[int]
    committed: int = 0  # batches committed so far
    pruned: set[int] = dataclasses.field(default_factory=set)

    def span(self, i: int) -> tuple[int, int]:
        first = sum(self.sizes[:i]) + 1
        return first, first + self.sizes[i] - 1

    def existing(self) -> list[int]:
        out: list[int] = []
        for i in range(self.committed):
            if i not in self.pruned:
                first, last = self.span(i)
                out += range(first, last + 1)
        return out

    def head(self) -> int:
        return self.span(self.committed - 1)[1] if self.committed else 0

    def page(self, after: int, limit: int) -> list[int]:
        return [p for p in self.existing() if p > after][:limit]


class CoreReader:
    """A hub member's algorithm, on the core alone: pages until a short one,
    then settle the held batches (a hole: pages again), then live, where a
    hole sends it back; and the position check of an idle reader."""

    def __init__(self, history: History, after: int, page: int, buffer_max: int) -> None:
        self.history = history
        self.position = after
        self.page_limit = page
        self.live = False
        self.held: LiveBuffer[tuple[int, int]] = LiveBuffer(buffer_max, first_always=False)
        self.delivered: list[int] = []

    def deliver(self, positions: list[int]) -> None:
        existing = self.history.existing()
        for p in positions:
            assert p > self.position, f"{p} again, or out of order (at {self.position})"
            assert p <= self.history.head(), f"{p} is not committed"
            skipped = [q for q in existing if self.position < q < p]
            assert not skipped, f"{p} delivered past the missing {skipped}"
            self.position = p
            self.delivered.append(p)

    def on_live(self, first: int, last: int) -> None:
        if not self.live:
            self.held.put((first, last), last - first + 1)
            return
        at = place(self.position, first, last)
        if at == STALE:
            return
        if at == HOLE:
            self.live = False
            self.held.clear()
            self.held.put((first, last), last - first + 1)
            return
        self.deliver(list(range(first, last + 1))[at:])  # the batch's items from `at`

    def step(self) -> None:
        """One catch-up turn (a page read, and the switch to live at the head)."""
        if self.live:
            if self.history.head() > self.position:  # the position check
                self.live = False
            return
        page = self.history.page(self.position, self.page_limit)
        self.deliver(page)
        if len(page) == self.page_limit:
            return
        if self.held.overflowed:
            self.held.clear()
            return
        go, _, hole = settle(self.position, ((b, b[0], b[1]) for b in self.held.take()))
        for (first, last), at in go:
            self.deliver(list(range(first, last + 1))[at:])  # the batch's items from `at`
        self.live = not hole


@settings(max_examples=400, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=14),
    start=st.integers(0, 14),
    cursor_at=st.integers(0, 100),
    page=st.integers(1, 5),
    buffer_max=st.integers(1, 12),
    actions=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 1000)), max_size=80),
)
def test_a_reader_made_of_the_core_delivers_each_existing_position_once_in_order(
    sizes: list[int],
    start: int,
    cursor_at: int,
    page: int,
    buffer_max: int,
    actions: list[tuple[int, int]],
) -> None:
    history = History(sizes, committed=min(start, len(sizes)))
    after = min(cursor_at, history.head())
    reader = CoreReader(history, after, page, buffer_max)
    in_flight: list[tuple[int, int]] = []  # live batches published, not delivered yet
    for kind, n in actions:
        if kind == 0 and history.committed < len(sizes):  # a commit, then its publish
            history.committed += 1
            in_flight.append(history.span(history.committed - 1))
        elif kind == 1 and in_flight:  # a delivery, in any order (reordered)
            reader.on_live(*in_flight.pop(n % len(in_flight)))
        elif kind == 2 and in_flight:  # a duplicate
            reader.on_live(*in_flight[n % len(in_flight)])
        elif kind == 3 and in_flight:  # a loss
            in_flight.pop(n % len(in_flight))
        elif kind == 4 and history.committed:  # an (ended) run pruned
            history.pruned.add(n % history.committed)
        else:
            reader.step()
    # Quiet from here: what is in flight arrives, and the reader is stepped
    # (pages, position checks) until it is live at the head.
    for b in in_flight:
        reader.on_live(*b)
    for _ in range(3 * sum(sizes) // page + 20):
        reader.step()
    assert set(p for p in history.existing() if p > after) <= set(reader.delivered)


# -- the real Subscription, on the memory backends, with a faulty bus


def _run(coro: object) -> None:
    asyncio.run(coro)  # type: ignore[arg-type]


async def _follow(
    log: LogStore, bus: LiveBus, settings_: Settings, *, after: int, **ident: str
) -> tuple[Subscription, list[int], asyncio.Task[None]]:
    sub = await Subscription(
        log, bus, settings_, BrokerMetrics(CollectorRegistry()), after=after, **ident
    ).start()
    seen: list[int] = []
    by_run = "run_id" in ident

    async def read() -> None:
        async for items in sub:
            seen.extend(e.seq if by_run else e.cursor for e in items)

    return sub, seen, asyncio.create_task(read())


_faults = st.builds(
    MemoryBus,
    drop=st.sampled_from([0.0, 0.2, 0.6]),
    duplicate=st.sampled_from([0.0, 0.3]),
    reorder=st.sampled_from([0.0, 0.3]),
    seed=st.integers(0, 2**16),
)
_quick = dataclasses.replace(Settings(), position_check_s=0.002)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    faults=_faults,
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=10),
    before=st.integers(0, 10),
    page=st.integers(1, 4),
    buffer_max=st.integers(1, 8),
    cursor_at=st.integers(0, 40),
)
def test_a_run_subscription_over_a_faulty_bus_yields_every_event_once_in_order(
    faults: MemoryBus,
    sizes: list[int],
    before: int,
    page: int,
    buffer_max: int,
    cursor_at: int,
) -> None:
    s = dataclasses.replace(_quick, page_max_events=page, live_buffer_max=buffer_max)

    async def main() -> None:
        log, bus = MemoryLog(), faults
        log.create_run("r", "s")
        batches: list[list[events.Event]] = [
            [events.Status(code="x") for _ in range(n)] for n in sizes
        ]
        batches[-1][-1] = events.RunEnd(status="completed")
        for evs in batches[:before]:
            log.append("r", *evs)  # history only: committed before anyone listened
        head, _ = await log.stream_head(True, "r")
        after = min(cursor_at, head)
        sub, seen, reading = await _follow(log, bus, s, after=after, run_id="r")
        for evs in batches[before:]:
            await bus.publish(log.append("r", *evs))
            await asyncio.sleep(0)
        bus.flush_late()
        await asyncio.wait_for(reading, 5)  # ends at run_end, lost or not
        await sub.close()
        assert seen == list(range(after + 1, sum(sizes) + 1))

    _run(main())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    faults=_faults,
    runs=st.lists(st.lists(st.integers(1, 3), min_size=1, max_size=3), min_size=1, max_size=6),
    before=st.integers(0, 6),
    pruned=st.sets(st.integers(0, 5)),
    page=st.integers(1, 4),
    cursor_at=st.integers(0, 40),
)
def test_a_session_subscription_skips_pruned_runs_and_misses_nothing_else(
    faults: MemoryBus,
    runs: list[list[int]],
    before: int,
    pruned: set[int],
    page: int,
    cursor_at: int,
) -> None:
    """Runs one after another in a session; the ended ones in `pruned` are
    deleted (before the subscription, or while it follows): the
    subscription's cursors skip their holes, and hold everything else."""
    s = dataclasses.replace(_quick, page_max_events=page, live_buffer_max=4)

    async def main() -> None:
        log, bus = MemoryLog(), faults
        log.create_session("s")

        async def play(i: int, publish: bool) -> None:
            rid = f"r{i}"
            log.create_run(rid, "s")
            for j, n in enumerate(runs[i]):
                evs: list[events.Event] = [events.Status(code="x") for _ in range(n)]
                if j == len(runs[i]) - 1:
                    evs[-1] = events.RunEnd(status="completed")
                batch = log.append(rid, *evs)
                if publish:
                    await bus.publish(batch)
                    await asyncio.sleep(0)
            if i in pruned:
                log.prune(rid)

        for i in range(min(before, len(runs))):
            await play(i, publish=False)
        head, _ = await log.stream_head(False, "s")
        after = min(cursor_at, head)
        sub, seen, reading = await _follow(log, bus, s, after=after, session_id="s")
        for i in range(min(before, len(runs)), len(runs)):
            await play(i, publish=True)
        bus.flush_late()
        existing = [e.cursor for e in await log.stream_page(False, "s", after, 1000)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not set(existing) <= set(seen) and loop.time() < deadline:
            await asyncio.sleep(0.002)
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await sub.close()
        assert seen == sorted(set(seen)), "a cursor twice or out of order"
        assert set(existing) <= set(seen), f"missing {sorted(set(existing) - set(seen))}"
        assert all(c > after for c in seen)

    _run(main())
