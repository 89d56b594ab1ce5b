"""Session notices (gateway/notices.py): who watches a session, across
gateways, and runs queued behind earlier ones — delivered on the WebSocket
and the session's SSE stream, never part of the log."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from broker import control
from broker.runtime import Broker
from broker.settings import Settings
from gateway.presence import PresenceTable, watching

from .gw import RunningGateway, WsClient, running_gateway, session_with, write_run, ws_connect

_REFRESH_S = 0.3  # a quick refresh, so that a crashed gateway's viewers leave quickly


async def _subscribe(ws: WsClient, sid: str) -> None:
    await ws.send(type="subscribe", ref="s", session_id=sid)
    reply = await ws.next_reply()
    assert (reply["type"], reply["topic"]) == ("subscribed", f"session:{sid}"), reply


async def _watchers(ws: WsClient, want: list[str], timeout_s: float = 10.0) -> None:
    """Presence messages until one names exactly `want`."""
    seen = []
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                m = await ws.next_notice("presence", timeout_s=timeout_s)
                seen.append(m["users"])
                if m["users"] == want:
                    return
    except TimeoutError:
        raise AssertionError(f"no presence {want} within {timeout_s} s; saw {seen}") from None


def test_presence_table_expires_and_merges() -> None:
    t = PresenceTable()
    assert t.announce("gw2", ["bob", "carol"], ttl_s=3.0, now=10.0)
    assert not t.announce("gw2", ["carol", "bob"], ttl_s=3.0, now=11.0)  # the same set again
    assert t.announce("gw3", ["dave"], ttl_s=1.0, now=11.0)
    assert watching({"alice", "bob"}, t, now=11.5) == ["alice", "bob", "carol", "dave"]
    assert not t.expire(now=11.9)
    assert t.expire(now=12.0)  # gw3 ran out
    assert watching({"alice"}, t, now=12.0) == ["alice", "bob", "carol"]
    assert t.announce("gw2", [], ttl_s=3.0, now=12.0)  # "none left"
    assert watching({"alice"}, t, now=12.0) == ["alice"]


async def test_a_notice_right_after_subscribing_is_not_lost(
    settings: Settings, broker: Broker
) -> None:
    """Once subscribe_notices returns, the subscription is live at the server:
    an announcement another gateway sends at once reaches it (before, about 1
    in 10 was dropped, the SUB still in the client's buffer; some runs lost
    every one)."""
    other = await Broker.connect(settings, name="runlog-test-other")
    missed = []
    try:
        for i in range(100):
            sid = f"race-{i}"
            got = asyncio.Event()

            def on_notice(_n: control.SessionNotice, got: asyncio.Event = got) -> None:
                got.set()

            sub = await broker.bus.subscribe_notices(sid, on_notice)
            await other.bus.publish_notice(
                control.Presence(session_id=sid, origin="gw2", users=["bob"], ttl_s=1.0)
            )
            try:
                await asyncio.wait_for(got.wait(), 2.0)
            except TimeoutError:
                missed.append(sid)
            await sub.unsubscribe()
            if len(missed) >= 3:
                break
    finally:
        await other.close()
    assert missed == []


async def test_presence_across_two_gateways(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(settings) as g1, running_gateway(settings) as g2:
        sid = await session_with(http, g1, "alice", bob="viewer")
        async with ws_connect(http, g1, "alice") as alice:
            await _subscribe(alice, sid)
            await _watchers(alice, ["alice"])
            async with ws_connect(http, g2, "bob") as bob:
                await _subscribe(bob, sid)
                # The new gateway's hello is answered: bob sees alice at once.
                await _watchers(bob, ["alice", "bob"])
                await _watchers(alice, ["alice", "bob"])
                # Unsubscribing is leaving, as closing is.
                await bob.send(type="unsubscribe", ref="u", session_id=sid)
                assert (await bob.next_reply())["type"] == "unsubscribed"
                await _watchers(alice, ["alice"])
                await _subscribe(bob, sid)
                await _watchers(alice, ["alice", "bob"])
            await _watchers(alice, ["alice"])
        # No notice is an event: the session's log is empty.
        async with http.get(f"{g1.url}/v1/sessions/{sid}/events", headers=g1.headers("alice")) as r:
            assert (await r.json())["events"] == []


async def test_a_crashed_gateways_viewers_expire(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, presence_refresh_s=_REFRESH_S) as g1:
        sid = await session_with(http, g1, "alice", ghost="viewer")
        async with ws_connect(http, g1, "alice") as alice:
            await _subscribe(alice, sid)
            await _watchers(alice, ["alice"])
            # A gateway that announces its viewer once, then dies without a word.
            await broker.bus.publish_notice(
                control.Presence(
                    session_id=sid, origin="dead-gw", users=["ghost"], ttl_s=3 * _REFRESH_S
                )
            )
            await _watchers(alice, ["alice", "ghost"])
            # Forgotten after its ttl (and at most one refresh more).
            await _watchers(alice, ["alice"], timeout_s=4 * _REFRESH_S + 5)


async def test_presence_on_the_session_sse_stream_has_no_id(
    settings: Settings, http: aiohttp.ClientSession
) -> None:
    async with running_gateway(settings) as g1:
        sid = await session_with(http, g1, "alice")
        async with http.get(
            f"{g1.url}/v1/sessions/{sid}/events",
            headers={**g1.headers("alice"), "Accept": "text/event-stream"},
        ) as r:
            assert r.status == 200
            frame = await _sse_frame(r, "presence")
    assert "id" not in frame
    assert json.loads(frame["data"]) == {
        "type": "presence", "topic": f"session:{sid}", "users": ["alice"],
    }  # fmt: skip


async def _sse_frame(r: aiohttp.ClientResponse, event: str) -> dict[str, str]:
    buf = b""
    async with asyncio.timeout(10):
        async for chunk in r.content.iter_any():
            buf += chunk
            while b"\n\n" in buf:
                raw, buf = buf.split(b"\n\n", 1)
                fields = dict(
                    line.decode().split(": ", 1) for line in raw.split(b"\n") if b": " in line
                    and not line.startswith(b":")
                )  # fmt: skip
                if fields.get("event") == event:
                    return fields
    raise AssertionError(f"no {event} frame")


async def test_a_queued_run_is_announced_to_every_gateways_watchers(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings) as g1, running_gateway(settings) as g2:
        sid = await session_with(http, g1, "alice", bob="approver")
        # A run that has not ended (no worker here): the next one waits for it.
        await write_run(broker, sid, 1, end=False)
        async with ws_connect(http, g2, "bob") as bob:
            await _subscribe(bob, sid)
            async with http.post(f"{g1.url}/v1/sessions/{sid}/runs", json={"input": "next one"},
                                 headers=g1.headers("alice")) as r:  # fmt: skip
                assert r.status == 202
                answer = await r.json()
            assert (answer["status"], answer["ahead"]) == ("queued", 1)
            run_id = answer["run_id"]
            notice = await bob.next_notice("run_queued")
            assert notice["topic"] == f"session:{sid}"
            assert {k: v for k, v in notice["run"].items() if k != "created_at"} == {
                "run_id": run_id, "started_by": "alice", "input": "next one",
            }  # fmt: skip
            # A late joiner finds it in the session, in line, then with its stop.
            assert await _queued(http, g2, sid) == [(run_id, "alice", "next one", None)]
            async with http.post(f"{g2.url}/v1/runs/{run_id}/interrupt", json={},
                                 headers=g2.headers("bob")) as r:  # fmt: skip
                assert r.status == 202
            assert await _queued(http, g2, sid) == [(run_id, "alice", "next one", "bob")]


async def _queued(http: aiohttp.ClientSession, gw: RunningGateway, sid: str) -> list[Any]:
    async with http.get(f"{gw.url}/v1/sessions/{sid}", headers=gw.headers("bob")) as r:
        body = await r.json()
    return [
        (q["run_id"], q["started_by"], q["input"], q["stop_requested_by"]) for q in body["queued"]
    ]
