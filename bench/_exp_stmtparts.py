"""Experiment, not a benchmark: PostgreSQL's CPU for the append statement
(`broker/log.py` `_APPEND`), its parts and variants, in isolation
(docs/performance.md, "Paced, third pass"):

    .venv/bin/python -m bench._exp_stmtparts                     # every variant, twice
    .venv/bin/python -m bench._exp_stmtparts full nolock full nolock
    PER=20 N=1000 .venv/bin/python -m bench._exp_stmtparts full

An embedded PostgreSQL (`_lib.stack()`), RUNS runs (default 100) in as many
sessions, one connection sending N statements (default 1,500) of PER
one-event run slices (default 10: the paced load's shape) back to back;
`VACUUM ANALYZE` of runs and sessions before each variant. Prints that
backend's psutil CPU (user+system) per statement and per event, and this
process's. psutil reads 10 ms ticks: keep N x the statement's cost well
above that, and alternate variants.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import sys
import time
from collections.abc import Callable

import asyncpg
import psutil

from broker import log

from . import _lib

RUNS = int(os.environ.get("RUNS", "100"))
PER = int(os.environ.get("PER", "10"))
N = int(os.environ.get("N", "1500"))
PAYLOAD = (
    b'{"type":"text_delta","run_id":"r_xxxxxxxxxxxxxxxxxxxxxx","session_id":'
    b'"s_xxxxxxxxxxxxxxxxxxxxxx","seq":1,"ts":1764600000000,"message_id":"m_0001",'
    b'"delta":" token"}'
)


def _variant(old: str, new: str) -> str:
    assert old in log._APPEND, f"the statement changed: {old!r} is gone"
    return log._APPEND.replace(old, new, 1)


_LOCK = """SELECT sessions.session_id FROM sessions JOIN per_session USING (session_id)
    ORDER BY sessions.session_id FOR NO KEY UPDATE OF sessions"""
_CASES = """,
        status = COALESCE(u.end_status, runs.status),
        ended_at = CASE WHEN u.end_status IS NULL THEN runs.ended_at ELSE now() END,
        checkpoint = CASE WHEN u.end_status IS NULL THEN runs.checkpoint END
"""
# Variants of the whole statement (same arguments, same result).
STATEMENTS = {
    "full": log._APPEND,
    "nolock": _variant(_LOCK, "SELECT session_id FROM per_session"),
    "lastseq": _variant(_CASES, "\n"),
    "mat": _variant("WITH u AS (", "WITH u AS MATERIALIZED ("),
    "noany": _variant("runs.run_id = ANY($1::text[])\n        AND ", ""),
}
# Parts alone, each its own statement and commit: (sql, which of seq/cursor it advances).
PARTS = {
    "trivial": "UPDATE sessions SET last_cursor = last_cursor WHERE session_id = $1",
    "fence": """
WITH u AS (SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS u(run_id, epoch, base))
UPDATE runs SET last_seq = u.base + 1 FROM u
WHERE runs.run_id = ANY($1::text[]) AND runs.run_id = u.run_id AND runs.owner_epoch = u.epoch
    AND runs.last_seq = u.base AND runs.ended_at IS NULL""",
    "runsany": "UPDATE runs SET last_seq = last_seq + 1 WHERE run_id = ANY($1::text[])",
    "cursors": "UPDATE sessions SET last_cursor = last_cursor + 1 WHERE session_id = ANY($1::text[])",
    "insert": """
INSERT INTO events (run_id, seq, session_id, cursor, ts, type, payload)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[],
    $6::text[], $7::bytea[])""",
}


class _Run:
    def __init__(self, run_id: str, session_id: str) -> None:
        self.run_id, self.session_id, self.seq, self.cursor = run_id, session_id, 0, 0


async def _one(conn: asyncpg.Connection, v: str, pick: list[_Run]) -> None:
    ids = [r.run_id for r in pick]
    ones = [1] * len(pick)
    if v in STATEMENTS:
        rows = await conn.fetch(
            STATEMENTS[v], ids, ones, [r.seq for r in pick], ones, [None] * len(pick),
            list(range(len(pick))), [1764600000000] * len(pick), ["text_delta"] * len(pick),
            [PAYLOAD] * len(pick),
        )  # fmt: skip
        assert len(rows) == len(pick), "a slice was refused: the script's state drifted"
    elif v == "trivial":
        await conn.execute(PARTS[v], pick[0].session_id)
    elif v == "fence":
        await conn.execute(PARTS[v], ids, ones, [r.seq for r in pick])
    elif v == "runsany":
        await conn.execute(PARTS[v], ids)
    elif v == "cursors":
        await conn.execute(PARTS[v], sorted(r.session_id for r in pick))
    elif v == "insert":
        await conn.execute(
            PARTS[v], ids, [r.seq + 1 for r in pick], [r.session_id for r in pick],
            [r.cursor + 1 for r in pick], [1764600000000] * len(pick),
            ["text_delta"] * len(pick), [PAYLOAD] * len(pick),
        )  # fmt: skip
    else:
        raise SystemExit(f"unknown variant {v!r}: {', '.join([*STATEMENTS, *PARTS])}")
    for r in pick:
        r.seq += v in (*STATEMENTS, "fence", "runsany", "insert")
        r.cursor += v in (*STATEMENTS, "cursors", "insert")


async def _resync(conn: asyncpg.Connection, runs: list[_Run]) -> None:
    """Runs and sessions as the events say (a part alone leaves them apart)."""
    await conn.execute(
        "UPDATE runs SET last_seq = coalesce("
        "(SELECT max(seq) FROM events e WHERE e.run_id = runs.run_id), 0)"
    )
    await conn.execute(
        "UPDATE sessions SET last_cursor = coalesce("
        "(SELECT max(cursor) FROM events e WHERE e.session_id = sessions.session_id), 0)"
    )
    for r in runs:
        r.seq = await conn.fetchval("SELECT last_seq FROM runs WHERE run_id = $1", r.run_id)
        r.cursor = await conn.fetchval(
            "SELECT last_cursor FROM sessions WHERE session_id = $1", r.session_id
        )
    await conn.execute("VACUUM ANALYZE runs")
    await conn.execute("VACUUM ANALYZE sessions")


async def main(variants: list[str]) -> None:
    async with _lib.stack() as st:
        conn = await asyncpg.connect(st.database_url)
        try:
            runs = []
            for _ in range(RUNS):
                r = _Run(f"r_{secrets.token_urlsafe(16)}", f"s_{secrets.token_urlsafe(16)}")
                await conn.execute("INSERT INTO sessions (session_id) VALUES ($1)", r.session_id)
                await conn.execute(
                    "INSERT INTO runs (run_id, session_id, status, owner_epoch)"
                    " VALUES ($1, $2, 'running', 1)",
                    r.run_id,
                    r.session_id,
                )
                runs.append(r)
            backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
            cpu: Callable[[], float] = lambda: sum(backend.cpu_times()[:2])  # noqa: E731
            for v in variants:
                await _resync(conn, runs)
                pg0, me0 = cpu(), time.process_time()
                for _ in range(N):
                    pick = sorted(random.sample(runs, PER), key=lambda r: r.run_id)
                    await _one(conn, v, pick)
                pg, me = cpu() - pg0, time.process_time() - me0
                print(
                    f"{v:8s} PostgreSQL backend {1e6 * pg / N:6.0f} µs/statement"
                    f" {1e6 * pg / N / PER:5.1f} µs/event; this process"
                    f" {1e6 * me / N / PER:5.1f} µs/event",
                    flush=True,
                )
        finally:
            await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:] or [*STATEMENTS, *PARTS] * 2))
