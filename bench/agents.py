"""agents: the agent API's cost per event over the built-in loop's append
path, each framework's cost under runlog over the framework run bare, and
what verifying a resumed agent's replay costs per logged event, with real
worker processes (`runlog worker`), in one run.

1. --runs concurrent runs (default 100, one session each), each streaming the
   same --events text deltas (default 200; bench/_agents.py `deltas`) as fast
   as it can, through one worker process:
   (a) the built-in loop: scripted adapter, `scripted_tokens_per_s=0`, input
       `echo:<text>` (exactly --events text deltas, no tool);
   (b) an API agent (`RUNLOG_AGENT=bench._agents:agent`): `ctx.text` per delta;
   (b2) the same inside one `ctx.step`;
   (b3) one `ctx.step` per --per-step deltas (default 10): the cost of a step.
   Both kinds yield to the loop once every 64 deltas (the scripted adapter's
   pacer at 0 tokens/s). Each run commits run_start, the deltas and run_end
   (--events + 2 events); a case whose runs do not all end `completed` with
   exactly those events fails the bench. A measurement is --rounds waves
   (default 3) of --runs runs: this process creates the sessions first, then,
   timed, starts a wave's runs all at once (`Broker.start_run`), polls until
   they have all ended, and starts the next wave. Over that window: committed
   events/s, and CPU µs per committed event of the worker process,
   PostgreSQL (which also creates the runs) and nats-server. The agent API's
   overhead is (b) - (a) in worker µs/event; a step's cost is the worker CPU
   of (b3) - (b) divided by the steps of (b3), in µs per step.
   Raw, same run: (c) the same waves of runs and deltas straight through
   `Broker.claim` + `RunWriter.append` in this process, timed from the first
   claim to the last commit (the runs are created before): the log's own
   share of the worker's CPU.
   For every trial each worker is started afresh (one at a time: workers
   share the job queue) and warmed up with a wave of short runs first.
   --no-api skips (a)-(b3), --no-raw (c).
2. Frameworks (--frameworks, default all registered: builtin, langgraph,
   openai-agents, pydantic-ai, agui): the same fake model (a stream of
   `deltas(n)`, n text chunks as fast as it can, no sleeps) and the same runs
   (--runs concurrent, --events tokens, --framework-rounds waves, default 1:
   the frameworks cost 3-13x the log per token) executed bare in this
   process (the framework's own streaming API, the runs as asyncio tasks; CPU
   µs per text token it produced, by this process's `time.process_time`) and
   as a runlog agent in a worker process, measured as in 1 (worker CPU µs per
   text delta committed: the runs' other events are not counted, their cost
   is). The difference is the adapter's overhead: what running under runlog
   costs per token. Both sides are also timed at 20 tokens, so the overhead
   splits into a part per run and a part per token. A case whose module
   cannot be imported is skipped with a line saying so.
3. Replay verification (--no-replay skips it; bench/_verify.py is the exact
   reference): a resumed API agent runs again from the top and each event it
   emits before the last durable point is compared with the log
   (workers/verify.py `Replay`). In process, over a log of --replay-events
   events (default 20,000: text deltas of 10 messages, each followed by a
   tool card) and an identical replay: CPU µs per event of building
   `Replay` (its filtering; again with 100 steps in the log) and of
   `Replay.take` of every event, next to the same loop awaiting a no-op and
   calling `msgspec.json.encode` of each event once (a `_key`). End to end,
   one takeover per trial: a worker runs `bench._agents:resume_agent`
   (--replay-events text deltas outside steps, a step, one more delta, a wait
   at a file gate) and is killed (-9) once the step is stored; a second
   worker, already started, takes the run over. From the claim (PostgreSQL's
   `now()`) to the `ts` of `status` resumed (the log read, `Replay` built)
   and of the resumed run's first live event (the delta after the step):
   the resume, per logged event, and the survivor's CPU; the same for a
   20-delta run, so that the resume splits into a part per resume and one
   per logged event. Next to it, the base: `Store.run_page` of those events
   from this process (pages of 1,000, as the journal reads them), with and
   without decoding them, and the first read of as many events just
   committed through a new pool. Verification's share of the resume is the
   in-process figure times the events over the resume.

Adding a framework case: one function in this module, decorated with
`@framework(name, needs=module, agent="module:attr")`, that runs the
framework bare: `async def bare(runs, n, settings) -> int` executes `runs`
runs concurrently, each with a fake model that streams n text tokens, and
returns the number of text tokens the framework handed out (the bench checks
it is runs x n). The runlog side is the same framework object and fake model
wrapped by the framework's adapter, as `attr` (the adapters' cases keep both
in a module of their own, bench/_fw_<name>.py, imported only when the case
runs), reading n from the run's input (`str(n)` unless `input=` gives
another function of n); each run must commit exactly n text deltas and end
`completed`. `needs` is the module the case cannot run without: when it
cannot be imported the case is skipped. `worker=` gives worker settings
instead of `agent` (the `builtin` case: the scripted adapter bare vs the
built-in loop). `serve=` is an async context manager entered around the
case that serves something from this process (the AG-UI upstream): it
yields a `Served`, whose settings go to the worker and to `bare` and whose
CPU is taken out of the bare figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from broker import events
from broker.log import RunWriter
from broker.runtime import Broker
from workers.adapters.scripted import ScriptedAdapter
from workers.model import Message, ModelRequest, TextChunk

from . import _agents, _gw, _lib, _verify
from ._gw import USER, progress
from ._lib import Figure, Stack, Timer
from ._procs import Meter, WorkerProc

_API_AGENT = "bench._agents:agent"
_BUILTIN: dict[str, object] = {"model_adapter": "scripted", "scripted_tokens_per_s": 0}
_SHORT_EVENTS = 20  # the warm-up's and the short runs' text deltas
_TIMEOUT_S = 120.0


# --- the framework cases -----------------------------------------------------------


@dataclass(frozen=True)
class Served:
    """What a case serves from the bench process while it runs (an upstream)."""

    settings: dict[str, object]  # added to the worker's settings and to bare's
    cpu_s: Callable[[], float]  # its CPU time so far, not counted as bare's


Bare = Callable[[int, int, Mapping[str, object]], Awaitable[int]]
Serve = Callable[[], contextlib.AbstractAsyncContextManager[Served]]


@dataclass(frozen=True)
class FrameworkCase:
    name: str
    needs: str  # a module the case cannot run without
    bare: Bare  # (runs, n, settings) → text tokens produced
    worker: dict[str, object]  # the worker process's settings
    input: Callable[[int], str] = str  # a run's input for n tokens
    serve: Serve | None = None


FRAMEWORKS: dict[str, FrameworkCase] = {}


def framework(
    name: str,
    *,
    needs: str,
    agent: str = "",
    worker: dict[str, object] | None = None,
    input: Callable[[int], str] = str,
    serve: Serve | None = None,
) -> Callable[[Bare], Bare]:
    """Register a case (see the module doc): the decorated function runs it bare."""

    def register(bare: Bare) -> Bare:
        settings = dict(worker or {})
        if agent:
            settings["agent"] = agent
        FRAMEWORKS[name] = FrameworkCase(name, needs, bare, settings, input, serve)
        return bare

    return register


@framework("builtin", needs="workers.adapters.scripted", worker=_BUILTIN,
           input=_agents.builtin_input)  # fmt: skip
async def builtin_bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    """The built-in loop's scripted model (`tokens_per_s=0`), its stream read
    bare vs run by the built-in loop in a worker."""
    adapter = ScriptedAdapter(tokens_per_s=0)
    request = ModelRequest(messages=[Message(role="user", content=_agents.builtin_input(n))])

    async def one() -> int:
        k = 0
        async for item in adapter.stream(request):
            k += isinstance(item, TextChunk)
        return k

    return sum(await asyncio.gather(*(one() for _ in range(runs))))


# The adapters' cases: each module (bench/_fw_*.py) holds the fake model, the
# framework object, its bare run and the adapter around them (`agent`).


@framework("langgraph", needs="bench._fw_langgraph", agent="bench._fw_langgraph:agent")
async def langgraph_bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    """A one-node graph whose chat model streams n chunks: `astream` bare vs
    `langgraph_agent` (PostgreSQL checkpoints, a step per superstep)."""
    from . import _fw_langgraph

    return await _fw_langgraph.bare(runs, n, settings)


@framework("openai-agents", needs="bench._fw_openai_agents",
           agent="bench._fw_openai_agents:agent")  # fmt: skip
async def openai_agents_bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    """An Agents SDK agent whose `Model` streams n text deltas:
    `Runner.run_streamed` bare vs `openai_agents_agent`."""
    from . import _fw_openai_agents

    return await _fw_openai_agents.bare(runs, n, settings)


@framework("pydantic-ai", needs="bench._fw_pydantic_ai", agent="bench._fw_pydantic_ai:agent")
async def pydantic_ai_bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    """A Pydantic AI agent on a `FunctionModel` streaming n text deltas:
    `agent.run(event_stream_handler=...)` bare vs `pydantic_ai_agent`."""
    from . import _fw_pydantic_ai

    return await _fw_pydantic_ai.bare(runs, n, settings)


@contextlib.asynccontextmanager
async def _agui_upstream() -> AsyncIterator[Served]:
    from ._fw_agui import Upstream

    async with Upstream.serving() as up:
        yield Served({"agui_url": up.url}, up.cpu_s)


@framework("agui", needs="bench._fw_agui", agent="workers.frameworks.agui:agent",
           serve=_agui_upstream)  # fmt: skip
async def agui_bare(runs: int, n: int, settings: Mapping[str, object]) -> int:
    """An AG-UI upstream in the bench process (its own thread) streaming n
    TEXT_MESSAGE_CONTENT events: a minimal AG-UI client bare vs the AG-UI
    adapter (`RUNLOG_AGUI_URL`)."""
    from . import _fw_agui

    return await _fw_agui.bare(runs, n, settings)


# --- the command ------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=100, help="concurrent runs (default: 100)")
    p.add_argument("--events", type=int, default=200, help="text deltas per run (default: 200)")
    p.add_argument("--rounds", type=int, default=3,
                   help="waves of --runs runs per measurement, one after the other (default: 3)")  # fmt: skip
    p.add_argument("--per-step", type=int, default=10,
                   help="text deltas per ctx.step in case b3 (default: 10)")  # fmt: skip
    p.add_argument("--framework-rounds", type=int, default=1,
                   help="waves of --runs runs per framework measurement, bare and under runlog "
                   "(default: 1: the frameworks cost 3-13x the log per token)")  # fmt: skip
    p.add_argument("--frameworks", default="all",
                   help="comma-separated framework cases, 'all' or 'none' (default: all; "
                   f"registered: {', '.join(FRAMEWORKS)})")  # fmt: skip
    p.add_argument("--no-raw", action="store_true", help="skip the raw RunWriter.append case")
    p.add_argument("--no-api", action="store_true",
                   help="skip cases (a), (b), (b2), (b3) of part 1")  # fmt: skip
    p.add_argument("--no-replay", action="store_true", help="skip part 3, replay verification")
    p.add_argument("--replay-events", type=int, default=20_000,
                   help="logged events of part 3's replay (default: 20000)")  # fmt: skip


_API_CASES: tuple[tuple[str, _agents.Mode], ...] = (("b", "text"), ("b2", "step"), ("b3", "steps"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cases, skipped = _frameworks(args.frameworks)
    if not args.no_replay and args.replay_events <= _SHORT_EVENTS:
        raise SystemExit(f"bench agents: --replay-events must be more than {_SHORT_EVENTS}")
    per_trial: list[dict[str, Any]] = [{} for _ in range(args.trials)]
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        b = await _gw.connect_broker(st)
        try:
            for trial, t in enumerate(per_trial):
                label = f"trial {trial + 1}:"
                if not args.no_api:
                    await _api_cases(st, b, meter, args, t, label)
                if not args.no_raw:
                    t["c"] = r = await _raw(b, meter, args)
                    progress(f"{label} (c) raw RunWriter.append: {r['events_s']:,.0f} events/s, "
                             f"{r['us_per_event']:.0f} µs/event")  # fmt: skip
                for case in cases:
                    t[f"fw_{case.name}"] = r = await _framework(st, b, meter, case, args)
                    progress(f"{label} framework {case.name}: bare {r['bare_us_per_token']:.1f} "
                             f"µs/token, under runlog {r['worker_us_per_token']:.1f} µs/token, "
                             f"overhead {r['overhead_us_per_token']:.1f} (fit: "
                             f"{r['overhead_us_per_run']:,.0f} µs/run + "
                             f"{r['overhead_us_per_delta']:.1f} µs/delta)")  # fmt: skip
                if not args.no_replay:
                    t["replay"] = r = await _verify.measure(
                        st, b, args.replay_events, _SHORT_EVENTS
                    )
                    p, lg = r["in_process"], r["long"]
                    progress(f"{label} replay verification: {p['added_us_per_event']:.2f} "
                             f"µs/event in process; resume of {args.replay_events:,} events "
                             f"{lg['claim_to_live_ms']:.0f} ms (reading them "
                             f"{lg['read_ms']:.0f} ms): verification "
                             f"{r['verify_share_pct']:.0f} % of it")  # fmt: skip
        finally:
            await b.close()
    return {
        "servers": versions,
        "frameworks_skipped": skipped,
        "figures": _figures(per_trial, args, cases),
        "trials": per_trial,
    }


async def _api_cases(
    st: Stack, b: Broker, meter: Meter, args: argparse.Namespace, t: dict[str, Any], label: str
) -> None:
    """Part 1's cases (a), (b), (b2), (b3) into `t`."""
    async with _worker(st, meter, args, _BUILTIN) as wk:
        t["a"] = r = await _runs(b, meter, wk, args, _agents.builtin_input)
        progress(f"{label} (a) built-in loop: {_line(r)}")
    async with _worker(st, meter, args, {"agent": _API_AGENT}) as wk:
        for key, mode in _API_CASES:
            make = functools.partial(_api_input, mode=mode, per_step=args.per_step)
            t[key] = r = await _runs(b, meter, wk, args, make)
            progress(f"{label} ({key}) API agent, {mode}: {_line(r)}")


def _api_input(n: int, *, mode: _agents.Mode, per_step: int) -> str:
    return _agents.api_input(n, mode, per_step)


def _frameworks(spec: str) -> tuple[list[FrameworkCase], dict[str, str]]:
    names = list(FRAMEWORKS) if spec == "all" else [s for s in spec.split(",") if s and s != "none"]
    unknown = [s for s in names if s not in FRAMEWORKS]
    if unknown:
        raise SystemExit(f"bench agents: unknown framework case(s) {', '.join(unknown)}; "
                         f"registered: {', '.join(FRAMEWORKS)}")  # fmt: skip
    cases, skipped = [], {}
    for name in names:
        case = FRAMEWORKS[name]
        try:
            importlib.import_module(case.needs)
        except ImportError as e:
            skipped[name] = f"{case.needs} cannot be imported ({e})"
            progress(f"framework {name}: skipped, {skipped[name]}")
            continue
        cases.append(case)
    return cases, skipped


def _line(r: dict[str, Any]) -> str:
    return (f"{r['events_s']:,.0f} events/s, worker {r['worker_us_per_event']:.0f} µs/event, "
            f"PostgreSQL {r['pg_us_per_event']:.0f}, nats {r['nats_us_per_event']:.0f}")  # fmt: skip


@contextlib.asynccontextmanager
async def _worker(
    st: Stack, meter: Meter, args: argparse.Namespace, settings: dict[str, object]
) -> AsyncIterator[WorkerProc]:
    """A started worker process taking every run at once, measured as
    "worker"; stopped on exit."""
    wk = await WorkerProc(st, concurrency=max(args.runs, 8), **settings).start()
    meter.add("worker", wk.pid)
    try:
        yield wk
    finally:
        meter.remove("worker")
        await wk.stop(timeout_s=30)


async def _runs(
    b: Broker,
    meter: Meter,
    wk: WorkerProc,
    args: argparse.Namespace,
    make_input: Callable[[int], str],
    *,
    exact: bool = True,
) -> dict[str, Any]:
    """A warm-up wave of short runs; then, measured, --rounds waves of --runs
    runs of `make_input(--events)`, each wave started at once when the last
    one has ended, timed from the first start to the last end; then as many
    waves of short runs (`make_input(_SHORT_EVENTS)`), timed apart: with the
    two run lengths, the worker's CPU splits into a part per run and a part
    per text delta (a straight line through the two points).

    Every run must end `completed` with its text deltas and (`exact`) no
    other events than run_start and run_end."""
    n = args.events
    await _waves(b, wk, args, make_input(_SHORT_EVENTS), 1)
    timer = Timer(meter)
    run_ids = await _waves(b, wk, args, make_input(n), args.rounds, timer)
    total = await _check(b, wk, run_ids, n, exact)
    short = Timer(meter)
    short_ids = await _waves(b, wk, args, make_input(_SHORT_EVENTS), args.rounds, short)
    await _check(b, wk, short_ids, _SHORT_EVENTS, exact)
    spans = sorted(
        float(v)
        for v in await b.store.pool.fetchval(
            "SELECT array_agg(span) FROM (SELECT max(ts) - min(ts) AS span FROM events"
            " WHERE run_id = ANY($1::text[]) GROUP BY run_id) s",
            run_ids,
        )
    )
    long_run_us = timer.cpu_s["worker"] * 1e6 / len(run_ids)
    short_run_us = short.cpu_s["worker"] * 1e6 / len(short_ids)
    per_delta_us = (long_run_us - short_run_us) / (n - _SHORT_EVENTS)
    return {
        "events": total,
        "text_deltas": n * len(run_ids),
        "events_s": total / timer.wall_s,
        "wall_s": timer.wall_s,
        "worker_cpu_s": timer.cpu_s["worker"],
        "worker_us_per_event": timer.us_per(total, "worker"),
        "worker_cpu_pct": 100 * timer.cpu_s["worker"] / timer.wall_s,
        "pg_us_per_event": timer.us_per(total, "postgres"),
        "nats_us_per_event": timer.us_per(total, "nats"),
        "pg_cpu_s": timer.cpu_s.get("postgres", float("nan")),
        "others_cpu_cores": max(timer.others_cores(), short.others_cores()),
        "run_span_p50_ms": _lib.quantile(spans, 0.5),
        "run_span_p99_ms": _lib.quantile(spans, 0.99),
        "worker_us_per_run_fixed": short_run_us - _SHORT_EVENTS * per_delta_us,
        "worker_us_per_delta_marginal": per_delta_us,
    }


async def _waves(
    b: Broker,
    wk: WorkerProc,
    args: argparse.Namespace,
    inp: str,
    rounds: int,
    timer: Timer | None = None,
) -> list[str]:
    """`rounds` waves of --runs runs (one session each, created first)."""
    waves = [
        [await b.store.create_session(USER, "bench agents") for _ in range(args.runs)]
        for _ in range(rounds)
    ]
    run_ids: list[str] = []
    if timer is not None:
        timer.start()
    for sessions in waves:
        wave = await asyncio.gather(*(b.start_run(sid, USER, input=inp) for sid in sessions))
        await _wait_ended(b, wk, wave)
        run_ids += wave
    if timer is not None:
        timer.stop()
    return run_ids


async def _wait_ended(b: Broker, wk: WorkerProc, run_ids: list[str]) -> None:
    q = "SELECT count(*) FROM runs WHERE run_id = ANY($1::text[]) AND ended_at IS NULL"
    try:
        async with asyncio.timeout(_TIMEOUT_S):
            while await b.store.pool.fetchval(q, run_ids):
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise RuntimeError(
            f"runs not ended in {_TIMEOUT_S:.0f} s; worker:\n{wk.output()}"
        ) from None


async def _check(b: Broker, wk: WorkerProc, run_ids: list[str], n: int, exact: bool) -> int:
    """The committed events of the runs, after checking they are what was asked for."""
    pool = b.store.pool
    rows = await pool.fetch(
        "SELECT r.status, r.last_seq, (SELECT count(*) FROM events e WHERE e.run_id = r.run_id"
        " AND e.type = 'text_delta') AS deltas FROM runs r WHERE r.run_id = ANY($1::text[])",
        run_ids,
    )
    bad = [
        dict(r)
        for r in rows
        if r["status"] != "completed" or r["deltas"] != n or (exact and r["last_seq"] != n + 2)
    ]
    if bad or len(rows) != len(run_ids):
        raise RuntimeError(
            f"{len(bad)} of {len(run_ids)} runs are not {n} text deltas, completed "
            f"(first: {bad[:1]}); worker:\n{wk.output()}"
        )
    return sum(int(r["last_seq"]) for r in rows)


# --- (c) raw: the log's own share ---------------------------------------------------


async def _raw(b: Broker, meter: Meter, args: argparse.Namespace) -> dict[str, Any]:
    """The runs' events through `RunWriter.append` in this process; then the
    short runs, timed apart, as `_runs` does."""
    timer, short = Timer(meter), Timer(meter)
    await _raw_waves(b, args, args.events, timer)
    await _raw_waves(b, args, _SHORT_EVENTS, short)
    runs = args.rounds * args.runs
    n = runs * (args.events + 2)
    long_run_us = timer.cpu_s["client"] * 1e6 / runs
    short_run_us = short.cpu_s["client"] * 1e6 / runs
    per_delta_us = (long_run_us - short_run_us) / (args.events - _SHORT_EVENTS)
    return {
        "events": n,
        "events_s": n / timer.wall_s,
        "us_per_event": timer.us_per(n, "client"),
        "pg_us_per_event": timer.us_per(n, "postgres"),
        "nats_us_per_event": timer.us_per(n, "nats"),
        "others_cpu_cores": max(timer.others_cores(), short.others_cores()),
        "us_per_run_fixed": short_run_us - _SHORT_EVENTS * per_delta_us,
        "us_per_delta_marginal": per_delta_us,
    }


async def _raw_waves(b: Broker, args: argparse.Namespace, n: int, timer: Timer) -> None:
    waves = []
    for _ in range(args.rounds):
        wave = []
        for _ in range(args.runs):
            sid = await b.store.create_session(USER, "bench agents raw")
            wave.append(await b.store.create_run(sid, USER, model="bench"))
        waves.append(wave)
    pieces = _agents.deltas(n)
    timer.start()
    for wave in waves:
        await asyncio.gather(*(_raw_run(b, run_id, pieces) for run_id in wave))
    timer.stop()


async def _raw_run(b: Broker, run_id: str, pieces: list[str]) -> None:
    w: RunWriter = await b.claim(run_id, "bench-raw")
    await w.append(events.RunStart(model="bench", started_by=USER))
    m = "m_0001"
    for i, piece in enumerate(pieces, 1):
        if i % 64 == 0:  # as the agents yield (bench/_agents.py)
            await asyncio.sleep(0)
        await w.append(events.TextDelta(message_id=m, delta=piece))
    await w.append(events.RunEnd(status="completed"))
    await w.flush()


# --- 2. frameworks ------------------------------------------------------------------


async def _framework(
    st: Stack, b: Broker, meter: Meter, case: FrameworkCase, args: argparse.Namespace
) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        served = Served({}, lambda: 0.0)
        if case.serve is not None:
            served = await stack.enter_async_context(case.serve())
        return await _framework_served(st, b, meter, case, args, served)
    raise AssertionError("unreachable")  # mypy: an exit stack may swallow


async def _framework_served(
    st: Stack,
    b: Broker,
    meter: Meter,
    case: FrameworkCase,
    args: argparse.Namespace,
    served: Served,
) -> dict[str, Any]:
    args = argparse.Namespace(**{**vars(args), "rounds": args.framework_rounds})
    n, runs = args.events, args.runs
    settings = {**case.worker, **served.settings}
    await case.bare(min(runs, 10), _SHORT_EVENTS, settings)
    long = await _bare(case, args, n, settings, served)
    short = await _bare(case, args, _SHORT_EVENTS, settings, served)
    async with _worker(st, meter, args, settings) as wk:
        r = await _runs(b, meter, wk, args, case.input, exact=False)
    tokens = r["text_deltas"]
    per_delta = (long["us_per_run"] - short["us_per_run"]) / (n - _SHORT_EVENTS)
    r.update(
        bare_us_per_token=long["cpu_s"] * 1e6 / long["tokens"],
        bare_tokens_s=long["tokens"] / long["wall_s"],
        bare_us_per_run_fixed=short["us_per_run"] - _SHORT_EVENTS * per_delta,
        bare_us_per_delta_marginal=per_delta,
        served_us_per_token=long["served_cpu_s"] * 1e6 / long["tokens"],
        worker_us_per_token=r["worker_cpu_s"] * 1e6 / tokens,
        pg_us_per_token=r["pg_cpu_s"] * 1e6 / tokens,
        events_per_run=r["events"] / (args.rounds * runs),
    )
    r["overhead_us_per_token"] = r["worker_us_per_token"] - r["bare_us_per_token"]
    r["overhead_us_per_run"] = r["worker_us_per_run_fixed"] - r["bare_us_per_run_fixed"]
    r["overhead_us_per_delta"] = r["worker_us_per_delta_marginal"] - per_delta
    return r


async def _bare(
    case: FrameworkCase,
    args: argparse.Namespace,
    n: int,
    settings: Mapping[str, object],
    served: Served,
) -> dict[str, float]:
    """--rounds waves of --runs bare runs of n tokens, in this process.

    CPU by `time.process_time` (ns resolution: a bare run may take less CPU
    than psutil's 10 ms ticks resolve), less what the case serves (an
    upstream, on a thread of its own: not the framework's)."""
    c0, s0, t0 = time.process_time(), served.cpu_s(), time.perf_counter()
    produced = 0
    for _ in range(args.rounds):
        produced += await case.bare(args.runs, n, settings)
    served_cpu_s = served.cpu_s() - s0
    cpu_s = time.process_time() - c0 - served_cpu_s
    if produced != args.rounds * args.runs * n:
        raise RuntimeError(f"framework {case.name}: bare produced {produced} tokens, "
                           f"not {args.rounds} x {args.runs} x {n}")  # fmt: skip
    return {
        "tokens": produced,
        "cpu_s": cpu_s,
        "wall_s": time.perf_counter() - t0,
        "served_cpu_s": served_cpu_s,
        "us_per_run": cpu_s * 1e6 / (args.rounds * args.runs),
    }


# --- figures ----------------------------------------------------------------------


def _figures(
    per_trial: list[dict[str, Any]], args: argparse.Namespace, cases: list[FrameworkCase]
) -> list[Figure]:
    figs: list[Figure] = []
    n, k = args.events, max(1, args.per_step)
    steps = -(-n // k)
    runs = args.runs * args.rounds
    api, raw = not args.no_api, not args.no_raw

    def add(section: str, name: str, unit: str, values: list[float]) -> None:
        figs.append(_lib.summarize(section, name, unit, values))

    def col(which: str, key: str) -> list[float]:
        return [float(t[which][key]) for t in per_trial]

    sec = (f"{args.runs} concurrent runs x {n} text deltas, {args.rounds} waves, one worker "
           f"process; per committed event ({n + 2} per run)")  # fmt: skip
    labels = {
        "a": "(a) built-in loop",
        "b": "(b) API, ctx.text",
        "b2": "(b2) API, one step",
        "b3": f"(b3) API, a step per {k}",
    }
    if api:
        for key, label in labels.items():
            add(sec, f"{label}: worker CPU", "µs/event", col(key, "worker_us_per_event"))
        for key, label in labels.items():
            add(sec, f"{label}: committed", "events/s", col(key, "events_s"))
        for key, label in labels.items():
            add(sec, f"{label}: run_start ts -> run_end ts p50", "ms", col(key, "run_span_p50_ms"))
        add(sec, "(b) - (a): the agent API's overhead, worker CPU", "µs/event",
            [t["b"]["worker_us_per_event"] - t["a"]["worker_us_per_event"] for t in per_trial])  # fmt: skip
        add(sec, "(b2) - (b): one step around the run, worker CPU", "µs/event",
            [t["b2"]["worker_us_per_event"] - t["b"]["worker_us_per_event"] for t in per_trial])  # fmt: skip
        add(sec, f"(b3) - (b): a step's cost ({steps} steps per run), worker CPU", "µs/step",
            [(t["b3"]["worker_cpu_s"] - t["b"]["worker_cpu_s"]) * 1e6 / (runs * steps)
             for t in per_trial])  # fmt: skip
        add(sec, "… PostgreSQL CPU", "µs/step",
            [(t["b3"]["pg_cpu_s"] - t["b"]["pg_cpu_s"]) * 1e6 / (runs * steps)
             for t in per_trial])  # fmt: skip
    short = _SHORT_EVENTS
    fit = f"(fit: {n}- vs {short}-delta runs)"
    if api:
        for key, label in (("a", labels["a"]), ("b", labels["b"])):
            add(sec, f"{label}: worker CPU per run {fit}", "µs/run",
                col(key, "worker_us_per_run_fixed"))  # fmt: skip
            add(sec, f"{label}: … + worker CPU per text delta", "µs/delta",
                col(key, "worker_us_per_delta_marginal"))  # fmt: skip
    if raw:
        add(sec, f"(c) raw: CPU per run {fit}", "µs/run", col("c", "us_per_run_fixed"))
        add(sec, "(c) raw: … + CPU per text delta", "µs/delta", col("c", "us_per_delta_marginal"))
    if api:
        for key, label in (("a", labels["a"]), ("b", labels["b"]), ("b3", labels["b3"])):
            add(sec, f"{label}: PostgreSQL CPU", "µs/event", col(key, "pg_us_per_event"))
            add(sec, f"{label}: nats-server CPU", "µs/event", col(key, "nats_us_per_event"))
    if raw:
        add(sec, "(c) raw: RunWriter.append in the bench process, CPU", "µs/event",
            col("c", "us_per_event"))  # fmt: skip
        add(sec, "(c) raw: … committed", "events/s", col("c", "events_s"))
        add(sec, "(c) raw: … PostgreSQL CPU", "µs/event", col("c", "pg_us_per_event"))
    whichs = (["a", "b", "b2", "b3"] if api else []) + (["c"] if raw else [])
    if whichs:
        add(sec, "host CPU outside our processes, max over the cases", "cores",
            [max(t[w]["others_cpu_cores"] for w in whichs) for t in per_trial])  # fmt: skip
    fw_rounds = args.framework_rounds
    for case in cases:
        key = f"fw_{case.name}"
        sec = (f"framework {case.name}: bare vs under runlog ({fw_rounds} x {args.runs} "
               f"runs x {n} tokens)")  # fmt: skip
        add(sec, "bare, in the bench process: CPU", "µs/token", col(key, "bare_us_per_token"))
        add(sec, "under runlog: worker CPU", "µs/token", col(key, "worker_us_per_token"))
        add(sec, "under runlog - bare: the adapter's overhead", "µs/token",
            col(key, "overhead_us_per_token"))  # fmt: skip
        if raw:
            add(sec, "… next to (c) raw RunWriter.append, same trial", "µs/event",
                col("c", "us_per_event"))  # fmt: skip
        add(sec, "under runlog: worker CPU per committed event", "µs/event",
            col(key, "worker_us_per_event"))  # fmt: skip
        add(sec, "under runlog: committed events per run", "events", col(key, "events_per_run"))
        fit = f"(fit: {n}- vs {short}-token runs)"
        add(sec, f"bare: CPU per run {fit}", "µs/run", col(key, "bare_us_per_run_fixed"))
        add(sec, "bare: … + CPU per token", "µs/token", col(key, "bare_us_per_delta_marginal"))
        add(sec, f"under runlog: worker CPU per run {fit}", "µs/run",
            col(key, "worker_us_per_run_fixed"))  # fmt: skip
        add(sec, "under runlog: … + worker CPU per text delta", "µs/delta",
            col(key, "worker_us_per_delta_marginal"))  # fmt: skip
        add(sec, "overhead per run (fit)", "µs/run", col(key, "overhead_us_per_run"))
        add(sec, "overhead per text delta (fit)", "µs/delta", col(key, "overhead_us_per_delta"))
        add(sec, "under runlog: PostgreSQL CPU", "µs/token", col(key, "pg_us_per_token"))
        if case.serve is not None:
            add(sec, "the upstream it serves, bare (not counted)", "µs/token",
                col(key, "served_us_per_token"))  # fmt: skip
        add(sec, "bare: tokens/s", "tokens/s", col(key, "bare_tokens_s"))
        add(sec, "under runlog: committed events/s", "events/s", col(key, "events_s"))
        add(sec, "host CPU outside our processes", "cores", col(key, "others_cpu_cores"))
    if not args.no_replay:
        figs += _replay_figures(per_trial, args)
    return figs


def _replay_figures(per_trial: list[dict[str, Any]], args: argparse.Namespace) -> list[Figure]:
    """Part 3 (bench/_verify.py)."""
    figs: list[Figure] = []
    n, short = args.replay_events, _SHORT_EVENTS

    def add(section: str, name: str, unit: str, key: str, *path: str) -> None:
        values = []
        for t in per_trial:
            v = t["replay"]
            for p in path:
                v = v[p]
            values.append(float(v[key]))
        figs.append(_lib.summarize(section, name, unit, values))

    sec = (f"replay verification, in process: a log of {n} events (text deltas of "
           "10 messages, each followed by a tool card), an identical replay; CPU, best of 5")  # fmt: skip
    ip = "in_process"
    add(sec, "Replay(...) built: the log filtered", "µs/event", "build_us_per_event", ip)
    add(sec, "… the log with 100 steps in it", "µs/event", "build_steps_us_per_event", ip)
    add(sec, "Replay.take of each replayed event, then until", "µs/event",
        "take_us_per_event", ip)  # fmt: skip
    add(sec, "base: the same loop awaiting a no-op", "µs/event", "noop_us_per_event", ip)
    add(sec, "base: the same loop, msgspec.json.encode of each event", "µs/event",
        "encode_us_per_event", ip)  # fmt: skip
    add(sec, "verification adds: built + take - no-op loop", "µs/event", "added_us_per_event", ip)
    sec = (f"replay verification, end to end: an API agent's run of {n} text deltas and a "
           "step, its worker killed (-9), resumed by another; per logged delta")  # fmt: skip
    lg = "long"
    add(sec, "resume: the claim -> the next live event's ts", "ms", "claim_to_live_ms", lg)
    add(sec, "… per logged event", "µs/event", "claim_to_live_us_per_event", lg)
    add(sec, "… the claim -> status resumed (log read, Replay built, tail retracted)", "ms",
        "claim_to_resumed_ms", lg)  # fmt: skip
    add(sec, "… status resumed -> the live event (the agent replayed, compared)", "ms",
        "resumed_to_live_ms", lg)  # fmt: skip
    add(sec, "survivor's CPU, the kill -> the live event", "µs/event",
        "survivor_cpu_us_per_event", lg)  # fmt: skip
    fit = f"(fit: {n}- vs {short}-delta resumes)"
    add(sec, f"resume per logged event {fit}", "µs/event", "claim_to_live_us_per_event_marginal")
    add(sec, "… + per resume", "ms", "claim_to_live_ms_fixed")
    add(sec, f"survivor's CPU per logged event {fit}", "µs/event",
        "survivor_cpu_us_per_event_marginal")  # fmt: skip
    add(sec, "base: Store.run_page of the events, pages of 1,000 (bench process)", "µs/event",
        "read_us_per_event", lg)  # fmt: skip
    add(sec, "base: … and events.decode_stored of each", "µs/event",
        "read_decode_us_per_event", lg)  # fmt: skip
    add(sec, "base: … the first read of as many events just committed, a new pool", "µs/event",
        "first_read_decode_us_per_event", lg)  # fmt: skip
    add(sec, "verification (in process, x events) / the resume", "%", "verify_share_pct")
    add(sec, "verification (in process) / the survivor's CPU per logged event (fit)", "%",
        "verify_share_cpu_pct")  # fmt: skip
    return figs
