"""runlog_runs_unfinished: unfinished runs by status, counted in PostgreSQL."""

from __future__ import annotations

from prometheus_client import generate_latest

from broker import events
from broker.census import RunCensus
from broker.runtime import Broker


async def test_census_counts_unfinished_runs_by_status(broker: Broker) -> None:
    census = RunCensus(broker.store, broker.metrics, interval_s=0)
    before = await census.sample()
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    queued = await census.sample()
    assert queued["queued"] == before["queued"] + 1
    w = await broker.claim(run_id, "census-test")
    running = await census.sample()
    assert running["queued"] == before["queued"]
    assert running["running"] == before["running"] + 1
    await w.append(events.RunEnd(status="completed"))
    await w.flush()
    assert await census.sample() == before
    # The gauge is what /metrics shows, one series per status.
    text = generate_latest(broker.metrics.registry).decode()
    for status, n in before.items():
        assert f'runlog_runs_unfinished{{status="{status}"}} {float(n)}' in text


async def test_census_runs_in_the_background(broker: Broker) -> None:
    # Broker.connect started one (runs_sample_interval_s > 0): it has sampled.
    assert broker.census.interval_s > 0
    assert broker.census._task is not None and not broker.census._task.done()
