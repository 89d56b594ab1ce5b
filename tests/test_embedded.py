"""The embedded launcher: real nats-server and real PostgreSQL, crashed and restarted.

These start their own servers (not the session-wide ones) because they kill them.
A first start's initdb is tested by test_postgres_row_survives_kill and the
root one; the other PostgreSQL tests start on a copy of the session's
initialised folder (tests/pgseed.py), as any later start finds its folder.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import asyncpg
import nats
import psutil
import pytest
import pytest_asyncio
from nats.js.api import StorageType

from broker.sockets import free_port, port_is_free
from runlog.embedded import ClusterSpec, NatsProcess, PostgresProcess

from . import pgseed

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], timeout_s: float = 15.0) -> T:
    """`probe()`'s first result that does not raise, retrying until `timeout_s`:
    clients need a moment to notice a restarted server."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                return await probe()
            except Exception:
                await asyncio.sleep(0.1)


@pytest.fixture
def data_root() -> Iterator[Path]:
    """A scratch folder outside pytest's tmp root. Every pytest session, a
    concurrent one included, resets that root to 0700 and prunes older runs,
    which would cut the unprivileged postgres user off from its files mid-test."""
    path = Path(tempfile.mkdtemp(prefix="runlog-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest_asyncio.fixture
async def pg_seed(tmp_root: Path) -> Path:
    return await pgseed.seed(tmp_root)


# Tiny synchronous file checks, kept out of the async tests' bodies.
def read_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def exists(path: Path) -> bool:
    return path.exists()


async def test_nats_message_survives_kill_and_client_reconnects(data_root: Path) -> None:
    async with NatsProcess(data_root / "nats") as server:
        assert server.url == f"nats://127.0.0.1:{server.port}"
        nc = await nats.connect(
            server.url, max_reconnect_attempts=-1, reconnect_time_wait=0.1, connect_timeout=2
        )
        try:
            js = nc.jetstream()
            await js.add_stream(name="T", subjects=["t.>"], storage=StorageType.FILE)
            ack = await js.publish("t.1", b"before")  # acknowledged = in the page cache
            sub = await js.pull_subscribe("t.>", durable="reader")
            [msg] = await sub.fetch(1, timeout=5)
            assert msg.data == b"before"
            await msg.ack()

            old_pid, port = server.pid, server.port
            server.kill()
            await server.wait_stopped()
            await server.restart()
            assert server.pid != old_pid and server.port == port

            # The same client reconnects to the same address by itself.
            stored = await eventually(lambda: js.get_msg("T", ack.seq))
            assert stored.data == b"before"
            ack2 = await eventually(lambda: js.publish("t.2", b"after"))
            assert ack2.seq == ack.seq + 1
            # The durable consumer survived too. Its ack of "before" may not have
            # reached disk before the kill (consumer state is flushed lazily), so
            # "before" may come again: at-least-once, as JetStream promises.
            seen: list[bytes] = []
            while b"after" not in seen:
                for m in await sub.fetch(1, timeout=5):
                    seen.append(m.data)
                    await m.ack()
            assert seen in ([b"after"], [b"before", b"after"])
        finally:
            await nc.close()
    assert not server.running


async def test_postgres_row_survives_kill(data_root: Path) -> None:
    async with PostgresProcess(data_root / "pg", fast_init=True) as pg:
        assert pg.url == f"postgresql://postgres@127.0.0.1:{pg.port}/runlog"
        pool = await asyncpg.create_pool(pg.url, min_size=1, max_size=2)
        try:
            await pool.execute("create table t (id int primary key, v text not null)")
            await pool.execute("insert into t values (1, 'before')")

            old_pid, port = pg.pid, pg.port
            pg.kill()
            await pg.wait_stopped()
            assert not exists(Path(pg.data_dir) / "postmaster.pid")
            await pg.restart()
            assert pg.pid != old_pid and pg.port == port

            # The pool drops its dead connections and opens new ones.
            value = await eventually(lambda: pool.fetchval("select v from t where id = 1"))
            assert value == "before"
        finally:
            await pool.close()

        # A graceful restart keeps the data too, and `runlog` is not recreated.
        await pg.restart()
        conn = await asyncpg.connect(pg.url)
        try:
            assert await conn.fetchval("select count(*) from t") == 1
        finally:
            await conn.close()


async def test_postgres_restart_without_wait(data_root: Path, pg_seed: Path) -> None:
    """restart() straight after kill() waits for the old instance itself."""
    pgseed.copy_to(pg_seed, data_root / "pg")
    async with PostgresProcess(data_root / "pg", fast_init=True) as pg:
        pg.kill()
        await pg.restart()
        conn = await asyncpg.connect(pg.url)
        try:
            assert await conn.fetchval("select 1") == 1
        finally:
            await conn.close()


async def test_postgres_long_data_dir_uses_short_socket_dir(data_root: Path, pg_seed: Path) -> None:
    deep = data_root / ("x" * 60) / ("y" * 60)
    pgseed.copy_to(pg_seed, deep)
    async with PostgresProcess(deep, fast_init=True) as pg:
        # Line 5 of postmaster.pid is the socket folder the server really uses.
        socket_dir = Path(read_lines(Path(pg.data_dir) / "postmaster.pid")[4])
        assert socket_dir.parent == Path("/tmp") and socket_dir.name.startswith("runlog-pg-")
        assert exists(socket_dir / f".s.PGSQL.{pg.port}")
    assert not exists(socket_dir), "stop() removes the socket folder"


def test_nats_config_options() -> None:
    server = NatsProcess(Path("/data/nats"), port=4999, sync_always=True)
    server._http_port = 8999  # config_text() needs the ports start() would pick
    text = server.config_text()
    assert 'listen: "127.0.0.1:4999"' in text
    assert 'http: "127.0.0.1:8999"' in text
    assert 'store_dir: "/data/nats/js"' in text
    assert "sync_interval: always" in text
    assert "cluster" not in text
    assert "sync_interval" not in NatsProcess(Path("/data/nats"), port=4999).config_text()


async def test_nats_three_node_cluster_replicates(data_root: Path) -> None:
    route_ports = [free_port() for _ in range(3)]
    servers = [
        NatsProcess(
            data_root / f"n{i}",
            cluster=ClusterSpec("c", port, [p for p in route_ports if p != port]),
        )
        for i, port in enumerate(route_ports)
    ]
    await asyncio.gather(*(s.start() for s in servers))
    try:
        nc = await nats.connect([s.url for s in servers], max_reconnect_attempts=-1)
        try:
            js = nc.jetstream()
            # The meta leader is elected after all nodes are up, not during start().
            await eventually(lambda: js.add_stream(name="R", subjects=["r.>"], num_replicas=3))
            # ... and so is the stream's own leader, just after creation.
            ack = await eventually(lambda: js.publish("r.1", b"x"))
            info = await js.stream_info("R")
            assert info.cluster is not None
            assert len(info.cluster.replicas or []) == 2
            assert (await js.get_msg("R", ack.seq)).data == b"x"
        finally:
            await nc.close()
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root runs postgres as another user")
async def test_postgres_as_root_runs_as_system_user(data_root: Path) -> None:
    import pwd

    async with PostgresProcess(data_root / "pg", fast_init=True) as pg:
        owner = pwd.getpwuid((Path(pg.data_dir) / "PG_VERSION").stat().st_uid).pw_name
        assert owner == "runlog-pg"
        status = read_lines(Path(f"/proc/{pg.pid}/status"))
        uid_line = next(line for line in status if line.startswith("Uid:"))
        assert int(uid_line.split()[1]) == pwd.getpwnam("runlog-pg").pw_uid


def _gone(p: psutil.Process) -> bool:
    """Exited; a zombie has let go of everything, so it counts as gone."""
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# A parent that starts one server, says its pid and port, and waits to be killed.
_PARENT = """
import asyncio, sys
from pathlib import Path
from runlog.embedded import NatsProcess, PostgresProcess

async def main():
    kind = {"nats": NatsProcess, "postgres": PostgresProcess}[sys.argv[1]]
    server = kind(Path(sys.argv[2]))
    await server.start()
    print(server.pid, server.port, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["nats", "postgres"])
async def test_a_server_stops_when_its_parent_is_sigkilled(
    kind: str, data_root: Path, tmp_root: Path
) -> None:
    if kind == "postgres":
        pgseed.copy_to(await pgseed.seed(tmp_root), data_root / kind)
    parent = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PARENT, kind, str(data_root / kind),
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        pid_s, port_s = (await asyncio.wait_for(parent.stdout.readline(), 60)).split()
        server = psutil.Process(int(pid_s))
        parent.kill()
        await parent.wait()
        # The kernel tells the server; it shuts down by itself (PostgreSQL: a
        # fast shutdown, so its data folder is clean) and lets go of its port.
        async with asyncio.timeout(15):
            while not _gone(server):
                await asyncio.sleep(0.05)
        assert port_is_free(int(port_s))
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
    if kind == "postgres":
        log = (data_root / kind / "postgres.log").read_text()
        assert "received fast shutdown request" in log
        assert "database system is shut down" in log
