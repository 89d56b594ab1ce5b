"""Several flushes in flight at once (`append_flushers`): what sharding the
appender by session must not break — seq and cursor order, fencing, close,
a PostgreSQL outage (real NATS + PostgreSQL; outages through tests/proxy.py)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from prometheus_client import CollectorRegistry

from broker import errors, events
from broker.log import RunWriter
from broker.runtime import Broker
from broker.settings import Settings

from .helpers import sample, text
from .test_crash import proxied_broker, session_row_held, stored_seqs, waiting_appends
from .workerkit import wait_until


async def _writers(b: Broker, n_sessions: int, runs_per_session: int) -> list[RunWriter]:
    """Writers of `runs_per_session` runs in each of `n_sessions` sessions,
    sessions interleaved (run i is in session i % n_sessions)."""
    sessions = [await b.store.create_session("alice") for _ in range(n_sessions)]
    writers = []
    for i in range(n_sessions * runs_per_session):
        run_id = await b.store.create_run(sessions[i % n_sessions], "alice")
        writers.append(await b.claim(run_id, "w"))
    return writers


async def _stream(w: RunWriter, start: int, n: int) -> None:
    for i in range(start, start + n):
        await w.append(text(i))
        await asyncio.sleep(0)  # interleave the runs, as model streams do


async def _assert_log(b: Broker, writers: list[RunWriter], n_events: int) -> None:
    """Each run holds seq 1..n_events with its own tokens in order; each
    session's cursors are 1..N with no hole, and follow seq within a run."""
    by_session: dict[str, list[RunWriter]] = {}
    for w in writers:
        by_session.setdefault(w.session_id, []).append(w)
    for session_id, ws in by_session.items():
        rows = await b.store.pool.fetch(
            "SELECT run_id, seq, cursor, payload FROM events WHERE session_id = $1 ORDER BY cursor",
            session_id,
        )
        assert [r["cursor"] for r in rows] == list(range(1, len(ws) * n_events + 1))
        for w in ws:
            mine = [r for r in rows if r["run_id"] == w.run_id]  # in cursor order
            assert [r["seq"] for r in mine] == list(range(1, n_events + 1))
            deltas = [events.decode_stored(r["payload"]) for r in mine]
            assert [d.delta for d in deltas if isinstance(d, events.TextDelta)] == [
                f"tok{i} " for i in range(n_events)
            ]


async def test_a_session_stuck_in_its_flush_does_not_hold_up_another_session(
    settings: Settings,
) -> None:
    """With two flushers, a flush waiting for session A's row (another
    connection holds it) leaves the second flusher to session B, whose full
    batch commits meanwhile; A's later events are not taken into B's flush
    (they would wait for A's run row with it) but wait for A's flush, and
    then commit after it, in order."""
    s = dataclasses.replace(settings, append_flushers=2, flush_max_events=10)
    b = await Broker.connect(s, registry=CollectorRegistry(), name="test-flushers")
    try:
        wa, wb = await _writers(b, 2, 1)
        for w in (wa, wb):
            await w.append(text(0))
            assert await w.flush() == 1
        async with session_row_held(s, wa.session_id) as release:
            for i in range(1, 11):  # a full batch: A's flush starts, then waits
                await wa.append(text(i))
            await wait_until(lambda: waiting_appends(s, 1))
            for i in range(11, 21):  # A's next batch: waits for A's flush
                await wa.append(text(i))
            for i in range(1, 11):  # B's full batch, for the free flusher
                await wb.append(text(i))
            assert await asyncio.wait_for(wb.flush(), 10) == 11
            assert await stored_seqs(b, wa.run_id) == [1]
            assert wa.committed_seq == 1
            await release()
            assert await asyncio.wait_for(wa.flush(), 10) == 21
        await _assert_log_of(b, wa, 21)
        await _assert_log_of(b, wb, 11)
        assert sample(b.metrics, "runlog_append_fenced_total") == 0
    finally:
        await b.close()


async def _appender_closing(b: Broker) -> bool:
    """Whether the broker's close reached its appender (which then refuses
    appends): its census task is gone by then."""
    return not any(t.get_name() == "runlog-run-census" for t in asyncio.all_tasks())


async def _assert_log_of(b: Broker, w: RunWriter, n: int) -> None:
    rows = await b.store.pool.fetch(
        "SELECT seq, cursor FROM events WHERE run_id = $1 ORDER BY seq", w.run_id
    )
    assert [(r[0], r[1]) for r in rows] == [(i, i) for i in range(1, n + 1)]


async def test_many_runs_through_three_flushers_keep_seq_and_cursor_order(
    settings: Settings,
) -> None:
    """40 runs in 8 sessions, small batches, three flushers: every run's seq
    and every session's cursor has no hole and follows append order."""
    s = dataclasses.replace(settings, append_flushers=3, flush_max_events=50)
    b = await Broker.connect(s, registry=CollectorRegistry(), name="test-flushers")
    try:
        writers = await _writers(b, 8, 5)
        await asyncio.gather(*(_stream(w, 0, 300) for w in writers))
        assert await asyncio.gather(*(w.flush() for w in writers)) == [300] * len(writers)
        await _assert_log(b, writers, 300)
        assert sample(b.metrics, "runlog_events_appended_total") == 300 * len(writers)
    finally:
        await b.close()


async def test_stale_owner_is_refused_while_other_flushers_commit(settings: Settings) -> None:
    """A takeover fences the old writer of one run while three flushers
    commit the other sessions: the stale writer's events are refused (its
    run holds exactly what it had committed), everyone else's commit."""
    s = dataclasses.replace(settings, append_flushers=3, flush_max_events=20)
    b = await Broker.connect(s, registry=CollectorRegistry(), name="test-flushers")
    try:
        writers = await _writers(b, 6, 2)
        stale = writers[0]
        await _stream(stale, 0, 5)
        assert await stale.flush() == 5
        taken = await b.claim(stale.run_id, "other")  # stale lost the run
        assert taken.epoch == stale.epoch + 1
        others = writers[1:]
        appends = asyncio.gather(
            _stream(stale, 5, 100), *(_stream(w, 0, 100) for w in others), return_exceptions=True
        )
        results = await appends
        # The refusal reaches the stale writer while it is still appending,
        # or at its flush.
        assert all(r is None or isinstance(r, errors.StaleEpoch) for r in results)
        try:
            await stale.flush()
            raise AssertionError("the stale writer's flush succeeded")
        except errors.StaleEpoch:
            pass
        assert await asyncio.gather(*(w.flush() for w in others)) == [100] * len(others)
        assert await stored_seqs(b, stale.run_id) == [1, 2, 3, 4, 5]
        for w in others:
            assert await stored_seqs(b, w.run_id) == list(range(1, 101))
        assert sample(b.metrics, "runlog_append_fenced_total") == 1
        # The new owner goes on from the stale one's last commit.
        await taken.append(text(5))
        assert await taken.flush() == 6
    finally:
        await b.close()


async def test_close_commits_what_every_flusher_holds(settings: Settings) -> None:
    """Closing the appender while three flushers each hold a batch (stuck on
    their sessions' rows, held by other connections) and more is pending
    behind them refuses new appends and commits all of it once the rows are
    free: nothing appended is lost."""
    s = dataclasses.replace(
        settings, append_flushers=3, flush_max_events=25, flush_interval_ms=10_000.0
    )
    b = await Broker.connect(s, registry=CollectorRegistry(), name="test-flushers")
    closing: asyncio.Task[None] | None = None
    try:
        writers = await _writers(b, 6, 1)
        # One event each, committed: from now on a flush waits the 10 s
        # interval unless its batch is full (or the appender closes).
        for w in writers:
            await w.append(text(0))
        assert await asyncio.gather(*(w.flush() for w in writers)) == [1] * len(writers)
        async with contextlib.AsyncExitStack() as held:
            releases = [
                await held.enter_async_context(session_row_held(s, w.session_id))
                for w in writers[:3]
            ]
            for w in writers[:3]:  # a full batch each, for each flusher
                await _stream(w, 1, 25)
            await wait_until(lambda: waiting_appends(s, 3))
            for w in writers:
                await _stream(w, w.last_seq, 10)
            closing = asyncio.create_task(b.close())
            # Broker.close stops the census first, then the appender.
            await wait_until(lambda: _appender_closing(b), interval_s=0.001)
            try:
                await writers[3].append(text(11))
                raise AssertionError("an append was taken while closing")
            except errors.StorageError:
                pass
            assert all(w.committed_seq == 1 for w in writers)
            for release in releases:
                await release()
            await asyncio.wait_for(closing, 20)
        assert [w.committed_seq for w in writers] == [36, 36, 36, 11, 11, 11]
        assert all(w.error is None for w in writers)
        check = await Broker.connect(s, registry=CollectorRegistry(), name="test-check")
        try:
            for w, n in zip(writers, [36, 36, 36, 11, 11, 11], strict=True):
                await _assert_log_of(check, w, n)
        finally:
            await check.close()
    finally:
        if closing is None:
            await b.close()


async def test_postgres_outage_with_several_flushes_in_flight_loses_and_doubles_nothing(
    settings: Settings,
) -> None:
    """PostgreSQL cut off while three flushers each retry a full batch of
    their own session and `max_pending_events` more wait behind them (the
    writers then wait): once it is back, every event is committed exactly
    once, seq and cursors without a hole."""
    limit = 60
    s = dataclasses.replace(
        settings,
        append_flushers=3,
        flush_max_events=30,
        max_pending_events=limit,
        flush_interval_ms=10_000.0,
    )
    async with proxied_broker(s) as (b, proxy):
        writers = await _writers(b, 6, 1)
        for w in writers:
            await w.append(text(0))
        assert await asyncio.gather(*(w.flush() for w in writers)) == [1] * len(writers)
        proxy.partition()
        try:
            for w in writers[:3]:  # a full batch each: three flushes in flight
                await _stream(w, 1, 30)
            producers = [
                asyncio.create_task(_stream(w, w.last_seq, 100 - w.last_seq)) for w in writers
            ]

            async def full() -> bool:
                return sample(b.metrics, "runlog_append_pending_events") == limit

            await wait_until(full, timeout_s=10)
            # Three batches in their commits' retries, `limit` more waiting: no more.
            assert sum(w.last_seq - 1 for w in writers) == 3 * 30 + limit
            assert not any(p.done() for p in producers)
            assert all(w.committed_seq == 1 for w in writers)
        finally:
            proxy.heal()
        await asyncio.wait_for(asyncio.gather(*producers), 60)
        assert await asyncio.wait_for(asyncio.gather(*(w.flush() for w in writers)), 60) == [
            100
        ] * len(writers)
        await _assert_log(b, writers, 100)
        assert sample(b.metrics, "runlog_events_appended_total") == 100 * len(writers)
        assert sample(b.metrics, "runlog_append_fenced_total") == 0
        assert sample(b.metrics, "runlog_append_flush_errors_total", kind="connection") >= 3
