"""worker: the worker's latencies and throughput, with real worker processes
(`runlog worker`), next to raw limits measured in the same run.

1. Stop → provider connection closed. A worker process runs the `openai`
   adapter against a fake OpenAI-compatible server in this process
   (tests/fakes/providers.py `FakeProvider`, streaming `slow_tokens` at 50
   tokens/s; it records when the client hung up). Per run: start it
   (`Broker.start_run`), wait for a random 2..--max-tokens-before-stop
   text_delta events (read through the broker), call `Broker.interrupt`, and
   measure from that call until the provider saw the connection closed (one
   clock: both ends are in this process). --stops runs per trial, one after
   the other. Raw, same run: a one-row UPDATE transaction in PostgreSQL, a
   JetStream publish → ordered push consumer delivery, and an aiohttp client
   closing a streaming response → the fake provider seeing it: the hops a
   stop is made of.
2. POST run → `run_start` at a subscriber. A gateway process and a worker
   process (scripted adapter); this process is the client: a WebSocket
   subscribed to the session, then `POST /v1/sessions/{id}/runs` (input
   "echo: hi"), timed until the run's `run_start` arrives on the WebSocket;
   the next run starts after the previous one's run_end. Raw, same run: a
   JetStream work-queue hop (publish → a waiting pull `fetch` returns), with
   batch 1 and with the worker's batch (its free slots).
3. --runs concurrent scripted runs at 50 tokens/s (the "long" script, text
   only) through one worker process: committed events/s over --window-s and
   the worker's CPU per event (and PostgreSQL's, nats-server's). Raw, same
   run: the same number of runs appending the same paced token stream
   straight through `RunWriter.append` in this process (the log's share of
   the worker's CPU).
4. kill -9 → `status` resumed (bench/_takeover.py). Two worker processes
   (scripted adapter at --tokens-per-s, default lease and liveness
   settings, concurrency 1, each with a known RUNLOG_WORKER_ID). Per kill: a
   run of the "long" script, 10 text_delta read through the broker,
   `runs.owner_id` names the process to SIGKILL; measured from the kill
   until the run's `status` "resumed" reaches a subscription opened at the
   run's head (the other worker saw the owner's liveness lock released,
   workers/liveness.py). The killed worker is replaced at once; a kill waits
   until the taker has held its lock for worker_liveness_grace_s and has a
   free slot, then for a random part of worker_liveness_interval_s (a crash
   comes at any moment of the taker's orphan search). The run taken over at
   the previous kill keeps the survivor busy while the next one starts, so
   the fresh worker owns it and the survivor is the taker: no grace to wait
   out per kill (left to JetStream, the older worker gets nearly every run).
   --kills per trial. Raw, same run: SIGKILL of a plain process holding an
   advisory lock on its own asyncpg connection → another connection sees it
   free in pg_locks (polled every 10 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import nats
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from broker import events
from broker.runtime import Broker
from tests.fakes.providers import FakeProvider, slow_tokens

from . import _gw, _lib, _takeover
from ._gw import USER, progress
from ._lib import Figure, Stack, Timer
from ._procs import NO_CONNECTION_CAPS, GatewayProc, Meter, WorkerProc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--stops", type=int, default=50, help="stopped runs per trial (default: 50)")
    p.add_argument("--max-tokens-before-stop", type=int, default=15,
                   help="stop after a random 2..N tokens (default: 15)")  # fmt: skip
    p.add_argument("--starts", type=int, default=50, help="POSTed runs per trial (default: 50)")
    p.add_argument("--runs", type=int, default=100, help="concurrent scripted runs (default: 100)")
    p.add_argument("--tokens-per-s", type=float, default=50.0, help="per run (default: 50)")
    p.add_argument("--window-s", type=float, default=10.0, help="measured window (default: 10)")
    p.add_argument("--skip", default="",
                   help="comma-separated parts to skip: stop,start,load,takeover")  # fmt: skip
    p.add_argument("--no-raw", action="store_true", help="skip the raw measurements")
    p.add_argument("--flush-interval-ms", type=float, default=None,
                   help="the scripted worker's (and part 3 raw's) flush_interval_ms "
                        "(default: the setting's default)")  # fmt: skip
    p.add_argument("--profile-worker", type=Path, default=None, metavar="FILE",
                   help="run the scripted worker (parts 2 and 3) under cProfile (CPU time); "
                        "stats written to FILE when it stops; its figures are then inflated")  # fmt: skip
    _takeover.add_arguments(p)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    skip = {s for s in args.skip.split(",") if s}
    per_trial: list[dict[str, Any]] = [{} for _ in range(args.trials)]
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        flush = (
            {} if args.flush_interval_ms is None else {"flush_interval_ms": args.flush_interval_ms}
        )
        b = await _gw.connect_broker(st, **flush)
        try:
            if "stop" not in skip:
                await _stop_part(st, b, meter, args, per_trial)
            if not {"start", "load"} <= skip:
                await _scripted_parts(st, b, meter, args, per_trial, skip)
            if _takeover.SKIP not in skip:
                await _takeover.run_part(st, b, args, per_trial)
        finally:
            await b.close()
    return {"servers": versions, "figures": _figures(per_trial, args, skip), "trials": per_trial}


# --- 1. stop → provider connection closed ---------------------------------------


async def _stop_part(
    st: Stack, b: Broker, meter: Meter, args: argparse.Namespace, per_trial: list[dict[str, Any]]
) -> None:
    async with FakeProvider() as provider:
        wk = await WorkerProc(
            st, concurrency=4, model_adapter="openai", openai_base_url=provider.url + "/v1",
            openai_api_key="sk-bench", openai_model="gpt-4o",
        ).start()  # fmt: skip
        meter.add("worker", wk.pid)
        try:
            for trial, t in enumerate(per_trial):
                t["stop"] = r = await _stops(b, provider, args)
                progress(f"trial {trial + 1}: stop → provider closed p50 {r['p50_ms']:.1f} ms, "
                         f"p99 {r['p99_ms']:.1f} ms (n={r['n']})")  # fmt: skip
                if not args.no_raw:
                    t["stop_raw"] = r = await _stop_raw(st, provider, args)
                    progress(f"trial {trial + 1}: raw: pg update p50 {r['pg_p50_ms']:.2f} ms, "
                             f"js publish → push p50 {r['js_p50_ms']:.2f} ms, "
                             f"client close → provider p50 {r['close_p50_ms']:.2f} ms")  # fmt: skip
        finally:
            meter.remove("worker")
            await wk.stop(timeout_s=30)


async def _stops(b: Broker, provider: FakeProvider, args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    session = await b.store.create_session(USER, "bench stop")
    stop_ms, after_return_ms, call_ms, to_end_ms = [], [], [], []
    for _ in range(args.stops):
        provider.push(slow_tokens("openai", 5000, 50.0))
        n_requests = len(provider.requests)
        run_id = await b.start_run(session, USER, input="hello")
        k = random.randint(2, max(2, args.max_tokens_before_stop))
        sub = await b.subscribe(run_id=run_id, after=0)
        try:
            seen = 0
            async with asyncio.timeout(60):
                async for batch in sub:
                    seen += sum(1 for e in batch if e.type == "text_delta")
                    if seen >= k:
                        break
            rec = await provider.wait_requests(n_requests + 1)
            t0 = loop.time()
            await b.interrupt(run_id, USER, "bench stop")
            t1 = loop.time()
            closed_at = await rec.wait_closed(timeout_s=10)
            async with asyncio.timeout(30):
                async for batch in sub:
                    if batch[-1].type == "run_end":
                        break
            t_end = loop.time()
        finally:
            await sub.close()
        stop_ms.append((closed_at - t0) * 1e3)
        after_return_ms.append((closed_at - t1) * 1e3)
        call_ms.append((t1 - t0) * 1e3)
        to_end_ms.append((t_end - t0) * 1e3)
    s = sorted(stop_ms)
    q = _lib.quantile
    return {
        "n": len(s),
        "p50_ms": q(s, 0.5),
        "p90_ms": q(s, 0.9),
        "p99_ms": q(s, 0.99),
        "max_ms": s[-1],
        "after_return_p50_ms": q(sorted(after_return_ms), 0.5),
        "after_return_p99_ms": q(sorted(after_return_ms), 0.99),
        "interrupt_call_p50_ms": q(sorted(call_ms), 0.5),
        "interrupt_call_p99_ms": q(sorted(call_ms), 0.99),
        "to_run_end_p50_ms": q(sorted(to_end_ms), 0.5),
        "samples_ms": stop_ms,
    }


async def _stop_raw(st: Stack, provider: FakeProvider, args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    n = args.stops
    q = _lib.quantile
    # (a) PostgreSQL: a one-row UPDATE ... RETURNING in its own transaction.
    conn = await asyncpg.connect(st.database_url)
    pg = []
    try:
        await conn.execute("CREATE TEMP TABLE bench_stop (id int PRIMARY KEY, n int)")
        await conn.execute("INSERT INTO bench_stop VALUES (1, 0)")
        for _ in range(n):
            t0 = loop.time()
            async with conn.transaction():
                await conn.fetchval("UPDATE bench_stop SET n = n + 1 WHERE id = 1 RETURNING n")
            pg.append((loop.time() - t0) * 1e3)
    finally:
        await conn.close()
    # (b) JetStream: publish (awaiting the ack) → ordered push consumer callback.
    stream, subject = "RUNLOG_BENCH_STOP", "runlog-bench.stop"
    pub = await nats.connect(st.nats_url, name="runlog-bench-pub")
    subc = await nats.connect(st.nats_url, name="runlog-bench-sub")
    js_lat: list[float] = []
    got: asyncio.Queue[float] = asyncio.Queue()
    try:
        js = pub.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(stream)
        await js.add_stream(name=stream, subjects=[subject], storage=api.StorageType.FILE)

        async def on_msg(msg: Msg) -> None:
            got.put_nowait(loop.time())

        sub = await subc.jetstream().subscribe(subject, cb=on_msg, ordered_consumer=True)
        for _ in range(n):
            t0 = loop.time()
            await js.publish(subject, b"stop")
            t1 = await asyncio.wait_for(got.get(), 10)
            js_lat.append((t1 - t0) * 1e3)
        await sub.unsubscribe()
        await js.delete_stream(stream)
    finally:
        await subc.close()
        await pub.close()
    # (c) aiohttp client closing a streaming response → the provider sees it.
    close_lat = []
    async with aiohttp.ClientSession() as http:
        for _ in range(n):
            provider.push(slow_tokens("openai", 5000, 50.0))
            k = len(provider.requests)
            resp = await http.post(provider.url + "/v1/chat/completions", json={})
            await resp.content.readline()
            rec = await provider.wait_requests(k + 1)
            t0 = loop.time()
            resp.close()
            closed_at = await rec.wait_closed(timeout_s=10)
            close_lat.append((closed_at - t0) * 1e3)
    return {
        "pg_p50_ms": q(sorted(pg), 0.5),
        "pg_p99_ms": q(sorted(pg), 0.99),
        "js_p50_ms": q(sorted(js_lat), 0.5),
        "js_p99_ms": q(sorted(js_lat), 0.99),
        "close_p50_ms": q(sorted(close_lat), 0.5),
        "close_p99_ms": q(sorted(close_lat), 0.99),
    }


# --- 2 and 3: the scripted worker -------------------------------------------------


async def _scripted_parts(
    st: Stack, b: Broker, meter: Meter, args: argparse.Namespace,
    per_trial: list[dict[str, Any]], skip: set[str],
) -> None:  # fmt: skip
    flush = {} if args.flush_interval_ms is None else {"flush_interval_ms": args.flush_interval_ms}
    wk = await WorkerProc(
        st, concurrency=max(args.runs, 8), model_adapter="scripted",
        scripted_tokens_per_s=args.tokens_per_s, **flush,
    ).profiled(args.profile_worker).start()  # fmt: skip
    gw = await GatewayProc(st, None, **NO_CONNECTION_CAPS).start() if "start" not in skip else None
    meter.add("worker", wk.pid)
    try:
        for trial, t in enumerate(per_trial):
            if gw is not None:
                t["start"] = r = await _starts(b, gw, args)
                progress(f"trial {trial + 1}: POST run → run_start p50 {r['p50_ms']:.1f} ms, "
                         f"p99 {r['p99_ms']:.1f} ms")  # fmt: skip
                if not args.no_raw:
                    t["start_raw"] = r = await _start_raw(st, args)
                    progress(f"trial {trial + 1}: raw: work-queue hop p50 batch 1 "
                             f"{r['batch1_p50_ms']:.2f} ms, batch {r['batch_n']} "
                             f"{r['batchn_p50_ms']:.1f} ms")  # fmt: skip
            if "load" not in skip:
                t["load"] = r = await _load(b, meter, args)
                progress(f"trial {trial + 1}: {args.runs} runs: {r['events_s']:,.0f} events/s, "
                         f"worker {r['worker_us_per_event']:.0f} µs/event "
                         f"({r['worker_cpu_pct']:.0f} % of a core)")  # fmt: skip
                if not args.no_raw:
                    t["load_raw"] = r = await _load_raw(b, meter, args)
                    progress(f"trial {trial + 1}: raw append, same pace: "
                             f"{r['events_s']:,.0f} events/s, {r['us_per_event']:.0f} µs/event")  # fmt: skip
    finally:
        meter.remove("worker")
        if gw is not None:
            await gw.stop()
        await wk.stop(timeout_s=30)


async def _starts(b: Broker, gw: GatewayProc, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {_gw.token()}"}
    seen: dict[str, dict[str, float]] = {}
    appended_ms: dict[str, int] = {}
    posted: dict[str, tuple[float, float]] = {}
    arrived = asyncio.Event()
    lat, post_ms = [], []
    async with aiohttp.ClientSession(headers=headers) as http:
        async with http.post(gw.url + "/v1/sessions", json={"title": "bench starts"}) as r:
            sid = (await r.json())["session_id"]
        async with http.ws_connect(gw.ws_url, protocols=("runlog.v1",)) as ws:
            await ws.send_json({"type": "subscribe", "session_id": sid, "after": 0})

            async def read() -> None:
                async for msg in ws:
                    m = msg.json()
                    if m["type"] == "event":
                        e = m["event"]
                        seen.setdefault(e["run_id"], {})[e["type"]] = time.time()
                        if e["type"] == "run_start":
                            appended_ms[e["run_id"]] = e["ts"]
                        arrived.set()

            reader = asyncio.create_task(read())
            try:
                for _ in range(args.starts):
                    t0 = time.time()
                    async with http.post(f"{gw.url}/v1/sessions/{sid}/runs",
                                         json={"input": "echo: hi"}) as r:  # fmt: skip
                        if r.status != 202:
                            raise RuntimeError(f"POST run: {r.status} {await r.text()}")
                        run_id = (await r.json())["run_id"]
                    t_post = time.time()
                    async with asyncio.timeout(30):
                        while "run_end" not in seen.get(run_id, {}):
                            arrived.clear()
                            await arrived.wait()
                    lat.append((seen[run_id]["run_start"] - t0) * 1e3)
                    post_ms.append((t_post - t0) * 1e3)
                    posted[run_id] = (t0, seen[run_id]["run_start"])
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
    # Where the time goes (wall clock, ms precision of the database and of `ts`):
    # POST → run row created (PostgreSQL now()) → run_start appended (its ts,
    # in the worker) → received here.
    created = {
        r[0]: r[1]
        for r in await b.store.pool.fetch(
            "SELECT run_id, extract(epoch FROM created_at)::float8 FROM runs"
            " WHERE run_id = ANY($1::text[])",
            list(posted),
        )
    }
    to_created, to_appended, to_received = [], [], []
    for run_id, (t0, t_recv) in posted.items():
        ta = appended_ms[run_id] / 1000
        to_created.append((created[run_id] - t0) * 1e3)
        to_appended.append((ta - created[run_id]) * 1e3)
        to_received.append((t_recv - ta) * 1e3)
    s = sorted(lat)
    q = _lib.quantile
    return {
        "n": len(s),
        "p50_ms": q(s, 0.5),
        "p90_ms": q(s, 0.9),
        "p99_ms": q(s, 0.99),
        "post_p50_ms": q(sorted(post_ms), 0.5),
        "post_to_created_p50_ms": q(sorted(to_created), 0.5),
        "created_to_appended_p50_ms": q(sorted(to_appended), 0.5),
        "created_to_appended_p90_ms": q(sorted(to_appended), 0.9),
        "appended_to_received_p50_ms": q(sorted(to_received), 0.5),
        "samples_ms": lat,
    }


async def _start_raw(st: Stack, args: argparse.Namespace) -> dict[str, Any]:
    """publish → a waiting pull `fetch` returns, on a scratch work-queue stream."""
    stream, subject = "RUNLOG_BENCH_JOBS", "runlog-bench.jobs"
    nc = await nats.connect(st.nats_url, name="runlog-bench-jobs")
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {"batch_n": max(args.runs, 8)}
    try:
        js = nc.jetstream()
        for key, batch in (("batch1", 1), ("batchn", out["batch_n"])):
            # A fresh stream each time: nothing left over from the other consumer.
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_stream(stream)
            await js.add_stream(name=stream, subjects=[subject], storage=api.StorageType.FILE,
                                retention=api.RetentionPolicy.WORK_QUEUE)  # fmt: skip
            psub = await js.pull_subscribe(subject, durable=f"bench-{key}", stream=stream)
            lat = []
            for _ in range(min(args.starts, 20)):

                async def publish_later() -> float:
                    await asyncio.sleep(0.05)  # the fetch is waiting by then
                    t = loop.time()
                    await js.publish(subject, b"job")
                    return t

                pub = asyncio.create_task(publish_later())
                msgs = await psub.fetch(batch=batch, timeout=5.0)
                t1 = loop.time()
                t0 = await pub
                for m in msgs:
                    await m.ack()
                lat.append((t1 - t0) * 1e3)
            await psub.unsubscribe()
            s = sorted(lat)
            out[f"{key}_p50_ms"] = _lib.quantile(s, 0.5)
            out[f"{key}_p99_ms"] = _lib.quantile(s, 0.99)
        await js.delete_stream(stream)
    finally:
        await nc.close()
    return out


async def _load(b: Broker, meter: Meter, args: argparse.Namespace) -> dict[str, Any]:
    run_ids = []
    for _ in range(args.runs):
        sid = await b.store.create_session(USER, "bench load")
        run_ids.append(await b.start_run(sid, USER, input="a long answer, please"))
    pool = b.store.pool
    total_q = "SELECT coalesce(sum(last_seq), 0)::bigint, count(*) FILTER (WHERE last_seq > 0)" \
              " FROM runs WHERE run_id = ANY($1::text[])"  # fmt: skip
    async with asyncio.timeout(60):
        while (await pool.fetchrow(total_q, run_ids))[1] < len(run_ids):
            await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)  # every run is streaming
    timer = Timer(meter)
    n0 = (await pool.fetchrow(total_q, run_ids))[0]
    timer.start()
    await asyncio.sleep(args.window_s)
    n1 = (await pool.fetchrow(total_q, run_ids))[0]
    timer.stop()
    for run_id in run_ids:
        await b.interrupt(run_id, USER, "bench done")
    async with asyncio.timeout(60):
        while await pool.fetchval(
            "SELECT count(*) FROM runs WHERE run_id = ANY($1::text[]) AND ended_at IS NULL",
            run_ids,
        ):
            await asyncio.sleep(0.2)
    n = n1 - n0
    return {
        "events": n,
        "events_s": n / timer.wall_s,
        "target_events_s": args.runs * args.tokens_per_s,
        "worker_us_per_event": timer.us_per(n, "worker"),
        "worker_cpu_pct": 100 * timer.cpu_s["worker"] / timer.wall_s,
        "pg_us_per_event": timer.us_per(n, "postgres"),
        "nats_us_per_event": timer.us_per(n, "nats"),
        "others_cpu_cores": timer.others_cores(),
    }


async def _load_raw(b: Broker, meter: Meter, args: argparse.Namespace) -> dict[str, Any]:
    """The same runs and pace through `RunWriter.append` in this process."""
    writers = []
    for _ in range(args.runs):
        sid = await b.store.create_session(USER, "bench load raw")
        writers.append(await _gw.new_run(b, sid))
    seconds = min(args.window_s, 5.0)
    timer = Timer(meter)
    timer.start()
    await asyncio.gather(*(_paced(w, args.tokens_per_s, seconds) for w in writers))
    timer.stop()
    for w in writers:
        await w.append(events.RunEnd(status="completed"))
    await asyncio.gather(*(w.flush() for w in writers))
    n = int(args.tokens_per_s * seconds) * len(writers)
    return {
        "events": n,
        "events_s": n / timer.wall_s,
        "us_per_event": timer.us_per(n, "client"),
        "cpu_pct": 100 * timer.cpu_s["client"] / timer.wall_s,
        "pg_us_per_event": timer.us_per(n, "postgres"),
        "nats_us_per_event": timer.us_per(n, "nats"),
    }


async def _paced(w: Any, rate: float, seconds: float) -> None:
    loop = asyncio.get_running_loop()
    period = 1.0 / rate
    start = loop.time() + random.random() * period
    for i in range(int(rate * seconds)):
        delay = start + i * period - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await w.append(events.TextDelta(message_id="m_0001", delta=_lib.TOKENS[i % 30]))
    await w.flush()


# --- figures ----------------------------------------------------------------------


def _figures(
    per_trial: list[dict[str, Any]], args: argparse.Namespace, skip: set[str]
) -> list[Figure]:
    figs: list[Figure] = []
    raw = not args.no_raw

    def add(section: str, name: str, unit: str, which: str, key: str) -> None:
        figs.append(_lib.summarize(section, name, unit, [t[which][key] for t in per_trial]))

    if "stop" not in skip:
        sec = f"stop → provider connection closed ({args.stops} runs per trial, openai adapter)"
        add(sec, "interrupt call → provider saw close p50", "ms", "stop", "p50_ms")
        add(sec, "interrupt call → provider saw close p99", "ms", "stop", "p99_ms")
        add(sec, "interrupt call → provider saw close max", "ms", "stop", "max_ms")
        pooled = sorted(x for t in per_trial for x in t["stop"]["samples_ms"])
        figs.append(_lib.summarize(sec, "… p99 of all trials' runs pooled", "ms",
                                   [_lib.quantile(pooled, 0.99)]))  # fmt: skip
        add(sec, "interrupt returned → provider saw close p50", "ms", "stop", "after_return_p50_ms")
        add(sec, "Broker.interrupt call p50", "ms", "stop", "interrupt_call_p50_ms")
        add(sec, "interrupt call → run_end read p50", "ms", "stop", "to_run_end_p50_ms")
        if raw:
            add(
                sec, "raw: PostgreSQL one-row UPDATE transaction p50", "ms", "stop_raw", "pg_p50_ms"
            )
            add(sec, "raw: JetStream publish → push consumer p50", "ms", "stop_raw", "js_p50_ms")
            add(sec, "raw: JetStream publish → push consumer p99", "ms", "stop_raw", "js_p99_ms")
            add(sec, "raw: aiohttp close → provider saw it p50", "ms", "stop_raw", "close_p50_ms")
            add(sec, "raw: aiohttp close → provider saw it p99", "ms", "stop_raw", "close_p99_ms")
    if "start" not in skip:
        sec = f"POST run → run_start at a WebSocket subscriber ({args.starts} runs per trial)"
        add(sec, "p50", "ms", "start", "p50_ms")
        add(sec, "p90", "ms", "start", "p90_ms")
        add(sec, "p99", "ms", "start", "p99_ms")
        add(sec, "POST → 202 response p50", "ms", "start", "post_p50_ms")
        add(sec, "… POST → run row created p50", "ms", "start", "post_to_created_p50_ms")
        add(sec, "… run created → run_start appended (worker) p50", "ms", "start",
            "created_to_appended_p50_ms")  # fmt: skip
        add(sec, "… run created → run_start appended (worker) p90", "ms", "start",
            "created_to_appended_p90_ms")  # fmt: skip
        add(sec, "… run_start appended → received p50", "ms", "start",
            "appended_to_received_p50_ms")  # fmt: skip
        if raw:
            add(sec, "raw: JetStream work-queue hop, fetch(batch=1) p50", "ms", "start_raw",
                "batch1_p50_ms")  # fmt: skip
            n = max(args.runs, 8)
            add(sec, f"raw: … fetch(batch={n}) p50", "ms", "start_raw", "batchn_p50_ms")
    if "load" not in skip:
        sec = f"{args.runs} concurrent scripted runs at {args.tokens_per_s:g} tokens/s, one worker"
        add(sec, "committed", "events/s", "load", "events_s")
        add(sec, "target (runs x tokens/s)", "events/s", "load", "target_events_s")
        add(sec, "worker CPU", "µs/event", "load", "worker_us_per_event")
        add(sec, "worker CPU (of one core)", "%", "load", "worker_cpu_pct")
        add(sec, "PostgreSQL CPU", "µs/event", "load", "pg_us_per_event")
        add(sec, "nats-server CPU", "µs/event", "load", "nats_us_per_event")
        add(sec, "host CPU outside our processes", "cores", "load", "others_cpu_cores")
        if raw:
            add(sec, "raw: same pace through RunWriter.append, CPU", "µs/event", "load_raw",
                "us_per_event")  # fmt: skip
            add(sec, "raw: … committed", "events/s", "load_raw", "events_s")
    if _takeover.SKIP not in skip:
        figs += _takeover.figures(per_trial, args)
    return figs
