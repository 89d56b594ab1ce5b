"""Steady load while one gateway and one worker are drained and replaced.

2 gateways and 2 workers run as real `runlog` processes. 50 runs (scripted
text-only answers, 300 tokens at 20 tokens/s, i.e. ~15 s of streaming each)
are watched by 200 WebSocket clients spread over both gateways, each client
following two runs, each run followed by eight clients (half of them in
batch mode). As the first wave of runs starts, a new gateway and a new
worker are started, and once it has streamed a while one old gateway and one
old worker get SIGTERM (a rolling replacement). Clients behave as the protocol asks: on
`server_draining` or a dropped connection they reconnect (to another
gateway, with jitter) and resubscribe from the last cursor they received.

Asserted: every client ends with every event of both its runs exactly once,
in order (a coalesced delta counts for the positions it covers), matching
PostgreSQL; every run reached `run_end` (none stuck); both drained processes
exited cleanly. A run that was streaming on the drained worker past
`drain_timeout_s` ends with run_error `worker_draining` (docs/workers.md):
that is a complete, ended log too.

Workers are capped at 15 runs each, so 20 runs wait queued at first and the
replacement worker has work to take. The test uses a database of its own, so
the workers' reapers never touch runs other tests left behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import secrets
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import pytest
import pytest_asyncio

from broker import migrate
from broker.constants import JOBS_STREAM
from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth

from .procs import RunlogProcess

RUNS = 50
CLIENTS = 200
TOKENS_PER_RUN = 300
PROCESS_ENV = {
    "RUNLOG_SCRIPTED_TOKENS_PER_S": "20",
    "RUNLOG_WORKER_CONCURRENCY": "15",
    "RUNLOG_DRAIN_TIMEOUT_S": "3",
    "RUNLOG_GATEWAY_DRAIN_S": "5",
    # All 200 followers are one user, and a drained gateway's move to the
    # others: past the default per-user cap, which this test is not about.
    "RUNLOG_MAX_CONNECTIONS_PER_USER": "0",
}
_MERGEABLE = {"text_delta": "delta", "reasoning_delta": "delta", "tool_args_delta": "partial_json"}


@pytest_asyncio.fixture(loop_scope="session")
async def own_database(settings: Settings) -> AsyncIterator[str]:
    """A fresh, migrated database on the session's PostgreSQL server."""
    name = f"runlog_scale_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(settings.database_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    parts = urlsplit(settings.database_url)
    url = urlunsplit(parts._replace(path="/" + name))
    await migrate.apply(url)
    try:
        yield url
    finally:
        admin = await asyncpg.connect(settings.database_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


class Follower:
    """One WebSocket client following some runs through gateway changes."""

    def __init__(self, n: int, run_ids: list[str], batch: bool) -> None:
        self.n = n
        self.batch = batch
        self.topics = [f"run:{r}" for r in run_ids]
        self.last = dict.fromkeys(self.topics, 0)
        self.ended: set[str] = set()
        # Per topic: (first, last, type, text) of every event frame received.
        self.got: dict[str, list[tuple[int, int, str, str]]] = {t: [] for t in self.topics}
        self.problems: list[str] = []
        self.disconnects: list[str] = []
        self.gateways: list[str] = []
        self.current = ""

    @property
    def done(self) -> bool:
        return len(self.ended) == len(self.topics)

    def _event(self, topic: str, first: int, last: int, event: dict[str, Any]) -> None:
        if first != self.last[topic] + 1:
            kind = "duplicate" if first <= self.last[topic] else "gap"
            self.problems.append(f"{topic}: {kind}: got {first}..{last} after {self.last[topic]}")
        self.last[topic] = max(self.last[topic], last)
        typ = event["type"]
        self.got[topic].append((first, last, typ, str(event.get(_MERGEABLE.get(typ, ""), ""))))
        if typ == "run_end":
            self.ended.add(topic)

    def _message(self, m: dict[str, Any]) -> None:
        match m["type"]:
            case "event":
                self._event(m["topic"], m.get("from", m["cursor"]), m["cursor"], m["event"])
            case "events":
                for i, e in enumerate(m["events"]):
                    self._event(m["topic"], m["cursor"] + i, m["cursor"] + i, e)
            case "disconnect":
                self.disconnects.append(m["code"])
            case "error":
                self.problems.append(f"error reply: {m}")

    async def follow(
        self, http: aiohttp.ClientSession, token: str, pick: Any, deadline: float
    ) -> None:
        url = pick(None, self.n)
        while not self.done:
            if time.monotonic() > deadline:
                self.problems.append("did not finish in time")
                return
            self.current = url
            try:
                async with http.ws_connect(
                    url.replace("http", "ws") + "/v1/ws",
                    headers={"Authorization": f"Bearer {token}"},
                ) as ws:
                    self.gateways.append(url)
                    for topic in self.topics:
                        if topic not in self.ended:
                            await ws.send_str(json.dumps({
                                "type": "subscribe", "run_id": topic[4:],
                                "after": self.last[topic], "batch": self.batch,
                            }))  # fmt: skip
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        self._message(json.loads(msg.data))
                        if self.done:
                            return
            except (aiohttp.ClientError, ConnectionError, OSError, TimeoutError):
                pass  # refused (stopped or draining gateway) or dropped: resume elsewhere
            # Reconnect with jitter, to another gateway, from our own cursors.
            await asyncio.sleep(random.uniform(0.05, 0.5))
            url = pick(url, self.n)


async def _start(p: RunlogProcess, ready_path: str, timeout_s: float = 60.0) -> None:
    await p.start()
    async with aiohttp.ClientSession() as h, asyncio.timeout(timeout_s):
        while True:
            assert p.proc is not None and p.proc.returncode is None, p.log_tail()
            try:
                async with h.get(p.url + ready_path) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)


def _worker(s: Settings, log_dir: Path) -> RunlogProcess:
    p = RunlogProcess("worker", s, log_dir, **PROCESS_ENV)
    # The worker's /metrics and /healthz on the port the helper picked.
    p.env["RUNLOG_WORKER_METRICS_PORT"] = str(p.port)
    return p


@pytest.mark.timeout(300)
async def test_drain_and_replace_under_steady_load(
    settings: Settings, own_database: str, tmp_root: Path
) -> None:
    s = dataclasses.replace(settings, database_url=own_database)
    log_dir = tmp_root / "scale"
    log_dir.mkdir(exist_ok=True)
    gateways = [RunlogProcess("gateway", s, log_dir, **PROCESS_ENV) for _ in range(2)]
    workers = [_worker(s, log_dir) for _ in range(2)]
    spares = [RunlogProcess("gateway", s, log_dir, **PROCESS_ENV), _worker(s, log_dir)]
    every = [*gateways, *workers, *spares]
    broker = await Broker.connect(s, name="test-scale")
    t0 = time.monotonic()
    try:
        # Job messages other tests left are for runs of another database.
        await broker.bus.js.purge_stream(JOBS_STREAM)
        await asyncio.gather(
            *(_start(g, "/readyz") for g in gateways), *(_start(w, "/healthz") for w in workers)
        )
        t_up = time.monotonic() - t0
        live = [g.url for g in gateways]

        def pick(previous: str | None, n: int) -> str:
            if previous is None:
                return live[n % len(live)]
            others = [u for u in live if u != previous] or live
            return random.choice(others)

        text = " ".join(f"w{i}" for i in range(TOKENS_PER_RUN))
        run_ids = []
        for _ in range(RUNS):
            sid = await broker.store.create_session("alice")
            run_ids.append(await broker.start_run(sid, "alice", input="echo:" + text))
        followers = [
            Follower(n, [run_ids[n % RUNS], run_ids[(n % RUNS + RUNS // 2) % RUNS]], n % 2 == 1)
            for n in range(CLIENTS)
        ]
        token = auth.mint(s, "alice", ttl_s=3600)
        deadline = time.monotonic() + 180
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            tasks = [asyncio.create_task(f.follow(http, token, pick, deadline)) for f in followers]

            # A rolling replacement, as an orchestrator does it: start the new
            # gateway and worker (while the first wave streams: they take a
            # few seconds to be ready), then SIGTERM the old ones mid-stream.
            new_gw, new_wk = spares
            spares_up = asyncio.gather(_start(new_gw, "/readyz"), _start(new_wk, "/healthz"))
            # Mid-stream: most of the first wave has streamed a while.
            async with asyncio.timeout(90):
                while sum(1 for f in followers for t in f.topics if f.last[t] >= 30) < CLIENTS:
                    await asyncio.sleep(0.1)
            await spares_up
            live.append(new_gw.url)
            t_mid = time.monotonic() - t0
            victim_gw, victim_wk = gateways[0], workers[0]
            on_victim = [f for f in followers if f.current == victim_gw.url and not f.done]
            live.remove(victim_gw.url)
            victim_gw.signal(signal.SIGTERM)
            victim_wk.signal(signal.SIGTERM)
            gw_exit, wk_exit = await asyncio.gather(victim_gw.wait(30), victim_wk.wait(45))

            await asyncio.wait_for(asyncio.gather(*tasks), 200)
            t_done = time.monotonic() - t0

            # Every process serves /metrics (workers on worker_metrics_port).
            for p in (gateways[1], workers[1], new_gw, new_wk):
                async with http.get(p.url + "/metrics") as r:
                    assert r.status == 200 and b"runlog_" in await r.read()

        assert gw_exit == 0, victim_gw.log_tail()
        assert wk_exit == 0, victim_wk.log_tail()

        # What PostgreSQL holds: every run ended, contiguous.
        log: dict[str, list[tuple[int, str, str]]] = {}
        statuses: Counter[str] = Counter()
        for run_id in run_ids:
            page = await broker.store.run_page(run_id, 0, 10_000)
            assert [e.seq for e in page] == list(range(1, len(page) + 1))
            evs = [json.loads(e.payload) for e in page]
            assert evs[0]["type"] == "run_start" and evs[-1]["type"] == "run_end", run_id
            statuses[evs[-1]["status"]] += 1
            if evs[-1]["status"] != "completed":
                assert any(e["type"] == "run_error" for e in evs), run_id
            log[run_id] = [
                (e["seq"], e["type"], str(e.get(_MERGEABLE.get(e["type"], ""), ""))) for e in evs
            ]
        stuck = await broker.store.pool.fetchval("SELECT count(*) FROM runs WHERE ended_at IS NULL")
        assert stuck == 0

        # What every client got: each position once, in order, same content.
        problems = [f"client {f.n}: {p}" for f in followers for p in f.problems]
        assert not problems, problems[:20]
        coalesced = 0
        for f in followers:
            assert f.done
            for topic in f.topics:
                stored = log[topic[4:]]
                got = f.got[topic]
                positions = [p for first, last, _, _ in got for p in range(first, last + 1)]
                assert positions == list(range(1, len(stored) + 1)), (f.n, topic)
                coalesced += sum(1 for first, last, _, _ in got if last > first)
                assert [t for _, _, t, _ in got if t not in _MERGEABLE] == [
                    t for _, t, _ in stored if t not in _MERGEABLE
                ]
                assert "".join(x for _, _, t, x in got if t == "text_delta") == "".join(
                    x for _, t, x in stored if t == "text_delta"
                )
        # The drained gateway's clients were told to resume, and did, elsewhere
        # (on the other old gateway or the new one).
        codes = Counter(c for f in followers for c in f.disconnects)
        moved = [f for f in on_victim if any(u != victim_gw.url for u in f.gateways)]
        assert len(moved) == len(on_victim)
        assert codes["server_draining"] >= 1
        landed = Counter(f.gateways[-1] for f in followers)
        events_total = sum(len(v) for v in log.values())
        print(
            f"\nsteady load: {RUNS} runs ({events_total} events), {CLIENTS} clients; "
            f"processes up in {t_up:.1f} s; SIGTERM at {t_mid:.1f} s; all clients done at "
            f"{t_done:.1f} s; run outcomes {dict(statuses)}; disconnects {dict(codes)}; "
            f"{len(on_victim)} clients moved off the drained gateway; last gateway per "
            f"client {sorted(landed.values())}; coalesced frames {coalesced}"
        )
    finally:
        await broker.close()
        await asyncio.gather(*(p.stop() for p in every if p.proc is not None))
