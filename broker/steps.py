"""Durable steps of a run in PostgreSQL (`run_steps`): written by the owner.

Contract of failures: `retry.py` (`load` reads, `record` writes).

Contract of `record`: fenced like every write of the owner (`fence.py`):
StaleEpoch and nothing written unless `epoch` owns the unended run. Writing
the same `idx` again overwrites it (a step that was `started` becomes done;
an approval gets its decision) but keeps the epoch that created the row.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .fence import as_owner
from .retry import Database, reads, writes

StepKind = Literal["step", "approval"]


class StepRecord(msgspec.Struct, frozen=True, gc=False):
    """A step as stored: a row of `load`'s SELECT, in order (`StepRecord(*row)`)."""

    idx: int
    name: str
    kind: StepKind
    done: bool
    result: bytes | None
    seq: int  # the log's last seq when written
    epoch: int  # the epoch that created it
    last_epoch: int  # the epoch that wrote it last


@reads("steps read")
async def load(store: Database, run_id: str) -> list[StepRecord]:
    rows = await store.pool.fetch(
        "SELECT idx, name, kind, done, result, seq, epoch, last_epoch FROM run_steps"
        " WHERE run_id = $1 ORDER BY idx",
        run_id,
    )
    return [StepRecord(*r) for r in rows]


@writes("step record")
async def record(
    store: Database,
    *,
    run_id: str,
    epoch: int,
    idx: int,
    name: str,
    kind: StepKind,
    done: bool,
    result: bytes | None,
    seq: int,
) -> None:
    await as_owner(
        store,
        run_id,
        epoch,
        "INSERT INTO run_steps (run_id, idx, name, kind, done, result, seq, epoch, last_epoch)"
        " SELECT run_id, $3, $4, $5, $6, $7, $8, $2, $2 FROM owner"
        " ON CONFLICT (run_id, idx) DO UPDATE SET done = EXCLUDED.done,"
        " result = EXCLUDED.result, seq = EXCLUDED.seq, last_epoch = EXCLUDED.last_epoch"
        " RETURNING 1",
        idx,
        name,
        kind,
        done,
        result,
        seq,
    )
