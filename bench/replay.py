"""replay: one client reads a stored --events-event run from its start,
through a real gateway process, next to a raw PostgreSQL read of the same
rows in the same run.

The run (--events token deltas between run_start and run_end, ~165-byte
events) is written once through the broker (`RunWriter.append`) before the
trials. Each trial then reads all of it, from the client process:

- WebSocket, `"batch": true` (the protocol's multi-event frames) and, for
  reference, one event per frame: subscribe from cursor 0 → the run_end's
  cursor received;
- SSE (`GET /v1/runs/{id}/events`, `Accept: text/event-stream`): request →
  end of the stream (it ends after run_end);
- JSON pages (`GET /v1/runs/{id}/events?after=N&limit=L`, L = the gateway's
  page_max_events): one request after the other until the last page.

Raw PostgreSQL (this process, asyncpg): the gateway's own page query
(`SELECT run_id, seq, cursor, type, payload FROM events WHERE run_id = $1 AND
seq > $2 ORDER BY seq LIMIT L`) in the same page size, one page after the
other, and the whole run through one cursor (prefetch 1,000) for reference.

The session (issue 13, item 7; --session-events, default 1,000,000, over
--session-runs runs, default 10, each run_start, token deltas, run_end, one
run after the other): written once straight into the tables by COPY (the
append path would take minutes; what is read is the same rows), then each
trial replays all of it from cursor 0 to one client over WebSocket
`"batch": true` and SSE (`GET /v1/sessions/{id}/events`, until the last
cursor arrived: a session's stream never ends), and reads the same rows
with the gateway's session page query (`... WHERE session_id = $1 AND
cursor > $2 ORDER BY cursor LIMIT L`) from this process. During every
gateway read the gateway's RSS is sampled every 100 ms: its growth (peak
minus the RSS just before the read, MiB) is printed for the 100k-event run
and the 1M-event session side by side: constant memory means the second is
not ~10x the first.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from broker import events
from broker.runtime import Broker

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import GatewayProc, LoadProc, Meter, rss_bytes

_PAGE_QUERY = (
    "SELECT run_id, seq, cursor, type, payload FROM events WHERE run_id = $1 AND seq > $2"
    " ORDER BY seq LIMIT $3"
)
_SESSION_PAGE_QUERY = (
    "SELECT run_id, seq, cursor, type, payload FROM events WHERE session_id = $1"
    " AND cursor > $2 ORDER BY cursor LIMIT $3"
)
_EVENT_COLUMNS = ("run_id", "seq", "session_id", "cursor", "ts", "type", "payload")
_RSS_EVERY_S = 0.1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=100_000, help="token deltas in the run (default: 100000)")  # fmt: skip
    p.add_argument("--session-events", type=int, default=1_000_000,
                   help="events in the session replayed whole (default: 1000000; 0: none)")  # fmt: skip
    p.add_argument("--session-runs", type=int, default=10,
                   help="runs the session's events are spread over (default: 10)")  # fmt: skip
    p.add_argument("--no-raw", action="store_true", help="skip the raw PostgreSQL reads")
    p.add_argument("--gateway-setting", action="append", default=[], metavar="NAME=VALUE",
                   help="a gateway setting (e.g. page_max_events=5000); repeatable")  # fmt: skip
    p.add_argument("--profile-gateway", type=Path, default=None, metavar="FILE",
                   help="run the gateway under cProfile (CPU time); pstats to FILE")  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    per_trial: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        b = await _gw.connect_broker(st)
        gw_settings = dict(kv.split("=", 1) for kv in args.gateway_setting)
        gw = await GatewayProc(st, profile=args.profile_gateway, **gw_settings).start()
        load = await LoadProc().start()
        meter.add("gateway", gw.pid)
        meter.add("wsload", load.pid)
        page = int(gw_settings.get("page_max_events", b.settings.page_max_events))
        raw: asyncpg.Connection | None = None
        try:
            session = await b.store.create_session(_gw.USER, "bench replay")
            t0 = time.perf_counter()
            w = await _gw.new_run(b, session)
            await _gw.append_burst(w, args.events)
            await _gw.end_run(w)
            total = w.last_seq
            progress(f"wrote {total:,} events in {time.perf_counter() - t0:.1f} s")
            big = ""
            if args.session_events:
                t0 = time.perf_counter()
                big = await _write_session(b, st.database_url, args.session_events,
                                           args.session_runs)  # fmt: skip
                progress(f"wrote a session of {args.session_events:,} events over "
                         f"{args.session_runs} runs (COPY) in {time.perf_counter() - t0:.1f} s")  # fmt: skip
            url = f"{gw.url}/v1/runs/{w.run_id}/events"
            big_url = f"{gw.url}/v1/sessions/{big}/events"
            await _warm_up(b, session, gw, load, page)
            # The raw reads get what the gateway has: a long-lived connection
            # that has run the query before. (A fresh connection read these
            # pages ~2-3x slower for its whole first pass, in an experiment
            # on this machine; a warm one up to ~900k rows/s.)
            raw = None if args.no_raw else await asyncpg.connect(st.database_url)
            if raw is not None:
                await _raw_pages(raw, w.run_id, page, meter)
                await _raw_cursor(raw, w.run_id, meter)
                if big:
                    await _raw_pages(raw, big, page, meter, _SESSION_PAGE_QUERY)
            for trial in range(args.trials):
                t: dict[str, Any] = {}
                reads: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
                    "ws_batch": lambda: load.call("ws_replay", url=gw.ws_url, token=_gw.token(),
                                                  topic=f"run:{w.run_id}", last=total, batch=True),
                    "ws_single": lambda: load.call("ws_replay", url=gw.ws_url, token=_gw.token(),
                                                   topic=f"run:{w.run_id}", last=total, batch=False),
                    "sse": lambda: load.call("sse_replay", url=url, token=_gw.token()),
                    "pages": lambda: load.call("page_replay", url=url, token=_gw.token(),
                                               limit=page),
                }  # fmt: skip
                if big:
                    reads |= {
                        "session_ws_batch": lambda: load.call(
                            "ws_replay", url=gw.ws_url, token=_gw.token(), topic=f"session:{big}",
                            last=args.session_events, batch=True),
                        "session_sse": lambda: load.call(
                            "sse_replay", url=big_url, token=_gw.token(),
                            events=args.session_events),
                    }  # fmt: skip
                for name, read in reads.items():
                    want = args.session_events if name.startswith("session_") else total
                    timer = Timer(meter)
                    async with _rss_growth(gw.pid) as rss:
                        timer.start()
                        r = await read()
                        timer.stop()
                    if r["events"] != want:
                        raise RuntimeError(f"{name}: read {r['events']} of {want} events")
                    t[name] = _result(r["events"], r["seconds"], timer)
                    t[name]["rss_growth_mib"] = rss.growth_mib
                    t[name]["rss_before_mib"] = rss.before / 2**20
                    if "to_eof_s" in r:
                        t[name]["to_eof_s"] = r["to_eof_s"]
                    progress(f"trial {trial + 1}: {name}: {t[name]['events_s']:,.0f} events/s, "
                             f"gateway {t[name]['gateway_us_per_event']:.2f} µs/event, "
                             f"RSS +{rss.growth_mib:.1f} MiB")  # fmt: skip
                if raw is not None:
                    t["raw_pages"] = await _raw_pages(raw, w.run_id, page, meter)
                    t["raw_cursor"] = await _raw_cursor(raw, w.run_id, meter)
                    progress(f"trial {trial + 1}: raw pages: {t['raw_pages']['events_s']:,.0f}, "
                             f"raw cursor: {t['raw_cursor']['events_s']:,.0f} rows/s")  # fmt: skip
                    if big:
                        t["session_raw_pages"] = await _raw_pages(raw, big, page, meter,
                                                                  _SESSION_PAGE_QUERY)  # fmt: skip
                        progress(f"trial {trial + 1}: session raw pages: "
                                 f"{t['session_raw_pages']['events_s']:,.0f} rows/s")  # fmt: skip
                per_trial.append(t)
        finally:
            if raw is not None:
                await raw.close()
            await load.stop()
            await gw.stop()
            await b.close()
    return {
        "servers": versions,
        "run_events": total,
        "session_events": args.session_events,
        "figures": _figures(per_trial, args, total),
        "trials": per_trial,
    }


async def _write_session(b: Broker, dsn: str, n: int, runs: int) -> str:
    """A session of `n` events over `runs` ended runs (each run_start, token
    deltas, run_end; the runs one after the other), COPYed straight into
    `events` with the runs' and session's heads set as the append path
    would have left them; returns the session id."""
    session = await b.store.create_session(_gw.USER, "bench replay: session")
    run_ids = [await b.store.create_run(session, _gw.USER, model="bench") for _ in range(runs)]
    per_run = [n // runs + (1 if r < n % runs else 0) for r in range(runs)]
    tokens = _lib.TOKENS
    now_ms = int(time.time() * 1000)
    conn = await asyncpg.connect(dsn)
    try:
        cursor = 0
        for r, (run_id, m) in enumerate(zip(run_ids, per_run, strict=True)):
            rows: list[tuple[Any, ...]] = []
            for seq in range(1, m + 1):
                ev: events.Event
                if seq == 1:
                    ev = events.RunStart(model="bench", started_by=_gw.USER)
                elif seq == m:
                    ev = events.RunEnd(status="completed")
                else:
                    ev = events.TextDelta(message_id=f"m_{r:04d}", delta=tokens[seq % len(tokens)])
                ev.run_id, ev.session_id, ev.seq, ev.ts = run_id, session, seq, now_ms
                tag = ev.__struct_config__.tag
                cursor += 1
                rows.append((run_id, seq, session, cursor, now_ms, tag, events.encode(ev)))
            await conn.copy_records_to_table("events", records=rows, columns=_EVENT_COLUMNS)
            await conn.execute(
                "UPDATE runs SET status = 'completed', ended_at = now(), last_seq = $2"
                " WHERE run_id = $1",
                run_id, m,
            )  # fmt: skip
        await conn.execute(
            "UPDATE sessions SET last_cursor = $2 WHERE session_id = $1", session, cursor
        )
        await conn.execute("ANALYZE events")
    finally:
        await conn.close()
    return session


class _Rss:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = self.peak = rss_bytes(pid)

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.before) / 2**20

    async def sample(self) -> None:
        while True:
            self.peak = max(self.peak, rss_bytes(self.pid))
            await asyncio.sleep(_RSS_EVERY_S)


@contextlib.asynccontextmanager
async def _rss_growth(pid: int) -> AsyncIterator[_Rss]:
    """The RSS of `pid` sampled every 100 ms while the block runs (and once at its end)."""
    rss = _Rss(pid)
    task = asyncio.create_task(rss.sample())
    try:
        yield rss
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        rss.peak = max(rss.peak, rss_bytes(pid))


async def _warm_up(b: Any, session: str, gw: GatewayProc, load: LoadProc, page: int) -> None:
    """Every read path once on a small run, not measured: the gateway's first
    read otherwise pays for database connections, prepared statements and
    first-use allocations."""
    w = await _gw.new_run(b, session)
    await _gw.append_burst(w, 3 * page)
    await _gw.end_run(w)
    url = f"{gw.url}/v1/runs/{w.run_id}/events"
    for batch in (True, False):
        await load.call("ws_replay", url=gw.ws_url, token=_gw.token(), topic=f"run:{w.run_id}",
                        last=w.last_seq, batch=batch)  # fmt: skip
    await load.call("sse_replay", url=url, token=_gw.token())
    await load.call("page_replay", url=url, token=_gw.token(), limit=page)


def _result(n: int, seconds: float, timer: Timer) -> dict[str, Any]:
    return {
        "events": n,
        "seconds": seconds,
        "events_s": n / seconds,
        "gateway_us_per_event": timer.us_per(n, "gateway"),
        "gateway_cpu_pct": 100 * timer.cpu_s["gateway"] / timer.wall_s,
        "client_cpu_pct": 100 * timer.cpu_s["wsload"] / timer.wall_s,
        "pg_us_per_event": timer.us_per(n, "postgres"),
        "others_cpu_cores": timer.others_cores(),
    }


async def _raw_pages(
    conn: asyncpg.Connection, ident: str, limit: int, meter: Meter, query: str = _PAGE_QUERY
) -> dict[str, Any]:
    timer = Timer(meter)
    timer.start()
    t0 = time.perf_counter()
    after = n = 0
    pos = 1 if query is _PAGE_QUERY else 2  # seq, or the session's cursor
    while True:
        rows = await conn.fetch(query, ident, after, limit)
        if not rows:
            break
        n += len(rows)
        after = rows[-1][pos]
    seconds = time.perf_counter() - t0
    timer.stop()
    r = _result(n, seconds, timer)
    r["client_us_per_event"] = timer.us_per(n, "client")
    return r


async def _raw_cursor(conn: asyncpg.Connection, run_id: str, meter: Meter) -> dict[str, Any]:
    timer = Timer(meter)
    timer.start()
    t0 = time.perf_counter()
    n = 0
    async with conn.transaction():
        async for _ in conn.cursor(_PAGE_QUERY, run_id, 0, 2**31, prefetch=1000):
            n += 1
    seconds = time.perf_counter() - t0
    timer.stop()
    return _result(n, seconds, timer)


def _figures(per_trial: list[dict[str, Any]], args: argparse.Namespace, total: int) -> list[Figure]:
    figs: list[Figure] = []

    def add(section: str, name: str, unit: str, which: str, key: str) -> None:
        figs.append(_lib.summarize(section, name, unit, [t[which][key] for t in per_trial]))

    def ratio(section: str, name: str, which: str) -> None:
        vals = [t[which]["events_s"] / t["raw_pages"]["events_s"] for t in per_trial]
        figs.append(_lib.summarize(section, name, "ratio", vals))

    sec = f"replay of a {total:,}-event run to one client"
    names = {
        "ws_batch": 'WebSocket, "batch": true',
        "ws_single": "WebSocket, one event per frame",
        "sse": "SSE",
        "pages": "JSON pages",
    }
    for which, label in names.items():
        add(sec, label, "events/s", which, "events_s")
    if not args.no_raw:
        add(sec, "raw PostgreSQL, same page query and size", "rows/s", "raw_pages", "events_s")
        add(sec, "raw PostgreSQL, one cursor (prefetch 1000)", "rows/s", "raw_cursor", "events_s")
        for which, label in names.items():
            ratio(sec, f"{label} / raw pages", which)
        for which, label in names.items():
            vals = [t[which]["events_s"] / t["raw_cursor"]["events_s"] for t in per_trial]
            figs.append(_lib.summarize(sec, f"{label} / raw cursor", "ratio", vals))
    for which, label in names.items():
        add(sec, f"{label}: gateway CPU", "µs/event", which, "gateway_us_per_event")
        add(sec, f"{label}: gateway CPU (of one core)", "%", which, "gateway_cpu_pct")
        add(sec, f"{label}: client CPU (of one core)", "%", which, "client_cpu_pct")
        add(sec, f"{label}: PostgreSQL CPU", "µs/event", which, "pg_us_per_event")
    add(sec, "SSE: request → end of stream (after run_end)", "s", "sse", "to_eof_s")
    if not args.no_raw:
        add(sec, "raw pages: client CPU", "µs/row", "raw_pages", "client_us_per_event")
        add(sec, "raw pages: PostgreSQL CPU", "µs/row", "raw_pages", "pg_us_per_event")
    add(sec, "host CPU outside our processes", "cores", "ws_batch", "others_cpu_cores")
    for which, label in names.items():
        add(sec, f"{label}: gateway RSS growth during the replay", "MiB", which, "rss_growth_mib")
    if args.session_events:
        sec = (f"replay of a {args.session_events:,}-event session ({args.session_runs} runs)"
               " to one client (issue 13, item 7)")  # fmt: skip
        snames = {"session_ws_batch": 'WebSocket, "batch": true', "session_sse": "SSE"}
        for which, label in snames.items():
            add(sec, label, "events/s", which, "events_s")
        if not args.no_raw:
            add(sec, "raw PostgreSQL, same page query and size", "rows/s", "session_raw_pages",
                "events_s")  # fmt: skip
            for which, label in snames.items():
                vals = [t[which]["events_s"] / t["session_raw_pages"]["events_s"]
                        for t in per_trial]  # fmt: skip
                figs.append(_lib.summarize(sec, f"{label} / raw pages (≥ 0.5)", "ratio", vals))
        for which, label in snames.items():
            add(sec, f"{label}: gateway CPU", "µs/event", which, "gateway_us_per_event")
            add(sec, f"{label}: gateway CPU (of one core)", "%", which, "gateway_cpu_pct")
            add(sec, f"{label}: PostgreSQL CPU", "µs/event", which, "pg_us_per_event")
        for which, label in snames.items():
            add(sec, f"{label}: gateway RSS before", "MiB", which, "rss_before_mib")
            add(sec, f"{label}: gateway RSS growth during the replay", "MiB", which,
                "rss_growth_mib")  # fmt: skip
        add(sec, "gateway RSS growth, 100k-event run (WebSocket batch)", "MiB", "ws_batch",
            "rss_growth_mib")  # fmt: skip
        if not args.no_raw:
            add(sec, "raw pages: client CPU", "µs/row", "session_raw_pages", "client_us_per_event")
            add(sec, "raw pages: PostgreSQL CPU", "µs/row", "session_raw_pages",
                "pg_us_per_event")  # fmt: skip
        add(sec, "host CPU outside our processes", "cores", "session_ws_batch", "others_cpu_cores")
    return figs
