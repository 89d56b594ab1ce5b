"""The durable per-run log: order, fencing, bad input (real NATS + PostgreSQL)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import msgspec
import pytest
from nats.aio.msg import Msg
from prometheus_client import CollectorRegistry

from broker import errors, events
from broker.metrics import GAP_FILL_REASONS as GAP_REASONS
from broker.runtime import Broker
from broker.settings import Settings
from broker.subscribe import Subscription

from . import appendproc
from .databases import fresh_database
from .helpers import (
    KillableStack,
    assert_contiguous,
    collect,
    make_settings,
    new_run,
    sample,
    text,
)
from .workerkit import REPO, wait_until


async def test_concurrent_runs_are_contiguous_per_run_and_per_session(broker: Broker) -> None:
    store = broker.store
    n_runs, n_events, n_sessions = 50, 1000, 5
    sessions = [await store.create_session("alice") for _ in range(n_sessions)]
    run_ids = [await store.create_run(sessions[i % n_sessions], "alice") for i in range(n_runs)]
    writers = [await broker.claim(r, "w-test") for r in run_ids]

    async def produce(w_index: int) -> None:
        w = writers[w_index]
        for i in range(n_events):
            await w.append(text(i))
            if i % 97 == 0:
                await asyncio.sleep(0)  # interleave the writers
        await w.flush()

    await asyncio.gather(*(produce(i) for i in range(n_runs)))

    async with store.pool.acquire() as conn:
        for run_id in run_ids:
            seqs = [
                r[0]
                for r in await conn.fetch(
                    "SELECT seq FROM events WHERE run_id = $1 ORDER BY seq", run_id
                )
            ]
            assert seqs == list(range(1, n_events + 1))
            payloads = await conn.fetch(
                "SELECT seq, payload FROM events WHERE run_id = $1 ORDER BY seq", run_id
            )
            for seq, payload in payloads:
                ev = events.decode_stored(payload)
                assert (ev.run_id, ev.seq) == (run_id, seq)
                assert isinstance(ev, events.TextDelta) and ev.delta == f"tok{seq - 1} "
        for sid in sessions:
            cursors = [
                r[0]
                for r in await conn.fetch(
                    "SELECT cursor FROM events WHERE session_id = $1 ORDER BY cursor", sid
                )
            ]
            expected = n_events * (n_runs // n_sessions)
            assert cursors == list(range(1, expected + 1))
            assert await store.session_head(sid) == expected
    # The committed events reached the metrics once each.
    total = sample(broker.metrics, "runlog_events_appended_total")
    assert total == n_runs * n_events


async def test_one_flush_of_mixed_runs_stores_every_payload_byte_exact(broker: Broker) -> None:
    """One flush statement carries every run's slice: payloads of every size
    (empty delta, multi-byte UTF-8, JSON and array-literal syntax, "NULL")
    and one run's run_end among the other runs' deltas come back exactly,
    each with its own run, seq and type."""
    store = broker.store
    sid = await store.create_session("alice")
    writers = [await broker.claim(await store.create_run(sid, "alice"), "w-test") for _ in range(3)]
    deltas = ["", "NULL", '{a,"b"}\\ ,', "\u00e9t\u00e9 \u6f22\u5b57 \U0001f600", "x" * 5000]
    appended: list[tuple[str, int, bytes]] = []
    for i, d in enumerate(deltas):
        for w in writers[:2]:
            seq = await w.append(events.TextDelta(message_id="m1", delta=d))
            appended.append((w.run_id, seq, d.encode()))
        if i == 2:
            await writers[2].append(events.RunEnd(status="aborted"))
    await asyncio.gather(*(w.flush() for w in writers))
    assert sample(broker.metrics, "runlog_append_batch_events_count") == 1.0
    rows = await store.pool.fetch(
        "SELECT run_id, seq, type, payload FROM events WHERE session_id = $1 ORDER BY cursor", sid
    )
    stored = {
        (r["run_id"], r["seq"]): (r["type"], events.decode_stored(r["payload"])) for r in rows
    }
    assert len(stored) == len(appended) + 1
    for run_id, seq, delta in appended:
        kind, ev = stored[(run_id, seq)]
        assert kind == "text_delta" and isinstance(ev, events.TextDelta)
        assert (ev.run_id, ev.seq, ev.delta.encode()) == (run_id, seq, delta)
    kind, end = stored[(writers[2].run_id, 1)]
    assert kind == "run_end" and isinstance(end, events.RunEnd) and end.status == "aborted"
    assert (await store.get_run(writers[2].run_id)).status == "aborted"


async def test_stale_epoch_writer_is_refused_and_appends_nothing(broker: Broker) -> None:
    _, run_id = await new_run(broker.store)
    old = await broker.claim(run_id, "worker-a")
    for i in range(5):
        await old.append(text(i))
    assert await old.flush() == 5

    new = await broker.claim(run_id, "worker-b")  # takeover: epoch bumped
    assert new.epoch == old.epoch + 1
    for i in range(3):
        await old.append(text(100 + i))
    with pytest.raises(errors.StaleEpoch) as info:
        await old.flush()
    assert info.value.code == "stale_epoch"
    with pytest.raises(errors.StaleEpoch):
        await old.append(text(999))  # dead for good

    count = await broker.store.pool.fetchval(
        "SELECT count(*) FROM events WHERE run_id = $1", run_id
    )
    assert count == 5
    # The new owner continues the same sequence.
    assert await new.append(text(5)) == 6
    assert await new.flush() == 6
    page = await broker.store.run_page(run_id, 0, 100)
    assert [e.seq for e in page] == [1, 2, 3, 4, 5, 6]


async def test_bad_input_gets_a_code_and_writes_nothing(broker: Broker) -> None:
    _, run_id = await new_run(broker.store)
    w = await broker.claim(run_id, "w")
    limit = broker.settings.max_event_bytes
    cases: list[tuple[bytes, str]] = [
        (b'{"type":"no_such_type","x":1}', "unknown_event_type"),
        (b'{"message_id":"m"}', "unknown_event_type"),
        (b'{"type":"text_delta","message_id":7,"delta":"x"}', "invalid_event"),
        (b'{"type":"tool_call_start","tool_call_id":"t","tool_name":"x","risk_level":"extreme"}',
         "invalid_event"),
        (b'{"type":"text_delta"', "invalid_event"),
        (b"\xff\xfe", "invalid_event"),
        (b'{"type":"text_delta","message_id":"m","delta":"' + b"x" * limit + b'"}',
         "payload_too_large"),
    ]  # fmt: skip
    for data, code in cases:
        with pytest.raises(errors.RunlogError) as info:
            await w.append_json(data)
        assert info.value.code == code, data[:60]
    # A struct built in code with a wrong field type is caught the same way.
    with pytest.raises(errors.InvalidEvent):
        await w.append(events.TextDelta(message_id=123, delta="x"))  # type: ignore[arg-type]
    with pytest.raises(errors.PayloadTooLarge):
        await w.append(events.TextDelta(message_id="m", delta="y" * limit))

    assert await w.flush() == 0
    assert await broker.store.run_page(run_id, 0, 10) == []
    # Bad input changed nothing: the writer still works, from seq 1.
    assert await w.append_json(b'{"type":"text_delta","message_id":"m","delta":"ok"}') == 1
    assert await w.flush() == 1


async def test_nothing_follows_run_end(broker: Broker) -> None:
    _, run_id = await new_run(broker.store)
    w = await broker.claim(run_id, "w")
    await w.append(text(0))
    await w.append(events.RunEnd(status="completed"))
    with pytest.raises(errors.RunEnded):
        await w.append(text(1))
    assert await w.flush() == 2
    info = await broker.store.get_run(run_id)
    assert info.status == "completed" and info.ended_at_ms is not None
    with pytest.raises(errors.RunEnded):
        await broker.claim(run_id, "w2")


async def test_subscribe_after_random_cursor_while_appending(broker: Broker) -> None:
    _, run_id = await new_run(broker.store)
    w = await broker.claim(run_id, "w")
    total = 3000
    rng = random.Random(7)
    for i in range(500):
        await w.append(text(i))
    await w.flush()

    async def produce() -> None:
        for i in range(500, total - 1):
            await w.append(text(i))
            if i % 50 == 0:
                await asyncio.sleep(0.002)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()

    async def consume(after: int) -> None:
        sub = await broker.subscribe(run_id=run_id, after=after)
        try:
            got = await collect(sub, total - after)
        finally:
            await sub.close()
        assert_contiguous(got, first=after + 1)
        assert len(got) == total - after
        assert got[-1].type == "run_end" and sub.ended
        for e in got[:3]:
            assert msgspec.json.decode(e.payload)["seq"] == e.seq

    producer = asyncio.create_task(produce())
    consumers = []
    for _ in range(8):
        after = rng.randrange(0, w.committed_seq + 1)
        consumers.append(asyncio.create_task(consume(after)))
        await asyncio.sleep(0.02)
    await asyncio.gather(producer, *consumers)


async def test_session_subscription_merges_runs_in_cursor_order(broker: Broker) -> None:
    session_id = await broker.store.create_session("alice")
    runs = [await broker.store.create_run(session_id, "alice") for _ in range(4)]
    writers = [await broker.claim(r, "w") for r in runs]
    per_run = 300
    sub = await broker.subscribe(session_id=session_id, after=0)

    async def produce(i: int) -> None:
        for k in range(per_run):
            await writers[i].append(text(k))
            if k % 25 == 0:
                await asyncio.sleep(0.001)
        await writers[i].flush()

    try:
        await asyncio.gather(*(produce(i) for i in range(4)))
        got = await collect(sub, per_run * 4)
    finally:
        await sub.close()
    assert_contiguous(got, first=1, by="cursor")
    for r in runs:  # each run's events, within the session stream, in seq order
        assert [e.seq for e in got if e.run_id == r] == list(range(1, per_run + 1))
    # Resuming mid-stream gives exactly the rest.
    sub2 = await broker.subscribe(session_id=session_id, after=700)
    try:
        rest = await collect(sub2, per_run * 4 - 700)
    finally:
        await sub2.close()
    assert_contiguous(rest, first=701, by="cursor")


async def test_cursor_past_head_is_refused(broker: Broker) -> None:
    session_id, run_id = await new_run(broker.store)
    with pytest.raises(errors.InvalidCursor):
        await broker.subscribe(run_id=run_id, after=5)
    with pytest.raises(errors.InvalidCursor):
        await broker.subscribe(session_id=session_id, after=-1)
    with pytest.raises(errors.RunNotFound):
        await broker.subscribe(run_id="r_doesnotexist", after=0)


@asynccontextmanager
async def _broker(settings: Settings) -> AsyncIterator[Broker]:
    b = await Broker.connect(settings, name="test-log")
    try:
        yield b
    finally:
        await b.close()


async def _run_appenders(jobs: list[appendproc.Job]) -> list[appendproc.Report]:
    """Each job in its own `tests.appendproc` process, started together."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.appendproc",
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in jobs
    ]
    try:
        async with asyncio.timeout(120):
            for proc, job in zip(procs, jobs, strict=True):
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(msgspec.json.encode(job) + b"\n")
                await proc.stdin.drain()
                assert await proc.stdout.readline() == b"ready\n"
            for proc in procs:  # all at once
                assert proc.stdin is not None
                proc.stdin.write(b"go\n")
                await proc.stdin.drain()
            outs = [await proc.communicate() for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    return [msgspec.json.decode(out, type=appendproc.Report) for out, _ in outs]


async def test_two_processes_sharing_sessions_never_deadlock(killable: KillableStack) -> None:
    """Two brokers in separate processes append to runs of the same sessions:
    one to runs of two sessions A < B, the other to runs of twelve, A and B
    among them. On a sessions table of about a thousand rows PostgreSQL
    updates two sessions through the index in array order (A, B), but twelve
    by a scan in physical order, and here B's row lies pages before A's: with
    the lock order left to the plan, the two lock A and B in opposite orders
    and deadlock. Session rows are locked in one order whatever the plan, so
    no transaction deadlocks; runs and sessions stay contiguous.

    A database of its own, so the table's size (hence the plans) is known."""
    async with (
        fresh_database(killable, "locks") as database_url,
        _broker(dataclasses.replace(make_settings(killable), database_url=database_url)) as b,
    ):
        store = b.store
        n_shared, filler_per_gap, per_run = 12, 200, 800
        filler = (
            "INSERT INTO sessions (session_id) SELECT 'filler_' || md5(random()::text)"
            " FROM generate_series(1, $1)"
        )
        # The shared sessions a few pages apart among filler rows; then every
        # other filler row goes, so each page has room and a session's
        # updates stay on its page (HOT): its physical place holds.
        shared: list[str] = []
        for _ in range(n_shared):
            await store.pool.execute(filler, filler_per_gap)
            shared.append(await store.create_session("alice"))
        await store.pool.execute(filler, filler_per_gap)
        await store.pool.execute(
            "DELETE FROM sessions WHERE session_id LIKE 'filler_%'"
            " AND (ctid::text::point)[1]::int % 2 = 0"
        )
        await store.pool.execute("VACUUM ANALYZE sessions")
        rows = await store.pool.fetch(
            "SELECT session_id, (ctid::text::point)[0] FROM sessions"
            " WHERE session_id = ANY($1::text[]) ORDER BY ctid",
            shared,
        )
        physical: list[tuple[str, float]] = [(r[0], r[1]) for r in rows]
        # A < B with B's row first, the pair farthest apart: the scan spends
        # longest between them.
        gaps = [
            (page_a - page_b, (sid_a, sid_b))
            for i, (sid_b, page_b) in enumerate(physical)
            for sid_a, page_a in physical[i + 1 :]
            if sid_a < sid_b and page_a > page_b + 1
        ]
        assert gaps, physical  # twelve random ids in physical order: 1 in 12!
        a, b_ = max(gaps)[1]
        per_process = [[a, b_, a, b_], shared]
        jobs = [
            appendproc.Job(
                nats_url=killable.nats.url,
                database_url=database_url,
                run_ids=[await store.create_run(sid, "alice") for sid in sids],
                events_per_run=per_run,
                seed=p,
            )
            for p, sids in enumerate(per_process)
        ]
        reports = await _run_appenders(jobs)
        assert [r.deadlocks for r in reports] == [0, 0]
        assert [(r.flush_errors, r.fenced) for r in reports] == [(0, 0), (0, 0)]
        for job, report in zip(jobs, reports, strict=True):
            assert report.committed == {r: per_run for r in job.run_ids}
            for run_id in job.run_ids:
                page = await store.run_page(run_id, 0, per_run + 1)
                assert [e.seq for e in page] == list(range(1, per_run + 1))
        for sid in shared:
            n = sum(sids.count(sid) for sids in per_process) * per_run
            page = await store.session_page(sid, 0, n + 1)
            assert [e.cursor for e in page] == list(range(1, n + 1))
            assert await store.session_head(sid) == n


@asynccontextmanager
async def _stalled_subscriber(
    settings: Settings, live_buffer_max: int, rounds: int, per_round: int
) -> AsyncIterator[tuple[Broker, Subscription]]:
    """A subscription (with `live_buffer_max`) that has read seq 1, then
    reads nothing while `rounds` batches of `per_round` events are committed
    and offered to it; yields once every one of them reached its live queue."""
    b = await Broker.connect(
        dataclasses.replace(settings, live_buffer_max=live_buffer_max),
        registry=CollectorRegistry(), name="test-stalled",
    )  # fmt: skip
    witness: asyncio.Event = asyncio.Event()
    marker = await b.bus.nc.subscribe(f"test.marker.{secrets.token_hex(4)}", cb=_set(witness))
    sub = None
    try:
        _, run_id = await new_run(b.store)
        w = await b.claim(run_id, "w")
        sub = await b.subscribe(run_id=run_id, after=0)
        await w.append(text(0))
        await w.flush()
        assert [e.seq for e in await collect(sub, 1)] == [1]
        for r in range(rounds):
            for i in range(per_round):
                await w.append(text(1 + r * per_round + i))
            await w.flush()

        async def all_published() -> bool:
            return sample(b.metrics, "runlog_publish_messages_total") == 1 + rounds

        await wait_until(all_published)
        # Published after the batches on the same connection, so delivered
        # after them: once it is here, every batch was offered to the queue.
        await b.bus.nc.publish(marker.subject, b"")
        await asyncio.wait_for(witness.wait(), 10)
        yield b, sub
    finally:
        if sub is not None:
            await sub.close()
        await marker.unsubscribe()
        await b.close()


def _set(event: asyncio.Event) -> Callable[[Msg], Awaitable[None]]:
    async def cb(_: Msg) -> None:
        event.set()

    return cb


async def test_slow_subscriber_overflows_its_live_queue_and_refills_from_postgres(
    settings: Settings,
) -> None:
    """A subscription whose consumer does not read while a writer appends
    fast: its live queue (live_buffer_max 16 events: three batches of 5)
    overflows and the later batches are dropped. Reading again, the consumer
    gets every event once, in order: the quiet live feed leads to a position
    check, which fills the hole from PostgreSQL as an overflow."""
    async with _stalled_subscriber(settings, 16, rounds=30, per_round=5) as (b, sub):
        got = await collect(sub, 150)
        assert_contiguous(got, first=2)
        assert len(got) == 150
        fills = {
            r: sample(b.metrics, "runlog_subscribe_gap_fills_total", reason=r) for r in GAP_REASONS
        }
        assert fills == {"gap": 0, "position_check": 0, "overflow": 1}


async def test_live_buffer_max_counts_events(settings: Settings) -> None:
    """`live_buffer_max` bounds the live *events* a subscription holds unread,
    as documented: with 10 and batches of 4, two batches wait (8 events), the
    third would make 12 and is dropped; the rest comes from PostgreSQL."""
    async with _stalled_subscriber(settings, 10, rounds=5, per_round=4) as (_, sub):
        live: list[int] = []
        while True:
            batch = await asyncio.wait_for(sub.__anext__(), 10)
            if not sub.committed_ms:  # read from PostgreSQL: the live buffer is spent
                assert [e.seq for e in batch] == list(range(len(live) + 2, 22))
                break
            live += [e.seq for e in batch]
        assert live == list(range(2, 10))  # two batches of 4 were held
