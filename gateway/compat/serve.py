"""Serving a projection: one run's log, from a cursor, as a format's SSE body.

Every compat format answers the same way (`serve_run`); only its request
parsing and its `Projection` differ. Contract:

- Before the body starts (so the client gets a JSON error and a status):
  the gateway must not be draining (503 `server_draining`), the principal
  must be allowed to read the run (`not_a_member`), the connection caps
  must have room (429 `too_many_connections`, with Retry-After), and the
  cursor must not be past the run's head (400 `invalid_cursor`).
- The projection's state is rebuilt from the log: events 1..cursor go to
  `projection.track` (read from PostgreSQL in replay turns, like a
  catch-up), and `ctx.decided` gets every approval of the run decided when
  the answer begins (from PostgreSQL's approvals, which hold a decision
  before the log does). Then `projection.start()`: the envelope and the
  re-opened spans, written after `framing.preamble`.
- Then every event after the cursor, exactly once and in seq order (replay
  pages, then live: the hub's shared subscription, one per run per
  gateway), goes to `projection.feed`, and its wire items are written as
  SSE frames (`framing`). The answer ends, with `framing.done` after the
  last item, when the projection is `done` (the run ended, or an undecided
  approval ended it with the format's native interrupt) or after `run_end`.
- A cursor at the end of an ended run gets the envelope and the run's last
  event again (its terminal answer): these formats have no 204, and a
  client that missed only the end learns how the run ended.
- The connection counts against the caps, and ends like a native SSE stream
  on drain (`server_draining`), revocation (`token_revoked`), loss of access
  (`forbidden`), a PostgreSQL outage and a slow reader (`slow_consumer`):
  the body just ends, without the format's terminal event, which its
  clients treat as a cut and resume from their cursor. A projection is
  stateful, so a slow reader is never given coalesced or skipped events:
  its queue (bounded in bytes like a native one) overflows and it is cut.
  Closing the body never stops the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import msgspec
from aiohttp import web

from broker import errors, events

from .. import sse
from ..admission import Ticket
from ..auth import Principal
from ..context import Gateway
from ..sendq import Item
from ..sse import HttpStream
from .base import Projection, Wire

# Rendered output is written in pieces of about this size, so a long replay
# never holds more than this (plus one event's items) beyond its queue.
_WRITE_BYTES = 64 * 1024


@dataclass(frozen=True)
class Framing:
    """How a format's wire items become SSE bytes, and what surrounds them."""

    ids: bool = True  # write `id: <seq>` on items that carry a seq
    event_names: bool = False  # write `event: <Wire.event>` lines
    heartbeat: bytes | None = b": hb\n\n"  # sent when idle for sse_heartbeat_s; None: never
    preamble: bytes = b""  # written first (e.g. b"retry: 1000\n\n" where the client tolerates it)
    done: bytes | None = None  # written after the projection is done (e.g. b"data: [DONE]\n\n")
    content_type: str = "text/event-stream"
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def render(self, wires: list[Wire]) -> bytes:
        if len(wires) == 1:  # most events are one item: no list, no join
            data, seq, event = wires[0]
            if seq is None or not self.ids:
                if event is None or not self.event_names:
                    return b"data: %b\n\n" % data
                return b"event: %b\ndata: %b\n\n" % (event.encode(), data)
            if event is None or not self.event_names:
                return b"id: %d\ndata: %b\n\n" % (seq, data)
            return b"id: %d\nevent: %b\ndata: %b\n\n" % (seq, event.encode(), data)
        out = []
        for w in wires:
            if self.ids and w.seq is not None:
                out.append(b"id: %d\n" % w.seq)
            if self.event_names and w.event is not None:
                out.append(b"event: " + w.event.encode() + b"\n")
            out.append(b"data: " + w.data + b"\n\n")
        return b"".join(out)


def decode(payload: bytes) -> events.AnyEvent | None:
    """A stored event, or None for a type this gateway does not know (a newer
    writer's: skipped, as old readers do)."""
    try:
        return events.decode_stored(payload)
    except msgspec.ValidationError:
        return None


class CompatClient(HttpStream):
    """One compat answer: a streamed response whose writer runs the
    projection over the stored events the hub queues for it ("raw" items).
    Its life is native SSE's (sse.HttpStream); only what it writes differs.
    It ends the body without an in-band reason: these formats have none that
    their clients resume from, and a body ended without its terminal event
    is a cut."""

    kind = "compat"

    def __init__(
        self, gw: Gateway, request: web.Request, resp: web.StreamResponse, user: str,
        projection: Projection, framing: Framing, *, ticket: Ticket, issued_at: float,
    ) -> None:  # fmt: skip
        super().__init__(gw, request, resp, user, "raw", ticket=ticket, issued_at=issued_at)
        self.projection = projection
        self.framing = framing
        self.heartbeat = framing.heartbeat
        self.finished = False  # the answer's last item is rendered: nothing more goes out

    async def send(self, items: list[Item]) -> None:
        out: list[bytes] = []
        size = 0
        # The per-event loop is the replay's hot path: its lookups are hoisted,
        # and `sent` is brought up to date before every await (only then can
        # anyone else read it) instead of after every event.
        projection = self.projection
        feed, render, decode_stored = projection.feed, self.framing.render, events.decode_stored
        for it in items:
            if self.finished:
                break  # a heartbeat, or events past the end: the answer is over
            if it.stored is None:
                assert it.data is not None
                out.append(it.data)
                size += len(it.data)
                continue
            topic = it.topic
            assert topic is not None
            seq = -1
            for e in it.stored:
                seq = e.seq
                try:
                    ev = decode_stored(e.payload)
                except msgspec.ValidationError:
                    pass  # a type this gateway does not know (see `decode`)
                else:
                    data = render(feed(ev))
                    out.append(data)
                    size += len(data)
                if projection.done or e.type == "run_end":
                    self.finished = True
                    if self.framing.done is not None:
                        out.append(self.framing.done)
                    break
                if size >= _WRITE_BYTES:
                    self.sent[topic] = seq
                    await self.write(b"".join(out))
                    out, size = [], 0
            if seq >= 0:
                self.sent[topic] = seq
        if out:
            await self.write(b"".join(out))

    def after_written(self) -> None:
        if self.finished:
            self.close(None)

    def wants_heartbeat(self) -> bool:
        return not self.finished


async def serve_run(
    request: web.Request, gw: Gateway, principal: Principal, run_id: str, after: int,
    projection: Projection, framing: Framing,
) -> web.StreamResponse:  # fmt: skip
    """Authorize read of the run, then: events 1..after → projection.track,
    projection.start(), events after the cursor (replay pages, then live) →
    projection.feed, written as SSE frames, until projection.done (then
    framing.done) or the client leaves. Counts against the connection caps;
    ends like native SSE on drain / revocation (see the module's contract)."""
    sse.refuse_if_draining(gw)
    await gw.authorize_stream(principal.user, "run", run_id)
    with sse.admitted(gw, request, principal.user) as ticket:
        return await _serve(request, gw, principal, run_id, after, projection, framing, ticket)


async def _serve(
    request: web.Request, gw: Gateway, principal: Principal, run_id: str, after: int,
    projection: Projection, framing: Framing, ticket: Ticket,
) -> web.StreamResponse:  # fmt: skip
    store = gw.broker.store
    retry_s = gw.settings.db_retry_s
    head, ended = await store.stream_head(True, run_id, retry_s=retry_s)
    if after > head:
        raise errors.InvalidCursor(
            f"cursor {after} is past the head ({head})",
            hint="resume from a cursor this stream gave you",
        )
    if ended and after >= head:
        after = head - 1  # the terminal answer again (see the module's contract)
    decided = projection.ctx.decided
    decided.update(a.approval_id for a in await store.run_approvals(run_id) if a.decision)
    await _track(gw, principal.user, run_id, after, projection)
    opening = framing.preamble + framing.render(projection.start())
    sse.refuse_if_draining(gw)
    headers = {**sse.SSE_HEADERS, "Content-Type": framing.content_type, **framing.headers}
    if projection.done:  # e.g. resumed at an approval that is still undecided
        resp = await sse.begin(request, headers, opening + (framing.done or b""))
        await resp.write_eof()
        return resp
    resp = await sse.begin(request, headers, opening)
    client = CompatClient(gw, request, resp, principal.user, projection, framing,
                          ticket=ticket, issued_at=principal.issued_at)  # fmt: skip
    await client.follow("run", run_id, after)
    return resp


async def _track(gw: Gateway, user: str, run_id: str, after: int, projection: Projection) -> None:
    """Events 1..after into `projection.track`, a page per replay turn."""
    store = gw.broker.store
    s = gw.settings
    slots = gw.hub.replay_slots
    pos = 0
    while pos < after:
        await slots.acquire(user)
        try:
            page = await store.stream_page(
                True, run_id, pos, min(s.page_max_events, after - pos), retry_s=s.db_retry_s
            )
        finally:
            slots.release()
        if not page:
            return  # cannot happen below the head; never loop on it
        for e in page:
            ev = decode(e.payload)
            if ev is not None:
                projection.track(ev)
        pos = page[-1].seq
