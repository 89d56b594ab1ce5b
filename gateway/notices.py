"""Session notices: who watches a session now (presence, across gateways),
and runs queued behind earlier ones. Neither is part of the log: no cursor,
no replay, nothing stored (docs/protocol.md, "Presence and queued runs").

Contract:
- A session's watchers are the users with a session subscription to it (a
  WebSocket `subscribe` with `session_id`, or the session's SSE stream), on
  any gateway. Each such subscription gets a `presence` message with the
  sorted user ids right after it starts, and again whenever the set changes.
- Between gateways: a gateway that has watchers of a session subscribes to
  `runlog.notice.<session_id>` (core NATS) and announces its own set there
  (`control.Presence`, the whole set), at once when it changes and again
  every `presence_refresh_s`. Its first announcement says `hello`, and the
  other gateways answer with theirs, so a new viewer sees everyone within a
  message's latency. A gateway whose last watcher of a session leaves
  announces an empty set and unsubscribes; one that crashed says nothing,
  and its set is forgotten `ttl_s` (3 times its refresh) after its last
  announcement: its viewers leave within about 4 times `presence_refresh_s`.
- `run_queued`: the gateway that creates a run behind earlier unended runs
  of its session (run policy `enqueue` or `interrupt`) sends
  `control.RunQueued`; every gateway passes it to its watchers of the
  session. At most once: a watcher that missed it learns of the run from
  GET /v1/sessions/{id} (`queued`) or from its `run_start`.

One task does the NATS work (subscribing, announcing, refreshing) for every
session in turn; the hub's hooks only note what changed and wake it, so a
subscribe or an unsubscribe never waits on NATS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.subscription import Subscription

from broker import control
from broker.bus import Bus

from .presence import PresenceTable, watching

if TYPE_CHECKING:
    from .hub import Member

log = logging.getLogger(__name__)

_NATS_ERRORS = (nats.errors.Error, OSError, TimeoutError)


class _Followed:
    """A session this gateway has watchers of."""

    def __init__(self) -> None:
        self.sub: Subscription | None = None
        self.table = PresenceTable()
        self.announced: list[str] | None = None  # our set as last sent
        self.shown: list[str] | None = None  # the watchers as last told to ours
        self.answer = False  # another gateway said hello: announce ours again


class Notices:
    def __init__(self, bus: Bus, refresh_s: float) -> None:
        self.bus = bus
        self.origin = secrets.token_hex(8)  # this gateway, in its announcements
        self.refresh_s = refresh_s  # presence_refresh_s
        self._watchers: dict[str, set[Member]] = {}  # session -> its subscriptions here
        self._fresh: dict[str, set[Member]] = {}  # joined, not told who watches yet
        self._followed: dict[str, _Followed] = {}
        self._dirty: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="runlog-notices")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sid, f in list(self._followed.items()):
            await self._announce(sid, [])
            await _unsubscribe(f)
        self._followed.clear()

    # -- the hub's hooks (no await: they only note the change)

    def joined(self, session_id: str, member: Member) -> None:
        self._watchers.setdefault(session_id, set()).add(member)
        self._fresh.setdefault(session_id, set()).add(member)
        self._changed(session_id)

    def left(self, session_id: str, member: Member) -> None:
        watchers = self._watchers.get(session_id)
        if watchers is not None:
            watchers.discard(member)
            if not watchers:
                del self._watchers[session_id]
        fresh = self._fresh.get(session_id)
        if fresh is not None:
            fresh.discard(member)
        self._changed(session_id)

    def _changed(self, session_id: str) -> None:
        self._dirty.add(session_id)
        self._wake.set()

    # -- runs queued

    async def run_queued(self, session_id: str, run_id: str, user: str, input: str) -> None:
        """Tell every gateway's watchers of the session (the run row is the fact:
        a failure is logged, not raised)."""
        msg = control.RunQueued(
            session_id=session_id, run_id=run_id, started_by=user,
            input=input[: control.QUEUED_INPUT_CHARS], created_at=int(time.time() * 1000),
        )  # fmt: skip
        try:
            await self.bus.publish_notice(msg)
        except _NATS_ERRORS as e:
            log.warning("run_queued notice not sent (the run shows once it starts): %r", e)

    # -- from other gateways

    def _on_notice(self, n: control.SessionNotice) -> None:
        match n:
            case control.Presence():
                f = self._followed.get(n.session_id)
                if n.origin == self.origin or f is None:
                    return
                now = asyncio.get_running_loop().time()
                changed = f.table.announce(n.origin, n.users, n.ttl_s, now)
                if n.hello:
                    f.answer = True
                if changed or n.hello:
                    self._changed(n.session_id)
            case control.RunQueued():
                run = {
                    "run_id": n.run_id, "started_by": n.started_by, "input": n.input,
                    "created_at": n.created_at,
                }  # fmt: skip
                for m in self._watchers.get(n.session_id, ()):
                    m.conn.notice("run_queued", topic=f"session:{n.session_id}", run=run)

    # -- the one task that talks to NATS

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_refresh = loop.time() + self.refresh_s
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_refresh - loop.time())):
                    await self._wake.wait()
            self._wake.clear()
            refresh = loop.time() >= next_refresh
            if refresh:
                next_refresh = loop.time() + self.refresh_s
            sessions = self._dirty | (set(self._followed) if refresh else set())
            self._dirty = set()
            for sid in sessions:
                try:
                    await self._sync(sid, refresh)
                except Exception:
                    log.exception("presence of session %s not updated", sid)

    async def _sync(self, sid: str, refresh: bool) -> None:
        f = self._followed.get(sid)
        if not self._watchers.get(sid):
            if f is not None:
                del self._followed[sid]
                await self._announce(sid, [])
                await _unsubscribe(f)
            return
        hello = f is None
        if f is None:
            f = self._followed[sid] = _Followed()
        if f.sub is None:  # new, or NATS refused it last time
            try:
                f.sub = await self.bus.subscribe_notices(sid, self._on_notice)
            except _NATS_ERRORS as e:
                log.warning("presence of session %s: cannot subscribe (%r)", sid, e)
        local = sorted({m.conn.user for m in self._watchers.get(sid, ()) if m.conn.user})
        if hello or refresh or f.answer or local != f.announced:
            f.answer = False
            f.announced = local
            await self._announce(sid, local, hello=hello)
        if self._followed.get(sid) is not f:
            return  # left meanwhile: a later round announced that
        now = asyncio.get_running_loop().time()
        f.table.expire(now)
        # From here on no await: who is told is what the set is now.
        watchers = self._watchers.get(sid, set())
        users = watching({m.conn.user for m in watchers if m.conn.user}, f.table, now)
        fresh = self._fresh.pop(sid, set())
        told = watchers if users != f.shown else fresh & watchers
        f.shown = users
        for m in told:
            m.conn.notice("presence", topic=f"session:{sid}", users=users)

    async def _announce(self, sid: str, users: list[str], *, hello: bool = False) -> None:
        msg = control.Presence(
            session_id=sid, origin=self.origin, users=users, ttl_s=3 * self.refresh_s,
            hello=hello,
        )  # fmt: skip
        try:
            await self.bus.publish_notice(msg)
        except _NATS_ERRORS as e:
            log.warning("presence of session %s not announced: %r", sid, e)


async def _unsubscribe(f: _Followed) -> None:
    if f.sub is not None:
        with contextlib.suppress(*_NATS_ERRORS):
            await f.sub.unsubscribe()
        f.sub = None
