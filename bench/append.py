"""append: durable append throughput of many concurrent runs, next to the raw limits.

One process plays a worker that owns `--runs` runs spread over `--sessions`
sessions and streams `--events-per-run` token deltas (~165-byte events) into
each through the product API (`Broker.claim` → `RunWriter.append`), all runs at
once. Measured from the first append until

- committed: every writer's `flush()` returned (PostgreSQL has every event), and
- published: the appender's publish backlog is empty (JetStream acked every
  live-feed message of those commits that was not dropped from a full backlog).

In the same run and against the same servers, each trial then measures the
raw limits the append path is built on:

- raw PostgreSQL: asyncpg `copy_records_to_table` of 1000-row batches into a
  scratch table shaped like `events` (same keys and index), one commit each;
- raw JetStream: nats-py `js.publish_async` of 150-byte messages to a scratch
  stream, 256 in flight;
- raw core NATS: publish → subscribe of 150-byte messages, both ends in this
  process (a reference for what one Python process moves through NATS at all).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import itertools
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from broker import events
from broker.log import RunWriter
from broker.metrics import BrokerMetrics
from broker.runtime import Broker
from broker.settings import Settings

from . import _appendproc, _lib, _procs, _raw
from ._lib import Figure, Stack, Timer, summarize


def add_arguments(p: argparse.ArgumentParser) -> None:
    defaults = Settings()
    p.add_argument("--runs", type=int, default=100, help="concurrent runs (default: 100)")
    p.add_argument("--events-per-run", type=int, default=2000, help="(default: 2000)")
    p.add_argument("--sessions", type=int, default=10, help="runs are spread over these")
    p.add_argument(
        "--burst",
        type=int,
        default=1,
        help="events a run appends before yielding to the event loop, like tokens arriving "
        "in one network read (default: 1, every token on its own)",
    )
    p.add_argument(
        "--rate-per-run",
        type=float,
        default=0.0,
        help="pace each run at this many events/s (default: 0, as fast as possible); "
        "a paced load below saturation shows the latency a watcher sees",
    )
    p.add_argument(
        "--sample-every",
        type=int,
        default=50,
        help="time append→commit of every Nth event of each run (default: 50)",
    )
    p.add_argument(
        "--flush-max-events",
        type=_int_list,
        default=[defaults.flush_max_events],
        help=f"setting to sweep, comma-separated (default: {defaults.flush_max_events})",
    )
    p.add_argument(
        "--flush-interval-ms",
        type=_float_list,
        default=[defaults.flush_interval_ms],
        help=f"setting to sweep, comma-separated (default: {defaults.flush_interval_ms})",
    )
    p.add_argument(
        "--max-pending-events",
        type=_int_list,
        default=[defaults.max_pending_events],
        help="setting to sweep, comma-separated: the backlog past which append() waits "
        f"(default: {defaults.max_pending_events})",
    )
    p.add_argument(
        "--append-flushers",
        type=_int_list,
        default=[defaults.append_flushers],
        help="setting to sweep, comma-separated: flushes in flight at once "
        f"(default: {defaults.append_flushers})",
    )
    p.add_argument(
        "--worker-procs",
        type=_int_list,
        default=[1, 2],
        metavar="P,P,...",
        help="also run the load split over P worker processes (each its own appender and "
        "connections, a session's runs in one process) for each P, e.g. 1,2: prints the "
        "P-process / 1-process ratio and PostgreSQL's share of the host's CPU (default: 1,2; "
        "'' turns it off)",
    )
    _raw.add_arguments(p)
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="FILE",
        help="cProfile the append phase of the first trial into FILE (pstats) and print "
        "the top functions; slows that trial, so its figures are not comparable",
    )


def _int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _float_list(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    combos = _combos(args)
    per_trial: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = _lib.CpuMeter(st)
        for trial in range(args.trials):
            t: dict[str, Any] = {"append": []}
            for combo in combos:
                profile = args.profile if trial == 0 and combo is combos[0] else None
                r = await _append_trial(st, meter, args, combo, profile)
                t["append"].append(r)
                _progress(trial, f"append {_combo_name(combo)}", r)
                if not args.no_raw:
                    # Right after each append phase: the host's load moves
                    # within seconds, and the ratio is the figure.
                    r["raw_pg"] = await _raw.copy_rows(st, meter, args)
                    r["ratio_raw_copy"] = r["committed_events_s"] / r["raw_pg"]["rows_s"]
                    _progress(trial, "raw pg", r["raw_pg"])
                    print(f"trial {trial + 1}: committed / raw COPY: {r['ratio_raw_copy']:.2f}")
            if args.worker_procs:
                t["procs"] = []
                for p in args.worker_procs:
                    r = await _procs_trial(st, args, combos[0], p)
                    t["procs"].append(r)
                    _progress(trial, f"{p} worker process(es)", r)
            if not args.no_raw:
                t["raw_pg"] = t["append"][0]["raw_pg"]
                t["raw_js"] = await _raw.jetstream_publish(st, meter, args)
                _progress(trial, "raw js", t["raw_js"])
                t["raw_core"] = await _raw.core_pub_sub(st, meter, args)
                _progress(trial, "raw core nats", t["raw_core"])
            per_trial.append(t)
    return {
        "servers": versions,
        "event_bytes_mean": per_trial[0]["append"][0]["event_bytes_mean"],
        "figures": _figures(per_trial, combos, args),
        "trials": per_trial,
    }


# Settings that can be swept from the command line (a flag each, comma-separated values).
SWEPT_SETTINGS = ("flush_max_events", "flush_interval_ms", "max_pending_events", "append_flushers")


def _combos(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every combination of the swept settings' values."""
    values = [getattr(args, name) for name in SWEPT_SETTINGS]
    return [dict(zip(SWEPT_SETTINGS, combo, strict=True)) for combo in itertools.product(*values)]


def _combo_name(combo: dict[str, Any]) -> str:
    return " ".join(f"{k}={v:g}" for k, v in combo.items())


def _progress(trial: int, what: str, r: dict[str, Any]) -> None:
    rate = r.get("committed_events_s") or r.get("rows_s") or r.get("msgs_s") or 0.0
    print(f"trial {trial + 1}: {what}: {rate:,.0f}/s", flush=True)


# --- the product path ------------------------------------------------------------


async def _append_trial(
    st: Stack,
    meter: _lib.CpuMeter,
    args: argparse.Namespace,
    combo: dict[str, Any],
    profile_path: Path | None,
) -> dict[str, Any]:
    settings = dataclasses.replace(
        Settings.from_env({}), nats_url=st.nats_url, database_url=st.database_url, **combo
    )
    b = await Broker.connect(settings, registry=CollectorRegistry(), name="runlog-bench")
    try:
        sessions = [await b.store.create_session("bench") for _ in range(args.sessions)]
        writers: list[RunWriter] = []
        for i in range(args.runs):
            run_id = await b.store.create_run(sessions[i % len(sessions)], "bench", model="bench")
            writers.append(await b.claim(run_id, "bench-worker"))
        # Warm-up outside the measurement: every run's first event (run_start)
        # opens the pool's connection, prepares the statements and creates the
        # publish path, as a worker that has been up for a while would have.
        for w in writers:
            await w.append(events.RunStart(model="bench", started_by="bench"))
        await asyncio.gather(*(w.flush() for w in writers))
        await wait_published(b)
        m = b.metrics
        # Counters and histograms are cumulative: read them before and after
        # the measured phase and report the difference.
        hists = {
            "batch": m.batch_events,
            "commit": m.commit_seconds,
            "append_latency": m.append_latency_seconds,
            "publish_lag": m.publish_lag_seconds,
        }
        before = {k: _lib.HistogramSnapshot.of(h) for k, h in hists.items()}
        messages_before = _sample(m, "runlog_publish_messages_total")
        dropped_before = _sample(m, "runlog_publish_dropped_total")

        feed = Feed(args.events_per_run, args.burst, args.sample_every, args.rate_per_run)
        n_events = args.runs * args.events_per_run
        profiler = cProfile.Profile(time.process_time) if profile_path is not None else None
        timer = Timer(meter)
        timer.start()
        feed.t0 = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        await asyncio.gather(*(stream_tokens(w, k, feed) for k, w in enumerate(writers)))
        commit_wall_s, commit_cpu = timer.lap()
        await wait_published(b)
        if profiler is not None:
            profiler.disable()
        timer.stop()
        if profiler is not None and profile_path is not None:
            _dump_profile(profiler, profile_path)

        h = {
            k: _lib.HistogramSnapshot.of(hist).since(before[k]).stats() for k, hist in hists.items()
        }
        n_batches = h["batch"]["count"]
        n_committed = h["batch"]["sum"]
        n_messages = _sample(m, "runlog_publish_messages_total") - messages_before
        # A live message dropped from a full backlog was still built from its batch.
        n_dropped = _sample(m, "runlog_publish_dropped_total") - dropped_before
        latencies = sorted(feed.latencies)
        appended_s = max(feed.appended_at) - feed.t0
        event_bytes = statistics.mean(
            len(
                events.encode(
                    events.TextDelta(
                        message_id="m_0001",
                        delta=token,
                        run_id=writers[0].run_id,
                        session_id=writers[0].session_id,
                        seq=1000,
                        ts=b.appender.now_ms(),
                    )
                )
            )
            for token in _lib.TOKENS
        )
        result = {
            "settings": combo,
            "events": n_events,
            "events_committed": n_committed,
            "event_bytes_mean": event_bytes,
            "committed_s": commit_wall_s,
            "published_s": timer.wall_s,
            "appended_s": appended_s,
            "appended_events_s": n_events / appended_s,
            "committed_events_s": n_events / commit_wall_s,
            "published_events_s": n_events / timer.wall_s,
            "latency_samples": len(latencies),
            "latency_p50_ms": _lib.quantile(latencies, 0.5) * 1e3,
            "latency_p99_ms": _lib.quantile(latencies, 0.99) * 1e3,
            "latency_max_ms": (latencies[-1] if latencies else float("nan")) * 1e3,
            # The product's own histogram: oldest event of each batch, append→commit.
            "metric_append_latency_p50_ms": h["append_latency"]["p50"] * 1e3,
            "metric_append_latency_p99_ms": h["append_latency"]["p99"] * 1e3,
            "batches": n_batches,
            "batch_events_mean": n_committed / n_batches if n_batches else float("nan"),
            "commit_ms_mean": h["commit"]["mean"] * 1e3,
            "commit_busy_pct": 100 * h["commit"]["sum"] / commit_wall_s,
            "publish_messages": n_messages,
            "events_per_message": n_committed / (n_messages + n_dropped)
            if n_messages + n_dropped
            else float("nan"),
            "publish_lag_p50_ms": h["publish_lag"]["p50"] * 1e3,
            "publish_lag_p99_ms": h["publish_lag"]["p99"] * 1e3,
            "publish_dropped": n_dropped,
            "cpu_s_until_committed": commit_cpu,
            "cpu_s": timer.cpu_s,
            "client_cpu_us_per_event": timer.us_per(n_events, "client"),
            "pg_cpu_us_per_event": timer.us_per(n_events, "postgres"),
            "nats_cpu_us_per_event": timer.us_per(n_events, "nats"),
            "client_cpu_pct": 100 * timer.cpu_s["client"] / timer.wall_s,
            "others_cpu_cores": timer.others_cores(),
            "steal_cpu_cores": timer.cpu_s["steal"] / timer.wall_s,
            "profiled": profiler is not None,
        }
        # End the runs (outside the measurement), as finished model streams do:
        # active runs pile up across trials otherwise, and the append
        # transaction's UPDATE of `runs` would see more of them every trial.
        for w in writers:
            await w.append(events.RunEnd(status="completed"))
        await asyncio.gather(*(w.flush() for w in writers))
        return result
    finally:
        await b.close()


def _sample(m: BrokerMetrics, name: str) -> float:
    value = m.registry.get_sample_value(name)
    return float("nan") if value is None else value


@dataclasses.dataclass
class Feed:
    """How the simulated model streams produce tokens, and what they record."""

    events_per_run: int
    burst: int
    sample_every: int
    rate_per_run: float  # events/s per run; 0: as fast as the appender takes them
    t0: float = 0.0  # perf_counter at the start of the measured phase
    latencies: list[float] = dataclasses.field(default_factory=list)
    appended_at: list[float] = dataclasses.field(default_factory=list)


async def stream_tokens(w: RunWriter, k: int, feed: Feed) -> None:
    """One run's model stream: token deltas, yielding every `burst` tokens."""
    loop = asyncio.get_running_loop()
    message_id = f"m_{k:04d}"
    period = feed.burst / feed.rate_per_run if feed.rate_per_run > 0 else 0.0
    # Paced runs start spread over one period, as independent streams would.
    due = feed.t0 + period * random.random()
    for i in range(feed.events_per_run):
        t0 = time.perf_counter()
        seq = await w.append(
            events.TextDelta(message_id=message_id, delta=_lib.TOKENS[i % len(_lib.TOKENS)])
        )
        if (i + k) % feed.sample_every == 0:
            _watch_commit(loop, w, seq, t0, feed.latencies)
        if (i + 1) % feed.burst == 0:
            # A real stream awaits the provider's socket between tokens; without
            # this, one run would append all its events before any other ran.
            if period:
                due += period
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            else:
                await asyncio.sleep(0)
    feed.appended_at.append(time.perf_counter())
    await w.flush()


def _watch_commit(
    loop: asyncio.AbstractEventLoop, w: RunWriter, seq: int, t0: float, out: list[float]
) -> None:
    """Record when `seq` is committed, as a `flush()` awaiting it would see it.

    `flush()` waits for the writer's *latest* seq, so calling it for a sample
    would block the stream or overstate the delay; instead we register the
    same kind of waiter flush registers (a private detail of broker/log.py; if
    it changes, the samples are simply missing and the figure reads n/a).
    """
    waiters = getattr(w, "_waiters", None)
    if not isinstance(waiters, list):
        return
    fut: asyncio.Future[int] = loop.create_future()

    def done(f: asyncio.Future[int]) -> None:
        if not f.cancelled() and f.exception() is None:
            out.append(time.perf_counter() - t0)

    fut.add_done_callback(done)
    waiters.append((seq, fut))


async def wait_published(b: Broker, timeout_s: float = 120.0) -> None:
    """Until JetStream acked every live-feed message of what was committed.

    The appender pops a message off its backlog only after its ack, so an
    empty backlog after the last commit means everything was published.
    """
    q = getattr(b.appender, "_publish_q", None)
    deadline = time.monotonic() + timeout_s
    if q is None:  # the appender changed: wait until the counter stops moving
        last, stable_since = -1.0, time.monotonic()
        while time.monotonic() < deadline:
            now_count = _sample(b.metrics, "runlog_publish_messages_total")
            if now_count != last:
                last, stable_since = now_count, time.monotonic()
            elif time.monotonic() - stable_since > 0.2:
                return
            await asyncio.sleep(0.001)
        raise TimeoutError("publishing did not settle")
    while q:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(q)} live-feed messages still unpublished")
        await asyncio.sleep(0.001)


def _dump_profile(profiler: cProfile.Profile, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(str(path))
    buf = io.StringIO()
    stats = pstats.Stats(profiler, stream=buf).strip_dirs()
    stats.sort_stats("tottime").print_stats(25)
    stats.sort_stats("cumulative").print_stats(30)
    print(buf.getvalue())
    print(f"profile written to {path}; this trial is left out of the summary")


# --- several worker processes ---------------------------------------------------


async def _procs_trial(
    st: Stack, args: argparse.Namespace, combo: dict[str, Any], n_procs: int
) -> dict[str, Any]:
    """The same load split over `n_procs` processes (bench/_appendproc.py),
    each its own appender against the same PostgreSQL: run i goes to process
    i mod P, and run i is in session i mod --sessions, so with P dividing
    --sessions a session's runs are all in one process (no session row is
    contended between processes: this measures the appenders, not that)."""
    settings = dataclasses.replace(
        Settings.from_env({}), nats_url=st.nats_url, database_url=st.database_url
    )
    b = await Broker.connect(settings, registry=CollectorRegistry(), name="runlog-bench")
    try:
        sessions = [await b.store.create_session("bench") for _ in range(args.sessions)]
        run_ids = [
            await b.store.create_run(sessions[i % len(sessions)], "bench", model="bench")
            for i in range(args.runs)
        ]
    finally:
        await b.close()
    meter = _procs.Meter(st)
    procs: list[asyncio.subprocess.Process] = []
    try:
        for k in range(n_procs):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "bench._appendproc",
                cwd=_procs.REPO,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            procs.append(proc)
            job = _appendproc.Job(
                nats_url=st.nats_url,
                database_url=st.database_url,
                run_ids=run_ids[k::n_procs],
                events_per_run=args.events_per_run,
                burst=args.burst,
                settings=combo,
            )
            await _send(proc, msgspec.json.encode(job).decode())
            meter.add(f"worker{k}", proc.pid, precise=True)
        for proc in procs:
            assert await _recv(proc) == "ready"
        timer = Timer(meter)
        timer.start()
        for proc in procs:
            await _send(proc, "go")
        reports = [
            msgspec.json.decode(await _recv(proc), type=_appendproc.Report) for proc in procs
        ]
        timer.stop()
        for proc in procs:
            await _send(proc, "bye")
        for proc in procs:
            await asyncio.wait_for(proc.wait(), 60)
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    n = sum(r.events for r in reports)
    committed_s = max(r.committed_s for r in reports)
    workers_cpu_s = sum(timer.cpu_s[f"worker{k}"] for k in range(n_procs))
    cores = os.cpu_count() or 1
    return {
        "procs": n_procs,
        "events": n,
        "committed_events_s": n / committed_s,
        "published_events_s": n / max(r.published_s for r in reports),
        "worker_cpu_us_per_event": workers_cpu_s * 1e6 / n,
        "worker_cores": workers_cpu_s / timer.wall_s,
        "pg_cpu_us_per_event": timer.us_per(n, "postgres"),
        "pg_cores": timer.cpu_s.get("postgres", float("nan")) / timer.wall_s,
        "pg_host_share_pct": 100 * timer.cpu_s.get("postgres", float("nan")) / timer.wall_s / cores,
        "nats_cores": timer.cpu_s.get("nats", float("nan")) / timer.wall_s,
        "host_idle_cores": max(0.0, cores - timer.cpu_s["host"] / timer.wall_s),
        "others_cpu_cores": max(0.0, timer.others_cores()),
    }


async def _send(proc: asyncio.subprocess.Process, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line.encode() + b"\n")
    await proc.stdin.drain()


async def _recv(proc: asyncio.subprocess.Process, timeout_s: float = 300.0) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), timeout_s)
    if not line:
        raise RuntimeError(f"worker process {proc.pid} exited (code {await proc.wait()})")
    return line.decode().strip()


# (key in the result, label, unit)
_PROCS_FIGURES = (
    ("committed_events_s", "committed, all processes", "events/s"),
    ("worker_cpu_us_per_event", "worker CPU, all processes", "µs/event"),
    ("worker_cores", "worker CPU", "cores"),
    ("pg_cpu_us_per_event", "PostgreSQL CPU", "µs/event"),
    ("pg_cores", "PostgreSQL CPU", "cores"),
    ("pg_host_share_pct", "PostgreSQL's share of the host's CPU", "%"),
    ("nats_cores", "nats-server CPU", "cores"),
    ("host_idle_cores", "host CPU left idle", "cores"),
    ("others_cpu_cores", "host CPU outside our processes", "cores"),
)


def _procs_figures(trials: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []
    for i, p in enumerate(args.worker_procs):
        section = f"{p} worker process(es), each its own appender, load split between them"
        for key, label, unit in _PROCS_FIGURES:
            figs.append(summarize(section, label, unit, [t["procs"][i][key] for t in trials]))
    if 1 in args.worker_procs:
        one = args.worker_procs.index(1)
        for i, p in enumerate(args.worker_procs):
            if p != 1:
                figs.append(
                    summarize(
                        f"{p} worker processes / 1",
                        "committed events/s ratio",
                        "ratio",
                        [
                            t["procs"][i]["committed_events_s"]
                            / t["procs"][one]["committed_events_s"]
                            for t in trials
                        ],
                    )
                )
    return figs


# --- figures ---------------------------------------------------------------------

# (key in the trial result, label, unit)
_APPEND_FIGURES = (
    ("appended_events_s", "appended (first append → last append returned)", "events/s"),
    ("committed_events_s", "committed (first append → all flushed)", "events/s"),
    ("published_events_s", "published (→ publish backlog empty)", "events/s"),
    ("latency_p50_ms", "append → flush return, p50 (sampled)", "ms"),
    ("latency_p99_ms", "append → flush return, p99 (sampled)", "ms"),
    ("metric_append_latency_p99_ms", "runlog_append_latency p99 (oldest/batch)", "ms"),
    ("batch_events_mean", "events per transaction, mean", "events"),
    ("commit_ms_mean", "append transaction, mean", "ms"),
    ("commit_busy_pct", "time spent in commit transactions", "%"),
    ("events_per_message", "events per JetStream message", "events"),
    ("publish_lag_p99_ms", "commit → JetStream ack, p99", "ms"),
    ("publish_dropped", "live-feed messages dropped", "msgs"),
    ("client_cpu_us_per_event", "client CPU", "µs/event"),
    ("client_cpu_pct", "client CPU (of one core)", "%"),
    ("pg_cpu_us_per_event", "PostgreSQL CPU (all backends)", "µs/event"),
    ("nats_cpu_us_per_event", "nats-server CPU", "µs/event"),
    ("others_cpu_cores", "host CPU outside our processes", "cores"),
)
_RAW_FIGURES = (
    ("raw_pg", "rows_s", "COPY {batch}-row batches, 1 commit each", "rows/s"),
    ("raw_pg", "client_cpu_us_per_row", "  client CPU", "µs/row"),
    ("raw_pg", "pg_cpu_us_per_row", "  PostgreSQL CPU", "µs/row"),
    ("raw_js", "msgs_s", "JetStream publish_async, {inflight} in flight", "msgs/s"),
    ("raw_js", "client_cpu_us_per_msg", "  client CPU", "µs/msg"),
    ("raw_js", "nats_cpu_us_per_msg", "  nats-server CPU", "µs/msg"),
    ("raw_core", "msgs_s", "core NATS pub → sub (one process)", "msgs/s"),
)


def _figures(
    per_trial: list[dict[str, Any]],
    combos: list[dict[str, Any]],
    args: argparse.Namespace,
) -> list[Figure]:
    figs: list[Figure] = []
    # A profiled trial is much slower; keep it out of the summary when others exist.
    trials = [t for t in per_trial if not t["append"][0]["profiled"]] or per_trial
    head = (
        f"runlog append: {args.runs} runs x {args.events_per_run} events, {args.sessions} sessions"
    )
    for c, combo in enumerate(combos):
        section = head if len(combos) == 1 else f"{head}; {_combo_name(combo)}"
        for key, label, unit in _APPEND_FIGURES:
            figs.append(summarize(section, label, unit, [t["append"][c][key] for t in trials]))
        if not args.no_raw:
            figs.append(
                summarize(
                    section,
                    "raw COPY of as many rows, right after",
                    "rows/s",
                    [t["append"][c]["raw_pg"]["rows_s"] for t in trials],
                )
            )
            figs.append(
                summarize(
                    section,
                    "committed / raw PostgreSQL COPY",
                    "ratio",
                    [t["append"][c]["ratio_raw_copy"] for t in trials],
                )
            )
    if args.worker_procs:
        figs.extend(_procs_figures(trials, args))
    if not args.no_raw:
        section = "raw limits, same servers, same run"
        for phase, key, label, unit in _RAW_FIGURES:
            label = label.format(batch=args.raw_pg_batch, inflight=args.raw_js_inflight)
            figs.append(summarize(section, label, unit, [t[phase][key] for t in per_trial]))
        figs.append(
            summarize(
                section,
                "host CPU outside our processes",
                "cores",
                [
                    max(t[p]["others_cpu_cores"] for p in ("raw_pg", "raw_js", "raw_core"))
                    for t in per_trial
                ],
            )
        )
    return figs
