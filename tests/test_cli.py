"""The `runlog` command as a user meets it: a closed pipe ends it quietly,
and each command's --help lists its own options (real processes)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
