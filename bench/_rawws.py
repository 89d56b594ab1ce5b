"""The raw aiohttp server the gateway benchmarks compare with: what one
aiohttp process does with no product code in the way.

    python -m bench._rawws [--nats-url URL]     # prints {"ok": true, "port": P} when ready

- `GET /ws[?topic=K]`: a plain `WebSocketResponse` (no heartbeat, no
  compression), kept in a set (and under topic K for the relay).
- `POST /broadcast?count=C[&rate=R&seconds=T]`: the naive broadcast,
  `for frame in frames: for ws in conns: await ws.send_str(frame)`, of C
  frames shaped like the gateway's one-event frames (same envelope, a real
  `text_delta` event as its payload, increasing cursors), so a client reads
  both servers the same way; with `rate`, one frame to all every 1/R s (for
  at most T s). Replies with the loop's start and end times.
- With `--nats-url`: a core-NATS subscription on `bench.rawlat.*`; each
  message (already a frame) is sent as it is to the connections of topic `*`,
  one `send_str` each: the raw relay the latency benchmark compares the
  product's commit → client path with.
- `GET /stats`: how many connections are open.

Written for the benchmarks (not copied from shared/baseline, whose
ws_fanout.py measures the same kind of loop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict

from aiohttp import WSMsgType, web

from broker import events

from . import _lib
from ._wsload import raise_fd_limit

RAW_RUN_ID = "r_rawbenchrawbenchrawbenc"
RAW_SESSION_ID = "s_rawbenchrawbenchrawbenc"
RELAY_SUBJECT_PREFIX = "bench.rawlat."


def event_frame(topic: str, cursor: int, payload: bytes) -> bytes:
    """The gateway's one-event frame layout (gateway/frames.py), rebuilt here."""
    return b'{"type":"event","topic":"%s","cursor":%d,"event":%s}' % (
        topic.encode(),
        cursor,
        payload,
    )


def delta_payload(seq: int, ts_ms: int, run_id: str = RAW_RUN_ID) -> bytes:
    return events.encode(
        events.TextDelta(
            message_id="m_0001",
            delta=_lib.TOKENS[seq % len(_lib.TOKENS)],
            run_id=run_id,
            session_id=RAW_SESSION_ID,
            seq=seq,
            ts=ts_ms,
        )
    )


async def serve(nats_url: str | None) -> None:
    raise_fd_limit()
    conns: set[web.WebSocketResponse] = set()
    by_topic: dict[str, list[web.WebSocketResponse]] = defaultdict(list)
    state = {"cursor": 0}
    app = web.Application()

    async def ws_handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(max_msg_size=0, compress=False)
        await ws.prepare(request)
        topic = request.query.get("topic")
        conns.add(ws)
        if topic is not None:
            by_topic[topic].append(ws)
        try:
            async for msg in ws:
                if msg.type in (WSMsgType.CLOSE, WSMsgType.ERROR):
                    break
        finally:
            conns.discard(ws)
            if topic is not None:
                by_topic[topic].remove(ws)
        return ws

    async def broadcast(request: web.Request) -> web.Response:
        """`count` frames to every connection; with `rate`, paced at that many
        frames/s (never faster, later when behind); with `seconds`, stop then."""
        count = int(request.query["count"])
        rate = float(request.query.get("rate", 0))
        seconds = float(request.query.get("seconds", 0))
        topic = "run:" + RAW_RUN_ID
        ts = int(time.time() * 1000)
        first = state["cursor"] + 1
        frames = [
            event_frame(topic, c, delta_payload(c, ts)).decode()
            for c in range(first, first + count)
        ]
        targets = list(conns)
        loop = asyncio.get_running_loop()
        t0 = time.time()
        start = loop.time()
        sent = 0
        for i, frame in enumerate(frames):
            if rate:
                now = loop.time()
                if seconds and now - start >= seconds:
                    break
                delay = start + i / rate - now
                if delay > 0:
                    await asyncio.sleep(delay)
            for ws in targets:
                await ws.send_str(frame)
            sent += 1
        t1 = time.time()
        state["cursor"] += sent
        return web.json_response(
            {"t_start": t0, "t_end": t1, "conns": len(targets), "last": state["cursor"],
             "sent": sent, "frame_bytes": sum(len(f) for f in frames) / max(1, len(frames))}
        )  # fmt: skip

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"connections": len(conns)})

    app.router.add_get("/ws", ws_handler)
    app.router.add_post("/broadcast", broadcast)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    nc = None
    if nats_url:
        import nats
        from nats.aio.msg import Msg

        nc = await nats.connect(nats_url, name="runlog-bench-rawrelay")

        async def relay(msg: Msg) -> None:
            frame = msg.data.decode()
            for ws in list(by_topic.get(msg.subject[len(RELAY_SUBJECT_PREFIX) :], ())):
                await ws.send_str(frame)

        await nc.subscribe(RELAY_SUBJECT_PREFIX + "*", cb=relay)
        await nc.flush()
    port = runner.addresses[0][1]
    sys.stdout.write(json.dumps({"ok": True, "port": port}) + "\n")
    sys.stdout.flush()
    try:
        await asyncio.Event().wait()  # until SIGTERM (aiohttp's runner raises GracefulExit)
    finally:
        if nc is not None:
            await nc.close()
        await runner.cleanup()


def main() -> None:
    p = argparse.ArgumentParser(description="raw aiohttp WebSocket server for the benchmarks")
    p.add_argument("--nats-url", default=None)
    a = p.parse_args()
    try:
        asyncio.run(serve(a.nats_url))
    except (KeyboardInterrupt, web.GracefulExit):
        pass


if __name__ == "__main__":
    main()
