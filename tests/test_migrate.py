"""Migration runner against a real PostgreSQL: ordered, idempotent, checksummed."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio

from broker import errors, migrate

from .helpers import Stack


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_db(stack: Stack) -> AsyncIterator[str]:
    """An empty database on the shared server, dropped afterwards."""
    name = "mig_" + secrets.token_hex(6)
    admin = await asyncpg.connect(stack.database_url)
    await admin.execute(f"CREATE DATABASE {name}")
    base, _, _ = stack.database_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
        await admin.close()


def write(folder: Path, name: str, sql: str) -> None:
    (folder / name).write_text(sql)


async def test_packaged_migrations_apply_once(fresh_db: str) -> None:
    first = await migrate.apply(fresh_db)
    assert [m.version for m in first] == [m.version for m in migrate.load()]
    assert await migrate.apply(fresh_db) == []  # re-running is a no-op
    conn = await asyncpg.connect(fresh_db)
    try:
        tables = {
            r[0]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
        assert {"sessions", "members", "runs", "events", "approvals", "audit"} <= tables
        rows = await conn.fetch("SELECT version, checksum FROM runlog_migrations ORDER BY 1")
        assert [(r[0], r[1]) for r in rows] == [(m.version, m.checksum) for m in migrate.load()]
    finally:
        await conn.close()


async def test_changed_migration_is_refused(fresh_db: str, tmp_path: Path) -> None:
    write(tmp_path, "0001_a.sql", "CREATE TABLE a (x int);")
    write(tmp_path, "0002_b.sql", "CREATE TABLE b (x int);")
    assert len(await migrate.apply(fresh_db, tmp_path)) == 2

    write(tmp_path, "0002_b.sql", "CREATE TABLE b (x bigint);")
    write(tmp_path, "0003_c.sql", "CREATE TABLE c (x int);")
    with pytest.raises(errors.MigrationChecksumMismatch) as info:
        await migrate.apply(fresh_db, tmp_path)
    assert info.value.code == "migration_checksum_mismatch"
    assert "0002_b" in info.value.detail
    conn = await asyncpg.connect(fresh_db)
    try:  # nothing after the refusal was applied
        assert await conn.fetchval("SELECT to_regclass('c')") is None
    finally:
        await conn.close()


async def test_failed_migration_rolls_back_whole_file(fresh_db: str, tmp_path: Path) -> None:
    write(tmp_path, "0001_ok.sql", "CREATE TABLE ok (x int);")
    write(tmp_path, "0002_bad.sql", "CREATE TABLE half (x int); SELECT no_such_function();")
    with pytest.raises(errors.MigrationError) as info:
        await migrate.apply(fresh_db, tmp_path)
    assert info.value.code == "migration_failed" and "0002_bad" in info.value.detail
    conn = await asyncpg.connect(fresh_db)
    try:
        assert await conn.fetchval("SELECT to_regclass('ok')") is not None
        assert await conn.fetchval("SELECT to_regclass('half')") is None
        assert await conn.fetchval("SELECT max(version) FROM runlog_migrations") == 1
    finally:
        await conn.close()


def test_bad_file_names_are_refused(tmp_path: Path) -> None:
    write(tmp_path, "1_init.sql", "SELECT 1;")
    with pytest.raises(errors.MigrationError):
        migrate.load(tmp_path)


async def test_a_gateway_on_a_schema_without_revocations_is_told_to_migrate(
    fresh_db: str, tmp_path: Path
) -> None:
    from broker.settings import Settings
    from broker.store import Store

    for m in migrate.load():
        if m.version < 3:  # the schema before token revocation
            write(tmp_path, f"{m.version:04d}_{m.name}.sql", m.sql)
    await migrate.apply(fresh_db, tmp_path)
    store = await Store.connect(fresh_db, Settings.from_env({}))
    try:
        with pytest.raises(errors.MigrationError) as e:
            await store.token_revocations()
        assert (e.value.code, e.value.hint) == ("migration_failed", "run `runlog migrate` first")
    finally:
        await store.close()
