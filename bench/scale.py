"""scale: --conns (100k) idle subscribed WebSockets over a gateway group on
this machine, then a restart of the group and the reconnect storm.

Setup: `runlog gateway --processes P` (P = --gateway-processes, default
ceil(conns / 15,000) and at least 2, so each process stays under the 20,000
open files RLIMIT_NOFILE allows here), and C client processes
(bench/_stormload.py, at most ~15,000 clients each), whose connections
come from source addresses 127.0.0.2 … 127.0.0.(1 + --sources) so that no
one address runs out of ephemeral ports. Each client subscribes to one of
--sessions sessions (round robin) from cursor 0; each session holds one
run.

Figures:
- open: the time to open, authenticate and subscribe every client, until
  every catch-up replay has ended on every process; the gateways' RSS
  (the sum over the group's processes, after minus before) and the clients'
  per connection.
- storm: a writer in this process appends --rate events/s (round robin
  over the sessions) from before the restart to the end. The group gets
  SIGTERM (every process drains: `disconnect server_draining` with
  cursors), exits, and is started again on the same port. Every client
  reconnects on its own with exponential backoff and full jitter
  (bench/_stormload.py: uniform(0, min(10 s, 250 ms * 2^attempt)), the
  shipped browser client's policy) and resubscribes from its cursor. Time
  from SIGTERM to the last client live again (`subscribed`), and from the
  group's readiness to it; then (the writer stopped 1 s later) to every
  client at its session's head, catch-up replays included; connect
  attempts (refused ones while the port is closed count).
- no lost event: once the writer stops, every client must reach its
  session's head (PostgreSQL's `session_head`), having received each event
  once, in order: gaps and duplicates counted over every client, both must
  be 0 (the run fails otherwise).
- PostgreSQL's load in the storm: its CPU (all its processes, psutil)
  from SIGTERM to the last client live, average and the peak of a 1 s
  sample, and the gateways' concurrent catch-up replays (the sum over the
  processes of `runlog_gateway_replays_running`, bounded by
  max_concurrent_replays per process) and waiting ones, sampled every
  0.5 s: their maxima.

One trial (--trials is ignored: one run takes minutes at 100k). Every
process is stopped on the way out, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
from typing import Any

import aiohttp

from broker import events
from broker.log import RunWriter

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Stack
from ._procs import NO_CONNECTION_CAPS, GatewayGroupProc, _LineChild, rss_bytes
from ._wsload import raise_fd_limit

KIB = 1024
_PER_CLIENT_PROC = 15_000
_PER_GATEWAY_PROC = 15_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conns", type=int, default=100_000, help="connections (default: 100000)")
    p.add_argument("--sessions", type=int, default=100, help="sessions (default: 100)")
    p.add_argument("--gateway-processes", type=int, default=0,
                   help="gateway processes (default: ceil(conns / 15000), at least 2)")  # fmt: skip
    p.add_argument("--client-processes", type=int, default=0,
                   help="client processes (default: ceil(conns / 15000))")  # fmt: skip
    p.add_argument("--sources", type=int, default=64,
                   help="client source addresses 127.0.0.2… (default: 64)")  # fmt: skip
    p.add_argument("--rate", type=float, default=50.0,
                   help="events/s appended during the storm (default: 50)")  # fmt: skip
    p.add_argument("--settle-s", type=float, default=3.0, help="wait before reading RSS (default: 3)")  # fmt: skip
    p.add_argument("--timeout-s", type=float, default=900.0,
                   help="bound on each phase (default: 900)")  # fmt: skip


class StormLoadProc(_LineChild):
    def __init__(self) -> None:
        super().__init__("stormload")

    async def start(self) -> StormLoadProc:
        await self._spawn("bench._stormload", "--uvloop")
        return self


async def run(args: argparse.Namespace) -> dict[str, Any]:
    args.trials = 1  # one run (see the docstring)
    n = args.conns
    gproc = args.gateway_processes or max(2, math.ceil(n / _PER_GATEWAY_PROC))
    cproc = args.client_processes or max(1, math.ceil(n / _PER_CLIENT_PROC))
    limit = raise_fd_limit()
    if n / gproc + 1000 > limit or n / cproc + 1000 > limit:
        raise SystemExit(f"RLIMIT_NOFILE hard limit {limit}: use more processes")
    async with _lib.stack(args.work_dir) as st, contextlib.AsyncExitStack() as procs:
        versions = await _lib.server_versions(st)
        b = await _gw.connect_broker(st)
        procs.push_async_callback(b.close)
        sessions = [
            await b.store.create_session(_gw.USER, "bench scale") for _ in range(args.sessions)
        ]
        writers = [await _gw.new_run(b, s) for s in sessions]
        gw = GatewayGroupProc(st, gproc, **NO_CONNECTION_CAPS)
        procs.push_async_callback(gw.stop, 120.0)
        await gw.start(timeout_s=120)
        loads = [StormLoadProc() for _ in range(cproc)]
        for ld in loads:
            procs.push_async_callback(ld.stop)
        await asyncio.gather(*(ld.start() for ld in loads))
        result = await _scenario(st, args, gw, loads, sessions, writers, b)
        result["servers"] = versions
        result["setup"] = {"conns": n, "gateway_processes": gproc, "client_processes": cproc,
                           "sessions": args.sessions, "sources": args.sources}  # fmt: skip
    return result


async def _scenario(st: Stack, args: argparse.Namespace, gw: GatewayGroupProc,
                    loads: list[StormLoadProc], sessions: list[str], writers: list[RunWriter],
                    b: Any) -> dict[str, Any]:  # fmt: skip
    n = args.conns
    topics = [f"session:{s}" for s in sessions]
    token = _gw.token()
    await asyncio.sleep(args.settle_s)
    rss0 = _group_rss(gw)
    load_rss0 = sum(rss_bytes(ld.pid) for ld in loads)
    shares = [n // len(loads) + (1 if k < n % len(loads) else 0) for k in range(len(loads))]
    starts = [sum(shares[:k]) for k in range(len(loads))]
    progress(f"scale: opening {n:,} connections over {gw.processes} gateway processes "
             f"from {len(loads)} client processes")  # fmt: skip
    t0 = time.monotonic()
    opened = await asyncio.gather(*(
        ld.call("connect", url=gw.ws_url, n=k, token=token, topics=topics, sources=args.sources,
                index0=i0, timeout_s=args.timeout_s)
        for ld, k, i0 in zip(loads, shares, starts, strict=True)
    ))  # fmt: skip
    subscribed_s = time.monotonic() - t0
    await _replays_done(gw, args.timeout_s)
    live_s = time.monotonic() - t0
    await asyncio.sleep(args.settle_s)
    rss1 = _group_rss(gw)
    load_rss1 = sum(rss_bytes(ld.pid) for ld in loads)
    counts = await _connections_per_process(gw)
    progress(f"scale: {n:,} live in {live_s:.1f} s; gateways "
             f"{(rss1 - rss0) / n / KIB:.1f} KiB/conn; per process {counts}")  # fmt: skip

    # The storm.
    stop_writing = asyncio.Event()
    written = [0]
    writer = asyncio.create_task(_write(writers, args.rate, stop_writing, written))
    sampler = _Sampler(st, gw)
    sampling = asyncio.create_task(sampler.run())
    try:
        await asyncio.sleep(1.0)  # events flow live before the restart too
        t_term = time.time()
        sampler.mark()
        await gw.stop(timeout_s=120)
        t_down = time.time()
        progress(f"scale: gateways stopped (drained) in {t_down - t_term:.1f} s; starting again")
        await gw.start(timeout_s=120)
        t_up = time.time()
        progress(f"scale: gateways ready {t_up - t_term:.1f} s after SIGTERM")
        status = await _wait_all_live(loads, n, args.timeout_s)
        t_live = max(s["t_last_live"] for s in status)
        cpu = sampler.mark()
        await asyncio.sleep(1.0)
    finally:
        stop_writing.set()
        await writer
        sampler.stop = True
        await sampling
    heads = {f"session:{s}": await b.store.session_head(s) for s in sessions}
    checks = await _wait_checked(loads, heads, args.timeout_s)
    t_head = time.time()  # every client at its head (or the bound passed)
    gaps = sum(c["gaps"] for c in checks)
    dups = sum(c["dups"] for c in checks)
    short = sum(c["short"] for c in checks)
    received = sum(c["received"] for c in checks)
    expected = sum(heads[topics[i % len(topics)]] for i in range(n))
    storm_s = t_live - t_term
    pg_cpu_s = cpu.get("postgres", float("nan"))
    storm = {
        "t_term": t_term, "drain_s": t_down - t_term, "down_to_ready_s": t_up - t_down,
        "sigterm_to_ready_s": t_up - t_term, "sigterm_to_all_live_s": storm_s,
        "ready_to_all_live_s": t_live - t_up, "sigterm_to_all_at_head_s": t_head - t_term,
        "attempts": sum(s["attempts"] for s in status) - n,
        "failed_attempts": sum(s["failed_attempts"] for s in status),
        "losses": sum(s["losses"] for s in status),
        "errors": _merge([s["errors"] for s in status]),
        "events_written": written[0], "gaps": gaps, "dups": dups, "short": short,
        "received": received, "expected": expected,
        "pg_cpu_s": pg_cpu_s, "pg_cpu_avg": pg_cpu_s / storm_s if storm_s else float("nan"),
        "pg_cpu_peak_1s": sampler.pg_peak, "replays_running_max": sampler.running_max,
        "replays_waiting_max": sampler.waiting_max,
        "replays_running_max_per_process": sampler.running_max_one,
        "host_busy_avg": cpu.get("host", float("nan")) / storm_s if storm_s else float("nan"),
    }  # fmt: skip
    progress(f"scale: all {n:,} live again {storm_s:.1f} s after SIGTERM "
             f"({t_live - t_up:.1f} s after ready); gaps {gaps}, duplicates {dups}, short {short}")  # fmt: skip
    if gaps or dups or short or received != expected:
        raise RuntimeError(f"lost or repeated events: {storm} {checks}")
    opening = {
        "conns": n, "subscribed_s": subscribed_s, "live_s": live_s,
        "rss_before": rss0, "rss_after": rss1, "gateway_kib": (rss1 - rss0) / n / KIB,
        "client_kib": (load_rss1 - load_rss0) / n / KIB, "per_process": counts,
        "connect_s": [o["seconds"] for o in opened],
    }  # fmt: skip
    return {"figures": _figures(args, gw.processes, opening, storm), "open": opening,
            "storm": storm}  # fmt: skip


def _group_rss(gw: GatewayGroupProc) -> int:
    return sum(rss_bytes(p) for p in gw.member_pids())


async def _metrics(gw: GatewayGroupProc, http: aiohttp.ClientSession) -> list[dict[str, float]]:
    """Each process's unlabelled gauges (an unreachable one: {})."""
    out: list[dict[str, float]] = []
    for m in gw.metrics_ports:
        vals: dict[str, float] = {}
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with http.get(f"http://127.0.0.1:{m}/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith("runlog_gateway_"):
                        name, _, value = line.rpartition(" ")
                        with contextlib.suppress(ValueError):
                            vals[name] = float(value)
        out.append(vals)
    return out


async def _replays_done(gw: GatewayGroupProc, timeout_s: float) -> None:
    names = ("runlog_gateway_replays_running", "runlog_gateway_replays_waiting")
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http, asyncio.timeout(timeout_s):
        while True:
            per = await _metrics(gw, http)
            if all(p and not any(p.get(k, 0) for k in names) for p in per):
                return
            await asyncio.sleep(0.2)


async def _connections_per_process(gw: GatewayGroupProc) -> list[int]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
        per = await _metrics(gw, http)
    return [int(p.get('runlog_gateway_connections{kind="ws"}', -1)) for p in per]


class _Sampler:
    """PostgreSQL's CPU and the group's replay gauges, every 0.5 s."""

    def __init__(self, st: Stack, gw: GatewayGroupProc) -> None:
        self.meter = _lib.CpuMeter(st)
        self.gw = gw
        self.stop = False
        self.pg_peak = 0.0
        self.running_max = 0.0
        self.waiting_max = 0.0
        self.running_max_one = 0.0
        self._mark = self.meter.snapshot()

    def mark(self) -> dict[str, float]:
        """CPU since the previous mark."""
        now = self.meter.snapshot()
        d = _lib.CpuMeter.delta(self._mark, now)
        self._mark = now
        return d

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=2)
        last = self.meter.snapshot()
        t_last = time.monotonic()
        async with aiohttp.ClientSession(timeout=timeout) as http:
            while not self.stop:
                await asyncio.sleep(0.5)
                per = await _metrics(self.gw, http)
                running = [p.get("runlog_gateway_replays_running", 0.0) for p in per]
                waiting = [p.get("runlog_gateway_replays_waiting", 0.0) for p in per]
                self.running_max = max(self.running_max, sum(running))
                self.waiting_max = max(self.waiting_max, sum(waiting))
                self.running_max_one = max(self.running_max_one, *running)
                now, t = self.meter.snapshot(), time.monotonic()
                if t - t_last >= 1.0:
                    pg = now.get("postgres", 0.0) - last.get("postgres", 0.0)
                    self.pg_peak = max(self.pg_peak, pg / (t - t_last))
                    last, t_last = now, t


async def _write(writers: list[RunWriter], rate: float, stop: asyncio.Event,
                 written: list[int]) -> None:  # fmt: skip
    """`rate` text deltas a second, round robin over the runs, in ticks of 50 ms."""
    tokens = _lib.TOKENS
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    k = 0
    while not stop.is_set():
        due = int((loop.time() - t0) * rate)
        touched: set[int] = set()
        while k < due:
            i = k % len(writers)
            await writers[i].append(events.TextDelta(message_id="m_0001",
                                                     delta=tokens[k % len(tokens)]))  # fmt: skip
            touched.add(i)
            k += 1
        for i in touched:
            await writers[i].flush()
        written[0] = k
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)


async def _wait_all_live(
    loads: list[StormLoadProc], n: int, timeout_s: float
) -> list[dict[str, Any]]:
    """Until every client is live again; a line of progress every 10 s (live,
    connect attempts, failed ones and why), and the last one on the timeout."""
    t0 = next_line = time.monotonic()
    while True:
        status = [await ld.call("status") for ld in loads]
        live = sum(s["live"] for s in status)
        if live == n and all(s["losses"] for s in status):
            return status
        now = time.monotonic()
        if now >= next_line or now - t0 > timeout_s:
            errs = sorted(_merge([s["errors"] for s in status]).items(), key=lambda kv: -kv[1])
            progress(f"scale: {now - t0:.0f} s: {live:,} of {n:,} live; "
                     f"{sum(s['attempts'] for s in status):,} attempts, "
                     f"{sum(s['failed_attempts'] for s in status):,} failed {errs[:4]}")  # fmt: skip
            next_line = now + 10
            if now - t0 > timeout_s:
                raise SystemExit(f"scale: not every client live again within {timeout_s:.0f} s")
        await asyncio.sleep(0.2)


async def _wait_checked(loads: list[StormLoadProc], heads: dict[str, int],
                        timeout_s: float) -> list[dict[str, Any]]:  # fmt: skip
    """Until every client reached its head (or the bound): the last checks."""
    deadline = time.monotonic() + timeout_s
    while True:
        checks = [await ld.call("check", heads=heads) for ld in loads]
        if not any(c["short"] for c in checks) or time.monotonic() > deadline:
            return checks
        await asyncio.sleep(0.5)


def _merge(dicts: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _figures(args: argparse.Namespace, gproc: int, o: dict[str, Any],
             s: dict[str, Any]) -> list[Figure]:  # fmt: skip
    figs: list[Figure] = []

    def add(section: str, name: str, unit: str, value: float) -> None:
        figs.append(_lib.summarize(section, name, unit, [value]))

    sec = f"{args.conns:,} idle subscribed WebSockets, {gproc} gateway processes on one port"
    add(sec, "gateway RSS per connection (sum over the processes)", "KiB/conn", o["gateway_kib"])
    add(sec, "gateway RSS, all processes", "MiB", o["rss_after"] / KIB / KIB)
    add(sec, "client RSS per connection", "KiB/conn", o["client_kib"])
    add(sec, "time to open, authenticate and subscribe all", "s", o["subscribed_s"])
    add(sec, "… until every catch-up replay ended", "s", o["live_s"])
    sec = f"gateway group restart (SIGTERM, drain, start), {args.rate:g} events/s written"
    add(sec, "SIGTERM → group exited (drained)", "s", s["drain_s"])
    add(sec, "SIGTERM → group ready again", "s", s["sigterm_to_ready_s"])
    add(sec, "SIGTERM → every client live again (resubscribed)", "s", s["sigterm_to_all_live_s"])
    add(sec, "group ready → every client live again", "s", s["ready_to_all_live_s"])
    add(sec, "SIGTERM → every client at its session's head (writer stopped at all live + 1 s)",
        "s", s["sigterm_to_all_at_head_s"])  # fmt: skip
    add(sec, "reconnect attempts (refused ones included)", "count", s["attempts"])
    add(sec, "events written", "count", s["events_written"])
    add(sec, "events lost (gaps) / duplicated, all clients", "count", s["gaps"] + s["dups"])
    add(sec, "PostgreSQL CPU, average over the storm", "cores", s["pg_cpu_avg"])
    add(sec, "PostgreSQL CPU, peak 1 s", "cores", s["pg_cpu_peak_1s"])
    add(sec, "concurrent catch-up replays, max (sum of processes)", "count",
        s["replays_running_max"])  # fmt: skip
    add(sec, "… max in one process (bound: max_concurrent_replays)", "count",
        s["replays_running_max_per_process"])  # fmt: skip
    add(sec, "replays waiting for a turn, max (sum)", "count", s["replays_waiting_max"])
    add(sec, "host CPU busy, average over the storm (outside load included)", "cores",
        s["host_busy_avg"])  # fmt: skip
    return figs
