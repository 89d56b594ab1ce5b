"""The JWT secret of a data folder, for `runlog up` and the CLIs that mint tokens.

`runlog up` must not run with the public default secret (anyone could mint a
token for any user), yet must work with no configuration. So, unless the
operator set jwt_secret, it uses a random one kept in `<data_dir>/jwt_secret`:
made on the first `up` (`secrets.token_urlsafe(32)`, mode 0600), reused by
every later `up` on that folder, so tokens and console links outlive a
restart. `runlog token` and `runlog tail --user` read the same file (found by
`--data-dir` / RUNLOG_DATA_DIR, default `.runlog`), so what they mint works
against that stack. An explicitly set jwt_secret always wins.

The file is made atomically: written under a temporary name created with
O_CREAT | O_EXCL and mode 0600, then linked to its name, which fails if it
exists. Two `up`s racing on one folder thus agree on one secret, and a crash
never leaves a half-written one under the real name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import stat
from pathlib import Path

from broker import errors
from broker.settings import Settings
from gateway.auth import secret_is_public

FILE_NAME = "jwt_secret"


def path_of(data_dir: Path) -> Path:
    return data_dir / FILE_NAME


def read(data_dir: Path) -> str | None:
    """The folder's secret, or None if it has none. InsecureSecret if others
    may read the file or it is empty (rather than use a secret that is not one)."""
    path = path_of(data_dir)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "r", encoding="utf-8") as f:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            raise errors.InsecureSecret(
                f"{path} is readable by others (mode {mode:04o}): chmod 600 it"
            )
        value = f.read().strip()
    if not value:
        raise errors.InsecureSecret(f"{path} is empty: delete it and a new one is made")
    return value


def create(data_dir: Path) -> str:
    """The folder's secret, made now if it has none."""
    existing = read(data_dir)
    if existing is not None:
        return existing
    value = secrets.token_urlsafe(32)
    tmp = data_dir / f".{FILE_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(value + "\n")
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path_of(data_dir))
        except FileExistsError:
            pass  # another `up` got there first: its secret is the folder's
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    got = read(data_dir)
    assert got is not None
    return got


def resolve(settings: Settings, *, create_missing: bool) -> Settings:
    """`settings` with the data folder's secret, unless jwt_secret was set.
    With `create_missing` (`runlog up`) a folder without one gets one."""
    if not secret_is_public(settings):
        return settings
    data_dir = settings.data_dir.resolve()
    value = create(data_dir) if create_missing else read(data_dir)
    if value is None:
        return settings
    return dataclasses.replace(settings, jwt_secret=value)
