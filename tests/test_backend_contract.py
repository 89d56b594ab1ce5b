"""One contract, two backends each: the same test body reads PostgreSQL
(`store.Store`, written by the real appender) and `MemoryLog`, and follows
NATS (`bus.Bus`) and `MemoryBus`, so the memory backends the server-free
tests use (test_merge.py, test_hub_memory.py) answer as the servers do
(broker/backend.py's LogStore and LiveBus contracts). What retention deletes
is tested on PostgreSQL in test_prune.py; MemoryLog's prune against the
same rules here.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

import msgspec
import pytest

from broker import constants as C
from broker import errors, events
from broker.backend import LiveBus, LogStore
from broker.backend_memory import MemoryBus, MemoryLog
from broker.bus import LiveBatch, encode_batch
from broker.rows import StoredEvent
from broker.runtime import Broker

# (session_id, run_id) of a new run in a new session, or in `session_id`.
NewRun = Callable[[str | None], Awaitable[tuple[str, str]]]
# Commit events to a run, in one go.
Append = Callable[[str, list[events.Event]], Awaitable[None]]


def _texts(n: int, tag: str) -> list[events.Event]:
    return [events.TextDelta(message_id="m", delta=f"{tag}{i}") for i in range(n)]


async def _the_contract(store: LogStore, new_run: NewRun, append: Append) -> None:
    sid, a = await new_run(None)
    _, b = await new_run(sid)
    assert await store.stream_head(True, a, retry_s=1) == (0, False)
    assert await store.stream_head(False, sid, retry_s=1) == (0, False)
    assert await store.stream_page(True, a, 0, 10, retry_s=1) == []

    await append(a, [events.RunStart(), *_texts(4, "a")])  # seq 1-5, cursors 1-5
    await append(b, [events.RunStart(), *_texts(2, "b")])  # seq 1-3, cursors 6-8
    await append(a, [*_texts(2, "a"), events.RunEnd(status="completed")])  # 6-8, 9-11

    page = await store.stream_page(True, a, 0, 100, retry_s=1)
    assert [e.seq for e in page] == list(range(1, 9))
    assert [e.cursor for e in page] == [1, 2, 3, 4, 5, 9, 10, 11]
    assert {e.run_id for e in page} == {a}
    assert [e.type for e in page] == ["run_start"] + ["text_delta"] * 6 + ["run_end"]
    decoded = [msgspec.json.decode(e.payload) for e in page]
    assert [d["seq"] for d in decoded] == list(range(1, 9))
    assert [d.get("delta") for d in decoded[1:7]] == ["a0", "a1", "a2", "a3", "a0", "a1"]

    # A page is strictly after its position, at most `limit` long.
    assert [e.seq for e in await store.stream_page(True, a, 3, 2, retry_s=1)] == [4, 5]
    assert await store.stream_page(True, a, 8, 10, retry_s=1) == []
    # Rows hold StoredEvent's fields in its order.
    rows = await store.stream_rows(True, a, 0, 100, retry_s=1)
    assert [StoredEvent(*r) for r in rows] == page

    session = await store.stream_page(False, sid, 0, 100, retry_s=1)
    assert [e.cursor for e in session] == list(range(1, 12))
    assert [(e.run_id, e.seq) for e in session] == (
        [(a, i) for i in range(1, 6)] + [(b, i) for i in range(1, 4)] + [(a, i) for i in (6, 7, 8)]
    )
    assert [e.cursor for e in await store.stream_page(False, sid, 7, 3, retry_s=1)] == [8, 9, 10]

    assert await store.stream_head(True, a, retry_s=1) == (8, True)  # ended: run_end committed
    assert await store.stream_head(True, b, retry_s=1) == (3, False)
    assert await store.stream_head(False, sid, retry_s=1) == (11, False)  # sessions never end

    with pytest.raises(errors.RunNotFound):
        await store.stream_head(True, "r_unknown", retry_s=1)
    with pytest.raises(errors.SessionNotFound):
        await store.stream_head(False, "s_unknown", retry_s=1)
    assert await store.stream_page(True, "r_unknown", 0, 10, retry_s=1) == []


async def test_postgresql_keeps_the_log_store_contract(broker: Broker) -> None:
    async def new_run(session_id: str | None) -> tuple[str, str]:
        sid = session_id or await broker.store.create_session("alice")
        return sid, await broker.store.create_run(sid, "alice")

    async def append(run_id: str, evs: list[events.Event]) -> None:
        w = await broker.claim(run_id, "contract-test")  # fences the last claim: one writer
        for ev in evs:
            await w.append(ev)
        await w.flush()

    await _the_contract(broker.store, new_run, append)


async def test_the_memory_log_keeps_the_log_store_contract() -> None:
    log = MemoryLog()
    n = 0

    async def new_run(session_id: str | None) -> tuple[str, str]:
        nonlocal n
        n += 1
        sid = session_id or f"s{n}"
        log.create_run(f"r{n}", sid)
        return sid, f"r{n}"

    async def append(run_id: str, evs: list[events.Event]) -> None:
        log.append(run_id, *evs)

    await _the_contract(log, new_run, append)


async def test_the_memory_log_commits_all_or_nothing_and_prunes_like_retention() -> None:
    log = MemoryLog()
    log.create_run("r1", "s")
    log.create_run("r2", "s")
    log.append("r1", events.RunStart())
    with pytest.raises(errors.RunEnded):  # nothing follows run_end, even in one append
        log.append("r1", events.RunEnd(status="completed"), events.Status(code="late"))
    assert await log.stream_head(True, "r1") == (1, False)  # and nothing of it was kept
    log.append("r1", events.RunEnd(status="completed"))
    with pytest.raises(errors.RunEnded):
        log.append("r1", events.Status(code="late"))
    log.append("r2", events.RunStart())
    with pytest.raises(ValueError):
        log.prune("r2")  # not ended: retention never deletes it
    assert log.prune("r1") == 2
    # The run is gone whole; its session keeps the hole of its cursors.
    with pytest.raises(errors.RunNotFound):
        await log.stream_head(True, "r1")
    assert [e.cursor for e in await log.stream_page(False, "s", 0, 10)] == [3]
    assert await log.stream_head(False, "s") == (3, False)
    log.unavailable = True
    with pytest.raises(errors.StorageError):
        await log.stream_page(False, "s", 0, 10)


async def _the_live_contract(bus: LiveBus, run_id: str, other_run: str, session_id: str) -> None:
    log = MemoryLog()  # builds the batches as the appender would
    log.create_run(run_id, session_id)
    log.create_run(other_run, session_id)
    by_run: list[LiveBatch] = []
    by_session: list[LiveBatch] = []
    sub_run = await bus.subscribe_live(C.run_events_filter(run_id), by_run.append)
    sub_session = await bus.subscribe_live(C.session_events_filter(session_id), by_session.append)
    sent = [
        log.append(run_id, events.RunStart()),
        log.append(other_run, events.RunStart()),
        log.append(run_id, *_texts(3, "a"), events.RunEnd(status="completed")),
    ]
    acks = []
    for b in sent:
        subject = C.events_subject(b.session_id, b.run_id)
        acks.append(await bus.publish_live(subject, encode_batch(b), f"{b.run_id}:{b.seq}"))
    assert all(isinstance(seq, int) for seq in await asyncio.wait_for(asyncio.gather(*acks), 5))
    async with asyncio.timeout(5):
        while len(by_run) < 2 or len(by_session) < 3:
            await asyncio.sleep(0.005)
    # In publish order (one publisher), each subscription its own filter's.
    assert [(b.run_id, b.seq, b.cursor) for b in by_run] == [(run_id, 1, 1), (run_id, 2, 3)]
    assert [(b.run_id, b.seq) for b in by_session] == [(run_id, 1), (other_run, 1), (run_id, 2)]
    got = by_run[1]
    assert (got.types, got.ended) == (["text_delta"] * 3 + ["run_end"], True)
    assert [bytes(e) for e in got.events] == [bytes(e) for e in sent[2].events]
    await sub_run.unsubscribe()
    await sub_session.unsubscribe()
    b = log.append(other_run, events.Status(code="after"))
    subject = C.events_subject(b.session_id, b.run_id)
    await asyncio.wait_for(await bus.publish_live(subject, encode_batch(b), "late"), 5)
    await asyncio.sleep(0.05)
    assert len(by_session) == 3  # nothing reaches a subscription once unsubscribed


async def test_nats_keeps_the_live_bus_contract(broker: Broker) -> None:
    n = secrets.token_hex(4)
    await _the_live_contract(broker.bus, f"r_{n}a", f"r_{n}b", f"s_{n}")


async def test_the_memory_bus_keeps_the_live_bus_contract() -> None:
    await _the_live_contract(MemoryBus(), "r1", "r2", "s1")
