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
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import asyncpg

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import GatewayProc, LoadProc, Meter

_PAGE_QUERY = (
    "SELECT run_id, seq, cursor, type, payload FROM events WHERE run_id = $1 AND seq > $2"
    " ORDER BY seq LIMIT $3"
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--events", type=int, default=100_000, help="token deltas in the run (default: 100000)")  # fmt: skip
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
            url = f"{gw.url}/v1/runs/{w.run_id}/events"
            await _warm_up(b, session, gw, load, page)
            # The raw reads get what the gateway has: a long-lived connection
            # that has run the query before. (A fresh connection read these
            # pages ~2-3x slower for its whole first pass, in an experiment
            # on this machine; a warm one up to ~900k rows/s.)
            raw = None if args.no_raw else await asyncpg.connect(st.database_url)
            if raw is not None:
                await _raw_pages(raw, w.run_id, page, meter)
                await _raw_cursor(raw, w.run_id, meter)
            for trial in range(args.trials):
                t: dict[str, Any] = {}
                reads = {
                    "ws_batch": lambda: load.call("ws_replay", url=gw.ws_url, token=_gw.token(),
                                                  topic=f"run:{w.run_id}", last=total, batch=True),
                    "ws_single": lambda: load.call("ws_replay", url=gw.ws_url, token=_gw.token(),
                                                   topic=f"run:{w.run_id}", last=total, batch=False),
                    "sse": lambda: load.call("sse_replay", url=url, token=_gw.token()),
                    "pages": lambda: load.call("page_replay", url=url, token=_gw.token(),
                                               limit=page),
                }  # fmt: skip
                for name, read in reads.items():
                    timer = Timer(meter)
                    timer.start()
                    r = await read()
                    timer.stop()
                    if r["events"] != total:
                        raise RuntimeError(f"{name}: read {r['events']} of {total} events")
                    t[name] = _result(r["events"], r["seconds"], timer)
                    if "to_eof_s" in r:
                        t[name]["to_eof_s"] = r["to_eof_s"]
                    progress(f"trial {trial + 1}: {name}: {t[name]['events_s']:,.0f} events/s")
                if raw is not None:
                    t["raw_pages"] = await _raw_pages(raw, w.run_id, page, meter)
                    t["raw_cursor"] = await _raw_cursor(raw, w.run_id, meter)
                    progress(f"trial {trial + 1}: raw pages: {t['raw_pages']['events_s']:,.0f}, "
                             f"raw cursor: {t['raw_cursor']['events_s']:,.0f} rows/s")  # fmt: skip
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
        "figures": _figures(per_trial, args, total),
        "trials": per_trial,
    }


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
    conn: asyncpg.Connection, run_id: str, limit: int, meter: Meter
) -> dict[str, Any]:
    timer = Timer(meter)
    timer.start()
    t0 = time.perf_counter()
    after = n = 0
    while True:
        rows = await conn.fetch(_PAGE_QUERY, run_id, after, limit)
        if not rows:
            break
        n += len(rows)
        after = rows[-1][1]
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
    return figs
