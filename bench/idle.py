"""idle: gateway memory per idle WebSocket connection, at --conns connections,
next to a raw aiohttp server's, nats-server's and python-socketio's in the
same run.

Per trial, a fresh gateway process (`runlog gateway`) is warmed up (a few
connections open, subscribe and close, so code paths, the database pool and
first allocations are not charged to the measured connections), then its RSS
is read (before); the client process opens --conns WebSockets, each
authenticated at the upgrade (bearer token) and answered with `hello`; RSS
after (unsubscribed). Then each subscribes to one of --sessions sessions
(`{"type":"subscribe","session_id":...}`, the way a collaborative console
follows its session) and waits for `subscribed` and for every catch-up
replay to end (the gateway's replays_running/waiting gauges at 0); RSS
again (subscribed). Each
figure is (RSS after - RSS before) / connections, measured --settle-s after
the last connection or subscription.

Raw, same trial: a fresh raw aiohttp server (bench/_rawws.py: a plain
`WebSocketResponse` per connection, no heartbeat), the same client, the same
number of connections.

Peers, same trial, each a fresh server read the same way (warm-up, RSS
before, --conns connections, RSS after), with the same client:
nats-server's own WebSocket listener (bench/_procs.py `NatsWsServer`; each
connection has sent CONNECT and `SUB fan 1`, answered by PONG: subscribed)
and python-socketio on aiohttp (bench/_sioserver.py; each connection is in
the room). They run in the first --peer-trials trials (default 1: their
figure is steady, and each costs ~35 s); --no-peers skips them.

Both this process and the children raise RLIMIT_NOFILE to its hard limit;
the client spreads its connections over source addresses 127.0.0.2… so
ephemeral ports and TIME_WAIT of earlier trials never run out.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path
from typing import Any

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Stack
from ._procs import (
    NO_CONNECTION_CAPS,
    GatewayProc,
    LoadProc,
    NatsWsServer,
    RawServerProc,
    SioServerProc,
)
from ._wsload import raise_fd_limit

KIB = 1024


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--conns", type=int, default=10_000, help="connections (default: 10000)")
    p.add_argument("--sessions", type=int, default=100,
                   help="sessions the connections subscribe to, round robin (default: 100)")  # fmt: skip
    p.add_argument("--settle-s", type=float, default=2.0, help="wait before reading RSS (default: 2)")  # fmt: skip
    p.add_argument("--sources", type=int, default=32, help="client source addresses (default: 32)")  # fmt: skip
    p.add_argument("--no-raw", action="store_true", help="skip the raw aiohttp server")
    p.add_argument("--tracemalloc-conns", type=int, default=0, metavar="N",
                   help="after the trials, one more gateway under tracemalloc: its Python heap "
                   "per subscribed connection at N connections, by source line (default: 0, off)")  # fmt: skip
    p.add_argument("--peer-trials", type=int, default=1,
                   help="trials that also measure the peers (default: 1; their figure is steady)")  # fmt: skip
    p.add_argument("--no-peers", action="store_true",
                   help="skip nats-server WebSocket and python-socketio")  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    limit = raise_fd_limit()
    if limit < args.conns + 1000:
        raise SystemExit(
            f"RLIMIT_NOFILE hard limit {limit} is too low for {args.conns} connections"
        )
    per_trial: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        b = await _gw.connect_broker(st)
        try:
            sessions = [
                await b.store.create_session(_gw.USER, "bench idle") for _ in range(args.sessions)
            ]
            for trial in range(args.trials):
                t: dict[str, Any] = {"gateway": await _gateway(st, sessions, args)}
                g = t["gateway"]
                progress(f"trial {trial + 1}: gateway {g['unsub_kib']:.1f} KiB/conn unsubscribed, "
                         f"{g['sub_kib']:.1f} KiB/conn subscribed")  # fmt: skip
                if not args.no_raw:
                    t["raw"] = r = await _raw(args)
                    progress(f"trial {trial + 1}: raw aiohttp {r['kib']:.1f} KiB/conn")
                if not args.no_peers and trial < args.peer_trials:
                    t["nats"] = r = await _nats(args)
                    progress(f"trial {trial + 1}: nats-server WS {r['kib']:.1f} KiB/conn")
                    t["sio"] = r = await _sio(args)
                    progress(f"trial {trial + 1}: python-socketio {r['kib']:.1f} KiB/conn")
                per_trial.append(t)
            heap = await _heap(st, sessions, args) if args.tracemalloc_conns else None
        finally:
            await b.close()
    figs = _figures(per_trial, args)
    if heap is not None:
        sec = f"Python heap of the gateway per subscribed connection (tracemalloc, {heap['conns']:,} connections)"
        figs.append(_lib.summarize(sec, "all", "B/conn", [heap["total"]]))
        for name, size in heap["by_package"].items():
            if abs(size) < 10:
                continue
            figs.append(_lib.summarize(sec, f"allocated in {name}", "B/conn", [size]))
        for line, size, blocks in heap["top_lines"]:
            figs.append(_lib.summarize(sec, f"{line} ({blocks:.1f} blocks)", "B/conn", [size]))
    return {"servers": versions, "figures": figs, "trials": per_trial, "heap": heap}


async def _gateway(st: Stack, sessions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    gw = await GatewayProc(st, None, **NO_CONNECTION_CAPS).start()
    load = await LoadProc().start()
    n = args.conns
    token = _gw.token()
    try:
        # Warm-up, not measured.
        await load.call("connect", url=gw.ws_url, n=20, token=token, protocol="runlog.v1")
        await load.call("subscribe", topics=[f"session:{s}" for s in sessions[:20]])
        await load.call("close_all")
        await asyncio.sleep(args.settle_s)
        rss0 = gw.rss()
        c = await load.call("connect", url=gw.ws_url, n=n, token=token, protocol="runlog.v1",
                            sources=args.sources, timeout_s=600)  # fmt: skip
        await asyncio.sleep(args.settle_s)
        rss1 = gw.rss()
        s = await load.call("subscribe", topics=[f"session:{x}" for x in sessions], timeout_s=600)
        if s["n_errors"]:
            raise RuntimeError(f"subscribe failed ({s['n_errors']}): {s['errors']}")
        # `subscribed` comes before the catch-up replay (from PostgreSQL, in
        # turns): an idle subscription is one that has gone live.
        live_s = await gw.wait_replays_done()
        await asyncio.sleep(args.settle_s)
        rss2 = gw.rss()
        stats = await load.call("stats")
        client_rss = (await load.call("rss"))["rss"]
        if stats["closed"]:
            raise RuntimeError(f"{stats['closed']} connections closed: {stats['closes']}")
    finally:
        await load.stop()
        await gw.stop(timeout_s=30)
    return {
        "conns": n,
        "rss_before": rss0,
        "rss_unsub": rss1,
        "rss_sub": rss2,
        "unsub_kib": (rss1 - rss0) / n / KIB,
        "sub_kib": (rss2 - rss0) / n / KIB,
        "subscription_kib": (rss2 - rss1) / n / KIB,
        "connect_s": c["seconds"],
        "subscribe_s": s["seconds"],
        "live_s": s["seconds"] + live_s,
        "client_kib": (client_rss - c["rss0"]) / n / KIB,
    }


async def _heap(st: Stack, sessions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """What the gateway's Python heap holds per subscribed idle connection:
    the difference of two tracemalloc snapshots (after a full collection),
    before the connections and once they are all live, by source line of
    the allocation (one frame) and by package. tracemalloc slows the
    gateway down and adds its own overhead to RSS: only these sizes count."""
    n = args.tracemalloc_conns
    with tempfile.TemporaryDirectory(prefix="runlog-bench-heap-") as tmp:
        gw = GatewayProc(st, None, **NO_CONNECTION_CAPS)
        gw.traced = Path(tmp) / "heap.snapshot"
        await gw.start()
        load = await LoadProc().start()
        token = _gw.token()
        try:
            await load.call("connect", url=gw.ws_url, n=20, token=token, protocol="runlog.v1")
            await load.call("subscribe", topics=[f"session:{s}" for s in sessions[:20]])
            await load.call("close_all")
            await asyncio.sleep(args.settle_s)
            before = await gw.heap_snapshot()
            await load.call("connect", url=gw.ws_url, n=n, token=token, protocol="runlog.v1",
                            sources=args.sources, timeout_s=600)  # fmt: skip
            s = await load.call("subscribe", topics=[f"session:{x}" for x in sessions],
                                timeout_s=600)  # fmt: skip
            if s["n_errors"]:
                raise RuntimeError(f"subscribe failed ({s['n_errors']}): {s['errors']}")
            await gw.wait_replays_done()
            await asyncio.sleep(args.settle_s)
            after = await gw.heap_snapshot()
        finally:
            await load.stop()
            await gw.stop(timeout_s=60)
    stats = after.compare_to(before, "lineno")
    by_package: dict[str, float] = {}
    for st_ in stats:
        pkg = _package(st_.traceback[0].filename)
        by_package[pkg] = by_package.get(pkg, 0.0) + st_.size_diff / n
    top = sorted(stats, key=lambda x: -x.size_diff)[:25]
    return {
        "conns": n,
        "total": sum(x.size_diff for x in stats) / n,
        "by_package": dict(sorted(by_package.items(), key=lambda kv: -kv[1])),
        "top_lines": [
            (
                _short(x.traceback[0].filename) + f":{x.traceback[0].lineno}",
                x.size_diff / n,
                x.count_diff / n,
            )
            for x in top
        ],
    }


def _package(filename: str) -> str:
    parts = Path(filename).parts
    for marker in ("site-packages", "python3.11"):
        if marker in parts:
            rest = parts[parts.index(marker) + 1 :]
            return rest[0] if marker == "site-packages" or len(rest) < 2 else f"stdlib {rest[0]}"
    for mine in ("gateway", "broker", "runlog"):
        if mine in parts:
            return mine
    return "other"


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for marker in ("site-packages", "python3.11"):
        if marker in parts:
            return "/".join(parts[parts.index(marker) + 1 :])
    for mine in ("gateway", "broker", "runlog"):
        if mine in parts:
            return "/".join(parts[parts.index(mine) :])
    return filename


async def _raw(args: argparse.Namespace) -> dict[str, Any]:
    raw = await RawServerProc().start()
    load = await LoadProc().start()
    n = args.conns
    try:
        await load.call("connect", url=raw.ws_url, n=20, hello=False)
        await load.call("close_all")
        await asyncio.sleep(args.settle_s)
        rss0 = raw.rss()
        c = await load.call("connect", url=raw.ws_url, n=n, hello=False, sources=args.sources,
                            timeout_s=600)  # fmt: skip
        await asyncio.sleep(args.settle_s)
        rss1 = raw.rss()
    finally:
        await load.stop()
        await raw.stop(timeout_s=30)
    return {"conns": n, "rss_before": rss0, "rss_after": rss1, "kib": (rss1 - rss0) / n / KIB,
            "connect_s": c["seconds"]}  # fmt: skip


async def _peer(server: NatsWsServer | SioServerProc, args: argparse.Namespace,
                proto: str) -> dict[str, Any]:  # fmt: skip
    """A peer server, already started: RSS per subscribed connection."""
    load = await LoadProc().start()
    n = args.conns
    try:
        await load.call("connect", url=server.ws_url, n=20, proto=proto)
        await load.call("close_all")
        await asyncio.sleep(args.settle_s)
        rss0 = server.rss()
        c = await load.call("connect", url=server.ws_url, n=n, proto=proto, sources=args.sources,
                            timeout_s=600)  # fmt: skip
        await asyncio.sleep(args.settle_s)
        rss1 = server.rss()
        held = await server.connections()
        if held < n:
            raise RuntimeError(f"{proto} server holds {held} of {n} connections")
    finally:
        await load.stop()
        await server.stop()
    return {"conns": n, "rss_before": rss0, "rss_after": rss1, "kib": (rss1 - rss0) / n / KIB,
            "connect_s": c["seconds"]}  # fmt: skip


async def _nats(args: argparse.Namespace) -> dict[str, Any]:
    server = NatsWsServer()
    await server.start()
    return await _peer(server, args, "nats")


async def _sio(args: argparse.Namespace) -> dict[str, Any]:
    return await _peer(await SioServerProc().start(), args, "sio")


def _figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []

    def add(section: str, name: str, unit: str, which: str, key: str) -> None:
        figs.append(_lib.summarize(section, name, unit, [t[which][key] for t in per_trial]))

    sec = f"{args.conns:,} idle WebSocket connections, one gateway process"
    add(
        sec, "gateway RSS, authenticated, subscribed to a session", "KiB/conn", "gateway", "sub_kib"
    )
    add(sec, "gateway RSS, authenticated, not subscribed", "KiB/conn", "gateway", "unsub_kib")
    add(sec, "… of which the subscription", "KiB/conn", "gateway", "subscription_kib")
    if not args.no_raw:
        add(sec, "raw aiohttp server RSS", "KiB/conn", "raw", "kib")
        vals = [t["gateway"]["sub_kib"] / t["raw"]["kib"] for t in per_trial]
        figs.append(_lib.summarize(sec, "gateway (subscribed) / raw", "ratio", vals))
    if not args.no_peers and args.peer_trials:
        peers = [t for t in per_trial if "nats" in t]
        for which, name in (("nats", "nats-server WebSocket RSS, subscribed"),
                            ("sio", "python-socketio RSS, in a room")):  # fmt: skip
            figs.append(_lib.summarize(sec, name, "KiB/conn", [t[which]["kib"] for t in peers]))
    figs.append(_lib.summarize(sec, "gateway RSS before the connections", "MiB",
                               [t["gateway"]["rss_before"] / KIB / KIB for t in per_trial]))  # fmt: skip
    add(sec, "time to open and authenticate all", "s", "gateway", "connect_s")
    add(sec, "time to subscribe all", "s", "gateway", "subscribe_s")
    add(sec, "… until every subscription is live (catch-ups done)", "s", "gateway", "live_s")
    add(sec, "client process RSS", "KiB/conn", "gateway", "client_kib")
    return figs
