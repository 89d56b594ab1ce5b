"""The python-socketio peer of `bench peers` and `bench idle`: what a team
gets from the stock Python answer to "WebSocket fan-out with rooms".

    python -m bench._sioserver        # prints {"ok": true, "port": P} when ready

- `socketio.AsyncServer(async_mode="aiohttp")` with its defaults (ping 25 s
  / 20 s) attached to an aiohttp app, as /shared/baseline/peer_socketio.py
  measured it; its connect handler puts every client in room `fan`.
- `POST /broadcast?count=C`: `for ev in events: await sio.emit("event", ev,
  to="fan")` of C events, the same `text_delta` events the gateway and the
  raw server send (bench/_rawws.py's `delta_payload`, as dicts: Socket.IO
  encodes them itself, each frame `42["event",{...}]`). Replies with the
  loop's start and end times.
- `GET /stats`: how many Socket.IO connections are in the room.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import socketio
from aiohttp import web

from ._rawws import delta_payload
from ._wsload import raise_fd_limit

ROOM = "fan"


async def serve() -> None:
    raise_fd_limit()
    sio = socketio.AsyncServer(async_mode="aiohttp", logger=False, engineio_logger=False)
    app = web.Application()
    sio.attach(app)
    state = {"conns": 0, "seq": 0}

    @sio.event
    async def connect(sid: str, environ: dict[str, Any], auth: Any = None) -> None:
        await sio.enter_room(sid, ROOM)
        state["conns"] += 1

    @sio.event
    async def disconnect(sid: str, *reason: Any) -> None:
        state["conns"] -= 1

    async def broadcast(request: web.Request) -> web.Response:
        count = int(request.query["count"])
        ts = int(time.time() * 1000)
        first = state["seq"] + 1
        evs = [json.loads(delta_payload(s, ts)) for s in range(first, first + count)]
        t0 = time.time()
        for ev in evs:
            await sio.emit("event", ev, to=ROOM)
        t1 = time.time()
        state["seq"] += count
        return web.json_response({"t_start": t0, "t_end": t1, "conns": state["conns"]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"connections": state["conns"]})

    app.router.add_post("/broadcast", broadcast)
    app.router.add_get("/stats", stats)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    sys.stdout.write(json.dumps({"ok": True, "port": runner.addresses[0][1]}) + "\n")
    sys.stdout.flush()
    try:
        await asyncio.Event().wait()  # until SIGTERM (aiohttp's runner raises GracefulExit)
    finally:
        await runner.cleanup()


def main() -> None:
    try:
        asyncio.run(serve())
    except (KeyboardInterrupt, web.GracefulExit):
        pass


if __name__ == "__main__":
    main()
