"""WebSocket endpoint `/v1/ws` (protocol in docs/protocol.md).

Per connection: one reader (this handler), one writer task (`Connection`),
and one `Member` per subscription. Replies to requests (`subscribed`, `ack`,
`error`, `pong`) go through the same queue as events, so the client sees
them in order with the events.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import WSMsgType, web

from broker import errors
from broker.store import TRANSIENT_DB_ERRORS, unavailable

from . import _aio, auth, credentials, error_answer, protocol
from .connection import Connection, State
from .context import GATEWAY, Gateway
from .disconnect import CODES
from .frames import message, ws_wire
from .sendq import Item

log = logging.getLogger(__name__)

# The hard limit aiohttp enforces itself (close 1009); below it, oversize
# messages get a `message_too_large` error and the connection stays.
_HARD_LIMIT_FACTOR = 16
_MAX_STRIKES = 20  # malformed messages in a row before the connection is closed
# Frames go straight to the socket while its unsent buffer is below this;
# above it they wait in the bounded queue for the writer task.
_DIRECT_WRITE_MAX_BYTES = 64 * 1024
# A server ping (RFC 6455 §5.5.2): FIN, opcode 9, no payload, unmasked.
_PING = b"\x89\x00"
_ROUTE = "/v1/ws"


class _Bucket:
    """Token bucket for client messages."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.capacity = 2 * rate
        self.tokens = self.capacity
        self.t = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class WsClient(Connection):
    kind = "ws"
    gw: Gateway  # all of it: authorize, decide, verify, admission

    def __init__(self, gw: Gateway, ws: web.WebSocketResponse, request: web.Request) -> None:
        _aio.check_uncompressed(ws)
        super().__init__(gw, "", "ws")
        self.ws = ws
        self.request = request
        self._transport = _aio.transport_of(request)
        self.principal: auth.Principal | None = None
        self._expiry: asyncio.TimerHandle | None = None
        # The gateway's heartbeat sweep (heartbeat.py) reads and clears these.
        self.heard = True
        self.pinged = False

    def _heard(self) -> None:
        self.heard = True

    def ping(self) -> None:
        t = self._writable()
        if t is not None:
            t.write(_PING)

    def dead(self) -> None:
        # What aiohttp's own heartbeat does, without waiting for a close
        # handshake the peer will not answer: the read loop then ends.
        self.abort_transport()

    def transport(self) -> asyncio.Transport | None:
        return self._transport

    def _writable(self) -> asyncio.Transport | None:
        """The transport, if data frames may still go out: not once our
        teardown began, nor once aiohttp closes the WebSocket (a client's
        close frame is answered inside `receive`), so nothing ever follows
        a close frame."""
        t = self._transport
        if self.ws.closed or t is None or t.is_closing():
            return None
        return t

    def write_now(self, frames: list[bytes], topic: str | None, last: int) -> bool:
        if self.state is not State.OPEN or self.queue.nbytes:
            return False
        t = self._writable()
        if t is None or t.get_write_buffer_size() > _DIRECT_WRITE_MAX_BYTES:
            return False
        if len(frames) == 1:
            t.write(frames[0])
        else:
            t.writelines(frames)
        if topic is not None:
            self.sent[topic] = last
        self.metrics.frames_direct["ws"] += len(frames)
        return True

    async def send(self, items: list[Item]) -> None:
        t = self._writable()
        if t is None:
            raise ConnectionResetError("the WebSocket is closing")
        t.writelines([it.render() for it in items])
        for it in items:
            if it.topic is not None:
                self.sent[it.topic] = it.last
        await _aio.drained(self.request)

    async def goodbye(self, code: str | None, cursors: dict[str, int]) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        if self.ws.closed:
            return  # aiohttp closed it (the client's close frame, a lost heartbeat)
        if code is None:
            await self.ws.close(drain=False)
            return
        d = CODES[code]
        t = self._writable()
        if t is not None:
            # After what was written, before the close frame; written straight
            # to the transport, so a socket that is full cannot hold it back.
            t.write(ws_wire(message(
                "disconnect", code=code, reconnect=d.reconnect, message=d.meaning,
                cursors=cursors, **self.disconnect_fields,
            )))  # fmt: skip
        # Sends the close frame and waits (at most the WebSocket's timeout)
        # for the client's; a client that never reads is cut by the timer.
        await self.ws.close(code=d.close_code, message=code.encode(), drain=False)

    def reply(self, type_: str, **fields: object) -> None:
        data = ws_wire(message(type_, **fields))
        if not self.write_now([data], None, 0):
            self.queue.put_message(data)

    def notice(self, type_: str, **fields: object) -> None:
        if self.state is State.OPEN:
            self.reply(type_, **fields)

    def error(self, e: errors.RunlogError, ref: str = "") -> None:
        self.gw.metrics.ws_errors.labels(e.code).inc()
        self.reply("error", ref=ref, **e.to_dict())

    # -- messages

    async def handle(self, data: str) -> None:
        s = self.gw.settings
        msg = protocol.decode(data, max_bytes=s.max_message_bytes)
        match msg:
            case protocol.Auth():
                await self.gw.issuers.ready(msg.token)  # a fresh kid's keys (issuers.py)
                self.authenticate(msg.token)
                self.reply("authenticated", ref=msg.ref, user=self.user)
            case protocol.Ping():
                self.reply("pong", ref=msg.ref, ts=int(time.time() * 1000))
            case _ if self.principal is None:
                raise errors.Unauthorized("authenticate first: send {'type':'auth','token':...}")
            case protocol.Subscribe():
                await self.subscribe(msg)
            case protocol.Unsubscribe():
                kind, ident = protocol.topic_of(msg)
                self.detach(f"{kind}:{ident}")
                self.reply("unsubscribed", ref=msg.ref, topic=f"{kind}:{ident}")
            case protocol.InterruptMsg():
                await self.gw.authorize(self.user, "run", msg.run_id, auth.ACT, "interrupt runs")
                first = await self.gw.broker.interrupt(msg.run_id, self.user, msg.reason)
                self.reply("ack", ref=msg.ref, result={"run_id": msg.run_id, "first": first})
            case protocol.DecideMsg():
                result = await self.gw.decide(
                    self.user, msg.approval_id, msg.decision, msg.comment,
                    call_digest=msg.call_digest,
                )  # fmt: skip
                self.reply("ack", ref=msg.ref, result=result)

    def authenticate(self, token: str) -> None:
        p = self.gw.verify(token)
        if self.principal is not None and p.user != self.principal.user:
            raise errors.Forbidden("a connection cannot change user")
        if self.ticket is not None:
            self.gw.admission.add_user(self.ticket, p.user)  # TooManyConnections past the cap
        self.principal = p
        self.user = p.user
        self.issued_at = p.issued_at
        if self._expiry is not None:
            self._expiry.cancel()
        # The leeway verify() allowed: else a token accepted within it would
        # end the connection at once, and the client would loop reconnecting.
        delay = max(0.0, p.expires_at + self.gw.settings.jwt_leeway_s - time.time())
        loop = asyncio.get_running_loop()
        self._expiry = loop.call_later(delay, self._expire)

    def _expire(self) -> None:
        self.close("token_expired")

    def end_topic(self, key: str, code: str, message: str) -> None:
        """End just this subscription (the socket stays): `unsubscribed` with
        the code and the cursor of the last event of it the client gets."""
        member = self.members.get(key)
        if member is None or self.state is not State.OPEN:
            return
        cursor = member.position
        self.detach(key)
        self.reply("unsubscribed", topic=key, code=code, message=message, cursor=cursor)

    def refuse(self, e: errors.TooManyConnections) -> asyncio.Future[None]:
        """Past a connection cap: say so (a browser cannot read an HTTP 429
        of an upgrade) and close with 4429."""
        self.disconnect_fields["retry_after_s"] = e.extra["retry_after_s"]
        return self.close("too_many_connections")

    async def subscribe(self, msg: protocol.Subscribe) -> None:
        kind, ident = protocol.topic_of(msg)
        key = f"{kind}:{ident}"
        if key in self.members:
            raise errors.Conflict(f"already subscribed to {key}; unsubscribe first")
        if len(self.members) >= self.gw.settings.max_subscriptions:
            raise errors.ClientError(
                f"at most {self.gw.settings.max_subscriptions} subscriptions per connection"
            )
        await self.gw.authorize_stream(self.user, kind, ident)
        mode = "ws_batch" if msg.batch else "ws"
        self.sent.pop(key, None)  # a cursor from an earlier subscription is not this one's
        member = await self.gw.hub.join(self, kind, ident, msg.after, mode)  # type: ignore[arg-type]
        if not self.attach(key, member):
            return  # the connection is ending
        # No await since join() started the member, whose first event can only
        # go out after this handler yields: the confirmation comes first.
        self.reply("subscribed", ref=msg.ref, topic=key, cursor=msg.after, head=member.head)


def is_ws_route(request: web.Request) -> bool:
    """A WebSocket upgrade request (`GET /v1/ws`): handle_ws answers its own
    errors, so that no middleware frame stays alive with the connection."""
    resource = request.match_info.route.resource
    return request.method == "GET" and resource is not None and resource.canonical == _ROUTE


async def handle_ws(request: web.Request) -> web.StreamResponse:
    gw: Gateway = request.app[GATEWAY]
    try:
        ws, client = await _open(gw, request)
    except Exception as e:
        resp = error_answer.answer(request, e)
        error_answer.count(request, resp.status)
        return resp
    if client is not None:
        gw.heartbeat.add(client)
        try:
            await _read_loop(gw, client, ws)
        finally:
            # Started here if the client left; else this waits for the teardown
            # a server-side reason started (it woke the read loop).
            await client.close(None)
            gw.heartbeat.discard(client)
    error_answer.count(request, 101)
    return ws


async def _open(gw: Gateway, request: web.Request) -> tuple[web.WebSocketResponse, WsClient | None]:
    """Check the request, upgrade it, admit the client and say hello; None
    in place of the client when it was refused after the upgrade. What is
    only needed here (the token, the offered protocols) ends with this
    frame, not kept for the connection's life."""
    s = gw.settings
    if gw.draining:
        raise errors.ServerDraining("this gateway is draining", hint="connect to another gateway")
    if not auth.origin_allowed(s, request.headers.get("Origin"), gw.own_origins):
        gw.metrics.ws_errors.labels("origin_not_allowed").inc()
        raise errors.Forbidden("Origin not allowed")

    # Credentials before the upgrade: header, subprotocol or query; else the
    # first message must be `auth`.
    token = credentials.token_of(request)
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
    for p in offered:
        if p.startswith(protocol.BEARER_SUBPROTOCOL_PREFIX):
            token = p[len(protocol.BEARER_SUBPROTOCOL_PREFIX) :]
            if protocol.SUBPROTOCOL not in offered:
                # Else aiohttp's handshake logs the offered protocols (the
                # token) at WARNING, as not overlapping ours.
                raise errors.ClientError(
                    f"the {protocol.BEARER_SUBPROTOCOL_PREFIX}<token> subprotocol is accepted "
                    f"next to {protocol.SUBPROTOCOL} only",
                    hint=f"offer both: Sec-WebSocket-Protocol: {protocol.SUBPROTOCOL}, "
                    f"{protocol.BEARER_SUBPROTOCOL_PREFIX}<token>",
                )
    if token:
        await gw.issuers.ready(token)  # a fresh kid's keys (issuers.py)
    principal = gw.verify(token) if token else None  # bad token: 401 before upgrade
    ip = gw.admission.client_ip(request)

    ws = web.WebSocketResponse(
        protocols=(protocol.SUBPROTOCOL,),
        heartbeat=None,  # the gateway's sweep pings (heartbeat.py), not a timer per connection
        max_msg_size=s.max_message_bytes * _HARD_LIMIT_FACTOR,
        compress=False,  # frames are pre-built, uncompressed (see _aio.py)
        timeout=s.disconnect_timeout_s,  # how long close() waits for the client's close
    )
    await ws.prepare(request)
    client = WsClient(gw, ws, request)
    try:
        # The address's cap now; the user's now if known, else at `auth`.
        client.ticket = gw.admission.admit(ip, principal.user if principal else None)
        if principal is not None and token is not None:
            client.authenticate(token)
    except errors.TooManyConnections as e:
        await client.refuse(e)
        await client.close(None)
        return ws, None
    except BaseException:
        await client.close(None)
        raise
    _aio.on_data_received(request, client._heard)
    client.reply(
        "hello", protocol=protocol.PROTOCOL_VERSION, heartbeat_s=s.ws_heartbeat_s,
        max_message_bytes=s.max_message_bytes, user=client.user or None,
    )  # fmt: skip
    return ws, client


async def _read_loop(gw: Gateway, client: WsClient, ws: web.WebSocketResponse) -> None:
    s = gw.settings
    bucket = _Bucket(s.control_rate_per_s)
    strikes = 0
    auth_deadline = time.monotonic() + s.ws_auth_timeout_s
    while not ws.closed and client.state is State.OPEN:
        timeout = None if client.principal else max(0.0, auth_deadline - time.monotonic())
        try:
            msg = await ws.receive(timeout=timeout)
        except TimeoutError:
            await client.close("auth_timeout")
            return
        if msg.type == WSMsgType.TEXT:
            if not bucket.take():
                if bucket.tokens < -4 * bucket.capacity:
                    await client.close("rate_limited")
                    return
                bucket.tokens -= 1  # debt: a flood runs the bucket negative
                client.error(errors.ClientError("too many messages; slow down"), "")
                continue
            try:
                await client.handle(msg.data)
                strikes = 0
            except errors.TooManyConnections as e:
                await client.refuse(e)  # its `auth` named a user already at the cap
                return
            except errors.ClientError as e:
                client.error(e, protocol.peek(msg.data)[1])
                strikes += 1
                if strikes >= _MAX_STRIKES:
                    await client.close("protocol_error")
                    return
            except errors.RunlogError as e:
                client.error(e, protocol.peek(msg.data)[1])
            except TRANSIENT_DB_ERRORS as e:
                # Got past the store: still the retryable answer, not a bug.
                log.warning("websocket message: %s; answered storage_unavailable",
                            type(e).__name__)  # fmt: skip
                client.error(unavailable("the request"), protocol.peek(msg.data)[1])
            except Exception:
                log.exception("websocket message failed")
                client.error(errors.InternalError("internal error"), protocol.peek(msg.data)[1])
        elif msg.type == WSMsgType.BINARY:
            client.error(protocol.InvalidMessage("binary frames are not accepted; send JSON text"))
            strikes += 1
            if strikes >= _MAX_STRIKES:
                await client.close("protocol_error")
                return
        elif msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            return
