"""Managing members and sessions in the console (issue 14, item 4), in a real
browser (Debian's Chromium, driven by Playwright), one browser context per
user, against a gateway on the test stack.

What each test pins: an owner removes and demotes members, who lose access
live (their streams end); the last owner is refused with `last_owner`, shown
as such; the controls are not drawn for non-owners; a rename, a run policy
and an archive reach the other member on the next refresh; the list pages
past 100 sessions, searches titles, and a session opened by link shows its
title although it is in no page shown.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect

from broker.runtime import Broker
from broker.settings import Settings

from .browser_helpers import WAIT_MS, Pages, console_url, pages_for
from .gw import RunningGateway, running_gateway


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


@pytest_asyncio.fixture(loop_scope="session")
async def pages(gw: RunningGateway, browser: Browser,
                request: pytest.FixtureRequest) -> AsyncIterator[Pages]:  # fmt: skip
    # After `gw`: the pages close (and their connections with them) before it stops.
    async with pages_for(browser, request) as p:
        yield p


def _user(name: str) -> str:
    return f"{name}-{secrets.token_hex(3)}"


async def _session(http: aiohttp.ClientSession, gw: RunningGateway, owner: str, title: str,
                   **members: str) -> str:  # fmt: skip
    async with http.post(gw.url + "/v1/sessions", json={"title": title},
                         headers=gw.headers(owner)) as r:  # fmt: skip
        assert r.status == 201, await r.text()
        sid: str = (await r.json())["session_id"]
    for user, role in members.items():
        async with http.post(f"{gw.url}/v1/sessions/{sid}/members",
                             json={"user_id": user, "role": role},
                             headers=gw.headers(owner)) as r:  # fmt: skip
            assert r.status == 201, await r.text()
    return sid


async def _get(http: aiohttp.ClientSession, gw: RunningGateway, user: str, path: str) -> Any:
    async with http.get(gw.url + path, headers=gw.headers(user)) as r:
        return r.status, await r.json()


async def _open(pages: Pages, gw: RunningGateway, user: str, sid: str | None = None) -> Page:
    page = await pages.open(user, console_url(gw.url, gw.token(user), session=sid))
    if sid is not None:
        await expect(page.locator("#session-id")).to_have_text(sid, timeout=WAIT_MS)
        await expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    return page


def _item(page: Page, sid: str) -> Any:
    return page.locator(f'#sessions .session-item[data-session-id="{sid}"]')


async def test_owner_removes_and_demotes_members_who_lose_access_live(
    gw: RunningGateway, pages: Pages, http: aiohttp.ClientSession
) -> None:
    alice, bob, carol = _user("alice"), _user("bob"), _user("carol")
    sid = await _session(http, gw, alice, "Team room", **{bob: "approver", carol: "approver"})
    a = await _open(pages, gw, alice, sid)
    b = await _open(pages, gw, bob, sid)
    c = await _open(pages, gw, carol, sid)
    # Only the owner gets the controls; the others see roles.
    for p in (b, c):
        await expect(p.locator(".member-role-select")).to_have_count(0)
        await expect(p.locator(".member-remove")).to_have_count(0)
        await expect(p.locator("#session-settings")).to_be_hidden()
        await expect(p.locator(f'.member[data-user="{alice}"] .role')).to_have_text("owner")
    await expect(a.locator(".member-role-select")).to_have_count(3)
    await expect(b.locator("#start-run")).to_be_enabled()

    # Demoted: bob's page turns read-only at once (his stream ended), no reload.
    await a.locator(f'.member[data-user="{bob}"] select.member-role-select').select_option("viewer")
    await expect(b.locator("#session-role")).to_have_text("viewer", timeout=WAIT_MS)
    await expect(b.locator("#start-run")).to_be_disabled()
    await expect(b.locator("#composer-note")).to_contain_text("You are a viewer")
    await expect(b.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    await expect(a.locator(f'.member[data-user="{bob}"]')).to_have_attribute(
        "data-role", "viewer", timeout=WAIT_MS
    )

    # Removed (the button asks once): carol's page says so, and her list drops it.
    await expect(_item(c, sid)).to_have_count(1)
    remove = a.locator(f'.member[data-user="{carol}"] button.member-remove')
    await remove.click()
    await expect(remove).to_have_text("Confirm")
    await remove.click()
    await expect(c.locator("#empty h1")).to_have_text(
        "You are not a member of this session", timeout=WAIT_MS
    )
    await expect(c.locator("#session")).to_be_hidden()
    await expect(_item(c, sid)).to_have_count(0, timeout=WAIT_MS)
    await expect(a.locator(f'.member[data-user="{carol}"]')).to_have_count(0, timeout=WAIT_MS)
    assert (await _get(http, gw, carol, f"/v1/sessions/{sid}"))[0] == 403

    # The last owner: the server refuses (409 last_owner) and the page says why.
    await a.locator(f'.member[data-user="{alice}"] select.member-role-select').select_option(
        "approver"
    )
    err = a.locator("#members-error")
    await expect(err).to_have_attribute("data-code", "last_owner", timeout=WAIT_MS)
    await expect(err).to_contain_text(f"{alice} is the session's last owner")
    await expect(err).to_contain_text("make another member owner first")
    await expect(
        a.locator(f'.member[data-user="{alice}"] select.member-role-select')
    ).to_have_value("owner")
    await expect(a.locator("#session-role")).to_have_text("owner")
    _, info = await _get(http, gw, alice, f"/v1/sessions/{sid}")
    assert {m["user_id"]: m["role"] for m in info["members"]} == {alice: "owner", bob: "viewer"}


async def test_rename_policy_and_archive_reach_the_other_member_after_a_refresh(
    gw: RunningGateway, pages: Pages, http: aiohttp.ClientSession
) -> None:
    alice, bob = _user("alice"), _user("bob")
    sid = await _session(http, gw, alice, "Draft", **{bob: "approver"})
    a = await _open(pages, gw, alice, sid)
    b = await _open(pages, gw, bob, sid)
    await expect(b.locator("#session-title")).to_have_text("Draft")

    await a.locator("#session-settings summary").click()
    await a.fill("#settings-title", "Q3 planning")
    await a.select_option("#settings-run-policy", "reject")
    await a.check("#settings-include-thinking")
    await a.click("#settings-save")
    await expect(a.locator("#session-title")).to_have_text("Q3 planning", timeout=WAIT_MS)
    await expect(a.locator("#session-policy")).to_have_text("new runs: reject")
    await expect(_item(a, sid).locator(".session-name")).to_have_text("Q3 planning")
    _, info = await _get(http, gw, bob, f"/v1/sessions/{sid}")
    assert (info["title"], info["run_policy"], info["include_thinking"]) == (
        "Q3 planning", "reject", True)  # fmt: skip

    await b.reload()
    await expect(b.locator("#session-title")).to_have_text("Q3 planning", timeout=WAIT_MS)
    await expect(b.locator("#session-policy")).to_have_text("new runs: reject")
    await expect(_item(b, sid).locator(".session-name")).to_have_text("Q3 planning")
    assert await b.title() == "Q3 planning · runlog"

    # Archived: out of the default list, read-only, listed under "Archived".
    await a.click("#session-archive")
    await expect(a.locator("#session-archived")).to_be_visible(timeout=WAIT_MS)
    await expect(a.locator("#session-archive")).to_have_text("Unarchive")
    await expect(a.locator("#start-run")).to_be_disabled()
    await expect(_item(a, sid)).to_have_count(0, timeout=WAIT_MS)
    await a.check("#show-archived")
    await expect(_item(a, sid)).to_have_count(1, timeout=WAIT_MS)
    await expect(_item(a, sid)).to_have_attribute("data-archived", "true")

    await b.reload()
    await expect(b.locator("#session-archived")).to_be_visible(timeout=WAIT_MS)
    await expect(b.locator("#start-run")).to_be_disabled()
    await expect(b.locator("#composer-note")).to_contain_text("archived")
    await expect(b.locator("#sessions")).to_contain_text("No sessions yet.", timeout=WAIT_MS)
    await expect(_item(b, sid)).to_have_count(0)

    await a.click("#session-archive")
    await expect(a.locator("#session-archived")).to_be_hidden(timeout=WAIT_MS)
    await expect(a.locator("#start-run")).to_be_enabled()
    await a.uncheck("#show-archived")
    await expect(_item(a, sid)).to_have_count(1, timeout=WAIT_MS)
    await b.reload()
    await expect(_item(b, sid)).to_have_count(1, timeout=WAIT_MS)
    await expect(b.locator("#start-run")).to_be_enabled()


async def test_the_list_pages_past_100_searches_titles_and_a_linked_session_keeps_its_title(
    gw: RunningGateway, pages: Pages, broker: Broker
) -> None:
    user = _user("pager")
    oldest = await broker.store.create_session(user, "The oldest one")
    for i in range(129):
        await broker.store.create_session(user, f"Bulk {i:03d}")
    # Opened by link: the session is in no page shown, and its title shows.
    p = await _open(pages, gw, user, oldest)
    await expect(p.locator("#session-title")).to_have_text("The oldest one")
    assert await p.title() == "The oldest one · runlog"
    items = p.locator("#sessions .session-item")
    await expect(items).to_have_count(100, timeout=WAIT_MS)
    await expect(_item(p, oldest)).to_have_count(0)

    await p.click("#sessions-more")
    await expect(items).to_have_count(130, timeout=WAIT_MS)
    await expect(p.locator("#sessions-more")).to_be_hidden()
    await expect(_item(p, oldest)).to_have_class("session-item active")

    await p.fill("#session-search", "BULK 04")
    await expect(items).to_have_count(10, timeout=WAIT_MS)
    await expect(items.first.locator(".session-name")).to_have_text("Bulk 049")
    await expect(p.locator("#sessions-more")).to_be_hidden()
    await p.fill("#session-search", "oldest")
    await expect(items).to_have_count(1, timeout=WAIT_MS)
    await p.fill("#session-search", "no such title")
    await expect(p.locator("#sessions")).to_contain_text(
        "No session title contains “no such title”.", timeout=WAIT_MS
    )
    await p.fill("#session-search", "")
    await expect(items).to_have_count(100, timeout=WAIT_MS)
    await expect(p.locator("#sessions-more")).to_be_visible()
