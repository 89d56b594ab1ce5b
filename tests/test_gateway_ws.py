"""WebSocket: resume across gateways, fan-out, slow clients, bad input, races."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from broker import approvals, events, ids
from broker.runtime import Broker
from broker.settings import Settings
from workers.binding import call_digest

from .gw import RunningGateway, append_text, running_gateway, session_with, write_run, ws_connect


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


@pytest_asyncio.fixture(loop_scope="session")
async def gw2(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


def seqs(got: list[tuple[int, dict]]) -> list[int]:
    assert all(c == e["seq"] for c, e in got)  # a run topic's cursor is the seq
    return [c for c, _ in got]


async def test_subscribe_replay_then_live(gw: RunningGateway, http: aiohttp.ClientSession,
                                          broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice")
    run_id, w = await write_run(broker, sid, 30, end=False)
    async with ws_connect(http, gw, "alice") as c:
        await c.send(type="subscribe", ref="s1", run_id=run_id, after=10)
        reply = await c.next_reply()
        assert reply == {"type": "subscribed", "ref": "s1", "topic": f"run:{run_id}",
                         "cursor": 10, "head": 30}  # fmt: skip
        await append_text(w, 20)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        got = await c.collect(f"run:{run_id}")
    assert seqs(got) == list(range(11, 52))


async def test_switching_gateways_mid_run_no_gap_no_duplicate(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice")
    run_id, w = await write_run(broker, sid, 0, end=False)
    topic = f"run:{run_id}"
    writer = asyncio.create_task(append_text(w, 2000, pause_every=50, pause_s=0.005))
    received: list[tuple[int, dict]] = []
    async with ws_connect(http, gw, "alice") as c:
        await c.send(type="subscribe", run_id=run_id, after=0, batch=True)
        await c.next_reply()
        received += await c.collect(topic, count=300, until_type="-")
    cursor = received[-1][0]
    async with ws_connect(http, gw2, "alice") as c2:
        await c2.send(type="subscribe", run_id=run_id, after=cursor)
        await c2.next_reply()
        await writer
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        received += await c2.collect(topic)
    assert seqs(received) == list(range(1, 2002))


async def test_two_hundred_subscribers_get_identical_sequences(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    # Four users: 200 connections of one are past max_connections_per_user.
    users = ["alice", "bob", "carol", "dave"]
    sid = await session_with(http, gw, "alice", bob="viewer", carol="viewer", dave="viewer")
    run_id, w = await write_run(broker, sid, 50, end=False)
    topic = f"run:{run_id}"
    async with aiohttp.ClientSession() as h2:
        clients = []
        for i in range(200):
            ctx = ws_connect(h2 if i % 2 else http, gw, users[i % 4])
            c = await ctx.__aenter__()
            clients.append((ctx, c))
            await c.send(type="subscribe", run_id=run_id, after=i % 40, batch=bool(i % 3 == 0))
        for _, c in clients:
            assert (await c.next_reply())["type"] == "subscribed"
        await append_text(w, 500, pause_every=100, pause_s=0.01)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        results = await asyncio.gather(*(c.collect(topic) for _, c in clients))
        for ctx, _ in clients:
            await ctx.__aexit__(None, None, None)
    for i, got in enumerate(results):
        assert seqs(got) == list(range(i % 40 + 1, 552)), i
        assert [e for _, e in got] == [e for _, e in results[0][-len(got) :]]


async def test_bad_messages_get_codes_and_the_server_stays_up(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", vic="viewer")
    run_id, _ = await write_run(broker, sid, 3)
    async with ws_connect(http, gw, "alice") as c:
        cases = [
            ("{", "invalid_message"),
            ('{"type":"fly"}', "unknown_message_type"),
            ('{"type":"subscribe","run_id":5}', "invalid_message"),
            ('{"type":"subscribe","run_id":"r","session_id":"s"}', "invalid_message"),
            ('{"type":"subscribe","run_id":"x","bogus":1}', "invalid_message"),
            ('{"type":"ping","ref":"' + "r" * 100 + '"}', "invalid_message"),
            ('"just a string"', "unknown_message_type"),
            ('{"type":"decide","approval_id":"a","decision":"maybe"}', "invalid_message"),
            ('{"type":"ping","pad":"' + "x" * 70000 + '"}', "message_too_large"),
            (json.dumps({"type": "subscribe", "run_id": run_id, "after": 99}), "invalid_cursor"),
        ]
        for raw, code in cases:
            await c.ws.send_str(raw)
            reply = await c.next_reply()
            assert reply["type"] == "error" and reply["code"] == code, (raw[:50], reply)
        await c.ws.send_bytes(b"\x00\x01")
        assert (await c.next_reply())["code"] == "invalid_message"
        await c.send(type="subscribe", ref="dup", run_id=run_id, after=0)
        assert (await c.next_reply())["type"] == "subscribed"
        await c.send(type="subscribe", ref="dup2", run_id=run_id, after=0)
        assert (await c.next_reply()) | {"message": ""} == {
            "type": "error",
            "ref": "dup2",
            "code": "conflict",
            "message": "",
            "retryable": False,
        }
        await c.send(type="ping", ref="p")
        assert (await c.next_reply())["type"] == "pong"
    async with ws_connect(http, gw, "vic") as v:
        await v.send(type="interrupt", ref="i", run_id=run_id)
        # The role is checked first: a viewer learns nothing about the run's state.
        assert (await v.next_reply())["code"] == "forbidden"


@hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.one_of(
    st.text(max_size=300),
    st.builds(json.dumps, st.dictionaries(
        st.sampled_from(["type", "ref", "run_id", "session_id", "after", "token", "decision", "x"]),
        st.one_of(st.none(), st.integers(-5, 10**20), st.text(max_size=30), st.booleans(),
                  st.sampled_from(["subscribe", "ping", "auth", "decide", "interrupt"])),
    )),
))  # fmt: skip
async def test_fuzzed_messages_never_break_the_connection(
    gw: RunningGateway, http: aiohttp.ClientSession, data: str
) -> None:
    async with http.ws_connect(gw.ws_url, headers=gw.headers("fuzzer")) as ws:
        hello = json.loads((await ws.receive(timeout=5)).data)
        assert hello["type"] == "hello"
        await ws.send_str(data)
        await ws.send_str('{"type":"ping","ref":"after"}')
        async with asyncio.timeout(10):
            while True:
                m = json.loads((await ws.receive()).data)
                if m["type"] == "error":
                    assert m["code"] and "Traceback" not in m.get("message", "")
                if m.get("ref") == "after" and m["type"] == "pong":
                    break


async def test_origin_is_checked(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        async with http.ws_connect(
            gw.ws_url, headers={**gw.headers("a"), "Origin": "https://evil.example"}
        ):
            pass
    assert info.value.status == 403
    async with http.ws_connect(gw.ws_url, headers={**gw.headers("a"), "Origin": gw.url}) as ws:
        assert json.loads((await ws.receive()).data)["type"] == "hello"


async def test_auth_by_subprotocol_and_first_message(gw: RunningGateway,
                                                     http: aiohttp.ClientSession) -> None:  # fmt: skip
    async with http.ws_connect(
        gw.ws_url, protocols=("runlog.v1", "bearer." + gw.token("ann"))
    ) as ws:
        assert ws.protocol == "runlog.v1"
        assert json.loads((await ws.receive()).data)["user"] == "ann"
    async with http.ws_connect(gw.ws_url) as ws:
        assert json.loads((await ws.receive()).data)["user"] is None
        await ws.send_str(json.dumps({"type": "subscribe", "ref": "a", "session_id": "s_x"}))
        assert json.loads((await ws.receive()).data)["code"] == "unauthorized"
        await ws.send_str(json.dumps({"type": "auth", "token": "bogus"}))
        assert json.loads((await ws.receive()).data)["code"] == "unauthorized"
        await ws.send_str(json.dumps({"type": "auth", "ref": "b", "token": gw.token("ann")}))
        assert json.loads((await ws.receive()).data) == {"type": "authenticated", "ref": "b",
                                                        "user": "ann"}  # fmt: skip
    with pytest.raises(aiohttp.WSServerHandshakeError) as info:
        async with http.ws_connect(gw.ws_url, headers={"Authorization": "Bearer forged"}):
            pass
    assert info.value.status == 401


async def test_unauthenticated_connection_times_out(settings: Settings,
                                                    http: aiohttp.ClientSession) -> None:  # fmt: skip
    async with (
        running_gateway(settings, ws_auth_timeout_s=0.3) as g,
        http.ws_connect(g.ws_url) as ws,
    ):
        await ws.receive()  # hello
        m = json.loads((await ws.receive(timeout=5)).data)
        assert (
            m["type"] == "disconnect" and m["code"] == "auth_timeout" and m["reconnect"] == "reauth"
        )
        close = await ws.receive(timeout=5)
        assert close.type == aiohttp.WSMsgType.CLOSE and close.data == 4408


async def test_concurrent_decisions_from_two_gateways_one_wins(
    gw: RunningGateway, gw2: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", ann="approver", ben="approver")
    run_id = await broker.store.create_run(sid, "alice")
    import time

    for _ in range(5):
        aid = ids.approval_id()
        # The run was never claimed (no worker here): its epoch is 0.
        await approvals.create(broker.store, approval_id=aid, run_id=run_id, epoch=0,
                               tool_call_id="c", summary="s",
                               expires_at_ms=int(time.time() * 1000) + 60000)  # fmt: skip
        async with ws_connect(http, gw, "ann") as a, ws_connect(http, gw2, "ben") as b:
            await asyncio.gather(
                a.send(type="decide", ref="a", approval_id=aid, decision="approve"),
                b.send(type="decide", ref="b", approval_id=aid, decision="reject"),
                a.send(type="decide", ref="a2", approval_id=aid, decision="approve"),
            )
            replies = [await a.next_reply(), await b.next_reply(), await a.next_reply()]
        created = [r for r in replies if r["type"] == "ack" and r["result"]["created"]]
        assert len(created) == 1
        winner = created[0]["result"]["approval"]["decision"]
        for r in replies:
            if r["type"] == "error":
                assert r["code"] == "approval_conflict"
            else:
                assert r["result"]["approval"]["decision"] == winner
        stored = await approvals.get(broker.store, aid)
        assert stored.decision == winner


async def test_a_websocket_decision_for_a_changed_call_is_stale(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", ann="approver")
    run_id = await broker.store.create_run(sid, "alice")
    aid, shown = ids.approval_id(), call_digest("send_email", '{"to": "a@example.com"}')
    await approvals.create(broker.store, approval_id=aid, run_id=run_id, epoch=0,
                           tool_call_id="c", summary="s", call_digest=shown,
                           expires_at_ms=int(time.time() * 1000) + 60000)  # fmt: skip
    async with ws_connect(http, gw, "ann") as a:
        await a.send(type="decide", ref="1", approval_id=aid, decision="approve",
                     call_digest=call_digest("send_email", '{"to": "b@example.com"}'))  # fmt: skip
        r = await a.next_reply()
        assert (r["type"], r["code"]) == ("error", "approval_stale")
        await a.send(type="decide", ref="2", approval_id=aid, decision="approve",
                     call_digest=shown)  # fmt: skip
        r = await a.next_reply()
        assert r["type"] == "ack" and r["result"]["created"] is True


async def test_session_streams_skip_pruned_holes_with_real_cursors(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """Pruning a finished run leaves a hole in its session's cursors: streams
    must carry the real cursors and lose nothing around the hole."""
    sid = await session_with(http, gw, "alice")
    r1, _ = await write_run(broker, sid, 5)  # cursors 1-6
    r2, _ = await write_run(broker, sid, 5)  # 7-12, pruned below
    r3, _ = await write_run(broker, sid, 10)  # 13-23
    async with broker.store.pool.acquire() as conn:
        await conn.execute("DELETE FROM events WHERE run_id = $1", r2)
    expected = list(range(1, 7)) + list(range(13, 24))
    async with ws_connect(http, gw, "alice") as c:
        for batch_mode in (False, True):
            topic = f"session:{sid}"
            c.events.pop(topic, None)
            await c.send(type="subscribe", session_id=sid, after=0, batch=batch_mode)
            await c.next_reply()
            got = await c.collect(topic, count=len(expected), until_type="-")
            assert [cur for cur, _ in got] == expected
            assert [cur for cur, e in got if e["run_id"] == r3] == list(range(13, 24))
            await c.send(type="unsubscribe", session_id=sid)
            await c.next_reply()
        c.events.pop(f"session:{sid}", None)
        await c.send(type="subscribe", session_id=sid, after=6)
        await c.next_reply()
        got = await c.collect(f"session:{sid}", count=11, until_type="-")
        assert [cur for cur, _ in got] == list(range(13, 24))
        assert [e["seq"] for _, e in got] == list(range(1, 12))  # all of run 3
    assert r1 != r3


async def test_a_refused_subscription_leaves_no_topic_behind(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    from gateway.context import GATEWAY

    sid = await session_with(http, gw, "alice")
    hub = gw.app[GATEWAY].hub
    async with ws_connect(http, gw, "alice") as c:
        for _ in range(3):
            await c.send(type="subscribe", session_id=sid, after=99)
            assert (await c.next_reply())["code"] == "invalid_cursor"
    assert f"session:{sid}" not in hub._topics
