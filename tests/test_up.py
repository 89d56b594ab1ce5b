"""`runlog up` as a real process: it supervises its children, takes them down
with it, names a busy port, and prints every child's pid and port.

One `runlog up --gateways 2` serves the tests of this module (a stack takes
seconds to start); the test that SIGKILLs it starts it again on the same data
folder and ports, so every test finds it running whatever the order. It starts
from an empty data folder (initdb, migrations: the first start a user makes);
the stacks of their own that other tests start get a copy of the session's
initialised and migrated PostgreSQL folder instead (tests/pgseed.py), as a
second `runlog up` on a folder finds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import parse_qs

import aiohttp
import psutil
import pytest
import pytest_asyncio
from ag_ui.core import (
    RunFinishedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
)

from broker.settings import Settings
from broker.sockets import LOOPBACK, free_port, port_is_free
from gateway import auth
from runlog import up as up_command
from runlog.client import Client
from runlog.supervisor import RestartBackoff, describe_exit

from . import pgseed
from .aguiserver import Exchange, serving
from .helpers import FIXTURE_TASK_PREFIX
from .procs import RunlogProcess

# Fast enough to keep the tests short, slow enough that the `long` run
# (2,000 tokens) streams for several seconds: a gateway dies mid-stream.
TOKENS_PER_S = 250
UP_READY_S = 120.0  # a first start: initdb, migrations, children


def _consecutive_free_ports(n: int) -> int:
    """A port p with p .. p+n-1 free right now (gateways take consecutive ports)."""
    while True:
        base = free_port()
        if base + n <= 65535 and all(port_is_free(base + i) for i in range(1, n)):
            return base


def _listener_pid(port: int) -> int | None:
    """The pid of the process listening on 127.0.0.1:`port`, if any."""
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
            return c.pid
    return None


def _listens_on(pid: int, port: int) -> bool:
    """Whether process `pid` holds a socket listening on `port`, bound or inherited
    (`_listener_pid` names one holder of a socket that several hold)."""
    return any(
        c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
        for c in psutil.Process(pid).net_connections(kind="tcp")
    )


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running; a zombie has let go of everything, so it counts as gone."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


async def _wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `procs` still alive after waiting up to `timeout_s` for all to go."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (alive := _alive(procs)) and loop.time() < deadline:
        await asyncio.sleep(0.1)
    return alive


def _clean_env(**env: str) -> dict[str, str]:
    # Without RUNLOG_* from outside (an external NATS/PostgreSQL for the suite,
    # say) `runlog up` runs its embedded servers, which is what is tested here.
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    return {**base, "PYTHONUNBUFFERED": "1", **env}


class Up:
    """`python -m runlog.cli up --gateways N` on a data folder and ports of its own."""

    def __init__(
        self,
        data_dir: Path,
        gateways: int = 2,
        *,
        args: tuple[str, ...] = (),
        cwd: Path | None = None,
        seed: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.seed = seed  # a PostgreSQL folder to start from, not initdb (tests/pgseed.py)
        self.gateways = gateways
        self.args = args
        self.cwd = cwd
        self.gateway_port = _consecutive_free_ports(gateways)
        self.env = _clean_env(
            RUNLOG_DATA_DIR=str(data_dir),
            RUNLOG_GATEWAY_PORT=str(self.gateway_port),
            RUNLOG_EMBEDDED_NATS_PORT=str(free_port()),
            RUNLOG_EMBEDDED_POSTGRES_PORT=str(free_port()),
            RUNLOG_SCRIPTED_TOKENS_PER_S=str(TOKENS_PER_S),
        )
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []  # stdout of `runlog up` and its children
        self.errors: list[str] = []  # their stderr
        self._changed = asyncio.Event()
        self._readers: list[asyncio.Task[None]] = []
        self._seen: list[psutil.Process] = []  # every descendant ever seen, for cleanup

    def url(self, k: int) -> str:
        """Gateway k (1-based)."""
        return f"http://{LOOPBACK}:{self.gateway_port + k - 1}"

    @property
    def urls(self) -> list[str]:
        return [self.url(k) for k in range(1, self.gateways + 1)]

    async def start(self) -> None:
        pg_dir = self.data_dir / "postgres"  # where `runlog up` keeps it
        if self.seed is not None and not pg_dir.exists():
            pgseed.copy_to(self.seed, pg_dir)
        self.lines.clear()
        self.errors.clear()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlog.cli", "up", "--gateways", str(self.gateways), *self.args,
            env=self.env, cwd=self.cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stderr is not None
        # They live as long as this stack, which a module-scoped fixture holds.
        self._readers = [
            asyncio.create_task(self._read(out, into), name=f"{FIXTURE_TASK_PREFIX}up-reader")
            for out, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.errors))
        ]
        await self.wait_line(r"^runlog is up$", UP_READY_S)
        self.remember_descendants()

    async def _read(self, stream: asyncio.StreamReader, into: list[str]) -> None:
        # The children share these pipes: EOF only once the last of them is gone.
        async for raw in stream:
            into.append(raw.decode(errors="replace").rstrip("\n"))
            self._changed.set()

    async def wait_line(self, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
        """The first stdout line matching `pattern` (already printed or to come)."""
        rx = re.compile(pattern)
        async with asyncio.timeout(timeout_s):
            while True:
                self._changed.clear()
                for line in self.lines:
                    if m := rx.search(line):
                        return m
                assert self.proc is not None
                if self.proc.returncode is not None:
                    raise AssertionError(f"runlog up exited {self.proc.returncode}: {self.tail()}")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):  # also notice the exit above
                        await self._changed.wait()

    def pid_now(self, name: str, printed: int) -> int:
        """The pid of child `name`: `printed` at start, or the last restart's."""
        rx = re.compile(rf"^runlog up: {name} \(.*as pid (\d+)$")
        restarts = [int(m.group(1)) for line in self.lines if (m := rx.search(line))]
        return restarts[-1] if restarts else printed

    @property
    def secret_path(self) -> Path:
        return self.data_dir / "jwt_secret"

    def token(self, user: str) -> str:
        """A token this stack accepts: signed with its data folder's secret."""
        secret = self.secret_path.read_text().strip()
        return auth.mint(dataclasses.replace(Settings.from_env({}), jwt_secret=secret), user)

    async def console_token(self) -> str:
        """The token of the console link `runlog up` printed last."""
        m = await self.wait_line(r"^  console: +http://\S+/#token=([^&\s]+)")
        return m.group(1)

    def tail(self) -> str:
        return "\n".join(["-- stdout", *self.lines[-40:], "-- stderr", *self.errors[-40:]])

    def descendants(self) -> list[psutil.Process]:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).children(recursive=True)

    def remember_descendants(self) -> None:
        known = {p.pid for p in self._seen}
        self._seen += [p for p in self.descendants() if p.pid not in known]

    async def kill_up(self) -> None:
        """SIGKILL `runlog up` itself, nothing else."""
        assert self.proc is not None
        self.proc.kill()
        await self.wait_exit(15.0)

    async def wait_exit(self, timeout_s: float) -> int:
        # Not proc.wait(): on Python 3.11 it also waits for EOF on the pipes,
        # which the children hold as long as they live.
        assert self.proc is not None
        async with asyncio.timeout(timeout_s):
            while self.proc.returncode is None:
                await asyncio.sleep(0.05)
        return self.proc.returncode

    async def close_readers(self) -> None:
        for t in self._readers:
            t.cancel()
        for t in self._readers:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._readers = []

    async def stop(self) -> None:
        """Ctrl-C's path (SIGTERM), then make sure nothing it started is left."""
        if self.proc is not None and self.proc.returncode is None:
            self.remember_descendants()
            self.proc.send_signal(signal.SIGTERM)
            try:
                await self.wait_exit(60.0)
            except TimeoutError:
                self.proc.kill()
                await self.wait_exit(15.0)
        for p in _alive(self._seen):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        await _wait_gone(self._seen, 15.0)
        await self.close_readers()


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    # Outside pytest's tmp root, which concurrent sessions reset to 0700 (see
    # tests/test_embedded.py): PostgreSQL runs as another user when we are root.
    path = Path(tempfile.mkdtemp(prefix="runlog-up-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pg_seed(tmp_root: Path) -> Path:
    return await pgseed.seed(tmp_root)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def up(data_dir: Path) -> AsyncIterator[Up]:
    stack = Up(data_dir / "stack")
    try:
        await stack.start()
        yield stack
    finally:
        print(stack.tail())  # shown with a failure
        await stack.stop()


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/readyz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


async def _all_events(c: Client, run_id: str) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    after = 0
    while True:
        page = await c.page(run_id, after=after)
        out += page["events"]
        after = page["next_after"]
        if page["ended"] or not page["events"]:
            return out


@pytest.mark.timeout(300)
async def test_kill_9_one_gateway_the_client_resumes_and_the_gateway_comes_back(up: Up) -> None:
    g1_port = up.gateway_port
    old_pid = _listener_pid(g1_port)
    assert old_pid is not None
    async with (
        Client(up.urls, up.token("alice"), max_reconnects=10) as c,
        aiohttp.ClientSession() as http,
    ):
        sid = await c.create_session("failover")
        run_id = await c.start_run(sid, "long")
        got = []
        async with asyncio.timeout(120):
            async for item in c.follow(run_id=run_id):
                got.append(item)
                if len(got) == 100:
                    assert c.base_url == up.url(1)  # following through gateway 1
                    os.kill(old_pid, signal.SIGKILL)
        assert c.reconnects == 1 and c.base_url == up.url(2)  # straight to the other
        # Every event exactly once, in order, the run completed (not failed by a
        # worker stopped along with everything else).
        assert [i.cursor for i in got] == list(range(1, len(got) + 1))
        assert [i.event for i in got] == await _all_events(c, run_id)
        assert got[-1].event["type"] == "run_end" and got[-1].event["status"] == "completed"

        # The killed gateway is back on its port, and `runlog up` said so.
        m = await up.wait_line(
            rf"^runlog up: gateway 1 \(pid {old_pid}, port {g1_port}\) exited"
            r" \(killed by SIGKILL\) after [\d.]+ s; restarted after 0\.5 s as pid (\d+)$"
        )
        new_pid = int(m.group(1))
        assert new_pid != old_pid
        async with asyncio.timeout(60):
            while not await _ready(http, up.url(1)):
                await asyncio.sleep(0.1)
        assert _listener_pid(g1_port) == new_pid
    up.remember_descendants()


async def test_prints_every_childs_pid_and_port_and_workers_serve_metrics(up: Up) -> None:
    for k in (1, 2):
        m = await up.wait_line(rf"^  gateway {k}: +http://127\.0\.0\.1:(\d+) +pid (\d+) ")
        assert int(m.group(1)) == up.gateway_port + k - 1
        assert _listener_pid(int(m.group(1))) == up.pid_now(f"gateway {k}", int(m.group(2)))
    m = await up.wait_line(r"^  worker 1: +pid (\d+) +metrics (http://127\.0\.0\.1:(\d+)/metrics)$")
    worker_pid, metrics_url, metrics_port = int(m.group(1)), m.group(2), int(m.group(3))
    # `runlog up` bound it for the worker, which inherited it: both hold it.
    assert _listens_on(up.pid_now("worker 1", worker_pid), metrics_port)
    async with aiohttp.ClientSession() as http, http.get(metrics_url) as r:
        assert r.status == 200
        assert "runlog_worker_" in await r.text()
    for server in ("NATS", "PostgreSQL"):
        m = await up.wait_line(rf"^  {server}: +\S+://\S+:(\d+)\S* +pid (\d+)$")
        assert _listener_pid(int(m.group(1))) == int(m.group(2))


@pytest.mark.timeout(300)
async def test_every_gateway_lists_the_gateways_of_the_console_link(up: Up) -> None:
    m = await up.wait_line(r"^  console: +(http://\S+)/#(\S+)$")
    assert m.group(1) == up.url(1)
    assert parse_qs(m.group(2))["gateways"] == [",".join(up.urls)]
    async with aiohttp.ClientSession() as http:
        for url in up.urls:
            async with http.get(url + "/v1/config") as r:
                assert r.status == 200, await r.text()
                assert await r.json() == {"gateways": up.urls}


async def test_sigkill_of_up_takes_every_child_down_and_the_next_start_works(up: Up) -> None:
    async with Client(up.urls, up.token("alice")) as c:
        sid = await c.create_session("survives")
    up.remember_descendants()
    children = up.descendants()
    names = {p.name() for p in children}
    assert {"nats-server", "postgres"} <= names
    assert len([p for p in children if "runlog.cli" in " ".join(p.cmdline())]) == 3

    await up.kill_up()
    alive = await _wait_gone(children, 15.0)
    assert alive == [], [(p.pid, p.name()) for p in alive]
    await up.close_readers()

    # Same data folder, same ports: PostgreSQL shut down cleanly enough to
    # start again, and what it held is still there.
    await up.start()
    async with Client(up.urls, up.token("alice")) as c:
        assert (await c.get_session(sid))["session_id"] == sid


async def _up_fails(env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "up", "--gateways", "2",
        env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        _, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, err.decode()


@pytest.mark.parametrize(
    ("busy", "what", "setting"),
    [
        ("gateway_port+1", "gateway 2", "gateway_port"),
        ("embedded_nats_port", "embedded NATS", "embedded_nats_port"),
        ("embedded_postgres_port", "embedded PostgreSQL", "embedded_postgres_port"),
        ("worker_metrics_port", "worker 1 metrics", "worker_metrics_port"),
    ],
)
async def test_a_busy_port_is_one_clear_line_and_exit_2(
    busy: str, what: str, setting: str, tmp_path: Path
) -> None:
    ports = {
        "gateway_port": _consecutive_free_ports(2),
        "embedded_nats_port": free_port(),
        "embedded_postgres_port": free_port(),
        "worker_metrics_port": free_port(),
    }
    name, _, plus = busy.partition("+")
    port = ports[name] + int(plus or 0)
    env = _clean_env(
        RUNLOG_DATA_DIR=str(tmp_path / "data"),
        **{"RUNLOG_" + k.upper(): str(v) for k, v in ports.items()},
    )
    with socket.create_server((LOOPBACK, port)):
        code, err = await _up_fails(env)
    flag = "--" + setting.replace("_", "-")
    line = (
        f"runlog: error [port_in_use]: port {port} is in use ({what}); "
        f"stop what uses it or set RUNLOG_{setting.upper()} / {flag}"
    )
    assert (code, err.strip()) == (2, line)
    assert not (tmp_path / "data").exists(), "nothing was started"


@pytest.mark.parametrize(
    ("kind", "setting"), [("gateway", "gateway_port"), ("worker", "worker_metrics_port")]
)
async def test_a_busy_port_of_a_lone_gateway_or_worker_is_one_line_and_exit_2(
    kind: str, setting: str, settings: Settings, tmp_path: Path
) -> None:
    p = RunlogProcess(kind, settings, tmp_path)
    p.env["RUNLOG_" + setting.upper()] = str(p.port)
    with socket.create_server((LOOPBACK, p.port)):
        await p.start()
        code = await p.wait(60)
    what = "gateway" if kind == "gateway" else "worker metrics"
    flag = "--" + setting.replace("_", "-")
    line = (
        f"runlog: error [port_in_use]: port {p.port} is in use ({what}); "
        f"stop what uses it or set RUNLOG_{setting.upper()} / {flag}"
    )
    log = p.log_tail()
    assert code == 2 and line in log.splitlines(), log
    assert "Traceback" not in log


def test_restart_backoff_doubles_to_its_cap_and_resets_after_a_stable_run() -> None:
    b = RestartBackoff()
    assert [b.delay_after(0.2) for _ in range(7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert b.delay_after(9.9) == 10.0  # still crashing soon after its start
    assert b.delay_after(10.0) == 0.5  # it had been running fine: a new incident
    assert b.delay_after(0.1) == 1.0


class _PipeEnd(io.BufferedIOBase):
    """The writing end of a pipe that records each write(2) made to it."""

    name = "<pipe>"

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes, /) -> int:  # type: ignore[override]
        self.writes.append(bytes(b))
        return len(b)


def test_each_line_runlog_up_prints_is_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """`runlog up` and its children share one stdout pipe. Unbuffered (as
    PYTHONUNBUFFERED=1 runs it here), print() writes a line and its newline
    in two write(2)s, and a child's line written between them glued to ours:
    "runlog up: gateway 1 (...) restarted ... as pid 7<the gateway's log line>",
    which `Up.wait_line`'s `...$` never matched (the flake). One write(2) of
    a whole line is atomic on a pipe (up to PIPE_BUF bytes)."""
    pipe = _PipeEnd()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(pipe, write_through=True))
    up_command._say("runlog is up")
    up_command._say(up_command._row("console", "http://127.0.0.1:1/#token=t"))
    assert pipe.writes == [b"runlog is up\n", b"  console:     http://127.0.0.1:1/#token=t\n"]


def test_exit_descriptions() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(0) == "exit code 0"
    assert describe_exit(2) == "exit code 2"


async def _status(http: aiohttp.ClientSession, url: str, token: str) -> int:
    async with http.get(url + "/v1/sessions", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status


async def _runlog_token(data_dir: Path, user: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "token", "--user", user, "--data-dir", str(data_dir),
        env=_clean_env(), stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    return out.decode().strip()


async def test_up_signs_with_a_random_secret_kept_in_its_data_folder(up: Up) -> None:
    path = up.secret_path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) >= 43 and secret != Settings().jwt_secret  # token_urlsafe(32)
    public = auth.mint(Settings(), "alice")  # the documented default secret
    console = await up.console_token()
    minted = await _runlog_token(up.data_dir, "alice")
    async with aiohttp.ClientSession() as http:
        for url in up.urls:
            assert await _status(http, url, public) == 401
            assert await _status(http, url, console) == 200
            assert await _status(http, url, minted) == 200


@pytest.mark.timeout(300)
async def _runlog(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", *args,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_commands_that_need_the_stack_find_it_by_runlog_ups_data_folder(up: Up) -> None:
    """No URL given, only the data folder (as `runlog token` takes it): revoke
    reaches its PostgreSQL and NATS, tail its first gateway."""
    env = _clean_env(RUNLOG_DATA_DIR=str(up.data_dir))
    code, out, err = await _runlog(env, "revoke", "--user", "nobody-here")
    assert code == 0, err
    assert out.startswith("revoked: tokens of user 'nobody-here'"), out
    assert err == ""  # the gateways were told at once, over its NATS
    code, _, err = await _runlog(env, "tail", "r_unknown", "--user", "alice")
    assert code == 2
    assert err.splitlines()[-1].startswith("runlog: error [not_a_member]"), err


async def test_a_worker_beside_up_finds_the_stack_by_its_data_folder(up: Up) -> None:
    """`runlog worker` (more workers, or one with another agent) needs the stack
    too: it had 'RUNLOG_NATS_URL and RUNLOG_DATABASE_URL must be set'."""
    env = _clean_env(RUNLOG_DATA_DIR=str(up.data_dir), RUNLOG_WORKER_METRICS_PORT="0")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "worker",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.startswith(b"runlog worker ") and b" ready" in line, line
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err


async def test_a_second_up_on_the_same_folder_reuses_its_secret(up: Up) -> None:
    secret = up.secret_path.read_text()
    old_console = await up.console_token()
    await up.stop()
    await up.start()
    assert up.secret_path.read_text() == secret
    async with aiohttp.ClientSession() as http:
        assert await _status(http, up.url(1), old_console) == 200  # survives the restart
        assert await _status(http, up.url(2), await up.console_token()) == 200


_DOCS = Path(__file__).resolve().parent.parent / "docs" / "agents.md"


@pytest.mark.timeout(300)
async def test_runlog_up_runs_the_agent_of_the_docs_quickstart(
    data_dir: Path, pg_seed: Path
) -> None:
    """docs/agents.md's first example, saved as myagent.py in a folder of its
    own and started from there with `runlog up --agent myagent:agent`."""
    example = re.search(r"```python\n(# myagent\.py\n.*?)```", _DOCS.read_text(), re.S)
    assert example is not None
    app = data_dir / "app"
    app.mkdir()
    (app / "myagent.py").write_text(example.group(1))
    stack = Up(
        data_dir / "agent-stack",
        gateways=1,
        args=("--agent", "myagent:agent"),
        cwd=app,
        seed=pg_seed,
    )
    try:
        await stack.start()
        got: list[dict[str, object]] = []
        async with Client(stack.urls, stack.token("alice")) as c:
            sid = await c.create_session("bring your own agent")
            run_id = await c.start_run(sid, "old invoices")
            async with asyncio.timeout(120):
                async for item in c.follow(run_id=run_id):
                    got.append(item.event)
                    if item.event["type"] == "approval_required":
                        await c.decide(run_id, str(item.event["approval_id"]), "approve", "fine")
    finally:
        print(stack.tail())
        await stack.stop()
    assert [e["type"] for e in got] == [
        "run_start", "text_delta", "tool_call_start", "tool_args_delta", "tool_call_end",
        "approval_required", "approval_decided", "tool_result", "text_delta", "run_end",
    ]  # fmt: skip
    assert "".join(str(e["delta"]) for e in got if e["type"] == "text_delta") == (
        "Looking up 'old invoices'. Done."
    )
    assert [(e["status"], e["summary"]) for e in got if e["type"] == "tool_result"] == [
        ("ok", "deleted 3 rows")
    ]
    assert got[-1]["status"] == "completed"
    assert got[-1]["usage"] == {"input_tokens": 120, "output_tokens": 30, "reasoning_tokens": 0}


async def _agui_hello(ex: Exchange) -> None:
    await ex.started()
    await ex.send(
        TextMessageStartEvent(message_id="a1", role="assistant"),
        TextMessageContentEvent(message_id="a1", delta="Hello from upstream"),
        TextMessageEndEvent(message_id="a1"),
        RunFinishedEvent(thread_id=ex.input.thread_id, run_id=ex.input.run_id),
    )


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("agent", "input", "text"),
    [
        (
            "tests.agents.lg_agent:agent",
            '{"say": "Hello brave new world"}',
            "Hello brave new world",
        ),
        ("tests.agents.oa_agent:agent", '{"words": ["Hel", "lo"]}', "Hello"),
        ("tests.agents.pa_agent:agent", '{"do": "lookup"}', "lookup: sunny in Paris"),
        ("tests.agents.agui_agent:agent", "hi", "Hello from upstream"),
    ],
    ids=["langgraph", "openai-agents", "pydantic-ai", "agui"],
)
async def test_runlog_up_runs_each_frameworks_agent(
    data_dir: Path, pg_seed: Path, agent: str, input: str, text: str
) -> None:
    """`runlog up --agent` with each adapter's test agent (the AG-UI one in
    front of an upstream in this process): a run streams and completes."""
    async with serving(_agui_hello) as upstream:
        folder = data_dir / f"up-{agent.split('.')[2]}"
        stack = Up(folder, gateways=1, args=("--agent", agent), seed=pg_seed)
        stack.env["RUNLOG_AGUI_URL"] = upstream.url
        try:
            await stack.start()
            async with Client(stack.urls, stack.token("alice")) as c:
                sid = await c.create_session("framework")
                run_id = await c.start_run(sid, input)
                async with asyncio.timeout(120):
                    got = [item.event async for item in c.follow(run_id=run_id)]
        finally:
            print(stack.tail())
            await stack.stop()
    assert "".join(str(e["delta"]) for e in got if e["type"] == "text_delta") == text
    assert got[0]["type"] == "run_start"
    assert got[-1]["type"] == "run_end" and got[-1]["status"] == "completed"
