"""The AI SDK's routes, under /v1/compat/ai-sdk (docs/compat.md): what
`DefaultChatTransport` sends, answered with the UI message stream of a run
(`aisdk.AiSdkProjection`, served by `serve.serve_run`).

- `GET /runs/{run_id}/stream`: the chat's `resumeStream()`. The whole run
  from seq 1 (the client treats a resume as a replay); with `?after=` or
  `Last-Event-ID` a continuation instead; an ended run asked from its end: 204
  (the client's "no active stream").
- `POST /runs` (body `{id: run_id, messages, trigger, messageId}`): the
  chat's send after `addToolApprovalResponse`. Each approval answered in the
  last assistant message (`state: "approval-responded"`) is decided through
  the gateway's one decision path (idempotent; 409 on a different decision),
  then the run streams on from right after the last answered
  `approval_required`, continuing the same assistant message.
- `POST /sessions/{session_id}`: the same send for a session-keyed chat: the
  approval answers as above (the assistant message's id is its run's), or
  else the last user message's text starts a new run, streamed whole.
- `GET /sessions/{session_id}/stream`: the session's newest active run,
  replayed whole; 204 when none is active.

Auth, roles and caps are the native API's; stopping is runlog's
`POST /v1/runs/{id}/interrupt` (a closed stream never stops a run).
"""

from __future__ import annotations

from typing import Annotated

import msgspec
from aiohttp import web

from .. import inputs, rest, sse
from ..auth import Principal
from ..context import GATEWAY, Gateway
from . import serve
from .aisdk import AiSdkProjection
from .base import Context

PREFIX = "/v1/compat/ai-sdk"

# The client checks neither the header nor `[DONE]`, but they are its
# protocol (UI_MESSAGE_STREAM_HEADERS); comments and `id:` lines it skips.
FRAMING = serve.Framing(
    ids=True,
    done=b"data: [DONE]\n\n",
    headers={"x-vercel-ai-ui-message-stream": "v1"},
)

_NoNul = Annotated[str, msgspec.Meta(pattern=inputs.NO_NUL)]


# The client's UIMessage, as far as runlog reads it. Lenient (unknown fields
# ignored): the chat sends whole messages, whose part kinds grow with every
# release; only what is read here is checked.
class _Approval(msgspec.Struct, kw_only=True):
    id: inputs.Ref
    approved: bool | None = None
    reason: inputs.Text | None = None


class _Part(msgspec.Struct, kw_only=True):
    type: str
    text: _NoNul | None = None
    state: str | None = None
    approval: _Approval | None = None


class _Message(msgspec.Struct, kw_only=True):
    id: str = ""
    role: str
    parts: list[_Part] = []


class ChatRequest(rest.Body, forbid_unknown_fields=False):
    """The body `DefaultChatTransport` posts (plus `model`, through its
    `body` option, for a new run)."""

    id: str = ""
    messages: list[_Message] = []
    trigger: str = "submit-message"
    messageId: str | None = None  # the client's name
    model: inputs.ShortText = ""


def routes(app: web.Application) -> None:
    r = app.router
    r.add_get(PREFIX + "/runs/{run_id}/stream", run_stream)
    r.add_post(PREFIX + "/runs", run_answer)
    r.add_post(PREFIX + "/sessions/{session_id}", session_message)
    r.add_get(PREFIX + "/sessions/{session_id}/stream", session_stream)


async def run_stream(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    after = sse.cursor_from(request)
    return await _stream(request, gw, p, request.match_info["run_id"], after)


async def session_stream(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    await gw.authorize_stream(p.user, "session", sid)
    active = await gw.broker.store.active_runs(sid)
    if not active:
        return web.Response(status=204)
    return await _stream(request, gw, p, active[-1], 0)


async def run_answer(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    body = await rest.read_body(request, ChatRequest, gw)
    answers = _answers(body)
    if not answers:
        raise rest.InvalidRequest(
            "nothing to continue: no approval answered in the last assistant message",
            hint=f"send new messages to {PREFIX}/sessions/{{session_id}}",
        )
    return await _continue(request, gw, p, body.id, answers)


async def session_message(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await rest.read_body(request, ChatRequest, gw)
    answers = _answers(body)
    if answers:
        # The assistant message is its run's (`start{messageId: run_id}`).
        run_id = body.messages[-1].id
        await gw.authorize_stream(p.user, "run", run_id)
        if await gw.run_session(run_id) != sid:
            raise rest.InvalidRequest(f"run {run_id} is not in session {sid}")
        return await _continue(request, gw, p, run_id, answers)
    # Only a new user message starts a run: never an older one sent again
    # (a regenerate, or a send after a client-side tool output).
    if not body.messages or body.messages[-1].role != "user" or body.trigger != "submit-message":
        raise rest.InvalidRequest(
            "nothing to answer: the last message is neither a new user message nor an"
            " approval answer",
            hint="a runlog run cannot be regenerated: send a new message",
        )
    text = "".join(part.text or "" for part in body.messages[-1].parts if part.type == "text")
    run_id = await gw.start_run(request, p.user, sid, text, body.model, streamed=True)
    return await _stream(request, gw, p, run_id, 0)


def _answers(body: ChatRequest) -> dict[str, _Approval]:
    """The approvals answered in the last message, if it is the assistant's."""
    if not body.messages or body.messages[-1].role != "assistant":
        return {}
    return {
        part.approval.id: part.approval
        for part in body.messages[-1].parts
        if part.state == "approval-responded"
        and part.approval is not None
        and part.approval.approved is not None
    }


async def _continue(
    request: web.Request, gw: Gateway, p: Principal, run_id: str,
    answers: dict[str, _Approval],
) -> web.StreamResponse:  # fmt: skip
    """Decide each answer (the one decision path), then stream from right
    after the last answered `approval_required`."""
    for approval_id, a in answers.items():
        decision = "approve" if a.approved else "reject"
        await gw.decide(p.user, approval_id, decision, a.reason or "", run_id=run_id)
    after = await _request_seq(gw, run_id, set(answers))
    return await _stream(request, gw, p, run_id, after, decided=set(answers))


async def _request_seq(gw: Gateway, run_id: str, approval_ids: set[str]) -> int:
    """The seq of the last of these approvals' `approval_required` (all are
    in the run: `decide` checked)."""
    store = gw.broker.store
    return max([(await store.approval_seq(run_id, a)) or 0 for a in approval_ids], default=0)


async def _stream(
    request: web.Request, gw: Gateway, p: Principal, run_id: str, after: int,
    decided: set[str] | None = None,
) -> web.StreamResponse:  # fmt: skip
    # Authorized here too (serve_run does it again): a 204 tells nothing to
    # a non-member, and the run's session is known only to its members.
    await gw.authorize_stream(p.user, "run", run_id)
    sid = await gw.run_session(run_id)
    if after > 0:
        head, ended = await gw.broker.store.run_head(run_id)
        if ended and after >= head:
            return web.Response(status=204)  # the client's "no active stream"
    ctx = Context(run_id, sid, decided=set(decided or ()))
    return await serve.serve_run(request, gw, p, run_id, after, AiSdkProjection(ctx), FRAMING)
