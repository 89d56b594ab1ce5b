"""Bad input on every endpoint, as one table (issue 10, items 8, 9 and 12).

Each row is a request that a client may send and the one answer it must get
(status and code). Each row also checks that the request changed nothing (row
counts of every table), that its bad value never reached PostgreSQL (the
gateway's database connections go through a recording proxy: most rows must
send it nothing at all) and that nothing was logged at WARNING or above (a
client's fault is not the operator's problem).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote_to_bytes

import aiohttp
import asyncpg
import pytest
import pytest_asyncio
from yarl import URL

from broker import approvals, ids
from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth, inputs

from .gw import RunningGateway, running_gateway, write_run
from .proxy import CuttingProxy

# -- the rules themselves (pure)


def test_id_forms() -> None:
    sid = ids.session_id()
    assert ids.is_valid(sid, ids.SESSION) and ids.is_valid(sid)
    assert not ids.is_valid(sid, ids.RUN)  # another type's id
    assert not ids.is_valid(sid + "\n")  # "$" would have matched before it
    assert not ids.is_valid(sid[:-1] + "\u00b2") and not ids.is_valid(sid + "A")
    assert ids.is_valid(ids.approval_id(), ids.APPROVAL) and ids.is_valid(ids.run_id(), ids.RUN)


@pytest.mark.parametrize("user", ["alice", "auth0|5f1e", "a.b@example.com", "Zoë Ng", "日本"])
def test_user_ids_accepted(user: str) -> None:
    assert ids.user_id_problem(user) is None


@pytest.mark.parametrize("user", ["", "x" * 201, " a", "a ", "a\x00", "a\u202eb", "a\u2069",
                                  "a\u200bb", "\ufeffa", "a\u00a0b", "a\u2028b", "\ud800",
                                  "a\x7f", "\ue000"])  # fmt: skip
def test_user_ids_refused(user: str) -> None:
    assert ids.user_id_problem(user) is not None


def test_counts_are_ascii_digits() -> None:
    assert [inputs.parse_count(v) for v in ("0", "7", "007", str(2**63 - 1))] == [
        0, 7, 7, 2**63 - 1]  # fmt: skip
    refused = ["", "\u00b2", "\u0663", "\uff13", "+3", " 3", "3 ", "-1", "1e3", "0x1", "1_0",
               "3\n", str(2**63), "9" * 20]  # fmt: skip
    assert [v for v in refused if inputs.parse_count(v) is not None] == []


# -- the table

_TABLES = ("sessions", "members", "runs", "events", "approvals", "audit")
_COUNTS = "SELECT " + ", ".join(f"(SELECT count(*) FROM {t})" for t in _TABLES)


@dataclasses.dataclass(frozen=True)
class World:
    """alice's session (sid) with a run (rid) and a pending approval (aid);
    bob's (sid2, rid2, aid2), of which alice is not a member."""

    gw: RunningGateway
    proxy: CuttingProxy
    db: asyncpg.Connection
    ids: dict[str, str]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def world(settings: Settings) -> AsyncIterator[World]:
    proxy = CuttingProxy.in_front_of(settings.database_url)
    await proxy.start()
    db = await asyncpg.connect(settings.database_url)
    b = await Broker.connect(settings, name="bad-input-setup")
    try:
        found: dict[str, str] = {}
        for user, suffix in (("alice", ""), ("bob", "2")):
            sid = await b.store.create_session(user, "t")
            rid, _ = await write_run(b, sid, 3, end=False)
            aid = f"ap_{'A' * 21}{suffix or '1'}"
            await approvals.create(b.store, approval_id=aid, run_id=rid, epoch=1,
                                   tool_call_id="c", summary="s",
                                   expires_at_ms=int(time.time() * 1000) + 3_600_000)  # fmt: skip
            found |= {"sid" + suffix: sid, "rid" + suffix: rid, "aid" + suffix: aid}
        # No census and no access re-check (its queries, every access_recheck_s,
        # would land in whichever row is recording then): the proxy must see
        # only what requests cause.
        async with running_gateway(
            settings, database_url=proxy.route(settings.database_url), runs_sample_interval_s=0,
            control_rate_per_s=1000, access_recheck_s=3600,
        ) as gw:  # fmt: skip
            yield World(gw, proxy, db, found)
    finally:
        await b.close()
        await db.close()
        await proxy.stop()


@dataclasses.dataclass(frozen=True)
class Row:
    what: str
    method: str
    path: str  # percent-encoded as sent; {sid} {rid} {aid} {sid2} {rid2} {aid2} filled in
    status: int
    code: str | None  # the error code; None for a success
    body: bytes | None = None
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    user: str | None = "alice"  # whose token; None: the headers carry their own
    mentions: str = ""  # the error message names this (the field at fault)
    says: str = ""  # ... and says this of it
    reads: bytes | None = None  # the answer needs a read: of valid ids, never of this


def _j(obj: object) -> bytes:
    return json.dumps(obj).encode()


NUL = "\u0000"
NOT_A_MEMBER = (403, "not_a_member")

# Malformed ids, percent-encoded, for a type prefix; and one well-formed unknown
# id (the control: malformed and unknown must get the same answer).
_BAD_IDS = {
    "nul": "%00",
    "nul_inside": "{p}_" + "A" * 21 + "%00",
    "trailing_newline": "{p}_" + "A" * 22 + "%0A",
    "over_long": "{p}_" + "A" * 300,
    "very_long": "{p}_" + "A" * 4000,
    "fullwidth": "{p}_" + "%EF%BC%A1" * 22,
    "superscript": "{p}_" + "%C2%B2" * 22,
    "rlo": "{p}_" + "A" * 21 + "%E2%80%AE",
    "zero_width": "{p}_" + "A" * 21 + "%E2%80%8B",
    "invalid_utf8": "{p}_" + "A" * 20 + "%FF%FE",
    "space": "{p}_" + "A" * 21 + "%20",
    "dotdot": "..",
    "wrong_type": "zz_" + "A" * 22,
    "unknown": "{p}_" + "B" * 22,
}

_ID_ENDPOINTS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("GET", "/v1/sessions/{sid}", None),
    ("PATCH", "/v1/sessions/{sid}", {"include_thinking": True}),
    ("POST", "/v1/sessions/{sid}/members", {"user_id": "zed", "role": "viewer"}),
    ("POST", "/v1/sessions/{sid}/runs", {"input": "x"}),
    ("GET", "/v1/sessions/{sid}/events", None),
    ("GET", "/v1/runs/{rid}", None),
    ("GET", "/v1/runs/{rid}/events", None),
    ("POST", "/v1/runs/{rid}/interrupt", {"reason": "r"}),
    ("POST", "/v1/runs/{rid}/approvals/{aid}", {"decision": "reject"}),
    ("PATCH", "/v1/sessions/{sid}/members/zed", {"role": "viewer"}),
    ("DELETE", "/v1/sessions/{sid}/members/zed", None),
    ("POST", "/v1/compat/sim/sessions/{sid}/chat", {"input": "x"}),
    ("GET", "/v1/compat/sim/runs/{rid}/stream", None),
    ("POST", "/v1/compat/agent-ui/sessions/{sid}/runs", {"goal": "x"}),
    ("GET", "/v1/compat/agent-ui/runs/{rid}/events", None),
]

# Malformed user ids in a member path, percent-encoded: answered as a
# non-member is (member_not_found), after the owner check, never looked up.
_BAD_PATH_USERS = {
    "nul": "a%00b",
    "rlo": "%E2%80%AEevil",
    "zero_width": "a%E2%80%8Bb",
    "newline": "a%0Ab",
    "invalid_utf8": "a%FF%FEb",
    "leading_space": "%20alice",
    "over_long": "x" * 201,
}


def _id_rows() -> list[Row]:
    rows = []
    for method, path, body in _ID_ENDPOINTS:
        for param, prefix in (("{sid}", "s"), ("{rid}", "r"), ("{aid}", "ap")):
            if param not in path:
                continue
            for name, bad in _BAD_IDS.items():
                bad = bad.format(p=prefix)
                # An approval id is looked up in the run the path names:
                # alice is a member there, so she hears that it is not found.
                status, code = (404, "approval_not_found") if param == "{aid}" else NOT_A_MEMBER
                # The unknown id is well formed: looking it up is allowed.
                reads = b"" if name == "unknown" else None
                if param == "{aid}" and name != "unknown":
                    # Membership is read (alice's, in the path's run), never the
                    # approval (a lone NUL is too short to look for).
                    decoded = URL(f"/?v={bad}", encoded=True).query["v"].encode(errors="replace")
                    reads = decoded if len(decoded) > 3 else b""
                rows.append(Row(f"{method} {path} {param}={name}", method,
                                path.replace(param, bad), status, code,
                                body=None if body is None else _j(body), reads=reads))  # fmt: skip
    return rows


def _member_path_rows() -> list[Row]:
    rows = []
    for method, body in (("PATCH", _j({"role": "viewer"})), ("DELETE", None)):
        for name, bad in _BAD_PATH_USERS.items():
            # alice's role is read (she is the owner); the bad user id never is.
            rows.append(Row(f"{method} member user_id={name}", method,
                            f"/v1/sessions/{{sid}}/members/{bad}", 404, "member_not_found",
                            body=body, reads=unquote_to_bytes(bad)))  # fmt: skip
    return rows


def _text_rows() -> list[Row]:
    """NUL in every text field of every body; odd user ids."""
    rows = []
    bodies: list[tuple[str, str, dict[str, Any], str]] = [
        ("POST", "/v1/sessions", {"title": "a" + NUL + "b"}, "title"),
        ("POST", "/v1/sessions/{sid}/members", {"user_id": "a" + NUL, "role": "viewer"},
         "user_id"),
        ("POST", "/v1/sessions/{sid}/members", {"user_id": "zed", "role": "viewer" + NUL},
         "role"),
        ("POST", "/v1/sessions/{sid}/runs", {"input": NUL}, "input"),
        ("POST", "/v1/sessions/{sid}/runs", {"input": "x", "model": "m" + NUL}, "model"),
        ("POST", "/v1/runs/{rid}/interrupt", {"reason": "stop" + NUL}, "reason"),
        ("POST", "/v1/runs/{rid}/approvals/{aid}", {"decision": "approve", "comment": NUL},
         "comment"),
        ("POST", "/v1/runs/{rid}/approvals/{aid}", {"decision": "approve" + NUL}, "decision"),
        ("POST", "/v1/sessions", {"title": "t", "run_policy": "reject" + NUL}, "run_policy"),
        ("PATCH", "/v1/sessions/{sid}", {"title": "a" + NUL + "b"}, "title"),
        ("PATCH", "/v1/sessions/{sid}", {"run_policy": "reject" + NUL}, "run_policy"),
    ]  # fmt: skip
    enums = {"role", "decision", "run_policy"}
    for method, path, body, field in bodies:
        says = "Invalid enum value" if field in enums else "without NUL characters"
        rows.append(Row(f"{path} NUL in {field}", method, path, 400, "invalid_request",
                        body=_j(body), mentions=field, says=says))  # fmt: skip
    odd_users = {
        "rlo": "\u202eevil",
        "lri": "a\u2066b",
        "zero_width_space": "a\u200bb",
        "zero_width_joiner": "a\u200db",
        "bom": "\ufeffalice",
        "bell": "\u0007",
        "newline": "a\nb",
        "nbsp": "a\u00a0b",
        "line_separator": "a\u2028b",
        "empty": "",
        "leading_space": " alice",
        "trailing_space": "alice ",
        "over_long": "x" * 201,
    }
    for name, user in odd_users.items():
        rows.append(Row(f"add member user_id={name}", "POST", "/v1/sessions/{sid}/members",
                        400, "invalid_request", body=_j({"user_id": user, "role": "viewer"}),
                        mentions="user_id"))  # fmt: skip
    return rows


def _shape_rows() -> list[Row]:
    """Wrong JSON types, unknown fields, malformed and huge bodies."""
    cases: list[tuple[str, bytes]] = [
        ("title_number", b'{"title": 5}'),
        ("title_null", b'{"title": null}'),
        ("title_object", b'{"title": {"a": 1}}'),
        ("unknown_field", b'{"title": "t", "owner": "mallory"}'),
        ("array", b"[]"),
        ("null", b"null"),
        ("string", b'"x"'),
        ("number", b"1e999"),
        ("raw_nul_byte", b'{"title": "a\x00b"}'),
        ("raw_control_byte", b'{"title": "a\x01b"}'),
        ("invalid_utf8", b'{"title": "\xff\xfe"}'),
        ("lone_surrogate", b'{"title": "\\ud800"}'),
        ("truncated", b'{"title": "t"'),
        ("deep", b"[" * 60_000),
        ("bom", b'\xef\xbb\xbf{"title": "t"}'),
    ]
    rows = [Row(f"create session body={n}", "POST", "/v1/sessions", 400, "invalid_request",
                body=b) for n, b in cases]  # fmt: skip
    more: list[tuple[str, str, bytes]] = [
        ("/v1/sessions/{sid}/members", "user_id_number", b'{"user_id": 5, "role": "viewer"}'),
        ("/v1/sessions/{sid}/members", "role_unknown", b'{"user_id": "z", "role": "god"}'),
        ("/v1/sessions/{sid}/members", "missing_role", b'{"user_id": "z"}'),
        ("/v1/sessions/{sid}/runs", "input_object", b'{"input": {}}'),
        ("/v1/sessions/{sid}/runs", "unknown_field", b'{"input": "x", "session_id": "s"}'),
        ("/v1/runs/{rid}/interrupt", "reason_list", b'{"reason": ["x"]}'),
        ("/v1/runs/{rid}/approvals/{aid}", "decision_bool", b'{"decision": true}'),
        ("/v1/runs/{rid}/approvals/{aid}", "no_decision", b"{}"),
        ("/v1/runs/{rid}/approvals/{aid}", "decided_by", b'{"decision": "approve", "decided_by": "x"}'),
    ]  # fmt: skip
    rows += [Row(f"{p} body={n}", "POST", p, 400, "invalid_request", body=b) for p, n, b in more]
    patch: list[tuple[str, bytes]] = [
        ("empty", b"{}"),
        ("title_null", b'{"title": null}'),
        ("title_number", b'{"title": 5}'),
        ("title_too_long", b'{"title": "' + b"x" * 4001 + b'"}'),
        ("run_policy_unknown", b'{"run_policy": "never"}'),
        ("archived_string", b'{"archived": "yes"}'),
        ("archived_number", b'{"archived": 1}'),
        ("include_thinking_string", b'{"include_thinking": "true"}'),
        ("unknown_field", b'{"archived": true, "archived_at": 0}'),
    ]
    rows += [Row(f"PATCH session body={n}", "PATCH", "/v1/sessions/{sid}", 400,
                 "invalid_request", body=b) for n, b in patch]  # fmt: skip
    big = b'{"title": "' + b"x" * 70_000 + b'"}'
    for path in ("/v1/sessions", "/v1/sessions/{sid}/members", "/v1/sessions/{sid}/runs",
                 "/v1/runs/{rid}/interrupt", "/v1/runs/{rid}/approvals/{aid}"):  # fmt: skip
        rows.append(Row(f"{path} huge body", "POST", path, 413, "payload_too_large", body=big))
    return rows


# Not a non-negative integer in ASCII digits (percent-encoded for a query).
_BAD_NUMBERS = {
    "superscript_two": "%C2%B2",
    "arabic_indic_three": "%D9%A3",
    "fullwidth_three": "%EF%BC%93",
    "plus": "%2B3",
    "leading_space": "%203",
    "trailing_space": "3%20",
    "minus": "-1",
    "over_int64": str(2**63),
    "twenty_digits": "9" * 20,
    "exponent": "1e3",
    "hex": "0x10",
    "underscore": "1_0",
    "nul": "3%00",
}

# The same in a header (where surrounding spaces are not part of the value).
_BAD_HEADER_CURSORS = {
    "superscript_two": "\u00b2",
    "arabic_indic_three": "\u0663",
    "fullwidth_three": "\uff13",
    "plus": "+3",
    "minus": "-1",
    "over_int64": str(2**63),
    "twenty_digits": "9" * 20,
    "exponent": "1e3",
    "underscore": "1_0",
}


def _number_rows() -> list[Row]:
    rows = []
    sse = {"Accept": "text/event-stream"}
    for stream in ("/v1/runs/{rid}/events", "/v1/sessions/{sid}/events"):
        for name, raw in _BAD_NUMBERS.items():
            rows.append(Row(f"{stream} after={name}", "GET", f"{stream}?after={raw}", 400,
                            "invalid_cursor"))  # fmt: skip
            rows.append(Row(f"{stream} limit={name}", "GET", f"{stream}?limit={raw}", 400,
                            "invalid_request"))  # fmt: skip
            rows.append(Row(f"{stream} SSE after={name}", "GET", f"{stream}?after={raw}", 400,
                            "invalid_cursor", headers=sse))  # fmt: skip
        for name, value in _BAD_HEADER_CURSORS.items():
            rows.append(Row(f"{stream} Last-Event-ID={name}", "GET", stream, 400,
                            "invalid_cursor", headers={"Last-Event-ID": value}))  # fmt: skip
            rows.append(Row(f"{stream} SSE Last-Event-ID={name}", "GET", stream, 400,
                            "invalid_cursor", headers={**sse, "Last-Event-ID": value}))  # fmt: skip
        for raw in ("0", "100000"):
            rows.append(Row(f"{stream} limit={raw}", "GET", f"{stream}?limit={raw}", 400,
                            "invalid_request"))  # fmt: skip
    return rows


def _bearer(settings: Settings, sub: str) -> dict[str, str]:
    return {"Authorization": "Bearer " + auth.mint(settings, sub)}


_BAD_SUBS = {
    "nul": "a\u0000b",
    "rlo": "\u202eevil",
    "zero_width": "a\u200bb",
    "newline": "a\nb",
    "empty": "",
    "over_long": "x" * 201,
}


def _other_rows() -> list[Row]:
    """Endpoints without ids; tokens whose subject is not a user id."""
    rows = [
        Row("index junk query", "GET", "/?after=%C2%B2&limit=%00", 200, None, user=None),
        Row("healthz junk query", "GET", "/healthz?after=%C2%B2", 200, None, user=None),
        Row("readyz junk query", "GET", "/readyz?after=%C2%B2", 200, None, user=None,
            reads=b"\xc2\xb2"),
        Row("metrics junk query", "GET", "/metrics?after=%C2%B2", 200, None, user=None),
        Row("openapi junk query", "GET", "/v1/openapi.json?limit=%C2%B2", 200, None, user=None),
        Row("list sessions junk query", "GET", "/v1/sessions?limit=%C2%B2&after=%00", 200, None,
            reads=b"\xc2\xb2"),
        Row("list sessions q NUL", "GET", "/v1/sessions?q=a%00", 400, "invalid_request"),
        Row("list sessions q too long", "GET", "/v1/sessions?q=" + "x" * 201, 400,
            "invalid_request"),
        Row("list sessions q invalid UTF-8", "GET", "/v1/sessions?q=%FF%FE", 200, None,
            reads=b"\xff\xfe"),
        Row("list sessions archived=yes", "GET", "/v1/sessions?archived=yes", 400,
            "invalid_request"),
        Row("list sessions archived=NUL", "GET", "/v1/sessions?archived=%00", 400,
            "invalid_request"),
        Row("list sessions before junk", "GET", "/v1/sessions?before=x", 400, "invalid_cursor"),
        Row("list sessions before superscript", "GET",
            "/v1/sessions?before=%C2%B2.s_" + "A" * 22, 400, "invalid_cursor"),
        Row("list sessions before NUL", "GET", "/v1/sessions?before=1.s_" + "A" * 21 + "%00",
            400, "invalid_cursor"),
        Row("list sessions before past year 9999", "GET",
            "/v1/sessions?before=" + "9" * 18 + ".s_" + "A" * 22, 400, "invalid_cursor"),
        Row("ws access_token NUL", "GET", "/v1/ws?access_token=%00", 401, "unauthorized",
            user=None),
        Row("events access_token NUL", "GET", "/v1/runs/{rid}/events?access_token=a%00b", 401,
            "unauthorized", user=None),
        Row("bearer not ASCII", "GET", "/v1/sessions", 401, "unauthorized", user=None,
            headers={"Authorization": "Bearer a\u00b2b"}),
    ]  # fmt: skip
    for name in _BAD_SUBS:
        for method, path, body in (("GET", "/v1/sessions", None),
                                   ("POST", "/v1/sessions", b"{}"),
                                   ("GET", "/v1/sessions/{sid}", None),
                                   ("GET", "/v1/ws", None)):  # fmt: skip
            rows.append(Row(f"{method} {path} token sub={name}", method, path, 401,
                            "unauthorized", body=body, user="sub:" + name))  # fmt: skip
    return rows


def _non_member_rows() -> list[Row]:
    """Item 12: a non-member learns nothing about an approval (or run) id."""
    rows = []
    for name, aid in (("existing", "{aid2}"), ("unknown", "ap_" + "C" * 22),
                      ("malformed", "ap_%00")):  # fmt: skip
        rows.append(Row(f"non-member decides {name} approval", "POST",
                        f"/v1/runs/{{rid2}}/approvals/{aid}", *NOT_A_MEMBER,
                        body=b'{"decision": "approve"}', reads=b"ap_\x00"))  # fmt: skip
    rows.append(Row("member decides another run's approval", "POST",
                    "/v1/runs/{rid}/approvals/{aid2}", 404, "approval_not_found",
                    body=b'{"decision": "approve"}', reads=b"ap_\x00"))  # fmt: skip
    for name, rid in (("existing", "{rid2}"), ("unknown", "r_" + "C" * 22)):
        rows.append(Row(f"non-member interrupts {name} run", "POST", f"/v1/runs/{rid}/interrupt",
                        *NOT_A_MEMBER, body=b"{}", reads=b"r_\x00"))  # fmt: skip
    return rows


ROWS = _id_rows() + _text_rows() + _shape_rows() + _number_rows() + _other_rows()
ROWS += _non_member_rows() + _member_path_rows()


def _fill(template: str, ids: dict[str, str]) -> str:
    for k in sorted(ids, key=len, reverse=True):
        template = template.replace("{" + k + "}", ids[k])
    return template


async def _counts(db: asyncpg.Connection) -> dict[str, int]:
    row = await db.fetchrow(_COUNTS)
    assert row is not None
    return dict(zip(_TABLES, row, strict=True))


def _quiet(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name} {r.levelname}: {r.getMessage()}" for r in caplog.records
            if r.levelno >= logging.WARNING or r.exc_info]  # fmt: skip


@pytest.mark.parametrize("row", ROWS, ids=[r.what for r in ROWS])
async def test_bad_http_input(world: World, http: aiohttp.ClientSession, row: Row,
                              caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    gw = world.gw
    headers = dict(row.headers)
    if row.user is not None and row.user.startswith("sub:"):
        headers |= _bearer(gw.settings, _BAD_SUBS[row.user[4:]])
    elif row.user is not None:
        headers |= gw.headers(row.user)
    if row.body is not None:
        headers.setdefault("Content-Type", "application/json")
    url = URL(gw.url + _fill(row.path, world.ids), encoded=True)
    before = await _counts(world.db)
    world.proxy.record()
    # Bounded: a misread cursor would open a stream that never ends.
    timeout = aiohttp.ClientTimeout(total=20)
    async with http.request(row.method, url, data=row.body, headers=headers,
                            timeout=timeout) as r:  # fmt: skip
        status, raw = r.status, await r.read()
    sent, world.proxy.recorded = bytes(world.proxy.recorded or b""), None
    got: tuple[int, str | None] = (status, None)
    if row.code is not None or status >= 400:
        got = (status, json.loads(raw)["error"]["code"])
    assert got == (row.status, row.code), raw[:300]
    if row.mentions:
        message = json.loads(raw)["error"]["message"]
        assert row.mentions in message
        # Said in words a client can show, never as the schema's regex.
        assert "regex" not in message, message
        assert row.says in message, message
    assert await _counts(world.db) == before, "the request changed the database"
    if row.reads is None:
        assert sent == b"", f"PostgreSQL was asked: {sent[:200]!r}"
    elif row.reads:
        assert row.reads not in sent, f"{row.reads!r} reached PostgreSQL"
    assert _quiet(caplog) == []


# -- WebSocket messages (on a connection authenticated at the upgrade)


@dataclasses.dataclass(frozen=True)
class WsRow:
    what: str
    msg: object  # sent as JSON (a str as it is); ids filled in as in `Row.path`
    code: str
    reads: bool = False  # the answer needs a read (of valid ids only)


def _ws_rows() -> list[WsRow]:
    rows = []
    for name, encoded in _BAD_IDS.items():
        bad = URL(f"/?v={encoded}", encoded=True).query["v"]
        for msg in (
            {"type": "subscribe", "run_id": bad.format(p="r")},
            {"type": "subscribe", "session_id": bad.format(p="s")},
            {"type": "interrupt", "run_id": bad.format(p="r")},
            {"type": "decide", "approval_id": bad.format(p="ap"), "decision": "approve"},
        ):
            rows.append(WsRow(f"{msg['type']} id={name}", msg, "not_a_member",
                              reads=name == "unknown"))  # fmt: skip
    rows += [
        WsRow("subscribe bob's run", {"type": "subscribe", "run_id": "{rid2}"}, "not_a_member",
              reads=True),
        WsRow("subscribe bob's session", {"type": "subscribe", "session_id": "{sid2}"},
              "not_a_member", reads=True),
        WsRow("decide bob's approval", {"type": "decide", "approval_id": "{aid2}",
                                        "decision": "approve"}, "not_a_member", reads=True),
        WsRow("interrupt bob's run", {"type": "interrupt", "run_id": "{rid2}"}, "not_a_member",
              reads=True),
        WsRow("interrupt reason NUL", {"type": "interrupt", "run_id": "{rid}", "reason": NUL},
              "invalid_message"),
        WsRow("decide comment NUL", {"type": "decide", "approval_id": "{aid}",
                                     "decision": "approve", "comment": "ok" + NUL},
              "invalid_message"),
        WsRow("ref NUL", {"type": "ping", "ref": NUL}, "invalid_message"),
        WsRow("after -1", {"type": "subscribe", "run_id": "{rid}", "after": -1},
              "invalid_message"),
        WsRow("after 2**63", {"type": "subscribe", "run_id": "{rid}", "after": 2**63},
              "invalid_message"),
        WsRow("after 2**64", {"type": "subscribe", "run_id": "{rid}", "after": 2**64},
              "invalid_message"),
        WsRow("after string", {"type": "subscribe", "run_id": "{rid}", "after": "3"},
              "invalid_message"),
        WsRow("after superscript", {"type": "subscribe", "run_id": "{rid}", "after": "\u00b2"},
              "invalid_message"),
        WsRow("after float", {"type": "subscribe", "run_id": "{rid}", "after": 1.5},
              "invalid_message"),
        WsRow("after bool", {"type": "subscribe", "run_id": "{rid}", "after": True},
              "invalid_message"),
        WsRow("after past head", {"type": "subscribe", "run_id": "{rid}", "after": 2**62},
              "invalid_cursor", reads=True),
        WsRow("run_id number", {"type": "subscribe", "run_id": 5}, "invalid_message"),
        WsRow("both ids", {"type": "subscribe", "run_id": "{rid}", "session_id": "{sid}"},
              "invalid_message"),
        WsRow("unknown field", {"type": "ping", "extra": 1}, "invalid_message"),
        WsRow("unknown type", {"type": "drop_tables"}, "unknown_message_type"),
        WsRow("no type", {"run_id": "{rid}"}, "unknown_message_type"),
        WsRow("array", [], "unknown_message_type"),
        WsRow("string", '"hello"', "unknown_message_type"),
        WsRow("malformed", "{", "invalid_message"),
        WsRow("auth NUL token", {"type": "auth", "token": "a" + NUL}, "unauthorized"),
        WsRow("huge", {"type": "ping", "ref": "x" * 70_000}, "message_too_large"),
    ]  # fmt: skip
    for name in _BAD_SUBS:
        rows.append(WsRow(f"auth token sub={name}", {"type": "auth", "token": f"sub:{name}"},
                          "unauthorized"))  # fmt: skip
    return rows


WS_ROWS = _ws_rows()


def _fill_msg(msg: object, world: World) -> str:
    if isinstance(msg, str):
        return msg
    if isinstance(msg, dict) and str(msg.get("token", "")).startswith("sub:"):
        msg = {**msg, "token": auth.mint(world.gw.settings, _BAD_SUBS[msg["token"][4:]])}
    return _fill(json.dumps(msg), world.ids)


@pytest.mark.parametrize("row", WS_ROWS, ids=[r.what for r in WS_ROWS])
async def test_bad_ws_message(world: World, http: aiohttp.ClientSession, row: WsRow,
                              caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    gw = world.gw
    async with http.ws_connect(gw.ws_url, headers=gw.headers("alice")) as ws:
        hello = json.loads((await ws.receive(timeout=10)).data)
        assert hello["type"] == "hello" and hello["user"] == "alice"
        before = await _counts(world.db)
        world.proxy.record()
        await ws.send_str(_fill_msg(row.msg, world))
        reply = json.loads((await ws.receive(timeout=10)).data)
        sent, world.proxy.recorded = bytes(world.proxy.recorded or b""), None
        assert (reply["type"], reply.get("code")) == ("error", row.code), reply
        # The connection stays, and still works.
        await ws.send_str('{"type": "ping", "ref": "after"}')
        pong = json.loads((await ws.receive(timeout=10)).data)
        assert (pong["type"], pong["ref"]) == ("pong", "after")
    assert await _counts(world.db) == before, "the message changed the database"
    if not row.reads:
        assert sent == b"", f"PostgreSQL was asked: {sent[:200]!r}"
    assert _quiet(caplog) == []
