"""Supervision of child processes: `runlog up`'s workers and gateways, and
the processes of `runlog gateway --processes N` (runlog/group.py).

Contract:

- `start(spec)` spawns a child and watches it. Until `wait_up()` has seen every
  child ready (the stack is up), a child that exits is a failed start: it is
  not restarted and `wait_up` raises `StartFailed` naming it, since what failed
  at the first start will most likely fail the same way again.
- Once running, a child that exits on its own (a crash, a kill -9, an exit
  code) is started again after a backoff (`RestartBackoff`: 0.5 s doubling to
  10 s while it keeps dying soon after its start, back to 0.5 s once it stayed
  up 10 s), and one line says which child, how it ended, after how long, and its
  new pid. A child in a crash loop thus costs one start per 10 s, not a busy CPU.
- `stop()` runs once: no more restarts; every child gets SIGTERM (its drain) at
  the same time, SIGKILL after `stop_timeout_s`; it returns when all are gone,
  with each child's last exit code (0: it drained and exited cleanly).
- Children die with us. Each is spawned with `PR_SET_PDEATHSIG` =
  SIGKILL (`runlog.embedded.die_with_parent`, Linux): if `runlog up` is
  SIGKILLed, the kernel kills its workers and gateways, so none lives on
  holding its port. SIGKILL rather than SIGTERM: a drain needs the NATS and
  PostgreSQL that are going down with us, and nobody would bound it; a crash
  is what the log's guarantees already cover (the next worker takes the runs
  over). Children run in their own session, so a Ctrl-C at the terminal
  reaches `runlog up` alone, which stops them in its own order.
- A child's own port (`OwnPort`) is either given (the child binds it) or, for
  port 0, bound here and inherited by the child (`ChildSpec.pass_fds`), which
  serves on that socket: the port is never free between its choice and the
  child's listen, where another process could take it, and a restarted child
  gets the same socket, so it comes back on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import signal
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from broker.settings import Settings
from broker.sockets import bind_free_port
from runlog.embedded import die_with_parent

log = logging.getLogger("runlog.up")

_POLL_S = 0.1


@dataclass
class RestartBackoff:
    """How long to wait before restarting a child that just exited. Pure."""

    first_s: float = 0.5
    max_s: float = 10.0
    # Up at least this long: it was running fine, so the next crash is a new
    # incident and restarts fast again.
    stable_s: float = 10.0
    _next_s: float = field(default=0.0, init=False)

    def delay_after(self, uptime_s: float) -> float:
        """The delay before the next start of a child that was up `uptime_s`."""
        if self._next_s == 0.0 or uptime_s >= self.stable_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(self.max_s, delay * 2)
        return delay


def install_stop_signals(stop: asyncio.Event) -> None:
    """SIGINT and SIGTERM set `stop` (the worker, `runlog gateway
    --processes` and `runlog up` all stop so)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def describe_exit(returncode: int) -> str:
    """'killed by SIGKILL' or 'exit code 1', from an asyncio returncode."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True)
class ChildSpec:
    """One child: `runlog <args>` with `env`, ready when `ready_url` answers 200."""

    name: str  # "gateway 1", "worker 2"
    args: list[str]
    env: dict[str, str]
    port: str  # for messages: "port 8080", "metrics port 41234"
    ready_url: str
    pass_fds: tuple[int, ...] = ()  # sockets it inherits, open here for every start


@dataclass(frozen=True)
class OwnPort:
    """A child's own port (its /metrics, say): given, or bound here (`sock`)."""

    port: int
    sock: socket.socket | None = None  # inherited by the child, which serves on it

    @classmethod
    def of(cls, port: int, host: str, held: contextlib.ExitStack) -> OwnPort:
        """`port`, which the child binds; for 0 a free port of `host` bound now,
        open until `held` closes (after the child's last exit)."""
        if port:
            return cls(port)
        sock = held.enter_context(bind_free_port(host))
        return cls(sock.getsockname()[1], sock)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self.sock is None else (self.sock.fileno(),)

    def env(self, setting: str) -> dict[str, str]:
        """RUNLOG_<setting>_PORT and _FD for the child ("gateway_metrics":
        gateway_metrics_port and gateway_metrics_fd; -1: it binds the port)."""
        name = "RUNLOG_" + setting.upper()
        fd = -1 if self.sock is None else self.sock.fileno()
        return {name + "_PORT": str(self.port), name + "_FD": str(fd)}


class StartFailed(Exception):
    """A child exited before the stack was up."""


class _State(enum.Enum):
    STARTING = "starting"  # an exit is a failed start
    RUNNING = "running"  # an exit is restarted
    STOPPING = "stopping"  # an exit is expected
    STOPPED = "stopped"


class _Child:
    def __init__(self, spec: ChildSpec) -> None:
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def spawn(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlog.cli", *self.spec.args,
            env=self.spec.env,
            stdin=asyncio.subprocess.DEVNULL,
            pass_fds=self.spec.pass_fds,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGKILL),
        )  # fmt: skip
        self.started_at = asyncio.get_running_loop().time()

    async def terminate(self, timeout_s: float) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            log.warning("%s did not stop in %.0f s; killing it", self.spec.name, timeout_s)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


class Supervisor:
    def __init__(
        self,
        *,
        stop_timeout_s: float = 30.0,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        who: str = "runlog up",
    ) -> None:
        self._stop_timeout_s = stop_timeout_s
        self._say = say
        self._who = who  # how its lines begin
        self._state = _State.STARTING
        self._stopping = asyncio.Event()
        self._children: list[_Child] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._failed: tuple[str, int] | None = None

    async def start(self, spec: ChildSpec) -> int:
        """Spawn `spec` and watch it; its pid."""
        if self._state not in (_State.STARTING, _State.RUNNING):
            raise RuntimeError(f"supervisor is {self._state.value}")
        child = _Child(spec)
        await child.spawn()
        self._children.append(child)
        self._watchers.append(asyncio.create_task(self._watch(child), name=f"watch {spec.name}"))
        return child.pid

    def pid(self, name: str) -> int:
        """The pid of child `name` now (it changes when it is restarted)."""
        return next(c.pid for c in self._children if c.spec.name == name)

    async def wait_up(self, timeout_s: float) -> None:
        """Until every child's ready_url answers 200; from then on a child that
        exits is restarted. StartFailed if one exits first or it takes too long."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        pending = list(self._children)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            while True:
                if self._failed is not None:
                    name, rc = self._failed
                    raise StartFailed(f"{name} exited ({describe_exit(rc)}) while starting")
                if not pending:
                    break
                pending = [c for c in pending if not await _answers_200(http, c.spec.ready_url)]
                if pending and loop.time() > deadline:
                    names = ", ".join(c.spec.name for c in pending)
                    raise StartFailed(f"{names} not ready after {timeout_s:.0f} s")
                if pending:
                    await asyncio.sleep(_POLL_S)
        if self._state is _State.STARTING:
            self._state = _State.RUNNING

    async def stop(self) -> dict[str, int | None]:
        """Stop every child (SIGTERM, then SIGKILL after the bound); runs once.
        Each child's last exit code (None: it never started)."""
        if self._state in (_State.STARTING, _State.RUNNING):
            self._state = _State.STOPPING
            self._stopping.set()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._state = _State.STOPPED
        return {c.spec.name: c.proc.returncode if c.proc else None for c in self._children}

    async def _watch(self, child: _Child) -> None:
        """One owner per child: restarts it, and terminates it on stop()."""
        backoff = RestartBackoff()
        loop = asyncio.get_running_loop()
        while True:
            old_pid = child.pid
            rc = await self._exit_or_stop(child)
            if rc is None:
                await child.terminate(self._stop_timeout_s)
                return
            if self._state is _State.STARTING:
                self._failed = (child.spec.name, rc)
                return
            uptime = up_s = loop.time() - child.started_at
            while True:
                delay = backoff.delay_after(up_s)
                if await _set_within(self._stopping, delay):
                    return
                try:
                    await child.spawn()
                    break
                except OSError as e:  # fork or exec failed: try again, later
                    self._say(f"{self._who}: could not restart {child.spec.name}: {e}")
                    up_s = 0.0
            self._say(
                f"{self._who}: {child.spec.name} (pid {old_pid}, {child.spec.port}) exited"
                f" ({describe_exit(rc)}) after {uptime:.1f} s;"
                f" restarted after {delay:.1f} s as pid {child.pid}"
            )

    async def _exit_or_stop(self, child: _Child) -> int | None:
        """The child's return code when it exits, or None once stop() was called."""
        assert child.proc is not None
        exited = asyncio.ensure_future(child.proc.wait())
        stopping = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait([exited, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            await _cancel(exited, stopping)
        if self._stopping.is_set():
            return None
        return child.proc.returncode


async def _set_within(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether `event` is set within `timeout_s`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
    return event.is_set()


async def _cancel(*futures: asyncio.Future[Any]) -> None:
    for f in futures:
        f.cancel()
    for f in futures:
        with contextlib.suppress(asyncio.CancelledError):
            await f


async def _answers_200(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as RUNLOG_* variables, so child processes see the same ones."""
    out = {}
    for f in dataclasses.fields(settings):
        out["RUNLOG_" + f.name.upper()] = str(getattr(settings, f.name))
    return out
