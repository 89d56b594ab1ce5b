"""A client connection (WebSocket or SSE): its subscriptions, send queue,
writer task, cursors, and its one teardown.

The writer task is the only code that waits on the client's socket, so a
slow client only ever slows itself. Everything else (the hub's pumps, other
connections) just puts bytes into this connection's bounded queue, or writes
them at once when nothing is queued and the socket keeps up.

Lifecycle, one way: OPEN → CLOSING → CLOSED. `close(code)` starts the
teardown the first time it is called (later calls return the same task), and
does the part that must not wait at once, synchronously:

1. the subscriptions are detached from the hub (nothing more is offered);
2. the queue is closed: it refuses everything from now on (and, for a slow
   client, forgets what it held);
3. a timer is armed that aborts the transport `disconnect_timeout_s` later,
   whatever the client does. Every wait of the teardown is bounded by it:
   nothing in it is ever cancelled, which matters because a task waiting in
   aiohttp's flow control must never be (see `_aio.py`).

Then, in the teardown task: what was queued is flushed (except for a slow
client), the subclass says goodbye (`disconnect` with the exact cursors of
what was written, then the close frame or the end of the stream), the
writer is waited for, and the connection is CLOSED: unregistered, its queue
discarded. A code of None means the client went away or the stream ended.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import TYPE_CHECKING, Protocol

from .disconnect import CODES
from .sendq import Item, Mode, SendQueue

if TYPE_CHECKING:
    from broker.settings import Settings

    from ._malloc import Trimmer
    from .admission import Ticket
    from .hub import Hub, Member
    from .metrics import GatewayMetrics

log = logging.getLogger(__name__)

# A disconnect with one of these codes first lets queued events out.
_FLUSH_S = 2.0


class State(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"


class Host(Protocol):
    """What a connection needs of its gateway (context.py's `Gateway`, which
    owns the connections and so is not imported here)."""

    @property
    def settings(self) -> Settings: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def hub(self) -> Hub: ...
    @property
    def trimmer(self) -> Trimmer: ...
    @property
    def connections(self) -> set[Connection]: ...  # each registers itself until CLOSED


class Connection:
    kind = "conn"

    def __init__(self, gw: Host, user: str, mode: Mode) -> None:
        s = gw.settings
        self.gw = gw
        self.user = user
        self.mode = mode
        self.metrics = gw.metrics
        self.queue = SendQueue(s.send_queue_max_bytes, s.send_queue_lag_bytes)
        self.state = State.OPEN
        self.issued_at = 0.0  # `iat` of the token it was opened with (token revocation)
        self.members: dict[str, Member] = {}  # topic -> subscription
        self.sent: dict[str, int] = {}  # topic -> position of the last event written
        self.overflowed = False
        self._writer: asyncio.Task[None] | None = None
        self._teardown: asyncio.Task[None] | None = None
        self._cut: asyncio.TimerHandle | None = None
        self._afters: dict[str, int] = {}  # topic -> cursor it was subscribed from
        # Its place in the per-user / per-address counts (admission.py), set
        # by the handler once admitted; released when CLOSED.
        self.ticket: Ticket | None = None
        # Fields the `disconnect` message carries besides code and cursors
        # (e.g. retry_after_s with too_many_connections).
        self.disconnect_fields: dict[str, object] = {}
        # The writer task starts when something is first queued: an idle
        # connection whose frames all go out directly never needs one.
        self.queue.on_ready = self._ensure_writer
        gw.connections.add(self)
        self.metrics.connections.labels(self.kind).inc()

    # -- what subclasses provide

    def transport(self) -> asyncio.Transport | None:
        raise NotImplementedError

    async def send(self, items: list[Item]) -> None:
        """Write `items` to the socket and wait until it takes more. Updates
        `sent` as each item is handed to the transport."""
        raise NotImplementedError

    async def goodbye(self, code: str | None, cursors: dict[str, int]) -> None:
        """End the connection: with `code`, tell the client why (and from
        where to resume) first. Bounded by the teardown's timer."""
        raise NotImplementedError

    def write_now(self, frames: list[bytes], topic: str | None, last: int) -> bool:
        """Write `frames` to the socket at once if nothing is queued and the
        socket keeps up (subclasses that can); False: queue them instead."""
        return False

    def notice(self, type_: str, **fields: object) -> None:
        """Send a message that is not in the log (presence, run_queued:
        notices.py), in order with the events; protocols without a place
        for one (the compat formats) ignore it."""

    # -- subscriptions

    def attach(self, key: str, member: Member) -> bool:
        """Keep a subscription the hub made; refused (and left) once the
        connection is ending, so a subscribe racing a close leaks nothing."""
        if self.state is not State.OPEN:
            self.gw.hub.leave(member)
            return False
        self.members[key] = member
        return True

    def detach(self, key: str) -> None:
        m = self.members.pop(key, None)
        self.sent.pop(key, None)
        if m is not None:
            self.gw.hub.leave(m)

    def end_topic(self, key: str, code: str, message: str) -> None:
        """End one subscription for a server-side reason (gateway/access.py).
        A connection that carries a single stream (SSE) ends whole."""
        self.close(code)

    # -- the writer

    def _ensure_writer(self) -> None:
        if self._writer is None and self.state is not State.CLOSED:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_loop(), name=f"runlog-{self.kind}-writer"
            )

    async def _write_loop(self) -> None:
        q = self.queue
        try:
            while True:
                items = await q.next_items()
                if not items:
                    return  # closed and empty
                await self.send(items)
                q.written(items)
                self._count(items)
                self.after_written()
        except ConnectionError:
            pass  # the peer went away: nothing more to write
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise
            # aiohttp's shared drain future was cancelled under us: this
            # connection cannot be written any more.
            self.abort_transport()
        except Exception:
            log.exception("%s writer failed", self.kind)
            self.abort_transport()
        finally:
            if self.state is State.OPEN:
                self.close(None)

    def after_written(self) -> None:
        """Called by the writer after each write (e.g. SSE ends after run_end)."""

    def _count(self, items: list[Item]) -> None:
        m = self.metrics
        m.frames_queued[self.kind] += len(items)
        q = self.queue
        if q.coalesced or q.dropped:  # only a lagging connection gets here with these
            m.coalesced.inc(q.coalesced)
            m.dropped.inc(q.dropped)
            q.coalesced = q.dropped = 0

    # -- the end

    def overflow(self) -> None:
        """The send queue passed its bound: the client is too slow."""
        if self.overflowed or self.state is not State.OPEN:
            return
        self.overflowed = True
        self.metrics.slow_disconnects.labels(self.kind).inc()
        self.close("slow_consumer")

    def close(self, code: str | None) -> asyncio.Future[None]:
        """End the connection (see the module's docstring); `code` is a
        disconnect code of `disconnect.CODES`, or None. Never blocks; what it
        returns is done when the connection is CLOSED. It is shielded: a
        caller cancelled while awaiting it (aiohttp cancels handlers at
        shutdown) never cancels the teardown, which must not be."""
        if self._teardown is not None:
            return asyncio.shield(self._teardown)
        assert code is None or code in CODES, code
        self.state = State.CLOSING
        for key, m in self.members.items():
            self._afters[key] = m.after
            self.gw.hub.leave(m)
        self.members.clear()
        self.queue.close(drop=code == "slow_consumer")
        loop = asyncio.get_running_loop()
        self._cut = loop.call_later(self.gw.settings.disconnect_timeout_s, self.abort_transport)
        self._teardown = loop.create_task(
            self._run_teardown(code), name=f"runlog-{self.kind}-close"
        )
        return asyncio.shield(self._teardown)

    def abort_transport(self) -> None:
        t = self.transport()
        if t is not None:
            t.abort()

    def spare_transport(self) -> None:
        """The goodbye ended cleanly and the socket may serve another request
        (an SSE stream that ended): do not cut it."""
        if self._cut is not None:
            self._cut.cancel()

    async def _run_teardown(self, code: str | None) -> None:
        try:
            if code is not None and code != "slow_consumer" and self.queue.nbytes:
                try:
                    async with asyncio.timeout(_FLUSH_S):
                        await self.queue.wait_below(0)
                except TimeoutError:
                    pass
            cursors = {k: self.sent.get(k, after) for k, after in self._afters.items()}
            try:
                await self.goodbye(code, cursors)
            except (ConnectionError, RuntimeError):
                pass  # the socket is gone: there is no one to tell
            if self._writer is not None:
                await asyncio.wait({self._writer})
        except Exception:
            log.exception("%s teardown failed", self.kind)
            self.abort_transport()
        finally:
            self.state = State.CLOSED
            self.queue.discard()
            self.gw.connections.discard(self)
            self.metrics.connections.labels(self.kind).dec()
            if self.ticket is not None:
                self.ticket.release()
            self.gw.trimmer.note_close()
