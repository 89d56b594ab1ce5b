"""Experiment, not product code: a write-through fast path for the gateway's hub.

Loaded into a benchmark's gateway process to measure a suggested change
without touching gateway/ (docs/performance.md, "fanout"):

    BENCH_GATEWAY_PRELOAD=bench/_exp_fastpath.py .venv/bin/python -m bench fanout \\
        --ns "" --batch-burst-events 0 --trials 2

When a WebSocket connection has nothing queued or being written, is not
lagging, and its transport is not paused, `Member._push` writes the batch's
shared frame(s) to aiohttp's WebSocket writer at once instead of queueing
them and waking the connection's writer task. Otherwise (a client that backs
up) the stock bounded queue and writer task take over, so ordering and the
slow-client rules are unchanged. It reaches into aiohttp's private writer
(`WebSocketResponse._writer`), which a product version would avoid by
building the frame header itself.
"""

from __future__ import annotations

from typing import Any

from aiohttp import WSMsgType

from gateway import hub
from gateway.frames import EncodedBatch, ws_events_frame
from gateway.ws import WsClient

_stock_push = hub.Member._push


def _push(self: hub.Member, batch: EncodedBatch) -> None:
    conn = self.conn
    q = conn.queue
    if self.mode != "sse" and q.nbytes == 0 and isinstance(conn, WsClient) and not q.lagging:
        w: Any = getattr(conn.ws, "_writer", None)
        if w is not None and not w.protocol._paused and not w.transport.is_closing():
            start = self.position + 1 - batch.first
            if self.mode == "ws":
                frames = batch.ws_single()
                for i in range(start, len(frames)):
                    w._write_websocket_frame(frames[i], WSMsgType.TEXT, 0)
            elif start == 0:
                w._write_websocket_frame(batch.ws_batch(), WSMsgType.TEXT, 0)
            else:
                payloads = [e.payload for e in batch.items[start:]]
                frame = ws_events_frame(batch.topic, batch.first + start, payloads)
                w._write_websocket_frame(frame, WSMsgType.TEXT, 0)
            conn.sent[batch.topic] = batch.last
            self.topic.hub.metrics.events_fanned_out.inc(len(batch.items) - start)
            self.position = batch.last
            if batch.ended:
                self.ended = True
            return
    _stock_push(self, batch)


setattr(hub.Member, "_push", _push)  # noqa: B010
