"""The console's approval cards and its states, in a real browser (Debian's
Chromium, driven by Playwright), against real gateway and worker processes.

Approvals: the tool's arguments as formatted JSON, a comment the approver
writes and everyone reads, who decided and when, what happened next, and a
countdown that turns into "expired". States: what the page says while
signed in with no session open, bad tokens told apart, Retry on retryable
errors, token usage of a stopped or failed run, "you" once in the member
list, echo answers without a leading space, run ids with a copy button.

Each test starts the worker it needs (so a test can give it its own
approval_timeout_s): only one worker takes this module's jobs at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest_asyncio
from playwright.async_api import Page, expect

from broker import events, ids
from broker.runtime import Broker
from broker.settings import Settings
from gateway import auth

from .browser_helpers import (
    WAIT_MS,
    Pages,
    console_url,
    log_events,
    page_text,
    run_card,
    wait_for_words,
)
from .gw import write_run
from .procs import RunlogProcess
from .test_browser import _gateway_pair, _live, _session, _start, _start_run, _words, pages

__all__ = ["pages"]  # the fixture, shared with test_browser.py

TOKENS_PER_S = 40


@dataclasses.dataclass
class Deployment:
    settings: Settings
    gateways: list[RunlogProcess]
    tmp_root: Path

    def token(self, user: str) -> str:
        return auth.mint(self.settings, user)

    @contextlib.asynccontextmanager
    async def worker(self, **env: str) -> AsyncIterator[RunlogProcess]:
        w = RunlogProcess(
            "worker", self.settings, self.tmp_root,
            RUNLOG_MODEL_ADAPTER="scripted", RUNLOG_SCRIPTED_TOKENS_PER_S=str(TOKENS_PER_S), **env,
        )  # fmt: skip
        try:
            await _start([w])
            yield w
        finally:
            await w.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def deployment(settings: Settings, tmp_root: Path) -> AsyncIterator[Deployment]:
    gws = _gateway_pair(settings, tmp_root)
    for g in gws:
        # A token revoked straight in the store (no NATS message) is refused at the
        # next re-check: a second, not the default 30 s the bad-tokens test waited.
        g.env["RUNLOG_ACCESS_RECHECK_S"] = "1"
    try:
        await _start(gws)
        yield Deployment(settings, gws, tmp_root)
    finally:
        for g in gws:
            await g.stop()


def _iso(ts_ms: int) -> str:
    """A ms timestamp as JavaScript's Date.toISOString() writes it."""
    dt = datetime.fromtimestamp(ts_ms / 1000, UTC)
    return dt.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _one(log: list[dict[str, object]], type_: str) -> dict[str, object]:
    (e,) = [e for e in log if e["type"] == type_]
    return e


# -- approvals


async def test_approver_comments_and_approves_the_other_user_sees_who_when_and_the_comment(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, b = deployment.gateways
    token = deployment.token("alice")
    sid = await _session(http, a.url, token, bob="approver")
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    bob = await pages.open("bob", console_url(b.url, deployment.token("bob"), session=sid))
    for p in (alice, bob):
        await _live(p)
    comment = "Checked the recipient — ship it"
    async with deployment.worker():
        run_id = await _start_run(http, a.url, token, sid, "tell me about approvals")
        for p in (alice, bob):
            approval = run_card(p, run_id).locator(".approval")
            await expect(approval).to_have_attribute("data-state", "pending", timeout=WAIT_MS)
            await expect(approval.locator(".expires")).to_have_text(
                re.compile(r"^expires in 1?\d:\d\d$")
            )
        log = await log_events(http, a.url, token, run_id)
        required = _one(log, "approval_required")
        raw = "".join(
            str(e["partial_json"]) for e in log
            if e["type"] == "tool_args_delta" and e["tool_call_id"] == required["tool_call_id"]
        )  # fmt: skip
        pretty = json.dumps(json.loads(raw), indent=2, ensure_ascii=False)
        assert "\n" in pretty and pretty != raw  # formatted, not the streamed string
        for p in (alice, bob):
            args = run_card(p, run_id).locator(".approval .approval-args")
            await expect(args).to_have_attribute("data-format", "json")
            assert await args.text_content() == pretty

        card = run_card(bob, run_id)
        await card.locator(".approval-comment").fill(comment)
        await card.locator("button.approve").click()
        for p in (alice, bob):
            card = run_card(p, run_id)
            await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    log = await log_events(http, a.url, token, run_id)
    decided = _one(log, "approval_decided")
    assert (decided["decision"], decided["decided_by"], decided["comment"]) == (
        "approve", "bob", comment,
    )  # fmt: skip
    result = [e for e in log if e["type"] == "tool_result"][-1]
    assert (result["tool_call_id"], result["status"]) == (required["tool_call_id"], "ok")
    ts = decided["ts"]
    assert isinstance(ts, int)
    for p in (alice, bob):
        approval = run_card(p, run_id).locator(".approval")
        await expect(approval.locator(".approval-decision")).to_have_text(
            f"Approved by bob — “{comment}”"
        )
        when = approval.locator(".decided-at")
        await expect(when).to_have_attribute("data-ts", str(ts))
        await expect(when).to_have_attribute("datetime", _iso(ts))
        await expect(when).to_have_text(re.compile(r"^at \d"))
        outcome = approval.locator(".approval-outcome")
        await expect(outcome).to_have_attribute("data-status", "ok")
        await expect(outcome).to_have_text(f"Then: the tool ran: ok — {result['summary']}")
        await expect(approval.locator(".approval-comment")).to_be_hidden()
        await expect(approval.locator(".expires")).to_have_text("")


async def test_approval_expires_after_a_short_approval_timeout(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = deployment.gateways
    token = deployment.token("alice")
    sid = await _session(http, a.url, token)
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)
    async with deployment.worker(RUNLOG_APPROVAL_TIMEOUT_S="15"):
        run_id = await _start_run(http, a.url, token, sid, "tell me about approvals")
        card = run_card(alice, run_id)
        approval = card.locator(".approval")
        # Counting down (15 s: time for the page to show it on a slow machine)...
        await expect(approval.locator(".expires")).to_have_text(
            re.compile(r"^expires in 0:[01]\d$"), timeout=WAIT_MS
        )
        # ...then expired, and what happened next: the tool was skipped.
        await expect(approval).to_have_attribute("data-state", "expired", timeout=WAIT_MS)
        await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    await expect(approval.locator(".expires")).to_have_text("expired")
    await expect(approval.locator(".approval-decision")).to_have_text(
        "Expired — nobody decided in time"
    )
    outcome = approval.locator(".approval-outcome")
    await expect(outcome).to_have_attribute("data-status", "skipped")
    await expect(outcome).to_have_text("Then: not run: skipped — approval expired")
    await expect(approval.locator("button.approve")).to_be_hidden()


async def test_countdown_reaching_expires_at_disables_the_buttons_before_any_decision(
    deployment: Deployment, pages: Pages, broker: Broker
) -> None:
    a, _ = deployment.gateways
    sid = await broker.store.create_session("alice", "countdown")
    # Straight into the log, and no worker: nobody but the page's clock ends it.
    run_id = await broker.store.create_run(sid, "alice", input="send it")
    w = await broker.claim(run_id, "test-writer")
    expires = int(time.time() * 1000) + 6_000
    for e in [
        events.RunStart(started_by="alice", input="send it", model="scripted"),
        events.ToolCallStart(tool_call_id="c1", tool_name="send_message", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='{"to": "team@exa'),
        events.ToolArgsDelta(tool_call_id="c1", partial_json='mple.com", "text": "hi'),  # not JSON
        events.ToolCallEnd(tool_call_id="c1"),
        events.ApprovalRequired(
            approval_id=ids.approval_id(), tool_call_id="c1", summary="send", expires_at=expires
        ),
    ]:
        await w.append(e)
    await w.flush()
    try:
        alice = await pages.open(
            "alice", console_url(a.url, deployment.token("alice"), session=sid)
        )
        approval = run_card(alice, run_id).locator(".approval")
        await expect(approval.locator(".expires")).to_have_text(
            re.compile(r"^expires in 0:0\d$"), timeout=WAIT_MS
        )
        await expect(approval.locator("button.approve")).to_be_enabled()
        # Arguments that do not parse are shown as they streamed.
        args = approval.locator(".approval-args")
        await expect(args).to_have_attribute("data-format", "raw")
        await expect(args).to_have_text('{"to": "team@example.com", "text": "hi')
        await expect(approval.locator(".expires")).to_have_text("expired", timeout=WAIT_MS)
        await expect(approval).to_have_attribute("data-countdown", "expired")
        for sel in ("button.approve", "button.reject", ".approval-comment"):
            await expect(approval.locator(sel)).to_be_disabled()
        await expect(approval).to_have_attribute("data-state", "pending")  # the log says no more
    finally:
        await w.append(events.RunEnd(status="aborted"))
        await w.flush()


# -- states


async def test_home_screen_says_who_is_signed_in_and_the_indicator_follows_the_connection(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = deployment.gateways
    token = deployment.token("alice")
    sid = await _session(http, a.url, token, title="home")
    page = await pages.open("alice", console_url(a.url, token))
    await expect(page.locator(f'.session-item[data-session-id="{sid}"]')).to_be_visible(
        timeout=WAIT_MS
    )
    conn = page.locator("#conn")
    await expect(conn.locator("#conn-text")).to_have_text(
        "signed in as alice · pick or create a session"
    )
    await expect(conn).to_have_attribute("data-state", "idle")
    await page.locator(f'.session-item[data-session-id="{sid}"]').click()
    await _live(page)
    await expect(conn.locator("#conn-text")).to_have_text("live")


async def _banner(page: Page) -> str:
    await expect(page.locator("#auth-banner")).to_be_visible(timeout=WAIT_MS)
    return (await page.locator("#auth-text").text_content()) or ""


async def _paste(page: Page, token: str) -> None:
    await page.fill("#auth-token", token)
    await page.click("#auth-form button[type=submit]")


async def test_bad_tokens_are_told_apart_malformed_refused_revoked_expired(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession, broker: Broker
) -> None:
    a, _ = deployment.gateways
    s = deployment.settings
    page = await pages.open("nobody", a.url + "/")
    banner = page.locator("#auth-banner")
    await expect(banner).to_be_visible(timeout=WAIT_MS)

    await _paste(page, "not-a-token")
    await expect(page.locator("#auth-text")).to_have_text(
        "That is not a token (it does not read as a JWT). Open a new console link, or paste a token:"
    )
    await expect(banner).to_have_attribute("data-code", "malformed")
    await expect(page.locator("#conn-text")).to_have_text("not signed in")

    forged = auth.mint(dataclasses.replace(s, jwt_secret="someone-else's-secret-0123456789"), "eve")
    await _paste(page, forged)
    await expect(banner).to_have_attribute("data-code", "unauthorized", timeout=WAIT_MS)
    await expect(page.locator("#auth-text")).to_have_text(
        "The gateway refused this token (invalid token: InvalidSignatureError). "
        "Open a new console link, or paste a token:"
    )
    await expect(page.locator("#conn-text")).to_have_text("sign-in needed")

    revoked = auth.mint(s, "rita")
    await broker.store.revoke_tokens("rita", "test")

    async def refused() -> bool:
        async with http.get(f"{a.url}/v1/sessions",
                            headers={"Authorization": f"Bearer {revoked}"}) as r:  # fmt: skip
            return r.status == 401 and (await r.json())["error"]["code"] == "token_revoked"

    async with asyncio.timeout(30):  # the gateway learns of revocations within a bound
        while not await refused():
            await asyncio.sleep(0.2)
    await _paste(page, revoked)
    await expect(banner).to_have_attribute("data-code", "token_revoked", timeout=WAIT_MS)
    await expect(page.locator("#auth-text")).to_have_text(
        "This token was revoked (runlog revoke): get a new one. "
        "Open a new console link, or paste a token:"
    )

    await _paste(page, deployment.token("alice"))
    await expect(banner).to_be_hidden(timeout=WAIT_MS)
    await expect(page.locator("#conn-text")).to_have_text(
        "signed in as alice · pick or create a session", timeout=WAIT_MS
    )

    expired = auth.mint(s, "alice", ttl_s=-60)
    old = await pages.open("expired", console_url(a.url, expired))
    assert (await _banner(old)).startswith("Your sign-in has expired.")
    await expect(old.locator("#auth-banner")).to_have_attribute("data-code", "token_expired")


async def test_a_retryable_error_gets_a_retry_button_that_retries(
    deployment: Deployment, pages: Pages, tmp_root: Path
) -> None:
    g = RunlogProcess("gateway", deployment.settings, tmp_root)
    try:
        await _start([g])
        page = await pages.open("alice", console_url(g.url, deployment.token("alice")))
        await expect(page.locator("#conn")).to_have_attribute("data-state", "idle", timeout=WAIT_MS)
        g.kill()  # the page's gateway is gone: a network error, retryable
        await g.wait()
        await page.fill("#new-session-title", "after the outage")
        await page.click("#new-session button[type=submit]")
        error = page.locator("#sessions-error")
        await expect(error).to_contain_text("network_error: cannot reach", timeout=WAIT_MS)
        retry = error.locator("button.retry")
        await expect(retry).to_have_text("Retry")
        await expect(error).to_have_attribute("data-code", "network_error")
        await _start([g])  # back, on the same port
        await retry.click()
        await expect(page.locator("#session-title")).to_have_text(
            "after the outage", timeout=WAIT_MS
        )
        await expect(error).to_be_hidden()
    finally:
        await g.stop()


async def test_a_stopped_or_failed_run_counts_what_streamed_instead_of_zero_tokens(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession, broker: Broker
) -> None:
    a, _ = deployment.gateways
    token = deployment.token("alice")
    sid = await _session(http, a.url, token)
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)
    async with deployment.worker():
        run_id = await _start_run(http, a.url, token, sid, "echo: " + _words(400))
        await wait_for_words(alice, run_id, 15)
        await run_card(alice, run_id).locator("button.stop").click()
        card = run_card(alice, run_id)
        await expect(card).to_have_attribute("data-status", "aborted", timeout=WAIT_MS)
    log = await log_events(http, a.url, token, run_id)
    end = log[-1]
    assert end["type"] == "run_end" and end["status"] == "aborted"
    usage = end["usage"]
    assert isinstance(usage, dict) and (usage["input_tokens"], usage["output_tokens"]) == (0, 0)
    streamed = sum(1 for e in log if e["type"] == "text_delta")
    assert streamed >= 15
    await expect(card.locator(".run-end .usage")).to_have_text(
        f"usage unknown · ~{streamed} tokens streamed"
    )

    # A failed run whose run_end has no usage at all.
    failed, w = await write_run(broker, sid, 7, end=False)
    await w.append(events.RunEnd(status="failed"))
    await w.flush()
    card = run_card(alice, failed)
    await expect(card).to_have_attribute("data-status", "failed", timeout=WAIT_MS)
    await expect(card.locator(".run-end .usage")).to_have_text("usage unknown · ~7 tokens streamed")


async def test_the_signed_in_user_is_shown_once_in_the_member_list(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = deployment.gateways
    token = deployment.token("you")  # runlog up's user
    sid = await _session(http, a.url, token, alice="viewer")
    page = await pages.open("you", console_url(a.url, token, session=sid))
    me = page.locator('.member[data-user="you"]')
    await expect(me.locator(".member-name")).to_have_text("you", timeout=WAIT_MS)
    await expect(me).to_have_attribute("data-me", "true")
    other = page.locator('.member[data-user="alice"]')
    await expect(other.locator(".member-name")).to_have_text("alice")
    assert await other.get_attribute("data-me") is None


async def test_an_echo_answer_has_no_leading_space(
    deployment: Deployment, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = deployment.gateways
    token = deployment.token("alice")
    sid = await _session(http, a.url, token)
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)
    async with deployment.worker():
        await alice.fill("#run-input", "echo: hello there")
        await alice.click("#start-run")
        card = alice.locator(".run").first
        await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    run_id = await card.get_attribute("data-run-id")
    assert run_id
    assert await page_text(alice, run_id) == "hello there"


async def test_a_run_id_has_its_full_id_in_a_title_and_a_copy_button(
    deployment: Deployment, pages: Pages, broker: Broker
) -> None:
    a, _ = deployment.gateways
    sid = await broker.store.create_session("alice", "ids")
    run_id, _ = await write_run(broker, sid, 3)
    ctx = await pages.browser.new_context(
        viewport={"width": 1280, "height": 800}, permissions=["clipboard-read", "clipboard-write"]
    )
    pages.contexts.append(ctx)
    page = await pages.open_in(
        ctx, "alice", console_url(a.url, deployment.token("alice"), session=sid)
    )
    card = run_card(page, run_id)
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    shown = card.locator(".run-id")
    await expect(shown).to_have_attribute("title", run_id)
    assert run_id.startswith(((await shown.text_content()) or "?").rstrip("…"))
    copy = card.locator(".run-head button.copy")
    await copy.click()
    await expect(copy).to_have_text("Copied")
    assert await page.evaluate("navigator.clipboard.readText()") == run_id
