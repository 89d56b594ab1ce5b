"""compat: every compat projection (/v1/compat/...) next to native SSE, in
the same run, through a real gateway process: replay rate, live latency, and
the projections' own CPU.

The formats are the rows of `FORMATS` (one row per way of reading a run:
its request, and how the reader finds a frame's seq); native SSE is the
reference every figure is read against. All are read by one client process
(bench/_sseload.py) with the same minimal reader: a regular expression that
finds the cursor of each frame carrying one (`id: <seq>` lines, or OpenAI's
`"seq":` in `extra`), never parsing events. Every trial, in an order rotated
by trial (so no format is always first):

1. Replay. One run of --events token deltas between run_start and run_end
   (~165-byte events, as `bench replay`), written once before the trials.
   Each format reads all of it from seq 0: request → the frame that carries
   the run_end's seq (events/s = the run's events / that time), and the
   gateway process's CPU (psutil user+sys) over the read, per event. Each
   format's read is paired with a native SSE read right before or after it
   (alternating), and its ratio is to that read: the host's speed drifts
   over a run (the same native read measured 209k-562k events/s in one
   afternoon), two reads a second apart see the same host. Target (issue
   11): ≥ 50 % of native SSE events/s.
2. In-process: decode + project + render of the same stored payloads (read
   back from PostgreSQL) in this process, per event: what a projection costs
   without sockets or the hub (what the profile of a slow format looks at);
   and the same for a run of one tool call whose arguments stream in
   --events deltas (argument text, like a message's, must not cost more per
   delta as it grows).
3. Live. --runs runs (over --sessions sessions) stream token deltas at
   --rate events/s in all (each run rate/runs events/s, random phase),
   appended by this process for the whole phase (only then: never during
   the replay), after a second's lead-in. Each slice opens one follower
   per run and format from the run's last committed seq, is measured for
   --live-seconds (the first --warmup-s left out), and closes. commit →
   receive as in `bench latency`: the appender's commit time (a hook in this
   process) → the client process's read of the frame (wall clock, one
   machine). First native SSE alone (100 followers: the issue's load), then
   each format beside native followers of the same runs (200 followers),
   so that the two p99s are of the same events at the same moment; the
   followers join in two waves, each format first on half of the runs (a
   gateway serves a run's followers in join order). Target: p99 within 1 ms
   of native SSE's.

The gateway runs without the per-user connection cap (a slice holds 200
followers of one user, and the last slice's may still be closing).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlencode

from broker import events
from broker.log import RunWriter
from broker.runtime import Broker
from gateway.compat import agentui_http, agui_http, aisdk_http, openai_http, sim_http
from gateway.compat.agentui import AgentUiProjection
from gateway.compat.agui import AgUi
from gateway.compat.aisdk import AiSdkProjection
from gateway.compat.base import Context, Projection
from gateway.compat.langgraph import MODES, LangGraph
from gateway.compat.openai import OpenAIChunks
from gateway.compat.serve import Framing, decode
from gateway.compat.sim import PROTOCOL_HEADER, PROTOCOL_V1, SimProjection

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure, Timer
from ._procs import GatewayProc, Meter, SseLoadProc
from .latency import hook_commits, match_latencies

NATIVE = "native"
_LG_MODES = ("messages-tuple", "updates", "custom")  # the quickstart's (docs/compat.md)

Factory = Callable[[str, str], tuple[Projection, Framing]]  # (run_id, session_id) → what serves it


def _langgraph(modes: frozenset[str]) -> Factory:
    # gateway/compat/langgraph_http.py builds its Framing per answer (Location headers).
    return lambda run, sid: (
        LangGraph(Context(run, sid), modes),
        Framing(ids=True, event_names=True),
    )


@dataclass(frozen=True)
class Format:
    """One way of reading a run. `path` and `body` name `{run}` and
    `{session}`; `cursor` is how the reader finds a frame's seq (`id`: an
    `id:` line, `seq`: a `"seq":` field); `serves` builds, for the
    in-process loop, the projection and framing the gateway's route uses
    (None: native SSE, which projects nothing)."""

    name: str
    label: str
    method: str
    path: str
    query: tuple[tuple[str, str], ...] = ()
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    body: Mapping[str, object] | None = None
    cursor: str = "id"
    serves: Factory | None = None

    def url(self, base: str, run: str, session: str, after: int = 0) -> str:
        query = list(self.query) + ([("after", str(after))] if after else [])
        path = self.path.format(run=run, session=session)
        return base + path + (f"?{urlencode(query)}" if query else "")

    def request_body(self, run: str, session: str) -> object:
        if self.body is None:
            return None
        return {
            k: v.format(run=run, session=session) if isinstance(v, str) else v
            for k, v in self.body.items()
        }


FORMATS: tuple[Format, ...] = (
    Format(NATIVE, "native SSE", "GET", "/v1/runs/{run}/events",
           headers={"Accept": "text/event-stream"}),
    Format("openai", "OpenAI chunks", "POST", "/v1/compat/openai/runs/{run}/chat/completions",
           body={"model": "bench", "messages": [], "stream": True}, cursor="seq",
           serves=lambda run, sid: (OpenAIChunks(Context(run, "")), openai_http.FRAMING)),
    Format("ai-sdk", "AI SDK", "GET", "/v1/compat/ai-sdk/runs/{run}/stream",
           serves=lambda run, sid: (AiSdkProjection(Context(run, sid)), aisdk_http.FRAMING)),
    Format("langgraph", "LangGraph (messages-tuple, updates, custom)", "GET",
           "/v1/compat/langgraph/threads/{session}/runs/{run}/stream",
           query=tuple(("stream_mode", m) for m in _LG_MODES),
           serves=_langgraph(frozenset(_LG_MODES))),
    Format("langgraph-values", "LangGraph (every mode, values too)", "GET",
           "/v1/compat/langgraph/threads/{session}/runs/{run}/stream", serves=_langgraph(MODES)),
    Format("sim", "Sim agent-events-v1", "GET", "/v1/compat/sim/runs/{run}/stream",
           headers={PROTOCOL_HEADER: PROTOCOL_V1},
           serves=lambda run, sid: (
               SimProjection(Context(run, sid, options={"negotiated": True})), sim_http.FRAMING)),
    Format("agent-ui", "AgentUiEvent", "GET", "/v1/compat/agent-ui/runs/{run}/events",
           serves=lambda run, sid: (AgentUiProjection(Context(run, sid)), agentui_http.FRAMING)),
    Format("agui", "AG-UI", "POST", "/v1/compat/agui/runs/{run}",
           headers={"Accept": "text/event-stream"},
           body={"threadId": "{session}", "runId": "{run}", "messages": []},
           serves=lambda run, sid: (AgUi(Context(run, sid)), agui_http.FRAMING)),
)  # fmt: skip


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = ", ".join(f.name for f in FORMATS if f.name != NATIVE)
    p.add_argument("--formats", default="", metavar="NAME,...",
                   help=f"compat formats to measure (default: all: {names}); native SSE always")  # fmt: skip
    p.add_argument("--events", type=int, default=100_000, help="token deltas in the replayed run (default: 100000)")  # fmt: skip
    p.add_argument("--rate", type=float, default=1000.0, help="live: events/s in all (default: 1000)")  # fmt: skip
    p.add_argument("--runs", type=int, default=100, help="live: runs, one follower each (default: 100)")  # fmt: skip
    p.add_argument("--sessions", type=int, default=10, help="live: sessions of the runs (default: 10)")  # fmt: skip
    p.add_argument("--live-seconds", type=float, default=4.0, help="live: measured per format and trial (default: 4)")  # fmt: skip
    p.add_argument("--warmup-s", type=float, default=0.5, help="live: left out after the followers open (default: 0.5)")  # fmt: skip
    p.add_argument("--no-replay", action="store_true", help="skip the replay")
    p.add_argument("--no-live", action="store_true", help="skip the live phase")
    p.add_argument("--no-inproc", action="store_true", help="skip the in-process loop")
    p.add_argument("--profile-inproc", type=Path, default=None, metavar="PREFIX",
                   help="cProfile the in-process loop of each format (first trial): "
                        "pstats to PREFIX.<format>.pstats")  # fmt: skip
    p.add_argument("--profile-gateway", type=Path, default=None, metavar="FILE",
                   help="run the gateway under cProfile (CPU time); pstats to FILE")  # fmt: skip


def _chosen(arg: str) -> list[Format]:
    known = {f.name: f for f in FORMATS}
    names = [n.strip() for n in arg.split(",") if n.strip()] or [f.name for f in FORMATS]
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"unknown format(s) {', '.join(bad)}; known: {', '.join(known)}")
    return [known[NATIVE]] + [known[n] for n in names if n != NATIVE]


def _rotated(formats: list[Format], trial: int) -> list[Format]:
    k = trial % len(formats)
    return formats[k:] + formats[:k]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    formats = _chosen(args.formats)
    per_trial: list[dict[str, Any]] = []
    total = 0
    async with _lib.stack(args.work_dir) as st:
        versions = await _lib.server_versions(st)
        meter = Meter(st)
        b = await _gw.connect_broker(st)
        commits: list[tuple[str, int, int, float]] = []
        hook_commits(b, commits)
        gw = await GatewayProc(st, profile=args.profile_gateway, max_connections_per_user=0).start()
        load = await SseLoadProc().start()
        meter.add("gateway", gw.pid)
        meter.add("client", load.pid)
        try:
            session = await b.store.create_session(_gw.USER, "bench compat")
            await _warm_up(b, session, gw, load, formats)
            payloads: list[bytes] = []
            tool_payloads: list[bytes] = []
            if not args.no_replay or not args.no_inproc:
                t0 = time.perf_counter()
                w = await _gw.new_run(b, session)
                await _gw.append_burst(w, args.events)
                await _gw.end_run(w)
                total = w.last_seq
                progress(f"wrote {total:,} events in {time.perf_counter() - t0:.1f} s")
                replay_run = w.run_id
                if not args.no_inproc:
                    payloads = await _payloads(b, replay_run)
                    tool_payloads = _tool_call_payloads(replay_run, session, args.events)
            commits.clear()  # the live phase's commits only from here
            live = None if args.no_live else await _Live.start(b, args, commits)
            try:
                for trial in range(args.trials):
                    t: dict[str, Any] = {
                        "replay": {}, "replay_beside": {}, "inproc": {}, "inproc_tool": {}, "live": {},
                        "live_beside": {},
                    }  # fmt: skip
                    order = _rotated(formats, trial)
                    if not args.no_replay:
                        # Each format next to a native read of its own (which goes first
                        # alternates), so that a ratio compares two reads a second apart.
                        natives: list[dict[str, Any]] = []
                        pairs = [[f] for f in order if f.name == NATIVE and len(formats) == 1]
                        pairs += [
                            [formats[0], f][:: 1 if (i + trial) % 2 else -1]
                            for i, f in enumerate(x for x in order if x.name != NATIVE)
                        ]
                        for pair in pairs:
                            for f in pair:
                                r = await _replay(f, gw, load, meter, replay_run, session, total)
                                progress(f"trial {trial + 1}: replay {f.name}: "
                                         f"{r['events_s']:,.0f} events/s, "
                                         f"gateway {r['gateway_us_per_event']:.1f} µs/event")  # fmt: skip
                                if f.name == NATIVE:
                                    natives.append(r)
                                else:
                                    t["replay"][f.name] = r
                            other = next((f for f in pair if f.name != NATIVE), None)
                            if other is not None:
                                t["replay_beside"][other.name] = natives[-1]
                        t["replay"][NATIVE] = {
                            k: _gw.median([n[k] for n in natives]) for k in natives[0]
                        }
                    if payloads:
                        for f in order:
                            if f.serves is not None:
                                prof = args.profile_inproc if trial == 0 else None
                                t["inproc"][f.name] = _inproc(f, payloads, replay_run, session,
                                                              prof)  # fmt: skip
                                t["inproc_tool"][f.name] = _inproc(f, tool_payloads,
                                                                   replay_run, session, None)  # fmt: skip
                    if live is not None:
                        # Only now: the writers' load must not disturb the replay.
                        await live.begin()
                        native = formats[0]
                        # Native alone first (the figure at the load), then each
                        # format beside native followers of the same runs, so that both
                        # see the same events on the same host at the same moment.
                        for fs in [[native]] + [[native, f] for f in order if f is not native]:
                            r = await live.measure(fs, gw, load, meter)
                            name = fs[-1].name
                            t["live"][name if len(fs) > 1 else NATIVE] = r[fs[-1].name]
                            if len(fs) > 1:
                                t["live_beside"][name] = r[NATIVE]
                            progress(f"trial {trial + 1}: live {name}: commit → receive p50 "
                                     + ", ".join(f"{k} {v['p50_ms']:.2f} ms" for k, v in r.items())
                                     + "; p99 "
                                     + ", ".join(f"{k} {v['p99_ms']:.2f} ms" for k, v in r.items())
                                     + f"; {sum(v['missing'] for v in r.values())} missing")  # fmt: skip
                        await live.pause()
                    per_trial.append(t)
            finally:
                if live is not None:
                    await live.stop()
        finally:
            await load.stop()
            await gw.stop()
            await b.close()
    return {
        "servers": versions,
        "run_events": total,
        "formats": [f.name for f in formats],
        "figures": _figures(per_trial, formats, args, total),
        "trials": per_trial,
    }


async def _warm_up(
    b: Broker, session: str, gw: GatewayProc, load: SseLoadProc, formats: list[Format]
) -> None:
    """Every format reads a small run once, not measured: a gateway's first
    read pays for database connections, prepared statements and imports."""
    w = await _gw.new_run(b, session)
    await _gw.append_burst(w, 3000)
    await _gw.end_run(w)
    for f in formats:
        await _read(f, gw, load, w.run_id, session, w.last_seq)


async def _read(
    f: Format, gw: GatewayProc, load: SseLoadProc, run: str, session: str, last: int
) -> dict[str, Any]:
    return await load.call(
        "replay", url=f.url(gw.url, run, session), method=f.method,
        headers=_headers(f), body=f.request_body(run, session), cursor=f.cursor, last=last,
    )  # fmt: skip


def _headers(f: Format) -> dict[str, str]:
    return {"Authorization": f"Bearer {_gw.token()}", **f.headers}


async def _replay(
    f: Format, gw: GatewayProc, load: SseLoadProc, meter: Meter, run: str, session: str,
    total: int,
) -> dict[str, Any]:  # fmt: skip
    timer = Timer(meter)
    timer.start()
    r = await _read(f, gw, load, run, session, total)
    timer.stop()
    return {
        "frames": r["frames"],
        "bytes": r["bytes"],
        "seconds": r["seconds"],
        "to_eof_s": r["to_eof_s"],
        "events_s": total / r["seconds"],
        "gateway_us_per_event": timer.us_per(total, "gateway"),
        "gateway_cpu_pct": 100 * timer.cpu_s["gateway"] / timer.wall_s,
        "client_cpu_pct": 100 * timer.cpu_s["client"] / timer.wall_s,
        "others_cpu_cores": timer.others_cores(),
    }


async def _payloads(b: Broker, run_id: str) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while True:
        page = await b.store.run_page(run_id, pos, 5000)
        if not page:
            return out
        out += [e.payload for e in page]
        pos = page[-1].seq


def _tool_call_payloads(run: str, session: str, n: int) -> list[bytes]:
    """A run of one tool call whose arguments stream in `n` deltas (a tool
    writing a file, say), as the log stores them: text that grows by deltas
    in another place than a message."""
    evs: list[events.Event] = [
        events.RunStart(model="bench", started_by=_gw.USER),
        events.ToolCallStart(tool_call_id="c_1", tool_name="write_file"),
        events.ToolArgsDelta(tool_call_id="c_1", partial_json='{"text":"'),
        *(events.ToolArgsDelta(tool_call_id="c_1", partial_json=_lib.TOKENS[i % len(_lib.TOKENS)])
          for i in range(n)),
        events.ToolArgsDelta(tool_call_id="c_1", partial_json='"}'),
        events.ToolCallEnd(tool_call_id="c_1"),
        events.ToolResult(tool_call_id="c_1", status="ok", summary="written"),
        events.RunEnd(status="completed"),
    ]  # fmt: skip
    out = []
    for seq, e in enumerate(evs, 1):
        e.run_id, e.session_id, e.seq, e.ts = run, session, seq, 1_700_000_000_000 + seq
        out.append(events.encode(e))
    return out


def _inproc(
    f: Format, payloads: list[bytes], run: str, session: str, profile: Path | None
) -> dict[str, Any]:
    """decode + feed + render of every payload, as CompatClient.send does them."""
    assert f.serves is not None
    projection, framing = f.serves(run, session)
    render, feed = framing.render, projection.feed
    prof = cProfile.Profile(time.process_time) if profile is not None else None
    nbytes = 0
    t0 = time.process_time()
    if prof is not None:
        prof.enable()
    for p in payloads:
        ev = decode(p)
        if ev is not None:
            nbytes += len(render(feed(ev)))
    if prof is not None:
        prof.disable()
        prof.dump_stats(f"{profile}.{f.name}.pstats")
    cpu_s = time.process_time() - t0
    return {"us_per_event": cpu_s * 1e6 / len(payloads), "bytes_per_event": nbytes / len(payloads)}


class _Live:
    """The live phase's runs, streaming for the whole phase; one format's
    followers at a time."""

    def __init__(self, args: argparse.Namespace, commits: list[tuple[str, int, int, float]]):
        self.args = args
        self.commits = commits
        self.writers: list[RunWriter] = []
        self.sessions: dict[str, str] = {}  # run → session
        self.appended: dict[tuple[str, int], float] = {}
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []

    @classmethod
    async def start(
        cls, b: Broker, args: argparse.Namespace, commits: list[tuple[str, int, int, float]]
    ) -> _Live:
        live = cls(args, commits)
        sessions = [await b.store.create_session(_gw.USER, "bench compat live")
                    for _ in range(args.sessions)]  # fmt: skip
        for i in range(args.runs):
            w = await _gw.new_run(b, sessions[i % len(sessions)])
            live.writers.append(w)
            live.sessions[w.run_id] = w.session_id
        return live

    async def begin(self) -> None:
        """Stream every run from now on (from a random phase); then a
        second's lead-in, so that no format's slice starts cold."""
        self.stopping.clear()
        rate = self.args.rate / self.args.runs
        self.tasks = [asyncio.create_task(self._stream(w, rate)) for w in self.writers]
        await asyncio.sleep(1.0)

    async def pause(self) -> None:
        """Stop streaming (the runs stay open: the next trial goes on with them)."""
        self.stopping.set()
        await asyncio.gather(*self.tasks)
        self.tasks = []

    async def _stream(self, w: RunWriter, rate: float) -> None:
        """Token deltas at `rate`/s from a random phase, until stopped."""
        loop = asyncio.get_running_loop()
        period = 1.0 / rate
        start = loop.time() + random.random() * period
        tokens = _lib.TOKENS
        i = 0
        while not self.stopping.is_set():
            delay = start + i * period - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            t = time.time()
            seq = await w.append(
                events.TextDelta(message_id="m_0001", delta=tokens[i % len(tokens)])
            )
            self.appended[(w.run_id, seq)] = t
            i += 1
        await w.flush()

    def _committed(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for run_id, _, seq, _ in self.commits:
            if seq > last.get(run_id, 0):
                last[run_id] = seq
        return last

    async def measure(
        self, fs: list[Format], gw: GatewayProc, load: SseLoadProc, meter: Meter
    ) -> dict[str, dict[str, Any]]:
        """One slice: every run followed once in each of `fs` at the same
        time, each from the run's last committed seq. They open in
        len(fs) waves, run i getting fs[(i + wave) % len(fs)] in wave
        `wave`, so each format is the first to join half of the runs (the
        gateway serves a run's followers in join order)."""
        args = self.args
        committed = self._committed()
        for wave in range(len(fs)):
            streams = []
            for i, w in enumerate(self.writers):
                f = fs[(i + wave) % len(fs)]
                after = committed.get(w.run_id, 1)
                streams.append({"key": f"{f.name} {w.run_id}", "method": f.method,
                                "url": f.url(gw.url, w.run_id, w.session_id, after),
                                "headers": _headers(f), "cursor": f.cursor,
                                "body": f.request_body(w.run_id, w.session_id)})  # fmt: skip
            await load.call("follow", streams=streams)
        timer = Timer(meter)
        timer.start()
        t_start = time.time()
        await asyncio.sleep(args.live_seconds)
        t_end = time.time()
        timer.stop()
        await asyncio.sleep(0.3)  # the last events reach the client
        r = await load.call("unfollow")
        if r["n_errors"]:
            raise RuntimeError(f"{[f.name for f in fs]}: followers failed: {r['errors']}")
        received: dict[str, list[tuple[str, int, float]]] = {f.name: [] for f in fs}
        for key, seq, t in r["records"]:
            name, _, run_id = key.partition(" ")
            received[name].append((run_id, seq, t))
        n = sum(1 for ta in self.appended.values() if t_start <= ta <= t_end)
        out: dict[str, dict[str, Any]] = {}
        q = _lib.quantile
        for f in fs:
            lat, _, append_commit, missing = match_latencies(
                self.appended, self.commits, received[f.name], t_start + args.warmup_s, t_end
            )
            out[f.name] = {
                "measured": len(lat),
                "missing": missing,
                "p50_ms": q(lat, 0.5),
                "p90_ms": q(lat, 0.9),
                "p99_ms": q(lat, 0.99),
                "p999_ms": q(lat, 0.999),
                "max_ms": lat[-1] if lat else float("nan"),
                "append_commit_p99_ms": q(append_commit, 0.99),
                # Of the whole slice (every format in it).
                "gateway_us_per_event": timer.us_per(n, "gateway"),
                "gateway_cpu_pct": 100 * timer.cpu_s["gateway"] / timer.wall_s,
                "others_cpu_cores": timer.others_cores(),
            }
        return out

    async def stop(self) -> None:
        await self.pause()
        for w in self.writers:
            await w.append(events.RunEnd(status="completed"))
        await asyncio.gather(*(w.flush() for w in self.writers))


def _figures(
    per_trial: list[dict[str, Any]], formats: list[Format], args: argparse.Namespace, total: int
) -> list[Figure]:
    figs: list[Figure] = []
    compat = [f for f in formats if f.name != NATIVE]

    def add(section: str, name: str, unit: str, vals: list[float]) -> None:
        figs.append(_lib.summarize(section, name, unit, vals))

    def each(phase: str, f: Format | str, key: str) -> list[float]:
        name = f if isinstance(f, str) else f.name
        return [float(t[phase][name][key]) for t in per_trial]

    def per(phase: str, key: str, pick: Callable[[list[float]], float]) -> list[float]:
        return [pick([float(r[key]) for r in t[phase].values()]) for t in per_trial]

    replay, live = not args.no_replay, not args.no_live
    sec = "against the targets (each ratio / difference within one trial)"
    if replay:
        for f in compat:
            add(sec, f"replay: {f.label} / native SSE beside it (≥ 0.5)", "ratio",
                [t["replay"][f.name]["events_s"] / t["replay_beside"][f.name]["events_s"]
                 for t in per_trial])  # fmt: skip
    if live:
        for f in compat:
            add(sec, f"live p99: {f.label} - native SSE beside it (≤ 1 ms)", "ms",
                [t["live"][f.name]["p99_ms"] - t["live_beside"][f.name]["p99_ms"]
                 for t in per_trial])  # fmt: skip
    if replay:
        sec = f"replay of a {total:,}-event run to one client, request → the run_end's frame"
        for f in formats:
            add(sec, f.label + (" (the median of its reads)" if f.name == NATIVE else ""),
                "events/s", each("replay", f, "events_s"))  # fmt: skip
        for f in formats:
            add(sec, f"{f.label}: gateway CPU", "µs/event", each("replay", f, "gateway_us_per_event"))  # fmt: skip
        for f in formats:
            add(sec, f"{f.label}: gateway CPU (of one core)", "%", each("replay", f, "gateway_cpu_pct"))  # fmt: skip
        add(sec, "client CPU, the highest of any read (of one core)", "%",
            per("replay", "client_cpu_pct", max))  # fmt: skip
        add(sec, "host CPU outside our processes, the highest of any read", "cores",
            per("replay", "others_cpu_cores", max))  # fmt: skip
    if per_trial and per_trial[0]["inproc"]:
        sec = "in-process decode + project + render of the same stored events (this process)"
        for f in compat:
            add(sec, f.label, "µs/event", each("inproc", f, "us_per_event"))
        sec = (f"in-process, the same for a run of one tool call whose arguments stream in "
               f"{args.events:,} deltas")  # fmt: skip
        for f in compat:
            add(sec, f.label, "µs/event", each("inproc_tool", f, "us_per_event"))
    if live:
        sec = (f"live: {args.rate:g} events/s over {args.runs} runs, one follower per run and "
               "format, commit → receive")  # fmt: skip
        add(sec, "native SSE alone: p50", "ms", each("live", NATIVE, "p50_ms"))
        add(sec, "native SSE alone: p99", "ms", each("live", NATIVE, "p99_ms"))
        add(sec, "native SSE alone: p99.9", "ms", each("live", NATIVE, "p999_ms"))
        add(sec, "native SSE alone: gateway CPU", "µs/event",
            each("live", NATIVE, "gateway_us_per_event"))  # fmt: skip
        for f in compat:
            add(sec, f"{f.label}: p50", "ms", each("live", f, "p50_ms"))
            add(sec, f"{f.label}: p99", "ms", each("live", f, "p99_ms"))
            add(sec, f"{f.label}: p99.9", "ms", each("live", f, "p999_ms"))
            add(sec, f"native SSE beside {f.label}: p99", "ms", each("live_beside", f, "p99_ms"))
            add(sec, f"gateway CPU, native SSE + {f.label}", "µs/event",
                each("live", f, "gateway_us_per_event"))  # fmt: skip
        add(sec, "events measured, the fewest of any format and slice", "events",
            [min(per("live", "measured", min)[i], per("live_beside", "measured", min)[i])
             for i in range(len(per_trial))] if compat else per("live", "measured", min))  # fmt: skip
        add(sec, "events not received, all slices", "events",
            [a + b for a, b in zip(per("live", "missing", sum), per("live_beside", "missing", sum),
                                   strict=True)] if compat else per("live", "missing", sum))  # fmt: skip
        add(sec, "append → commit p99 (native slice)", "ms",
            each("live", NATIVE, "append_commit_p99_ms"))  # fmt: skip
        add(sec, "host CPU outside our processes, the highest of any slice", "cores",
            per("live", "others_cpu_cores", max))  # fmt: skip
    return figs
