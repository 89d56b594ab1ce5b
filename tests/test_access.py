"""Revocable access (issue 10, items 3 and 4): removing a member and changing a
role, the last-owner rule under concurrency, streams ending on every gateway
when access ends (a NATS control message, and the periodic re-check that
catches a lost one), and per-user token revocation with `runlog revoke`.

Every gateway here runs in the test's process on the shared NATS and
PostgreSQL; the ones that must prove the control message did the work run
with a re-check period far longer than the test, and the backstop tests with
a short one and no message at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth
from runlog.client import Client, ClientError

from .gw import (
    RunningGateway,
    WsClient,
    append_text,
    running_gateway,
    session_with,
    write_run,
    ws_connect,
)
from .rawclient import RawSse

# Far longer than any test: what ends a stream within it is the message.
_NO_RECHECK_S = 3600.0


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings, access_recheck_s=_NO_RECHECK_S) as g:
        yield g


async def _call(http: aiohttp.ClientSession, gw: RunningGateway, method: str, path: str,
                user: str, json: Any = None) -> tuple[int, Any]:  # fmt: skip
    async with http.request(method, gw.url + path, json=json, headers=gw.headers(user)) as r:
        return r.status, await r.json()


def _fresh_user(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


def _code(body: Any) -> str | None:
    return body["error"]["code"] if isinstance(body, dict) and "error" in body else None


async def _members(http: aiohttp.ClientSession, gw: RunningGateway, sid: str,
                   user: str) -> dict[str, str]:  # fmt: skip
    status, body = await _call(http, gw, "GET", f"/v1/sessions/{sid}", user)
    assert status == 200, body
    return {m["user_id"]: m["role"] for m in body["members"]}


async def _audit(broker: Broker, sid: str) -> list[tuple[str, str, dict[str, Any]]]:
    rows = await broker.store.pool.fetch(
        "SELECT actor, action, detail::text FROM audit WHERE session_id = $1 ORDER BY audit_id",
        sid,
    )
    return [(r[0], r[1], json.loads(r[2])) for r in rows]


# -- the endpoints


async def test_remove_member_and_change_role(gw: RunningGateway, http: aiohttp.ClientSession,
                                             broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice", bob="viewer", carol="approver")
    base = f"/v1/sessions/{sid}/members"

    # Change a role: 200 with the previous one.
    assert await _call(http, gw, "PATCH", f"{base}/bob", "alice", {"role": "approver"}) == (
        200, {"session_id": sid, "user_id": "bob", "role": "approver", "previous_role": "viewer"})  # fmt: skip
    # Remove: 200 with the role it had.
    assert await _call(http, gw, "DELETE", f"{base}/carol", "alice") == (
        200, {"session_id": sid, "user_id": "carol", "role": None, "previous_role": "approver"})  # fmt: skip
    assert await _members(http, gw, sid, "alice") == {"alice": "owner", "bob": "approver"}
    status, body = await _call(http, gw, "GET", f"/v1/sessions/{sid}", "carol")
    assert (status, _code(body)) == (403, "not_a_member")

    # Not a member: 404 with a code, for both.
    status, body = await _call(http, gw, "DELETE", f"{base}/carol", "alice")
    assert (status, _code(body)) == (404, "member_not_found")
    status, body = await _call(http, gw, "PATCH", f"{base}/zed", "alice", {"role": "viewer"})
    assert (status, _code(body)) == (404, "member_not_found")
    # Owners only; a non-member learns nothing.
    status, body = await _call(http, gw, "DELETE", f"{base}/alice", "bob")
    assert (status, _code(body)) == (403, "forbidden")
    status, body = await _call(http, gw, "PATCH", f"{base}/bob", "bob", {"role": "owner"})
    assert (status, _code(body)) == (403, "forbidden")
    status, body = await _call(http, gw, "DELETE", f"{base}/bob", "mallory")
    assert (status, _code(body)) == (403, "not_a_member")
    # A bad role or body is refused before anything changes.
    status, body = await _call(http, gw, "PATCH", f"{base}/bob", "alice", {"role": "god"})
    assert (status, _code(body)) == (400, "invalid_request")
    status, body = await _call(
        http, gw, "PATCH", f"{base}/bob", "alice", {"role": "viewer", "x": 1}
    )
    assert (status, _code(body)) == (400, "invalid_request")
    assert await _members(http, gw, sid, "alice") == {"alice": "owner", "bob": "approver"}

    # Every change is audited, by whom, with the role before and after.
    assert [a for a in await _audit(broker, sid) if a[1] != "add_member"] == [
        ("alice", "set_role", {"user_id": "bob", "role": "approver", "previous_role": "viewer"}),
        ("alice", "remove_member", {"user_id": "carol", "role": None,
                                    "previous_role": "approver"}),
    ]  # fmt: skip
    # POST on an existing member changes its role, as PATCH does (and says so).
    assert await _call(http, gw, "POST", base, "alice", {"user_id": "bob", "role": "viewer"}) == (
        201, {"session_id": sid, "user_id": "bob", "role": "viewer", "previous_role": "approver"})  # fmt: skip
    assert (await _audit(broker, sid))[-1] == (
        "alice", "add_member", {"user_id": "bob", "role": "viewer", "previous_role": "approver"})  # fmt: skip


async def test_the_last_owner_cannot_be_removed_or_demoted(
    gw: RunningGateway, http: aiohttp.ClientSession
) -> None:
    sid = await session_with(http, gw, "alice", bob="approver")
    base = f"/v1/sessions/{sid}/members"
    refusals = [
        ("POST", base, {"user_id": "alice", "role": "viewer"}),  # the path that exists today
        ("DELETE", f"{base}/alice", None),
        ("PATCH", f"{base}/alice", {"role": "viewer"}),
        ("PATCH", f"{base}/alice", {"role": "approver"}),
    ]
    for method, path, body in refusals:
        status, reply = await _call(http, gw, method, path, "alice", body)
        assert (status, _code(reply)) == (409, "last_owner"), (method, reply)
        assert reply["error"]["retryable"] is False
    assert await _members(http, gw, sid, "alice") == {"alice": "owner", "bob": "approver"}
    # Owner to owner is no demotion.
    status, _ = await _call(http, gw, "PATCH", f"{base}/alice", "alice", {"role": "owner"})
    assert status == 200
    # With a second owner, the first may step down; then the second is the last.
    assert (await _call(http, gw, "PATCH", f"{base}/bob", "alice", {"role": "owner"}))[0] == 200
    assert (await _call(http, gw, "DELETE", f"{base}/alice", "alice"))[0] == 200
    status, reply = await _call(http, gw, "PATCH", f"{base}/bob", "bob", {"role": "viewer"})
    assert (status, _code(reply)) == (409, "last_owner")
    assert await _members(http, gw, sid, "bob") == {"bob": "owner"}


async def _lock_waiters(broker: Broker) -> int:
    n: int = await broker.store.pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    return n


@pytest.mark.parametrize("how", ["demote_each_other", "remove_each_other", "both_step_down"])
async def test_two_owners_at_once_leave_exactly_one(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker, how: str
) -> None:
    """Two owners' changes, one through each of two gateways, truly at once:
    the test holds the session's rows locked until both requests, past their
    role checks, wait inside their transactions, then lets them go. Whatever
    the change locks (the session row or its members'), both queue behind it."""
    if how == "both_step_down":
        pairs = [("alice", "alice"), ("bob", "bob")]
    else:
        pairs = [("alice", "bob"), ("bob", "alice")]
    method = "DELETE" if how == "remove_each_other" else "PATCH"
    body = None if method == "DELETE" else {"role": "viewer"}
    async with running_gateway(settings) as g1, running_gateway(settings) as g2:
        for _ in range(5):
            sid = await session_with(http, g1, "alice", bob="owner")
            base = f"/v1/sessions/{sid}/members"
            async with broker.store.pool.acquire() as blocker:
                hold = blocker.transaction()
                await hold.start()
                await blocker.execute("SELECT FROM sessions WHERE session_id = $1 FOR UPDATE", sid)
                await blocker.execute("SELECT FROM members WHERE session_id = $1 FOR UPDATE", sid)
                both = asyncio.gather(*(
                    _call(http, g, method, f"{base}/{target}", actor, body)
                    for g, (actor, target) in zip((g1, g2), pairs, strict=True)
                ))  # fmt: skip
                try:
                    deadline = time.monotonic() + 15
                    while await _lock_waiters(broker) < 2:
                        assert time.monotonic() < deadline, "the two changes never both waited"
                        assert not both.done(), both.result()
                        await asyncio.sleep(0.01)
                finally:
                    await hold.rollback()
                results = await both
            outcomes = sorted((status, _code(reply)) for status, reply in results)
            assert outcomes == [(200, None), (409, "last_owner")], results
            members = (await broker.store.session_info(sid)).members
            assert [role for _, role in members].count("owner") == 1, members


# -- streams end on every gateway when access ends


async def _ws_subscribed(c: WsClient, **topic: str) -> str:
    await c.send(type="subscribe", ref="s", after=0, **topic)
    reply = await c.next_reply()
    assert reply["type"] == "subscribed", reply
    topic_key: str = reply["topic"]
    return topic_key


async def _sse(g: RunningGateway, path: str, user: str, token: str | None = None) -> RawSse:
    return await RawSse.connect(g.port, path, token or g.token(user), rcvbuf=1 << 16)


async def _sse_disconnect(c: RawSse) -> dict[str, Any]:
    """The `event: disconnect` the stream ends with (the last frame)."""
    frames = await asyncio.wait_for(c.read_to_end(), 15)
    assert frames and frames[-1].get("event") == "disconnect", frames[-3:]
    data: dict[str, Any] = json.loads(frames[-1]["data"])
    return data


async def _still_open(c: WsClient) -> None:
    """The connection answers a ping, and nothing but the pong came first."""
    await c.send(type="ping", ref="p")
    reply = await c.next_reply()
    assert reply["type"] == "pong", reply


async def test_removed_member_streams_end_on_every_gateway(
    gw: RunningGateway, settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, access_recheck_s=_NO_RECHECK_S) as gb:
        sid = await session_with(http, gw, "alice", bob="viewer", carol="viewer")
        other = await session_with(http, gw, "alice", bob="viewer")
        run_id, _ = await write_run(broker, sid, 3, end=False)
        other_run, w_other = await write_run(broker, other, 2, end=False)

        async with ws_connect(http, gw, "bob") as ws_a, ws_connect(http, gb, "bob") as ws_b, \
                ws_connect(http, gb, "carol") as ws_c:  # fmt: skip
            assert await _ws_subscribed(ws_a, session_id=sid) == f"session:{sid}"
            assert await _ws_subscribed(ws_a, run_id=other_run) == f"run:{other_run}"
            assert await _ws_subscribed(ws_b, run_id=run_id) == f"run:{run_id}"
            await _ws_subscribed(ws_c, session_id=sid)
            await ws_a.collect(f"session:{sid}", count=3)
            await ws_b.collect(f"run:{run_id}", count=3)
            sse_a = await _sse(gw, f"/v1/runs/{run_id}/events", "bob")
            sse_b = await _sse(gb, f"/v1/sessions/{sid}/events", "bob")
            try:
                status, _ = await _call(http, gw, "DELETE", f"/v1/sessions/{sid}/members/bob",
                                        "alice")  # fmt: skip
                assert status == 200

                # WebSocket: that subscription ends with a coded message; the
                # socket stays, with its other topics.
                assert await ws_a.next_reply() == {
                    "type": "unsubscribed", "topic": f"session:{sid}", "code": "forbidden",
                    "message": f"your access to session {sid} changed", "cursor": 3}  # fmt: skip
                assert await ws_b.next_reply() == {
                    "type": "unsubscribed", "topic": f"run:{run_id}", "code": "forbidden",
                    "message": f"your access to session {sid} changed", "cursor": 3}  # fmt: skip
                await _still_open(ws_a)
                await append_text(w_other, 1)
                await w_other.flush()
                assert [c for c, _ in await ws_a.collect(f"run:{other_run}", count=3)] == [1, 2, 3]
                # SSE: the stream ends with `event: disconnect`, code forbidden.
                for sse in (sse_a, sse_b):
                    assert await _sse_disconnect(sse) == {
                        "type": "disconnect", "code": "forbidden", "reconnect": "stop",
                        "cursor": 3}  # fmt: skip
                # Another member of the session keeps its stream.
                await _still_open(ws_c)
                # And the removed one cannot come back.
                await ws_a.send(type="subscribe", ref="again", session_id=sid)
                reply = await ws_a.next_reply()
                assert (reply["type"], reply["code"]) == ("error", "not_a_member")
                assert gw.sample("runlog_gateway_access_ended_total",
                                 {"code": "forbidden", "via": "message"}) == 2  # fmt: skip
                assert gb.sample("runlog_gateway_access_ended_total",
                                 {"code": "forbidden", "via": "message"}) == 2  # fmt: skip
            finally:
                await sse_a.close()
                await sse_b.close()


async def test_demoted_member_streams_end_and_may_resubscribe(
    gw: RunningGateway, settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with running_gateway(settings, access_recheck_s=_NO_RECHECK_S) as gb:
        sid = await session_with(http, gw, "alice", bob="owner", carol="viewer")
        await write_run(broker, sid, 2, end=False)
        topic = f"session:{sid}"
        ended = {"type": "unsubscribed", "topic": topic, "code": "forbidden",
                 "message": f"your access to session {sid} changed", "cursor": 2}  # fmt: skip
        base = f"/v1/sessions/{sid}/members"
        async with ws_connect(http, gb, "bob") as bob, ws_connect(http, gb, "carol") as carol:
            await _ws_subscribed(bob, session_id=sid)
            await bob.collect(topic, count=2)
            sse = await _sse(gb, f"/v1/sessions/{sid}/events", "bob")
            try:
                # owner -> approver (PATCH): a demotion, though bob still may read.
                status, _ = await _call(http, gw, "PATCH", f"{base}/bob", "alice",
                                        {"role": "approver"})  # fmt: skip
                assert status == 200
                assert await bob.next_reply() == ended
                assert await _sse_disconnect(sse) == {
                    "type": "disconnect",
                    "code": "forbidden",
                    "reconnect": "stop",
                    "cursor": 2,
                }
            finally:
                await sse.close()
            # It may subscribe again with its new role.
            await _ws_subscribed(bob, session_id=sid)
            await bob.collect(topic, count=4)  # replayed from 0 again: 2 + 2
            # approver -> viewer through POST .../members: the same rule.
            status, _ = await _call(http, gw, "POST", base, "alice",
                                    {"user_id": "bob", "role": "viewer"})  # fmt: skip
            assert status == 201
            assert await bob.next_reply() == {**ended, "cursor": 2}
            await _ws_subscribed(bob, session_id=sid)
            # A promotion ends nothing. Proof of order: carol's removal is
            # published after it, by the same gateway; once carol's stream has
            # ended, the promotion was seen, and bob's next reply is his pong.
            await _ws_subscribed(carol, session_id=sid)
            assert (await _call(http, gw, "PATCH", f"{base}/bob", "alice", {"role": "approver"})
                    )[0] == 200  # fmt: skip
            assert (await _call(http, gw, "DELETE", f"{base}/carol", "alice"))[0] == 200
            assert (await carol.next_reply())["code"] == "forbidden"
            await _still_open(bob)


async def test_backstop_ends_streams_when_the_message_is_lost(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    # Changes made in PostgreSQL only (no message): the re-check finds them.
    eve = _fresh_user("eve")  # revoked below: a name no other test uses
    async with running_gateway(settings, access_recheck_s=0.3) as g:
        sid = await session_with(http, g, "alice", bob="viewer", dave="approver")
        await write_run(broker, sid, 1, end=False)
        async with ws_connect(http, g, "bob") as bob, ws_connect(http, g, "dave") as dave, \
                ws_connect(http, g, eve) as carol:  # fmt: skip
            await _ws_subscribed(bob, session_id=sid)
            await _ws_subscribed(dave, session_id=sid)
            sse = await _sse(g, f"/v1/sessions/{sid}/events", "bob")
            try:
                assert await broker.store.remove_member(sid, "bob", "alice") == "viewer"
                assert await broker.store.set_member_role(sid, "dave", "viewer", "alice") == (
                    "approver")  # fmt: skip
                for c in (bob, dave):
                    reply = await c.next_reply(timeout_s=15)
                    assert (reply["type"], reply["code"]) == ("unsubscribed", "forbidden")
                assert (await _sse_disconnect(sse))["code"] == "forbidden"
            finally:
                await sse.close()
            assert g.sample("runlog_gateway_access_ended_total",
                            {"code": "forbidden", "via": "recheck"}) == 3  # fmt: skip
            assert g.sample("runlog_gateway_access_ended_total",
                            {"code": "forbidden", "via": "message"}) == 0  # fmt: skip

            # A revocation written only to PostgreSQL: carol's connection ends.
            old = g.token(eve)
            await broker.store.revoke_tokens(eve, "test")
            with pytest.raises(ConnectionError):
                await carol.next_reply(timeout_s=15)
            assert carol.disconnect is not None and carol.disconnect["code"] == "token_revoked"
            assert g.sample("runlog_gateway_access_ended_total",
                            {"code": "token_revoked", "via": "recheck"}) == 1  # fmt: skip
            async with http.get(g.url + "/v1/sessions",
                                headers={"Authorization": f"Bearer {old}"}) as r:  # fmt: skip
                assert (r.status, _code(await r.json())) == (401, "token_revoked")
    # A gateway started after the revocation refuses the old token at once.
    async with running_gateway(settings, access_recheck_s=_NO_RECHECK_S) as fresh:
        async with http.get(fresh.url + "/v1/sessions",
                            headers={"Authorization": f"Bearer {old}"}) as r:  # fmt: skip
            assert (r.status, _code(await r.json())) == (401, "token_revoked")


# -- per-user token revocation


async def _revoke_cli(settings: Settings, user: str) -> str:
    env = {**os.environ, "RUNLOG_DATABASE_URL": settings.database_url,
           "RUNLOG_NATS_URL": settings.nats_url}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "revoke", "--user", user,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_runlog_revoke_ends_connections_on_two_gateways_and_refuses_old_tokens(
    gw: RunningGateway, settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    bob = _fresh_user("bob")  # revoked below: a name no other test uses
    async with running_gateway(settings, access_recheck_s=_NO_RECHECK_S) as gb:
        sid = await session_with(http, gw, "alice", **{bob: "viewer"}, carol="viewer")
        await write_run(broker, sid, 2, end=False)
        old = gw.token(bob)
        async with ws_connect(http, gw, bob) as ws_a, ws_connect(http, gb, bob) as ws_b, \
                ws_connect(http, gb, "carol") as carol:  # fmt: skip
            for c in (ws_a, ws_b, carol):
                await _ws_subscribed(c, session_id=sid)
                await c.collect(f"session:{sid}", count=2)
            sse_a = await _sse(gw, f"/v1/sessions/{sid}/events", bob)
            sse_b = await _sse(gb, f"/v1/sessions/{sid}/events", bob)
            try:
                out = await _revoke_cli(settings, bob)
                assert out.startswith(f"revoked: tokens of user {bob!r} issued before "), out
                for c in (ws_a, ws_b):
                    with pytest.raises(ConnectionError):
                        await c.next_reply(timeout_s=15)
                    assert c.disconnect == {
                        "type": "disconnect", "code": "token_revoked", "reconnect": "reauth",
                        "message": "the user's tokens were revoked: get a new token",
                        "cursors": {f"session:{sid}": 2}}  # fmt: skip
                    assert c.closed_with is not None and c.closed_with.data == 4409
                for sse in (sse_a, sse_b):
                    assert await _sse_disconnect(sse) == {
                        "type": "disconnect", "code": "token_revoked", "reconnect": "reauth",
                        "cursor": 2}  # fmt: skip
            finally:
                await sse_a.close()
                await sse_b.close()
            await _still_open(carol)  # another user is untouched

        # The old token is refused everywhere, on every kind of request.
        bearer = {"Authorization": f"Bearer {old}"}
        for g in (gw, gb):
            async with http.get(g.url + "/v1/sessions", headers=bearer) as r:
                body = await r.json()
                assert (r.status, _code(body), body["error"]["retryable"]) == (
                    401, "token_revoked", False)  # fmt: skip
            async with http.get(f"{g.url}/v1/sessions/{sid}/events?access_token={old}",
                                headers={"Accept": "text/event-stream"}) as r:  # fmt: skip
                assert (r.status, _code(await r.json())) == (401, "token_revoked")
            with pytest.raises(aiohttp.WSServerHandshakeError) as e:
                async with http.ws_connect(g.ws_url, headers=bearer):
                    pass
            assert e.value.status == 401
            async with http.ws_connect(g.ws_url) as ws:  # authenticating by message
                c = WsClient(ws)
                assert (await c.next_reply())["type"] == "hello"
                await c.send(type="auth", ref="a", token=old)
                reply = await c.next_reply()
                assert (reply["type"], reply["code"]) == ("error", "token_revoked")

        # A token issued from `not_before` on works.
        not_before = await broker.store.pool.fetchval(
            "SELECT extract(epoch FROM not_before) FROM token_revocations WHERE user_id = $1", bob
        )
        while time.time() < float(not_before):
            await asyncio.sleep(0.05)
        fresh = auth.mint(gw.settings, bob)
        for g in (gw, gb):
            async with http.get(g.url + "/v1/sessions",
                                headers={"Authorization": f"Bearer {fresh}"}) as r:  # fmt: skip
                assert r.status == 200
            async with http.ws_connect(g.ws_url,
                                       headers={"Authorization": f"Bearer {fresh}"}) as ws:  # fmt: skip
                c = WsClient(ws)
                assert (await c.next_reply())["type"] == "hello"
                assert await _ws_subscribed(c, session_id=sid) == f"session:{sid}"


async def test_python_client_follow_stops_with_forbidden_when_removed(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", bob="viewer")
    run_id, _ = await write_run(broker, sid, 2, end=False)
    async with Client(gw.url, gw.token("bob")) as c, Client(gw.url, gw.token("alice")) as owner:
        got = []
        with pytest.raises(ClientError) as e:
            async for item in c.follow(run_id=run_id):
                got.append(item.cursor)
                if len(got) == 2:
                    assert await owner.remove_member(sid, "bob") == "viewer"
        assert (e.value.code, got, c.reconnects) == ("forbidden", [1, 2], 0)
        with pytest.raises(ClientError) as e:
            await owner.set_role(sid, "bob", "viewer")
        assert (e.value.status, e.value.code) == (404, "member_not_found")
