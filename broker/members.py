"""Membership changes: add a member, change a role, remove a member.

Contract: a session never loses its last owner. Each change runs in the
caller's transaction, which first locks the session's owner rows (`FOR
UPDATE`, in user_id order, so concurrent changers queue up rather than
deadlock) and counts them: removing or demoting the only owner raises
LastOwner and changes nothing. Every change of one session therefore waits
for the one before it; two owners demoting (or removing) each other at the
same time leave exactly one owner, because the second change sees the first
one's result. Under the same lock the actor must still be an owner (it may
have been demoted since its request was authorized), else Forbidden.

The order of the checks is part of the contract: not a member
(MemberNotFound), then the last owner (LastOwner), then the actor (Forbidden).

`lowers` says which changes take access away (a removal or a demotion):
those end the user's open streams of the session (gateway/access.py).

Contract of failures: `retry.py` (`stream_roles` reads; `change` runs in its
caller's transaction, `Store.change_member`, which writes).
"""

from __future__ import annotations

import asyncpg

from . import errors
from .retry import Database, reads

# Higher can do more (see gateway/auth.py for what each role may do).
RANKS = {"viewer": 0, "approver": 1, "owner": 2}


def lowers(before: str | None, after: str | None) -> bool:
    """Whether a member going from role `before` to `after` (None: not a
    member) loses something: removed, or demoted to a lesser role."""
    if before is None:
        return False
    return after is None or RANKS[after] < RANKS[before]


def check(owners: list[str], actor: str, target: str, after: str | None) -> None:
    """Raise unless `actor` may give `target` the role `after` (None: remove),
    given the session's current `owners` (pure: the rule without the SQL)."""
    if target in owners and after != "owner" and len(owners) == 1:
        raise errors.LastOwner(
            f"{target!r} is the session's last owner",
            hint="make another member owner first",
        )
    if actor not in owners:
        raise errors.Forbidden("only owners may change members (you are no longer one)")


async def change(
    conn: asyncpg.Connection,
    session_id: str,
    user_id: str,
    role: str | None,
    by: str,
    *,
    must_exist: bool,
) -> str | None:
    """Give `user_id` the role `role` in the session (None: remove it), as `by`,
    inside the caller's transaction. Returns the role it had before (None: it
    was not a member, which is MemberNotFound when `must_exist`)."""
    owners = [
        r[0]
        for r in await conn.fetch(
            "SELECT user_id FROM members WHERE session_id = $1 AND role = 'owner'"
            " ORDER BY user_id FOR UPDATE",
            session_id,
        )
    ]
    if not owners and not await conn.fetchval(
        "SELECT 1 FROM sessions WHERE session_id = $1", session_id
    ):
        raise errors.SessionNotFound(f"no session {session_id}")
    before: str | None = await conn.fetchval(
        "SELECT role FROM members WHERE session_id = $1 AND user_id = $2", session_id, user_id
    )
    if before is None and (must_exist or role is None):
        raise errors.MemberNotFound(f"{user_id!r} is not a member of session {session_id}")
    check(owners, by, user_id, role)
    if role is None:
        await conn.execute(
            "DELETE FROM members WHERE session_id = $1 AND user_id = $2", session_id, user_id
        )
        return before
    try:
        await conn.execute(
            "INSERT INTO members (session_id, user_id, role, added_by) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (session_id, user_id) DO UPDATE SET role = EXCLUDED.role",
            session_id,
            user_id,
            role,
            by,
        )
    except asyncpg.ForeignKeyViolationError as e:
        raise errors.SessionNotFound(f"no session {session_id}") from e
    return before


@reads("roles read")
async def stream_roles(
    store: Database, streams: list[tuple[str, str, str]]
) -> list[tuple[str | None, str | None]]:
    """For each open stream (user_id, kind "run"/"session", id): (its session,
    the user's role there, None if not a member), in one query for all."""
    if not streams:
        return []
    users, kinds, idents = (list(col) for col in zip(*streams, strict=True))
    rows = await store.pool.fetch(
        "SELECT s.sid, m.role"
        " FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS t(u, kind, ident, i)"
        " LEFT JOIN runs r ON t.kind = 'run' AND r.run_id = t.ident"
        " CROSS JOIN LATERAL"
        " (SELECT CASE WHEN t.kind = 'run' THEN r.session_id ELSE t.ident END AS sid) s"
        " LEFT JOIN members m ON m.session_id = s.sid AND m.user_id = t.u"
        " ORDER BY t.i",
        users,
        kinds,
        idents,
    )
    return [(r[0], r[1]) for r in rows]
