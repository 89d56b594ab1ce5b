"""A PostgreSQL data folder made once per test session (no tests here).

initdb and the migrations take seconds; every embedded PostgreSQL of the suite
(the `stack` and `killable` servers, each `runlog up` of tests/test_up.py) used
to pay them. Instead `seed(root)` runs initdb once, applies the migrations to
the `runlog` database, stops the server cleanly (a checkpoint: nothing to
recover) and keeps the folder, in which `TEMPLATE` is a copy of that database
that no session ever opens (so `CREATE DATABASE x TEMPLATE runlog_template`
works on a busy server: tests/databases.py). `copy_to(seed, dest)` gives a
server a copy of the folder, already migrated, which PostgresProcess starts
without initdb, as it does any existing data folder. (As root the copy is root's: PostgresProcess
hands a folder that is not its server user's to that user, as always.)
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from broker import migrate
from runlog.embedded import PG_DATABASE, PostgresProcess

TEMPLATE = "runlog_template"  # a migrated database to copy, never connected to

_made: dict[Path, Path] = {}
_lock = asyncio.Lock()


async def seed(root: Path) -> Path:
    """The seed folder under `root`, made on the first call of the session."""
    async with _lock:
        if root not in _made:
            folder = root / "pg-seed"
            pg = PostgresProcess(folder, fast_init=True)
            await pg.start()
            try:
                await migrate.apply(pg.url)
                await migrate.create_database(
                    pg.url_for("postgres"), TEMPLATE, template=PG_DATABASE
                )
            finally:
                await pg.stop()
            (folder / "postgres.log").unlink(missing_ok=True)  # each copy logs its own
            _made[root] = folder
        return _made[root]


def copy_to(seed_dir: Path, dest: Path) -> None:
    """`dest` (which must not exist) becomes a copy of the seed folder."""
    shutil.copytree(seed_dir, dest, symlinks=True)
