"""The OpenAPI 3.1 document served at /v1/openapi.json.

Request bodies come from the same msgspec Structs the handlers decode with,
so the document cannot drift from what the server accepts; the rules the
Structs cannot say are added from where the server keeps them: the model
allow-list and the page limit (the gateway's settings), the user id rule
(broker/ids.py), PATCH's "at least one field". Each operation lists exactly
the statuses it can answer, described by their codes in broker/codes.py.
"""

from __future__ import annotations

import functools
import sys
import unicodedata
from typing import Any

import msgspec

from broker import codes, events, ids, models, sessions
from broker.settings import Settings

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


# What an error status means here: how it is used, then the codes of the
# registry (broker/codes.py, docs/protocol.md "Error codes") it carries.
_USES = {
    400: "bad input (the body, the query, malformed HTTP)",
    401: "no valid token",
    403: "not a member (also for unknown or malformed ids), or the role does not allow it",
    404: "not found (in a session you are a member of)",
    409: "conflict with the run's or the session's state",
    410: "too late",
    413: "the body is over max_message_bytes",
    414: "the request line is too long",
    429: "past a connection cap (retry_after_s)",
    431: "a header is too long",
    503: "retryable: a dependency is unavailable, or this gateway is draining",
}
# Codes of a status no operation here answers with (the append path's, a
# WebSocket's, a client that left).
_HIDDEN = {"client_gone", "stale_epoch", "conflict", "invalid_event", "unknown_event_type"}


def _describe(status: int) -> str:
    names = [n for n, c in codes.CODES.items()
             if c.kind == "request" and c.http == status and n not in _HIDDEN]  # fmt: skip
    return f"{_USES[status]}: {', '.join(names)}"


# Any request may be refused by the HTTP parser (400, 414, 431), is
# authenticated (401) and may meet an outage or a drain (503).
_COMMON = (400, 401, 414, 431, 503)
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
            "description": _describe(s),
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
            "text/event-stream": {"schema": {"type": "object"}},
            "application/json": {"schema": {"type": "object"}},
        }
    op["parameters"] = [
        {"name": p, "in": "path", "required": True, "schema": _path_schema(p)} for p in params
    ]
    return op


def _path_schema(name: str) -> dict[str, Any]:
    if name == "user_id":
        return {"$ref": "#/components/schemas/UserId"}
    if name in _ID_PATTERNS:
        return {"type": "string", "pattern": _ID_PATTERNS[name]}
    return {"type": "string"}


def _cursor_params(page_max_events: int) -> list[dict[str, Any]]:
    return [
        {"name": "after", "in": "query",
         "schema": {"type": "integer", "minimum": 0, "maximum": inputs.MAX_COUNT}},
        {"name": "limit", "in": "query",
         "schema": {"type": "integer", "minimum": 1, "maximum": page_max_events}},
        {"name": "Last-Event-ID", "in": "header",
         "schema": {"type": "string", "pattern": "^[0-9]+$"}},
        {"name": "access_token", "in": "query", "schema": {"type": "string"},
         "description": "the bearer token, for EventSource: only with Accept: text/event-stream"},
    ]  # fmt: skip


def _printable_class(*, space: bool) -> str:
    """A regex character class of the characters broker/ids.py's rule
    allows in a user id (str.isprintable: no control, format, surrogate,
    private-use or unassigned character, no separator but the ASCII space),
    as ranges: the same in JSON Schema (ECMA-262, u flag) and Python."""
    out, start, prev = [], -1, -2
    for cp in range(sys.maxunicode + 1):
        ok = chr(cp).isprintable() and (space or cp != 0x20)
        if ok and cp == prev + 1:
            prev = cp
            continue
        if start >= 0:
            out.append(_char(start) if start == prev else f"{_char(start)}-{_char(prev)}")
            start = -1
        if ok:
            start = prev = cp
    if start >= 0:
        out.append(f"{_char(start)}-{_char(prev)}")
    return "[" + "".join(out) + "]"


def _char(cp: int) -> str:
    if cp < 0x80:
        c = chr(cp)
        return "\\" + c if c in "\\]^-[" else c
    if cp <= 0xFFFF:
        return f"\\u{cp:04x}"
    return chr(cp)  # an astral character as itself (no escape both read alike)


@functools.cache
def _user_id_schema() -> dict[str, Any]:
    edge, inner = _printable_class(space=False), _printable_class(space=True)
    n = ids.USER_ID_MAX_CHARS
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": n,
        "pattern": f"^{edge}(?:{inner}{{0,{n - 2}}}{edge})?$",
        "description": "1 to 200 printable characters (Unicode "
        f"{unicodedata.unidata_version}), not starting or ending with a space",
    }


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


def _stream_op(summary: str, params: tuple[str, ...], errors: tuple[int, ...],
               body: str = "RunAgentInput") -> dict[str, Any]:  # fmt: skip
    """A compat format's answer: only ever an event stream (docs/compat.md)."""
    op = _op(summary, body=body, params=params, errors=errors)
    op["responses"]["200"]["content"] = {"text/event-stream": {"schema": {"type": "object"}}}
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
            " decide and continue that run)", ("session_id",), (400, 403, 409, 410, 429),
            "AgUiStart")},
    }  # fmt: skip


def _models(settings: Settings) -> list[str]:
    """What a run's `model` may be (broker/models.py): "" and the allow-list."""
    return list(dict.fromkeys(["", models.default_model(settings), *models.listed(settings)]))


def document(settings: Settings) -> dict[str, Any]:
    """The document for a gateway with these settings (the model allow-list
    and the page limit are theirs)."""
    return _document(settings.page_max_events, tuple(_models(settings)))


@functools.cache
def _document(page_max_events: int, allowed_models: tuple[str, ...]) -> dict[str, Any]:
    bodies = (rest.CreateSession, rest.AddMember, rest.SetRole, rest.StartRun,
              rest.InterruptBody, rest.DecideBody, rest.UpdateSession,
              agui_http.RunAgentInput)  # fmt: skip
    (_, *_rest), components = msgspec.json.schema_components(
        [*bodies, events.AnyEvent], ref_template="#/components/schemas/{name}"
    )
    run_events = _op("A run's events: JSON page, or SSE with Accept: text/event-stream",
                     ok=(200, 204), sse=True, params=("run_id",), errors=(400, 403, 429))  # fmt: skip
    run_events["parameters"] += _cursor_params(page_max_events)
    session_events = _op("A session's events (all runs, session cursor): page or SSE",
                         ok=(200, 204), sse=True, params=("session_id",),
                         errors=(400, 403, 429))  # fmt: skip
    session_events["parameters"] += _cursor_params(page_max_events)
    ws_op = _op("WebSocket (see docs/protocol.md); 400 if not an upgrade", ok=101,
                errors=(400, 403))  # fmt: skip
    ws_op["parameters"].append(
        {"name": "access_token", "in": "query", "schema": {"type": "string"}}
    )
    _server_rules(components, list(allowed_models))
    return {
        "openapi": "3.1.0",
        "info": {"title": "runlog gateway", "version": "1"},
        "components": {
            "schemas": {**components, "Error": _ERROR, "UserId": _user_id_schema()},
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
                "post": _op("Stop a run (owners and approvers; 409 run_ended once it has ended)",
                            body="InterruptBody", ok=(202,), params=("run_id",),
                            errors=(403, 409))},
            "/v1/runs/{run_id}/approvals/{approval_id}": {
                "post": _op("Decide an approval (first decision wins; 200 on a repeat)",
                            body="DecideBody", ok=(201, 200), params=("run_id", "approval_id"),
                            errors=(403, 404, 409, 410))},
            "/v1/ws": {"get": ws_op},
            **_agui_paths(),
        },
    }  # fmt: skip


def _server_rules(schemas: dict[str, Any], allowed_models: list[str]) -> None:
    """What the handlers check beyond the Structs' types, in the schemas."""
    schemas["AddMember"]["properties"]["user_id"] = {"$ref": "#/components/schemas/UserId"}
    schemas["StartRun"]["properties"]["model"]["enum"] = allowed_models
    schemas["AgUiRunlogProps"]["properties"]["model"]["enum"] = allowed_models
    # PATCH: the fields given change; null is a field not given, and at
    # least one must be.
    patch = schemas["UpdateSession"]
    for name, prop in patch["properties"].items():
        (given,) = [s for s in prop.pop("anyOf") if s != {"type": "null"}]
        prop.pop("default", None)
        patch["properties"][name] = {**prop, **given}
    patch["minProperties"] = 1
    # AG-UI: a session's start needs a user message (its text is the run's
    # input) unless it answers approvals (resume); no text holds a NUL.
    (text,) = [s for s in schemas["AgUiMessage"]["properties"]["content"]["anyOf"]
               if s.get("type") == "string"]  # fmt: skip
    text["pattern"] = schemas["AgUiContentPart"]["properties"]["text"]["pattern"] = inputs.NO_NUL
    user = {"type": "object", "required": ["role"], "properties": {"role": {"const": "user"}}}
    schemas["AgUiStart"] = {"allOf": [{"$ref": "#/components/schemas/RunAgentInput"}], "anyOf": [
        {"required": ["messages"], "properties": {"messages": {"contains": user}}},
        {"required": ["resume"], "properties": {"resume": {"minItems": 1}}},
    ]}  # fmt: skip
