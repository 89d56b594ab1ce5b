"""Where a running `runlog up` says what it serves, so that the commands
that need the stack find it the way `runlog token` finds its secret: by the
data folder (`--data-dir` / `RUNLOG_DATA_DIR`, default `.runlog`).

Contract:
- `runlog up` writes `<data_dir>/up.json` (its pid, the NATS and PostgreSQL
  URLs, the gateways' URLs; mode 0600, replaced atomically) once every child
  is ready, and removes it when it stops. A file left by a `runlog up` that
  was killed names a pid that is gone, and is ignored.
- `fill` gives a command's settings the URLs they do not set (a setting or
  a flag always wins); `gateway_urls` the gateways to reach, in order:
  `public_url`, then the stack's, then gateway_host:gateway_port.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import msgspec

from broker.settings import Settings

FILE = "up.json"


class Running(msgspec.Struct, kw_only=True):
    pid: int
    nats_url: str
    database_url: str
    gateway_urls: list[str]


def write(data_dir: Path, running: Running) -> None:
    path = data_dir / FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(msgspec.json.encode(running))
    tmp.replace(path)


def remove(data_dir: Path) -> None:
    (data_dir / FILE).unlink(missing_ok=True)


def read(data_dir: Path) -> Running | None:
    """The `runlog up` running on `data_dir`, or None (none, or it is gone)."""
    try:
        running = msgspec.json.decode((data_dir / FILE).read_bytes(), type=Running)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None
    try:
        os.kill(running.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    return running


def fill(settings: Settings) -> Settings:
    running = read(settings.data_dir)
    if running is None:
        return settings
    return dataclasses.replace(
        settings,
        nats_url=settings.nats_url or running.nats_url,
        database_url=settings.database_url or running.database_url,
    )


def gateway_urls(settings: Settings) -> list[str]:
    if settings.public_url:
        return [settings.public_url]
    running = read(settings.data_dir)
    if running is not None and running.gateway_urls:
        return list(running.gateway_urls)
    return [f"http://{settings.gateway_host}:{settings.gateway_port}"]
