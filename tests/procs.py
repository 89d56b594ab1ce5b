"""Run `runlog` processes (gateway, worker) as real subprocesses, for kill tests.

A gateway's port: with RUNLOG_GATEWAY_PORT="0" the gateway binds a free port
itself and prints it, and `wait_port()` reads it there, so no other process
can take it between its choice and the bind. Without it one is picked here
(`free_port()`) and passed on, for a test that needs the URL before the start
(two gateways that list each other); another process may take it first, so
prefer port 0.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import aiohttp

from broker.settings import Settings
from broker.sockets import free_port

_LISTENING = re.compile(r"gateway listening on http://\S+?:(\d+)")


class RunlogProcess:
    def __init__(self, kind: str, settings: Settings, log_dir: Path, **env: str) -> None:
        self.kind = kind
        self.settings = settings
        # 0: known once the gateway printed it (wait_port)
        self.port = int(env.get("RUNLOG_GATEWAY_PORT") or free_port())
        fd, log_path = tempfile.mkstemp(prefix=f"{kind}-{self.port}-", suffix=".log", dir=log_dir)
        os.close(fd)
        self.log_path = Path(log_path)
        self.env = {
            **os.environ,
            "RUNLOG_NATS_URL": settings.nats_url,
            "RUNLOG_DATABASE_URL": settings.database_url,
            "RUNLOG_GATEWAY_PORT": str(self.port),
            "RUNLOG_JWT_SECRET": settings.jwt_secret,
            **env,
        }
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        assert self.port, "the gateway's port is not known yet: await wait_port()"
        return f"http://127.0.0.1:{self.port}"

    async def start(self, *args: str) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "runlog.cli", self.kind, *args,
                env=self.env, stdout=log, stderr=log,
            )  # fmt: skip

    async def wait_port(self, timeout_s: float = 30) -> int:
        """The gateway's port: the one given, or (port 0) the one it bound, once
        it printed it. A later start() binds that one again."""
        try:
            async with asyncio.timeout(timeout_s):
                while not self.port:
                    assert self.proc is not None and self.proc.returncode is None, self.log_tail()
                    if (m := _LISTENING.search(self.log_text())) and int(m.group(1)):
                        self.port = int(m.group(1))
                        self.env["RUNLOG_GATEWAY_PORT"] = str(self.port)
                    else:
                        await asyncio.sleep(0.05)
        except TimeoutError:
            raise AssertionError(f"no port printed in {timeout_s} s: {self.log_tail()}") from None
        return self.port

    async def wait_ready(self, timeout_s: float = 30) -> None:
        await self.wait_port(timeout_s)
        async with aiohttp.ClientSession() as h, asyncio.timeout(timeout_s):
            while True:
                assert self.proc is not None and self.proc.returncode is None, self.log_tail()
                try:
                    async with h.get(self.url + "/readyz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    async def wait(self, timeout_s: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout_s)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text()[-3000:]
        except OSError:
            return ""
