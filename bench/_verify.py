"""The replay-verification item of `bench agents` (bench/agents.py, part 3):
what comparing a resumed agent's replay with its log (`workers/verify.py`
`Replay`) costs per logged event, each figure next to its base.

- In process, the comparison alone: `synthetic_log(n)` is n events (text
  deltas of `_TURNS` messages, each followed by a tool card of
  `_CARD_EVENTS` events: start, three args deltas, end, result) as the log
  holds them (run and session ids, seq, ts) and as an agent emits them again
  (without). Timed by this thread's CPU clock, best of `_REPS`: building
  `Replay` over the log (its filtering; also with `_STEPS` steps in the log,
  steps that emitted nothing, so every event is still compared), then
  `Replay.take` of every replayed event and `until` the last seq. The bases:
  the same loop awaiting an async no-op, and the same loop calling
  `msgspec.json.encode` of each event once (what one `_key` costs; `take`
  makes two). Verification adds (build + take - no-op loop) per event.
- End to end, one takeover (`takeover`): a worker runs
  `bench._agents:resume_agent` (n text deltas outside steps, a step, one
  more delta, then a wait at a file gate); once the step's row is stored and
  that delta committed, a second worker is started and the first is killed
  (SIGKILL). The survivor takes the run over (its owner's process is gone:
  `worker_liveness_interval_s` 0.1 s), reads the log through the step
  (`Journal._load_replay`) and replays the agent, each delta compared and
  dropped, to its first live event, the delta after the step. Timed by
  PostgreSQL's and the worker's clocks (one host): from the claim
  (`lease_until` - `worker_lease_s`, i.e. `now()` of the claim's statement;
  the lease is long enough that no renewal comes before it is read) to the
  `ts` of `status` resumed (`Journal.prepare`: the log read, `Replay` built,
  the tail retracted) and to the live delta's; the survivor's CPU (ns,
  `task_cpu_s`) from the kill to the live delta seen. The run must end
  `completed` with nothing appended but the retraction of that one delta,
  `status` resumed, the live delta and run_end: a replay that diverged
  would fail the bench. `measure` does it for n and for `short` deltas: the
  straight line through the two splits the resume into a part per resume
  and a part per logged event.
- The base, in this process: `Store.run_page` of the same events in pages of
  1,000 as `_load_replay` reads them, once the run completed, without and
  with `events.decode_stored` of each (what `_load_replay` does before it
  builds `Replay`), best of `_REPS`; and (`first_read`) the first read of as
  many events just committed, through a new pool, as a survivor reads them.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import msgspec

from broker import events
from broker.runtime import Broker
from broker.store import Store
from workers.verify import Replay

from . import _agents
from ._gw import USER, settings_for
from ._lib import Stack
from ._procs import WorkerProc, task_cpu_s

_TURNS = 10  # messages in the synthetic log, each followed by a tool card
_CARD_EVENTS = 6
_REPS = 5
_STEPS = 100  # the log's steps in the second build
_PAGE = 1000  # Journal._load_replay's page
_LEASE_S = 120.0  # renewed every 40 s: not before the claim's lease_until is read
_TIMEOUT_S = 120.0
_WORKER: dict[str, object] = {
    "agent": "bench._agents:resume_agent",
    "worker_lease_s": _LEASE_S,
    "worker_liveness_interval_s": 0.1,
    "worker_liveness_grace_s": 0.1,
}


# --- in process: the comparison alone --------------------------------------------


def synthetic_log(n: int) -> tuple[list[events.AnyEvent], list[events.AnyEvent]]:
    """n events as the log holds them (seq 1..n) and as a replay emits them."""
    per_turn = max(_CARD_EVENTS + 1, n // _TURNS)
    pieces = _agents.deltas(per_turn - _CARD_EVENTS)
    replayed: list[events.AnyEvent] = []
    for t in range(_TURNS):
        m, c = f"m_{t:04d}", f"tc_{t:04d}"
        replayed += [events.TextDelta(message_id=m, delta=p) for p in pieces]
        replayed += [
            events.ToolCallStart(tool_call_id=c, tool_name="search"),
            events.ToolArgsDelta(tool_call_id=c, partial_json='{"query": '),
            events.ToolArgsDelta(tool_call_id=c, partial_json='"durable logs"'),
            events.ToolArgsDelta(tool_call_id=c, partial_json="}"),
            events.ToolCallEnd(tool_call_id=c),
            events.ToolResult(tool_call_id=c, status="ok", summary="3 results"),
        ]
    logged: list[events.AnyEvent] = [
        msgspec.structs.replace(e, run_id="r", session_id="s", seq=seq, ts=1_700_000_000_000)
        for seq, e in enumerate(replayed, 1)
    ]
    return logged, replayed


async def _unexpected_append(ev: events.Event) -> None:
    raise AssertionError(f"an identical replay appended {ev!r}")


def _unexpected_fail(what: str) -> NoReturn:
    raise AssertionError(f"an identical replay failed: {what}")


async def _nothing(ev: events.Event) -> bool:
    return True


async def _encoded(ev: events.Event) -> bool:
    msgspec.json.encode(ev)
    return True


async def _loop(
    replayed: Sequence[events.Event], take: Callable[[events.Event], Awaitable[bool]]
) -> float:
    t0 = time.thread_time()
    for ev in replayed:
        if not await take(ev):
            raise AssertionError(f"an identical replay did not drop {ev!r}")
    return time.thread_time() - t0


async def in_process(n: int) -> dict[str, Any]:
    """µs per event: `Replay` built (also with `_STEPS` steps in the log),
    `take`, and the two bases (module doc)."""
    logged, replayed = synthetic_log(n)
    # Steps that emitted nothing, spread over the log: (seq, seq] holds no
    # event, so every event is still compared, and each range is looked at.
    stride = max(1, len(logged) // _STEPS)
    steps = [(seq, seq) for seq in range(stride, len(logged) + 1, stride)][:_STEPS]
    best: dict[str, float] = {}

    def keep(key: str, s: float) -> None:
        best[key] = min(best.get(key, s), s)

    def build(inside: list[tuple[int, int]]) -> tuple[Replay, float]:
        t0 = time.thread_time()
        r = Replay(logged, inside, run_id="r", epoch=2, append=_unexpected_append,
                   fail=_unexpected_fail)  # fmt: skip
        return r, time.thread_time() - t0

    for _ in range(_REPS):
        keep("build_steps", build(steps)[1])
        r, s = build([])
        keep("build", s)
        s = await _loop(replayed, r.take)
        t0 = time.thread_time()
        await r.until(len(logged))
        keep("take", s + time.thread_time() - t0)
        keep("noop", await _loop(replayed, _nothing))
        keep("encode", await _loop(replayed, _encoded))
    k = len(replayed)
    out: dict[str, Any] = {f"{key}_us_per_event": v * 1e6 / k for key, v in best.items()}
    out["events"] = k
    out["added_us_per_event"] = (best["build"] + best["take"] - best["noop"]) * 1e6 / k
    return out


# --- end to end: one takeover -----------------------------------------------------


async def measure(st: Stack, b: Broker, n: int, short: int) -> dict[str, Any]:
    """Both parts for a log of n events: in process, then a takeover of an
    n-delta run and of a `short`-delta one (the straight line through the
    two splits the resume into a part per resume and a part per event)."""
    r: dict[str, Any] = {"in_process": await in_process(n)}
    r["long"] = long = await takeover(st, b, n)
    r["short"] = low = await takeover(st, b, short)
    long["first_read_decode_ms"] = await first_read(st, b, n)
    long["first_read_decode_us_per_event"] = long["first_read_decode_ms"] * 1e3 / n
    added_ms = r["in_process"]["added_us_per_event"] * n / 1e3
    for key in ("claim_to_live", "survivor_cpu"):
        per = (long[f"{key}_ms"] - low[f"{key}_ms"]) * 1e3 / (n - short)
        r[f"{key}_us_per_event_marginal"] = per
        r[f"{key}_ms_fixed"] = low[f"{key}_ms"] - short * per / 1e3
    r["verify_share_pct"] = 100 * added_ms / long["claim_to_live_ms"]
    r["verify_share_cpu_pct"] = (
        100 * r["in_process"]["added_us_per_event"] / r["survivor_cpu_us_per_event_marginal"]
    )
    return r


async def takeover(st: Stack, b: Broker, n: int) -> dict[str, Any]:
    """One resume of an n-delta run (module doc); ms and µs per logged delta."""
    with tempfile.TemporaryDirectory(prefix="runlog-bench-gate-") as tmp:
        gate = Path(tmp) / "gate"
        first = await WorkerProc(st, concurrency=4, **_WORKER).start()
        survivor: WorkerProc | None = None
        try:
            sid = await b.store.create_session(USER, "bench agents resume")
            run_id = await b.start_run(sid, USER, input=_agents.resume_input(n, str(gate)))
            # run_start, the n deltas (the step's row at seq n + 1), the live delta
            await _until(b, first, run_id, "SELECT 1 FROM runs r JOIN run_steps s USING (run_id)"
                         " WHERE run_id = $1 AND s.idx = 0 AND s.done AND r.last_seq = $2",
                         n + 2)  # fmt: skip
            survivor = await WorkerProc(st, concurrency=4, **_WORKER).start()
            await asyncio.sleep(0.3)  # its liveness grace (0.1 s) passes
            cpu0 = task_cpu_s(survivor.pid)
            assert first.proc is not None
            first.proc.kill()
            await first.proc.wait()
            live = await _until(b, survivor, run_id, "SELECT seq, ts FROM events WHERE run_id = $1"
                                " AND seq > $2 AND type = 'text_delta' ORDER BY seq LIMIT 1",
                                n + 2)  # fmt: skip
            cpu_s = task_cpu_s(survivor.pid) - cpu0
            claim_ms, epoch = await b.store.pool.fetchrow(
                "SELECT extract(epoch FROM lease_until) * 1000 - $2::float8, owner_epoch"
                " FROM runs WHERE run_id = $1",
                run_id,
                _LEASE_S * 1000,
            )
            resumed = events.decode_stored(await b.store.pool.fetchval(
                "SELECT payload FROM events WHERE run_id = $1 AND seq > $2 AND type = 'status'"
                " ORDER BY seq LIMIT 1", run_id, n + 2))  # fmt: skip
            gate.touch()
            await _until(b, survivor, run_id,
                         "SELECT 1 FROM runs WHERE run_id = $1 AND ended_at IS NOT NULL")  # fmt: skip
            await _check(b, survivor, run_id, n, epoch, resumed)
        finally:
            for wk in (survivor, first):
                if wk is not None:
                    await wk.stop(timeout_s=30)
    assert isinstance(resumed, events.Status)
    base = await _read_base(b, run_id, n + 1)
    out = {
        "claim_to_live_ms": live["ts"] - claim_ms,
        "claim_to_resumed_ms": resumed.ts - claim_ms,
        "resumed_to_live_ms": live["ts"] - resumed.ts,
        "survivor_cpu_ms": cpu_s * 1e3,
        **base,
    }
    for key in list(out):
        out[key.replace("_ms", "_us_per_event")] = out[key] * 1e3 / n
    return out


async def _until(
    b: Broker, wk: WorkerProc, run_id: str, query: str, *args: object
) -> dict[str, Any]:
    """Poll `query` (run_id, *args) until it returns a row."""
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            while (row := await b.store.pool.fetchrow(query, run_id, *args)) is None:
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise RuntimeError(f"run {run_id}: not there in {_TIMEOUT_S:.0f} s ({query});"
                           f" worker:\n{wk.output()}") from None  # fmt: skip
    return dict(row)


async def _check(
    b: Broker, wk: WorkerProc, run_id: str, n: int, epoch: int, resumed: events.AnyEvent
) -> None:
    """Completed, taken over once, and nothing appended but the tail's
    retraction, `status` resumed, the live delta and run_end."""
    status, last_seq = await b.store.pool.fetchrow(
        "SELECT status, last_seq FROM runs WHERE run_id = $1", run_id
    )
    ok = (
        status == "completed"
        and last_seq == n + 6
        and epoch == 2
        and isinstance(resumed, events.Status)
        and resumed.code == "resumed"
    )
    if not ok:
        raise RuntimeError(
            f"run {run_id}: {status}, last seq {last_seq} (want completed, {n + 6}), epoch "
            f"{epoch}, first status {resumed!r}; worker:\n{wk.output()}"
        )


async def _read_base(b: Broker, run_id: str, through: int) -> dict[str, float]:
    """ms of `Store.run_page` through `through` as `_load_replay` pages it,
    without and with decoding each event (module doc), best of `_REPS`."""
    best = {"read_ms": float("inf"), "read_decode_ms": float("inf")}
    for _ in range(_REPS):
        best["read_ms"] = min(best["read_ms"], await _read(b.store, run_id, through, False))
        ms = await _read(b.store, run_id, through, True)
        best["read_decode_ms"] = min(best["read_decode_ms"], ms)
    return best


async def first_read(st: Stack, b: Broker, n: int) -> float:
    """ms of the first read (`run_page` + `decode_stored`, as `_read_base`)
    of run_start and n text deltas just committed, through a new pool: as a
    survivor reads them (new connections, rows nobody has read yet)."""
    sid = await b.store.create_session(USER, "bench agents resume base")
    run_id = await b.store.create_run(sid, USER, model="bench")
    w = await b.claim(run_id, "bench-resume-base")
    await w.append(events.RunStart(model="bench", started_by=USER))
    m = "m_0001"
    for i, piece in enumerate(_agents.deltas(n), 1):
        if i % 64 == 0:
            await asyncio.sleep(0)
        await w.append(events.TextDelta(message_id=m, delta=piece))
    await w.flush()
    store = await Store.connect(st.database_url, settings_for(st))
    try:
        return await _read(store, run_id, n + 1, True)
    finally:
        await store.close()


async def _read(store: Store, run_id: str, through: int, decode: bool) -> float:
    t0 = time.perf_counter()
    after = got = 0
    while after < through:
        page = await store.run_page(run_id, after, min(_PAGE, through - after))
        if not page:
            break
        if decode:
            for e in page:
                events.decode_stored(e.payload)
        got += len(page)
        after = page[-1].seq
    if got != through:
        raise RuntimeError(f"run {run_id}: read {got} events, not {through}")
    return (time.perf_counter() - t0) * 1e3
