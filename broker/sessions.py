"""Sessions as their members manage them: the list (pages, title search,
archived or not) and the settings an owner changes (title, run policy,
exposure policies, archived).

Contract of the list: a member's sessions, newest first, ordered by
(created_at, session_id) descending, so that the order is total and a page
cursor (`PageKey`, the last row's key) resumes exactly after that row: no
session is skipped or repeated across pages, whatever is created meanwhile
(new sessions go before the first page, not into the middle). A title
search is a substring of the title, case folded (`fold`: Python's
casefold, stored with the title, so it is the same whatever the database's
locale), among the member's own sessions: it is bounded by the member's
sessions, which `members_user_idx` finds (migration 0006).

Contract of the settings: `update` changes the fields given (None keeps one)
in one transaction that locks the session row, with one audit row per field
group given (`rename_session`, `set_run_policy`, `set_stream_policy`,
`archive_session` / `unarchive_session`), each with the value before. An
archived session takes no new run (`Store.create_run_checked` checks it
under the same row lock); archiving ends nothing that is running.

Contract of failures: `retry.py` (`page` reads; `update` runs in its
caller's transaction, `Store.update_session`, which writes).
"""

from __future__ import annotations

import datetime as dt

import asyncpg
import msgspec

from . import errors, ids
from .retry import Database, reads

RUN_POLICIES = ("reject", "enqueue", "interrupt")
PAGE_SIZE = 100  # sessions per page of GET /v1/sessions
QUERY_MAX_CHARS = 200  # a title search (`?q=`)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_US = dt.timedelta(microseconds=1)
_MAX_US = (dt.datetime(9999, 12, 31, tzinfo=dt.UTC) - _EPOCH) // _US  # Python's last date


class PageKey(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Where a page of the list ends: its last session's (created_at, id)."""

    created_at_us: int
    session_id: str

    def encode(self) -> str:
        return f"{self.created_at_us}.{self.session_id}"

    @classmethod
    def decode(cls, raw: str) -> PageKey:
        """The key a page gave (`next_before`), or InvalidCursor."""
        us, dot, sid = raw.partition(".")
        ok = (
            dot
            and us.isascii()
            and us.isdigit()
            and len(us) <= 18
            and ids.is_valid(sid, ids.SESSION)
        )
        if not ok or int(us) > _MAX_US:
            raise errors.InvalidCursor("before must be a next_before that a page gave")
        return cls(created_at_us=int(us), session_id=sid)


class SessionSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    session_id: str
    title: str
    role: str  # the member's
    head: int
    created_at_ms: int
    archived_at_ms: int | None = None
    key: PageKey | None = None  # where a page ending with it ends


class Settings(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What an owner changes (PATCH /v1/sessions/{id})."""

    title: str
    run_policy: str
    include_thinking: bool
    include_tool_calls: bool
    archived_at_ms: int | None


class Changes(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The fields a PATCH gives (None: keep it)."""

    title: str | None = None
    run_policy: str | None = None
    include_thinking: bool | None = None
    include_tool_calls: bool | None = None
    archived: bool | None = None


def fold(title: str) -> str:
    """A title (or a search of titles) as the search compares it."""
    return title.casefold()


def _us(t: dt.datetime) -> int:
    return (t - _EPOCH) // _US


def ms(t: dt.datetime | None) -> int | None:
    """A stored time as ms since the epoch (floored, exact), or None."""
    return None if t is None else _us(t) // 1000


@reads("sessions read")
async def page(
    store: Database, user_id: str, *, query: str = "",
    archived: bool = False, before: PageKey | None = None, limit: int = PAGE_SIZE,
) -> tuple[list[SessionSummary], PageKey | None]:  # fmt: skip
    """One page of `user_id`'s sessions (archived ones, or the others) whose
    title contains `query` (any case; "" : all), after `before`. Returns the
    page and the key of its last row when more follow (None: the last page)."""
    cut = None if before is None else _EPOCH + before.created_at_us * _US
    rows = await store.pool.fetch(
        "SELECT s.session_id, s.title, m.role, s.last_cursor, s.created_at, s.archived_at"
        " FROM members m JOIN sessions s USING (session_id)"
        " WHERE m.user_id = $1 AND (s.archived_at IS NOT NULL) = $2"
        " AND ($3 = '' OR strpos(s.title_folded, $3) > 0)"
        " AND ($4::timestamptz IS NULL OR (s.created_at, s.session_id) < ($4, $5::text))"
        " ORDER BY s.created_at DESC, s.session_id DESC LIMIT $6",
        user_id,
        archived,
        fold(query),
        cut,
        "" if before is None else before.session_id,
        limit + 1,
    )
    out = [
        SessionSummary(
            session_id=r[0], title=r[1], role=r[2], head=r[3], created_at_ms=ms(r[4]) or 0,
            archived_at_ms=ms(r[5]), key=PageKey(created_at_us=_us(r[4]), session_id=r[0]),
        )
        for r in rows[:limit]
    ]  # fmt: skip
    return out, (out[-1].key if len(rows) > limit else None)


def _settings(row: asyncpg.Record) -> Settings:
    return Settings(
        title=row[0],
        run_policy=row[1],
        include_thinking=row[2],
        include_tool_calls=row[3],
        archived_at_ms=ms(row[4]),
    )


_SETTINGS = "title, run_policy, include_thinking, include_tool_calls, archived_at"


def audit_rows(
    before: Settings, after: Settings, c: Changes
) -> list[tuple[str, dict[str, object]]]:
    """(action, detail) of each field group `c` gives (pure: the audit's shape)."""
    out: list[tuple[str, dict[str, object]]] = []
    if c.title is not None:
        out.append(("rename_session", {"title": after.title, "previous": before.title}))
    if c.run_policy is not None:
        out.append(
            ("set_run_policy", {"run_policy": after.run_policy, "previous": before.run_policy})
        )
    if c.include_thinking is not None or c.include_tool_calls is not None:
        out.append((
            "set_stream_policy",
            {"include_thinking": after.include_thinking,
             "include_tool_calls": after.include_tool_calls,
             "previous": {"include_thinking": before.include_thinking,
                          "include_tool_calls": before.include_tool_calls}},
        ))  # fmt: skip
    if c.archived is not None:
        out.append((
            "archive_session" if c.archived else "unarchive_session",
            {"archived_at": after.archived_at_ms, "previous": before.archived_at_ms},
        ))  # fmt: skip
    return out


async def update(
    conn: asyncpg.Connection, session_id: str, c: Changes
) -> tuple[Settings, Settings]:
    """Apply `c` inside the caller's transaction (the row locked first).
    Returns (before, after). Archiving an archived session keeps its time."""
    if c.run_policy is not None and c.run_policy not in RUN_POLICIES:
        raise errors.ClientError(f"run_policy must be one of {', '.join(RUN_POLICIES)}")
    row = await conn.fetchrow(
        f"SELECT {_SETTINGS} FROM sessions WHERE session_id = $1 FOR UPDATE", session_id
    )
    if row is None:
        raise errors.SessionNotFound(f"no session {session_id}")
    before = _settings(row)
    row = await conn.fetchrow(
        "UPDATE sessions SET title = coalesce($2, title),"
        " title_folded = coalesce($7, title_folded), run_policy = coalesce($3, run_policy),"
        " include_thinking = coalesce($4, include_thinking),"
        " include_tool_calls = coalesce($5, include_tool_calls),"
        " archived_at = CASE WHEN $6::boolean IS NULL THEN archived_at"
        " WHEN $6 THEN coalesce(archived_at, now()) END"
        f" WHERE session_id = $1 RETURNING {_SETTINGS}",
        session_id, c.title, c.run_policy, c.include_thinking, c.include_tool_calls, c.archived,
        None if c.title is None else fold(c.title),
    )  # fmt: skip
    return before, _settings(row)
