"""Processes of the gateway and worker benchmarks, each measured apart.

- `GatewayProc`: the real gateway, `python -m runlog.cli gateway`, configured
  only through RUNLOG_* variables, on a free port. `GatewayGroupProc`: N of
  them sharing that port (`runlog gateway --processes N`), each with its own
  metrics port.
- `WorkerProc`: the real worker, `python -m runlog.cli worker`.
- `RawServerProc`: bench/_rawws.py, the raw aiohttp server to compare with.
- `LoadProc`: bench/_wsload.py, the client process (many WebSockets, SSE,
  JSON pages), driven over stdin/stdout.
- `SseLoadProc`: bench/_sseload.py, the SSE reader of `bench compat` (any
  format, native or compat), driven the same way.
- `NatsWsServer`: a private nats-server with its WebSocket listener (the
  "expose NATS to browsers" peer), `SioServerProc`: bench/_sioserver.py
  (python-socketio on aiohttp, the rooms peer).
- `Meter`: the CPU readers of `_lib.CpuMeter` plus any of these processes,
  so that `_lib.Timer` reports each one's CPU and the host's outside load.

All children inherit this process's raised RLIMIT_NOFILE; all are stopped by
their own PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from broker.sockets import free_port, port_is_free
from runlog.embedded import NatsProcess

from . import _lib
from ._lib import Stack
from ._wsload import raise_fd_limit

REPO = Path(__file__).resolve().parent.parent
# Generous pipe buffer: a latency dump is one JSON line of a few MB.
_LINE_LIMIT = 256 * 1024 * 1024


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def task_cpu_s(pid: int) -> float:
    """CPU seconds of every live thread of `pid`, at nanosecond resolution
    (the scheduler's run time, /proc/PID/task/*/schedstat: the time that
    user+sys accounts, which /proc/PID/stat and so psutil only give in 10 ms
    ticks, too coarse for a round of a few ms). Threads that exited are
    not counted: for servers whose threads live as long as they do."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError as e:
        raise psutil.NoSuchProcess(pid) from e
    for tid in tids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    return total / 1e9


def rss_bytes(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


class Meter(_lib.CpuMeter):
    """`_lib.CpuMeter` plus named child processes (added and removed as they come and go)."""

    def __init__(self, st: Stack) -> None:
        super().__init__(st)
        self._pids: dict[str, int] = {}
        self._precise: set[str] = set()
        self._trees: dict[str, int] = {}

    def add(self, name: str, pid: int, precise: bool = False) -> None:
        """`precise`: read it with `task_cpu_s` (ns) rather than psutil (10 ms ticks)."""
        self._pids[name] = pid
        if precise:
            self._precise.add(name)

    def add_tree(self, name: str, pid: int) -> None:
        """`pid` and every process under it, as one (a gateway group)."""
        self._trees[name] = pid

    def remove(self, name: str) -> None:
        self._pids.pop(name, None)
        self._trees.pop(name, None)

    def snapshot(self) -> dict[str, float]:
        snap = super().snapshot()
        for name, pid in self._pids.items():
            try:
                snap[name] = task_cpu_s(pid) if name in self._precise else _cpu_s(pid)
            except psutil.NoSuchProcess:
                snap[name] = float("nan")
        for name, pid in self._trees.items():
            try:
                snap[name] = _lib.tree_cpu_s(pid)
            except psutil.NoSuchProcess:
                snap[name] = float("nan")
        return snap


def child_env(st: Stack, **settings: object) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(
        RUNLOG_NATS_URL=st.nats_url,
        RUNLOG_DATABASE_URL=st.database_url,
        RUNLOG_LOG_LEVEL="warning",
        PYTHONPATH=str(REPO),
    )
    for k, v in settings.items():
        env["RUNLOG_" + k.upper()] = str(v)
    return env


class _Child:
    """A child process whose output goes to a log file (read on failure)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        fd, path = tempfile.mkstemp(prefix=f"runlog-bench-{name}-", suffix=".log")
        os.close(fd)
        self.log_path = Path(path)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def output(self, tail: int = 4000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-tail:]
        return ""

    def rss(self) -> int:
        return rss_bytes(self.pid)

    async def stop(self, timeout_s: float = 15.0) -> None:
        p = self.proc
        if p is not None and p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(p.wait(), timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
                await p.wait()
        with contextlib.suppress(OSError):
            self.log_path.unlink()


# `runlog gateway` under cProfile with a CPU-time clock: on a shared host a
# wall-clock profile charges time spent waiting for a core to whatever ran.
_PROFILED_GATEWAY = """
import cProfile, sys, time
from runlog import cli
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    cli.main(["gateway"])
finally:
    prof.disable()
    prof.dump_stats(sys.argv[1])
"""

# `runlog worker` likewise; its argv after the stats file is the worker's.
_PROFILED_WORKER = """
import cProfile, sys, time
from runlog import cli
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    cli.main(["worker", *sys.argv[2:]])
finally:
    prof.disable()
    prof.dump_stats(sys.argv[1])
"""

# BENCH_GATEWAY_PRELOAD=file.py: run that file in the gateway process before
# it starts. For A/B experiments with a patched gateway (a suggested change
# tried without touching gateway/); never set by the scenarios themselves.
_PRELOADED_GATEWAY = """
import runpy, sys
from runlog import cli
runpy.run_path(sys.argv[1])
cli.main(["gateway"])
"""


# `runlog gateway` under tracemalloc (BENCH idle --tracemalloc-conns):
# SIGUSR1 writes a snapshot of the live Python heap (after a full
# collection) to argv[1], atomically, for `GatewayProc.heap_snapshot`.
_TRACED_GATEWAY = """
import gc, os, signal, sys, tracemalloc
from runlog import cli
tracemalloc.start(int(sys.argv[2]))
def dump(signum, frame):
    gc.collect()
    tracemalloc.take_snapshot().dump(sys.argv[1] + ".part")
    os.replace(sys.argv[1] + ".part", sys.argv[1])
signal.signal(signal.SIGUSR1, dump)
cli.main(["gateway"])
"""


# The load processes open their many clients as one user from one address:
# benchmarks of fan-out, latency and idle connections turn the per-user and
# per-address caps off (bench flood measures them, with their defaults).
NO_CONNECTION_CAPS: dict[str, object] = {"max_connections_per_user": 0, "max_connections_per_ip": 0}


def consecutive_free_ports(n: int) -> int:
    """A port p with p .. p+n-1 free right now."""
    while True:
        base = free_port()
        if base + n <= 65535 and all(port_is_free(base + i) for i in range(1, n)):
            return base


class GatewayProc(_Child):
    """`profile`: run the gateway under cProfile (CPU time), stats written to
    that file when it stops."""

    def __init__(self, st: Stack, profile: Path | None = None, **settings: object) -> None:
        super().__init__("gateway")
        self.profile = profile
        # Set before start(): run under tracemalloc, snapshots to this file.
        self.traced: Path | None = None
        self.processes = 1
        self.metrics_ports: list[int] = []  # a group's: each process's own port
        self.port = free_port()
        self.env = child_env(st, gateway_host="127.0.0.1", gateway_port=self.port, **settings)

    def member_pids(self) -> list[int]:
        """The pids that serve connections: the group's children, or the lone gateway."""
        if self.processes == 1:
            return [self.pid]
        return [p.pid for p in psutil.Process(self.pid).children()]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    async def start(self, timeout_s: float = 60.0) -> GatewayProc:
        raise_fd_limit()
        with self.log_path.open("wb") as log:
            preload = os.environ.get("BENCH_GATEWAY_PRELOAD")
            if self.profile:
                argv = ["-c", _PROFILED_GATEWAY, str(self.profile)]
            elif self.traced:
                argv = ["-c", _TRACED_GATEWAY, str(self.traced), "1"]
            elif preload:
                argv = ["-c", _PRELOADED_GATEWAY, preload]
            else:
                argv = ["-m", "runlog.cli", "gateway"]
                if self.processes > 1:
                    argv += ["--processes", str(self.processes)]
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, *argv, cwd=REPO, env=self.env, stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        urls = [f"http://127.0.0.1:{m}/readyz" for m in self.metrics_ports]
        pending = urls or [self.url + "/readyz"]
        async with aiohttp.ClientSession() as http:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"gateway exited:\n{self.output()}")
                pending = [u for u in pending if not await _answers_200(http, u)]
                if not pending:
                    return self
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gateway not ready in {timeout_s} s:\n{self.output()}")
                await asyncio.sleep(0.1)

    async def heap_snapshot(self, timeout_s: float = 300.0) -> tracemalloc.Snapshot:
        """The gateway's Python heap now (only when started with `traced`)."""
        assert self.traced is not None
        self.traced.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        async with asyncio.timeout(timeout_s):
            while not self.traced.exists():
                await asyncio.sleep(0.1)
        return await asyncio.to_thread(tracemalloc.Snapshot.load, str(self.traced))

    async def gauges(self, *names: str) -> dict[str, float]:
        """Current values of unlabelled gauges, from its /metrics."""
        return await _gauges(self.url + "/metrics", names)

    async def wait_replays_done(self, timeout_s: float = 600.0) -> float:
        """Until no catch-up replay runs or waits for a turn (subscriptions
        are then all live); returns the seconds it took."""
        names = ("runlog_gateway_replays_running", "runlog_gateway_replays_waiting")
        t0 = time.monotonic()
        async with asyncio.timeout(timeout_s):
            while any((await self.gauges(*names)).values()):
                await asyncio.sleep(0.1)
        return time.monotonic() - t0


class GatewayGroupProc(GatewayProc):
    """`runlog gateway --processes N`: N gateways sharing one port, ready once
    every process's own /readyz (on its metrics port) says so."""

    def __init__(self, st: Stack, processes: int, **settings: object) -> None:
        if os.environ.get("BENCH_GATEWAY_PRELOAD"):
            raise ValueError("BENCH_GATEWAY_PRELOAD runs one process: use GatewayProc")
        base = consecutive_free_ports(processes)
        super().__init__(st, None, gateway_metrics_port=base, **settings)
        self.processes = processes
        self.metrics_ports = [base + k for k in range(processes)]


async def _gauges(metrics_url: str, names: tuple[str, ...]) -> dict[str, float]:
    async with aiohttp.ClientSession() as http, http.get(metrics_url) as r:
        text = await r.text()
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in names:
            out[name] = float(value)
    return out


async def _answers_200(http: aiohttp.ClientSession, url: str) -> bool:
    with contextlib.suppress(aiohttp.ClientError, OSError):
        async with http.get(url) as r:
            return r.status == 200
    return False


class WorkerProc(_Child):
    """`profiled(path)`: run the worker under cProfile (CPU time), stats
    written to that file when it stops. `metrics_url`: its /metrics, from
    its `ready` line."""

    def __init__(self, st: Stack, concurrency: int, **settings: object) -> None:
        super().__init__("worker")
        self.concurrency = concurrency
        self.profile: Path | None = None
        self.env = child_env(st, **settings)
        self.metrics_url = ""

    def profiled(self, profile: Path | None) -> WorkerProc:
        self.profile = profile
        return self

    async def start(self, timeout_s: float = 60.0) -> WorkerProc:
        args = ["--concurrency", str(self.concurrency)]
        if self.profile:
            argv = ["-c", _PROFILED_WORKER, str(self.profile), *args]
        else:
            argv = ["-m", "runlog.cli", "worker", *args]
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, *argv, cwd=REPO, env=self.env, stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        # "runlog worker <id> ready; metrics <url>" (workers/serve.py)
        while (ready := re.search(rb" ready; metrics (\S+)\n", self.log_path.read_bytes())) is None:
            if self.proc.returncode is not None:
                raise RuntimeError(f"worker exited:\n{self.output()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker not ready in {timeout_s} s:\n{self.output()}")
            await asyncio.sleep(0.05)
        self.metrics_url = ready[1].decode()
        return self

    async def gauges(self, *names: str) -> dict[str, float]:
        """Current values of unlabelled gauges, from its /metrics."""
        return await _gauges(self.metrics_url, names)


class _LineChild(_Child):
    """A child that speaks one JSON object per line on stdin/stdout."""

    async def _spawn(self, *argv: str) -> dict[str, Any]:
        raise_fd_limit()
        with self.log_path.open("wb") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", *argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                limit=_LINE_LIMIT,
            )  # fmt: skip
        return await self.read(60.0)

    async def read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout_s)
        if not line:
            raise RuntimeError(f"{self.name} exited:\n{self.output()}")
        msg: dict[str, Any] = json.loads(line)
        if not msg.get("ok"):
            raise RuntimeError(f"{self.name}: {msg.get('error')}\n{self.output()}")
        return msg

    async def call(self, cmd: str, timeout_s: float = 300.0, **kw: Any) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write((json.dumps({"cmd": cmd, **kw}) + "\n").encode())
        await self.proc.stdin.drain()
        return await self.read(timeout_s)

    async def stop(self, timeout_s: float = 15.0) -> None:
        if self.proc is not None and self.proc.stdin is not None and self.proc.returncode is None:
            with contextlib.suppress(OSError, BrokenPipeError, ConnectionResetError):
                self.proc.stdin.close()
        await super().stop(timeout_s)


class RawServerProc(_LineChild):
    def __init__(self, nats_url: str | None = None) -> None:
        super().__init__("rawws")
        self.nats_url = nats_url
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    async def start(self) -> RawServerProc:
        argv = ["bench._rawws"] + (["--nats-url", self.nats_url] if self.nats_url else [])
        self.port = (await self._spawn(*argv))["port"]
        return self

    async def broadcast(
        self, count: int, rate: float = 0.0, seconds: float = 0.0, timeout_s: float = 300.0
    ) -> dict[str, Any]:
        params = {"count": count, "rate": rate, "seconds": seconds}
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
            http.post(self.url + "/broadcast", params=params) as r,
        ):
            out: dict[str, Any] = await r.json()
            return out


class LoadProc(_LineChild):
    def __init__(self, use_uvloop: bool = True) -> None:
        super().__init__("wsload")
        self.use_uvloop = use_uvloop

    async def start(self) -> LoadProc:
        await self._spawn("bench._wsload", *(["--uvloop"] if self.use_uvloop else []))
        return self

    async def arm(self, target: int, timeout_s: float = 120.0) -> None:
        """Start waiting for every connection to reach `target`; collect with `armed_result`."""
        await self.call("arm", target=target, timeout_s=timeout_s)

    async def armed_result(self, timeout_s: float = 180.0) -> dict[str, Any]:
        return await self.read(timeout_s)


class SseLoadProc(_LineChild):
    """bench/_sseload.py: the SSE reader of `bench compat` (every format, one reader)."""

    def __init__(self, use_uvloop: bool = True) -> None:
        super().__init__("sseload")
        self.use_uvloop = use_uvloop

    async def start(self) -> SseLoadProc:
        await self._spawn("bench._sseload", *(["--uvloop"] if self.use_uvloop else []))
        return self


class NatsWsServer(NatsProcess):
    """The embedded nats-server binary with its own WebSocket listener:
    `websocket { host, port, no_tls: true }` (no compression, everything
    else at its defaults) beside its TCP port, in a temp folder of its own,
    so its CPU and memory are only the peer's."""

    def __init__(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="runlog-bench-natsws-")
        super().__init__(Path(self._tmp.name), port=0)
        self.ws_port = free_port()

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}/"

    def config_text(self) -> str:
        return super().config_text() + (
            f'websocket {{\n  host: "127.0.0.1"\n  port: {self.ws_port}\n  no_tls: true\n}}\n'
        )

    def rss(self) -> int:
        return rss_bytes(self.pid)

    async def start(self) -> None:
        raise_fd_limit()
        await super().start()

    async def connections(self) -> int:
        """Client connections nats-server holds (its /varz)."""
        async with aiohttp.ClientSession() as http, http.get(self.monitor_url + "/varz") as r:
            return int((await r.json())["connections"])

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self._tmp.cleanup()


class SioServerProc(_LineChild):
    """bench/_sioserver.py: python-socketio on aiohttp, every client in one room."""

    def __init__(self) -> None:
        super().__init__("sioserver")
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/socket.io/?EIO=4&transport=websocket"

    async def start(self) -> SioServerProc:
        self.port = (await self._spawn("bench._sioserver"))["port"]
        return self

    async def _http(self, method: str, path: str, timeout_s: float, **params: int) -> Any:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as http,
            http.request(method, self.url + path, params=params) as r,
        ):
            return await r.json()

    async def broadcast(self, count: int, timeout_s: float = 600.0) -> dict[str, Any]:
        out: dict[str, Any] = await self._http("POST", "/broadcast", timeout_s, count=count)
        return out

    async def connections(self) -> int:
        return int((await self._http("GET", "/stats", 30.0))["connections"])
