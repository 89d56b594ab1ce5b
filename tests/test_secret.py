"""The public development JWT secret: a gateway that anyone off this machine
can reach refuses to start with it (or with an empty one), in one line naming
the setting; on loopback it starts. `runlog token` signs with the secret
`runlog up` keeps in the data folder. (`runlog up`'s side: tests/test_up.py.)"""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import aiohttp
import jwt
import pytest

from broker import errors
from broker.settings import Settings
from runlog import secret

from .procs import RunlogProcess

DEFAULT = Settings().jwt_secret
LINE = {
    "default": (
        "runlog: error [insecure_secret]: jwt_secret is the public development default and "
        "gateway_host {host} is not loopback-only, so anyone could mint tokens: set "
        "RUNLOG_JWT_SECRET (or --jwt-secret) to a long random string, e.g. "
        "`openssl rand -hex 32`, or listen on 127.0.0.1"
    ),
    "empty": (
        "runlog: error [insecure_secret]: jwt_secret is empty and "
        "gateway_host {host} is not loopback-only, so anyone could mint tokens: set "
        "RUNLOG_JWT_SECRET (or --jwt-secret) to a long random string, e.g. "
        "`openssl rand -hex 32`, or listen on 127.0.0.1"
    ),
}


async def _exit_or_ready(p: RunlogProcess, timeout_s: float = 60) -> int | None:
    """The exit code if the gateway exits, None once it answers /readyz."""
    assert p.proc is not None
    async with aiohttp.ClientSession() as http, asyncio.timeout(timeout_s):
        while p.proc.returncode is None:
            try:
                async with http.get(p.url + "/readyz") as r:
                    if r.status == 200:
                        return None
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
        return p.proc.returncode


@pytest.mark.parametrize(
    ("host", "secret"), [("0.0.0.0", "default"), ("0.0.0.0", "empty"), ("::", "default")]
)
async def test_a_reachable_gateway_refuses_the_public_secret(
    host: str, secret: str, settings: Settings, tmp_path: Path
) -> None:
    p = RunlogProcess("gateway", settings, tmp_path, RUNLOG_GATEWAY_HOST=host,
                      RUNLOG_JWT_SECRET=DEFAULT)  # fmt: skip
    try:
        # An empty variable means "unset"; an empty flag is an empty secret.
        await p.start(*(["--jwt-secret="] if secret == "empty" else []))
        code = await _exit_or_ready(p)
    finally:
        await p.stop()
    log = p.log_tail()
    assert code == 2, log
    assert log.splitlines() == [LINE[secret].format(host=host)]


@pytest.mark.parametrize(
    ("host", "secret"),
    [("127.0.0.1", DEFAULT), ("localhost", DEFAULT), ("0.0.0.0", "s3cret-" + "x" * 40)],
)
async def test_a_loopback_gateway_or_a_real_secret_starts(
    host: str, secret: str, settings: Settings, tmp_path: Path
) -> None:
    p = RunlogProcess("gateway", settings, tmp_path, RUNLOG_GATEWAY_HOST=host,
                      RUNLOG_JWT_SECRET=secret)  # fmt: skip
    try:
        await p.start()
        assert await _exit_or_ready(p) is None, p.log_tail()
    finally:
        await p.stop()


async def _runlog_token(*args: str, **env: str) -> tuple[int, str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "runlog.cli", "token", *args, env={**base, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode().strip(), err.decode()


def _claims(token: str, secret: str) -> dict[str, object]:
    got: dict[str, object] = jwt.decode(token, secret, algorithms=["HS256"], issuer="runlog")
    return got


async def test_runlog_token_signs_with_the_data_folders_secret(tmp_path: Path) -> None:
    (tmp_path / "jwt_secret").write_text("folder-secret-" + "y" * 40)
    os.chmod(tmp_path / "jwt_secret", 0o600)
    code, token, err = await _runlog_token("--user", "ann", "--data-dir", str(tmp_path))
    assert (code, err) == (0, "")
    assert _claims(token, "folder-secret-" + "y" * 40)["sub"] == "ann"
    # The same folder by RUNLOG_DATA_DIR; an explicit secret wins over the folder's.
    code, token, _ = await _runlog_token("--user", "bo", RUNLOG_DATA_DIR=str(tmp_path))
    assert code == 0 and _claims(token, "folder-secret-" + "y" * 40)["sub"] == "bo"
    code, token, _ = await _runlog_token("--user", "cy", "--data-dir", str(tmp_path),
                                         RUNLOG_JWT_SECRET="explicit-" + "z" * 40)  # fmt: skip
    assert code == 0 and _claims(token, "explicit-" + "z" * 40)["sub"] == "cy"


def test_the_folder_secret_is_made_once_with_mode_0600_and_reused(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    first = secret.resolve(s, create_missing=True)
    path = tmp_path / "jwt_secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.jwt_secret == path.read_text().strip() and len(first.jwt_secret) >= 43
    assert secret.resolve(s, create_missing=True).jwt_secret == first.jwt_secret
    assert secret.resolve(s, create_missing=False).jwt_secret == first.jwt_secret
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jwt_secret"]  # no temporary left


def test_an_explicit_secret_wins_and_makes_no_file(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path, jwt_secret="explicit-" + "z" * 40)
    assert secret.resolve(s, create_missing=True) == s
    assert list(tmp_path.iterdir()) == []


def test_a_folder_secret_others_may_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jwt_secret"
    path.write_text("w" * 43)
    os.chmod(path, 0o644)
    with pytest.raises(errors.InsecureSecret) as info:
        secret.resolve(Settings(data_dir=tmp_path), create_missing=True)
    assert info.value.detail == f"{path} is readable by others (mode 0644): chmod 600 it"
