"""Gateway REST + SSE against real NATS and PostgreSQL, through real HTTP."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import jwt
import pytest
import pytest_asyncio

from broker import approvals, events, ids
from broker.runtime import Broker
from broker.settings import Settings
from workers.binding import call_digest

from .gw import RunningGateway, read_sse, running_gateway, session_with, write_run


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings, sse_heartbeat_s=0.3) as g:
        yield g


async def test_session_run_and_pages(gw: RunningGateway, http: aiohttp.ClientSession,
                                     broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice", bob="viewer")
    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={"input": "hi"},
                         headers=gw.headers("alice")) as r:  # fmt: skip
        assert r.status == 202
        body = await r.json()
        assert ids.is_valid(body["run_id"]) and body["session_id"] == sid
    async with http.get(f"{gw.url}/v1/runs/{body['run_id']}", headers=gw.headers("bob")) as r:
        assert r.status == 200
        assert (await r.json())["status"] == "queued"  # no worker runs in these tests

    run_id, _ = await write_run(broker, sid, 25)
    async with http.get(f"{gw.url}/v1/runs/{run_id}/events?after=10&limit=5",
                        headers=gw.headers("bob")) as r:  # fmt: skip
        page = await r.json()
    assert [e["seq"] for e in page["events"]] == [11, 12, 13, 14, 15]
    assert page["next_after"] == 15 and page["head"] == 26 and page["ended"] is False
    async with http.get(f"{gw.url}/v1/runs/{run_id}/events?after=20",
                        headers=gw.headers("bob")) as r:  # fmt: skip
        page = await r.json()
    assert page["events"][-1]["type"] == "run_end" and page["ended"] is True
    async with http.get(f"{gw.url}/v1/sessions/{sid}", headers=gw.headers("bob")) as r:
        info = await r.json()
    assert info["your_role"] == "viewer" and {m["user_id"] for m in info["members"]} == {
        "alice", "bob"}  # fmt: skip


async def test_auth_failures(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    sid = await session_with(http, gw, "alice", vic="viewer")
    url = f"{gw.url}/v1/sessions/{sid}"
    forged = jwt.encode({"sub": "alice", "exp": time.time() + 60, "iss": "runlog"},
                        "not-the-secret-not-the-secret-not-the-secret", algorithm="HS256")  # fmt: skip
    cases = [
        ({}, 401, "unauthorized"),
        ({"Authorization": "Basic abc"}, 401, "unauthorized"),
        ({"Authorization": f"Bearer {gw.token('alice', ttl_s=-120)}"}, 401, "token_expired"),
        ({"Authorization": f"Bearer {forged}"}, 401, "unauthorized"),
        ({"Authorization": "Bearer not.a.jwt"}, 401, "unauthorized"),
        (gw.headers("mallory"), 403, "not_a_member"),
    ]
    for headers, status, code in cases:
        async with http.get(url, headers=headers) as r:
            assert r.status == status, headers
            err = (await r.json())["error"]
            assert err["code"] == code and "Traceback" not in err["message"]
    # A viewer may read but not act.
    run_id = await _start(http, gw, sid, "alice")
    async with http.post(f"{gw.url}/v1/runs/{run_id}/interrupt", json={},
                         headers=gw.headers("vic")) as r:  # fmt: skip
        assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden"
    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={},
                         headers=gw.headers("vic")) as r:  # fmt: skip
        assert r.status == 403
    async with http.post(f"{gw.url}/v1/sessions/{sid}/members",
                         json={"user_id": "x", "role": "owner"}, headers=gw.headers("vic")) as r:  # fmt: skip
        assert r.status == 403
    # Owners may stop; a repeat is accepted but changes nothing.
    for first in (True, False):
        async with http.post(f"{gw.url}/v1/runs/{run_id}/interrupt", json={"reason": "enough"},
                             headers=gw.headers("alice")) as r:  # fmt: skip
            assert r.status == 202 and (await r.json())["first"] is first
    async with http.get(f"{gw.url}/v1/runs/{run_id}", headers=gw.headers("vic")) as r:
        stop = (await r.json())["interrupt"]
    assert stop["requested_by"] == "alice" and stop["reason"] == "enough"


async def test_a_run_says_which_worker_owns_it_and_how_often_it_was_taken_over(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", vic="viewer")
    run_id = await _start(http, gw, sid, "alice")

    async def owner() -> object:
        async with http.get(f"{gw.url}/v1/runs/{run_id}", headers=gw.headers("vic")) as r:
            assert r.status == 200
            return (await r.json())["owner"]

    assert await owner() is None  # queued: nobody owns it yet
    assert await broker.store.claim_queued(run_id, "w-1", 30.0) is not None
    assert await owner() == {"worker_id": "w-1", "epoch": 1, "takeovers": 0}
    await broker.store.release(run_id, 1)
    assert await broker.store.claim_expired(run_id, "w-2", 30.0) is not None
    assert await owner() == {"worker_id": "w-2", "epoch": 2, "takeovers": 1}


async def _start(http: aiohttp.ClientSession, gw: RunningGateway, sid: str, user: str) -> str:
    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={"input": "x"},
                         headers=gw.headers(user)) as r:  # fmt: skip
        assert r.status == 202, await r.text()
        return str((await r.json())["run_id"])


async def test_bad_bodies_get_codes(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    h = gw.headers("alice")
    cases = [
        (b"{", 400, "invalid_request"),
        (b'{"title": 5}', 400, "invalid_request"),
        (b'{"title": "x", "extra": 1}', 400, "invalid_request"),
        (b'{"run_policy": "chaos"}', 400, "invalid_request"),
        (b'{"title": "' + b"x" * 70000 + b'"}', 413, "payload_too_large"),
    ]
    for body, status, code in cases:
        async with http.post(f"{gw.url}/v1/sessions", data=body, headers=h) as r:
            assert r.status == status, body[:40]
            assert (await r.json())["error"]["code"] == code
    async with http.get(f"{gw.url}/v1/nope", headers=h) as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "not_found"
    sid = await session_with(http, gw, "alice")
    run_id = await _start(http, gw, sid, "alice")
    bad_queries = [
        ("after=-1", "invalid_cursor"),
        ("after=abc", "invalid_cursor"),
        ("after=99999", "invalid_cursor"),  # past the head
        ("limit=0", "invalid_request"),
        ("limit=100000", "invalid_request"),
    ]
    for q, code in bad_queries:
        async with http.get(f"{gw.url}/v1/runs/{run_id}/events?{q}", headers=h) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (400, code), q


async def test_approvals_decided_once(gw: RunningGateway, http: aiohttp.ClientSession,
                                      broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice", ann="approver", vic="viewer", ben="approver")
    run_id = await _start(http, gw, sid, "alice")
    now = int(time.time() * 1000)
    live, old = ids.approval_id(), ids.approval_id()
    epoch = (await broker.store.get_run(run_id)).owner_epoch  # no worker here: 0
    await approvals.create(broker.store, approval_id=live, run_id=run_id, epoch=epoch,
                           tool_call_id="c1", summary="delete", expires_at_ms=now + 60_000)  # fmt: skip
    await approvals.create(broker.store, approval_id=old, run_id=run_id, epoch=epoch,
                           tool_call_id="c2", summary="delete", expires_at_ms=now - 1)  # fmt: skip
    url = f"{gw.url}/v1/runs/{run_id}/approvals/"

    async def decide(user: str, aid: str, decision: str) -> tuple[int, dict]:
        async with http.post(url + aid, json={"decision": decision},
                             headers=gw.headers(user)) as r:  # fmt: skip
            return r.status, await r.json()

    assert (await decide("vic", live, "approve"))[0] == 403
    status, body = await decide("ann", live, "approve")
    assert status == 201 and body["created"] is True
    assert body["approval"]["decided_by"] == "ann" and body["approval"]["decision"] == "approve"
    status, body = await decide("ben", live, "approve")  # the same decision: a no-op
    assert status == 200 and body["created"] is False and body["approval"]["decided_by"] == "ann"
    status, body = await decide("ben", live, "reject")
    assert status == 409 and body["error"]["code"] == "approval_conflict"
    assert body["error"]["stored"]["decision"] == "approve"
    status, body = await decide("ann", old, "approve")
    assert status == 410 and body["error"]["code"] == "approval_expired"
    status, body = await decide("ann", ids.approval_id(), "approve")
    assert status == 404 and body["error"]["code"] == "approval_not_found"


async def test_a_decision_for_a_call_the_approval_no_longer_guards_is_stale(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", ann="approver")
    run_id = await _start(http, gw, sid, "alice")
    aid, shown = ids.approval_id(), call_digest("delete_rows", '{"rows": [1]}')
    epoch = (await broker.store.get_run(run_id)).owner_epoch
    await approvals.create(broker.store, approval_id=aid, run_id=run_id, epoch=epoch,
                           tool_call_id="c1", summary="delete", call_digest=shown,
                           expires_at_ms=int(time.time() * 1000) + 60_000)  # fmt: skip
    url = f"{gw.url}/v1/runs/{run_id}/approvals/{aid}"

    async def decide(**body: str) -> tuple[int, dict]:
        async with http.post(url, json=body, headers=gw.headers("ann")) as r:
            return r.status, await r.json()

    other = call_digest("delete_rows", '{"rows": [1, 2]}')
    status, body = await decide(decision="approve", call_digest=other)
    assert (status, body["error"]["code"]) == (409, "approval_stale")
    assert body["error"]["call_digest"] == shown
    assert (await approvals.get(broker.store, aid)).decision is None
    status, body = await decide(decision="approve", call_digest="not hex")
    assert (status, body["error"]["code"]) == (400, "invalid_request")
    status, body = await decide(decision="approve", call_digest=shown)
    assert status == 201 and body["approval"]["call_digest"] == shown


async def test_sse_resume_by_last_event_id_and_after(gw: RunningGateway, http: aiohttp.ClientSession,
                                                      broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice")
    run_id, _ = await write_run(broker, sid, 40)
    h = {**gw.headers("alice"), "Accept": "text/event-stream"}
    async with http.get(f"{gw.url}/v1/runs/{run_id}/events", headers=h) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        assert r.headers["X-Accel-Buffering"] == "no" and "Content-Encoding" not in r.headers
        full = await read_sse(r)
    assert [i for i, _ in full] == list(range(1, 42)) and [e["seq"] for _, e in full] == list(
        range(1, 42)
    )
    async with http.get(f"{gw.url}/v1/runs/{run_id}/events",
                        headers={**h, "Last-Event-ID": "17"}) as r:  # fmt: skip
        assert [i for i, _ in await read_sse(r)] == list(range(18, 42))
    # EventSource cannot set headers: the token and cursor go in the query.
    tok = gw.token("alice")
    async with http.get(f"{gw.url}/v1/runs/{run_id}/events?after=30&access_token={tok}",
                        headers={"Accept": "text/event-stream"}) as r:  # fmt: skip
        assert [i for i, _ in await read_sse(r)] == list(range(31, 42))
    # At the end of an ended run: 204, so EventSource stops reconnecting.
    async with http.get(f"{gw.url}/v1/runs/{run_id}/events",
                        headers={**h, "Last-Event-ID": "41"}) as r:  # fmt: skip
        assert r.status == 204


async def test_sse_live_with_heartbeat_and_session_cursor(gw: RunningGateway,
        http: aiohttp.ClientSession, broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice")
    _, wa = await write_run(broker, sid, 5, end=False)
    h = {**gw.headers("alice"), "Accept": "text/event-stream"}
    async with http.get(f"{gw.url}/v1/sessions/{sid}/events?after=2", headers=h) as r:
        first = await read_sse(r, until_type=None, count=3)
        assert [i for i, _ in first] == [3, 4, 5]
        raw = await asyncio.wait_for(r.content.readuntil(b"\n\n"), 5)  # quiet: a heartbeat
        assert raw.startswith(b":")
        run_b, _ = await write_run(broker, sid, 3)
        rest = await read_sse(r, until_type="run_end")
    assert [i for i, _ in rest] == [6, 7, 8, 9]
    assert {e["run_id"] for _, e in rest} == {run_b}
    await wa.append(events.RunEnd(status="completed"))
    await wa.flush()


async def test_post_run_streams_with_accept_sse(gw: RunningGateway, http: aiohttp.ClientSession,
                                                broker: Broker) -> None:  # fmt: skip
    sid = await session_with(http, gw, "alice")
    h = {**gw.headers("alice"), "Accept": "text/event-stream"}

    async def fake_worker() -> None:
        # The worker's side, written through the broker as a worker does.
        for _ in range(100):
            runs = await broker.store.active_runs(sid)
            if runs:
                w = await broker.claim(runs[0], "w")
                await w.append(events.RunStart(model="m", started_by="alice"))
                await w.append(events.TextDelta(message_id="m", delta="hello"))
                await w.append(events.RunEnd(status="completed"))
                await w.flush()
                return
            await asyncio.sleep(0.05)

    task = asyncio.create_task(fake_worker())
    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs", json={"input": "hi"},
                         headers=h) as r:  # fmt: skip
        assert r.status == 200
        got = await read_sse(r)
    await task
    assert [e["type"] for _, e in got] == ["run_start", "text_delta", "run_end"]


async def test_health_and_docs(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    async with http.get(gw.url + "/healthz") as r:
        assert r.status == 200
    async with http.get(gw.url + "/readyz") as r:
        assert r.status == 200 and (await r.json())["ready"] is True
    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
        assert "runlog_gateway_connections" in text and "runlog_events_appended_total" in text
        assert 'runlog_gateway_http_requests_total{route="/readyz",status="2xx"}' in text
    async with http.get(gw.url + "/v1/openapi.json") as r:
        doc = await r.json()
        assert doc["openapi"].startswith("3.") and "/v1/runs/{run_id}/events" in doc["paths"]
        assert "StartRun" in doc["components"]["schemas"]


@pytest.mark.parametrize("path", ["/v1/sessions/s_x/events", "/v1/runs/r_x/events"])
async def test_streams_of_unknown_ids_do_not_leak(gw: RunningGateway, http: aiohttp.ClientSession,
                                                  path: str) -> None:  # fmt: skip
    async with http.get(gw.url + path, headers=gw.headers("alice")) as r:
        assert r.status == 403 and (await r.json())["error"]["code"] == "not_a_member"


async def test_session_pages_carry_real_cursors_across_pruned_holes(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    """Pruned runs leave holes in a session's cursors: a page's `cursor` is its
    first event's real cursor, and a page stops before a hole, so event i of a
    page still has cursor `cursor + i`."""
    sid = await session_with(http, gw, "alice")
    r1, _ = await write_run(broker, sid, 5)  # cursors 1-6
    r2, _ = await write_run(broker, sid, 5)  # 7-12, pruned below
    r3, _ = await write_run(broker, sid, 10)  # 13-23
    await broker.store.pool.execute("DELETE FROM events WHERE run_id = $1", r2)

    async def page(after: int) -> dict:
        async with http.get(f"{gw.url}/v1/sessions/{sid}/events?after={after}",
                            headers=gw.headers("alice")) as r:  # fmt: skip
            assert r.status == 200, await r.text()
            return dict(await r.json())

    p = await page(6)  # the page right after the hole starts at its real cursor
    assert (p["cursor"], p["next_after"], p["head"]) == (13, 23, 23)
    assert [(e["run_id"], e["seq"]) for e in p["events"]] == [(r3, s) for s in range(1, 12)]
    p = await page(8)  # a cursor inside the hole
    assert (p["cursor"], p["next_after"]) == (13, 23)
    assert len(p["events"]) == 11
    p = await page(3)  # a page that would span the hole stops before it
    assert (p["cursor"], p["next_after"]) == (4, 6)
    assert [(e["run_id"], e["seq"]) for e in p["events"]] == [(r1, 4), (r1, 5), (r1, 6)]
    # Paging through from 0 with next_after: every stored event once, with the
    # cursors the rule gives, the same as a stream's.
    got: list[tuple[int, str, int]] = []
    after = 0
    while True:
        p = await page(after)
        if not p["events"]:
            break
        got += [(p["cursor"] + i, e["run_id"], e["seq"]) for i, e in enumerate(p["events"])]
        after = p["next_after"]
    assert got == [(c, r1, c) for c in range(1, 7)] + [(12 + s, r3, s) for s in range(1, 12)]
    assert after == 23


async def test_head_of_an_events_stream_sends_headers_only(gw: RunningGateway, broker: Broker,
                                                           http: aiohttp.ClientSession) -> None:  # fmt: skip
    """HEAD with Accept: text/event-stream answers like the JSON page's HEAD:
    headers, no body (an SSE body there broke the next response on the
    keep-alive connection)."""
    sid = await session_with(http, gw, "alice")
    run_id, _ = await write_run(broker, sid, 3, end=False)
    h = {**gw.headers("alice"), "Accept": "text/event-stream"}
    # One connection, reused: whatever HEAD left on it reaches the next answer.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as one:
        for url in (f"{gw.url}/v1/runs/{run_id}/events", f"{gw.url}/v1/sessions/{sid}/events"):
            async with one.head(url, headers=h) as r:
                assert (r.status, r.headers["Content-Type"]) == (200, "application/json")
            async with one.get(url, headers=gw.headers("alice")) as r:
                assert r.status == 200 and len((await r.json())["events"]) == 3
