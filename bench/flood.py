"""flood: a second user's REST and live latency while a first user floods
one gateway with replays, next to the same figures without the flood, and
the gateway's RSS before, at its peak and after the flood.

One real gateway process (its settings: the defaults, or --gateway-setting).
The victim, in this process: one WebSocket following a live run that this
process writes at --rate token deltas/s (each delta carries its append wall
time: append → receive is measured per event), and `GET /v1/sessions/{id}`
one after the other with a 50 ms pause (request → response). The flooder, in
its own process (bench/_floodload.py), one user: --flood-ws WebSockets and
--flood-sse SSE streams, all opened at once, each replaying a session of
--replay-events events from 0 (two such sessions); the WebSockets replay over
and over, the SSE streams once. Whatever the caps refuse is counted by code.

Per trial: --seconds of victim alone (after a warm-up), then the flood is
opened and, after a ramp, --seconds measured while it runs; then it is
closed. RSS (psutil) of the gateway: just before the flood, its peak (sampled
every 0.2 s), once its connections are gone, and malloc_trim_s + 2 s later
(after the gateway's malloc_trim).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from broker import events

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure
from ._procs import GatewayProc, _LineChild

VICTIM, FLOODER = "victim", "flooder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seconds", type=float, default=10.0, help="measured per phase (default: 10)")
    p.add_argument("--rate", type=float, default=50.0, help="victim's live run, deltas/s (default: 50)")  # fmt: skip
    p.add_argument("--flood-ws", type=int, default=1000, help="flood WebSockets (default: 1000)")
    p.add_argument("--flood-sse", type=int, default=200, help="flood SSE streams (default: 200)")
    p.add_argument("--replay-events", type=int, default=4000,
                   help="events in each flooded session (default: 4000)")  # fmt: skip
    p.add_argument("--ramp-s", type=float, default=2.0, help="flood running before measuring (default: 2)")  # fmt: skip
    p.add_argument("--gateway-setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a gateway setting (e.g. max_connections_per_user=0); repeatable")  # fmt: skip


class FloodProc(_LineChild):
    def __init__(self) -> None:
        super().__init__("floodload")

    async def start(self) -> FloodProc:
        await self._spawn("bench._floodload")
        return self

    async def call(self, cmd: str, timeout_s: float = 120.0, **kw: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"cmd": cmd, **kw}) + "\n").encode())
        await self.proc.stdin.drain()
        return await self.read(timeout_s)


class Victim:
    """The second user: live latency on one run, REST latency on its session."""

    def __init__(self, http: aiohttp.ClientSession, gw: GatewayProc, sid: str, rate: float) -> None:
        self.http = http
        self.rate = rate
        self.gw = gw
        self.sid = sid
        self.recording = False
        self.live: list[float] = []
        self.rest: list[float] = []
        self.rest_errors = 0
        self.tasks: list[asyncio.Task[None]] = []

    async def start(self, b: Any) -> None:
        run_id = await b.store.create_run(self.sid, VICTIM, model="bench")
        self.writer = await b.claim(run_id, "bench-writer")
        await self.writer.append(events.RunStart(model="bench", started_by=VICTIM))
        await self.writer.flush()
        headers = {"Authorization": f"Bearer {_gw.token(VICTIM)}"}
        self.ws = await self.http.ws_connect(self.gw.ws_url, headers=headers)
        await self.ws.send_json({"type": "subscribe", "run_id": run_id, "after": 0})
        self.tasks = [asyncio.create_task(f()) for f in (self._read, self._write, self._rest)]

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                break
            m = json.loads(msg.data)
            if m["type"] == "event" and m["event"]["type"] == "text_delta" and self.recording:
                self.live.append(time.time() - float(m["event"]["delta"]))
            elif m["type"] == "disconnect":
                raise RuntimeError(f"victim disconnected: {m}")

    async def _write(self) -> None:
        while True:
            await self.writer.append(events.TextDelta(message_id="m1", delta=repr(time.time())))
            await asyncio.sleep(1 / self.rate)

    async def _rest(self) -> None:
        url = f"{self.gw.url}/v1/sessions/{self.sid}"
        headers = {"Authorization": f"Bearer {_gw.token(VICTIM)}"}
        while True:
            t0 = time.perf_counter()
            async with self.http.get(url, headers=headers) as r:
                await r.read()
                ok = r.status == 200
            if self.recording:
                if ok:
                    self.rest.append(time.perf_counter() - t0)
                else:
                    self.rest_errors += 1
            await asyncio.sleep(0.05)

    async def measure(self, seconds: float) -> dict[str, float]:
        self.live, self.rest, self.rest_errors = [], [], 0
        self.recording = True
        await asyncio.sleep(seconds)
        self.recording = False
        for t in self.tasks:
            if t.done():
                t.result()  # a failed victim fails the benchmark
        live, rest = sorted(self.live), sorted(self.rest)
        q = _lib.quantile
        return {
            "live_p50_ms": q(live, 0.5) * 1e3, "live_p99_ms": q(live, 0.99) * 1e3,
            "live_events": len(live), "rest_p50_ms": q(rest, 0.5) * 1e3,
            "rest_p99_ms": q(rest, 0.99) * 1e3, "rest_requests": len(rest),
            "rest_errors": self.rest_errors,
        }  # fmt: skip

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.ws.close()


async def _metrics(http: aiohttp.ClientSession, gw: GatewayProc) -> dict[str, float]:
    async with http.get(gw.url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = s.name + "".join(f"{{{k}={v}}}" for k, v in sorted(s.labels.items()))
            out[key] = s.value
    return out


def _connections(m: dict[str, float]) -> float:
    return m.get("runlog_gateway_connections{kind=ws}", 0) + m.get(
        "runlog_gateway_connections{kind=sse}", 0
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    per_trial: list[dict[str, Any]] = []
    gw_settings = dict(kv.split("=", 1) for kv in args.gateway_setting)
    trim_s = float(gw_settings.get("malloc_trim_s", 5.0))
    async with _lib.stack(args.work_dir) as st:
        b = await _gw.connect_broker(st)
        gw = await GatewayProc(st, **gw_settings).start()
        flood = await FloodProc().start()
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        victim: Victim | None = None
        try:
            flood_sessions = []
            for _ in range(2):
                sid = await b.store.create_session(FLOODER, "bench flood")
                w = await b.claim(await b.store.create_run(sid, FLOODER, model="bench"), "bench")
                await _gw.append_burst(w, args.replay_events - 1)
                await _gw.end_run(w)
                flood_sessions.append((sid, w.run_id))
            vsid = await b.store.create_session(VICTIM, "bench victim")
            victim = Victim(http, gw, vsid, args.rate)
            await victim.start(b)
            await victim.measure(2.0)  # warm-up
            for trial in range(args.trials):
                t: dict[str, Any] = {}
                t["quiet"] = await victim.measure(args.seconds)
                progress(f"trial {trial + 1}: no flood: {_line(t['quiet'])}")
                before = await _metrics(http, gw)
                t["rss_before_mb"] = gw.rss() / 2**20
                started = await flood.call(
                    "start", ws_url=gw.ws_url, token=_gw.token(FLOODER), ws=args.flood_ws,
                    sse=args.flood_sse, sessions=[s for s, _ in flood_sessions],
                    target=args.replay_events,
                    sse_urls=[f"{gw.url}/v1/sessions/{s}/events" for s, _ in flood_sessions],
                )  # fmt: skip
                t["flood_opened"] = {"ws": started["ws"], "sse": started["sse"]}
                progress(f"trial {trial + 1}: flood opened: ws {started['ws']}, "
                         f"sse {started['sse']}")  # fmt: skip
                peak = {"rss": gw.rss(), "waiting": 0.0, "running": 0.0}
                sampler = asyncio.create_task(_sample(http, gw, peak))
                try:
                    await asyncio.sleep(args.ramp_s)
                    t["flood"] = await victim.measure(args.seconds)
                finally:
                    sampler.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await sampler
                stopped = await flood.call("stop")
                t["flood_replays"] = stopped["replays"]
                t["flood_events"] = stopped["ws_events"] + stopped["sse_events"]
                progress(f"trial {trial + 1}: flood: {_line(t['flood'])}; "
                         f"{stopped['replays']} WebSocket replays done")  # fmt: skip
                after = await _metrics(http, gw)
                for reason in ("user", "ip"):
                    key = f"runlog_gateway_connections_refused_total{{reason={reason}}}"
                    t[f"refused_{reason}"] = after.get(key, 0) - before.get(key, 0)
                t["replays_waiting_max"] = peak["waiting"]
                t["replays_running_max"] = peak["running"]
                t["rss_peak_mb"] = peak["rss"] / 2**20
                deadline = time.monotonic() + 30
                while _connections(await _metrics(http, gw)) > 1:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the flood's connections did not close in 30 s")
                    await asyncio.sleep(0.1)
                t["rss_closed_mb"] = gw.rss() / 2**20
                await asyncio.sleep(trim_s + 2.0)
                t["rss_after_mb"] = gw.rss() / 2**20
                progress(f"trial {trial + 1}: RSS before {t['rss_before_mb']:.0f} MB, peak "
                         f"{t['rss_peak_mb']:.0f}, closed {t['rss_closed_mb']:.0f}, after "
                         f"{t['rss_after_mb']:.0f}")  # fmt: skip
                per_trial.append(t)
        finally:
            if victim is not None:
                await victim.stop()
            await http.close()
            await flood.stop()
            await gw.stop()
            await b.close()
    return {"figures": _figures(per_trial, args), "trials": per_trial, "settings": gw_settings}


async def _sample(http: aiohttp.ClientSession, gw: GatewayProc, peak: dict[str, float]) -> None:
    while True:
        peak["rss"] = max(peak["rss"], gw.rss())
        with contextlib.suppress(aiohttp.ClientError, OSError):
            m = await _metrics(http, gw)
            peak["waiting"] = max(peak["waiting"], m.get("runlog_gateway_replays_waiting", 0))
            peak["running"] = max(peak["running"], m.get("runlog_gateway_replays_running", 0))
        await asyncio.sleep(0.2)


def _line(r: dict[str, float]) -> str:
    return (f"REST p50 {r['rest_p50_ms']:.1f} / p99 {r['rest_p99_ms']:.1f} ms, live p50 "
            f"{r['live_p50_ms']:.1f} / p99 {r['live_p99_ms']:.1f} ms")  # fmt: skip


def _figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []

    def add(section: str, name: str, unit: str, get: Any) -> None:
        figs.append(_lib.summarize(section, name, unit, [get(t) for t in per_trial]))

    sec = "second user, while the first floods (vs. no flood)"
    for phase, label in (("quiet", "no flood"), ("flood", "flood")):
        add(sec, f"REST GET session p50, {label}", "ms", lambda t, p=phase: t[p]["rest_p50_ms"])
        add(sec, f"REST GET session p99, {label}", "ms", lambda t, p=phase: t[p]["rest_p99_ms"])
        add(sec, f"live append → receive p50, {label}", "ms",
            lambda t, p=phase: t[p]["live_p50_ms"])  # fmt: skip
        add(sec, f"live append → receive p99, {label}", "ms",
            lambda t, p=phase: t[p]["live_p99_ms"])  # fmt: skip
    add(sec, "REST errors during the flood", "requests", lambda t: t["flood"]["rest_errors"])
    fsec = f"first user: {args.flood_ws} WebSockets + {args.flood_sse} SSE, {args.replay_events:,}-event replays"  # fmt: skip
    for kind in ("ws", "sse"):
        add(fsec, f"{kind} accepted", "conns", lambda t, k=kind: t["flood_opened"][k].get("accepted", 0))  # fmt: skip
        add(fsec, f"{kind} refused too_many_connections", "conns",
            lambda t, k=kind: t["flood_opened"][k].get("too_many_connections", 0))  # fmt: skip
    add(fsec, "refused (gateway metric), reason user", "conns", lambda t: t["refused_user"])
    add(fsec, "refused (gateway metric), reason ip", "conns", lambda t: t["refused_ip"])
    add(
        fsec,
        "WebSocket replays completed during the flood",
        "replays",
        lambda t: t["flood_replays"],
    )
    add(fsec, "replays waiting for a turn (max)", "replays", lambda t: t["replays_waiting_max"])
    add(fsec, "replay turns running (max)", "turns", lambda t: t["replays_running_max"])
    msec = "gateway RSS"
    add(msec, "before the flood", "MB", lambda t: t["rss_before_mb"])
    add(msec, "peak during the flood", "MB", lambda t: t["rss_peak_mb"])
    add(msec, "flood connections closed", "MB", lambda t: t["rss_closed_mb"])
    add(msec, "malloc_trim_s + 2 s later", "MB", lambda t: t["rss_after_mb"])
    return figs
