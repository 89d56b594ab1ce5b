"""The catch-up replay's read path (gateway/hub.py `Member._turn`,
gateway/replay_page.py): frames built from the page rows, the next page read
ahead of its turn. What it must keep: every event after the cursor once, in
order, across page and run boundaries and the handover to live; and a
client that does not read holds no page and a bounded queue."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import aiohttp
import asyncpg
import pytest

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from broker.store import StoredEvent
from gateway.context import GATEWAY
from gateway.frames import sse_frame
from gateway.replay_page import chunk_len, sse_text

from .gw import (
    WsClient,
    append_text,
    eventually,
    read_sse,
    running_gateway,
    session_with,
    write_run,
    ws_connect,
)
from .helpers import KillableStack, make_settings
from .rawclient import RawSse, RawWs

_BIG = "x" * 2000


def test_chunk_len_is_at_most_max_bytes_of_payload_and_at_least_one() -> None:
    p = [b"a" * 10] * 5
    assert chunk_len(p, 50) == 5
    assert chunk_len(p, 49) == 4
    assert chunk_len(p, 20) == 2
    assert chunk_len(p, 3) == 1  # one event larger than the mark still goes
    assert chunk_len([b"a" * 100, b"b"], 50) == 1


def test_sse_text_is_the_frames_of_each_event() -> None:
    payloads = [b'{"a":1}', b'{"b":2}', b'{"c":3}']
    assert sse_text(99, payloads) == b"".join(sse_frame(99 + i, p) for i, p in enumerate(payloads))


@pytest.mark.parametrize("mode", ["ws_batch", "ws", "sse"])
async def test_a_session_catch_up_across_pages_and_runs_gets_every_event_once_then_live(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker, mode: str
) -> None:
    """Pages of 7 events cut runs in the middle and end on run boundaries;
    a fourth run streams while the client replays the first three and goes
    live: the client gets cursors 1..N once each, in order, and each run's
    seqs 1..n in order."""
    async with running_gateway(settings, page_max_events=7) as g:
        sid = await session_with(http, g, "alice")
        for _ in range(3):
            await write_run(broker, sid, 30)  # 31 events each: pages cut them at 7
        live, w = await write_run(broker, sid, 5, end=False)
        appended = 120

        async def stream() -> None:
            await append_text(w, appended, pause_every=5, pause_s=0.005)
            await w.append(events.RunEnd(status="completed"))
            await w.flush()

        total = 3 * 31 + 5 + appended + 1
        writer = asyncio.create_task(stream())
        try:
            got = await _read_session(http, g.url, g.headers("alice"), sid, mode, total)
        finally:
            await writer
        assert [c for c, _ in got] == list(range(1, total + 1))
        by_run: dict[str, list[int]] = {}
        for _, e in got:
            by_run.setdefault(e["run_id"], []).append(e["seq"])
        assert sorted(map(len, by_run.values())) == [31, 31, 31, 5 + appended + 1]
        for seqs in by_run.values():
            assert seqs == list(range(1, len(seqs) + 1))
        assert by_run[live][-1] == 5 + appended + 1


async def _read_session(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], sid: str, mode: str,
    total: int,
) -> list[tuple[int, dict[str, Any]]]:  # fmt: skip
    if mode == "sse":
        async with http.get(f"{url}/v1/sessions/{sid}/events",
                            headers={**headers, "Accept": "text/event-stream"}) as r:  # fmt: skip
            assert r.status == 200
            return await read_sse(r, until_type=None, count=total)
    ws_url = url.replace("http://", "ws://") + "/v1/ws"
    async with http.ws_connect(ws_url, headers=headers) as ws:
        c = WsClient(ws)
        assert (await c.next_reply())["type"] == "hello"
        await c.send(type="subscribe", session_id=sid, after=0, batch=mode == "ws_batch")
        assert (await c.next_reply())["type"] == "subscribed"
        return await c.collect(f"session:{sid}", until_type="", count=total)


def _rows_alive() -> int:
    gc.collect()
    return sum(isinstance(o, StoredEvent | asyncpg.Record) for o in gc.get_objects())


@pytest.mark.parametrize("how", ["ws_batch", "ws", "sse"])
async def test_a_replay_to_a_client_that_does_not_read_holds_no_page_and_a_bounded_queue(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker, how: str
) -> None:
    """A 4 MB run replayed to a client that reads nothing: the replay stops
    once the queue passes the lag mark, and then holds no replay turn, no
    page (not even one read ahead) and at most one chunk past the mark."""
    lag = 16 * 1024
    # Pages of 4 events (8 KB) are pushed whole: each turn may read the next ahead.
    async with running_gateway(settings, send_queue_lag_bytes=lag, page_max_events=4) as g:
        sid = await session_with(http, g, "alice")
        big, w = await write_run(broker, sid, 0, end=False)
        for i in range(2000):  # 4 MB: more than the sockets on the way can hold
            await w.append(events.TextDelta(message_id=f"m{i}", delta=_BIG))
        await w.flush()
        stalled: RawWs | RawSse
        if how == "sse":
            stalled = await RawSse.connect(g.port, f"/v1/runs/{big}/events", g.token("alice"))
        else:
            stalled, _ = await RawWs.connect(g.port, g.token("alice"))
            assert (await stalled.message())["type"] == "hello"
            await stalled.send(type="subscribe", run_id=big, after=0, batch=how == "ws_batch")
            assert (await stalled.message())["type"] == "subscribed"
        try:
            await eventually(
                lambda: (
                    (g.sample("runlog_gateway_send_queue_bytes") or 0) > lag
                    and g.sample("runlog_gateway_replays_running") == 0
                ),
                10,
                "the replay paused: its queue past the lag mark, no replay turn held",
            )
            queued = g.sample("runlog_gateway_send_queue_bytes") or 0
            # The mark, plus one chunk (at most the mark of payload) and its framing.
            assert queued <= 2 * lag + 4096, queued
            assert _rows_alive() == 0
            kind = "sse" if how == "sse" else "ws"
            assert g.sample("runlog_gateway_connections", {"kind": kind}) == 1  # not cut: paused
        finally:
            await stalled.close()
        await w.append(events.RunEnd(status="completed"))
        await w.flush()


def _frames_of(msgs: list[dict[str, Any]]) -> list[int]:
    return [len(m["events"]) if m["type"] == "events" else 1 for m in msgs]


async def test_a_batch_replay_sends_a_page_per_frame(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """A batch client replaying a run gets it a page (page_max_events) per
    frame, cursors first..last, the last frame up to run_end."""
    async with running_gateway(settings, page_max_events=10) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 34)  # 35 events
        async with ws_connect(http, g, "alice") as c:
            await c.send(type="subscribe", run_id=run_id, after=0, batch=True)
            assert (await c.next_reply())["type"] == "subscribed"
            msgs: list[dict[str, Any]] = []
            async with asyncio.timeout(20):
                while sum(_frames_of(msgs)) < 35:
                    m = json.loads((await c.ws.receive()).data)
                    if m["type"] in ("event", "events"):
                        msgs.append(m)
        assert _frames_of(msgs) == [10, 10, 10, 5]
        assert [m["cursor"] for m in msgs] == [1, 11, 21, 31]
        assert msgs[-1]["events"][-1]["type"] == "run_end"


async def test_a_storage_outage_during_a_replay_reading_ahead_frees_every_replay_slot(
    killable: KillableStack, http: aiohttp.ClientSession
) -> None:
    """PostgreSQL dies while a client that keeps up replays a long run in
    pages of 10 (so a read ahead is nearly always in flight): the client
    gets storage_unavailable, and every replay slot comes back (none lost,
    none released twice)."""
    s = make_settings(killable, db_retry_s=1.0, page_max_events=10)
    b = await Broker.connect(make_settings(killable, db_retry_s=60.0), name="test-outage-writer")
    try:
        async with running_gateway(s) as g:
            sid = await session_with(http, g, "alice")
            run_id, _ = await write_run(b, sid, 20_000, end=False)
            c, _ = await RawWs.connect(g.port, g.token("alice"), rcvbuf=1 << 20)
            try:
                assert (await c.message())["type"] == "hello"
                await c.send(type="subscribe", run_id=run_id, after=0, batch=True)
                assert (await c.message())["type"] == "subscribed"
                assert (await c.message())["type"] == "events"  # the replay is under way
                killable.pg.kill()
                msgs, close_code = await asyncio.wait_for(c.read_to_end(), 30)
                assert msgs[-1]["type"] == "disconnect"
                assert msgs[-1]["code"] == "storage_unavailable"
                assert close_code == 4002
                await eventually(
                    lambda: g.sample("runlog_gateway_connections", {"kind": "ws"}) == 0, 10
                )
                assert g.sample("runlog_gateway_replays_running") == 0
                assert g.app[GATEWAY].hub.replay_slots.running == 0
            finally:
                await c.close()
                await killable.pg.wait_stopped()
                await killable.pg.restart()
    finally:
        await b.close()
