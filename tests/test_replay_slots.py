"""The gateway's turns for catch-up replays (gateway/replay_slots.py): pure
asyncio, no servers. The order of grants is exact: round-robin over users,
first come first served within one user."""

from __future__ import annotations

import asyncio

import pytest

from gateway.replay_slots import ReplaySlots


async def _waiters(
    slots: ReplaySlots, order: list[str], names: list[str]
) -> list[asyncio.Task[None]]:
    """One task per name ("a1" = user a's first replay), each queued in that
    order, recording its name when granted and holding the slot until released."""

    async def one(name: str) -> None:
        await slots.acquire(name[0])
        order.append(name)

    tasks = []
    for name in names:
        tasks.append(asyncio.create_task(one(name), name=f"replay-{name}"))
        await asyncio.sleep(0)  # queued in this order
    return tasks


async def _grant_one_by_one(slots: ReplaySlots, order: list[str], n: int) -> None:
    for i in range(n):
        slots.release()
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(order) == i + 1, (i, order)


async def test_a_flooding_user_delays_another_by_one_turn_at_most() -> None:
    slots = ReplaySlots(1)
    await slots.acquire("a")  # a's replay runs; everything else waits
    order: list[str] = []
    tasks = await _waiters(slots, order, ["a1", "a2", "a3", "a4", "a5", "b1"])
    assert (slots.running, slots.waiting) == (1, 6)
    await _grant_one_by_one(slots, order, 6)
    assert order == ["a1", "b1", "a2", "a3", "a4", "a5"]
    assert (slots.running, slots.waiting) == (1, 0)
    await asyncio.gather(*tasks)
    slots.release()
    assert slots.running == 0


async def test_grants_go_round_robin_over_users_in_order_of_arrival() -> None:
    slots = ReplaySlots(2)
    await slots.acquire("x")
    await slots.acquire("x")
    order: list[str] = []
    tasks = await _waiters(slots, order, ["a1", "a2", "a3", "b1", "b2", "c1"])
    await _grant_one_by_one(slots, order, 6)
    assert order == ["a1", "b1", "c1", "a2", "b2", "a3"]
    await asyncio.gather(*tasks)
    slots.release()
    slots.release()
    assert (slots.running, slots.waiting) == (0, 0)


async def test_below_the_limit_a_turn_is_granted_without_waiting() -> None:
    slots = ReplaySlots(3)
    for _ in range(3):
        await slots.acquire("a")
    assert (slots.running, slots.waiting) == (3, 0)
    blocked = asyncio.create_task(slots.acquire("a"))
    await asyncio.sleep(0)
    assert not blocked.done() and slots.waiting == 1
    slots.release()
    await blocked
    assert (slots.running, slots.waiting) == (3, 0)
    for _ in range(3):
        slots.release()
    assert slots.running == 0


async def test_limit_zero_means_no_bound() -> None:
    slots = ReplaySlots(0)
    for _ in range(1000):
        await slots.acquire("a")
    assert (slots.running, slots.waiting) == (1000, 0)
    for _ in range(1000):
        slots.release()
    assert slots.running == 0


async def test_a_waiter_cancelled_before_its_turn_leaves_no_trace() -> None:
    slots = ReplaySlots(1)
    await slots.acquire("a")
    order: list[str] = []
    tasks = await _waiters(slots, order, ["a1", "b1", "c1"])
    tasks[1].cancel()  # b1's connection closed while it waited
    await asyncio.sleep(0)
    assert slots.waiting == 2
    await _grant_one_by_one(slots, order, 2)
    assert order == ["a1", "c1"]
    assert (slots.running, slots.waiting) == (1, 0)
    await asyncio.gather(*tasks, return_exceptions=True)
    slots.release()
    assert slots.running == 0


async def test_a_waiter_cancelled_right_after_its_grant_passes_the_slot_on() -> None:
    slots = ReplaySlots(1)
    await slots.acquire("a")
    order: list[str] = []
    tasks = await _waiters(slots, order, ["b1", "c1"])
    slots.release()  # granted to b1, which is cancelled before it ever runs
    tasks[0].cancel()
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == ["c1"]
    assert (slots.running, slots.waiting) == (1, 0)
    await asyncio.gather(*tasks, return_exceptions=True)
    slots.release()
    assert slots.running == 0


class _Clock:
    """The slots' clock, set by the test: how long a turn "took" is exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_with_others_waiting_a_slot_rests_after_its_turn_for_the_share() -> None:
    """share 0.25: a turn that took 30 ms leaves its slot resting 90 ms (busy
    a quarter of the time); the waiter gets it after the rest, not at once."""
    clock = _Clock()
    slots = ReplaySlots(1, 0.25, clock=clock)
    granted = await slots.acquire("a")
    assert granted == 100.0
    order: list[str] = []
    tasks = await _waiters(slots, order, ["b1"])
    clock.now += 0.030
    assert slots.release(granted) == pytest.approx(0.090)
    assert (slots.running, slots.waiting) == (1, 1)  # resting; b1 still waits
    await asyncio.sleep(0)
    assert order == []
    await asyncio.gather(*tasks)  # granted once the rest is over
    assert order == ["b1"]
    assert (slots.running, slots.waiting) == (1, 0)
    assert slots.release(clock.now) == 0.0  # nobody waits: freed at once
    assert slots.running == 0


async def test_a_turn_released_with_nobody_waiting_frees_its_slot_at_once() -> None:
    clock = _Clock()
    slots = ReplaySlots(1, 0.1, clock=clock)
    granted = await slots.acquire("a")
    clock.now += 5.0
    assert slots.release(granted) == 0.0
    assert slots.running == 0
    await slots.acquire("a")  # no suspension: the slot is free
    assert slots.running == 1
    slots.release()
    assert slots.running == 0


async def test_a_waiter_granted_after_a_rest_gets_the_time_of_its_grant() -> None:
    """What `acquire` returns is when the turn began, so the next rest is
    proportional to that turn alone (not to the time it waited)."""
    clock = _Clock()
    slots = ReplaySlots(1, 0.5, clock=clock)
    granted = await slots.acquire("a")
    waiter = asyncio.create_task(slots.acquire("b"))
    await asyncio.sleep(0)
    clock.now += 0.010
    assert slots.release(granted) == pytest.approx(0.010)
    clock.now += 7.0  # what the clock says when the rest ends and b is granted
    assert await waiter == pytest.approx(107.010)
    assert slots.release(await waiter) == 0.0
    assert (slots.running, slots.waiting) == (0, 0)


async def test_try_acquire_takes_only_a_free_slot_and_never_one_a_waiter_is_owed() -> None:
    """A read ahead (gateway/replay_page.py) takes a slot only when one is
    free now: with the slots full it gets None, and a released slot goes to
    the waiting replay, not to it."""
    slots = ReplaySlots(2)
    assert slots.try_acquire() is not None
    await slots.acquire("a")
    assert slots.try_acquire() is None  # full
    waiter = asyncio.create_task(slots.acquire("b"))
    await asyncio.sleep(0)
    slots.release()  # owed to b
    assert slots.try_acquire() is None
    await waiter
    assert (slots.running, slots.waiting) == (2, 0)
    slots.release()
    slots.release()
    assert slots.running == 0
    assert ReplaySlots(0).try_acquire() is not None  # no bound
