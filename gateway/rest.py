"""REST handlers under /v1 (reference: docs/protocol.md and /v1/openapi.json).

Request bodies are JSON objects decoded strictly (unknown fields refused) and
size-limited; every error is `{"error": {"code", "message", "retryable"}}`.
"""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

import msgspec
from aiohttp import web

from broker import errors, ids, sessions
from broker.store import StoredEvent, StreamPolicy

from . import auth, inputs, sse
from .context import GATEWAY, Gateway, json_response

Digest = inputs.Digest
Text = inputs.Text  # no NUL in any text field (see inputs.py)
UserId = Annotated[
    str, msgspec.Meta(min_length=1, max_length=ids.USER_ID_MAX_CHARS, pattern=inputs.NO_NUL)
]
Role = Literal["owner", "approver", "viewer"]
Policy = Literal["reject", "enqueue", "interrupt"]


class Body(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The base of a request body `read_body` decodes: keyword-only fields,
    unknown fields refused (a misspelt option is an error, not ignored). The
    native routes' bodies derive from it; a compat format whose clients send
    options runlog has no use for derives with `forbid_unknown_fields=False`."""


class CreateSession(Body):
    title: Text = ""
    run_policy: Policy = "enqueue"
    # What Sim agent-events-v1 clients may see (docs/compat.md).
    include_thinking: bool = False
    include_tool_calls: bool = False


class UpdateSession(Body):
    """PATCH: the fields given change, the others stay (owners only)."""

    title: Text | None = None
    run_policy: Policy | None = None
    include_thinking: bool | None = None
    include_tool_calls: bool | None = None
    # true: leaves the default list and takes no new run; false: back.
    archived: bool | None = None


class AddMember(Body):
    user_id: UserId
    role: Role

    def __post_init__(self) -> None:
        # The rest of the user id rule, in the one place it is written.
        problem = ids.user_id_problem(self.user_id)
        if problem is not None:
            raise ValueError(f"{problem} - at `$.user_id`")


class SetRole(Body):
    role: Role


class StartRun(Body):
    input: inputs.LongText = ""
    model: inputs.ShortText = ""


class InterruptBody(Body):
    reason: Text = ""


class DecideBody(Body):
    decision: Literal["approve", "reject"]
    comment: Text = ""
    call_digest: Digest = ""  # what the approver was shown; 409 approval_stale if it changed


InvalidRequest = errors.InvalidRequest  # 400 invalid_request (the compat formats raise it too)


B = TypeVar("B", bound=msgspec.Struct)  # a Body, or a compat format's own struct


async def read_body(request: web.Request, typ: type[B], gw: Gateway) -> B:
    """The request's JSON body as `typ`, for every route that takes one (native
    and compat): over max_message_bytes is 413 `payload_too_large` (refused
    by its Content-Length before reading, when it says so), an empty body is
    `{}`, and malformed JSON or a body `typ` refuses is 400 `invalid_request`,
    in words (inputs.describe)."""
    limit = gw.settings.max_message_bytes
    if request.content_length is not None and request.content_length > limit:
        raise errors.PayloadTooLarge(f"body is over {limit} bytes")
    data = await request.content.read(limit + 1)
    if len(data) > limit:
        raise errors.PayloadTooLarge(f"body is over {limit} bytes")
    if not data.strip():
        data = b"{}"
    try:
        return msgspec.json.decode(data, type=typ)
    except msgspec.ValidationError as e:
        raise InvalidRequest(inputs.describe(e)) from e
    except msgspec.DecodeError as e:
        raise InvalidRequest("malformed JSON body") from e


def wants_sse(request: web.Request) -> bool:
    # A HEAD gets the JSON page's headers: a stream's body has no place there.
    return request.method != "HEAD" and "text/event-stream" in request.headers.get("Accept", "")


def _limit(request: web.Request, gw: Gateway) -> int:
    raw = request.query.get("limit", "")
    if raw == "":
        return gw.settings.page_max_events
    n = inputs.parse_count(raw)
    if n is None or not 1 <= n <= gw.settings.page_max_events:
        raise InvalidRequest(f"limit must be 1..{gw.settings.page_max_events} in ASCII digits")
    return n


async def create_session(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    body = await read_body(request, CreateSession, gw)
    policy = StreamPolicy(
        include_thinking=body.include_thinking, include_tool_calls=body.include_tool_calls
    )
    sid = await gw.broker.store.create_session(p.user, body.title, policy)
    if body.run_policy != "enqueue":
        await gw.broker.store.set_run_policy(sid, body.run_policy)
    return json_response(
        {"session_id": sid, "run_policy": body.run_policy, **msgspec.structs.asdict(policy)}, 201
    )


async def update_session(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await read_body(request, UpdateSession, gw)
    changes = sessions.Changes(
        title=body.title, run_policy=body.run_policy, include_thinking=body.include_thinking,
        include_tool_calls=body.include_tool_calls, archived=body.archived,
    )  # fmt: skip
    if changes == sessions.Changes():
        raise InvalidRequest(
            "nothing to change: give title, run_policy, include_thinking, include_tool_calls"
            " or archived"
        )
    await auth.require_role(gw.broker.store, sid, p.user, auth.MANAGE, "change the session")
    before, after = await gw.broker.store.update_session(sid, p.user, changes)
    return json_response({"session_id": sid, **_settings(after), "previous": _settings(before)})


def _settings(s: sessions.Settings) -> dict[str, object]:
    return {"title": s.title, "run_policy": s.run_policy, "include_thinking": s.include_thinking,
            "include_tool_calls": s.include_tool_calls, "archived_at": s.archived_at_ms}  # fmt: skip


def _list_query(request: web.Request) -> tuple[str, bool, sessions.PageKey | None]:
    """`?q=` (title search), `?archived=true|false` and `?before=` of the list."""
    q = request.query.get("q", "")
    if len(q) > sessions.QUERY_MAX_CHARS or "\x00" in q:
        raise InvalidRequest(f"q is at most {sessions.QUERY_MAX_CHARS} characters, without NUL")
    archived = request.query.get("archived", "false")
    if archived not in ("true", "false"):
        raise InvalidRequest("archived must be true or false")
    raw = request.query.get("before", "")
    return q, archived == "true", sessions.PageKey.decode(raw) if raw else None


async def list_sessions(request: web.Request) -> web.Response:
    """The sessions the caller is a member of, newest first, a page at a time."""
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    q, archived, before = _list_query(request)
    rows, more = await gw.broker.store.sessions_page(
        p.user, query=q, archived=archived, before=before
    )
    return json_response(
        {
            "sessions": [
                {"session_id": r.session_id, "title": r.title, "your_role": r.role,
                 "head": r.head, "created_at": r.created_at_ms, "archived_at": r.archived_at_ms}
                for r in rows
            ],
            "next_before": None if more is None else more.encode(),
        }
    )  # fmt: skip


async def get_session(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    role = await auth.require_role(gw.broker.store, sid, p.user, auth.READ, "read")
    info = await gw.broker.store.session_info(sid)
    return json_response(
        {
            "session_id": sid,
            "title": info.title,
            "your_role": role,
            "head": info.head,
            "created_at": info.created_at_ms,
            "archived_at": info.archived_at_ms,
            "run_policy": info.run_policy,
            **msgspec.structs.asdict(info.stream_policy),
            "members": [{"user_id": u, "role": r} for u, r in info.members],
            "runs": [msgspec.structs.asdict(r) for r in info.runs],
            "queued": [msgspec.structs.asdict(q) for q in info.queued],
        }
    )


async def add_member(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await read_body(request, AddMember, gw)
    await auth.require_role(gw.broker.store, sid, p.user, auth.MANAGE, "add members")
    # An existing member's role is changed, under the same rules as PATCH.
    before = await gw.broker.store.add_member(sid, body.user_id, body.role, p.user)
    await gw.access.member_changed(sid, body.user_id, body.role, before)
    return json_response({"session_id": sid, "user_id": body.user_id, "role": body.role,
                          "previous_role": before}, 201)  # fmt: skip


def _member_id(sid: str, user_id: str) -> None:
    """A path's user id that no user can have is answered as a non-member is
    (after the owner check, so it tells a non-owner nothing), without a query."""
    if ids.user_id_problem(user_id) is not None:
        raise errors.MemberNotFound(f"{user_id[:64]!r} is not a member of session {sid}")


async def set_member_role(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid, user_id = request.match_info["session_id"], request.match_info["user_id"]
    body = await read_body(request, SetRole, gw)
    await auth.require_role(gw.broker.store, sid, p.user, auth.MANAGE, "change roles")
    _member_id(sid, user_id)
    before = await gw.broker.store.set_member_role(sid, user_id, body.role, p.user)
    await gw.access.member_changed(sid, user_id, body.role, before)
    return json_response(
        {"session_id": sid, "user_id": user_id, "role": body.role, "previous_role": before}
    )


async def remove_member(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid, user_id = request.match_info["session_id"], request.match_info["user_id"]
    await auth.require_role(gw.broker.store, sid, p.user, auth.MANAGE, "remove members")
    _member_id(sid, user_id)
    before = await gw.broker.store.remove_member(sid, user_id, p.user)
    await gw.access.member_changed(sid, user_id, None, before)
    return json_response(
        {"session_id": sid, "user_id": user_id, "role": None, "previous_role": before}
    )


async def start_run(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    sid = request.match_info["session_id"]
    body = await read_body(request, StartRun, gw)
    streamed = wants_sse(request)
    run_id, ahead = await gw.queue_run(
        request, p.user, sid, body.input, body.model, streamed=streamed
    )
    if streamed:
        return await sse.stream(request, gw, p.user, "run", run_id, 0, issued_at=p.issued_at)
    # `ahead`: the session's runs that had not ended when it was created; it
    # starts once they have (0: it starts now).
    return json_response(
        {"run_id": run_id, "session_id": sid, "events_url": f"/v1/runs/{run_id}/events",
         "status": "queued", "ahead": ahead},
        202,
    )  # fmt: skip


async def get_run(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    run_id = request.match_info["run_id"]
    await gw.authorize_stream(p.user, "run", run_id)
    info = await gw.broker.store.get_run(run_id)
    stop = await gw.broker.store.interrupt_request(run_id)
    hidden = ("owner_id", "owner_epoch", "takeovers")
    out: dict[str, object] = {
        k: v for k, v in msgspec.structs.asdict(info).items() if k not in hidden
    }
    # Who executes it now (None: no worker has started it): the worker's
    # name, its ownership epoch (one more at every takeover) and takeovers.
    out["owner"] = (
        None
        if info.owner_id is None
        else {"worker_id": info.owner_id, "epoch": info.owner_epoch, "takeovers": info.takeovers}
    )
    out["interrupt"] = (
        None
        if stop is None
        else {"requested_by": stop[0], "requested_at": stop[1], "reason": stop[2]}
    )
    return json_response(out)


async def run_events(request: web.Request) -> web.StreamResponse:
    return await _events(request, "run", request.match_info["run_id"])


async def session_events(request: web.Request) -> web.StreamResponse:
    return await _events(request, "session", request.match_info["session_id"])


async def _events(request: web.Request, kind: str, ident: str) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    # All of the request is read before any query (a bad cursor costs nothing).
    after = sse.cursor_from(request)
    limit = 0 if wants_sse(request) else _limit(request, gw)
    await gw.authorize_stream(p.user, kind, ident)
    if wants_sse(request):
        return await sse.stream(request, gw, p.user, kind, ident, after, issued_at=p.issued_at)
    store = gw.broker.store
    by_run = kind == "run"
    retry_s = gw.settings.db_retry_s
    page = await store.stream_page(by_run, ident, after, limit, retry_s=retry_s)
    head, ended = await store.stream_head(by_run, ident, retry_s=retry_s)
    if after > head:
        raise errors.InvalidCursor(f"cursor {after} is past the head ({head})")
    page = _up_to_hole(page, by_run)
    first = (page[0].seq if by_run else page[0].cursor) if page else after
    last = (page[-1].seq if by_run else page[-1].cursor) if page else after
    # The stored JSON goes out as it is: no decode, no re-encode.
    body = b"".join(
        (
            b'{"events":[',
            b",".join(e.payload for e in page),
            b'],"cursor":',
            str(first).encode(),
            b',"next_after":',
            str(last).encode(),
            b',"head":',
            str(head).encode(),
            b',"ended":',
            b"true" if ended and last >= head else b"false",
            b"}",
        )
    )
    return web.Response(body=body, content_type="application/json")


def _up_to_hole(page: list[StoredEvent], by_run: bool) -> list[StoredEvent]:
    """The page up to its first hole, so that event i has cursor `cursor + i`
    (a session's cursors have holes where pruned runs were; a run's never)."""
    if by_run or len(page) < 2 or page[-1].cursor - page[0].cursor == len(page) - 1:
        return page
    for i in range(1, len(page)):
        if page[i].cursor != page[i - 1].cursor + 1:
            return page[:i]
    return page


async def interrupt(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    run_id = request.match_info["run_id"]
    body = await read_body(request, InterruptBody, gw)
    await gw.authorize(p.user, "run", run_id, auth.ACT, "interrupt runs")
    first = await gw.broker.interrupt(run_id, p.user, body.reason)
    return json_response({"run_id": run_id, "first": first}, 202)


async def decide_approval(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request)
    approval_id = request.match_info["approval_id"]
    body = await read_body(request, DecideBody, gw)
    result = await gw.decide(
        p.user,
        approval_id,
        body.decision,
        body.comment,
        run_id=request.match_info["run_id"],
        call_digest=body.call_digest,
    )
    return json_response(result, 201 if result["created"] else 200)
