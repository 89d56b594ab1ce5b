"""`bench worker` part 4: kill -9 of a run's owner → `status` "resumed" at a
subscriber (bench/worker.py's docstring, item 4).

Two `runlog worker` processes (scripted adapter, default lease and liveness
settings), each started with a known RUNLOG_WORKER_ID. Per kill: a fresh
run ("long story": 2,000 tokens), 10 text_delta read through the broker,
`runs.owner_id` names the process to SIGKILL; measured from the kill until
the run's `status` "resumed" reaches a subscription opened at the run's
head just before it. The killed process is replaced at once.

The worker that takes over must have held its liveness lock for
`worker_liveness_grace_s` (5 s) and have a free slot, or the figure would
be the grace's (a worker takes no orphan over before it, workers/liveness.py)
or a full worker's: each kill waits for both. Left to JetStream, nearly
every run goes to the older worker, so every kill would wait out the fresh
one's grace (~5 s a kill). Hence each worker runs at concurrency 1, and the
run taken over at the previous kill keeps the survivor busy while the next
run starts: the fresh worker claims it, the previous run is stopped (the
survivor's slot is free again, read from its runs_active gauge), and the
fresh worker is killed. Any run that still lands on the survivor is handled
the same way, after the grace. The kill comes at a random moment of the
taker's orphan search (every `worker_liveness_interval_s`), as a crash does.

Raw, same run: SIGKILL of a plain Python process holding a session-level
advisory lock on its own asyncpg connection → another connection sees the
lock free in pg_locks (polled every 10 ms): the operating system's and
PostgreSQL's share of the takeover.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from typing import Any

import asyncpg

from broker import events
from broker.runtime import Broker
from broker.store import LIVENESS_LOCK_NS, StoredEvent
from broker.subscribe import Subscription

from . import _lib
from ._gw import USER, progress
from ._lib import Figure, Stack
from ._procs import REPO, WorkerProc

SKIP = "takeover"
_MIN_DELTAS = 10
_POLL_S = 0.010
# A worker's job fetch waits up to 1 s (workers/worker.py): one issued before
# the survivor took the previous run over has expired after this.
_STALE_FETCH_S = 1.2
# The raw holders' lock namespace: not the workers' (their orphan search never sees it).
_RAW_LOCK_NS = LIVENESS_LOCK_NS + 1

# A session-level advisory lock on its own connection, as workers/liveness.py holds one.
_LOCK_HOLDER = """
import asyncio, sys
import asyncpg
async def main():
    conn = await asyncpg.connect(sys.argv[1])
    await conn.fetchval("SELECT pg_advisory_lock($1, $2)", int(sys.argv[2]), int(sys.argv[3]))
    print("locked", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""

_HELD = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND classid = $1::oid AND objid = $2::oid AND objsubid = 2)"
)
_OWNER = "SELECT owner_id FROM runs WHERE run_id = $1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kills", type=int, default=20,
                   help="part 4: run owners killed (kill -9) per trial (default: 20)")  # fmt: skip


class _Pair:
    """The two worker processes by worker id, each with the monotonic time it
    was ready (it took its liveness lock just before)."""

    def __init__(self, st: Stack, tokens_per_s: float) -> None:
        self._st = st
        self._tokens_per_s = tokens_per_s
        self._started = 0
        self.procs: dict[str, tuple[WorkerProc, float]] = {}

    async def start_one(self) -> None:
        self._started += 1
        worker_id = f"bench-takeover-{self._started}"
        wk = await WorkerProc(
            self._st, concurrency=1, worker_id=worker_id, model_adapter="scripted",
            scripted_tokens_per_s=self._tokens_per_s,
        ).start()  # fmt: skip
        self.procs[worker_id] = (wk, time.monotonic())

    async def replace(self, worker_id: str) -> None:
        """Reap a killed worker and start another."""
        wk, _ = self.procs.pop(worker_id)
        assert wk.proc is not None
        # Reaped first: a signal sent meanwhile (stop's SIGTERM) would reap it
        # behind asyncio's back (Popen.send_signal polls first).
        await wk.proc.wait()
        await wk.stop()
        await self.start_one()

    async def close(self) -> None:
        for wk, _ in self.procs.values():
            await wk.stop(timeout_s=30)
        self.procs.clear()


async def run_part(
    st: Stack, b: Broker, args: argparse.Namespace, per_trial: list[dict[str, Any]]
) -> None:
    pair = _Pair(st, args.tokens_per_s)
    try:
        await pair.start_one()
        await pair.start_one()
        for trial, t in enumerate(per_trial):
            t["takeover"] = r = await _kills(b, pair, args.kills)
            progress(f"trial {trial + 1}: kill -9 → status resumed p50 {r['p50_ms']:.0f} ms, "
                     f"p99 {r['p99_ms']:.0f} ms, max {r['max_ms']:.0f} ms (n={r['n']})")  # fmt: skip
            if not args.no_raw:
                t["takeover_raw"] = r = await _raw(st, args.kills)
                progress(f"trial {trial + 1}: raw: kill -9 → advisory lock free p50 "
                         f"{r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms")  # fmt: skip
    finally:
        await pair.close()


async def _kills(b: Broker, pair: _Pair, n: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    s = b.settings
    pool = b.store.pool
    lat, to_appended, to_received, slot_waits = [], [], [], []
    grace_waits = wrong_taker = 0
    prev: tuple[str, Subscription, float] | None = None  # the run the last kill resumed
    try:
        for _ in range(n):
            if prev is not None:
                await asyncio.sleep(max(0.0, prev[2] + _STALE_FETCH_S - time.monotonic()))
            session = await b.store.create_session(USER, "bench takeover")
            run_id = await b.start_run(session, USER, input="long story")
            await _read_deltas(b, run_id, _MIN_DELTAS)
            owner = await pool.fetchval(_OWNER, run_id)
            if prev is not None:
                await _stop(b, prev[0], prev[1])
                prev = None
            taker = next(k for k in pair.procs if k != owner)
            victim, _ = pair.procs[owner]
            taker_wk, taker_ready = pair.procs[taker]
            grace_s = taker_ready + s.worker_liveness_grace_s - time.monotonic()
            if grace_s > 0:
                grace_waits += 1
                await asyncio.sleep(grace_s)
            t_slot = time.monotonic()
            await _wait_free_slot(taker_wk)
            slot_waits.append(time.monotonic() - t_slot)
            await asyncio.sleep(random.uniform(0.0, s.worker_liveness_interval_s))
            head = await pool.fetchval("SELECT last_seq FROM runs WHERE run_id = $1", run_id)
            live = await b.subscribe(run_id=run_id, after=head)
            try:
                assert victim.proc is not None
                t0, wall0 = loop.time(), time.time()
                victim.proc.kill()
                resumed = await _read_resumed(live)
                t1, wall1 = loop.time(), time.time()
            except BaseException:
                await live.close()
                raise
            prev = (run_id, live, time.monotonic())
            lat.append((t1 - t0) * 1e3)
            to_appended.append(resumed.ts - wall0 * 1e3)
            to_received.append(wall1 * 1e3 - resumed.ts)
            wrong_taker += await pool.fetchval(_OWNER, run_id) != taker
            await pair.replace(owner)
    finally:
        if prev is not None:
            await _stop(b, prev[0], prev[1])
    s_lat = sorted(lat)
    q = _lib.quantile
    return {
        "n": len(s_lat),
        "p50_ms": q(s_lat, 0.5),
        "p90_ms": q(s_lat, 0.9),
        "p99_ms": q(s_lat, 0.99),
        "max_ms": s_lat[-1],
        "to_appended_p50_ms": q(sorted(to_appended), 0.5),
        "to_appended_max_ms": max(to_appended),
        "appended_to_received_p50_ms": q(sorted(to_received), 0.5),
        "appended_to_received_max_ms": max(to_received),
        # Kills that waited out the taker's grace (its run went to the survivor).
        "grace_waits": grace_waits,
        "slot_wait_max_ms": max(slot_waits) * 1e3,
        "not_the_other_worker": wrong_taker,
        "samples_ms": lat,
    }


async def _wait_free_slot(wk: WorkerProc) -> None:
    gauge = "runlog_worker_runs_active"
    async with asyncio.timeout(30):
        while (await wk.gauges(gauge)).get(gauge, wk.concurrency) >= wk.concurrency:
            await asyncio.sleep(_POLL_S)


async def _read_deltas(b: Broker, run_id: str, k: int) -> None:
    sub = await b.subscribe(run_id=run_id, after=0)
    try:
        seen = 0
        async with asyncio.timeout(60):
            async for batch in sub:
                seen += sum(1 for e in batch if e.type == "text_delta")
                if seen >= k:
                    return
    finally:
        await sub.close()
    raise RuntimeError(f"run {run_id} ended before {k} text_delta")


async def _read_resumed(live: Subscription) -> events.Status:
    async with asyncio.timeout(60):
        async for batch in live:
            for e in batch:
                if (status := _resumed(e)) is not None:
                    return status
    raise RuntimeError(f"run {live.run_id} ended without being resumed")


def _resumed(e: StoredEvent) -> events.Status | None:
    if e.type != "status":
        return None
    status = events.decode_stored(e.payload)
    return status if isinstance(status, events.Status) and status.code == "resumed" else None


async def _stop(b: Broker, run_id: str, live: Subscription) -> None:
    """Stop a run and read on until its run_end."""
    try:
        await b.interrupt(run_id, USER, "bench done")
        async with asyncio.timeout(30):
            async for batch in live:
                if batch[-1].type == "run_end":
                    break
    finally:
        await live.close()


async def _raw(st: Stack, n: int) -> dict[str, Any]:
    """SIGKILL of a lock holder → the lock seen free in pg_locks."""
    loop = asyncio.get_running_loop()
    conn = await asyncpg.connect(st.database_url)
    lat, polls = [], []
    try:
        for key in range(1, n + 1):
            holder = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _LOCK_HOLDER, st.database_url, str(_RAW_LOCK_NS), str(key),
                cwd=REPO, stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            killed = False
            try:
                assert holder.stdout is not None
                line = await asyncio.wait_for(holder.stdout.readline(), 30)
                if line.strip() != b"locked":
                    raise RuntimeError(f"lock holder: {line!r}")
                t0 = loop.time()
                holder.kill()
                killed = True
                k = 1
                async with asyncio.timeout(30):
                    while await conn.fetchval(_HELD, _RAW_LOCK_NS, key):
                        await asyncio.sleep(_POLL_S)
                        k += 1
                lat.append((loop.time() - t0) * 1e3)
                polls.append(k)
            finally:
                if not killed:
                    holder.kill()
                await holder.wait()
    finally:
        await conn.close()
    s = sorted(lat)
    q = _lib.quantile
    return {
        "n": len(s),
        "p50_ms": q(s, 0.5),
        "p99_ms": q(s, 0.99),
        "max_ms": s[-1],
        # Queries until one saw it free (the first is sent right after the kill).
        "polls_p50": q(sorted(polls), 0.5),
        "polls_max": max(polls),
    }


def figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    figs: list[Figure] = []
    sec = (
        f"kill -9 of a run's owner → `status` resumed at a subscriber ({args.kills} kills "
        "per trial, two workers, scripted)"
    )

    def add(name: str, unit: str, which: str, key: str) -> None:
        figs.append(_lib.summarize(sec, name, unit, [t[which][key] for t in per_trial]))

    add("p50", "ms", "takeover", "p50_ms")
    add("p99", "ms", "takeover", "p99_ms")
    add("max", "ms", "takeover", "max_ms")
    pooled = sorted(x for t in per_trial for x in t["takeover"]["samples_ms"])
    figs.append(_lib.summarize(sec, "… p99 of all trials' kills pooled", "ms",
                               [_lib.quantile(pooled, 0.99)]))  # fmt: skip
    add("… kill → `status` appended (its ts) p50", "ms", "takeover", "to_appended_p50_ms")
    add("… `status` appended → received p50", "ms", "takeover", "appended_to_received_p50_ms")
    add("kills that waited out the taker's liveness grace", "kills", "takeover", "grace_waits")
    add("runs not taken over by the other worker", "runs", "takeover", "not_the_other_worker")
    if not args.no_raw:
        add("raw: kill -9 of an advisory lock holder → lock free p50", "ms", "takeover_raw",
            "p50_ms")  # fmt: skip
        add("raw: … p99", "ms", "takeover_raw", "p99_ms")
        add("raw: … max", "ms", "takeover_raw", "max_ms")
        add("raw: … pg_locks queries until seen free, max", "queries", "takeover_raw",
            "polls_max")  # fmt: skip
    return figs
