"""Queued runs are taken fairly between users (issue 19, item 6): one
user's backlog does not make another user's run wait past the next free
slot, and `worker_user_max_runs` caps how many of one user's runs execute
at once."""

from __future__ import annotations

import asyncio
import dataclasses

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from broker.store import Store

from .helpers import sample
from .workerkit import read_run, running_worker, start, wait_until

_SHORT = "tell me, no tools"  # reasoning and a short answer


async def _start_many(b: Broker, n: int, user: str) -> list[str]:
    run_ids: list[str] = []
    for i in range(0, n, 50):
        chunk = await asyncio.gather(*(start(b, _SHORT, user) for _ in range(min(50, n - i))))
        run_ids.extend(r for _, r in chunk)
    return run_ids


async def _starts(b: Broker, run_ids: list[str]) -> dict[str, int]:
    """run_start ts of each run that has started."""
    rows = await b.store.pool.fetch(
        "SELECT run_id, ts FROM events WHERE run_id = ANY($1) AND type = 'run_start'", run_ids
    )
    return {r[0]: r[1] for r in rows}


async def test_another_users_run_takes_the_next_free_slot_not_the_end_of_a_backlog(
    settings: Settings, client: Broker
) -> None:
    async with running_worker(settings, concurrency=1, scripted_tokens_per_s=20.0) as (_, w):
        backlog = await _start_many(client, 200, "alice")
        # The one slot is busy with an alice run, streaming: no job is being taken.

        async def one_streams() -> bool:
            n = await client.store.pool.fetchval(
                "SELECT count(*) FROM events WHERE run_id = ANY($1) AND type = 'text_delta'",
                backlog,
            )
            return bool(n)

        await wait_until(one_streams)
        _, dave = await start(client, _SHORT, "dave")
        created = (await client.store.get_run(dave)).created_at_ms
        evs = await read_run(client, dave)
        assert evs[-1].status == "completed"  # type: ignore[union-attr]
        began = evs[0].ts
        jumped = [r for r, ts in (await _starts(client, backlog)).items() if created <= ts < began]
        assert jumped == []  # dave's run took the first slot that came free
        assert w.metrics is not None
        assert sample(w.metrics, "runlog_worker_jobs_total", outcome="yielded") >= 1


async def test_a_user_at_the_cap_waits_while_others_take_the_free_slots(
    settings: Settings, client: Broker
) -> None:
    async with running_worker(
        settings, concurrency=4, scripted_tokens_per_s=20.0, worker_user_max_runs=2
    ) as (_, w):
        mine = await _start_many(client, 6, "alice")
        _, dave = await start(client, _SHORT, "dave")
        logs = await asyncio.gather(*(read_run(client, r) for r in [*mine, dave]))
        assert w.metrics is not None
        assert sample(w.metrics, "runlog_worker_jobs_total", outcome="capped") >= 1
    assert [e[-1].status for e in logs] == ["completed"] * 7  # type: ignore[union-attr]
    spans = [(evs[0].ts, evs[-1].ts) for evs in logs[:-1]]
    # At most two of alice's at once, and two at a time she had.
    most = max(sum(1 for s, e in spans if s <= t < e) for t, _ in spans)
    assert most == 2
    assert isinstance(logs[-1][0], events.RunStart)
    third = sorted(s for s, _ in spans)[2]
    assert logs[-1][0].ts < third  # dave did not wait for alice's cap to clear


async def test_a_queued_run_says_why_it_waits(settings: Settings, client: Broker) -> None:
    """GET /v1/sessions/{id}'s `queued[].waiting_for` (no worker runs here)."""
    busy = await client.store.create_session("alice")
    running = await client.start_run(busy, "alice", input="x")
    assert await client.store.claim_queued(running, "w-1", 30.0) is not None  # alice: 1 executing
    sid = await client.store.create_session("alice")
    first = await client.start_run(sid, "alice", input="a")
    second = await client.start_run(sid, "alice", input="b")  # run policy enqueue: behind first

    async def why(store: Store) -> list[tuple[str, str]]:
        return [(q.run_id, q.waiting_for) for q in (await store.session_info(sid)).queued]

    assert await why(client.store) == [(first, "worker"), (second, "earlier_run")]
    capped = Store(client.store.pool, dataclasses.replace(settings, worker_user_max_runs=1))
    assert await why(capped) == [(first, "user_limit"), (second, "earlier_run")]
