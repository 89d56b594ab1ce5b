"""The gateway's per-process state, shared by its handlers (an aiohttp AppKey).

It holds nothing a client cannot rebuild from the log: open connections and
the hub's topics are caches of "who follows what from which cursor".
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from broker import errors, ids, models
from broker.runtime import Broker
from broker.settings import Settings

from . import auth, credentials, issuers
from ._malloc import Trimmer
from .access import Access
from .admission import Admission
from .heartbeat import Heartbeat
from .hub import Hub
from .metrics import GatewayMetrics
from .notices import Notices

if TYPE_CHECKING:
    from .connection import Connection

log = logging.getLogger(__name__)

_RUN_CACHE_MAX = 100_000


class Gateway:
    def __init__(self, broker: Broker, settings: Settings, metrics: GatewayMetrics) -> None:
        self.broker = broker
        self.settings = settings
        self.metrics = metrics
        self.hub = Hub(broker, metrics, settings.hub_linger_s)
        self.draining = False
        self.connections: set[Connection] = set()  # each registers itself until CLOSED
        metrics.subscriptions.set_function(lambda: self.hub.member_count)
        metrics.send_queue_bytes.set_function(lambda: sum(c.queue.nbytes for c in self.connections))
        # Fair sharing (see admission.py, replay_slots.py, _malloc.py).
        self.admission = Admission(settings, metrics.connections_refused)
        metrics.replays_running.set_function(lambda: self.hub.replay_slots.running)
        metrics.replays_waiting.set_function(lambda: self.hub.replay_slots.waiting)
        self.trimmer = Trimmer(settings.malloc_trim_s)
        self.heartbeat = Heartbeat(settings.ws_heartbeat_s)  # every WebSocket's ping/pong
        self._run_sessions: dict[str, str] = {}
        self.access = Access(self)
        self.issuers = issuers.Issuers(settings, metrics.jwks_loads)  # every token's verifier
        self.notices = Notices(broker.bus, settings.presence_refresh_s)
        self.hub.watch = self.notices
        public = settings.public_url or f"http://{settings.gateway_host}:{settings.gateway_port}"
        self.own_origins = {
            public.rstrip("/"),
            f"http://localhost:{settings.gateway_port}",
            f"http://127.0.0.1:{settings.gateway_port}",
        }

    async def start(self) -> None:
        await self.issuers.start()
        await self.access.start()
        await self.notices.start()

    # -- auth helpers

    def verify(self, token: str) -> auth.Principal:
        """A valid, unrevoked token's principal (revocations are in memory)."""
        p = self.issuers.verify(token)
        self.access.check(p)
        return p

    def principal(self, request: web.Request, *, api_key: bool = False) -> auth.Principal:
        """The request's principal (`api_key`: see credentials.token_of)."""
        token = credentials.token_of(request, api_key=api_key)
        if not token:
            raise errors.Unauthorized(
                "missing bearer token", hint="send 'Authorization: Bearer <token>'"
            )
        return self.verify(token)

    async def run_session(self, run_id: str) -> str:
        """The session of a run (immutable, so cached). A malformed run id is
        an unknown run, found without a query."""
        sid = self._run_sessions.get(run_id)
        if sid is None:
            if not ids.is_valid(run_id, ids.RUN):
                raise errors.RunNotFound(f"no run {run_id[:64]!r}")
            info = await self.broker.store.get_run(run_id)
            sid = info.session_id
            if len(self._run_sessions) >= _RUN_CACHE_MAX:
                self._run_sessions.clear()
            self._run_sessions[run_id] = sid
        return sid

    async def authorize_stream(self, user: str, kind: str, ident: str) -> None:
        """Raise unless `user` may read the run or session (and note its role
        there, to find demotions whose message this gateway missed)."""
        sid, role = await self.authorize(user, kind, ident, auth.READ, "read")
        await self.access.noted(user, sid, role)

    async def authorize(
        self, user: str, kind: str, ident: str, allowed: frozenset[str], action: str
    ) -> tuple[str, str]:
        """(session id, the user's role there) for the run or session, if the
        role allows `action`. An unknown or malformed id gets the answer a
        session you are not in gets (`not_a_member`), so ids cannot be probed."""
        if kind == "run":
            try:
                sid = await self.run_session(ident)
            except errors.RunNotFound:
                raise errors.NotAMember(
                    f"run {ident[:64]!r} is not in any session of yours"
                ) from None
        else:
            sid = ident
        return sid, await auth.require_role(self.broker.store, sid, user, allowed, action)

    async def start_run(
        self, request: web.Request, user: str, session_id: str, input: str, model: str = "",
        *, streamed: bool,
    ) -> str:  # fmt: skip
        """Start a run for `user`, as every way in does (native REST and every
        compat format): the input fits an event, the role may start runs, the
        model is allowed, and a streamed answer is within the connection caps
        (checked before the run exists, not after). Returns the run id."""
        run_id, _ = await self.queue_run(request, user, session_id, input, model, streamed=streamed)
        return run_id

    async def queue_run(
        self, request: web.Request, user: str, session_id: str, input: str, model: str = "",
        *, streamed: bool,
    ) -> tuple[str, int]:  # fmt: skip
        """`start_run`, also returning how many of the session's runs had not
        ended when it was created (it starts once they have)."""
        # The input travels in the run's first event, which must fit an event.
        if len(input.encode()) > self.settings.max_event_bytes - 4096:
            raise errors.PayloadTooLarge(
                f"input is over {self.settings.max_event_bytes - 4096} bytes of UTF-8"
            )
        await auth.require_role(self.broker.store, session_id, user, auth.ACT, "start runs")
        models.check(self.settings, model)
        if streamed:
            self.admission.check(self.admission.client_ip(request), user)
        run_id, ahead = await self.broker.queue_run(session_id, user, input=input, model=model)
        if ahead:
            # It waits for them: every watcher of the session sees it queued.
            await self.notices.run_queued(session_id, run_id, user, input)
        return run_id, len(ahead)

    async def decide(
        self,
        user: str,
        approval_id: str,
        decision: str,
        comment: str,
        run_id: str | None = None,
        call_digest: str = "",
    ) -> dict[str, object]:
        """Shared by REST and WebSocket: role check, then the single decision.

        A non-member learns nothing about an approval: unknown, malformed or
        someone else's, the answer is `not_a_member`. With `run_id` (REST),
        the run's members may learn that the run has no such approval (its
        events list its approvals anyway)."""
        if run_id is not None:
            await self.authorize_stream(user, "run", run_id)
        try:
            if not ids.is_valid(approval_id, ids.APPROVAL):
                raise errors.ApprovalNotFound(f"no approval {approval_id[:64]!r}")
            info = await self.broker.store.approval(approval_id)
            if run_id is not None and info.run_id != run_id:
                raise errors.ApprovalNotFound(f"no approval {approval_id[:64]!r} in run {run_id}")
        except errors.ApprovalNotFound:
            if run_id is not None:
                raise
            raise errors.NotAMember(
                f"approval {approval_id[:64]!r} is not in any session of yours"
            ) from None
        await auth.require_role(
            self.broker.store, info.session_id, user, auth.ACT, "decide approvals"
        )
        stored, created = await self.broker.decide(
            approval_id, decision, user, comment, call_digest
        )
        return {"approval": msgspec.structs.asdict(stored), "created": created}

    # -- drain

    async def drain(self) -> None:
        """Tell every client to resume elsewhere (code + cursor), then return
        (each connection's end is bounded by disconnect_timeout_s)."""
        self.draining = True
        conns = list(self.connections)
        if conns:
            await asyncio.gather(*(c.close("server_draining") for c in conns))

    async def close(self) -> None:
        await self.notices.close()
        await self.access.close()
        await self.issuers.close()
        self.trimmer.close()
        self.heartbeat.close()
        await self.hub.close()


def json_response(data: object, status: int = 200) -> web.Response:
    return web.Response(
        body=msgspec.json.encode(data), status=status, content_type="application/json"
    )


GATEWAY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)
