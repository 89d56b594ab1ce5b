"""The serving harness every compat format uses (gateway/compat/serve.py),
over real gateways, with a tiny test projection: one JSON object per event
carrying its seq, a synthesised `open` item (no seq) when a span opens, and
an `interrupt` ending the answer at an undecided approval."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any

import aiohttp
from aiohttp import web

from broker import approvals, control, events, ids
from broker.log import RunWriter
from broker.runtime import Broker
from broker.settings import Settings
from gateway import sse
from gateway.compat import spans
from gateway.compat.base import Context, Projection, Wire
from gateway.compat.base import json as to_json
from gateway.compat.serve import Framing, serve_run
from gateway.context import GATEWAY

from .gw import RunningGateway, eventually, running_gateway, session_with, write_run
from .rawclient import RawSse

PATH = "/test/compat/runs/{run_id}"


class Echo(Projection):
    def start(self) -> list[Wire]:
        opened = [s.id for s in self.spans.open_now()]
        out = [Wire(to_json({"start": self.spans.last_seq, "open": opened}))]
        for a in self.spans.pending_approvals.values():
            if a.approval_id not in self.ctx.decided:  # resumed at it: ask again at once
                out.append(Wire(to_json({"interrupt": a.approval_id})))
                self.done = True
        return out

    def feed(self, ev: events.Event) -> list[Wire]:
        out = [
            Wire(to_json({"open": t.span.id}))
            for t in self.spans.advance(ev)
            if isinstance(t, spans.Open)
        ]
        tag = type(ev).__struct_config__.tag
        assert isinstance(tag, str)
        item: dict[str, object] = {"seq": ev.seq, "type": tag}
        if isinstance(ev, events.TextDelta):
            item["delta"] = ev.delta
        out.append(Wire(to_json(item), ev.seq, tag))
        if isinstance(ev, events.ApprovalRequired) and ev.approval_id not in self.ctx.decided:
            out.append(Wire(to_json({"interrupt": ev.approval_id})))
            self.done = True
        if isinstance(ev, events.RunEnd):
            self.done = True
        return out


routes = web.RouteTableDef()


@routes.get(PATH)
async def echo(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    q = request.query
    framing = Framing(
        ids=q.get("ids") != "0",
        event_names=q.get("names") == "1",
        heartbeat=None if q.get("hb") == "0" else b": hb\n\n",
        preamble=q.get("preamble", "").encode(),
        done=b"data: [DONE]\n\n" if q.get("done") == "1" else None,
        headers={"x-test-format": "echo"},
    )
    run_id = request.match_info["run_id"]
    ctx = Context(run_id=run_id, session_id="")
    return await serve_run(request, gw, p, run_id, sse.cursor_from(request), Echo(ctx), framing)


def _gateway(settings: Settings, **overrides: Any) -> Any:
    return running_gateway(settings, routes, **overrides)


def _url(g: RunningGateway, run_id: str, query: str = "") -> str:
    return g.url + PATH.format(run_id=run_id) + (f"?{query}" if query else "")


def _frames(body: bytes) -> list[dict[str, str]]:
    """SSE frames as their fields ("comment" for `:` lines), LF framing only."""
    assert b"\r" not in body
    out = []
    for raw in body.split(b"\n\n"):
        if not raw:
            continue
        fields: dict[str, str] = {}
        for line in raw.decode().split("\n"):
            k, _, v = line.partition(": ")
            fields["comment" if k == "" else k] = v
        out.append(fields)
    return out


def _items(body: bytes) -> list[Any]:
    """The data of each frame, decoded ("[DONE]" as it is)."""
    return [
        f["data"] if f["data"] == "[DONE]" else json.loads(f["data"])
        for f in _frames(body)
        if "data" in f
    ]


async def _get(http: aiohttp.ClientSession, g: RunningGateway, run_id: str, user: str = "alice",
               query: str = "", after: int | None = None) -> bytes:  # fmt: skip
    headers = g.headers(user)
    if after is not None:
        headers["Last-Event-ID"] = str(after)
    async with http.get(_url(g, run_id, query), headers=headers) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"] == "text/event-stream"
        assert r.headers["x-test-format"] == "echo"
        return await asyncio.wait_for(r.read(), 30)


def _expected(first: int, last: int, *, open_at: int = 1) -> list[dict[str, Any]]:
    """What Echo writes for a write_run(n) run's events first..last (seq n+1 is
    its run_end): text deltas of m1, so `open` before seq `open_at`."""
    out: list[dict[str, Any]] = []
    for seq in range(first, last + 1):
        if seq == open_at:
            out.append({"open": "m1"})
        if seq < last:
            out.append({"seq": seq, "type": "text_delta", "delta": f"t{seq - 1} "})
        else:
            out.append({"seq": seq, "type": "run_end"})
    return out


async def test_full_replay_of_an_ended_run(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 5)
        body = await _get(http, g, run_id)
        assert _items(body) == [{"start": 0, "open": []}, *_expected(1, 6)]
        ids_written = [int(f["id"]) for f in _frames(body) if "id" in f]
        assert ids_written == [1, 2, 3, 4, 5, 6]  # only items that carry a seq


async def test_resume_from_every_cursor_loses_and_doubles_nothing(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 5)
        for after in range(0, 6):
            got = _items(await _get(http, g, run_id, after=after))
            opened = ["m1"] if after else []
            assert got == [{"start": after, "open": opened}, *_expected(after + 1, 6)], after
        # At the end of an ended run: the envelope and the run's end again.
        got = _items(await _get(http, g, run_id, after=6))
        assert got == [{"start": 5, "open": ["m1"]}, {"seq": 6, "type": "run_end"}]
        # ?after= works as well as Last-Event-ID.
        got = _items(await _get(http, g, run_id, query="after=4"))
        assert got == [{"start": 4, "open": ["m1"]}, *_expected(5, 6)]


async def test_live_events_follow_the_replay_then_the_end_closes_the_body(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 3, end=False)
        async with http.get(_url(g, run_id), headers=g.headers("alice")) as r:
            buf = b""
            async with asyncio.timeout(30):
                while buf.count(b'"seq"') < 3:
                    buf += await r.content.readany()
                for i in range(3, 6):
                    await w.append(events.TextDelta(message_id="m1", delta=f"t{i} "))
                await w.append(events.RunEnd(status="completed"))
                await w.flush()
                buf += await r.read()
        assert _items(buf) == [{"start": 0, "open": []}, *_expected(1, 7)]
        await eventually(lambda: not g.app[GATEWAY].connections, 10, "answer closed")


async def test_an_undecided_approval_ends_the_answer_and_a_decided_one_streams_inline(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 1, end=False)
        waiting = ids.approval_id()
        await w.append(events.ToolCallStart(tool_call_id="c1", tool_name="sh"))
        await w.append(events.ToolCallEnd(tool_call_id="c1"))
        await w.append(events.ApprovalRequired(approval_id=waiting, tool_call_id="c1"))
        await w.append(events.Status(code="waiting"))
        await w.flush()
        # seq 4 is the approval: the answer ends there, whatever follows in the log.
        got = _items(await _get(http, g, run_id, query="done=1"))
        assert got == [
            {"start": 0, "open": []},
            {"open": "m1"},
            {"seq": 1, "type": "text_delta", "delta": "t0 "},
            {"open": "c1"},
            {"seq": 2, "type": "tool_call_start"},
            {"seq": 3, "type": "tool_call_end"},
            {"seq": 4, "type": "approval_required"},
            {"interrupt": waiting},
            "[DONE]",
        ]
        # Resumed right at it, still undecided: the envelope and the interrupt again.
        got = _items(await _get(http, g, run_id, query="done=1", after=4))
        assert got == [{"start": 4, "open": []}, {"interrupt": waiting}, "[DONE]"]
        # A decided approval (in PostgreSQL, before its event) streams inline.
        decided = await _approval(broker, w, "c1")
        await broker.decide(decided, "approve", "alice")
        await w.append(events.ApprovalDecided(approval_id=waiting, decision="reject"))
        await w.append(events.ApprovalRequired(approval_id=decided, tool_call_id="c1"))
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        got = _items(await _get(http, g, run_id, after=6))
        assert got == [
            {"start": 6, "open": []},
            {"seq": 7, "type": "approval_required"},
            {"seq": 8, "type": "run_end"},
        ]


async def _approval(broker: Broker, w: RunWriter, tool_call_id: str) -> str:
    approval_id = ids.approval_id()
    await approvals.create(
        broker.store, approval_id=approval_id, run_id=w.run_id, epoch=w.epoch,
        tool_call_id=tool_call_id, summary="", expires_at_ms=int(time.time() * 1000) + 600_000,
    )  # fmt: skip
    return approval_id


async def test_framing_options_shape_the_bytes(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 1)
        start = b'data: {"start":0,"open":[]}\n\n'
        opened = b'data: {"open":"m1"}\n\n'
        delta = b'data: {"seq":1,"type":"text_delta","delta":"t0 "}\n\n'
        end = b'data: {"seq":2,"type":"run_end"}\n\n'
        assert await _get(http, g, run_id) == (
            start + opened + b"id: 1\n" + delta + b"id: 2\n" + end
        )
        assert await _get(http, g, run_id, query="ids=0") == start + opened + delta + end
        assert await _get(http, g, run_id, query="ids=0&names=1&done=1&preamble=retry:%201000%0A%0A") == (
            b"retry: 1000\n\n" + start + opened + b"event: text_delta\n" + delta
            + b"event: run_end\n" + end + b"data: [DONE]\n\n"
        )  # fmt: skip


async def test_heartbeats_only_when_idle_and_only_when_asked(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings, sse_heartbeat_s=0.2) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        async with http.get(_url(g, run_id), headers=g.headers("alice")) as beating, \
                http.get(_url(g, run_id, "hb=0"), headers=g.headers("alice")) as quiet:  # fmt: skip
            opening = b'data: {"start":0,"open":[]}\n\n'
            async with asyncio.timeout(30):
                buf = b""
                while buf.count(b": hb\n\n") < 3:
                    buf += await beating.content.readany()
                assert buf == opening + b": hb\n\n" * 3
                await w.append(events.TextDelta(message_id="m1", delta="x"))
                await w.append(events.RunEnd(status="completed"))
                await w.flush()
                # Quiet all along (three heartbeats' time): its first bytes are
                # the opening, then the events.
                assert await quiet.read() == opening + (
                    b'data: {"open":"m1"}\n\nid: 1\ndata: {"seq":1,"type":"text_delta","delta":"x"}\n\n'
                    b'id: 2\ndata: {"seq":2,"type":"run_end"}\n\n'
                )
                await beating.read()


async def test_the_connection_caps_count_compat_answers(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    caps = {"max_connections_per_user": 1, "connection_retry_after_s": 7.0}
    async with _gateway(settings, **caps) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 1, end=False)
        async with http.get(_url(g, run_id), headers=g.headers("alice")) as first:
            await first.content.readany()
            async with http.get(_url(g, run_id), headers=g.headers("alice")) as r:
                body = await r.json()
                assert (r.status, body["error"]["code"], r.headers["Retry-After"]) == (
                    429, "too_many_connections", "7")  # fmt: skip
            assert g.sample("runlog_gateway_connections", {"kind": "compat"}) == 1


async def test_bad_requests_get_coded_errors_before_the_body(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 2, end=False)
        cases = [
            ("mallory", {}, 403, "not_a_member"),
            ("alice", {"Last-Event-ID": "3"}, 400, "invalid_cursor"),
            ("alice", {"Last-Event-ID": "x"}, 400, "invalid_cursor"),
        ]
        for user, extra, status, code in cases:
            async with http.get(_url(g, run_id), headers={**g.headers(user), **extra}) as r:
                assert (r.status, (await r.json())["error"]["code"]) == (status, code)
        async with http.get(_url(g, "run_nope"), headers=g.headers("alice")) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (403, "not_a_member")


class _Open:
    """An answer being read: what came so far in `buf`."""

    def __init__(self, r: aiohttp.ClientResponse, buf: bytes) -> None:
        self.r = r
        self.buf = buf


async def _open(http: aiohttp.ClientSession, g: RunningGateway, run_id: str,
                user: str, events: int = 2) -> _Open:  # fmt: skip
    """An answer, read until its first `events` events came."""
    r = await http.get(_url(g, run_id), headers=g.headers(user))
    assert r.status == 200
    buf = b""
    async with asyncio.timeout(30):
        while buf.count(b'"seq"') < events:
            buf += await r.content.readany()
    return _Open(r, buf)


async def _ends_without_its_end(a: _Open) -> None:
    rest = await asyncio.wait_for(a.r.read(), 30)
    assert rest == b"", rest  # nothing more, not even the format's end
    a.r.release()


async def test_drain_ends_the_answer(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    async with _gateway(settings) as g:
        sid = await session_with(http, g, "alice")
        run_id, _ = await write_run(broker, sid, 2, end=False)
        r = await _open(http, g, run_id, "alice")
        await asyncio.wait_for(g.app[GATEWAY].drain(), 20)
        await _ends_without_its_end(r)
        async with http.get(_url(g, run_id), headers=g.headers("alice")) as again:
            assert (again.status, (await again.json())["error"]["code"]) == (
                503, "server_draining")  # fmt: skip


async def test_removal_and_revocation_end_the_answer(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    bob, carol = f"bob-{secrets.token_hex(4)}", f"carol-{secrets.token_hex(4)}"
    async with _gateway(settings) as g:
        gw = g.app[GATEWAY]
        sid = await session_with(http, g, "alice", **{bob: "viewer", carol: "viewer"})
        run_id, w = await write_run(broker, sid, 2, end=False)
        rb = await _open(http, g, run_id, bob)
        rc = await _open(http, g, run_id, carol)
        ra = await _open(http, g, run_id, "alice")
        async with http.delete(f"{g.url}/v1/sessions/{sid}/members/{bob}",
                               headers=g.headers("alice")) as r:  # fmt: skip
            assert r.status == 200
        await _ends_without_its_end(rb)
        await gw.access.apply(
            control.TokensRevoked(user_id=carol, not_before=time.time() + 5), "message"
        )
        await _ends_without_its_end(rc)
        assert g.sample("runlog_gateway_access_ended_total", {"code": "forbidden",
                                                             "via": "message"}) == 1  # fmt: skip
        # alice's answer goes on to the end.
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        rest = await asyncio.wait_for(ra.r.read(), 30)
        assert _items(ra.buf + rest) == [{"start": 0, "open": []}, *_expected(1, 3)]
        ra.r.release()


async def test_a_slow_reader_is_cut_with_nothing_skipped_before_the_cut(
    settings: Settings, http: aiohttp.ClientSession, broker: Broker
) -> None:
    small = {"send_queue_max_bytes": 256 * 1024, "send_queue_lag_bytes": 64 * 1024}
    async with _gateway(settings, **small) as g:
        sid = await session_with(http, g, "alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        slow = await RawSse.connect(g.port, PATH.format(run_id=run_id), g.token("alice"))
        try:
            await eventually(lambda: g.sample("runlog_gateway_connections",
                                              {"kind": "compat"}) == 1)  # fmt: skip
            big = "x" * 2000
            n = 0
            while g.sample("runlog_gateway_slow_client_disconnects_total", {"kind": "compat"}) != 1:
                for _ in range(20):
                    # One message: a native lagging client would get these merged.
                    await w.append(events.TextDelta(message_id="m", delta=big))
                    n += 1
                await w.flush()
                await asyncio.sleep(0.01)
                assert n < 20_000, "never cut"
            frames = await asyncio.wait_for(slow.read_to_end(), 30)
            seqs = [int(f["id"]) for f in frames]
            assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) < n
            assert all(json.loads(f["data"])["type"] == "text_delta" for f in frames)
            assert g.sample("runlog_gateway_coalesced_events_total") == 0
            await eventually(lambda: not slow.server_side_open(g.port), what="socket closed")
            await eventually(lambda: g.sample("runlog_gateway_send_queue_bytes") == 0)
        finally:
            await slow.close()
