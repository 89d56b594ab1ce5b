"""LangGraph Platform runs API under /v1/compat/langgraph (the projection is
langgraph.py; contract in docs/compat.md, "LangGraph").

Threads are sessions and runs are runs; an assistant id is accepted and
ignored (runlog runs one agent per deployment). The token comes as
`Authorization: Bearer <token>` or, on these routes only, as LangGraph's
`x-api-key: <token>`; roles are the native ones. Request bodies are decoded
leniently: the SDKs send options runlog has no use for (`on_disconnect`,
`multitask_strategy`, `stream_resumable`, `config`, ...), and refusing them
would refuse the SDKs' own requests. A closed stream never stops a run.

Every stream answer carries `Location: /threads/{t}/runs/{r}/stream?stream_mode=...`,
relative to the prefix (the JS SDK appends it to its apiUrl; both SDKs
reconnect there by themselves with `Last-Event-ID`), and
`Content-Location: /threads/{t}/runs/{r}`.
"""

from __future__ import annotations

import datetime
from urllib.parse import urlencode

import msgspec
from aiohttp import web

from broker import errors, ids
from broker.store import RunInfo

from .. import auth, inputs, sse
from ..context import GATEWAY, Gateway, json_response
from ..rest import InvalidRequest, read_body
from .base import Context
from .langgraph import MODES, LangGraph, parse_modes
from .serve import Framing, serve_run

PREFIX = "/v1/compat/langgraph"
ASSISTANT_ID = "runlog"
_RUN_STATUS = {  # runlog run status -> the LangGraph run status the SDKs expect
    "queued": "pending",
    "running": "running",
    # Still live here (the run goes on in place once decided): an SDK whose
    # stream closed early reconnects and gets the interrupt again.
    "waiting_approval": "running",
    "completed": "success",
    "aborted": "interrupted",
    "failed": "error",
}


# -- request bodies (lenient: unknown fields are the SDKs' options)


class _ContentBlock(msgspec.Struct):
    type: str = ""
    text: inputs.LongText = ""


class _Message(msgspec.Struct):
    role: str = ""
    type: str = ""
    content: inputs.LongText | list[_ContentBlock | inputs.LongText] = ""


class _Input(msgspec.Struct):
    messages: list[_Message] = []


class _Command(msgspec.Struct):
    resume: msgspec.Raw = msgspec.Raw()  # empty: not sent
    goto: msgspec.Raw = msgspec.Raw()
    update: msgspec.Raw = msgspec.Raw()


class _RunBody(msgspec.Struct, kw_only=True):
    assistant_id: str = ""
    input: _Input | None = None
    command: _Command | None = None
    stream_mode: str | list[str] = []


class _Metadata(msgspec.Struct):
    title: inputs.Text = ""


class _ThreadBody(msgspec.Struct, kw_only=True):
    thread_id: str | None = None
    metadata: _Metadata = msgspec.field(default_factory=_Metadata)
    if_exists: str = "raise"


class _Decision(msgspec.Struct, forbid_unknown_fields=True):
    decision: str
    comment: inputs.Text = ""


def human_text(inp: _Input) -> str:
    """The last human message's text: a run's input."""
    for m in reversed(inp.messages):
        if (m.role or m.type) in ("user", "human"):
            if isinstance(m.content, str):
                return m.content
            return "".join(
                b if isinstance(b, str) else b.text
                for b in m.content
                if isinstance(b, str) or b.type == "text"
            )
    raise InvalidRequest(
        "input has no human message", hint='send {"input": {"messages": [{"role": "user", ...}]}}'
    )


def decisions(resume: msgspec.Raw, pending: list[str]) -> dict[str, tuple[str, str]]:
    """`command.resume` as {approval id: (decision, comment)}. Either keyed by
    approval id ({"ap_...": value}), or one value for the one approval waiting
    (`pending`). A value is "approve" / "reject", {"decision", "comment"?}, or
    the LangChain HITL shape {"decisions": [{"type", "message"?}]}."""
    raw = msgspec.json.decode(resume)
    if isinstance(raw, dict) and raw and all(ids.is_valid(k, ids.APPROVAL) for k in raw):
        return {k: _decision(v) for k, v in raw.items()}
    if len(pending) != 1:
        raise errors.ApprovalNotFound(
            f"the thread has {len(pending)} approvals waiting",
            hint="key command.resume by approval id (the interrupt's id)",
        )
    return {pending[0]: _decision(raw)}


def _decision(value: object) -> tuple[str, str]:
    if isinstance(value, dict) and isinstance(value.get("decisions"), list):
        many = value["decisions"]
        if len(many) != 1 or not isinstance(many[0], dict):
            raise InvalidRequest("command.resume: decisions must hold one decision")
        value = {"decision": many[0].get("type"), "comment": many[0].get("message") or ""}
    if isinstance(value, str):
        value = {"decision": value}
    try:
        d = msgspec.convert(value, _Decision)
    except msgspec.ValidationError as e:
        raise InvalidRequest(f"command.resume: {inputs.describe(e)}") from e
    if d.decision not in ("approve", "reject"):
        raise InvalidRequest(
            f"command.resume: decision {d.decision[:40]!r} is not approve or reject"
        )
    return d.decision, d.comment


# -- auth


async def _run_in_thread(gw: Gateway, user: str, thread_id: str, run_id: str) -> None:
    """Raise unless `user` may read the run and it is in the thread (another
    thread's run is answered as an unknown one)."""
    sid, _ = await gw.authorize(user, "run", run_id, auth.READ, "read")
    if sid != thread_id:
        raise errors.RunNotFound(f"no run {run_id[:64]!r} in thread {thread_id[:64]!r}")


# -- handlers


async def create_thread(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request, api_key=True)
    body = await read_body(request, _ThreadBody, gw)
    if body.thread_id:
        # runlog names its sessions; an existing one of yours is yours again.
        if body.if_exists != "do_nothing":
            raise InvalidRequest(
                "runlog chooses thread ids", hint="omit thread_id, or send if_exists=do_nothing"
            )
        await auth.require_role(gw.broker.store, body.thread_id, p.user, auth.READ, "read")
        return json_response(await _thread(gw, body.thread_id))
    sid = await gw.broker.store.create_session(p.user, body.metadata.title)
    return json_response(await _thread(gw, sid))


async def get_thread(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request, api_key=True)
    sid = request.match_info["thread_id"]
    await auth.require_role(gw.broker.store, sid, p.user, auth.READ, "read")
    return json_response(await _thread(gw, sid))


async def _thread(gw: Gateway, sid: str) -> dict[str, object]:
    info = await gw.broker.store.session_info(sid, runs_limit=1)
    last = info.runs[0].status if info.runs else None
    status = {"waiting_approval": "interrupted", "queued": "busy", "running": "busy",
              "failed": "error"}.get(last or "", "idle")  # fmt: skip
    return {"thread_id": sid, "status": status, "metadata": {}, "values": None,
            "runlog": {"head": info.head, "last_run": info.runs[0].run_id if info.runs else None}}  # fmt: skip


async def get_run(request: web.Request) -> web.Response:
    gw = request.app[GATEWAY]
    p = gw.principal(request, api_key=True)
    thread_id, run_id = request.match_info["thread_id"], request.match_info["run_id"]
    await _run_in_thread(gw, p.user, thread_id, run_id)
    return json_response(_run(await gw.broker.store.get_run(run_id)))


def _run(info: RunInfo) -> dict[str, object]:
    ended = info.ended_at_ms or info.created_at_ms
    return {
        "run_id": info.run_id,
        "thread_id": info.session_id,
        "assistant_id": ASSISTANT_ID,
        "created_at": _iso(info.created_at_ms),
        "updated_at": _iso(ended),
        "status": _RUN_STATUS.get(info.status, "running"),
        "metadata": {},
        "multitask_strategy": None,
        "kwargs": {},
    }


def _iso(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


async def cancel_run(request: web.Request) -> web.Response:
    """The SDK's `runs.cancel`: runlog's interrupt (`action=rollback`, which
    would delete the run, is refused: a log is never rewritten)."""
    gw = request.app[GATEWAY]
    p = gw.principal(request, api_key=True)
    thread_id, run_id = request.match_info["thread_id"], request.match_info["run_id"]
    if request.query.get("action", "interrupt") != "interrupt":
        raise InvalidRequest("only action=interrupt is served", hint="runlog never deletes a run")
    sid, _ = await gw.authorize(p.user, "run", run_id, auth.ACT, "interrupt runs")
    if sid != thread_id:
        raise errors.RunNotFound(f"no run {run_id[:64]!r} in thread {thread_id[:64]!r}")
    first = await gw.broker.interrupt(run_id, p.user, "cancelled through the LangGraph API")
    return json_response({"run_id": run_id, "first": first}, 202)


async def stream_run(request: web.Request) -> web.StreamResponse:
    """`POST /threads/{t}/runs/stream`: `input` starts a run; `command.resume`
    decides the approvals it names and streams on right after them."""
    gw = request.app[GATEWAY]
    p = gw.principal(request, api_key=True)
    thread_id = request.match_info["thread_id"]
    body = await read_body(request, _RunBody, gw)
    modes = parse_modes([body.stream_mode] if isinstance(body.stream_mode, str)
                        else body.stream_mode)  # fmt: skip
    if body.command is not None:
        if body.command.goto or body.command.update:
            raise InvalidRequest("command.goto and command.update are not served")
        if not body.command.resume or bytes(body.command.resume) == b"null":
            raise InvalidRequest("command needs resume")
        return await _resume(request, gw, p, thread_id, body.command.resume, modes)
    if body.input is None:
        raise InvalidRequest("send input (a new run) or command.resume (an approval's answer)")
    run_id = await gw.start_run(request, p.user, thread_id, human_text(body.input), streamed=True)
    return await _serve(request, gw, p, thread_id, run_id, 0, modes)


async def join_stream(request: web.Request) -> web.StreamResponse:
    """`GET /threads/{t}/runs/{r}/stream`: a run from `Last-Event-ID` on."""
    gw = request.app[GATEWAY]
    p = gw.principal(request, api_key=True)
    thread_id, run_id = request.match_info["thread_id"], request.match_info["run_id"]
    after = sse.cursor_from(request)
    # LangGraph joins with the modes the run was made with; runlog's runs have
    # none, so a join without modes gets them all.
    modes = parse_modes(request.query.getall("stream_mode", []), MODES)
    await _run_in_thread(gw, p.user, thread_id, run_id)
    return await _serve(request, gw, p, thread_id, run_id, after, modes)


async def _resume(
    request: web.Request, gw: Gateway, p: auth.Principal, thread_id: str, resume: msgspec.Raw,
    modes: frozenset[str],
) -> web.StreamResponse:  # fmt: skip
    await auth.require_role(gw.broker.store, thread_id, p.user, auth.READ, "read")
    try:
        chosen = decisions(resume, await _waiting(gw, thread_id))
    except msgspec.DecodeError as e:
        raise InvalidRequest("command.resume: malformed JSON") from e
    runs = {await _approval_run(gw, thread_id, a) for a in chosen}
    if len(runs) != 1:
        raise InvalidRequest("command.resume names approvals of more than one run")
    (run_id,) = runs
    for approval_id, (decision, comment) in chosen.items():
        # The one decision path: role check, decided once, 409 on another answer.
        await gw.decide(p.user, approval_id, decision, comment, run_id=run_id)
    # Right after the first of them (serve_run streams decided ones inline).
    after = await _approval_seq(gw, run_id, set(chosen))
    return await _serve(request, gw, p, thread_id, run_id, after, modes)


async def _approval_run(gw: Gateway, thread_id: str, approval_id: str) -> str:
    """The run of an approval of this thread (any other is answered as
    `Gateway.decide` answers one of a session you are not in)."""
    try:
        info = await gw.broker.store.approval(approval_id)
    except errors.ApprovalNotFound:
        info = None
    if info is None or info.session_id != thread_id:
        raise errors.NotAMember(f"approval {approval_id[:64]!r} is not in this thread")
    return info.run_id


async def _waiting(gw: Gateway, thread_id: str) -> list[str]:
    """The undecided approvals of the thread's runs that wait for one."""
    store = gw.broker.store
    runs = (await store.session_info(thread_id)).runs
    return [a.approval_id for r in runs if r.status == "waiting_approval"
            for a in await store.run_approvals(r.run_id) if a.decision is None]  # fmt: skip


async def _approval_seq(gw: Gateway, run_id: str, approval_ids: set[str]) -> int:
    """The seq of the first of these approvals' `approval_required` in the
    run's log."""
    store = gw.broker.store
    found = [s for a in approval_ids if (s := await store.approval_seq(run_id, a)) is not None]
    if not found:
        raise errors.ApprovalNotFound(
            "the approval is not in the run's log yet", hint="retry in a moment"
        )
    return min(found)


async def _serve(
    request: web.Request, gw: Gateway, p: auth.Principal, thread_id: str, run_id: str,
    after: int, modes: frozenset[str],
) -> web.StreamResponse:  # fmt: skip
    query = urlencode([("stream_mode", m) for m in sorted(modes)])
    run_path = f"/threads/{thread_id}/runs/{run_id}"
    framing = Framing(
        ids=True,
        event_names=True,
        headers={"Location": f"{run_path}/stream?{query}", "Content-Location": run_path},
    )
    projection = LangGraph(Context(run_id, thread_id), modes)
    return await serve_run(request, gw, p, run_id, after, projection, framing)


def routes(app: web.Application) -> None:
    r = app.router
    r.add_post(PREFIX + "/threads", create_thread)
    r.add_get(PREFIX + "/threads/{thread_id}", get_thread)
    r.add_post(PREFIX + "/threads/{thread_id}/runs/stream", stream_run)
    r.add_get(PREFIX + "/threads/{thread_id}/runs/{run_id}/stream", join_stream)
    r.add_get(PREFIX + "/threads/{thread_id}/runs/{run_id}", get_run)
    r.add_post(PREFIX + "/threads/{thread_id}/runs/{run_id}/cancel", cancel_run)
