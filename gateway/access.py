"""Access that ends while streams are open: members removed or demoted, and
users' tokens revoked.

Contract (docs/protocol.md, "When access ends"):
- A member removed from a session or demoted (to any lesser role): every
  gateway ends that user's open streams of the session (the session's and its
  runs') with code `forbidden`. An SSE stream ends with `event: disconnect`;
  a WebSocket subscription ends with an `unsubscribed` message carrying the
  code and its cursor, and the socket stays open with its other
  subscriptions. A demoted member that may still read can subscribe again.
- A user's tokens revoked (`runlog revoke`, a `not_before` per user): every
  gateway refuses that user's tokens issued before it (401 `token_revoked`,
  on every request and WebSocket `auth`) and ends the connections they
  opened (disconnect `token_revoked`, `reconnect: reauth`).
- Bound: the change commits in PostgreSQL, then goes to every gateway as a
  message on core NATS (`runlog.access`), which acts on it at once. Core NATS
  may lose a message (a gateway disconnected at that moment), so every
  `access_recheck_s` each gateway re-reads the revocations and, in one query
  for all its open streams, their users' current roles, and ends what a lost
  message would have: normally the message's latency, `access_recheck_s` at
  worst.

Revocations live in memory (read at start, then updated by messages and the
re-check), so checking a token costs no query. To find demotions, the
re-check compares a user's current role in a session with the role last seen
there (when one of its streams was authorized, or at the previous re-check).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from typing import TYPE_CHECKING, Protocol

import nats.errors
from nats.aio.subscription import Subscription

from broker import control, errors, members
from broker.bus import Bus

from .auth import Principal
from .connection import Connection, State

if TYPE_CHECKING:
    from broker.runtime import Broker
    from broker.settings import Settings

    from .metrics import GatewayMetrics

log = logging.getLogger(__name__)


async def send(bus: Bus, msg: control.AccessChange) -> bool:
    """Publish an access change that PostgreSQL already holds. A failure is
    logged, not raised: every gateway finds the change at its next re-check."""
    try:
        await bus.publish_access(msg)
        return True
    except (nats.errors.Error, OSError, TimeoutError) as e:
        log.warning("access change not sent (gateways apply it at their next re-check): %r", e)
        return False


class Host(Protocol):
    """What access control needs of its gateway (context.py's `Gateway`, which
    owns it and so is not imported here)."""

    @property
    def broker(self) -> Broker: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def connections(self) -> set[Connection]: ...
    async def run_session(self, run_id: str) -> str: ...


class Access:
    def __init__(self, gw: Host) -> None:
        self.gw = gw
        self.origin = secrets.token_hex(8)  # tells this gateway's own messages apart
        self.not_before: dict[str, float] = {}  # user -> s since the epoch
        self._roles: dict[tuple[str, str], str] = {}  # (user, session) -> role last seen
        self._sub: Subscription | None = None
        self._recheck: asyncio.Task[None] | None = None

    async def start(self) -> None:
        # Subscribed before the first read, so no revocation falls in between.
        self._sub = await self.gw.broker.bus.subscribe_access(self._on_message)
        for user, not_before in (await self.gw.broker.store.token_revocations()).items():
            self._revoke(user, not_before)
        self._recheck = asyncio.create_task(self._recheck_loop(), name="runlog-access-recheck")

    async def close(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._recheck
        if self._sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await self._sub.unsubscribe()

    # -- tokens

    def check(self, p: Principal) -> None:
        """Raise TokenRevoked if `p`'s token was issued before its user's not_before."""
        not_before = self.not_before.get(p.user)
        if not_before is not None and p.issued_at < not_before:
            raise errors.TokenRevoked(
                "this token was revoked (issued before its user's tokens were revoked)",
                hint="get a new token",
            )

    def _revoke(self, user: str, not_before: float) -> None:
        self.not_before[user] = max(not_before, self.not_before.get(user, 0.0))

    def _end_revoked(self, via: str, user: str | None = None) -> None:
        for conn in list(self.gw.connections):
            if not conn.user or conn.state is not State.OPEN:
                continue
            if user is not None and conn.user != user:
                continue
            not_before = self.not_before.get(conn.user)
            if not_before is not None and conn.issued_at < not_before:
                conn.close("token_revoked")
                self.gw.metrics.access_ended.labels("token_revoked", via).inc()

    # -- roles

    async def noted(self, user: str, session_id: str, role: str) -> None:
        """`user` was just authorized with `role` in the session: a lesser role
        than last seen there means a demotion whose message this gateway
        missed, so its older streams of the session end now."""
        before = self._roles.get((user, session_id))
        self._roles[(user, session_id)] = role
        if members.lowers(before, role):
            await self._end_streams(user, session_id, "subscribe")

    async def member_changed(
        self, session_id: str, user_id: str, role: str | None, before: str | None
    ) -> None:
        """After a committed membership change: if it took access away, end the
        user's streams of the session here and on every other gateway."""
        if before is None or not members.lowers(before, role):
            return
        msg = control.MemberChanged(
            session_id=session_id, user_id=user_id, role=role, previous_role=before,
            origin=self.origin,
        )  # fmt: skip
        await self.apply(msg, "message")
        await send(self.gw.broker.bus, msg)

    async def apply(self, msg: control.AccessChange, via: str) -> None:
        match msg:
            case control.MemberChanged():
                key = (msg.user_id, msg.session_id)
                if msg.role is None:
                    self._roles.pop(key, None)
                elif key in self._roles:
                    self._roles[key] = msg.role
                await self._end_streams(msg.user_id, msg.session_id, via)
            case control.TokensRevoked():
                self._revoke(msg.user_id, msg.not_before)
                self._end_revoked(via, msg.user_id)

    async def _on_message(self, msg: control.AccessChange) -> None:
        if msg.origin == self.origin:
            return  # applied before it was sent
        try:
            await self.apply(msg, "message")
        except Exception:
            log.exception("access message not applied (the next re-check will)")

    async def _end_streams(self, user: str, session_id: str, via: str) -> None:
        """End `user`'s open streams of the session with `forbidden`."""
        for conn in list(self.gw.connections):
            if conn.user != user or conn.state is not State.OPEN:
                continue
            for key, member in list(conn.members.items()):
                if await self._session_of(key) == session_id and conn.members.get(key) is member:
                    self._end(conn, key, session_id, via)

    async def _session_of(self, key: str) -> str | None:
        kind, _, ident = key.partition(":")
        if kind == "session":
            return ident
        try:
            return await self.gw.run_session(ident)  # cached: the subscribe looked it up
        except errors.RunlogError:
            return None  # unknown here: the re-check resolves it in PostgreSQL

    def _end(self, conn: Connection, key: str, session_id: str, via: str) -> None:
        conn.end_topic(key, "forbidden", f"your access to session {session_id} changed")
        self.gw.metrics.access_ended.labels("forbidden", via).inc()

    # -- the backstop

    async def _recheck_loop(self) -> None:
        period = self.gw.settings.access_recheck_s
        while True:
            await asyncio.sleep(period)
            try:
                await self.recheck()
            except errors.RunlogError as e:
                log.warning("access re-check failed (%s); next one in %.0f s", e.code, period)
            except Exception:
                log.exception("access re-check failed")

    async def recheck(self) -> None:
        """Apply what PostgreSQL says now: revocations, then the roles of the
        users of every open stream (one query for all of them)."""
        store = self.gw.broker.store
        for user, not_before in (await store.token_revocations()).items():
            self._revoke(user, not_before)
        self._end_revoked("recheck")
        streams = [
            (conn, key, member)
            for conn in list(self.gw.connections)
            if conn.user and conn.state is State.OPEN
            for key, member in conn.members.items()
        ]
        asked = list(dict.fromkeys(_triple(conn.user, key) for conn, key, _ in streams))
        found = dict(zip(asked, await store.stream_roles(asked), strict=True)) if asked else {}
        now: dict[tuple[str, str], str | None] = {}
        for conn, key, member in streams:
            sid, role = found[_triple(conn.user, key)]
            seen = self._roles.get((conn.user, sid)) if sid is not None else None
            if role is None or members.lowers(seen, role):
                if conn.state is State.OPEN and conn.members.get(key) is member:
                    self._end(conn, key, sid or "?", "recheck")
            if sid is not None:
                now[(conn.user, sid)] = role
        for pair, role in now.items():
            if role is None:
                self._roles.pop(pair, None)
            else:
                self._roles[pair] = role
        users = {c.user for c in self.gw.connections}
        for pair in [p for p in self._roles if p[0] not in users]:
            del self._roles[pair]


def _triple(user: str, key: str) -> tuple[str, str, str]:
    kind, _, ident = key.partition(":")
    return user, kind, ident
