"""Adversity: NATS and PostgreSQL killed (SIGKILL) mid-stream and restarted;
PostgreSQL connections cut at chosen moments of a commit (tests/proxy.py).

The kill tests use `killable`, a private NATS + PostgreSQL pair started by the
product's launcher, so killing them never disturbs other tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import asyncpg
import pytest
from prometheus_client import CollectorRegistry

from broker import errors, events
from broker.runtime import Broker
from broker.settings import Settings

from .helpers import (
    KillableStack,
    assert_contiguous,
    collect,
    make_settings,
    new_run,
    sample,
    text,
)
from .proxy import CuttingProxy
from .workerkit import wait_until


async def test_nats_killed_between_commit_and_publish(killable: KillableStack) -> None:
    settings = make_settings(killable)
    writer_side = await Broker.connect(settings, name="test-writer")
    reader_side = await Broker.connect(settings, name="test-reader")
    try:
        _, run_id = await new_run(writer_side.store)
        w = await writer_side.claim(run_id, "w")
        sub = await reader_side.subscribe(run_id=run_id, after=0)
        for i in range(100):
            await w.append(text(i))
        await w.flush()
        first = await collect(sub, 100)

        published_before = sample(writer_side.metrics, "runlog_publish_messages_total")
        killable.nats.kill()
        await killable.nats.wait_stopped()
        # Committed while NATS is down: every publish after commit fails.
        for i in range(100, 300):
            await w.append(text(i))
        await w.append(events.RunEnd(status="completed"))
        assert await w.flush() == 301
        await killable.nats.restart()

        rest = await collect(sub, 201)
        got = first + rest
        assert_contiguous(got, first=1)
        assert len(got) == 301 and got[-1].type == "run_end" and sub.ended
        await sub.close()

        # The publisher (buffering while reconnecting, retrying on timeouts)
        # caught up once NATS was back: what committed during the outage was
        # published afterwards.
        async def published() -> bool:
            return sample(writer_side.metrics, "runlog_publish_backlog_messages") == 0

        await wait_until(published, timeout_s=30)
        assert sample(writer_side.metrics, "runlog_publish_messages_total") > published_before

        # A fresh subscriber after recovery sees the same log.
        again = await reader_side.subscribe(run_id=run_id, after=0)
        replay = await collect(again, 301)
        await again.close()
        assert [e.payload for e in replay] == [e.payload for e in got]
    finally:
        await reader_side.close()
        await writer_side.close()


async def test_postgres_restarted_mid_append(killable: KillableStack) -> None:
    settings = make_settings(killable, db_retry_s=60.0)
    b = await Broker.connect(settings, name="test-pg-restart")
    try:
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        total = 4000
        appended = asyncio.Event()

        async def produce() -> None:
            for i in range(total):
                await w.append(text(i))
                if i == 1000:
                    appended.set()
                if i % 50 == 0:
                    await asyncio.sleep(0.002)
            await w.flush()

        # A reader follows the run through the restart (its reads retry too).
        sub = await b.subscribe(run_id=run_id, after=0)
        reader = asyncio.create_task(collect(sub, total, timeout_s=90))
        task = asyncio.create_task(produce())
        await appended.wait()
        killable.pg.kill()
        await killable.pg.wait_stopped()
        await asyncio.sleep(0.5)  # appends keep coming while PostgreSQL is down
        await killable.pg.restart()
        await asyncio.wait_for(task, 90)

        assert w.committed_seq == total
        rows = await b.store.pool.fetch(
            "SELECT seq, payload FROM events WHERE run_id = $1 ORDER BY seq", run_id
        )
        assert [r[0] for r in rows] == list(range(1, total + 1))
        deltas = [events.decode_stored(r[1]) for r in rows]
        assert [d.delta for d in deltas if isinstance(d, events.TextDelta)] == [
            f"tok{i} " for i in range(total)
        ]
        assert sample(b.metrics, "runlog_append_flush_errors_total", kind="connection") > 0
        assert await b.store.run_head(run_id) == (total, False)
        followed = await reader
        await sub.close()
        assert_contiguous(followed, first=1)
        assert len(followed) == total
    finally:
        await b.close()


@asynccontextmanager
async def proxied_broker(settings: Settings) -> AsyncIterator[tuple[Broker, CuttingProxy]]:
    """A broker whose PostgreSQL connections all go through a CuttingProxy."""
    proxy = CuttingProxy.in_front_of(settings.database_url)
    await proxy.start()
    b = await Broker.connect(
        dataclasses.replace(settings, database_url=proxy.route(settings.database_url)),
        registry=CollectorRegistry(),
    )
    try:
        yield b, proxy
    finally:
        await b.close()
        await proxy.stop()


def token(i: int) -> bytes:
    """Bytes that only the flush statement carrying `text(i)` sends."""
    return f'"tok{i} "'.encode()


@asynccontextmanager
async def session_row_held(
    settings: Settings, session_id: str
) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """The session's row locked by a transaction of another connection until
    the yielded function is called (or the block ends)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        tx = conn.transaction()
        await tx.start()
        await conn.execute("SELECT FROM sessions WHERE session_id = $1 FOR UPDATE", session_id)
        released = False

        async def release() -> None:
            nonlocal released
            if not released:
                released = True
                await tx.rollback()

        try:
            yield release
        finally:
            await release()
    finally:
        await conn.close()


async def waiting_appends(settings: Settings, n: int) -> bool:
    """Whether `n` flush statements are waiting for a lock at the server."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        waiting = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND query LIKE '%UPDATE runs SET%'"
        )
    finally:
        await conn.close()
    return bool(waiting == n)


async def proxy_idle(proxy: CuttingProxy) -> bool:
    return not proxy.busy


async def stored_seqs(b: Broker, run_id: str) -> list[int]:
    rows = await b.store.pool.fetch("SELECT seq FROM events WHERE run_id = $1 ORDER BY seq", run_id)
    return [r[0] for r in rows]


async def test_connection_cut_after_commit_is_sent_loses_and_doubles_nothing(
    settings: Settings,
) -> None:
    """The ambiguous case: a flush's statement reached PostgreSQL (which ran
    and committed it) but its reply never came back. The appender must find
    out that the batch committed and not write it again (nor lose it)."""
    async with proxied_broker(settings) as (b, proxy):
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        for i in range(10):
            await w.append(text(i))
        await w.flush()
        for round_ in range(3):
            proxy.arm(token(100 * (round_ + 1)))
            for i in range(50):
                await w.append(text(100 * (round_ + 1) + i))
            await w.flush()
        assert proxy.cuts == 3
        assert await stored_seqs(b, run_id) == list(range(1, 161))
        assert w.committed_seq == 160
        assert sample(b.metrics, "runlog_append_flush_errors_total", kind="connection") == 3
        assert sample(b.metrics, "runlog_append_fenced_total") == 0


async def test_commit_still_in_flight_when_cut_is_not_reported_as_fenced(
    settings: Settings,
) -> None:
    """The connection breaks while the flush's statement is still running at
    the server (here: waiting for the session's row, which another
    connection holds): it keeps its runs' row locks when the appender
    retries, so the retry's fence waits, then matches no row. The writers
    must learn that their slices committed, not that they were fenced."""
    async with proxied_broker(settings) as (b, proxy):
        session_id = await b.store.create_session("alice")
        run_ids = [await b.store.create_run(session_id, "alice") for _ in range(2)]
        writers = [await b.claim(r, "w") for r in run_ids]
        for w in writers:
            for i in range(10):
                await w.append(text(i))
        for w in writers:
            assert await w.flush() == 10
        async with session_row_held(settings, session_id) as release:
            proxy.arm(token(10))
            for w in writers:  # one batch, one transaction, both runs
                for i in range(10, 60):
                    await w.append(text(i))
            flushed = asyncio.gather(*(w.flush() for w in writers))
            # The cut statement waits for the session's row, the retry for
            # the run rows the cut one holds.
            await wait_until(lambda: waiting_appends(settings, 2))
            await release()
            assert await flushed == [60, 60]
        for w in writers:
            assert w.error is None and w.committed_seq == 60
        assert proxy.cuts == 1
        for r in run_ids:
            assert await stored_seqs(b, r) == list(range(1, 61))
        cursors = await b.store.pool.fetch(
            "SELECT cursor FROM events WHERE session_id = $1 ORDER BY cursor", session_id
        )
        assert [c[0] for c in cursors] == list(range(1, 121))
        assert sample(b.metrics, "runlog_append_fenced_total") == 0
        assert sample(b.metrics, "runlog_append_flush_errors_total", kind="connection") == 1
        # The writers go on from there.
        for w in writers:
            await w.append(text(60))
            assert await w.flush() == 61


async def test_a_cut_statement_arriving_after_its_retry_writes_nothing(
    settings: Settings,
) -> None:
    """The connection breaks before the flush's statement reaches the server,
    which gets it only a second later, after the appender's retry committed
    the batch: the late copy writes nothing (its fence refuses it; the events'
    primary key would refuse its rows too), no cursor is taken twice, and the
    writer goes on."""
    async with proxied_broker(settings) as (b, proxy):
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        await w.append(text(0))
        assert await w.flush() == 1
        proxy.arm(token(1), hold_s=1.0)
        for i in range(1, 21):
            await w.append(text(i))
        assert await w.flush() == 21
        await wait_until(lambda: proxy_idle(proxy))  # the late copy was answered
        assert proxy.cuts == 1
        assert await stored_seqs(b, run_id) == list(range(1, 22))
        assert sample(b.metrics, "runlog_append_fenced_total") == 0
        await w.append(text(21))
        assert await w.flush() == 22


async def test_connection_cut_before_commit_is_retried_once(settings: Settings) -> None:
    """The connection breaks before the flush's statement is ever delivered:
    nothing of it happened at the server, and the retry commits the batch
    exactly once."""
    async with proxied_broker(settings) as (b, proxy):
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        for i in range(10):
            await w.append(text(i))
        await w.flush()
        for round_ in range(3):
            proxy.arm(token(10 + 50 * round_), forward=False)
            for i in range(50):
                await w.append(text(10 + 50 * round_ + i))
            assert await w.flush() == 10 + 50 * (round_ + 1)
        assert proxy.cuts == 3
        page = await b.store.run_page(run_id, 0, 1000)
        assert [e.seq for e in page] == list(range(1, 161))
        deltas = [events.decode_stored(e.payload) for e in page]
        assert [d.delta for d in deltas if isinstance(d, events.TextDelta)] == [
            f"tok{i} " for i in range(160)
        ]
        assert sample(b.metrics, "runlog_append_flush_errors_total", kind="connection") == 3
        assert sample(b.metrics, "runlog_append_fenced_total") == 0


async def test_fenced_writer_in_a_retried_batch_is_still_refused(settings: Settings) -> None:
    """Recognizing committed slices after a lost reply must not let a fenced
    writer through: in the same cut batch, the healthy writer's slice is
    accepted once and the fenced one is refused."""
    async with proxied_broker(settings) as (b, proxy):
        session_id = await b.store.create_session("alice")
        healthy_run, fenced_run = [await b.store.create_run(session_id, "alice") for _ in range(2)]
        healthy = await b.claim(healthy_run, "w")
        fenced = await b.claim(fenced_run, "w")
        for w in (healthy, fenced):
            await w.append(text(0))
            assert await w.flush() == 1
        await b.claim(fenced_run, "other")  # a takeover: `fenced` lost the run
        async with session_row_held(settings, session_id) as release:
            proxy.arm(token(1))
            for i in range(1, 21):
                await healthy.append(text(i))
                await fenced.append(text(i))
            flushed = asyncio.gather(healthy.flush(), fenced.flush(), return_exceptions=True)
            await wait_until(lambda: waiting_appends(settings, 2))
            await release()
            done, refused = await flushed
        assert done == 21
        assert isinstance(refused, errors.StaleEpoch)
        assert proxy.cuts == 1
        assert await stored_seqs(b, healthy_run) == list(range(1, 22))
        assert await stored_seqs(b, fenced_run) == [1]
        assert sample(b.metrics, "runlog_append_fenced_total") == 1


async def test_appends_wait_at_the_pending_bound_while_postgres_is_away(
    settings: Settings,
) -> None:
    """Cut off PostgreSQL, a writer appends until `max_pending_events` are
    pending (besides the batch whose commit is retried), then waits; the
    pending gauge says so meanwhile (the backpressure alert's input). When
    PostgreSQL is back everything commits, each seq once."""
    limit = 50
    async with proxied_broker(dataclasses.replace(settings, max_pending_events=limit)) as (
        b,
        proxy,
    ):
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        proxy.partition()

        async def produce() -> None:
            for i in range(4 * limit):
                await w.append(text(i))

        producer = asyncio.create_task(produce())
        try:

            async def full() -> bool:
                return sample(b.metrics, "runlog_append_pending_events") == limit

            async with asyncio.timeout(10):
                while not await full():
                    await asyncio.sleep(0.02)
            # One batch in its commit's retries, `limit` more waiting: no more.
            assert w.last_seq == 2 * limit and not producer.done()
        finally:
            proxy.heal()
            await asyncio.wait_for(producer, 30)
        assert await w.flush() == 4 * limit
        assert await stored_seqs(b, run_id) == list(range(1, 4 * limit + 1))
        assert sample(b.metrics, "runlog_append_fenced_total") == 0


async def test_publish_backlog_past_its_bound_drops_the_oldest_and_readers_fill_them(
    killable: KillableStack,
) -> None:
    """NATS is down while a writer commits 20 batches: its publish backlog
    (publish_backlog_max 5) keeps the newest 5 and drops exactly the 15
    oldest. A subscriber still gets every event once, in order, filled from
    PostgreSQL, and the backlog is published once NATS is back."""
    settings = make_settings(killable, publish_backlog_max=5)
    writer_side = await Broker.connect(settings, registry=CollectorRegistry(), name="test-w")
    reader_side = await Broker.connect(settings, registry=CollectorRegistry(), name="test-r")
    sub = None
    try:
        _, run_id = await new_run(writer_side.store)
        w = await writer_side.claim(run_id, "w")
        sub = await reader_side.subscribe(run_id=run_id, after=0)
        for i in range(10):
            await w.append(text(i))
        await w.flush()
        first = await collect(sub, 10)

        async def backlog_empty() -> bool:
            return sample(writer_side.metrics, "runlog_publish_backlog_messages") == 0

        await wait_until(backlog_empty)
        killable.nats.kill()
        await killable.nats.wait_stopped()
        rounds = 20
        for r in range(rounds):  # one batch, one live message each
            for i in range(10):
                await w.append(text(10 + 10 * r + i))
            await w.flush()
        assert sample(writer_side.metrics, "runlog_publish_dropped_total") == rounds - 5
        assert sample(writer_side.metrics, "runlog_publish_backlog_messages") == 5
        during = await collect(sub, 10 * rounds)  # from PostgreSQL: the feed is down
        await killable.nats.restart()
        await wait_until(backlog_empty, timeout_s=60)
        await w.append(events.RunEnd(status="completed"))
        assert await w.flush() == 10 * rounds + 11
        rest = await collect(sub, 1)
        got = first + during + rest
        assert_contiguous(got, first=1)
        assert len(got) == 10 * rounds + 11 and got[-1].type == "run_end" and sub.ended
        assert sample(writer_side.metrics, "runlog_publish_dropped_total") == rounds - 5
        assert (
            sample(reader_side.metrics, "runlog_subscribe_gap_fills_total", reason="position_check")
            > 0
        )
    finally:
        if sub is not None:
            await sub.close()
        await reader_side.close()
        await writer_side.close()


async def test_a_paused_writer_holding_a_lock_does_not_block_the_session(
    settings: Settings,
) -> None:
    """A worker paused (SIGSTOP, a long GC, a frozen VM) in the middle of a
    transaction holds its locks for as long as PostgreSQL keeps its session.
    Here a connection of one process's pool holds the session's row lock (as
    an appender's commit does) and then says nothing more; another writer of
    the same session must get through once db_idle_in_transaction_timeout_s
    has passed, not wait until the paused one wakes up."""
    s = dataclasses.replace(settings, db_idle_in_transaction_timeout_s=1.0)
    frozen = await Broker.connect(s, name="frozen")
    other = await Broker.connect(s, name="other")
    try:
        session_id = await other.store.create_session("alice")
        run_id = await other.start_run(session_id, "alice", input="x")
        own = await other.store.claim_queued(run_id, "w-other", 30.0)
        assert own is not None
        conn = await frozen.store.pool.acquire()
        tx = conn.transaction()
        await tx.start()
        await conn.execute(
            "SELECT last_cursor FROM sessions WHERE session_id = $1 FOR UPDATE", session_id
        )
        writer = other.writer(own)
        await writer.append(events.RunStart(input="x"))
        async with asyncio.timeout(30):
            assert await writer.flush() == 1
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)):
            await tx.commit()  # its session was ended for it
        await frozen.store.pool.release(conn)
    finally:
        await frozen.close()
        await other.close()
