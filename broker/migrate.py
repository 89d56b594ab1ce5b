"""Migration runner: numbered plain-SQL files, applied in order, each in its
own transaction, recorded with a checksum.

Contract:
- Files are `NNNN_name.sql` in the `migrations` package; NNNN orders them.
- Re-running is a no-op. A file whose checksum differs from the one recorded
  when it was applied is refused (MigrationChecksumMismatch): applied
  migrations are history, change the schema with a new file.
- Concurrent runners (several `runlog migrate` at once) serialize on an
  advisory lock, so each file is applied exactly once.

Beside it, the server-level statements a launcher needs before there is a
schema (runlog/embedded.py and the tests' template database): `server_ready`
and `create_database`. They live here so that asyncpg stays inside broker/.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from . import errors
from .constants import MIGRATIONS_TABLE

log = logging.getLogger(__name__)

_IDENT_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_LOCK_KEY = 0x72756E6C6F67  # "runlog"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load(directory: Path | None = None) -> list[Migration]:
    """The migrations in `directory` (default: the packaged ones), in order."""
    if directory is None:
        files = [
            (p.name, p.read_text())
            for p in importlib.resources.files("migrations").iterdir()
            if p.name.endswith(".sql")
        ]
    else:
        files = [(p.name, p.read_text()) for p in directory.glob("*.sql")]
    out = []
    for name, sql in files:
        m = _FILE_RE.match(name)
        if not m:
            raise errors.MigrationError(f"migration file name {name!r} is not NNNN_name.sql")
        out.append(Migration(int(m.group(1)), m.group(2), sql))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if len(set(versions)) != len(versions):
        raise errors.MigrationError(f"two migration files share a number: {versions}")
    return out


async def apply(dsn: str, directory: Path | None = None) -> list[Migration]:
    """Apply pending migrations; return the ones applied now."""
    migrations = load(directory)
    try:
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise errors.StorageError(f"cannot connect to PostgreSQL: {e}") from e
    try:
        await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
        try:
            return await _apply_locked(conn, migrations)
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)
    finally:
        await conn.close()


async def _apply_locked(conn: asyncpg.Connection, migrations: list[Migration]) -> list[Migration]:
    await conn.execute(
        f"""CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (
            version int PRIMARY KEY,
            name text NOT NULL,
            checksum text NOT NULL,
            applied_at timestamptz NOT NULL DEFAULT now())"""
    )
    rows = await conn.fetch(f"SELECT version, name, checksum FROM {MIGRATIONS_TABLE}")
    applied = {r["version"]: r for r in rows}
    for m in migrations:
        row = applied.get(m.version)
        if row is not None and row["checksum"] != m.checksum:
            raise errors.MigrationChecksumMismatch(
                f"migration {m.version:04d}_{m.name} was changed after it was applied "
                f"(recorded {row['checksum'][:12]}, file {m.checksum[:12]})",
                hint="never edit an applied migration; add a new numbered file",
            )
    done = []
    for m in migrations:
        if m.version in applied:
            continue
        try:
            async with conn.transaction():
                await conn.execute(m.sql)
                await conn.execute(
                    f"INSERT INTO {MIGRATIONS_TABLE} (version, name, checksum) VALUES ($1, $2, $3)",
                    m.version,
                    m.name,
                    m.checksum,
                )
        except asyncpg.PostgresError as e:
            raise errors.MigrationError(
                f"migration {m.version:04d}_{m.name} failed and was rolled back: {e}"
            ) from e
        log.info("applied migration %04d_%s", m.version, m.name)
        done.append(m)
    return done


# --- server administration (before any schema exists) ---------------------------


async def server_ready(dsn: str, *, timeout_s: float = 5.0) -> bool:
    """Whether the server at `dsn` answers a query now. While starting up,
    PostgreSQL accepts TCP but refuses sessions ("the database system is
    starting up", CannotConnectNowError): that is False, not an error."""
    try:
        conn = await asyncpg.connect(dsn, timeout=timeout_s)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    try:
        return bool(await conn.fetchval("SELECT 1") == 1)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    finally:
        conn.terminate()  # a probe: no need for a polite goodbye


async def create_database(dsn: str, name: str, *, template: str | None = None) -> bool:
    """Create database `name` on the server `dsn` connects to (a copy of
    `template`, which no session may be using, when given); False when it
    exists already. Names are plain identifiers (CREATE DATABASE takes no
    parameters)."""
    for ident in (name, template):
        if ident is not None and not _IDENT_RE.match(ident):
            raise ValueError(f"not a plain database name: {ident!r}")
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as e:
        raise errors.StorageError(f"cannot connect to PostgreSQL: {e}") from e
    try:
        if await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            return False
        sql = f'CREATE DATABASE "{name}"'
        if template is not None:
            sql += f' TEMPLATE "{template}"'
        try:
            await conn.execute(sql)
        except asyncpg.DuplicateDatabaseError:  # a concurrent creator won
            return False
        return True
    finally:
        await conn.close()
