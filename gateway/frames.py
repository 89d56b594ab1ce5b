"""Server frames, built as bytes.

A topic ("run:<id>" or "session:<id>") batch is encoded at most once per wire
format and the bytes are shared by every client following the topic; the
event JSON inside is the stored payload, never re-encoded.

WebSocket (text frames, JSON):
  {"type":"event","topic":T,"cursor":N,"event":{...}}            one event
  {"type":"events","topic":T,"cursor":N,"events":[{...},...]}     several; cursor = first's
  a coalesced event adds "from":M: it stands for positions M..N
SSE (LF only):
  id: N\\ndata: {...}\\n\\n
The cursor of a run topic is the event's seq; of a session topic, the
session cursor. Resuming with the last cursor received gives what follows.
"""

from __future__ import annotations

from typing import Any

import msgspec

from broker.store import StoredEvent

_json = msgspec.json.Encoder()


def contiguous(topic: str, items: list[StoredEvent], by_run: bool) -> list[EncodedBatch]:
    """`items` (in position order) as batches without holes. A run's seqs never
    have holes; a session's cursors do once old runs are pruned."""
    out = []
    start = 0
    for i in range(1, len(items)):
        prev, cur = items[i - 1], items[i]
        if (cur.seq != prev.seq + 1) if by_run else (cur.cursor != prev.cursor + 1):
            out.append(EncodedBatch(topic, items[start:i], by_run))
            start = i
    out.append(EncodedBatch(topic, items[start:], by_run))
    return out


class EncodedBatch:
    """Contiguous events of one topic (positions first..last, no hole), with
    lazily built shared frames. Build them with `contiguous()`."""

    __slots__ = (
        "_sse",
        "_sse_joined",
        "_ws_batch",
        "_ws_batch_wire",
        "_ws_single",
        "_ws_single_wire",
        "by_run",
        "first",
        "items",
        "last",
        "topic",
    )

    def __init__(self, topic: str, items: list[StoredEvent], by_run: bool) -> None:
        self.topic = topic
        self.items = items
        self.by_run = by_run
        self.first = self.pos(items[0])
        self.last = self.pos(items[-1])
        self._ws_single: list[bytes] | None = None
        self._ws_batch: bytes | None = None
        self._sse: list[bytes] | None = None
        self._sse_joined: bytes | None = None
        self._ws_single_wire: list[bytes] | None = None
        self._ws_batch_wire: bytes | None = None

    def pos(self, e: StoredEvent) -> int:
        return e.seq if self.by_run else e.cursor

    @property
    def ended(self) -> bool:
        return self.by_run and self.items[-1].type == "run_end"

    def ws_single(self) -> list[bytes]:
        if self._ws_single is None:
            head = b'{"type":"event","topic":"' + self.topic.encode() + b'","cursor":'
            self._ws_single = [
                b"".join((head, str(self.first + i).encode(), b',"event":', e.payload, b"}"))
                for i, e in enumerate(self.items)
            ]
        return self._ws_single

    def ws_batch(self) -> bytes:
        if self._ws_batch is None:
            self._ws_batch = ws_events_frame(
                self.topic, self.first, [e.payload for e in self.items]
            )
        return self._ws_batch

    def sse(self) -> list[bytes]:
        if self._sse is None:
            self._sse = [sse_frame(self.first + i, e.payload) for i, e in enumerate(self.items)]
        return self._sse

    def ws_single_wire(self) -> list[bytes]:
        """`ws_single()` with WebSocket framing: ready for the socket, shared."""
        if self._ws_single_wire is None:
            self._ws_single_wire = [ws_wire(f) for f in self.ws_single()]
        return self._ws_single_wire

    def ws_batch_wire(self) -> bytes:
        if self._ws_batch_wire is None:
            self._ws_batch_wire = ws_wire(self.ws_batch())
        return self._ws_batch_wire

    def wire(self, mode: str, start: int) -> list[bytes]:
        """WebSocket wire frames for items[start:] in `mode` ("ws"/"ws_batch")."""
        if mode == "ws":
            frames = self.ws_single_wire()
            return frames if start == 0 else frames[start:]
        if start == 0:
            return [self.ws_batch_wire()]
        payloads = [e.payload for e in self.items[start:]]
        return [ws_wire(ws_events_frame(self.topic, self.first + start, payloads))]

    def sse_joined(self) -> bytes:
        if self._sse_joined is None:
            self._sse_joined = b"".join(self.sse())
        return self._sse_joined


def ws_wire(payload: bytes) -> bytes:
    """A server-to-client WebSocket text frame (FIN, unmasked, uncompressed)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x81, n))
    elif n < 65536:
        head = b"\x81\x7e" + n.to_bytes(2, "big")
    else:
        head = b"\x81\x7f" + n.to_bytes(8, "big")
    return head + payload


def ws_events_frame(topic: str, first: int, payloads: list[bytes]) -> bytes:
    return b"".join(
        (
            b'{"type":"events","topic":"',
            topic.encode(),
            b'","cursor":',
            str(first).encode(),
            b',"events":[',
            b",".join(payloads),
            b"]}",
        )
    )


def ws_event_frame(topic: str, pos: int, payload: bytes, from_pos: int | None = None) -> bytes:
    extra = b"" if from_pos is None else b',"from":' + str(from_pos).encode()
    return b"".join(
        (
            b'{"type":"event","topic":"',
            topic.encode(),
            b'","cursor":',
            str(pos).encode(),
            extra,
            b',"event":',
            payload,
            b"}",
        )
    )


def sse_frame(pos: int, payload: bytes) -> bytes:
    return b"id: " + str(pos).encode() + b"\ndata: " + payload + b"\n\n"


def message(type_: str, **fields: Any) -> bytes:
    """A small server message (hello, subscribed, error, ack, disconnect...)."""
    fields = {"type": type_, **fields}
    return _json.encode(fields)
