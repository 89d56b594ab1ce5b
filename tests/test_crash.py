"""Adversity: NATS and PostgreSQL killed (SIGKILL) mid-stream and restarted.

These tests use `killable`, a private NATS + PostgreSQL pair started by the
product's launcher, so killing them never disturbs other tests.
"""

from __future__ import annotations

import asyncio
import time

from broker import events
from broker.runtime import Broker

from .helpers import KillableStack, assert_contiguous, collect, make_settings, new_run, text


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

        published_before = writer_side.metrics.published_messages._value.get()
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
        deadline = time.monotonic() + 30
        while len(writer_side.appender._publish_q) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert len(writer_side.appender._publish_q) == 0
        assert writer_side.metrics.published_messages._value.get() > published_before

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
        assert b.metrics.flush_errors.labels("connection")._value.get() > 0
        assert await b.store.run_head(run_id) == (total, False)
        followed = await reader
        await sub.close()
        assert_contiguous(followed, first=1)
        assert len(followed) == total
    finally:
        await b.close()


async def test_connection_cut_after_commit_is_sent_loses_and_doubles_nothing(
    stack: object, settings: object
) -> None:
    """The ambiguous case: COMMIT reached PostgreSQL but its reply never came
    back. The appender must find out that the batch committed and not write
    it again (nor lose it)."""
    import dataclasses
    from urllib.parse import urlsplit

    from broker.settings import Settings

    from .proxy import CuttingProxy

    assert isinstance(settings, Settings)
    u = urlsplit(settings.database_url)
    proxy = CuttingProxy(u.hostname or "127.0.0.1", u.port or 5432)
    await proxy.start()
    via_proxy = settings.database_url.replace(f":{u.port}/", f":{proxy.port}/")
    b = await Broker.connect(dataclasses.replace(settings, database_url=via_proxy))
    try:
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        for i in range(10):
            await w.append(text(i))
        await w.flush()
        for round_ in range(3):
            proxy.arm(b"COMMIT")
            for i in range(50):
                await w.append(text(100 * (round_ + 1) + i))
            await w.flush()
        assert proxy.cuts == 3
        rows = await b.store.pool.fetch(
            "SELECT seq FROM events WHERE run_id = $1 ORDER BY seq", run_id
        )
        assert [r[0] for r in rows] == list(range(1, 161))
        assert w.committed_seq == 160
        assert b.metrics.flush_errors.labels("connection")._value.get() >= 3
    finally:
        await b.close()
        await proxy.stop()
