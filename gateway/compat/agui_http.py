"""AG-UI's endpoints: a RunAgentInput POSTed, a run's log answered as AG-UI SSE.

- `POST /v1/compat/agui/runs/{run_id}`: attach to a run (running or ended).
  The cursor is the largest of `forwardedProps.runlog.after`,
  `Last-Event-ID` and `?after=`; `resume[]` decides the approvals it names
  and, without a cursor, the answer continues right after the last one's
  `approval_required`.
- `POST /v1/compat/agui/sessions/{session_id}`: the last user message
  starts a new run of the session (`forwardedProps.runlog.model` picks the
  model), answered from its start; with `resume[]` it decides and continues
  the run those approvals belong to instead (an HttpAgent sends its answer to
  an interrupt to the URL it ran on).

A resume entry `resolved` decides `payload.decision` ("approve" when
absent), `cancelled` rejects; `payload.comment` is the decision's comment.
The decision goes through the gateway's one decision path (role, decided
once, 409 `approval_conflict` on a different one); a `cancelled` answer to
an approval that expired is accepted (nothing is left to decide).

Both answer only as an event stream (`Accept: text/event-stream`, which the
HttpAgent always sends; 400 otherwise), so a request that could not read
the answer starts nothing. RunAgentInput is decoded leniently (fields
runlog does not use, and future ones, are ignored) but every field runlog
reads is typed and bounded.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from aiohttp import web

from broker import errors

from .. import auth, inputs, rest, sse
from ..context import GATEWAY, Gateway
from .agui import AgUi
from .base import Context
from .serve import Framing, serve_run

PREFIX = "/v1/compat/agui"
# `id:` lines and `: hb` comments are ignored by the client's parser (seen);
# LF framing only (it fails on CRLF).
FRAMING = Framing(ids=True, event_names=False)

_Id = Annotated[str, msgspec.Meta(max_length=200, pattern=inputs.NO_NUL)]


class AgUiContentPart(msgspec.Struct):
    type: str = ""
    text: str = ""


class AgUiMessage(msgspec.Struct):
    role: str = ""
    content: str | list[AgUiContentPart] | None = None


class AgUiResumePayload(msgspec.Struct, forbid_unknown_fields=True):
    decision: Literal["approve", "reject"] = "approve"
    comment: inputs.Text = ""


class AgUiResumeEntry(msgspec.Struct, rename="camel"):
    interrupt_id: _Id
    status: Literal["resolved", "cancelled"]
    payload: AgUiResumePayload | None = None


class AgUiRunlogProps(msgspec.Struct):
    after: inputs.Count | None = None
    model: inputs.ShortText = ""


class AgUiForwardedProps(msgspec.Struct):
    runlog: AgUiRunlogProps | None = None


class RunAgentInput(msgspec.Struct, rename="camel"):
    thread_id: _Id = ""
    run_id: _Id = ""
    messages: list[AgUiMessage] = []
    forwarded_props: AgUiForwardedProps | None = None
    resume: list[AgUiResumeEntry] = []


def _runlog(body: RunAgentInput) -> AgUiRunlogProps:
    fp = body.forwarded_props
    return fp.runlog if fp is not None and fp.runlog is not None else AgUiRunlogProps()


def _cursor(request: web.Request, body: RunAgentInput) -> int | None:
    """The largest cursor the request names, or None if it names none."""
    found = [c for c in (_runlog(body).after,) if c is not None] + sse.request_cursors(request)
    return max(found) if found else None


def _last_user_text(body: RunAgentInput) -> str | None:
    for m in reversed(body.messages):
        if m.role == "user":
            c = m.content
            if isinstance(c, str):
                return c
            return "".join(p.text for p in c or [] if p.type == "text")
    return None


async def _read(request: web.Request, gw: Gateway) -> RunAgentInput:
    if not rest.wants_sse(request):
        raise rest.InvalidRequest(
            "this endpoint answers as an event stream", hint="send Accept: text/event-stream"
        )
    return await rest.read_body(request, RunAgentInput, gw)


async def _decide(gw: Gateway, user: str, body: RunAgentInput, run_id: str | None,
                  session_id: str) -> tuple[str | None, int]:  # fmt: skip
    """Decide every resume entry; returns the run they belong to (None
    without entries) and the seq of the last one's `approval_required`."""
    found_run: str | None = run_id
    last = 0
    for entry in body.resume:
        aid = entry.interrupt_id
        try:
            info = await gw.broker.store.approval(aid)
        except errors.ApprovalNotFound:
            info = None
        # Unknown, or another session's: the same answer as for a stranger.
        if (
            info is None
            or info.session_id != session_id
            or (found_run is not None and info.run_id != found_run)
        ):
            raise errors.NotAMember(f"approval {aid[:64]!r} is not in this run of yours")
        found_run = info.run_id
        answer = entry.payload or AgUiResumePayload()
        decision = "reject" if entry.status == "cancelled" else answer.decision
        try:
            await gw.decide(user, aid, decision, answer.comment, run_id=info.run_id)
        except errors.ApprovalExpired:
            if entry.status != "cancelled":
                raise
        seq = await gw.broker.store.approval_seq(info.run_id, aid)
        last = max(last, seq or 0)
    return (found_run if body.resume else None), last


async def attach(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    run_id = request.match_info["run_id"]
    body = await _read(request, gw)
    sid, _ = await gw.authorize(p.user, "run", run_id, auth.READ, "read")
    after = _cursor(request, body)
    _, decided_at = await _decide(gw, p.user, body, run_id, sid)
    return await _answer(request, gw, p, run_id, sid, body, decided_at if after is None else after)


async def start(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await _read(request, gw)
    after = _cursor(request, body)
    if body.resume:
        await gw.authorize(p.user, "session", sid, auth.READ, "read")
        run_id, decided_at = await _decide(gw, p.user, body, None, sid)
        assert run_id is not None
        return await _answer(request, gw, p, run_id, sid, body,
                             decided_at if after is None else after)  # fmt: skip
    text = _last_user_text(body)
    if text is None:
        raise rest.InvalidRequest("no user message in messages: it is the run's input")
    if "\x00" in text:
        raise rest.InvalidRequest("the user message holds a NUL character")
    model = _runlog(body).model
    run_id = await gw.start_run(request, p.user, sid, text, model, streamed=True)
    return await _answer(request, gw, p, run_id, sid, body, 0)


async def _answer(request: web.Request, gw: Gateway, p: auth.Principal, run_id: str, sid: str,
                  body: RunAgentInput, after: int) -> web.StreamResponse:  # fmt: skip
    ctx = Context(run_id=run_id, session_id=sid, options={"agui_run_id": body.run_id or run_id})
    return await serve_run(request, gw, p, run_id, after, AgUi(ctx), FRAMING)


def routes(app: web.Application) -> None:
    app.router.add_post(PREFIX + "/runs/{run_id}", attach)
    app.router.add_post(PREFIX + "/sessions/{session_id}", start)
