"""The `runlog` command as a user meets it: a closed pipe ends it quietly,
and each command's --help lists its own options (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COMMANDS = ["up", "migrate", "gateway", "worker", "token", "revoke", "tail", "prune", "settings"]


def test_a_closed_pipe_ends_a_command_quietly() -> None:
    """`runlog settings | head -1`: the reader is gone (here before the first
    write, so the write fails every time, not only when it outgrows the pipe)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runlog.cli", "settings"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=30,
        )
    finally:
        os.close(write_end)
    assert done.stderr == b""
    assert done.returncode == 141  # as a shell reports SIGPIPE: 128 + 13


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_commands_own_options_not_every_setting(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runlog.cli", command, "--help"],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout.decode()
    assert "--gateway-metrics-port" not in out  # a setting, not this command's option
    assert len(out.splitlines()) < 40, out
    if command != "settings":
        assert "runlog settings" in out  # where the settings are


def test_make_run_installs_the_product_not_the_test_tools(tmp_path: Path) -> None:
    """`make run` on a fresh machine (dry run, a venv folder not made yet):
    the product's extras only, not `.[dev]` (test tools, every adapter)."""
    plan = subprocess.run(
        ["make", "-n", "run", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        check=True,
        timeout=30,
        text=True,
    ).stdout
    installs = [line for line in plan.splitlines() if "pip install" in line and "-e" in line]
    assert installs == [f"{tmp_path / 'venv'}/bin/python -m pip install -q -e '.[embedded,fast]'"]
