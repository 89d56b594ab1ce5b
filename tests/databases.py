"""A database of a test's own on the private PostgreSQL (no tests here)."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg

from broker import migrate

from . import pgseed
from .helpers import KillableStack


@asynccontextmanager
async def fresh_database(killable: KillableStack, prefix: str) -> AsyncIterator[str]:
    """A new, migrated database on `killable`'s PostgreSQL (its URL), dropped
    afterwards. Its tables hold only what the test puts there: no runs other
    tests left behind (a reaper would take them over), and table sizes (so
    the plans PostgreSQL picks) that the test chooses."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    # A copy of the session's migrated template (tests/pgseed.py), not a migration.
    await migrate.create_database(killable.pg.url, name, template=pgseed.TEMPLATE)
    try:
        yield killable.pg.url_for(name)
    finally:
        await _admin(killable, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def _admin(killable: KillableStack, sql: str) -> None:
    conn = await asyncpg.connect(killable.pg.url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()
