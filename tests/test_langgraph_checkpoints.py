"""The LangGraph checkpointer's tables are runlog's migrations' (issue 23,
item 2; migrations/0011_langgraph_checkpoints.sql), against a real
PostgreSQL: they are exactly what the installed langgraph-checkpoint-postgres's
`setup()` creates, a `setup()` after them does nothing, and the adapter
checkpoints a graph in a migrated database without ever calling `setup()`.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypedDict

import asyncpg
import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from broker import migrate
from workers.api import AgentError
from workers.frameworks.langgraph import Checkpoints

from .helpers import Stack

_Fresh = Callable[[], AbstractAsyncContextManager[str]]


@pytest.fixture
def fresh(stack: Stack) -> _Fresh:
    """`async with fresh() as url`: an empty database on the shared server, dropped after."""

    @asynccontextmanager
    async def database() -> AsyncIterator[str]:
        name = "lgc_" + secrets.token_hex(6)
        admin = await asyncpg.connect(stack.database_url)
        try:
            await admin.execute(f"CREATE DATABASE {name}")
            base, _, _ = stack.database_url.rpartition("/")
            yield f"{base}/{name}"
        finally:
            await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
            await admin.close()

    return database


async def _setup(url: str) -> None:
    """What the saver's own documentation says to do first (runlog never does)."""
    async with await psycopg.AsyncConnection.connect(
        url, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        await AsyncPostgresSaver(conn).setup()


async def _schema(url: str, tables: list[str]) -> dict[str, list[tuple[Any, ...]]]:
    """The columns, constraints and indexes of `tables`, and the saver's bookkeeping."""
    conn = await asyncpg.connect(url)
    try:
        columns = await conn.fetch(
            "SELECT table_name, ordinal_position, column_name, data_type, is_nullable,"
            " column_default FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = ANY($1::text[]) ORDER BY 1, 2",
            tables,
        )
        constraints = await conn.fetch(
            "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid)"
            " FROM pg_constraint WHERE conrelid::regclass::text = ANY($1::text[]) ORDER BY 1, 2",
            tables,
        )
        indexes = await conn.fetch(
            "SELECT tablename, indexname, indexdef FROM pg_indexes"
            " WHERE schemaname = 'public' AND tablename = ANY($1::text[]) ORDER BY 1, 2",
            tables,
        )
        versions = await conn.fetch("SELECT v FROM checkpoint_migrations ORDER BY v")
    finally:
        await conn.close()
    return {
        "columns": [tuple(r) for r in columns],
        "constraints": [tuple(r) for r in constraints],
        "indexes": [tuple(r) for r in indexes],
        "versions": [tuple(r) for r in versions],
    }


async def _column(url: str, sql: str) -> list[object]:
    """The first column of `sql`'s rows, on a connection of its own."""
    conn = await asyncpg.connect(url)
    try:
        return [r[0] for r in await conn.fetch(sql)]
    finally:
        await conn.close()


async def _tables(url: str) -> list[str]:
    return [
        str(t)
        for t in await _column(
            url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
        )
    ]


async def test_the_migrations_create_what_setup_creates(fresh: _Fresh) -> None:
    async with fresh() as by_setup, fresh() as by_migrate:
        await _setup(by_setup)
        await migrate.apply(by_migrate)
        tables = await _tables(by_setup)
        assert tables == [
            "checkpoint_blobs", "checkpoint_migrations", "checkpoint_writes", "checkpoints",
        ]  # fmt: skip
        assert set(tables) <= set(await _tables(by_migrate))
        expected = await _schema(by_setup, tables)
        assert expected["versions"] == [(v,) for v in range(len(AsyncPostgresSaver.MIGRATIONS))]
        assert await _schema(by_migrate, tables) == expected
        # setup() on a migrated database finds nothing to do.
        await _setup(by_migrate)
        assert await _schema(by_migrate, tables) == expected


async def test_the_migration_keeps_the_tables_setup_made(fresh: _Fresh) -> None:
    """A deployment whose workers ran setup() before this version: migrating
    keeps its tables and their rows."""
    async with fresh() as url:
        await _setup(url)
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(
                "INSERT INTO checkpoints (thread_id, checkpoint_id, checkpoint)"
                " VALUES ('t', 'c', '{}')"
            )
            await migrate.apply(url)
            assert await conn.fetchval("SELECT count(*) FROM checkpoints") == 1
        finally:
            await conn.close()


class _State(TypedDict):
    n: int


async def test_the_adapter_checkpoints_without_setup(
    fresh: _Fresh, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refused(self: AsyncPostgresSaver) -> None:
        raise AssertionError("the adapter called setup()")

    monkeypatch.setattr(AsyncPostgresSaver, "setup", refused)
    builder = StateGraph(_State)
    builder.add_node("inc", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "inc")
    builder.add_edge("inc", END)
    config: RunnableConfig = {"configurable": {"thread_id": "run-1"}}
    async with fresh() as url:
        await migrate.apply(url)
        checkpoints = Checkpoints(2)
        try:
            graph = builder.compile(checkpointer=await checkpoints.saver(url))
            assert await graph.ainvoke({"n": 1}, config) == {"n": 2}
            assert (await graph.aget_state(config)).values == {"n": 2}
        finally:
            await checkpoints.aclose()
        [stored] = await _column(url, "SELECT count(*) FROM checkpoints WHERE thread_id = 'run-1'")
        assert isinstance(stored, int) and stored > 0


async def test_an_unmigrated_database_is_told_to_migrate(fresh: _Fresh) -> None:
    async with fresh() as url:
        checkpoints = Checkpoints(1)
        try:
            with pytest.raises(AgentError) as info:
                await checkpoints.saver(url)
        finally:
            await checkpoints.aclose()
        assert info.value.code == "checkpoint_unavailable"
        assert "runlog migrate" in info.value.message
        assert await _tables(url) == []  # and nothing was created
