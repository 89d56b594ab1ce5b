"""The one place that touches nats-py beyond its public API, and what it relies on.

nats-py hands each message of a subscription with a callback to a task of
that subscription, through an `asyncio.Queue`: a task switch, a future and
a queue hand-off per message, and its headers parsed into a dict first. The
live feed does not need any of that: its handler only decodes the payload
and offers it to buffers that never wait (broker/subscribe.py), and it reads
no header (the `Nats-Msg-Id` is for JetStream's dedupe). So `Client` calls a
*direct* subscription's handler with the payload where nats-py's protocol
parser hands the message over (`Client._process_msg`, awaited by
`Parser.parse` for every MSG/HMSG): no task, no queue, no header parsing,
and in the order the server sent the messages.

A direct subscription is an ordinary nats-py `Subscription` without a
callback (so nats-py starts no task for it, and re-subscribes it after a
reconnect like any other), whose id is registered here until nats-py
removes it (`Client._remove_sub`: unsubscribe, drain). A handler must not
block or await; an exception from it is logged and the message dropped (a
live-feed reader fills what it missed from PostgreSQL), never raised into
the reader, which would treat it as a protocol error and reconnect.

A *reply* subscription (`subscribe_replies`) is the same with the message's
subject and raw headers passed too: the live publish's JetStream acks
(broker/bus.py), one per published message, which nats-py's own
`publish_async` takes through a callback subscription's task and queue,
parses as JSON into a dataclass and resolves through a done callback: about
as much work again as the publish. `publish_headed` writes an HPUB whose
header block the caller built once (nats-py builds and checks it from a dict
on every publish), with `publish`'s own checks and flush hand-off.

`flush()` is PING, then wait for the PONG: the server has processed all
that was sent before. nats-py 2.16 writes the PING straight to the socket
(`Client._send_ping`), ahead of what is still in its pending buffer, so its
flush could return before a SUB made just before it reached the server: a
message another connection published "after" was dropped (about 1 in 100 on
loopback). `Client` queues the PING behind the pending data instead
(tests/test_notices.py, a notice right after subscribing).

Each private name used here is a `Guard` below, checked when this module is
imported (broker/contract.py), and has a contract test against a real NATS
(tests/test_dependency_contracts.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from nats import errors
from nats.aio import client as _client
from nats.aio.client import Client as _NatsClient
from nats.aio.subscription import Subscription
from nats.protocol import command as _command
from nats.protocol.parser import Parser

from .contract import Guard, check, params, uses

log = logging.getLogger(__name__)

# The nats-py release these names were read from: the pin in pyproject.toml
# (nats-py~=TESTED) and the version the contract tests ran against.
TESTED = "2.16.0"


def _guards() -> tuple[Guard, ...]:
    fresh = _NatsClient()  # no I/O: the state a client starts in
    return (
        Guard(
            "Client._process_msg",
            "(self, sid, subject, reply, data, headers), awaited by Parser.parse",
            lambda: (
                params(_NatsClient._process_msg)
                == ["self", "sid", "subject", "reply", "data", "headers"]
                and uses(Parser.parse, "_process_msg")
            ),
        ),
        Guard(
            "Client._remove_sub",
            "(self, sid, max_msgs), called by Subscription.unsubscribe",
            lambda: (
                params(_NatsClient._remove_sub) == ["self", "sid", "max_msgs"]
                and uses(Subscription.unsubscribe, "_remove_sub")
            ),
        ),
        Guard(
            "Client._send_ping",
            "(self, future), the way flush() sends its PING",
            lambda: (
                params(_NatsClient._send_ping) == ["self", "future"]
                and uses(_NatsClient.flush, "_send_ping")
            ),
        ),
        Guard(
            "Client._send_command",
            "(self, cmd, priority), queueing bytes for the flusher",
            lambda: params(_NatsClient._send_command) == ["self", "cmd", "priority"],
        ),
        Guard(
            "Client._flush_pending",
            "(self, force_flush), kicking the flusher",
            lambda: params(_NatsClient._flush_pending) == ["self", "force_flush"],
        ),
        Guard(
            "Client._pongs",
            "the list of futures waiting for a PONG, popped by Client._process_pong",
            lambda: fresh._pongs == [] and uses(_NatsClient._process_pong, "_pongs"),
        ),
        Guard(
            "Client._subs",
            "a dict of the subscriptions by id",
            lambda: type(fresh._subs) is dict and not fresh._subs,
        ),
        Guard(
            "Client._flush_queue",
            "None until connect, then the flusher's queue",
            lambda: fresh._flush_queue is None and uses(_NatsClient._flusher, "_flush_queue"),
        ),
        Guard(
            "Client._max_pending_size",
            "an int, the connect option pending_size",
            lambda: type(fresh._max_pending_size) is int,
        ),
        Guard(
            "Client._pending_data_size",
            "an int, the bytes waiting for the flusher",
            lambda: type(fresh._pending_data_size) is int,
        ),
        Guard(
            "Client._max_payload",
            "an int, the server's max_payload",
            lambda: type(fresh._max_payload) is int,
        ),
        Guard(
            "Client.stats",
            "a dict counting in_msgs, in_bytes, out_msgs, out_bytes",
            lambda: {"in_msgs", "in_bytes", "out_msgs", "out_bytes"} <= fresh.stats.keys(),
        ),
        Guard(
            "Subscription._id",
            "the subscription's id, the key of Client._subs",
            lambda: uses(Subscription.__init__, "_id"),
        ),
        Guard(
            "nats.aio.client.PING_PROTO",
            "the bytes of a PING",
            lambda: _client.PING_PROTO == b"PING\r\n",
        ),
        Guard(
            "nats.protocol.command.hpub_cmd",
            "(subject, reply, hdr, payload), an HPUB's bytes",
            lambda: params(_command.hpub_cmd) == ["subject", "reply", "hdr", "payload"],
        ),
    )


GUARDS = _guards()
check("nats-py", TESTED, GUARDS)

PING_PROTO: bytes = _client.PING_PROTO
hpub_cmd = _command.hpub_cmd

# A reply subscription's handler: (subject, data, raw headers or None).
ReplyHandler = Callable[[bytes, bytes, "bytes | None"], None]


class Client(_NatsClient):
    """A nats-py client that can hand messages to direct subscriptions."""

    def __init__(self) -> None:
        super().__init__()
        self._direct: dict[int, Callable[[bytes], None]] = {}
        self._replies: dict[int, ReplyHandler] = {}

    async def subscribe_direct(
        self, subject: str, handler: Callable[[bytes], None]
    ) -> Subscription:
        """Subscribe `subject`; each message's payload goes to `handler(data)`
        from the connection's reader, in order. Undo with `sub.unsubscribe()`."""
        sub = await self.subscribe(subject)
        self._direct[sub._id] = handler
        return sub

    async def subscribe_replies(self, subject: str, handler: ReplyHandler) -> Subscription:
        """Like `subscribe_direct`, for replies: `handler(subject, data, headers)`,
        headers raw (a status line such as `NATS/1.0 503` for no responders)."""
        sub = await self.subscribe(subject)
        self._replies[sub._id] = handler
        return sub

    async def publish_headed(self, subject: str, reply: str, hdr: bytes, payload: bytes) -> None:
        """`publish(subject, payload, reply, headers)` with the header block
        already encoded: the `NATS/1.0` line, `Key: value` lines, a blank line."""
        if self.is_closed:
            raise errors.ConnectionClosedError
        if self.is_draining_pubs:
            raise errors.ConnectionDrainingError
        size = len(payload)
        if not self.is_connected and (
            self._max_pending_size <= 0 or size + self._pending_data_size > self._max_pending_size
        ):
            raise errors.OutboundBufferLimitError
        if size > self._max_payload:
            raise errors.MaxPayloadError
        self.stats["out_msgs"] += 1
        self.stats["out_bytes"] += size
        await self._send_command(hpub_cmd(subject, reply, hdr, payload))
        if self._flush_queue is not None and self._flush_queue.empty():
            await self._flush_pending()

    async def _send_ping(self, future: asyncio.Future[bool] | None = None) -> None:
        # Behind what is pending, so that its PONG means all of it arrived.
        # Not while reconnecting: a PING left in the buffer would be answered
        # after the reconnect, and its PONG taken for a later flush's.
        if not self.is_connected:
            await super()._send_ping(future)
            return
        self._pongs.append(future if future is not None else asyncio.Future())
        await self._send_command(PING_PROTO)
        await self._flush_pending()

    def _remove_sub(self, sid: int, max_msgs: int = 0) -> None:
        # nats-py's one way out for a subscription (unsubscribe, drain).
        self._direct.pop(sid, None)
        self._replies.pop(sid, None)
        super()._remove_sub(sid, max_msgs)

    async def _process_msg(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None
    ) -> None:
        handler = self._direct.get(sid)
        if handler is None:
            replies = self._replies.get(sid)
            if replies is None:
                await super()._process_msg(sid, subject, reply, data, headers)  # type: ignore[arg-type]
                return
            self.stats["in_msgs"] += 1
            self.stats["in_bytes"] += len(data)
            try:
                replies(subject, data, headers)
            except Exception:
                log.exception("reply handler failed on %s", subject.decode(errors="replace"))
            return
        self.stats["in_msgs"] += 1
        self.stats["in_bytes"] += len(data)
        try:
            handler(data)
        except Exception:
            log.exception("live-feed handler failed on %s", subject.decode(errors="replace"))
