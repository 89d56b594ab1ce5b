"""The client side of `bench compat`: a separate process reading SSE bodies of
any format, native or compat, with one minimal reader.

    python -m bench._sseload       # driven by the bench process over stdin/stdout

The reader does not parse events: it finds the cursor of each frame that
carries one, with one regular expression over the complete lines of each
chunk read (C speed, the same for every format), so that every format,
native SSE included, is read at the same client cost:

- `id`: an `id: <seq>` line (native SSE, AI SDK, LangGraph, Sim, AgentUiEvent, AG-UI);
- `seq`: a `"seq":<n>` field in the frame's JSON (OpenAI's `extra.seq`, for
  a format without `id:` lines; a `"seq":` inside a JSON string is escaped,
  `\\"seq\\":`, so it never matches).

Protocol with the parent: one JSON object per line each way; every command
gets one reply (`{"ok": true, ...}` or `{"ok": false, "error": ...}`).

| command | does | reply |
|---|---|---|
| `replay` url, method, headers, body, cursor, last | one request, read to the end of the body | seconds (request → the frame with seq `last`), frames (frames with a seq), last, bytes, to_eof_s |
| `follow` streams [{key, url, method, headers, body, cursor}, ...] | open every stream, wait for every 200, then record (key, seq, wall time) of each frame with a seq (more may follow before `unfollow`) | seconds |
| `unfollow` | close every followed stream | records, errors |
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from ._wsload import serve_commands

CURSORS = {
    "id": re.compile(rb"^id: (\d+)$", re.MULTILINE),
    "seq": re.compile(rb'"seq":(\d+)'),
}


async def _open(
    http: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str], body: Any
) -> aiohttp.ClientResponse:
    resp = await http.request(method, url, headers=headers, json=body)
    if resp.status != 200:
        text = await resp.text()
        resp.release()
        raise RuntimeError(f"{method} {url}: HTTP {resp.status}: {text[:300]}")
    return resp


async def _frames(resp: aiohttp.ClientResponse, on: Callable[[bytes, float], None]) -> int:
    """Read the body to its end; `on(complete lines, wall time of the read)`
    for each chunk. Returns the bytes read."""
    tail = b""
    nbytes = 0
    async for chunk in resp.content.iter_any():
        t = time.time()
        nbytes += len(chunk)
        data = tail + chunk
        cut = data.rfind(b"\n") + 1  # only complete lines: a cursor is never split
        tail = data[cut:]
        if cut:
            on(data[:cut], t)
    return nbytes


class Driver:
    def __init__(self) -> None:
        self.http: aiohttp.ClientSession | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.records: list[tuple[str, int, float]] = []
        self.errors: list[str] = []

    def _session(self) -> aiohttp.ClientSession:
        if self.http is None:
            # No pool limit: the live phase holds one connection per run.
            self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self.http

    async def replay(self, url: str, method: str, headers: dict[str, str], body: Any,
                     cursor: str, last: int, timeout_s: float = 300.0) -> dict[str, Any]:  # fmt: skip
        find = CURSORS[cursor].findall
        state = {"frames": 0, "last": 0, "t_last": 0.0}

        def on(lines: bytes, t: float) -> None:
            seqs = find(lines)
            if seqs:
                state["frames"] += len(seqs)
                seq = int(seqs[-1])
                if seq > state["last"]:
                    state["last"] = seq
                    if seq >= last and not state["t_last"]:
                        state["t_last"] = t

        http = self._session()
        t0 = time.time()
        async with asyncio.timeout(timeout_s):
            resp = await _open(http, method, url, headers, body)
            try:
                nbytes = await _frames(resp, on)
            finally:
                resp.release()
        t1 = time.time()
        if not state["t_last"]:
            raise RuntimeError(f"{url}: the body ended at seq {state['last']}, before {last}")
        # Up to the last event: a body may end some time after it.
        return {"seconds": state["t_last"] - t0, "frames": state["frames"],
                "last": state["last"], "bytes": nbytes, "to_eof_s": t1 - t0}  # fmt: skip

    async def follow(
        self, streams: list[dict[str, Any]], timeout_s: float = 60.0
    ) -> dict[str, Any]:
        """Open every stream (each: key, url, method, headers, body, cursor),
        wait for every 200, and record from then on; more may be opened
        before `unfollow`."""
        http = self._session()
        records = self.records
        t0 = time.time()

        async def one(spec: dict[str, Any], opened: asyncio.Future[None]) -> None:
            key, find = spec["key"], CURSORS[spec["cursor"]].findall

            def on(lines: bytes, t: float) -> None:
                for s in find(lines):
                    records.append((key, int(s), t))

            try:
                resp = await _open(http, spec["method"], spec["url"], spec["headers"], spec["body"])
            except Exception as e:
                opened.set_exception(e)
                return
            opened.set_result(None)
            try:
                await _frames(resp, on)
                self.errors.append(f"{key}: the body ended")  # a live follower never ends
            except (aiohttp.ClientError, OSError) as e:
                self.errors.append(f"{key}: {type(e).__name__}: {e}")
            finally:
                resp.close()

        loop = asyncio.get_running_loop()
        opened = [loop.create_future() for _ in streams]
        self.tasks += [
            asyncio.create_task(one(spec, f)) for spec, f in zip(streams, opened, strict=True)
        ]
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*opened)
        return {"seconds": time.time() - t0}

    async def unfollow(self) -> dict[str, Any]:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.tasks = []
        recs, self.records = self.records, []
        errs, self.errors = self.errors, []
        return {"records": recs, "errors": errs[:5], "n_errors": len(errs)}

    async def close(self) -> None:
        await self.unfollow()
        if self.http is not None:
            await self.http.close()


async def main() -> None:
    d = Driver()
    handlers: dict[str, Callable[..., Any]] = {
        "replay": d.replay, "follow": d.follow, "unfollow": d.unfollow,
    }  # fmt: skip
    try:
        await serve_commands(handlers)
    finally:
        await d.close()


if __name__ == "__main__":
    if "--uvloop" in sys.argv:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())
