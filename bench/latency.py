"""latency: event committed → WebSocket client receives it, at a steady
--rate events/s spread over --runs runs, with --clients clients (one run
each, one-event frames), through a real gateway process.

This process is the worker: it owns the runs and appends paced token deltas
(`RunWriter.append`), each run at rate/runs events/s with a random phase.
Times are wall-clock (CLOCK_REALTIME, shared by every process on the
machine), kept at full precision:

- append: just before `append()` (which sets the event's `ts`, a ms figure);
- commit: when the appender's transaction returned (a hook on the appender's
  after-commit step, in this process), for every event of the batch;
- receive: when the client process read the frame from its socket.

Figures: commit → receive (what the guarantee "durable before visible" costs
a watcher on top of the commit), append → receive (what a watcher sees from
the model's token to the screen: commit batching included), append → commit.
Events appended in the first --warmup-s are left out. CPU: psutil user+sys
of the gateway process (and of the raw server) over the streaming phase,
per event frame the clients received ("µs/delivery").

Raw reference, same run, same servers: a raw relay. The raw aiohttp server
holds a core-NATS subscription; this process publishes one frame per event
(same rate, same spread over 100 topics) with core NATS, the raw server
sends each to its topic's connections (`await ws.send_str(frame)`), the same
client process reads them. publish → receive is the floor of the product's
commit → receive path (JetStream publish, NATS, gateway, socket), and
its CPU per delivery the floor of the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nats

from broker import events
from broker.log import RunWriter

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import NO_CONNECTION_CAPS, GatewayProc, LoadProc, Meter, RawServerProc
from ._rawws import RELAY_SUBJECT_PREFIX, delta_payload, event_frame


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rate", type=float, default=1000.0, help="events/s in all (default: 1000)")
    p.add_argument("--runs", type=int, default=100, help="runs the rate is spread over (default: 100)")  # fmt: skip
    p.add_argument("--sessions", type=int, default=10, help="sessions of the runs (default: 10)")
    p.add_argument("--clients", type=int, default=100,
                   help="WebSocket clients, each following one run (cycled) (default: 100)")  # fmt: skip
    p.add_argument("--seconds", type=float, default=15.0, help="measured stream per trial (default: 15)")  # fmt: skip
    p.add_argument("--warmup-s", type=float, default=1.0, help="left out at the start (default: 1)")  # fmt: skip
    p.add_argument("--batch", action="store_true", help='clients subscribe with "batch": true')
    p.add_argument("--no-raw", action="store_true", help="skip the raw relay")
    p.add_argument("--flush-interval-ms", type=float, default=None,
                   help="the appender's flush_interval_ms (default: the setting's default)")  # fmt: skip
    p.add_argument("--profile-gateway", type=Path, default=None, metavar="FILE",
                   help="run the gateway under cProfile (CPU time); pstats to FILE")  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    per_trial: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        overrides = {} if args.flush_interval_ms is None else {
            "flush_interval_ms": args.flush_interval_ms}  # fmt: skip
        b = await _gw.connect_broker(st, **overrides)
        gw = await GatewayProc(st, profile=args.profile_gateway, **NO_CONNECTION_CAPS).start()
        raw = None if args.no_raw else await RawServerProc(nats_url=st.nats_url).start()
        load = await LoadProc().start()
        meter.add("gateway", gw.pid)
        meter.add("wsload", load.pid)
        if raw is not None:
            meter.add("raw", raw.pid)
        commits: list[tuple[str, int, int, float]] = []
        hook_commits(b, commits)
        try:
            sessions = [
                await b.store.create_session(_gw.USER, "bench latency")
                for _ in range(args.sessions)
            ]
            for trial in range(args.trials):
                t: dict[str, Any] = {}
                commits.clear()
                t["product"] = r = await _product(b, sessions, gw, load, meter, args, commits)
                progress(f"trial {trial + 1}: commit → receive p50 {r['commit_p50_ms']:.2f} ms, "
                         f"p99 {r['commit_p99_ms']:.2f} ms; append → receive p50 "
                         f"{r['append_p50_ms']:.2f} ms, p99 {r['append_p99_ms']:.2f} ms")  # fmt: skip
                if raw is not None:
                    t["raw"] = r = await _raw(st.nats_url, raw, load, meter, args)
                    progress(f"trial {trial + 1}: raw relay publish → receive p50 "
                             f"{r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")  # fmt: skip
                per_trial.append(t)
        finally:
            await load.stop()
            if raw is not None:
                await raw.stop()
            await gw.stop()
            await b.close()
    return {"servers": versions, "figures": _figures(per_trial, args), "trials": per_trial}


def hook_commits(b: Any, out: list[tuple[str, int, int, float]]) -> None:
    """Record (run_id, first seq, last seq, wall time) when each transaction
    returned, before the live publish is queued. Wraps a private step of the
    appender (broker/log.py `_after_commit`): if it is renamed, this fails loudly."""
    appender = b.appender
    original: Callable[..., None] = appender._after_commit

    def after_commit(groups: dict[Any, list[Any]], accepted: dict[Any, int], batch: Any) -> None:
        t = time.time()
        for w in accepted:
            entries = groups[w]
            out.append((w.run_id, entries[0].seq, entries[-1].seq, t))
        original(groups, accepted, batch)

    setattr(appender, "_after_commit", after_commit)  # noqa: B010


def match_latencies(
    appended: dict[tuple[str, int], float],
    commits: list[tuple[str, int, int, float]],
    received: list[tuple[str, int, float]],
    since: float,
    until: float = float("inf"),
) -> tuple[list[float], list[float], list[float], int]:
    """Commit → receive, append → receive and append → commit (ms, sorted)
    of the events appended in [since, until], and how many of them were not
    received. `appended`: (run_id, seq) → append time; `commits`: what
    `hook_commits` recorded; `received`: (run_id, seq, time), the first
    receipt of an event counting when several clients follow its run."""
    committed: dict[tuple[str, int], float] = {}
    for run_id, first, last, t in commits:
        for seq in range(first, last + 1):
            committed[(run_id, seq)] = t
    first_receipt: dict[tuple[str, int], float] = {}
    for run_id, seq, t in received:
        first_receipt.setdefault((run_id, seq), t)
    lat_commit, lat_append, append_commit = [], [], []
    missing = 0
    for key, ta in appended.items():
        if ta < since or ta > until:
            continue
        tr = first_receipt.get(key)
        tc = committed.get(key)
        if tr is None or tc is None:
            missing += 1
            continue
        lat_commit.append((tr - tc) * 1e3)
        lat_append.append((tr - ta) * 1e3)
        append_commit.append((tc - ta) * 1e3)
    lat_commit.sort()
    lat_append.sort()
    append_commit.sort()
    return lat_commit, lat_append, append_commit, missing


async def _product(
    b: Any,
    sessions: list[str],
    gw: GatewayProc,
    load: LoadProc,
    meter: Meter,
    args: argparse.Namespace,
    commits: list[tuple[str, int, int, float]],
) -> dict[str, Any]:
    writers: list[RunWriter] = [
        await _gw.new_run(b, sessions[i % len(sessions)]) for i in range(args.runs)
    ]
    await load.call("connect", url=gw.ws_url, n=args.clients, token=_gw.token(),
                    protocol="runlog.v1")  # fmt: skip
    try:
        sub = await load.call(
            "subscribe", topics=[f"run:{w.run_id}" for w in writers], batch=args.batch, after=0
        )
        if sub["n_errors"]:
            raise RuntimeError(f"subscribe failed: {sub['errors']}")
        await load.arm(1)
        await load.armed_result(60)
        await load.call("record", on=True)
        appended: dict[tuple[str, int], float] = {}
        commits_before = _lib.HistogramSnapshot.of(b.metrics.batch_events)
        commit_s_before = _lib.HistogramSnapshot.of(b.metrics.commit_seconds)
        timer = Timer(meter)
        timer.start()
        t_start = time.time()
        per_run = args.rate / args.runs
        await asyncio.gather(
            *(_stream(w, per_run, args.seconds, appended) for w in writers)
        )  # fmt: skip
        timer.stop()
        await asyncio.sleep(0.5)  # the last events reach the clients
        records = (await load.call("dump"))["records"]
        batches = _lib.HistogramSnapshot.of(b.metrics.batch_events).since(commits_before)
        commit_s = _lib.HistogramSnapshot.of(b.metrics.commit_seconds).since(commit_s_before)
    finally:
        for w in writers:
            await w.append(events.RunEnd(status="completed"))
        await asyncio.gather(*(w.flush() for w in writers))
        await load.call("close_all")

    received = [(topic[4:], cursor, t) for topic, cursor, t in records]  # "run:<id>"
    lat_commit, lat_append, append_commit, missing = match_latencies(
        appended, commits, received, t_start + args.warmup_s
    )
    q = _lib.quantile
    n_events = len(appended)
    return {
        "events": n_events,
        "measured": len(lat_commit),
        "missing": missing,
        "events_s": n_events / timer.wall_s,
        "commit_p50_ms": q(lat_commit, 0.5),
        "commit_p90_ms": q(lat_commit, 0.9),
        "commit_p99_ms": q(lat_commit, 0.99),
        "commit_p999_ms": q(lat_commit, 0.999),
        "commit_max_ms": lat_commit[-1] if lat_commit else float("nan"),
        "append_p50_ms": q(lat_append, 0.5),
        "append_p99_ms": q(lat_append, 0.99),
        "append_commit_p50_ms": q(append_commit, 0.5),
        "append_commit_p99_ms": q(append_commit, 0.99),
        "events_per_transaction": batches.sum / batches.count if batches.count else float("nan"),
        "transaction_ms_mean": commit_s.stats()["mean"] * 1e3,
        "gateway_cpu_pct": 100 * timer.cpu_s["gateway"] / timer.wall_s,
        "deliveries": len(records),
        "gateway_us_per_event": timer.us_per(len(records), "gateway"),
        "writer_cpu_pct": 100 * timer.cpu_s["client"] / timer.wall_s,
        "others_cpu_cores": timer.others_cores(),
    }


async def _stream(
    w: RunWriter, rate: float, seconds: float, appended: dict[tuple[str, int], float]
) -> None:
    """One run's tokens at `rate`/s, starting at a random phase."""
    loop = asyncio.get_running_loop()
    period = 1.0 / rate
    start = loop.time() + random.random() * period
    n = int(rate * seconds)
    tokens = _lib.TOKENS
    for i in range(n):
        delay = start + i * period - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        t = time.time()
        seq = await w.append(events.TextDelta(message_id="m_0001", delta=tokens[i % len(tokens)]))
        appended[(w.run_id, seq)] = t
    await w.flush()


async def _raw(
    nats_url: str, raw: RawServerProc, load: LoadProc, meter: Meter, args: argparse.Namespace
) -> dict[str, Any]:
    topics = args.runs
    for k in range(args.clients):
        await load.call("connect", url=f"{raw.ws_url}?topic={k % topics}", n=1, hello=False)
    nc = await nats.connect(nats_url, name="runlog-bench-rawpub")
    try:
        await load.call("record", on=True)
        published: dict[tuple[str, int], float] = {}
        seconds = min(args.seconds, 10.0)
        loop = asyncio.get_running_loop()
        period = topics / args.rate

        async def stream(k: int) -> None:
            start = loop.time() + random.random() * period
            ts = int(time.time() * 1000)
            for i in range(int(seconds / period)):
                delay = start + i * period - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                frame = event_frame(f"raw:{k}", i + 1, delta_payload(i + 1, ts))
                published[(str(k), i + 1)] = time.time()
                await nc.publish(f"{RELAY_SUBJECT_PREFIX}{k}", frame)

        timer = Timer(meter)
        timer.start()
        t_start = time.time()
        await asyncio.gather(*(stream(k) for k in range(topics)))
        await nc.flush()
        timer.stop()
        await asyncio.sleep(0.5)
        records = (await load.call("dump"))["records"]
    finally:
        await nc.close()
        await load.call("close_all")
    received: dict[tuple[str, int], float] = {}
    for topic, cursor, t in records:
        received.setdefault((topic[4:], cursor), t)
    lat = sorted(
        (received[key] - tp) * 1e3
        for key, tp in published.items()
        if tp >= t_start + args.warmup_s and key in received
    )
    q = _lib.quantile
    return {
        "published": len(published),
        "measured": len(lat),
        "p50_ms": q(lat, 0.5),
        "p90_ms": q(lat, 0.9),
        "p99_ms": q(lat, 0.99),
        "p999_ms": q(lat, 0.999),
        "max_ms": lat[-1] if lat else float("nan"),
        "raw_cpu_pct": 100 * timer.cpu_s["raw"] / timer.wall_s,
        "raw_us_per_event": timer.us_per(len(records), "raw"),
        "others_cpu_cores": timer.others_cores(),
    }


def _figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []

    def add(section: str, name: str, unit: str, which: str, key: str) -> None:
        figs.append(_lib.summarize(section, name, unit, [t[which][key] for t in per_trial]))

    sec = (f"{args.rate:g} events/s over {args.runs} runs, {args.clients} clients "
           f"({'batch' if args.batch else 'one-event'} frames)")  # fmt: skip
    add(sec, "commit → receive p50", "ms", "product", "commit_p50_ms")
    add(sec, "commit → receive p90", "ms", "product", "commit_p90_ms")
    add(sec, "commit → receive p99", "ms", "product", "commit_p99_ms")
    add(sec, "commit → receive p99.9", "ms", "product", "commit_p999_ms")
    add(sec, "commit → receive max", "ms", "product", "commit_max_ms")
    add(sec, "append → receive p50", "ms", "product", "append_p50_ms")
    add(sec, "append → receive p99", "ms", "product", "append_p99_ms")
    add(sec, "append → commit p50", "ms", "product", "append_commit_p50_ms")
    add(sec, "append → commit p99", "ms", "product", "append_commit_p99_ms")
    add(sec, "events per transaction", "events", "product", "events_per_transaction")
    add(sec, "append transaction, mean", "ms", "product", "transaction_ms_mean")
    add(sec, "events measured", "events", "product", "measured")
    add(sec, "events not received", "events", "product", "missing")
    add(sec, "gateway CPU (of one core)", "%", "product", "gateway_cpu_pct")
    add(sec, "gateway CPU", "µs/delivery", "product", "gateway_us_per_event")
    add(sec, "writer process CPU (of one core)", "%", "product", "writer_cpu_pct")
    add(sec, "host CPU outside our processes", "cores", "product", "others_cpu_cores")
    if not args.no_raw:
        sec = "raw relay (core NATS → aiohttp send_str), same rate and clients"
        add(sec, "publish → receive p50", "ms", "raw", "p50_ms")
        add(sec, "publish → receive p90", "ms", "raw", "p90_ms")
        add(sec, "publish → receive p99", "ms", "raw", "p99_ms")
        add(sec, "publish → receive p99.9", "ms", "raw", "p999_ms")
        add(sec, "publish → receive max", "ms", "raw", "max_ms")
        add(sec, "raw server CPU (of one core)", "%", "raw", "raw_cpu_pct")
        add(sec, "raw server CPU", "µs/delivery", "raw", "raw_us_per_event")
        add(sec, "host CPU outside our processes", "cores", "raw", "others_cpu_cores")
    return figs
