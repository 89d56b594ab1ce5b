"""The OpenAPI 3.1 document served at /v1/openapi.json.

Request bodies come from the same msgspec Structs the handlers decode with,
so the document cannot drift from what the server accepts.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from broker import events, sessions

from . import inputs, rest
from .compat import agui_http

_ERROR = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "retryable": {"type": "boolean"},
                "hint": {"type": "string"},
            },
            "required": ["code", "message", "retryable"],
        }
    },
}


# Every error status an operation can answer, with what it means here (the
# codes are in docs/protocol.md). An operation lists exactly its own.
_ERRORS = {
    400: "bad input: invalid_request (body, limit), invalid_cursor, bad_request",
    401: "unauthorized / token_expired",
    403: "not_a_member (also for unknown or malformed ids) / forbidden",
    404: "not found (approval_not_found, in a run you are a member of)",
    409: "conflict (run_busy, session_archived, approval_conflict, ...)",
    410: "approval_expired",
    413: "payload_too_large",
    429: "too_many_connections (retry_after_s)",
    503: "storage_unavailable / server_draining / bus_unavailable (retryable)",
}
_COMMON = (401, 503)
_WITH_BODY = (400, 413)

# The form of the ids (broker/ids.py). A path id of another form is answered
# as an unknown one, so clients may send anything; this says what exists.
_ID_PATTERNS = {
    "session_id": "^s_[A-Za-z0-9_-]{22}$",
    "run_id": "^r_[A-Za-z0-9_-]{22}$",
    "approval_id": "^ap_[A-Za-z0-9_-]{22}$",
}


def _op(summary: str, *, body: str | None = None, ok: int | tuple[int, ...] = 200,
        sse: bool = False, params: tuple[str, ...] = (),
        errors: tuple[int, ...] = ()) -> dict[str, Any]:  # fmt: skip
    ok = (ok,) if isinstance(ok, int) else ok
    statuses = sorted({*errors, *_COMMON, *(_WITH_BODY if body else ())})
    responses: dict[str, Any] = {
        str(s): {"description": "no content (an ended run, read from its end)" if s == 204
                 else "success"} for s in ok
    }  # fmt: skip
    for s in statuses:
        responses[str(s)] = {
            "description": _ERRORS[s],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
    op: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}], "responses": responses}
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    if sse:  # 200 is the stream (or, without Accept: text/event-stream, the page)
        responses["200"]["content"] = {
            "text/event-stream": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        }
    op["parameters"] = [
        {"name": p, "in": "path", "required": True,
         "schema": {"type": "string", **({"pattern": _ID_PATTERNS[p]} if p in _ID_PATTERNS
                                         else {})}}
        for p in params
    ]  # fmt: skip
    return op


_CURSOR_PARAMS = [
    {"name": "after", "in": "query",
     "schema": {"type": "integer", "minimum": 0, "maximum": inputs.MAX_COUNT}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    {"name": "access_token", "in": "query", "schema": {"type": "string"},
     "description": "the bearer token, for EventSource: only with Accept: text/event-stream"},
]  # fmt: skip


def _list_op() -> dict[str, Any]:
    """`GET /v1/sessions`: a page of yours, searched and filtered."""
    op = _op("Your sessions, newest first, a page at a time (next_before: the next page)",
             errors=(400,))  # fmt: skip
    op["parameters"] = [
        {"name": "q", "in": "query", "description": "title contains this, any case",
         "schema": {"type": "string", "maxLength": sessions.QUERY_MAX_CHARS}},
        {"name": "archived", "in": "query", "description": "true: only the archived ones",
         "schema": {"type": "string", "enum": ["true", "false"]}},
        {"name": "before", "in": "query", "description": "a page's next_before",
         "schema": {"type": "string", "pattern": "^[0-9]{1,18}[.]s_[A-Za-z0-9_-]{22}$"}},
    ]  # fmt: skip
    return op


def _config_op() -> dict[str, Any]:
    """`GET /v1/config` needs no token: a console reads it before it has one."""
    op = _op("This deployment's public facts: the gateways a console may use")
    op["security"] = []
    op["responses"]["200"]["content"] = {"application/json": {"schema": {
        "type": "object",
        "properties": {"gateways": {"type": "array", "items": {"type": "string"}}},
        "required": ["gateways"],
    }}}  # fmt: skip
    return op


def _stream_op(summary: str, params: tuple[str, ...], errors: tuple[int, ...]) -> dict[str, Any]:
    """A compat format's answer: only ever an event stream (docs/compat.md)."""
    op = _op(summary, body="RunAgentInput", params=params, errors=errors)
    op["responses"]["200"]["content"] = {"text/event-stream": {"schema": {"type": "string"}}}
    op["parameters"].append({"name": "Last-Event-ID", "in": "header",
                             "schema": {"type": "string", "pattern": "^[0-9]+$"}})  # fmt: skip
    return op


def _agui_paths() -> dict[str, Any]:
    p = agui_http.PREFIX
    return {
        p + "/runs/{run_id}": {"post": _stream_op(
            "AG-UI: a run's events from a cursor (forwardedProps.runlog.after or Last-Event-ID);"
            " resume[] decides its approvals", ("run_id",), (400, 403, 409, 410, 429))},
        p + "/sessions/{session_id}": {"post": _stream_op(
            "AG-UI: the last user message starts a run, answered as it streams (with resume[]:"
            " decide and continue that run)", ("session_id",), (400, 403, 409, 410, 429))},
    }  # fmt: skip


@functools.cache
def document() -> dict[str, Any]:
    bodies = (rest.CreateSession, rest.AddMember, rest.SetRole, rest.StartRun,
              rest.InterruptBody, rest.DecideBody, rest.UpdateSession,
              agui_http.RunAgentInput)  # fmt: skip
    (_, *_rest), components = msgspec.json.schema_components(
        [*bodies, events.AnyEvent], ref_template="#/components/schemas/{name}"
    )
    run_events = _op("A run's events: JSON page, or SSE with Accept: text/event-stream",
                     ok=(200, 204), sse=True, params=("run_id",), errors=(400, 403, 429))  # fmt: skip
    run_events["parameters"] += _CURSOR_PARAMS
    session_events = _op("A session's events (all runs, session cursor): page or SSE",
                         ok=(200, 204), sse=True, params=("session_id",),
                         errors=(400, 403, 429))  # fmt: skip
    session_events["parameters"] += _CURSOR_PARAMS
    ws_op = _op("WebSocket (see docs/protocol.md); 400 if not an upgrade", ok=101,
                errors=(400, 403))  # fmt: skip
    ws_op["parameters"].append(
        {"name": "access_token", "in": "query", "schema": {"type": "string"}}
    )
    return {
        "openapi": "3.1.0",
        "info": {"title": "runlog gateway", "version": "1"},
        "components": {
            "schemas": {**components, "Error": _ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "paths": {
            "/v1/config": {"get": _config_op()},
            "/v1/sessions": {"post": _op("Create a session (you become its owner)",
                                         body="CreateSession", ok=(201,)),
                             "get": _list_op()},
            "/v1/sessions/{session_id}": {"get": _op("A session: members, runs, queued runs, head",
                                                     params=("session_id",), errors=(403,)),
                                          "patch": _op("Rename, set the run policy, what Sim "
                                                       "agent-events-v1 clients may see, or "
                                                       "archive (owners only; audited)",
                                                       body="UpdateSession",
                                                       params=("session_id",), errors=(403,))},
            "/v1/sessions/{session_id}/members": {
                "post": _op("Add a member or change its role, as PATCH does (owners only)",
                            body="AddMember", ok=201, params=("session_id",),
                            errors=(403, 409))},
            "/v1/sessions/{session_id}/members/{user_id}": {
                "patch": _op("Change a member's role (owners only; 409 last_owner for the "
                             "last owner; the member's streams end if it was demoted)",
                             body="SetRole", params=("session_id", "user_id"),
                             errors=(403, 404, 409)),
                "delete": _op("Remove a member (owners only; 409 last_owner for the last "
                              "owner; its streams end on every gateway)",
                              params=("session_id", "user_id"), errors=(403, 404, 409))},
            "/v1/sessions/{session_id}/runs": {
                "post": _op("Start a run (202 with its id, and `ahead`: the unended runs it "
                            "waits for; SSE with Accept: text/event-stream)",
                            body="StartRun", ok=(202, 200), sse=True, params=("session_id",),
                            errors=(403, 409, 429))},
            "/v1/sessions/{session_id}/events": {"get": session_events},
            "/v1/runs/{run_id}": {"get": _op("A run's status", params=("run_id",),
                                             errors=(403,))},
            "/v1/runs/{run_id}/events": {"get": run_events},
            "/v1/runs/{run_id}/interrupt": {
                "post": _op("Stop a run (owners and approvers)", body="InterruptBody", ok=(202,),
                            params=("run_id",), errors=(403,))},
            "/v1/runs/{run_id}/approvals/{approval_id}": {
                "post": _op("Decide an approval (first decision wins; 200 on a repeat)",
                            body="DecideBody", ok=(201, 200), params=("run_id", "approval_id"),
                            errors=(403, 404, 409, 410))},
            "/v1/ws": {"get": ws_op},
            **_agui_paths(),
        },
    }  # fmt: skip
