"""`runlog gateway` and `runlog worker` on a busy port: one line, exit 2."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from broker.embedded import LOOPBACK
from broker.settings import Settings

from .procs import RunlogProcess


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
