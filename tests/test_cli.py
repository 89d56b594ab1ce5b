"""The `runlog` command as a user meets it: a closed pipe ends it quietly,
each command's --help lists its own options, and a mistake (a bad value, an
unreachable stack, a data folder that is a file) is one line and exit 2,
without a traceback (real processes)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.settings import Settings
from broker.sockets import bind_free_port
from runlog import stack

from .gw import running_gateway

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


# -- a new user's mistakes: one line naming what is wrong, exit 2, no traceback


def _runlog(cwd: Path, *args: str | bytes, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runlog.cli", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )


def assert_refused(done: subprocess.CompletedProcess[str], code: str, says: str) -> None:
    """Exit 2 and one line (maybe a hint after it) saying `says`, without a traceback."""
    lines = [line for line in done.stderr.splitlines() if not line.startswith("hint: ")]
    assert (done.returncode, len(lines)) == (2, 1), done.stderr
    assert lines[0].startswith(f"runlog: error [{code}]: "), done.stderr
    assert says in lines[0], done.stderr


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (held, so nothing starts to)."""
    with bind_free_port() as sock:
        yield sock.getsockname()[1]


@pytest.mark.parametrize("command", [["migrate"], ["prune", "--older-than-days", "30"]])
def test_an_unreachable_postgresql_is_one_line(
    tmp_path: Path, closed_port: int, command: list[str]
) -> None:
    url = f"postgresql://127.0.0.1:{closed_port}/runlog"
    done = _runlog(tmp_path, *command, "--database-url", url)
    assert_refused(done, "storage_unavailable", "cannot connect to PostgreSQL")


@pytest.mark.parametrize("command", [["migrate"], ["prune", "--older-than-days", "30"]])
def test_a_database_url_that_is_not_one_is_one_line(tmp_path: Path, command: list[str]) -> None:
    done = _runlog(tmp_path, *command, "--database-url", "localhost:5432")
    assert_refused(done, "invalid_setting", "RUNLOG_DATABASE_URL / --database-url")


@pytest.mark.parametrize("command", [["migrate"], ["gateway"], ["worker"]])
@pytest.mark.parametrize("port", ["x", "", "99999", "0x10"])
def test_a_database_url_whose_port_is_no_port_is_one_line(
    tmp_path: Path, command: list[str], port: str
) -> None:
    # asyncpg's ValueError, a traceback (migrate, gateway, worker alike).
    url = f"postgresql://nobody:s3cret@127.0.0.1:{port}/runlog"
    done = _runlog(tmp_path, *command, "--database-url", url, "--nats-url", "nats://127.0.0.1:1")
    assert_refused(done, "invalid_setting", f"RUNLOG_DATABASE_URL / --database-url: '{port}' is")
    assert "s3cret" not in done.stderr


@pytest.mark.parametrize("option", ["--gateway-port", "--embedded-postgres-port"])
@pytest.mark.parametrize("value", ["65536", "-1"])
def test_a_port_out_of_range_names_its_own_setting(tmp_path: Path, option: str, value: str) -> None:
    # --gateway-port 99999 was told as RUNLOG_PUBLIC_URL "is not a URL".
    done = _runlog(tmp_path, "token", "--user", "alice", option, value)
    env = "RUNLOG_" + option[2:].upper().replace("-", "_")
    assert_refused(done, "invalid_setting", f"{env} / {option}: '{value}' is not a port")


def test_up_on_gateway_port_0_is_one_line(tmp_path: Path) -> None:
    # It started everything, waited 60 s for a gateway on port 0, then stopped.
    started = time.monotonic()
    done = _runlog(tmp_path, "up", "--gateway-port", "0", "--data-dir", "data")
    assert_refused(done, "invalid_setting", "RUNLOG_GATEWAY_PORT / --gateway-port: '0' is not")
    assert time.monotonic() - started < 20
    assert not (tmp_path / "data").exists()  # refused before starting anything


@pytest.mark.parametrize("url", ["nota url", "http://", "ftp://127.0.0.1:1", "127.0.0.1:8080"])
def test_tail_of_a_url_that_is_not_one_is_one_line(tmp_path: Path, url: str) -> None:
    # It was tried 5 times and told as `unreachable`.
    done = _runlog(tmp_path, "tail", "r_x", "--token", "t", "--url", url)
    assert_refused(done, "bad_request", f"--url {url!r} is not an http:// or https:// URL")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--older-than-days", "-1"), ("--older-than-days", "0"), ("--older-than-days", "nan"),
     ("--older-than-days", "inf"), ("--older-than-days", "1e300"), ("--batch-events", "0"),
     ("--batch-events", "-3")],
)  # fmt: skip
def test_prune_refuses_a_cutoff_or_batch_it_cannot_use_before_connecting(
    tmp_path: Path, closed_port: int, option: str, value: str
) -> None:
    # -1 and 0 days were refused only once connected (retention.prune), here after
    # the unreachable PostgreSQL's traceback; nan, inf and 1e300 reached PostgreSQL
    # (1e300: a NumericValueOutOfRangeError traceback).
    args = {"--older-than-days": "30", "--batch-events": "100", option: value}
    url = f"postgresql://127.0.0.1:{closed_port}/runlog"
    done = _runlog(
        tmp_path, "prune", *[x for kv in args.items() for x in kv], "--database-url", url
    )
    assert_refused(done, "bad_request", f"{option} must be")


@pytest.mark.parametrize(("option", "value"), [("--gateways", "0"), ("--gateways", "-1"),
                                                ("--workers", "-1")])  # fmt: skip
def test_up_refuses_a_process_count_it_cannot_run(tmp_path: Path, option: str, value: str) -> None:
    done = _runlog(tmp_path, "up", option, value)
    assert_refused(done, "bad_request", f"{option} must be")
    assert not (tmp_path / ".runlog").exists()  # refused before starting anything


@pytest.mark.parametrize("command", [["token", "--user", "alice"], ["up"]])
def test_a_data_folder_that_is_a_file_is_one_line(tmp_path: Path, command: list[str]) -> None:
    (tmp_path / "data").write_text("")
    done = _runlog(tmp_path, *command, "--data-dir", "data")
    assert_refused(done, "invalid_setting", "RUNLOG_DATA_DIR / --data-dir: 'data' is not a folder")


def test_a_setting_that_is_not_a_number_is_one_line_like_every_setting(tmp_path: Path) -> None:
    done = _runlog(tmp_path, "token", "--user", "alice", "--gateway-port", "80a")
    assert_refused(done, "invalid_setting", "RUNLOG_GATEWAY_PORT / --gateway-port: '80a' is not")
    done = _runlog(tmp_path, "token", "--user", "alice", RUNLOG_ACCESS_RECHECK_S="soon")
    assert_refused(done, "invalid_setting", "RUNLOG_ACCESS_RECHECK_S / --access-recheck-s")


def test_an_argument_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    # A user id no gateway could take back from a token (b"\xff" is no UTF-8).
    done = _runlog(tmp_path, "token", "--user", b"al\xffce")
    assert_refused(done, "bad_request", "is not UTF-8")
    assert done.stdout == ""
    # Nor a setting's variable (UnicodeEncodeError traceback).
    done = _runlog(tmp_path, "migrate", RUNLOG_DATABASE_URL="postgresql://\udcff")
    assert_refused(done, "bad_request", "the variable RUNLOG_DATABASE_URL is not UTF-8")
    assert "postgresql" not in done.stderr


def test_tail_of_an_unreachable_gateway_is_one_line_at_once(
    tmp_path: Path, closed_port: int
) -> None:
    # It tried 50 times over about two minutes, silent, before saying so.
    url = f"http://127.0.0.1:{closed_port}"
    started = time.monotonic()
    done = _runlog(tmp_path, "tail", "r_x", "--token", "t", "--url", url)
    assert_refused(done, "unreachable", f"no gateway of {url} answered in 5 attempts")
    assert time.monotonic() - started < 20


def test_up_on_the_data_folder_of_a_running_up_is_one_line(
    tmp_path: Path, closed_port: int
) -> None:
    # A live pid in its up.json (this test's): the second `runlog up` failed with a
    # traceback, 'another postgres (pid ...) is running on .runlog/postgres'.
    (tmp_path / ".runlog").mkdir()
    stack.write(tmp_path / ".runlog", stack.Running(pid=os.getpid(), nats_url="nats://x:1",
                database_url="postgresql://x:1/db", gateway_urls=[]))  # fmt: skip
    done = _runlog(tmp_path, "up", "--gateway-port", str(closed_port))
    assert_refused(done, "bad_request", f"a runlog up (pid {os.getpid()}) is running on .runlog")


@pytest.mark.parametrize("value", ["0", "-1"])
def test_worker_refuses_a_concurrency_below_one(
    tmp_path: Path, closed_port: int, value: str
) -> None:
    # -1 ran one at a time and 0 the default, silently.
    done = _runlog(tmp_path, "worker", "--concurrency", value, "--nats-url",
                   f"nats://127.0.0.1:{closed_port}", "--database-url",
                   f"postgresql://127.0.0.1:{closed_port}/runlog")  # fmt: skip
    assert_refused(done, "bad_request", "--concurrency must be 1 or more")


def test_an_empty_user_is_refused(tmp_path: Path) -> None:
    done = _runlog(tmp_path, "token", "--user", "")  # minted a token for user ''
    assert_refused(done, "bad_request", "--user must not be empty")
    assert done.stdout == ""


async def test_tail_with_a_token_the_gateway_refuses_says_so_at_once(
    settings: Settings, tmp_path: Path
) -> None:
    # It took the 401 of the upgrade for an unreachable gateway, 50 times over.
    async with running_gateway(settings) as gw:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "runlog.cli", "tail", "r_x", "--url", gw.url, "--token", "no",
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert (proc.returncode, out, err.decode().splitlines()) == (
        2, b"", ["runlog: error [unauthorized]: the gateway refused the token (unauthorized)"])  # fmt: skip
