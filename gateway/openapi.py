"""The OpenAPI 3.1 document served at /v1/openapi.json.

Request bodies come from the same msgspec Structs the handlers decode with,
so the document cannot drift from what the server accepts.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from broker import events

from . import rest

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


def _op(summary: str, *, body: str | None = None, ok: int = 200, sse: bool = False,
        params: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"bearer": []}],
        "responses": {
            str(ok): {"description": "success"},
            "default": {
                "description": "error (see docs/protocol.md for codes)",
                "content": {"application/json": {"schema": _ERROR}},
            },
        },
    }
    if body:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{body}"}}},
        }
    if sse:
        op["responses"][str(ok)]["content"] = {
            "text/event-stream": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        }
    op["parameters"] = [
        {"name": p, "in": "path", "required": True, "schema": {"type": "string"}} for p in params
    ]
    return op


_CURSOR_PARAMS = [
    {"name": "after", "in": "query", "schema": {"type": "integer", "minimum": 0}},
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
    {
        "name": "access_token",
        "in": "query",
        "schema": {"type": "string"},
        "description": "the bearer token, for EventSource: only with Accept: text/event-stream",
    },
]


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


@functools.cache
def document() -> dict[str, Any]:
    bodies = (rest.CreateSession, rest.AddMember, rest.SetRole, rest.StartRun,
              rest.InterruptBody, rest.DecideBody)  # fmt: skip
    (_, *_rest), components = msgspec.json.schema_components(
        [*bodies, events.AnyEvent], ref_template="#/components/schemas/{name}"
    )
    run_events = _op("A run's events: JSON page, or SSE with Accept: text/event-stream",
                     sse=True, params=("run_id",))  # fmt: skip
    run_events["parameters"] += _CURSOR_PARAMS
    session_events = _op("A session's events (all runs, session cursor): page or SSE",
                         sse=True, params=("session_id",))  # fmt: skip
    session_events["parameters"] += _CURSOR_PARAMS
    ws_op = _op("WebSocket (see docs/protocol.md)", ok=101)
    ws_op["parameters"].append(
        {"name": "access_token", "in": "query", "schema": {"type": "string"}}
    )
    return {
        "openapi": "3.1.0",
        "info": {"title": "runlog gateway", "version": "1"},
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "paths": {
            "/v1/config": {"get": _config_op()},
            "/v1/sessions": {"post": _op("Create a session (you become its owner)",
                                         body="CreateSession", ok=201),
                             "get": _op("Your sessions, newest first")},
            "/v1/sessions/{session_id}": {"get": _op("A session: members, runs, head",
                                                     params=("session_id",))},
            "/v1/sessions/{session_id}/members": {
                "post": _op("Add a member or change its role, as PATCH does (owners only)",
                            body="AddMember",
                            ok=201, params=("session_id",))},
            "/v1/sessions/{session_id}/members/{user_id}": {
                "patch": _op("Change a member's role (owners only; 409 last_owner for the "
                             "last owner; the member's streams end if it was demoted)",
                             body="SetRole", params=("session_id", "user_id")),
                "delete": _op("Remove a member (owners only; 409 last_owner for the last "
                              "owner; its streams end on every gateway)",
                              params=("session_id", "user_id"))},
            "/v1/sessions/{session_id}/runs": {
                "post": _op("Start a run (202 with its id; SSE with Accept: text/event-stream)",
                            body="StartRun", ok=202, sse=True, params=("session_id",))},
            "/v1/sessions/{session_id}/events": {"get": session_events},
            "/v1/runs/{run_id}": {"get": _op("A run's status", params=("run_id",))},
            "/v1/runs/{run_id}/events": {"get": run_events},
            "/v1/runs/{run_id}/interrupt": {
                "post": _op("Stop a run (owners and approvers)", body="InterruptBody", ok=202,
                            params=("run_id",))},
            "/v1/runs/{run_id}/approvals/{approval_id}": {
                "post": _op("Decide an approval (first decision wins; 200 on a repeat)",
                            body="DecideBody", ok=201, params=("run_id", "approval_id"))},
            "/v1/ws": {"get": ws_op},
        },
    }  # fmt: skip
