"""A client connection (WebSocket or SSE): send queue, writer task, cursors.

The writer task is the only code that awaits the client's socket, so a slow
client only ever slows itself. Everything else (the hub's pumps, other
connections) just puts bytes into this connection's bounded queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from .metrics import GatewayMetrics
from .sendq import Item, Mode, SendQueue

log = logging.getLogger(__name__)


class Connection:
    kind = "conn"

    def __init__(
        self,
        user: str,
        mode: Mode,
        queue: SendQueue,
        metrics: GatewayMetrics,
    ) -> None:
        self.user = user
        self.mode = mode
        self.queue = queue
        self.metrics = metrics
        self.sent: dict[str, int] = {}  # topic -> last position written
        self._writer: asyncio.Task[None] | None = None
        self._writer_stopped = False
        self.overflowed = False
        # The writer task starts when something is first queued: an idle
        # connection whose frames all go out directly never needs one.
        queue.on_ready = self._ensure_writer

    def _ensure_writer(self) -> None:
        if self._writer is None and not self._writer_stopped:
            self._writer = asyncio.get_running_loop().create_task(
                self._write_loop(), name=f"runlog-{self.kind}-writer"
            )

    def write_now(self, frames: list[bytes], topic: str | None, last: int) -> bool:
        """Write `frames` to the socket at once if nothing is queued and the
        socket keeps up (subclasses that can); False: queue them instead."""
        return False

    async def write_frames(self, frames: list[bytes]) -> None:
        raise NotImplementedError

    async def _write_loop(self) -> None:
        q = self.queue
        try:
            while True:
                await q.wait_ready()
                items = q.take()
                if not items:
                    continue
                await self._write_items(items)
        except (ConnectionError, RuntimeError, asyncio.CancelledError):
            # The peer went away (or we are closing): nothing more to write.
            pass
        except Exception:
            log.exception("%s writer failed", self.kind)

    async def _write_items(self, items: list[Item]) -> None:
        frames = [it.render() for it in items]
        await self.write_frames(frames)
        events = 0
        for it in items:
            self.queue.written(it)
            if it.topic is not None:
                self.sent[it.topic] = it.last
                events += 1
        self.metrics.frames_sent[self.kind] += len(frames)
        q = self.queue
        if q.coalesced or q.dropped:  # only a lagging connection gets here with these
            self.metrics.coalesced.inc(q.coalesced)
            self.metrics.dropped.inc(q.dropped)
            q.coalesced = q.dropped = 0

    def overflow(self) -> None:
        """The send queue passed its bound: the client is too slow."""
        if self.overflowed:
            return
        self.overflowed = True
        self.metrics.slow_disconnects.labels(self.kind).inc()
        self.on_overflow()

    def on_overflow(self) -> None:
        """Disconnect the client (subclasses say how); must not block."""
        self.abort("slow_consumer")

    def abort(self, code: str) -> None:
        """Disconnect the client with a disconnect code (docs/protocol.md) and
        its cursors; must not block. Subclasses say how."""

    async def stop_writer(self) -> None:
        self._writer_stopped = True
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._writer
            self._writer = None

    async def flush(self, timeout_s: float) -> bool:
        """Wait until the queue is written (bounded); False on timeout."""
        if self.queue.nbytes == 0:
            return True
        if self._writer is None or self._writer.done():
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await self.queue.wait_below(0)
        except TimeoutError:
            return False
        return True
