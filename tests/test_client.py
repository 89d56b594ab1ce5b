"""The Python client and `runlog tail`, against real gateways."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from broker import events
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import free_port
from gateway.context import GATEWAY
from runlog.client import Client, ClientError

from .gw import RunningGateway, append_text, running_gateway, write_run


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


async def test_client_rest_and_follow(gw: RunningGateway, broker: Broker) -> None:
    async with Client(gw.url, gw.token("alice")) as c:
        sid = await c.create_session("demo")
        await c.add_member(sid, "bob", "viewer")
        assert {s["session_id"] for s in await c.list_sessions()} >= {sid}
        run_id, w = await write_run(broker, sid, 10, end=False)
        got: list[int] = []

        async def follow() -> None:
            async for item in c.follow(run_id=run_id, after=3):
                got.append(item.cursor)

        task = asyncio.create_task(follow())
        await append_text(w, 10)
        await w.append(events.RunEnd(status="completed"))
        await w.flush()
        await asyncio.wait_for(task, 30)
        assert got == list(range(4, 22))
        assert (await c.page(run_id, after=20))["ended"] is True
    async with Client(gw.url, gw.token("bob")) as viewer:
        try:
            await viewer.interrupt(run_id)
        except ClientError as e:
            assert (e.status, e.code) == (403, "forbidden")
        else:
            raise AssertionError("a viewer stopped a run")


async def test_follow_survives_a_gateway_going_away(settings: Settings, broker: Broker) -> None:
    async with running_gateway(settings) as g2:
        g1_ctx = running_gateway(settings)
        g1 = await g1_ctx.__aenter__()
        sid = await broker.store.create_session("alice")
        run_id, w = await write_run(broker, sid, 0, end=False)
        writer = asyncio.create_task(append_text(w, 1500, pause_every=50, pause_s=0.005))
        got: list[int] = []
        async with Client([g1.url, g2.url], g1.token("alice")) as c:

            async def follow() -> None:
                async for item in c.follow(run_id=run_id):
                    got.append(item.cursor)
                    if len(got) == 200:
                        # The gateway drains (server_draining): resume on the other.
                        asyncio.get_running_loop().create_task(g1.app[GATEWAY].drain())

            task = asyncio.create_task(follow())
            await writer
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            await asyncio.wait_for(task, 60)
            assert c.reconnects >= 1
        await g1_ctx.__aexit__(None, None, None)
        assert got == list(range(1, 1502))


async def test_runlog_tail_prints_the_run(gw: RunningGateway, broker: Broker,
                                          settings: Settings, tmp_root: Path) -> None:  # fmt: skip
    sid = await broker.store.create_session("alice")
    run_id = await broker.store.create_run(sid, "alice")
    w = await broker.claim(run_id, "w")
    await w.append(events.RunStart(model="demo", started_by="alice"))
    await w.append(events.TextDelta(message_id="m", delta="Hello "))
    await w.append(events.TextDelta(message_id="m", delta="world"))
    await w.append(events.ToolCallStart(tool_call_id="c", tool_name="search", risk_level="low"))
    await w.append(events.ToolResult(tool_call_id="c", status="ok", summary="3 hits"))
    await w.append(events.RunEnd(status="completed"))
    await w.flush()
    # A data folder without a jwt_secret file (the default, .runlog, may have
    # one from a `runlog up`, which --user would sign with): the test's secret.
    env = {**os.environ, "RUNLOG_JWT_SECRET": settings.jwt_secret,
           "RUNLOG_DATA_DIR": str(tmp_root / "no-up-here")}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "tail", run_id, "--url", gw.url, "--user", "alice",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    text = out.decode()
    assert proc.returncode == 0, err.decode()
    assert "Hello world" in text and "tool search (low risk)" in text
    assert "3 hits" in text and "run ended: completed" in text


async def test_follow_surfaces_a_non_retryable_error_at_once(
    gw: RunningGateway, broker: Broker
) -> None:
    sid = await broker.store.create_session("alice")
    run_id, _ = await write_run(broker, sid, 1)
    async with Client(gw.url, gw.token("mallory")) as c:
        with pytest.raises(ClientError) as e:
            async for _ in c.follow(run_id=run_id):
                pass
        assert (e.value.code, e.value.retryable, c.reconnects) == ("not_a_member", False, 0)
        # REST errors say whether to retry, too.
        with pytest.raises(ClientError) as e:
            await c.get_run(run_id)
        assert (e.value.status, e.value.code, e.value.retryable) == (403, "not_a_member", False)


async def test_follow_gives_up_after_max_reconnects_in_a_row() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with Client(url, "token", max_reconnects=2) as c:
        with pytest.raises(ConnectionError, match="after 2 reconnects in a row"):
            async for _ in c.follow(run_id="r_x"):
                pass
        assert c.reconnect_reasons == {"ClientConnectorError": 3}


async def test_runlog_tail_of_an_unknown_run_says_so_in_one_line(
    gw: RunningGateway, settings: Settings, tmp_root: Path
) -> None:
    env = {**os.environ, "RUNLOG_JWT_SECRET": settings.jwt_secret,
           "RUNLOG_DATA_DIR": str(tmp_root / "no-up-here")}  # fmt: skip
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "tail", "r_unknown", "--url", gw.url,
        "--user", "alice",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2, err.decode()
    assert out == b""
    # One line says why (after the note on the development secret --user signs with).
    errors = [line for line in err.decode().splitlines() if not line.startswith("runlog: note:")]
    assert errors == [
        "runlog: error [not_a_member]: run 'r_unknown' is not in any session of yours"
    ]
