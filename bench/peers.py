"""peers: server CPU per delivered event of the gateway's fan-out next to the
two peers a team would pick instead, at 100, 1,000 and 10,000 clients, in
the same run, read by the same client process.

Servers, each its own process, all running for the whole benchmark:
- runlog: the real gateway (`runlog gateway`), behind it the stack's
  nats-server and PostgreSQL; this process writes one run through the broker
  (`RunWriter.append`, the worker's path), token deltas as fast as the
  appender commits them. Measured twice: clients subscribed with
  `"batch": true` (multi-event frames) and with `"batch": false` (one event
  per frame, E capped under the send queue's lag mark so that nothing is
  coalesced).
- nats-server WS: a private nats-server (the embedded binary) with its own
  WebSocket listener (`websocket { port, no_tls: true }`): "just expose NATS
  to browsers". Each client speaks the NATS text protocol over the
  WebSocket (CONNECT, SUB, PING/PONG); this process publishes with nats-py
  on the TCP port (`publish` E times, then `flush`). nats-server puts
  several MSGs in one frame when a client has more than one pending.
- python-socketio on aiohttp (bench/_sioserver.py): every client in one room,
  `await sio.emit("event", ev, to=room)` E times; one event per frame.

The events are the same everywhere: the workload's `text_delta` JSON
(~165 bytes; bench/_rawws.py `delta_payload`), inside each protocol's own
envelope. The client is one bench/_wsload.py process holding all N
WebSockets (a lean frame reader: runlog's protocol, the NATS text protocol,
or Engine.IO/Socket.IO framing), opened from --sources loopback addresses.

Per N and server: N connections are opened (and, for runlog, subscribed to
a fresh run), then one round per trial over the same connections: the
client is armed with the count every connection must reach, E events are
published, and the round ends when every connection has them.
E = --deliveries / N (--sio-deliveries / N for python-socketio, whose
rounds take ~100 µs per delivery). Figures per round:
- server CPU µs per delivered event: user+sys CPU of the server process
  (all threads; read from /proc/PID/task/*/schedstat, the same time psutil
  reports but in ns rather than 10 ms ticks) over the round ÷ events
  delivered to all clients
  (the gateway only; the stack's nats-server and PostgreSQL beside it as
  "behind the gateway", which is per event, not per delivery);
- delivered events/s: events received by all clients ÷ (last receipt -
  first receipt), as the client process saw them (bounded by the client
  process on this 2-core machine: its CPU is printed too).

Goals (issue 13): runlog with multi-event frames ≤ nats-server WS, and
runlog with one event per frame ≤ 1/5 of python-socketio, in server CPU per
delivered event.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import nats

from broker.runtime import Broker

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import (
    NO_CONNECTION_CAPS,
    GatewayProc,
    LoadProc,
    Meter,
    NatsWsServer,
    SioServerProc,
)
from ._rawws import delta_payload

SYSTEMS = ("batch", "single", "nats", "sio")
NAMES = {
    "batch": 'runlog, multi-event frames ("batch": true)',
    "single": 'runlog, one event per frame ("batch": false)',
    "nats": "nats-server WebSocket",
    "sio": "python-socketio (aiohttp)",
}
SERVER = {"batch": "gateway", "single": "gateway", "nats": "natsws", "sio": "sio"}
SUBJECT = "fan"
# Bytes of a one-event frame of this workload, to keep a round's backlog per
# connection under the gateway's lag mark (as bench fanout does).
_FRAME_BYTES_EST = 245


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ns", default="100,1000,10000", help="client counts (default: 100,1000,10000)")  # fmt: skip
    p.add_argument("--deliveries", type=int, default=200_000,
                   help="deliveries per round of runlog and nats-server: E = this / N (default: 200000)")  # fmt: skip
    p.add_argument("--sio-deliveries", type=int, default=40_000,
                   help="deliveries per round of python-socketio (default: 40000)")  # fmt: skip
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help=f"which to measure (default: {','.join(SYSTEMS)})")  # fmt: skip
    p.add_argument("--sources", type=int, default=32, help="client source addresses (default: 32)")  # fmt: skip
    p.add_argument("--profile-gateway", type=Path, default=None, metavar="FILE",
                   help="run the gateway under cProfile (slower: figures not comparable); "
                   "pstats written to FILE when it stops")  # fmt: skip


class _Ctx:
    def __init__(self, b: Broker, session: str, gw: GatewayProc, natsws: NatsWsServer,
                 sio: SioServerProc, load: LoadProc, meter: Meter, nc: Any,
                 args: argparse.Namespace) -> None:  # fmt: skip
        self.b, self.session, self.gw, self.natsws, self.sio = b, session, gw, natsws, sio
        self.load, self.meter, self.nc, self.args = load, meter, nc, args
        self.cap = int(0.8 * b.settings.send_queue_lag_bytes / _FRAME_BYTES_EST)

    async def connect(self, url: str, n: int, **kw: Any) -> None:
        await self.load.call("connect", url=url, n=n, sources=self.args.sources, timeout_s=600,
                             **kw)  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    systems = [s for s in args.systems.split(",") if s]
    ns = [int(x) for x in args.ns.split(",") if x]
    per_trial: list[dict[str, Any]] = [{} for _ in range(args.trials)]
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        b = await _gw.connect_broker(st)
        gw = await GatewayProc(st, profile=args.profile_gateway, **NO_CONNECTION_CAPS).start()
        natsws = NatsWsServer()
        await natsws.start()
        sio = await SioServerProc().start()
        load = await LoadProc().start()
        nc = await nats.connect(natsws.url, name="runlog-bench-peers", pending_size=64 * 1024**2)
        for name, pid in (("gateway", gw.pid), ("natsws", natsws.pid), ("sio", sio.pid),
                          ("wsload", load.pid)):  # fmt: skip
            meter.add(name, pid, precise=True)
        try:
            session = await b.store.create_session(_gw.USER, "bench peers")
            c = _Ctx(b, session, gw, natsws, sio, load, meter, nc, args)
            for n in ns:
                for system in systems:
                    rounds = await _MEASURE[system](c, n)
                    for t, r in zip(per_trial, rounds, strict=True):
                        t[f"{system}{n}"] = r
                    med = _gw.median([r["server_us_per_event"] for r in rounds])
                    eps = _gw.median([r["events_s"] for r in rounds])
                    progress(f"N={n} {NAMES[system]}: E={rounds[0]['events_per_round']}, "
                             f"{med:.2f} µs server CPU/event, {eps:,.0f} events/s, "
                             f"{_gw.median([r['events_per_frame'] for r in rounds]):.1f} events/frame")  # fmt: skip
        finally:
            await nc.close()
            await load.stop()
            await sio.stop()
            await natsws.stop()
            await gw.stop(timeout_s=60)
            await b.close()
    return {
        "servers": versions,
        "events_per_round_cap_single": c.cap,
        "figures": _figures(per_trial, ns, systems),
        "trials": per_trial,
    }


# --- the servers -----------------------------------------------------------------


async def _runlog(c: _Ctx, n: int, batch: bool) -> list[dict[str, Any]]:
    e = max(1, c.args.deliveries // n)
    if not batch:
        e = min(e, c.cap)
    w = await _gw.new_run(c.b, c.session)
    rounds = []
    try:
        await c.connect(c.gw.ws_url, n, token=_gw.token(), protocol="runlog.v1")
        sub = await c.load.call("subscribe", topics=[f"run:{w.run_id}"], batch=batch, after=0,
                                timeout_s=600)  # fmt: skip
        if sub["n_errors"]:
            raise RuntimeError(f"subscribe failed: {sub['errors']}")
        await c.load.arm(w.last_seq)  # every client has caught up with run_start
        await c.load.armed_result(120)
        for _ in range(c.args.trials):
            await c.load.arm(w.last_seq + e)
            timer = Timer(c.meter)
            timer.start()
            await _gw.append_burst(w, e)
            res = await c.load.armed_result()
            timer.stop()
            rounds.append(_round(res, timer, n, e, "gateway"))
    finally:
        await _gw.end_run(w)
        await c.load.call("close_all")
    return rounds


async def _batch(c: _Ctx, n: int) -> list[dict[str, Any]]:
    return await _runlog(c, n, batch=True)


async def _single(c: _Ctx, n: int) -> list[dict[str, Any]]:
    return await _runlog(c, n, batch=False)


async def _nats(c: _Ctx, n: int) -> list[dict[str, Any]]:
    e = max(1, c.args.deliveries // n)
    rounds = []
    try:
        await c.connect(c.natsws.ws_url, n, proto="nats", subject=SUBJECT)
        held = await c.natsws.connections()
        if held < n:
            raise RuntimeError(f"nats-server holds {held} of {n} connections")
        sent = 0
        for _ in range(c.args.trials):
            ts = int(time.time() * 1000)
            payloads = [delta_payload(sent + i + 1, ts) for i in range(e)]
            await c.load.arm(sent + e)
            timer = Timer(c.meter)
            timer.start()
            for p in payloads:
                await c.nc.publish(SUBJECT, p)
            await c.nc.flush()
            res = await c.load.armed_result()
            timer.stop()
            sent += e
            rounds.append(_round(res, timer, n, e, "natsws"))
    finally:
        await c.load.call("close_all")
    return rounds


async def _sio(c: _Ctx, n: int) -> list[dict[str, Any]]:
    e = max(1, c.args.sio_deliveries // n)
    rounds = []
    try:
        await c.connect(c.sio.ws_url, n, proto="sio")
        held = await c.sio.connections()
        if held < n:
            raise RuntimeError(f"python-socketio holds {held} of {n} connections in the room")
        sent = 0
        for _ in range(c.args.trials):
            await c.load.arm(sent + e, timeout_s=600)
            timer = Timer(c.meter)
            timer.start()
            await c.sio.broadcast(e)
            res = await c.load.armed_result(600)
            timer.stop()
            sent += e
            rounds.append(_round(res, timer, n, e, "sio"))
    finally:
        await c.load.call("close_all")
        await _wait_sio_empty(c)
    return rounds


async def _wait_sio_empty(c: _Ctx, timeout_s: float = 60.0) -> None:
    """Its disconnect handlers run after we close: let them, before the next
    server's round is measured."""
    async with asyncio.timeout(timeout_s):
        while await c.sio.connections():
            await asyncio.sleep(0.2)


_MEASURE = {"batch": _batch, "single": _single, "nats": _nats, "sio": _sio}


# --- arithmetic ------------------------------------------------------------------


def _round(res: dict[str, Any], timer: Timer, n: int, e: int, server: str) -> dict[str, Any]:
    if res["timed_out"] or res["short"]:
        raise RuntimeError(f"round incomplete: {res}")
    span = res["t_last"] - res["t_first"]
    frames, evs = res["frames"], res["events"]
    if evs != n * e:
        raise RuntimeError(f"{evs} events delivered, expected {n * e}: {res}")
    wall = timer.wall_s
    behind = timer.cpu_s.get("nats", float("nan")) + timer.cpu_s.get("postgres", float("nan"))
    return {
        "events_per_round": e,
        "events": evs,
        "frames": frames,
        "span_s": span,
        "events_s": evs / span if span > 0 else float("nan"),
        "events_per_frame": evs / frames if frames else float("nan"),
        "server_us_per_event": timer.us_per(evs, server),
        "server_cores": timer.cpu_s.get(server, float("nan")) / wall,
        "behind_us_per_event": behind * 1e6 / evs if server == "gateway" else float("nan"),
        "client_us_per_event": timer.us_per(evs, "wsload"),
        "client_cores": timer.cpu_s.get("wsload", float("nan")) / wall,
        "others_cpu_cores": timer.others_cores(),
    }


def _figures(per_trial: list[dict[str, Any]], ns: list[int], systems: list[str]) -> list[Figure]:
    figs: list[Figure] = []

    def add(section: str, name: str, unit: str, which: str, key: str) -> None:
        figs.append(_lib.summarize(section, name, unit, [t[which][key] for t in per_trial]))

    def ratio(section: str, name: str, a: str, b: str) -> None:
        k = "server_us_per_event"
        figs.append(_lib.summarize(section, name, "ratio", [t[a][k] / t[b][k] for t in per_trial]))

    for n in ns:
        sec = f"{n:,} clients of one stream, burst"
        for s in systems:
            w = f"{s}{n}"
            add(sec, f"{NAMES[s]}: server CPU", "µs/event", w, "server_us_per_event")
        for s in systems:
            w = f"{s}{n}"
            add(sec, f"{NAMES[s]}: delivered", "events/s", w, "events_s")
        for s in systems:
            w = f"{s}{n}"
            add(sec, f"{NAMES[s]}: events per frame", "events", w, "events_per_frame")
            add(sec, f"{NAMES[s]}: events per round", "events", w, "events_per_round")
        for s in systems:
            w = f"{s}{n}"
            add(sec, f"{NAMES[s]}: client process CPU", "cores", w, "client_cores")
        for s in ("batch", "single"):
            if s in systems:
                add(sec, f"{NAMES[s]}: stack nats-server + PostgreSQL CPU", "µs/event",
                    f"{s}{n}", "behind_us_per_event")  # fmt: skip
        if "batch" in systems and "nats" in systems:
            ratio(
                sec, "runlog multi-event / nats-server WS CPU (goal ≤ 1)", f"batch{n}", f"nats{n}"
            )
        if "single" in systems and "sio" in systems:
            ratio(sec, "runlog one-event / python-socketio CPU (goal ≤ 0.2)", f"single{n}",
                  f"sio{n}")  # fmt: skip
        add(sec, "host CPU outside our processes", "cores", f"{systems[0]}{n}", "others_cpu_cores")
    return figs
