"""Run `runlog` processes (gateway, worker) as real subprocesses, for kill tests."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp

from broker.embedded import free_port
from broker.settings import Settings


class RunlogProcess:
    def __init__(self, kind: str, settings: Settings, log_dir: Path, **env: str) -> None:
        self.kind = kind
        self.settings = settings
        self.port = free_port()
        self.log_path = log_dir / f"{kind}-{self.port}.log"
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
        return f"http://127.0.0.1:{self.port}"

    async def start(self, *args: str) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "runlog.cli", self.kind, *args,
                env=self.env, stdout=log, stderr=log,
            )  # fmt: skip

    async def wait_ready(self, timeout_s: float = 30) -> None:
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
