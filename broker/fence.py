"""Writes made on a run's behalf by its owner, fenced by the owner's epoch.

The check is part of the write's own statement, and it locks the run's row
(FOR SHARE), which a takeover's epoch bump must wait for: either the write
commits first (and the new owner sees it), or it sees the new epoch. So a
worker that was paused or partitioned while it owned the run — even one
whose statement was already on its way — writes nothing for a run it no
longer owns. Used by approvals (`approvals.py`) and steps (`steps.py`), whose
functions (`retry.writes`) say how a failure is told.
"""

from __future__ import annotations

from . import errors
from .retry import Database

# The run's row, while `epoch` owns it: the write happens only if it is there.
OWNER = """owner AS (SELECT run_id FROM runs
    WHERE run_id = $1 AND owner_epoch = $2 AND ended_at IS NULL FOR SHARE)"""


async def as_owner(store: Database, run_id: str, epoch: int, write: str, *args: object) -> int:
    """Run `write` (a statement that writes only rows joined to `owner`, with
    RETURNING; its own parameters start at $3) as the run's owner; return how
    many rows it wrote. StaleEpoch if `epoch` no longer owns the run."""
    row = await store.pool.fetchrow(
        f"WITH {OWNER}, w AS ({write}) SELECT EXISTS (SELECT FROM owner), (SELECT count(*) FROM w)",
        run_id,
        epoch,
        *args,
    )
    assert row is not None
    if not row[0]:
        raise errors.StaleEpoch(
            f"run {run_id}: epoch {epoch} is no longer the owner's, or the run has ended;"
            " nothing was written"
        )
    return int(row[1])
