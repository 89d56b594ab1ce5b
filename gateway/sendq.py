"""The per-connection send queue: bounded in bytes, coalescing when lagging.

Contract:
- Items leave in the order they were put; event items carry the topic and
  the last position they cover, so the connection knows the cursor of what it
  actually wrote.
- Below `lag_bytes` queued (or being written), event frames are the shared,
  pre-encoded ones. Above it the connection is lagging: consecutive
  text/reasoning/tool-args deltas of one message are merged into one event
  (which covers positions first..last), and progress events are dropped.
- Above `max_bytes`, `put_*` returns False: the caller disconnects the client
  with its cursor. Bytes count until the socket has taken them (the writer
  reports them `written` once the transport drained), so memory per
  connection never exceeds about `max_bytes` plus one batch, whatever the
  client does.
- WebSocket items are wire frames (header included), SSE items text: the
  writer hands them to the transport as they are. "raw" items (a compat
  projection's input, gateway/compat/serve.py) keep the stored events
  themselves, for the writer to project: they are never coalesced or
  dropped (a projection is stateful), so a lagging raw connection only
  reaches the bound sooner, and is cut there.
- Once `close()`d, the queue refuses everything (the connection is ending):
  `put_*` keep nothing, waiters wake, and nothing is queued again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from broker.store import StoredEvent

from .frames import EncodedBatch, sse_frame, ws_event_frame, ws_events_frame, ws_wire

Mode = Literal["ws", "ws_batch", "sse", "raw"]

# Delta types that can be merged, and the field that names their stream.
_MERGEABLE = {
    "text_delta": ("message_id", "delta"),
    "reasoning_delta": ("message_id", "delta"),
    "tool_args_delta": ("tool_call_id", "partial_json"),
}
_DROPPABLE = frozenset({"progress"})
_decode = msgspec.json.Decoder(dict[str, Any]).decode
_encode = msgspec.json.Encoder().encode


class Item:
    __slots__ = (
        "data", "event", "first", "key", "last", "mode", "nbytes", "payloads", "stored", "topic",
    )  # fmt: skip

    def __init__(
        self,
        data: bytes | None,
        topic: str | None,
        last: int,
        nbytes: int,
        *,
        mode: Mode = "ws",
        first: int = 0,
        key: tuple[str, str, str] | None = None,
        event: dict[str, Any] | None = None,
        payloads: list[bytes] | None = None,
        stored: list[StoredEvent] | None = None,
    ) -> None:
        self.data = data
        self.topic = topic
        self.last = last
        self.nbytes = nbytes
        self.mode = mode
        self.first = first
        self.key = key
        self.event = event
        self.payloads = payloads  # a batch frame still open to more events
        self.stored = stored  # "raw": the events themselves, for the connection to render

    def render(self) -> bytes:
        """The bytes for the transport: a wire frame (WebSocket) or text (SSE)."""
        if self.data is not None:
            return self.data
        assert self.stored is None, "raw items are rendered by their connection"
        if self.payloads is not None:
            assert self.topic is not None
            return ws_wire(ws_events_frame(self.topic, self.first, self.payloads))
        assert self.event is not None and self.topic is not None
        payload = _encode(self.event)
        from_pos = self.first if self.first != self.last else None
        if self.mode == "sse":
            return sse_frame(self.last, payload)
        return ws_wire(ws_event_frame(self.topic, self.last, payload, from_pos))


class SendQueue:
    def __init__(self, max_bytes: int, lag_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.lag_bytes = lag_bytes
        # A list, and futures made only while someone waits: an idle
        # connection's queue costs a few hundred bytes, not the ~2 KiB of a
        # deque plus two asyncio.Events.
        self._items: list[Item] = []
        self.nbytes = 0  # queued + being written
        self._ready: asyncio.Future[None] | None = None  # only the writer waits
        self._progress: list[asyncio.Future[None]] = []  # any number may wait
        self.on_ready: Callable[[], None] | None = None  # called when items arrive
        self.coalesced = 0
        self.dropped = 0
        self.closed = False

    @property
    def lagging(self) -> bool:
        return self.nbytes > self.lag_bytes

    def put_message(self, data: bytes) -> None:
        """A control message (hello, ack, error...; as wire bytes): small,
        never refused while the queue is open."""
        if not self.closed:
            self._append(Item(data, None, 0, len(data)))

    def put_events(self, mode: Mode, batch: EncodedBatch, start: int) -> bool:
        """Queue `batch.items[start:]`; False if that overflows the bound."""
        if self.closed:
            return True  # the connection is ending: nothing more goes out
        if mode == "raw":
            stored = batch.items if start == 0 else batch.items[start:]
            size = sum(len(e.payload) for e in stored)
            self._append(Item(None, batch.topic, batch.last, size, mode=mode,
                              first=batch.first + start, stored=stored))  # fmt: skip
        elif self.lagging:
            self._put_lagging(mode, batch, start)
        elif mode == "ws":
            frames = batch.ws_single_wire()
            for i in range(start, len(frames)):
                f = frames[i]
                self._append(Item(f, batch.topic, batch.first + i, len(f)))
        elif mode == "ws_batch":
            # Behind the socket: everything queued for a topic leaves as one
            # frame, however many commits it spans.
            payloads = [e.payload for e in batch.items[start:]]
            size = sum(len(p) for p in payloads) + len(payloads)
            last = self._items[-1] if self._items else None
            if (
                last is not None
                and last.payloads is not None
                and last.topic == batch.topic
                and last.last + 1 == batch.first + start
            ):
                last.payloads += payloads
                last.last = batch.last
                last.nbytes += size
                self.nbytes += size
            else:
                self._append(
                    Item(None, batch.topic, batch.last, size + 64, mode=mode,
                         first=batch.first + start, payloads=payloads)
                )  # fmt: skip
        else:
            data = batch.sse_joined() if start == 0 else b"".join(batch.sse()[start:])
            self._append(Item(data, batch.topic, batch.last, len(data)))
        return self.nbytes <= self.max_bytes

    def put_frame(self, data: bytes, topic: str, last: int) -> bool:
        """Queue one event frame built already (a WebSocket wire frame, or
        SSE text) whose last event is at position `last` of `topic`: a
        catch-up page, built in one piece (gateway/replay_page.py). False if
        that overflows the bound."""
        if self.closed:
            return True
        self._append(Item(data, topic, last, len(data)))
        return self.nbytes <= self.max_bytes

    def _put_lagging(self, mode: Mode, batch: EncodedBatch, start: int) -> None:
        items = batch.items
        for i in range(start, len(items)):
            e = items[i]
            pos = batch.first + i
            if e.type in _DROPPABLE:
                self.dropped += 1
                continue
            spec = _MERGEABLE.get(e.type)
            if spec is None:
                data = sse_frame(pos, e.payload) if mode == "sse" else (
                    ws_wire(ws_event_frame(batch.topic, pos, e.payload))
                )  # fmt: skip
                self._append(Item(data, batch.topic, pos, len(data)))
                continue
            id_field, text_field = spec
            ev = _decode(e.payload)
            # Ids are unique within a run only: a session stream mixes runs.
            key = (e.run_id, e.type, str(ev.get(id_field, "")))
            last = self._items[-1] if self._items else None
            if last is not None and last.key == key and last.topic == batch.topic:
                assert last.event is not None
                text = str(last.event.get(text_field, "")) + str(ev.get(text_field, ""))
                ev[text_field] = text
                added = len(e.payload)
                last.event = ev
                last.last = pos
                last.nbytes += added
                self.nbytes += added
                self.coalesced += 1
                continue
            self._append(
                Item(None, batch.topic, pos, len(e.payload) + 64, mode=mode, first=pos,
                     key=key, event=ev)
            )  # fmt: skip

    def _append(self, item: Item) -> None:
        self._items.append(item)
        self.nbytes += item.nbytes
        if self._ready is not None:
            if not self._ready.done():
                self._ready.set_result(None)
        elif self.on_ready is not None:
            self.on_ready()

    async def next_items(self) -> list[Item]:
        """For the writer: everything queued, waiting until there is some;
        empty once the queue is closed. Report them `written` when the
        transport has taken them."""
        while not self._items and not self.closed:
            self._ready = asyncio.get_running_loop().create_future()
            try:
                await self._ready
            finally:
                self._ready = None
        return self.take()

    def take(self) -> list[Item]:
        items, self._items = self._items, []
        return items

    def written(self, items: list[Item]) -> None:
        self.nbytes -= sum(it.nbytes for it in items)
        self._wake_progress()

    def _wake_progress(self) -> None:
        waiters, self._progress = self._progress, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def wait_below(self, nbytes: int) -> None:
        """Wait until at most `nbytes` are queued or being written, or the
        queue is discarded. Several tasks may wait at once (e.g. the
        catch-ups of two subscriptions)."""
        while self.nbytes > nbytes:
            fut = asyncio.get_running_loop().create_future()
            self._progress.append(fut)
            await fut

    def close(self, *, drop: bool) -> None:
        """Refuse everything from now on; with `drop`, forget what is queued
        (bytes being written still count until `written`)."""
        self.closed = True
        if drop:
            self.nbytes -= sum(it.nbytes for it in self._items)
            self._items = []
        self._wake_progress()
        if self._ready is not None and not self._ready.done():
            self._ready.set_result(None)

    def discard(self) -> None:
        """The connection is closed: nothing of it is held any more."""
        self._items = []
        self.nbytes = 0
        self._wake_progress()
