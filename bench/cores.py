"""cores: fan-out by 1 and by N gateway processes sharing one port
(`runlog gateway --processes N`), measured in the same run.

Processes besides NATS and PostgreSQL: the gateway group (`runlog gateway
--processes P`: a supervising parent and P children, each a whole gateway,
all bound to one port with SO_REUSEPORT; P = 1 is the lone `runlog gateway`),
--load-procs client processes (bench/_wsload.py) sharing --n WebSockets of
one run between them (one-event frames), and this process, which writes the
run through the broker (`RunWriter.append`, the worker's path). Each trial
runs every P in turn on a fresh group, so noise on a shared host falls on
all of them alike.

Sustained windows per P (--sustain-s each), the run streaming in 5 ms ticks
as a model does (each commit a small live batch):

- cost: --cost-rate events/s, a load every P keeps up with, so every P does
  the same work (the same live batches, the same writes per connection):
  gateway CPU µs per delivered event, psutil user+sys of the whole group
  (parent and children summed) over the window / events the clients received
  in it. Same work, so any difference is the price of being several processes
  (beside it: what the group spends with every client subscribed and nothing
  sent, heartbeats and timers, paid once per process).
- capacity R, for each R of --capacity-rates: R events/s, more than one
  process keeps up with:
  delivered events/s (all clients, all processes) in the window, and the
  backlog left at its end, in seconds of stream.

Why not `bench fanout`'s bursts: a burst's few large live batches cost the
gateway one write per connection each (~0.1 µs per delivered event), so the
load generator is the bottleneck there, not the gateway.

Also per P: cores used by the gateway group, by the load generator, by the
rest of the host and by the whole host; how the kernel spread the connections (each child's own
runlog_gateway_connections, from its metrics port) and the busiest child's
share of the children's CPU. Ratios to P = 1 in the same trial.

On a host with fewer cores than gateway processes + load generator, they
compete: the capacity ratio then measures the host, not the gateway; the
CPU per delivered event is the figure that survives (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from broker.log import RunWriter
from broker.runtime import Broker

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import NO_CONNECTION_CAPS, GatewayGroupProc, GatewayProc, LoadProc, Meter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--processes", default="1,2", help="gateway processes of each configuration (default: 1,2)")  # fmt: skip
    p.add_argument("--n", type=int, default=1000, help="WebSocket clients of the run (default: 1000)")  # fmt: skip
    p.add_argument("--load-procs", type=int, default=1,
                   help="client processes sharing the --n connections (default: 1)")  # fmt: skip
    p.add_argument("--sustain-s", type=float, default=4.0, help="length of each window (default: 4)")  # fmt: skip
    p.add_argument("--cost-rate", type=float, default=20.0,
                   help="events/s of the cost window, kept up with by every P (default: 20)")  # fmt: skip
    p.add_argument("--capacity-rates", default="400,1000",
                   help="events/s of the capacity windows, more than one process keeps up with "
                   "(default: 400,1000; empty: none)")  # fmt: skip


def _processes(args: argparse.Namespace) -> list[int]:
    return [int(x) for x in args.processes.split(",") if x]


def _phases(args: argparse.Namespace) -> list[tuple[str, float]]:
    """(name, events/s) of each window, in order."""
    caps = [float(x) for x in args.capacity_rates.split(",") if x]
    return [("cost", args.cost_rate)] + [(f"capacity {r:g}", r) for r in caps]


class _Ctx:
    def __init__(self, st: _lib.Stack, b: Broker, session: str, loads: list[LoadProc],
                 args: argparse.Namespace) -> None:  # fmt: skip
        self.st, self.b, self.session, self.loads, self.args = st, b, session, loads, args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    per_trial: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        b = await _gw.connect_broker(st)
        loads = [await LoadProc().start() for _ in range(args.load_procs)]
        try:
            session = await b.store.create_session(_gw.USER, "bench cores")
            c = _Ctx(st, b, session, loads, args)
            for trial in range(args.trials):
                t = {}
                for p in _processes(args):
                    t[f"p{p}"] = r = await _configuration(c, p)
                    for phase, _ in _phases(args):
                        progress(f"trial {trial + 1}: {p} gateway process(es), {phase}: "
                                     + _describe(r[phase]) + f", spread {r['spread']}")  # fmt: skip
                per_trial.append(t)
        finally:
            for load in loads:
                await load.stop()
            await b.close()
    return {
        "servers": versions,
        "cpu_count": psutil.cpu_count(),
        "figures": _figures(per_trial, args),
        "trials": per_trial,
    }


def _describe(r: dict[str, Any]) -> str:
    return (f"{r['events_s']:,.0f} events/s (backlog {r['backlog_s']:.2f} s), "
            f"{r['gateway_us_per_event']:.2f} µs gateway CPU/event, gateway "
            f"{r['gateway_cores']:.2f} cores, load {r['load_cores']:.2f} cores, "
            f"others {r['others_cores']:.2f} cores")  # fmt: skip


async def _configuration(c: _Ctx, processes: int) -> dict[str, Any]:
    """Both windows on a fresh group of `processes` gateway processes."""
    if processes == 1:
        gw = await GatewayProc(c.st, None, **NO_CONNECTION_CAPS).start()
    else:
        gw = await GatewayGroupProc(c.st, processes, **NO_CONNECTION_CAPS).start()
    meter = Meter(c.st)
    meter.add_tree("gateway", gw.pid)
    for i, load in enumerate(c.loads):
        meter.add(f"load{i}", load.pid)
    members = gw.member_pids()
    out: dict[str, Any] = {}
    try:
        w = await _connect(c, gw)
        out["spread"] = await _spread(gw)
        try:
            out["idle_cores"] = await _idle(meter, c.args.sustain_s / 2)
            for phase, rate in _phases(c.args):
                await _arm_all(c, w.last_seq, 300.0)  # the last window's backlog, if any
                out[phase] = await _window(c, w, meter, members, rate)
        finally:
            await _gw.end_run(w)
            for load in c.loads:
                await load.call("close_all")
    finally:
        await gw.stop()
    return out


async def _connect(c: _Ctx, gw: GatewayProc) -> RunWriter:
    w = await _gw.new_run(c.b, c.session)
    n, k = c.args.n, len(c.loads)
    for i, load in enumerate(c.loads):
        share = n // k + (1 if i < n % k else 0)
        await load.call("connect", url=gw.ws_url, n=share, token=_gw.token(), protocol="runlog.v1")
        sub = await load.call("subscribe", topics=[f"run:{w.run_id}"], batch=False, after=0)
        if sub["n_errors"]:
            raise RuntimeError(f"subscribe failed: {sub['errors']}")
    await _arm_all(c, w.last_seq)  # every client has caught up with run_start
    return w


async def _arm_all(c: _Ctx, target: int, timeout_s: float = 120.0) -> None:
    for load in c.loads:
        await load.arm(target, timeout_s)
    for res in await asyncio.gather(*(load.armed_result(timeout_s + 60) for load in c.loads)):
        if res["timed_out"] or res["short"]:
            raise RuntimeError(f"clients did not catch up: {res}")


async def _idle(meter: Meter, secs: float) -> float:
    """Cores the gateway group uses with every client subscribed and nothing sent
    (heartbeats, timers, the parent): paid once per process."""
    timer = Timer(meter)
    timer.start()
    await asyncio.sleep(secs)
    timer.stop()
    return timer.cpu_s["gateway"] / timer.wall_s


async def _stats(c: _Ctx) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(load.call("stats") for load in c.loads)))


async def _window(
    c: _Ctx, w: RunWriter, meter: Meter, members: list[int], rate: float
) -> dict[str, Any]:
    secs = c.args.sustain_s
    s0 = await _stats(c)
    cpu0 = _member_cpu(members)
    timer = Timer(meter)
    timer.start()
    await _gw.append_paced(w, rate, secs)
    s1 = await _stats(c)
    timer.stop()
    cpu1 = _member_cpu(members)
    span = max(b["t"] for b in s1) - min(a["t"] for a in s0)
    events = sum(b["events"] - a["events"] for a, b in zip(s0, s1, strict=True))
    frames = sum(b["frames"] - a["frames"] for a, b in zip(s0, s1, strict=True))
    closed = sum(b["closed"] for b in s1)
    if closed:
        raise RuntimeError(
            f"{closed} connections closed in the window: {[b['closes'] for b in s1]}"
        )
    expected = c.args.n * int(rate * secs)
    wall = timer.wall_s
    member_s = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
    load_s = sum(timer.cpu_s[f"load{i}"] for i in range(len(c.loads)))
    return {
        "rate": rate,
        "events": events,
        "frames": frames,
        "events_per_frame": events / frames if frames else float("nan"),
        "expected": expected,
        "span_s": span,
        "events_s": events / span,
        # What the clients were still missing at the end, in seconds of stream.
        "backlog_s": (expected - events) / (c.args.n * rate),
        "gateway_us_per_event": timer.us_per(events, "gateway"),
        "gateway_cores": timer.cpu_s["gateway"] / wall,
        "load_cores": load_s / wall,
        "load_us_per_event": load_s * 1e6 / events if events else float("nan"),
        "writer_cores": timer.cpu_s["client"] / wall,
        "others_cores": timer.others_cores(),
        "host_cores": timer.cpu_s["host"] / wall,  # everything: ours, NATS, PostgreSQL, others
        # The busiest child's share of the children's CPU (1/P: even).
        "busiest_member_share": max(member_s) / sum(member_s) if sum(member_s) else float("nan"),
    }


def _member_cpu(pids: list[int]) -> list[float]:
    out = []
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        out.append(t.user + t.system)
    return out


async def _spread(gw: GatewayProc) -> list[int]:
    """Open WebSockets of each child (its own /metrics); [n] for a lone gateway."""
    if not gw.metrics_ports:
        return []
    out = []
    async with aiohttp.ClientSession() as http:
        for port in gw.metrics_ports:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
            ws = 0
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == "runlog_gateway_connections" and s.labels.get("kind") == "ws":
                        ws = int(s.value)
            out.append(ws)
    return out


def _figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []
    ps = _processes(args)
    base = ps[0]
    for phase, rate in _phases(args):
        for p in ps:
            sec = (f"{phase}: {p} gateway process{'es' if p > 1 else ''}, {args.n} clients of one "
                   f"run, {rate:g} events/s sustained, one-event frames")  # fmt: skip
            key = f"p{p}"

            def add(name: str, unit: str, field: str, key: str = key, sec: str = sec,
                    phase: str = phase) -> None:  # fmt: skip
                vals = [t[key][phase][field] for t in per_trial]
                figs.append(_lib.summarize(sec, name, unit, vals))

            add("delivered (all processes)", "events/s", "events_s")
            add("backlog at the end", "s", "backlog_s")
            add("gateway CPU (all processes summed)", "µs/event", "gateway_us_per_event")
            add("gateway CPU", "cores", "gateway_cores")
            vals = [t[key]["idle_cores"] for t in per_trial]
            figs.append(_lib.summarize(sec, "gateway CPU, subscribed but idle", "cores", vals))
            if p > 1:
                add("busiest process's share of the gateway CPU", "fraction",
                    "busiest_member_share")  # fmt: skip
                vals = [min(t[key]["spread"]) / args.n for t in per_trial]
                figs.append(
                    _lib.summarize(sec, "fewest connections on one process", "fraction", vals)
                )
            add("load generator CPU", "cores", "load_cores")
            add("load generator CPU", "µs/event", "load_us_per_event")
            add("writer (this process) CPU", "cores", "writer_cores")
            add("host CPU outside our processes", "cores", "others_cores")
            add(f"whole host CPU (of {psutil.cpu_count()})", "cores", "host_cores")
            if p != base:
                b = f"p{base}"
                for name, field in (("delivered events/s", "events_s"),
                                    ("gateway CPU per event", "gateway_us_per_event")):  # fmt: skip
                    vals = [t[key][phase][field] / t[b][phase][field] for t in per_trial]
                    figs.append(_lib.summarize(sec, f"{name} / {base} process", "ratio", vals))
    return figs
