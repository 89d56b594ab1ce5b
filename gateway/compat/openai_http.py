"""The OpenAI chat completions endpoints (the chunks are gateway/compat/openai.py).

- `POST /v1/compat/openai/sessions/{session_id}/chat/completions`: a new
  run of the session, its input the last user message's text, streamed.
- `POST /v1/compat/openai/runs/{run_id}/chat/completions`: attach to a run
  (running or ended) from a cursor: the largest of `Last-Event-ID`,
  `?after=` and the body's `runlog.after` (0: the whole run); `model` and
  `messages` are required by the SDK and ignored here.

Auth is the SDK's `Authorization: Bearer <api_key>`: the api_key is a runlog
token, with the same roles as `/v1`. The answer is SSE when the body says
`stream: true` (the SDK sends `Accept: application/json` even then).

`stream: false` is refused (400 `invalid_request`) on both: a blocking
answer holds a silent connection for as long as the run lasts, approvals
included, which proxies and the SDK's own timeout cut; and the SDK re-sends
a timed-out POST, which on the sessions path would start a second run.

The body is read leniently: OpenAI clients send many parameters (temperature,
tools, n, user, ...) that mean nothing to a run; they are ignored, while the
fields read here are typed strictly. Approvals are decided through the native
`POST /v1/runs/{run_id}/approvals/{approval_id}` (the `confirm_request`
chunk names it) and a run is stopped through `POST /v1/runs/{run_id}/interrupt`.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import msgspec
from aiohttp import web

from .. import inputs, rest, sse
from ..auth import Principal
from ..context import GATEWAY, Gateway
from .base import Context
from .openai import OpenAIChunks
from .serve import Framing, serve_run

PREFIX = "/v1/compat/openai"

# No `id:` and no `retry:` lines: after either, the SDK's SSE decoder turns
# the next comment-only frame (a heartbeat) into an empty event and dies on
# its JSON. Comments alone are fine. The cursor is `extra.seq`.
FRAMING = Framing(ids=False, heartbeat=b": hb\n\n", done=b"data: [DONE]\n\n")


class _Part(msgspec.Struct, kw_only=True):
    type: str
    text: inputs.LongText = ""


class _Message(msgspec.Struct, kw_only=True):  # lenient: messages carry more (name, tool_calls)
    role: str
    content: inputs.LongText | list[_Part] | None = None


class _StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class _Runlog(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    after: inputs.Count = 0


class ChatRequest(rest.Body, forbid_unknown_fields=False):
    """What runlog reads of a chat completions request (the rest is ignored)."""

    model: inputs.ShortText = ""
    messages: list[_Message] = []
    stream: bool = False
    stream_options: _StreamOptions | None = None
    runlog: _Runlog | None = None  # the SDK's extra_body={"runlog": {"after": n}}


def routes(app: web.Application) -> None:
    app.router.add_post(PREFIX + "/sessions/{session_id}/chat/completions", new_run)
    app.router.add_post(PREFIX + "/runs/{run_id}/chat/completions", attach)


async def new_run(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    body = await _read(request, gw)
    text = _input(body)
    sid = request.match_info["session_id"]
    run_id = await gw.start_run(request, p.user, sid, text, body.model, streamed=True)
    return await _serve(request, gw, p, run_id, 0, body)


async def attach(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    after = sse.cursor_from(request)  # Last-Event-ID and ?after=
    body = await _read(request, gw)
    if body.runlog is not None:
        after = max(after, body.runlog.after)
    return await _serve(request, gw, p, request.match_info["run_id"], after, body)


async def _read(request: web.Request, gw: Gateway) -> ChatRequest:
    body = await rest.read_body(request, ChatRequest, gw)
    if not body.stream:
        raise rest.InvalidRequest(
            "only streamed chat completions are served: a blocking answer would wait, "
            "silent, for the whole run",
            hint='send "stream": true (stream=True in the SDK)',
        )
    return body


def _input(body: ChatRequest) -> str:
    """The run's input: the text of the last user message."""
    for m in reversed(body.messages):
        if m.role != "user":
            continue
        if m.content is None or isinstance(m.content, str):
            return m.content or ""
        if any(part.type != "text" for part in m.content):
            raise rest.InvalidRequest(
                "a run's input is text: the last user message has a part that is not text",
                hint='send only {"type": "text"} parts',
            )
        return "".join(part.text for part in m.content)
    raise rest.InvalidRequest(
        "no user message: a new run's input is the last user message",
        hint='add {"role": "user", "content": "..."} to messages',
    )


async def _serve(
    request: web.Request, gw: Gateway, p: Principal, run_id: str, after: int, body: ChatRequest
) -> web.StreamResponse:
    options: dict[str, object] = {
        "include_usage": body.stream_options is not None and body.stream_options.include_usage
    }
    ctx = Context(run_id, "", options=options)  # the chunks need no session id
    # The run id in a header too, for a client that started the run (to stop it).
    framing = dataclasses.replace(FRAMING, headers=MappingProxyType({"x-runlog-run-id": run_id}))
    return await serve_run(request, gw, p, run_id, after, OpenAIChunks(ctx), framing)
