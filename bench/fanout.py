"""fanout: what one gateway process delivers to 100 and 1,000 WebSocket
clients of one run, next to a raw aiohttp broadcast measured in the same run.

Processes besides NATS and PostgreSQL: the real gateway (`runlog gateway`),
one client process holding every WebSocket (bench/_wsload.py, a lean frame
reader, so that the client is not the bottleneck), the raw aiohttp server
(bench/_rawws.py: `for frame: for ws in conns: await ws.send_str(frame)`),
and this process, which writes the run through the broker
(`RunWriter.append`, the worker's path).

Burst rounds (the baseline's method): the client process is armed with the
cursor every connection must reach; this process appends E token deltas to
the run as fast as the appender commits them (so the gateway gets a few large
live batches); delivered = frames received / (last receipt - first receipt),
as the client process saw them. E x N = --deliveries, with E capped under
the send queue's lag mark, so the gateway sends every event as it is and
never coalesces. The raw server broadcasts E frames of the same shape and
size, read by the same client the same way.

Sustained windows (a live stream): one run streams at R events/s (paced in
5 ms ticks) for --sustain-s; delivered = what the clients received during
that window, per second; whatever is still queued at its end is reported as
backlog (seconds of stream). Each commit of a paced stream carries a few
events, so the gateway gets one small live batch every few milliseconds. The
raw server sends one frame to every connection every 1/R s in the same window.

Figures:
- one-event frames (`"batch": false`), burst, N = --ns: frames/s, gateway /
  raw ratio, gateway CPU µs per frame;
- one-event frames, sustained at --single-rate events/s, N = --sustain-n:
  the same comparison for a live stream;
- multi-event frames (`"batch": true`), N = --sustain-n, sustained at
  --batch-rate events/s: events/s delivered (events covered by the frames
  received, merged deltas included), and its ratio to the raw burst
  one-event-per-frame rate at that N in the same trial; plus the burst variant.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from broker.log import RunWriter
from broker.runtime import Broker

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import NO_CONNECTION_CAPS, GatewayProc, LoadProc, Meter, RawServerProc

# Bytes of a one-event frame of this workload (a text_delta in a run topic),
# to keep a burst's backlog per connection under the gateway's lag mark.
_FRAME_BYTES_EST = 245


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ns", default="100,1000", help="client counts of the burst rounds (default: 100,1000)")  # fmt: skip
    p.add_argument("--deliveries", type=int, default=200_000,
                   help="deliveries per burst round: E = this / N events (default: 200000), "
                   "capped by --max-events")  # fmt: skip
    p.add_argument("--max-events", type=int, default=0,
                   help="most events per burst round (default: what stays under send_queue_lag_bytes)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=2, help="burst rounds per figure per trial (default: 2)")  # fmt: skip
    p.add_argument("--sustain-n", type=int, default=1000, help="clients of the sustained windows (default: 1000; 0: skip)")  # fmt: skip
    p.add_argument("--sustain-s", type=float, default=3.0, help="length of a sustained window (default: 3)")  # fmt: skip
    p.add_argument("--single-rate", type=float, default=100.0,
                   help="events/s of the one-event sustained window (default: 100; 0: skip)")  # fmt: skip
    p.add_argument("--batch-rate", type=float, default=1000.0,
                   help="events/s of the multi-event sustained window (default: 1000; 0: skip)")  # fmt: skip
    p.add_argument("--batch-burst-events", type=int, default=1000,
                   help="events of the multi-event burst round (default: 1000; 0: skip)")  # fmt: skip
    p.add_argument("--no-raw", action="store_true", help="skip the raw aiohttp broadcast")
    p.add_argument("--profile-gateway", type=Path, default=None, metavar="FILE",
                   help="run the gateway under cProfile (slower: figures not comparable); "
                   "pstats written to FILE when it stops")  # fmt: skip


def _ns(args: argparse.Namespace) -> list[int]:
    return [int(x) for x in args.ns.split(",") if x]


class _Ctx:
    def __init__(self, b: Broker, session: str, gw: GatewayProc, raw: RawServerProc | None,
                 load: LoadProc, meter: Meter, args: argparse.Namespace) -> None:  # fmt: skip
        self.b, self.session, self.gw, self.raw = b, session, gw, raw
        self.load, self.meter, self.args = load, meter, args
        self.cap = args.max_events or int(0.8 * b.settings.send_queue_lag_bytes / _FRAME_BYTES_EST)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    per_trial: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        b = await _gw.connect_broker(st)
        gw = await GatewayProc(st, profile=args.profile_gateway, **NO_CONNECTION_CAPS).start()
        raw = None if args.no_raw else await RawServerProc().start()
        load = await LoadProc().start()
        meter.add("gateway", gw.pid)
        meter.add("wsload", load.pid)
        if raw is not None:
            meter.add("raw", raw.pid)
        try:
            session = await b.store.create_session(_gw.USER, "bench fanout")
            c = _Ctx(b, session, gw, raw, load, meter, args)
            for trial in range(args.trials):
                per_trial.append(await _trial(c, trial))
        finally:
            await load.stop()
            if raw is not None:
                await raw.stop()
            await gw.stop()
            await b.close()
    return {
        "servers": versions,
        "events_per_burst_cap": c.cap,
        "figures": _figures(per_trial, args),
        "trials": per_trial,
    }


async def _trial(c: _Ctx, trial: int) -> dict[str, Any]:
    args = c.args
    t: dict[str, Any] = {}

    def say(what: str, r: dict[str, Any], key: str = "frames_s", unit: str = "frames/s") -> None:
        extra = f", backlog {r['backlog_s']:.2f} s" if "backlog_s" in r else ""
        progress(f"trial {trial + 1}: {what}: {r[key]:,.0f} {unit}{extra}")

    ns = _ns(args)
    if args.sustain_n and args.sustain_n not in ns and (args.batch_rate or args.batch_burst_events):
        ns.append(args.sustain_n)  # the raw burst rate the batch figures are compared with
    for n in ns:
        e = max(1, min(c.cap, args.deliveries // n))
        t[f"ws{n}"] = r = await _burst_product(c, n, e, batch=False)
        say(f"gateway burst N={n} E={e}", r)
        if c.raw is not None:
            t[f"raw{n}"] = r = await _burst_raw(c, n, e)
            say(f"raw     burst N={n} E={e}", r)
    n = args.sustain_n
    if n and args.single_rate:
        t["single"] = r = await _sustained_product(c, n, args.single_rate, batch=False)
        say(f"gateway sustained N={n} {args.single_rate:g} events/s", r)
        if c.raw is not None:
            t["single_raw"] = r = await _sustained_raw(c, n, args.single_rate)
            say(f"raw     sustained N={n} {args.single_rate:g} frames/s", r)
    if n and args.batch_rate:
        t["batch"] = r = await _sustained_product(c, n, args.batch_rate, batch=True)
        say(f"gateway sustained N={n} {args.batch_rate:g} events/s, batch frames "
            f"({r['events_per_frame']:.1f}/frame)", r, "events_s", "events/s")  # fmt: skip
    if n and args.batch_burst_events:
        t["batch_burst"] = r = await _burst_product(c, n, args.batch_burst_events, batch=True)
        say(f"gateway burst N={n} E={args.batch_burst_events}, batch frames "
            f"({r['events_per_frame']:.1f}/frame)", r, "events_s", "events/s")  # fmt: skip
    return t


# --- the product -----------------------------------------------------------------


async def _connect_product(c: _Ctx, n: int, batch: bool) -> RunWriter:
    w = await _gw.new_run(c.b, c.session)
    await c.load.call("connect", url=c.gw.ws_url, n=n, token=_gw.token(), protocol="runlog.v1")
    sub = await c.load.call("subscribe", topics=[f"run:{w.run_id}"], batch=batch, after=0)
    if sub["n_errors"]:
        raise RuntimeError(f"subscribe failed: {sub['errors']}")
    await c.load.arm(w.last_seq)  # every client has caught up with run_start
    await c.load.armed_result(60)
    return w


async def _burst_product(c: _Ctx, n: int, e: int, *, batch: bool) -> dict[str, Any]:
    w = await _connect_product(c, n, batch)
    rounds = []
    try:
        for _ in range(c.args.rounds):
            target = w.last_seq + e
            commits0 = _lib.HistogramSnapshot.of(c.b.metrics.batch_events)
            await c.load.arm(target)
            timer = Timer(c.meter)
            timer.start()
            await _gw.append_burst(w, e)
            res = await c.load.armed_result()
            timer.stop()
            commits = _lib.HistogramSnapshot.of(c.b.metrics.batch_events).since(commits0)
            rounds.append(_burst_round(res, timer, n, e, commits.count))
    finally:
        await _gw.end_run(w)
        stats = await c.load.call("stats")
        await c.load.call("close_all")
    out = _median_rounds(rounds)
    out["closes"] = stats["closes"]
    return out


async def _sustained_product(c: _Ctx, n: int, rate: float, *, batch: bool) -> dict[str, Any]:
    w = await _connect_product(c, n, batch)
    try:
        commits0 = _lib.HistogramSnapshot.of(c.b.metrics.batch_events)
        s0 = await c.load.call("stats")
        timer = Timer(c.meter)
        timer.start()
        await _gw.append_paced(w, rate, c.args.sustain_s)
        s1 = await c.load.call("stats")
        timer.stop()
        commits = _lib.HistogramSnapshot.of(c.b.metrics.batch_events).since(commits0)
    finally:
        await _gw.end_run(w)
        await c.load.call("close_all")
    return _window(s0, s1, timer, n, rate, c.args.sustain_s, commits.count)


# --- the raw server --------------------------------------------------------------


async def _connect_raw(c: _Ctx, n: int) -> int:
    assert c.raw is not None
    last: int = (await c.raw.broadcast(0))["last"]
    await c.load.call("connect", url=c.raw.ws_url, n=n, hello=False, cursor=last)
    return last


async def _burst_raw(c: _Ctx, n: int, e: int) -> dict[str, Any]:
    assert c.raw is not None
    last = await _connect_raw(c, n)
    rounds = []
    try:
        for _ in range(c.args.rounds):
            await c.load.arm(last + e)
            timer = Timer(c.meter)
            timer.start()
            bc = await c.raw.broadcast(e)
            res = await c.load.armed_result()
            timer.stop()
            last = bc["last"]
            r = _burst_round(res, timer, n, e, 1)
            r["frame_bytes"] = bc["frame_bytes"]
            r["send_loop_frames_s"] = n * e / (bc["t_end"] - bc["t_start"])
            rounds.append(r)
    finally:
        await c.load.call("close_all")
    return _median_rounds(rounds)


async def _sustained_raw(c: _Ctx, n: int, rate: float) -> dict[str, Any]:
    assert c.raw is not None
    await _connect_raw(c, n)
    try:
        s0 = await c.load.call("stats")
        timer = Timer(c.meter)
        timer.start()
        secs = c.args.sustain_s
        bc = await c.raw.broadcast(int(rate * secs), rate=rate, seconds=secs)
        s1 = await c.load.call("stats")
        timer.stop()
    finally:
        await c.load.call("close_all")
    out = _window(s0, s1, timer, n, rate, secs, bc["sent"])
    out["frames_sent_in_window"] = bc["sent"]
    return out


# --- arithmetic ------------------------------------------------------------------


def _burst_round(
    res: dict[str, Any], timer: Timer, n: int, e: int, batches: float
) -> dict[str, Any]:
    if res["timed_out"] or res["short"]:
        raise RuntimeError(f"round incomplete: {res}")
    span = res["t_last"] - res["t_first"]
    frames, evs = res["frames"], res["events"]
    return {
        "frames": frames,
        "events": evs,
        "expected": n * e,
        "span_s": span,
        "frames_s": frames / span,
        "events_s": evs / span,
        "events_per_frame": evs / frames if frames else float("nan"),
        "live_batches": batches,
        **_cpu(timer, frames, evs),
    }


def _window(
    s0: dict[str, Any], s1: dict[str, Any], timer: Timer, n: int, rate: float, secs: float,
    batches: float,
) -> dict[str, Any]:  # fmt: skip
    span = s1["t"] - s0["t"]
    frames = s1["frames"] - s0["frames"]
    evs = s1["events"] - s0["events"]
    expected = n * int(rate * secs)
    return {
        "rate": rate,
        "expected": expected,
        "frames": frames,
        "events": evs,
        "span_s": span,
        "frames_s": frames / span,
        "events_s": evs / span,
        "events_per_frame": evs / frames if frames else float("nan"),
        "live_batches": batches,
        "events_per_live_batch": int(rate * secs) / batches if batches else float("nan"),
        # What the clients were still missing at the end, in seconds of stream.
        "backlog_s": (expected - evs) / (n * rate),
        "closed": s1["closed"],
        "closes": s1["closes"],
        **_cpu(timer, frames, evs),
    }


def _cpu(timer: Timer, frames: int, evs: int) -> dict[str, float]:
    wall = timer.wall_s
    return {
        "gateway_us_per_frame": timer.us_per(frames, "gateway"),
        "gateway_us_per_event": timer.us_per(evs, "gateway"),
        "raw_us_per_frame": timer.us_per(frames, "raw"),
        "client_us_per_frame": timer.us_per(frames, "wsload"),
        "gateway_cpu_pct": 100 * timer.cpu_s.get("gateway", float("nan")) / wall,
        "raw_cpu_pct": 100 * timer.cpu_s.get("raw", float("nan")) / wall,
        "client_cpu_pct": 100 * timer.cpu_s.get("wsload", float("nan")) / wall,
        "writer_cpu_pct": 100 * timer.cpu_s.get("client", float("nan")) / wall,
        "others_cpu_cores": timer.others_cores(),
    }


def _median_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: _gw.median([r[k] for r in rounds]) for k in rounds[0]}
    out["rounds"] = rounds
    return out


def _figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []
    raw = not args.no_raw

    def add(section: str, name: str, unit: str, key: str, which: str) -> None:
        figs.append(_lib.summarize(section, name, unit, [t[which][key] for t in per_trial]))

    def ratio(section: str, name: str, a: tuple[str, str], b: tuple[str, str]) -> None:
        vals = [t[a[0]][a[1]] / t[b[0]][b[1]] for t in per_trial]
        figs.append(_lib.summarize(section, name, "ratio", vals))

    def cpu(section: str, which: str, raw_which: str | None) -> None:
        add(section, "gateway CPU", "µs/frame", "gateway_us_per_frame", which)
        add(section, "gateway CPU (of one core)", "%", "gateway_cpu_pct", which)
        if raw_which:
            add(section, "raw server CPU", "µs/frame", "raw_us_per_frame", raw_which)
            add(section, "raw server CPU (of one core)", "%", "raw_cpu_pct", raw_which)
        add(section, "client process CPU (of one core)", "%", "client_cpu_pct", which)
        add(section, "host CPU outside our processes", "cores", "others_cpu_cores", which)

    for n in _ns(args):
        sec = f"one-event frames, burst, {n} clients of one run"
        add(sec, "gateway delivered", "frames/s", "frames_s", f"ws{n}")
        if raw:
            add(sec, "raw aiohttp broadcast delivered", "frames/s", "frames_s", f"raw{n}")
            ratio(sec, "gateway / raw", (f"ws{n}", "frames_s"), (f"raw{n}", "frames_s"))
        add(sec, "live batches per round", "batches", "live_batches", f"ws{n}")
        cpu(sec, f"ws{n}", f"raw{n}" if raw else None)
    n = args.sustain_n
    if n and args.single_rate:
        sec = f"one-event frames, sustained {args.single_rate:g} events/s, {n} clients"
        add(sec, "gateway delivered", "frames/s", "frames_s", "single")
        add(sec, "gateway backlog at the end", "s", "backlog_s", "single")
        if raw:
            add(sec, "raw paced broadcast delivered", "frames/s", "frames_s", "single_raw")
            add(sec, "raw backlog at the end", "s", "backlog_s", "single_raw")
            ratio(sec, "gateway / raw", ("single", "frames_s"), ("single_raw", "frames_s"))
        add(sec, "events per live batch", "events", "events_per_live_batch", "single")
        cpu(sec, "single", "single_raw" if raw else None)
    if n and args.batch_rate:
        sec = f'multi-event frames ("batch": true), sustained {args.batch_rate:g} events/s, {n} clients'
        add(sec, "gateway delivered", "events/s", "events_s", "batch")
        add(sec, "gateway delivered", "frames/s", "frames_s", "batch")
        add(sec, "events per frame", "events", "events_per_frame", "batch")
        add(sec, "events per live batch", "events", "events_per_live_batch", "batch")
        add(sec, "backlog at the end", "s", "backlog_s", "batch")
        if raw and f"raw{n}" in per_trial[0]:
            add(sec, f"raw one-event burst, {n} clients", "frames/s", "frames_s", f"raw{n}")
            ratio(sec, "gateway events/s / raw frames/s", ("batch", "events_s"),
                  (f"raw{n}", "frames_s"))  # fmt: skip
        add(sec, "gateway CPU", "µs/event", "gateway_us_per_event", "batch")
        cpu(sec, "batch", None)
    if n and args.batch_burst_events:
        sec = f'multi-event frames ("batch": true), burst of {args.batch_burst_events}, {n} clients'
        add(sec, "gateway delivered", "events/s", "events_s", "batch_burst")
        add(sec, "events per frame", "events", "events_per_frame", "batch_burst")
        if raw and f"raw{n}" in per_trial[0]:
            ratio(sec, "gateway events/s / raw frames/s", ("batch_burst", "events_s"),
                  (f"raw{n}", "frames_s"))  # fmt: skip
        add(sec, "gateway CPU", "µs/event", "gateway_us_per_event", "batch_burst")
    return figs
