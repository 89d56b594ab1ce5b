"""Managing sessions (issue 14, item 4): PATCH /v1/sessions/{id} renames a
session and sets its run policy, exposure policies and archived state
(owners only, audited); an archived session leaves the default list and
takes no new run; the list pages past 100 sessions and searches titles.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from broker import errors, sessions
from broker.runtime import Broker
from broker.settings import Settings

from .gw import RunningGateway, running_gateway, session_with


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


async def _call(http: aiohttp.ClientSession, gw: RunningGateway, method: str, path: str,
                user: str, body: Any = None) -> tuple[int, Any]:  # fmt: skip
    async with http.request(method, gw.url + path, json=body, headers=gw.headers(user)) as r:
        return r.status, await r.json()


def _code(body: Any) -> str | None:
    return body["error"]["code"] if isinstance(body, dict) and "error" in body else None


def _user(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"


async def _audit(broker: Broker, sid: str) -> list[tuple[str, str, dict[str, Any]]]:
    rows = await broker.store.pool.fetch(
        "SELECT actor, action, detail::text FROM audit WHERE session_id = $1"
        " AND action NOT IN ('add_member') ORDER BY audit_id",
        sid,
    )
    return [(r[0], r[1], json.loads(r[2])) for r in rows]


async def _list(http: aiohttp.ClientSession, gw: RunningGateway, user: str,
                **params: str) -> dict[str, Any]:  # fmt: skip
    async with http.get(gw.url + "/v1/sessions", params=params, headers=gw.headers(user)) as r:
        assert r.status == 200, await r.text()
        page: dict[str, Any] = await r.json()
    return page


# -- pure


def test_page_keys_round_trip_and_junk_is_invalid_cursor() -> None:
    key = sessions.PageKey(created_at_us=1_700_000_000_123_456, session_id="s_" + "A" * 22)
    assert sessions.PageKey.decode(key.encode()) == key
    for junk in ("", "1", "x.s_" + "A" * 22, "1.s_short", "-1.s_" + "A" * 22,
                 "\u00b2.s_" + "A" * 22, "1" * 19 + ".s_" + "A" * 22, "9" * 18 + ".s_" + "A" * 22,
                 "1.s_" + "A" * 22 + "\n", "1.r_" + "A" * 22):  # fmt: skip
        with pytest.raises(errors.InvalidCursor):
            sessions.PageKey.decode(junk)


def test_audit_rows_name_each_field_group_given() -> None:
    before = sessions.Settings(
        title="a",
        run_policy="enqueue",
        include_thinking=False,
        include_tool_calls=False,
        archived_at_ms=None,
    )
    after = sessions.Settings(
        title="b",
        run_policy="reject",
        include_thinking=True,
        include_tool_calls=False,
        archived_at_ms=5,
    )
    changes = sessions.Changes(title="b", run_policy="reject", include_thinking=True, archived=True)
    got = sessions.audit_rows(before, after, changes)
    assert got == [
        ("rename_session", {"title": "b", "previous": "a"}),
        ("set_run_policy", {"run_policy": "reject", "previous": "enqueue"}),
        ("set_stream_policy", {"include_thinking": True, "include_tool_calls": False,
                               "previous": {"include_thinking": False,
                                            "include_tool_calls": False}}),
        ("archive_session", {"archived_at": 5, "previous": None}),
    ]  # fmt: skip
    assert sessions.audit_rows(before, before, sessions.Changes()) == []


# -- PATCH /v1/sessions/{id}


async def test_owners_rename_and_set_policies_others_are_refused_and_each_change_is_audited(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    sid = await session_with(http, gw, "alice", bob="approver", vic="viewer")
    path = f"/v1/sessions/{sid}"
    refused: list[tuple[str, object, int, str]] = [
        ("bob", {"title": "mine"}, 403, "forbidden"),
        ("vic", {"run_policy": "reject"}, 403, "forbidden"),
        ("bob", {"archived": True}, 403, "forbidden"),
        ("mallory", {"title": "mine"}, 403, "not_a_member"),
        ("alice", {}, 400, "invalid_request"),
        ("alice", {"title": None}, 400, "invalid_request"),
        ("alice", {"title": 5}, 400, "invalid_request"),
        ("alice", {"title": "a\u0000b"}, 400, "invalid_request"),
        ("alice", {"title": "x" * 4001}, 400, "invalid_request"),
        ("alice", {"run_policy": "never"}, 400, "invalid_request"),
        ("alice", {"archived": "yes"}, 400, "invalid_request"),
        ("alice", {"title": "t", "owner": "mallory"}, 400, "invalid_request"),
    ]
    for user, body, status, code in refused:
        assert (await _call(http, gw, "PATCH", path, user, body))[0] == status, (user, body)
        assert _code((await _call(http, gw, "PATCH", path, user, body))[1]) == code
    assert await _audit(broker, sid) == []  # nothing refused changed anything

    status, got = await _call(http, gw, "PATCH", path, "alice",
                              {"title": "Release \u202ereview", "run_policy": "reject"})  # fmt: skip
    assert status == 200, got
    assert got == {
        "session_id": sid, "title": "Release \u202ereview", "run_policy": "reject",
        "include_thinking": False, "include_tool_calls": False, "archived_at": None,
        "previous": {"title": "t", "run_policy": "enqueue", "include_thinking": False,
                     "include_tool_calls": False, "archived_at": None},
    }  # fmt: skip
    status, got = await _call(http, gw, "PATCH", path, "alice", {"include_tool_calls": True})
    assert (status, got["include_tool_calls"], got["title"]) == (200, True, "Release \u202ereview")
    # Every member reads the new settings (the title too, for a session opened by link).
    status, info = await _call(http, gw, "GET", path, "vic")
    assert status == 200
    assert (info["title"], info["run_policy"], info["include_tool_calls"], info["archived_at"]) == (
        "Release \u202ereview", "reject", True, None)  # fmt: skip
    assert isinstance(info["created_at"], int) and info["created_at"] > 0
    assert await _audit(broker, sid) == [
        ("alice", "rename_session", {"title": "Release \u202ereview", "previous": "t"}),
        ("alice", "set_run_policy", {"run_policy": "reject", "previous": "enqueue"}),
        ("alice", "set_stream_policy", {"include_thinking": False, "include_tool_calls": True,
                                        "previous": {"include_thinking": False,
                                                     "include_tool_calls": False}}),
    ]  # fmt: skip
    # The run policy applies at once: a second run while one is active is refused.
    await broker.store.create_run(sid, "alice")
    status, body = await _call(http, gw, "POST", f"{path}/runs", "bob", {"input": "x"})
    assert (status, _code(body)) == (409, "run_busy")


async def test_an_archived_session_leaves_the_list_takes_no_run_and_comes_back(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    alice = _user("alice")
    sid = await session_with(http, gw, alice, bob="approver")
    other = await session_with(http, gw, alice)
    path = f"/v1/sessions/{sid}"
    status, got = await _call(http, gw, "PATCH", path, alice, {"archived": True})
    assert status == 200, got
    archived_at = got["archived_at"]
    assert isinstance(archived_at, int) and got["previous"]["archived_at"] is None
    # Archiving again keeps the first time (and is audited, as every request is).
    status, again = await _call(http, gw, "PATCH", path, alice, {"archived": True})
    assert (status, again["archived_at"], again["previous"]["archived_at"]) == (
        200, archived_at, archived_at)  # fmt: skip

    for user in (alice, "bob"):
        listed = [s["session_id"] for s in (await _list(http, gw, user))["sessions"]]
        assert sid not in listed
    assert [s["session_id"] for s in (await _list(http, gw, alice))["sessions"]] == [other]
    page = await _list(http, gw, alice, archived="true")
    assert [(s["session_id"], s["archived_at"]) for s in page["sessions"]] == [(sid, archived_at)]
    # Its history stays readable; no new run, by any way in.
    status, info = await _call(http, gw, "GET", path, "bob")
    assert (status, info["archived_at"]) == (200, archived_at)
    status, body = await _call(http, gw, "POST", f"{path}/runs", "bob", {"input": "x"})
    assert (status, _code(body), body["error"]["retryable"]) == (409, "session_archived", False)
    status, body = await _call(http, gw, "POST", f"/v1/compat/sim/sessions/{sid}/chat", "bob",
                               {"input": "x"})  # fmt: skip
    assert (status, _code(body)) == (409, "session_archived")
    assert (await broker.store.session_info(sid)).runs == []

    status, got = await _call(http, gw, "PATCH", path, alice, {"archived": False})
    assert (status, got["archived_at"], got["previous"]["archived_at"]) == (
        200, None, archived_at)  # fmt: skip
    assert [s["session_id"] for s in (await _list(http, gw, alice))["sessions"]] == [other, sid]
    assert (await _list(http, gw, alice, archived="true"))["sessions"] == []
    status, body = await _call(http, gw, "POST", f"{path}/runs", "bob", {"input": "x"})
    assert status == 202, body
    assert [a[1] for a in await _audit(broker, sid)] == [
        "archive_session", "archive_session", "unarchive_session"]  # fmt: skip


# -- GET /v1/sessions: pages and search


async def test_the_list_pages_past_100_in_order_and_searches_titles(
    gw: RunningGateway, http: aiohttp.ClientSession, broker: Broker
) -> None:
    user = _user("pager")
    titles = [f"Bulk {i:03d}" for i in range(230)] + ["100%_done", "tab\tbed", "ÉCLAIR"]
    created = [await broker.store.create_session(user, t) for t in titles]
    newest_first = created[::-1]

    seen: list[str] = []
    page = await _list(http, gw, user)
    sizes = []
    while True:
        sizes.append(len(page["sessions"]))
        seen += [s["session_id"] for s in page["sessions"]]
        if page["next_before"] is None:
            break
        if len(seen) == 100:  # a session created meanwhile goes before the first page
            await broker.store.create_session(user, "Bulk late")
        page = await _list(http, gw, user, before=page["next_before"])
    assert sizes == [100, 100, 33]
    assert seen == newest_first  # each once, newest first, none skipped

    def found(page: dict[str, Any]) -> list[str]:
        return [s["title"] for s in page["sessions"]]

    assert found(await _list(http, gw, user, q="bulk 04")) == [f"Bulk {i:03d}" for i in
                                                               range(49, 39, -1)]  # fmt: skip
    assert found(await _list(http, gw, user, q="BULK 229")) == ["Bulk 229"]
    # The query is a plain substring: % and _ are themselves, not patterns.
    assert found(await _list(http, gw, user, q="%_")) == ["100%_done"]
    assert found(await _list(http, gw, user, q="_")) == ["100%_done"]
    assert found(await _list(http, gw, user, q="\t")) == ["tab\tbed"]
    assert found(await _list(http, gw, user, q="éclair")) == ["ÉCLAIR"]
    assert found(await _list(http, gw, user, q="no such title")) == []
    # A search pages as the list does.
    page, got = await _list(http, gw, user, q="bulk"), []
    while True:
        got += found(page)
        if page["next_before"] is None:
            break
        page = await _list(http, gw, user, q="bulk", before=page["next_before"])
    assert got == ["Bulk late", *titles[229::-1]]
    # Another user's sessions are never in it.
    assert (await _list(http, gw, _user("stranger"), q="bulk"))["sessions"] == []


async def test_bad_list_queries_get_codes(gw: RunningGateway, http: aiohttp.ClientSession) -> None:
    cases = [
        ({"q": "x" * (sessions.QUERY_MAX_CHARS + 1)}, 400, "invalid_request"),
        ({"q": "a\u0000"}, 400, "invalid_request"),
        ({"archived": "yes"}, 400, "invalid_request"),
        ({"archived": ""}, 400, "invalid_request"),
        ({"before": "junk"}, 400, "invalid_cursor"),
        ({"before": "12.s_short"}, 400, "invalid_cursor"),
    ]
    for params, status, code in cases:
        async with http.get(gw.url + "/v1/sessions", params=params,
                            headers=gw.headers("alice")) as r:  # fmt: skip
            assert (r.status, (await r.json())["error"]["code"]) == (status, code), params
    page = await _list(http, gw, _user("nobody"), q="x" * sessions.QUERY_MAX_CHARS)
    assert page == {"sessions": [], "next_before": None}
