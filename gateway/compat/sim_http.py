"""Sim agent-events-v1 routes (projection: `sim.py`; docs/compat.md):

- `POST /v1/compat/sim/sessions/{session_id}/chat`: `{input, conversationId?,
  model?, includeThinking?, includeToolCalls?}` starts a run and streams it
  (the run's id in the `X-Runlog-Run-Id` response header).
- `GET /v1/compat/sim/runs/{run_id}/stream`: a run from the cursor
  (`Last-Event-ID` or `?after=`), `?includeThinking=` / `?includeToolCalls=`
  as in the body.

`X-Sim-Stream-Protocol: agent-events-v1` negotiates live text; the session's
policy (`include_thinking`, `include_tool_calls`) decides which frames a
negotiated client sees. Everything the request says is checked before the
run starts.
"""

from __future__ import annotations

import dataclasses

import msgspec
from aiohttp import web

from broker.store import StreamPolicy

from .. import auth, inputs, rest, sse
from ..context import GATEWAY, Gateway
from .base import Context
from .serve import Framing, serve_run
from .sim import PROTOCOL_HEADER, SimProjection, check_request, exposure, negotiated

FRAMING = Framing(done=b"data: [DONE]\n\n")
RUN_ID_HEADER = "X-Runlog-Run-Id"


class SimChat(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    input: inputs.LongText = ""
    conversationId: inputs.ShortText = ""  # accepted, unused: the session is the conversation
    model: inputs.ShortText = ""
    includeThinking: bool | None = None
    includeToolCalls: bool | None = None


def _flag(request: web.Request, name: str) -> bool | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if raw in ("true", "false"):
        return raw == "true"
    raise rest.InvalidRequest(f"{name} must be true or false")


async def _policy(gw: Gateway, session_id: str) -> StreamPolicy:
    return await gw.broker.store.stream_policy(session_id)


async def chat(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await rest.read_body(request, SimChat, gw)
    neg = negotiated(request.headers.get(PROTOCOL_HEADER))
    check_request(neg, body.includeThinking, body.includeToolCalls)
    # The role first: what the session exposes is its members' business.
    await auth.require_role(gw.broker.store, sid, p.user, auth.ACT, "start runs")
    opts = exposure(neg, body.includeThinking, body.includeToolCalls, await _policy(gw, sid))
    run_id = await gw.start_run(request, p.user, sid, body.input, body.model, streamed=True)
    proj = SimProjection(Context(run_id, sid, options=opts))
    # S1 frames name no run (a text block is a message): the header tells
    # the client what to resume, stop or decide approvals of.
    framing = dataclasses.replace(
        FRAMING, headers={RUN_ID_HEADER: run_id, "Access-Control-Expose-Headers": RUN_ID_HEADER}
    )
    return await serve_run(request, gw, p, run_id, 0, proj, framing)


async def stream(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    run_id = request.match_info["run_id"]
    after = sse.cursor_from(request)
    thinking, tool_calls = _flag(request, "includeThinking"), _flag(request, "includeToolCalls")
    neg = negotiated(request.headers.get(PROTOCOL_HEADER))
    check_request(neg, thinking, tool_calls)
    sid, _ = await gw.authorize(p.user, "run", run_id, auth.READ, "read")
    opts = exposure(neg, thinking, tool_calls, await _policy(gw, sid))
    proj = SimProjection(Context(run_id, sid, options=opts))
    return await serve_run(request, gw, p, run_id, after, proj, FRAMING)


def routes(app: web.Application) -> None:
    app.router.add_post("/v1/compat/sim/sessions/{session_id}/chat", chat)
    app.router.add_get("/v1/compat/sim/runs/{run_id}/stream", stream)
