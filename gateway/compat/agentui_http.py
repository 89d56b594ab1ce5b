"""AgentUiEvent routes (projection: `agentui.py`; docs/compat.md):

- `POST /v1/compat/agent-ui/sessions/{session_id}/runs`: `{goal, model?,
  sessionId?}` starts a run and streams it (fetch + ReadableStream).
- `GET /v1/compat/agent-ui/runs/{run_id}/events?after=seq`: the events after
  `seq` (or `Last-Event-ID`), then live, until the run ends.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from .. import auth, inputs, rest, sse
from ..context import GATEWAY
from .agentui import AgentUiProjection
from .base import Context
from .serve import Framing, serve_run

FRAMING = Framing()  # `id: <seq>` lines and `: hb` comments: the seed's parser skips both


class StartBody(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    goal: inputs.LongText = ""
    model: inputs.ShortText = ""
    sessionId: inputs.ShortText = ""  # the seed sends it; it must be the path's when given


async def start(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await rest.read_body(request, StartBody, gw)
    if body.sessionId and body.sessionId != sid:
        raise rest.InvalidRequest("sessionId is not the session of the path")
    run_id = await gw.start_run(request, p.user, sid, body.goal, body.model, streamed=True)
    return await serve_run(request, gw, p, run_id, 0, AgentUiProjection(Context(run_id, sid)),
                           FRAMING)  # fmt: skip


async def events(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    run_id = request.match_info["run_id"]
    after = sse.cursor_from(request)
    sid, _ = await gw.authorize(p.user, "run", run_id, auth.READ, "read")
    return await serve_run(request, gw, p, run_id, after, AgentUiProjection(Context(run_id, sid)),
                           FRAMING)  # fmt: skip


def routes(app: web.Application) -> None:
    app.router.add_post("/v1/compat/agent-ui/sessions/{session_id}/runs", start)
    app.router.add_get("/v1/compat/agent-ui/runs/{run_id}/events", events)
