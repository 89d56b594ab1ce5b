"""PostgreSQL outages under streaming runs: ridden out, not turned into
failures (DESIGN guarantee 10), while fencing still decides every commit.

The outage test stops the private `killable` PostgreSQL under two
in-process workers for three of their leases and several read retries; the
partition test cuts one worker off PostgreSQL (a CuttingProxy) while it
stays up for the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import msgspec

from broker import events
from broker.runtime import Broker
from workers.metrics import RUN_OUTCOMES, TAKEOVER_OUTCOMES
from workers.worker import Worker

from .databases import fresh_database
from .helpers import KillableStack, make_settings, sample
from .proxy import CuttingProxy
from .workerkit import (
    IN_SLOT,
    WORKER_DEFAULTS,
    of,
    running_worker,
    scripted_text,
    start,
    stored,
    text_of,
    wait_event,
    wait_until,
)

# The outage outlasts what would turn it into failures if it were not ridden
# out: the leases (WORKER_DEFAULTS: 3 s; every run's is expired when
# PostgreSQL comes back) and the retries of reads (db_retry_s), several times
# over; it stays under storage_outage_grace_s (120 s), past which writers fail.
_DB_RETRY_S = 2.0
_OUTAGE_S = 3 * max(WORKER_DEFAULTS["worker_lease_s"], _DB_RETRY_S)
_SLOW_TOOL_S = 3.0  # search_docs under `slow tool` (scripted_slow_tool_s; 10 s by default)


def _outcomes(w: Worker, name: str, labels: tuple[str, ...]) -> dict[str, float]:
    assert w.metrics is not None
    return {o: sample(w.metrics, name, outcome=o) for o in labels}


async def _wait_ended(b: Broker, run_ids: list[str], timeout_s: float) -> None:
    async def all_ended() -> bool:
        return all([(await b.store.run_head(r))[1] for r in run_ids])

    await wait_until(all_ended, timeout_s=timeout_s, interval_s=0.2)


async def test_postgres_down_past_the_leases_fails_no_streaming_run(
    killable: KillableStack,
) -> None:
    """16 runs stream on two workers (leases of 3 s, reads retried for 2 s)
    while PostgreSQL is down for three leases (_OUTAGE_S): the workers keep
    their runs, buffer (bounded: the models wait once `max_pending_events`
    are pending), commit when it is back, and no worker takes over another's
    runs. Every run completes with exactly the scripted text, each seq once."""
    async with fresh_database(killable, "outage") as database_url:
        settings = dataclasses.replace(
            make_settings(killable, db_retry_s=_DB_RETRY_S), database_url=database_url
        )
        assert _OUTAGE_S < settings.storage_outage_grace_s
        # Slots to spare on both (24 for 16 runs): a reaper that took expired
        # runs over after the outage would have room to.
        n_runs, concurrency = 16, 12
        expected = await scripted_text("long")
        tuning: dict[str, Any] = {"scripted_tokens_per_s": 200.0, "max_pending_events": 2000}
        async with (
            running_worker(settings, concurrency=concurrency, **tuning) as (b, w1),
            running_worker(settings, concurrency=concurrency, purge=False, **tuning) as (b2, w2),
        ):
            run_ids = [(await start(b, "long"))[1] for _ in range(n_runs)]

            async def all_streaming() -> bool:
                heads = [(await b.store.run_head(r))[0] for r in run_ids]
                return min(heads) >= 50

            await wait_until(all_streaming, timeout_s=60)
            placed = {w: len(w.active_runs) for w in (w1, w2)}
            assert sum(placed.values()) == n_runs and min(placed.values()) >= 1, placed
            killable.pg.kill()
            await killable.pg.wait_stopped()
            t_down = time.monotonic()
            await asyncio.sleep(_OUTAGE_S)
            # Both buffers filled up and stopped there: every run's model waits.
            for broker in (b, b2):
                pending = sample(broker.metrics, "runlog_append_pending_events")
                assert pending == tuning["max_pending_events"]
            await killable.pg.restart()
            await _wait_ended(b, run_ids, timeout_s=90)
            assert time.monotonic() - t_down >= _OUTAGE_S

            # Nobody took a run over: each is still under the epoch it started with.
            assert [(await b.store.get_run(r)).owner_epoch for r in run_ids] == [1] * n_runs
            # Each log contiguous from 1, each seq once (`stored` checks).
            logs = {run_id: await stored(b, run_id) for run_id in run_ids}
            assert {r: [e.code for e in of(evs, events.RunError)] for r, evs in logs.items()} == {
                r: [] for r in run_ids
            }
            for evs in logs.values():
                assert [
                    e.__struct_config__.tag for e in evs if not isinstance(e, events.TextDelta)
                ] == [
                    "run_start",
                    "run_end",
                ]
                end = evs[-1]
                assert isinstance(end, events.RunEnd) and end.status == "completed"
                assert text_of(evs) == expected
                assert len(of(evs, events.TextDelta)) == 2000
            for w, broker in ((w1, b), (w2, b2)):
                runs = _outcomes(w, "runlog_worker_runs_total", RUN_OUTCOMES)
                assert runs == {**dict.fromkeys(RUN_OUTCOMES, 0.0), "completed": float(placed[w])}
                takeovers = _outcomes(w, "runlog_worker_takeovers_total", TAKEOVER_OUTCOMES)
                assert takeovers == dict.fromkeys(TAKEOVER_OUTCOMES, 0.0)
                assert sample(broker.metrics, "runlog_append_fenced_total") == 0
                # The outage did reach the commit path of both.
                assert (
                    sample(broker.metrics, "runlog_append_flush_errors_total", kind="connection")
                    > 0
                )


async def test_worker_cut_off_postgres_is_fenced_when_it_comes_back(
    killable: KillableStack,
) -> None:
    """PostgreSQL stays up for everyone but worker A (a partition): A keeps
    its streaming run and buffers, as in an outage, but its lease runs out
    where PostgreSQL is, and worker B takes the run over and resumes it to
    its end. When A reaches PostgreSQL again its buffered commit is refused
    by the fence, its renewal finds the run lost, and nothing of A's lands
    after B's end."""
    async with fresh_database(killable, "partition") as database_url:
        settings = dataclasses.replace(make_settings(killable), database_url=database_url)
        proxy = CuttingProxy.in_front_of(settings.database_url)
        await proxy.start()
        via_proxy = dataclasses.replace(settings, database_url=proxy.route(settings.database_url))
        try:
            async with running_worker(via_proxy, concurrency=4, scripted_tokens_per_s=50.0) as (
                b_a,
                w_a,
            ):
                _, run_id = await start(b_a, "long")

                async def streaming() -> bool:
                    return (await b_a.store.run_head(run_id))[0] >= 20

                await wait_until(streaming)
                assert w_a.active_runs == [run_id]
                async with running_worker(settings, purge=False) as (b_b, w_b):
                    proxy.partition()
                    await _wait_ended(b_b, [run_id], timeout_s=60)  # taken over, resumed by B
                    head = await stored(b_b, run_id)
                    assert w_a.active_runs == [run_id]  # A kept it through the cut
                    proxy.heal()

                    async def a_gave_up() -> bool:
                        # Its renewal found the run lost, and its appender
                        # (retrying on its own backoff) tried the buffered
                        # commit: only then is "nothing of A's landed" proven.
                        fenced = sample(b_a.metrics, "runlog_append_fenced_total")
                        return not w_a.active_runs and fenced > 0

                    await wait_until(a_gave_up)
                    after = await stored(b_b, run_id)
                    assert w_b.metrics is not None and w_a.metrics is not None
                    takeovers = _outcomes(w_b, "runlog_worker_takeovers_total", TAKEOVER_OUTCOMES)
                    a_runs = _outcomes(w_a, "runlog_worker_runs_total", RUN_OUTCOMES)
                    a_fenced = sample(b_a.metrics, "runlog_append_fenced_total")
            # A's partial answer retracted, B's whole answer once after it.
            (reset,) = of(head, events.MessageReset)
            assert text_of(head[head.index(reset) :]) == await scripted_text("long")
            assert of(head, events.RunError) == []
            end = head[-1]
            assert isinstance(end, events.RunEnd) and end.status == "completed"
            assert [msgspec.json.encode(e) for e in after] == [msgspec.json.encode(e) for e in head]
            assert takeovers == {**dict.fromkeys(TAKEOVER_OUTCOMES, 0.0), "resumed": 1.0}
            assert a_runs == {**dict.fromkeys(RUN_OUTCOMES, 0.0), "lost": 1.0}
            assert a_fenced == 1  # its buffered batch, refused once
        finally:
            await proxy.stop()


async def test_a_run_that_asks_for_approval_during_an_outage_waits_it_out(
    killable: KillableStack,
) -> None:
    """PostgreSQL goes down while a tool runs; the next step stores an
    approval and a checkpoint. Those writes wait for PostgreSQL as commits do
    (up to storage_outage_grace_s), not db_retry_s, which bounds reads: the
    run asks, is approved after the outage, and completes under its epoch
    (waiting in its slot: a parked run is woken under the next epoch)."""
    async with fresh_database(killable, "outage_approval") as database_url:
        settings = dataclasses.replace(
            make_settings(killable, db_retry_s=_DB_RETRY_S, scripted_slow_tool_s=_SLOW_TOOL_S),
            database_url=database_url,
        )
        async with running_worker(settings, **IN_SLOT) as (b, w):
            _, run_id = await start(b, "slow tool: tell me about approvals")
            await wait_event(b, run_id, "progress")  # search_docs runs for _SLOW_TOOL_S
            killable.pg.kill()
            await killable.pg.wait_stopped()
            # Down past the tool's end and past db_retry_s after it (twice).
            await asyncio.sleep(_SLOW_TOOL_S + 2 * _DB_RETRY_S)
            await killable.pg.restart()
            req = await wait_event(b, run_id, "approval_required", timeout_s=60)
            assert isinstance(req, events.ApprovalRequired)
            await b.decide(req.approval_id, "approve", "bob")
            await _wait_ended(b, [run_id], timeout_s=60)
            evs = await stored(b, run_id)
            assert [e.code for e in of(evs, events.RunError)] == []
            assert evs[-1].status == "completed"  # type: ignore[union-attr]
            assert (await b.store.get_run(run_id)).owner_epoch == 1
            assert [r.status for r in of(evs, events.ToolResult)] == ["ok", "ok"]
            # The search took _SLOW_TOOL_S (100 steps), so it ended in the outage.
            (search,) = [c for c in of(evs, events.ToolCallStart) if c.tool_name == "search_docs"]
            deltas = of(evs, events.ToolArgsDelta)
            args = json.loads(
                "".join(d.partial_json for d in deltas if d.tool_call_id == search.tool_call_id)
            )
            assert args["steps"] * args["delay_ms"] == 1000 * _SLOW_TOOL_S
            runs = _outcomes(w, "runlog_worker_runs_total", RUN_OUTCOMES)
            assert runs == {**dict.fromkeys(RUN_OUTCOMES, 0.0), "completed": 1.0}
