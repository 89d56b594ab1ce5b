"""Gateways as real processes: kill -9 one and resume on another; drain on SIGTERM.

Then a group: `runlog gateway --processes 2`, two processes on one port
(runlog/group.py). Which process serves a connection is the kernel's pick;
each process's own metrics port (gateway_metrics_port) tells how many it holds.

No port here is picked free by the test and bound later by the gateway
(another process may take it in between): the gateways get port 0, bind a
free port themselves and print it; a group's parent does so for its
processes' metrics ports, and keeps them while a process is restarted.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import port_is_free
from gateway import auth
from runlog.client import Client, Received

from .gw import WsClient, append_text, eventually
from .procs import RunlogProcess


@pytest_asyncio.fixture(loop_scope="session")
async def two_gateways(settings: Settings, tmp_root: Path) -> AsyncIterator[list[RunlogProcess]]:
    gws = [RunlogProcess("gateway", settings, tmp_root, RUNLOG_GATEWAY_PORT="0") for _ in range(2)]
    try:
        for g in gws:
            await g.start()
        for g in gws:
            await g.wait_ready()
        yield gws
    finally:
        for g in gws:
            await g.stop()


async def _connect(http: aiohttp.ClientSession, url: str, token: str) -> WsClient:
    ws = await http.ws_connect(url.replace("http", "ws") + "/v1/ws",
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    c = WsClient(ws)
    assert (await c.next_reply())["type"] == "hello"
    return c


async def test_a_gateway_on_port_0_serves_the_port_it_printed_and_counts_it_its_own_origin(
    two_gateways: list[RunlogProcess], settings: Settings
) -> None:
    a, _ = two_gateways
    assert a.port != 0
    assert f"gateway listening on http://127.0.0.1:{a.port}" in a.log_text()
    token = auth.mint(settings, "alice")
    async with aiohttp.ClientSession() as http:
        # The WebSocket Origin check allows the gateway's own origin: its real port.
        async with http.ws_connect(a.url.replace("http", "ws") + "/v1/ws", origin=a.url,
                                   headers={"Authorization": f"Bearer {token}"}) as ws:  # fmt: skip
            assert (await WsClient(ws).next_reply())["type"] == "hello"


async def test_kill_9_gateway_clients_resume_on_the_other(
    two_gateways: list[RunlogProcess], settings: Settings, broker: Broker
) -> None:
    a, b = two_gateways
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    topic = f"run:{run_id}"
    writer = asyncio.create_task(append_text(w, 3000, pause_every=50, pause_s=0.005))
    async with aiohttp.ClientSession() as http:
        clients = [await _connect(http, a.url, token) for _ in range(5)]
        for c in clients:
            await c.send(type="subscribe", run_id=run_id, after=0)
            await c.next_reply()
        await asyncio.gather(*(c.collect(topic, count=200, until_type="-") for c in clients))
        a.kill()  # no goodbye: the clients just see the connection drop
        await a.wait()
        resumed = []
        for c in clients:
            got = c.events.get(topic, [])
            cursor = got[-1][0] if got else 0
            c2 = await _connect(http, b.url, token)
            await c2.send(type="subscribe", run_id=run_id, after=cursor)
            await c2.next_reply()
            resumed.append((got, c2))
        await writer
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        for got, c2 in resumed:
            rest = await c2.collect(topic)
            seqs = [s for s, _ in got + rest]
            assert seqs == list(range(1, 3002))
            await c2.ws.close()
        for c in clients:
            await c.ws.close()


async def test_sigterm_drains_with_code_and_cursor(
    two_gateways: list[RunlogProcess], settings: Settings, broker: Broker
) -> None:
    _, b = two_gateways
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    await append_text(w, 100)
    await w.flush()
    async with aiohttp.ClientSession() as http:
        c = await _connect(http, b.url, token)
        await c.send(type="subscribe", run_id=run_id, after=0)
        await c.next_reply()
        await c.collect(f"run:{run_id}", count=100, until_type="-")
        t0 = time.monotonic()
        b.signal(signal.SIGTERM)
        await c.collect(f"run:{run_id}", count=10**9, until_type="-", timeout_s=20)
        assert c.disconnect is not None
        assert c.disconnect["code"] == "server_draining" and c.disconnect["reconnect"] == "resume"
        assert c.disconnect["cursors"] == {f"run:{run_id}": 100}
        assert c.closed_with is not None and c.closed_with.data == 4000
        assert await b.wait(20) == 0
        assert time.monotonic() - t0 < settings.gateway_drain_s + 5
    await w.append(events.RunEnd(status="completed"))
    await w.flush()


# --- a group of processes on one port -----------------------------------------------


class Group:
    """`runlog gateway --processes N` and what it printed about its processes."""

    def __init__(self, settings: Settings, log_dir: Path, processes: int) -> None:
        self.processes = processes
        # Ports 0: the group binds free ones itself and prints them.
        self.proc = RunlogProcess("gateway", settings, log_dir, RUNLOG_GATEWAY_PORT="0",
                                  RUNLOG_GATEWAY_METRICS_PORT="0")  # fmt: skip
        self.metrics_ports: dict[int, int] = {}  # process k (1-based) -> its own port

    @property
    def url(self) -> str:
        return self.proc.url

    async def start(self) -> None:
        await self.proc.start("--processes", str(self.processes))
        await self.proc.wait_port(60)
        await self.wait_line(rf"gateway listening on {self.url}: {self.processes} processes", 60)
        for k in range(1, self.processes + 1):
            m = await self.wait_line(rf"gateway process {k}: pid \d+, metrics http://\S+:(\d+)/")
            self.metrics_ports[k] = int(m.group(1))

    async def wait_line(self, pattern: str, timeout_s: float = 30) -> re.Match[str]:
        rx = re.compile(pattern)
        async with asyncio.timeout(timeout_s):
            while True:
                for line in self.proc.log_text().splitlines():
                    if m := rx.search(line):
                        return m
                assert self.proc.proc is not None
                assert self.proc.proc.returncode is None, self.proc.log_tail()
                await asyncio.sleep(0.05)

    def pid(self, k: int) -> int:
        """Process k's pid now: the one printed at start, or its last restart's."""
        restarts = re.findall(rf"runlog gateway: process {k} \(.*as pid (\d+)$",
                              self.proc.log_text(), re.MULTILINE)  # fmt: skip
        if restarts:
            return int(restarts[-1])
        m = re.search(rf"gateway process {k}: pid (\d+),", self.proc.log_text())
        assert m is not None
        return int(m.group(1))

    def metrics_url(self, k: int) -> str:
        return f"http://127.0.0.1:{self.metrics_ports[k]}"

    async def ws_connections(self, http: aiohttp.ClientSession, k: int) -> int:
        """Open WebSockets of process k, from its own /metrics."""
        async with http.get(self.metrics_url(k) + "/metrics") as r:
            assert r.status == 200
            text = await r.text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "runlog_gateway_connections" and sample.labels["kind"] == "ws":
                    return int(sample.value)
        return 0  # no WebSocket opened yet: the labelled gauge does not exist

    async def spread(self, http: aiohttp.ClientSession) -> dict[int, int]:
        return {k: await self.ws_connections(http, k) for k in self.metrics_ports}


@pytest_asyncio.fixture(loop_scope="session")
async def group(settings: Settings, tmp_root: Path) -> AsyncIterator[Group]:
    g = Group(settings, tmp_root, 2)
    try:
        await g.start()
        yield g
    finally:
        await g.proc.stop()
        print(g.proc.log_tail())  # shown with a failure


@pytest.mark.timeout(120)
async def test_a_group_on_port_0_shares_the_free_port_it_bound_and_printed(group: Group) -> None:
    assert group.proc.port != 0
    assert _listener_pids(group.proc.port) == {group.pid(1), group.pid(2)}
    assert set(group.metrics_ports.values()).isdisjoint({0, group.proc.port})


@pytest.mark.timeout(120)
async def test_a_restarted_process_of_a_group_gets_its_metrics_port_back_nobody_else(
    group: Group,
) -> None:
    """The port is the group's from its choice on, also while the process is
    down: a port the parent merely picked free would be anyone's in between."""
    from .test_up import _listens_on

    port, old = group.metrics_ports[1], psutil.Process(group.pid(1))
    old.kill()
    await asyncio.to_thread(old.wait, 10)
    assert not port_is_free(port), f"process 1's metrics port {port} is free while it restarts"
    m = await group.wait_line(rf"runlog gateway: process 1 \(pid {old.pid}, .*as pid (\d+)$")
    assert int(m.group(1)) == group.pid(1) != old.pid
    async with aiohttp.ClientSession() as http, asyncio.timeout(60):
        while not await _ready(http, group.metrics_url(1)):
            await asyncio.sleep(0.1)
    assert _listens_on(group.pid(1), port)


async def _until_spread(g: Group, http: aiohttp.ClientSession, total: int) -> dict[int, int]:
    """Per process, its open WebSockets, once they add up to `total`."""
    async with asyncio.timeout(20):
        while sum((spread := await g.spread(http)).values()) != total:
            await asyncio.sleep(0.05)
    return spread


@pytest.mark.timeout(120)
async def test_a_group_spreads_connections_over_its_processes_and_each_delivers(
    group: Group, settings: Settings, broker: Broker
) -> None:
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    topic = f"run:{run_id}"
    n = 40
    async with aiohttp.ClientSession() as http:
        # Both processes answer on their own ports, each with its own pid.
        pids = {group.pid(k) for k in (1, 2)}
        assert len(pids) == 2
        for k in (1, 2):
            async with http.get(group.metrics_url(k) + "/readyz") as r:
                assert r.status == 200 and (await r.json())["ready"] is True
        clients = [await _connect(http, group.url, token) for _ in range(n)]
        try:
            for c in clients:
                await c.send(type="subscribe", run_id=run_id, after=0)
                await c.next_reply()
            spread = await _until_spread(group, http, n)
            assert spread[1] > 0 and spread[2] > 0, spread  # all on one: p = 2**-39
            await append_text(w, 300, pause_every=30, pause_s=0.01)
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            for c in clients:  # each process delivered the whole run to its clients
                got = await c.collect(topic)
                assert [s for s, _ in got] == list(range(1, 302))
        finally:
            for c in clients:
                await c.ws.close()


async def _follow(c: Client, run_id: str, into: list[Received]) -> None:
    async for item in c.follow(run_id=run_id):
        into.append(item)


@pytest.mark.timeout(180)
async def test_kill_9_of_a_groups_process_it_is_restarted_and_its_clients_resume(
    group: Group, settings: Settings, broker: Broker
) -> None:
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    n = 20
    writer = asyncio.create_task(append_text(w, 3000, pause_every=50, pause_s=0.02))
    clients = [Client(group.url, token, max_reconnects=10) for _ in range(n)]
    got: list[list[Received]] = [[] for _ in clients]
    followers = [
        asyncio.create_task(_follow(c, run_id, g)) for c, g in zip(clients, got, strict=True)
    ]
    try:
        async with aiohttp.ClientSession() as http:
            spread = await _until_spread(group, http, n)
            await eventually(lambda: all(len(g) >= 100 for g in got), 30, "100 events each")
            old_pid = group.pid(1)
            psutil.Process(old_pid).kill()  # no goodbye: its clients see the connection drop
            m = await group.wait_line(
                rf"runlog gateway: process 1 \(pid {old_pid}, port {group.proc.port}, metrics "
                rf"port {group.metrics_ports[1]}\) exited \(killed by SIGKILL\) after [\d.]+ s;"
                r" restarted after 0\.5 s as pid (\d+)$"
            )
            assert int(m.group(1)) != old_pid
            await writer
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            async with asyncio.timeout(60):
                await asyncio.gather(*followers)
            # Every client saw every event once, in order; exactly those process 1
            # held reconnected (once: to process 2, the only one left on the port).
            for g in got:
                assert [i.cursor for i in g] == list(range(1, 3002))
            assert sorted(c.reconnects for c in clients) == [0] * spread[2] + [1] * spread[1]
            # The new process 1 is ready and takes its share of new connections again.
            async with asyncio.timeout(60):
                while not await _ready(http, group.metrics_url(1)):
                    await asyncio.sleep(0.1)
            more = [await _connect(http, group.url, token) for _ in range(20)]
            try:
                again = await _until_spread(group, http, 20)
                assert again[1] > 0, again
            finally:
                for m2 in more:
                    await m2.ws.close()
    finally:
        writer.cancel()
        for f in followers:
            f.cancel()
        await asyncio.gather(writer, *followers, return_exceptions=True)
        for c in clients:
            await c.close()


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/readyz") as r:
            return r.status == 200
    except aiohttp.ClientError:
        return False


@pytest.mark.timeout(120)
async def test_sigterm_drains_every_process_of_a_group_and_it_exits_0(
    group: Group, settings: Settings, broker: Broker
) -> None:
    token = auth.mint(settings, "alice")
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    await append_text(w, 100)
    await w.flush()
    topic = f"run:{run_id}"
    children = [psutil.Process(group.pid(k)) for k in (1, 2)]
    async with aiohttp.ClientSession() as http:
        clients = [await _connect(http, group.url, token) for _ in range(10)]
        try:
            for c in clients:
                await c.send(type="subscribe", run_id=run_id, after=0)
                await c.next_reply()
                await c.collect(topic, count=100, until_type="-")
            spread = await _until_spread(group, http, 10)
            assert spread[1] > 0 and spread[2] > 0, spread
            t0 = time.monotonic()
            group.proc.signal(signal.SIGTERM)
            for c in clients:  # each told to resume elsewhere, with its cursor
                await c.collect(topic, count=10**9, until_type="-", timeout_s=20)
                assert c.disconnect is not None
                assert c.disconnect["code"] == "server_draining"
                assert c.disconnect["reconnect"] == "resume"
                assert c.disconnect["cursors"] == {topic: 100}
                assert c.closed_with is not None and c.closed_with.data == 4000
            assert await group.proc.wait(30) == 0
            assert time.monotonic() - t0 < settings.gateway_drain_s + 5
        finally:
            for c in clients:
                await c.ws.close()
    assert not [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert "gateway stopped: 2 processes drained" in group.proc.log_text()
    await w.append(events.RunEnd(status="completed"))
    await w.flush()


# --- runlog up --gateway-processes ----------------------------------------------------


def _listener_pids(port: int) -> set[int]:
    """The pids listening on `port` (several share it with SO_REUSEPORT)."""
    return {
        c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid
    }


@pytest.mark.integration  # `runlog up` in its body: no server fixture shows it
@pytest.mark.timeout(240)
async def test_up_with_gateway_processes_serves_from_each_on_one_port() -> None:
    from .test_up import Up, _consecutive_free_ports

    data_dir = Path(tempfile.mkdtemp(prefix="runlog-up-procs-"))  # see test_up's data_dir
    up = Up(data_dir, gateways=1, args=("--gateway-processes", "2"))
    metrics = _consecutive_free_ports(2)
    up.env["RUNLOG_GATEWAY_METRICS_PORT"] = str(metrics)
    try:
        await up.start()
        pids = []
        for k in (1, 2):  # process k on gateway_metrics_port + k - 1
            m = await up.wait_line(rf"^  gateway 1\.{k}: +pid (\d+)  metrics http://\S+:(\d+)/")
            assert int(m.group(2)) == metrics + k - 1
            pids.append(int(m.group(1)))
            assert _listener_pids(metrics + k - 1) == {pids[-1]}
        assert _listener_pids(up.gateway_port) == set(pids)
        await up.wait_line(rf"^  gateway 1: +{up.url(1)}  2 processes  \(REST ")
        async with Client(up.urls, up.token("alice")) as c:
            sid = await c.create_session("two processes")
            run_id = await c.start_run(sid, "no tools")
            async with asyncio.timeout(60):
                got = [item async for item in c.follow(run_id=run_id)]
        assert [i.cursor for i in got] == list(range(1, len(got) + 1))
        assert got[-1].event["type"] == "run_end" and got[-1].event["status"] == "completed"
    finally:
        print(up.tail())  # shown with a failure
        await up.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.parametrize("shared", [False, True])
async def test_a_group_on_a_busy_port_is_one_line_and_exit_2(
    settings: Settings, tmp_root: Path, shared: bool
) -> None:
    """Also when what holds it set SO_REUSEPORT: the group's processes would
    otherwise join it (another group's port) and serve beside it."""
    with socket.socket() as holder:
        if shared:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))  # the kernel's pick: busy from the start
        holder.listen()
        busy = str(holder.getsockname()[1])
        g = RunlogProcess("gateway", settings, tmp_root, RUNLOG_GATEWAY_PORT=busy)
        await g.start("--processes", "2")
        try:
            assert await g.wait(60) == 2
        finally:
            await g.stop()
    assert f"runlog: error [port_in_use]: port {g.port} is in use (gateway)" in g.log_text()
