"""The console, live (issue 14, items 1, 6 and 7), in a real browser: queued
runs in place with their position and Cancel, the side panels on a narrow
screen, the numbers on a run card, and who is watching a session now.

Same stack as test_browser.py: two gateway processes, a scripted worker,
Debian's Chromium through Playwright; every wait is for a condition.
"""

from __future__ import annotations

import os
from typing import Any

import aiohttp
from playwright.async_api import Page, expect
from playwright.async_api import TimeoutError as PlaywrightTimeout

from . import test_browser
from .browser_helpers import (
    ARTIFACTS,
    DOCS_IMG,
    WAIT_MS,
    Pages,
    console_url,
    log_events,
    publish_screenshot,
    run_card,
)
from .test_browser import Cluster, _live, _session, _start_run

# The same module-scoped stack and pages fixtures as test_browser.py.
cluster = test_browser.cluster
pages = test_browser.pages


async def _interrupt(http: aiohttp.ClientSession, url: str, token: str, run_id: str) -> None:
    async with http.post(f"{url}/v1/runs/{run_id}/interrupt", json={"reason": "test over"},
                         headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
        assert r.status in (202, 409), await r.text()


async def _submit(page: Page, text: str) -> None:
    await page.fill("#run-input", text)
    await page.click("#start-run")
    await expect(page.locator("#run-input")).to_have_value("", timeout=WAIT_MS)


async def _queued_ids(page: Page) -> list[str]:
    ids: list[str] = await page.eval_on_selector_all(
        "#runs .run-queued", "(els) => els.map((e) => e.dataset.runId)"
    )
    return ids


async def test_queued_runs_show_in_place_with_their_position_and_can_be_cancelled(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, b = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token, bob="approver", carol="viewer")
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    bob = await pages.open("bob", console_url(b.url, cluster.token("bob"), session=sid))
    for p in (alice, bob):
        await _live(p)
    # A run that waits for an approval nobody gives: the next ones queue behind it.
    await _submit(alice, "tell me about approvals")
    first = alice.locator("#runs .run").first
    await expect(first.locator(".approval")).to_have_attribute("data-state", "pending",
                                                               timeout=WAIT_MS)  # fmt: skip
    first_id = await first.get_attribute("data-run-id")
    assert first_id
    await _submit(alice, "echo: second")
    await _submit(alice, "echo: third")
    for p in (alice, bob):  # bob learns of alice's runs from the gateway's notice
        queued = p.locator("#runs .run-queued")
        await expect(queued).to_have_count(2, timeout=WAIT_MS)
        await expect(queued.nth(0).locator(".run-status")).to_have_text("queued · 1st in line")
        await expect(queued.nth(1).locator(".run-status")).to_have_text("queued · 2nd in line")
        await expect(queued.nth(0).locator(".run-input")).to_contain_text("echo: second")
        # In place: after the run they wait for, in the order they will start.
        assert await p.eval_on_selector_all(
            "#runs > .run", "(els) => els.map((e) => e.classList.contains('run-queued'))"
        ) == [False, True, True]
    second_id, third_id = await _queued_ids(alice)
    assert await _queued_ids(bob) == [second_id, third_id]
    # Cancel is for the starter and owners: bob (an approver) has none.
    await expect(run_card(bob, second_id).locator("button.cancel-queued")).to_be_hidden()
    await run_card(alice, second_id).locator("button.cancel-queued").click()

    # Ended at once, though the run ahead still waits for its approval.
    for p in (alice, bob):
        await expect(run_card(p, second_id)).to_have_attribute("data-status", "aborted",
                                                               timeout=WAIT_MS)  # fmt: skip
        await expect(p.locator(f'.run-queued[data-run-id="{second_id}"]')).to_have_count(0)
        await expect(run_card(p, third_id).locator(".run-status")).to_have_text(
            "queued · 1st in line"
        )
        await expect(run_card(p, first_id)).to_have_attribute("data-status", "waiting")
    evs = await log_events(http, a.url, token, second_id)
    assert [e["type"] for e in evs] == ["run_start", "interrupt_requested", "run_end"]
    assert (evs[1]["requested_by"], evs[2]["status"]) == ("alice", "aborted")

    # A late joiner sees the line as it is.
    carol = await pages.open("carol", console_url(a.url, cluster.token("carol"), session=sid))
    await _live(carol)
    await expect(carol.locator("#runs .run-queued")).to_have_count(1, timeout=WAIT_MS)
    await expect(run_card(carol, third_id).locator(".run-status")).to_have_text(
        "queued · 1st in line"
    )
    await expect(run_card(carol, third_id).locator("button.cancel-queued")).to_be_hidden()
    for run_id in (third_id, first_id):
        await _interrupt(http, a.url, token, run_id)
    for p in (alice, bob, carol):
        await expect(run_card(p, third_id)).to_have_attribute("data-status", "aborted",
                                                              timeout=WAIT_MS)  # fmt: skip


# Every element a user can see, whose box is not inside the viewport (text cut
# on purpose with an ellipsis is judged by its box, the ellipsis's owner).
_OUTSIDE_JS = """() => {
  const w = document.documentElement.clientWidth, out = [];
  const ellipsis = (el) => {
    for (let p = el.parentElement; p; p = p.parentElement) {
      if (getComputedStyle(p).textOverflow === "ellipsis") return true;
    }
    return false;
  };
  for (const el of document.querySelectorAll("body *")) {
    if (!el.checkVisibility({ visibilityProperty: true }) || ellipsis(el)) continue;
    const r = el.getBoundingClientRect();
    if (!r.width && !r.height) continue;
    if (r.left < -0.5 || r.right > w + 0.5) out.push(`${el.tagName}#${el.id}.${el.className} ${r.left}..${r.right}`);
  }
  return out;
}"""
_SCROLLS_JS = "() => document.documentElement.scrollWidth > document.documentElement.clientWidth"


async def _fits(page: Page) -> None:
    """Nothing visible outside the viewport, no horizontal scroll (once a
    panel has finished sliding)."""
    try:
        await page.wait_for_function(
            f"() => !({_SCROLLS_JS})() && ({_OUTSIDE_JS})().length === 0", timeout=10_000
        )
    except PlaywrightTimeout:
        pass
    assert await page.evaluate(_OUTSIDE_JS) == []
    assert not await page.evaluate(_SCROLLS_JS)


async def test_narrow_screen_collapses_the_side_panels_behind_buttons(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token, "A session with a long title that must not push "
                         "anything off a phone screen", bob="approver")  # fmt: skip
    run_id = await _start_run(http, a.url, token, sid, "echo: " + "word " * 60)
    alice = await pages.open("alice", console_url(a.url, token, session=sid), viewport=(390, 844))
    await _live(alice)
    await expect(run_card(alice, run_id)).to_have_attribute("data-status", "completed",
                                                            timeout=WAIT_MS)  # fmt: skip
    sessions_btn = alice.get_by_role("button", name="Sessions", exact=True)
    members_btn = alice.get_by_role("button", name="Members", exact=True)
    # The runs take the whole width; the panels are closed.
    box = await alice.locator("#main").bounding_box()
    assert box is not None and box["x"] == 0 and box["width"] == 390
    await expect(alice.locator("#sessions-panel")).not_to_be_visible()
    await expect(alice.locator("#members-panel")).not_to_be_visible()
    await expect(sessions_btn).to_have_attribute("aria-expanded", "false")
    await _fits(alice)

    # Sessions: opened by its button, closed by Escape.
    await sessions_btn.click()
    await expect(alice.locator("#sessions-panel")).to_be_visible()
    await expect(sessions_btn).to_have_attribute("aria-expanded", "true")
    await expect(alice.locator(f'.session-item[data-session-id="{sid}"]')).to_be_in_viewport()
    await _fits(alice)
    await alice.keyboard.press("Escape")
    await expect(alice.locator("#sessions-panel")).not_to_be_visible()
    await expect(sessions_btn).to_have_attribute("aria-expanded", "false")

    # Members: opened, the other closes; closed by its button again.
    await members_btn.click()
    await expect(alice.locator("#members-panel")).to_be_visible()
    await expect(alice.locator('.member[data-user="bob"]')).to_be_in_viewport()
    await expect(alice.locator("#members-panel")).to_be_in_viewport(ratio=1)  # slid all the way in
    shot = ARTIFACTS / "console-narrow.png"
    await alice.screenshot(path=str(shot))
    publish_screenshot(
        shot,
        DOCS_IMG / "console-narrow.png",
        force=bool(os.environ.get("RUNLOG_UPDATE_SCREENSHOT")),
    )
    await _fits(alice)
    await members_btn.click()
    await expect(alice.locator("#members-panel")).not_to_be_visible()

    # Picking a session from the panel closes it and opens the session.
    await sessions_btn.click()
    await alice.locator(f'.session-item[data-session-id="{sid}"]').click()
    await expect(alice.locator("#sessions-panel")).not_to_be_visible()
    await expect(run_card(alice, run_id)).to_be_visible(timeout=WAIT_MS)
    await _fits(alice)


def _ts(evs: list[dict[str, Any]], type_: str) -> int:
    return next(int(e["ts"]) for e in evs if e["type"] == type_)


async def test_run_card_shows_first_token_duration_tokens_and_approval_wait(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token)
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)

    # While it streams: a duration that counts up, tokens counted with "~".
    long_id = await _start_run(http, a.url, token, sid, "long")
    card = run_card(alice, long_id)
    tokens = card.locator('.stat[data-stat="tokens"]')
    duration = card.locator('.stat[data-stat="duration"]')
    await expect(tokens).to_contain_text("~", timeout=WAIT_MS)
    await expect(duration).to_have_attribute("data-final", "false")
    shown = int(await duration.get_attribute("data-value") or "0")
    await alice.wait_for_function(
        "([id, ms]) => +document.querySelector(`.run[data-run-id='${id}'] "
        "[data-stat=duration]`).dataset.value >= ms + 1000",
        arg=[long_id, shown], timeout=WAIT_MS,
    )  # fmt: skip
    await card.locator("button.stop").click()
    await expect(card).to_have_attribute("data-status", "aborted", timeout=WAIT_MS)
    evs = await log_events(http, a.url, token, long_id)
    deltas = sum(e["type"] in ("text_delta", "reasoning_delta") for e in evs)
    # Stopped mid-stream: what streamed is counted, not "0 out".
    await expect(tokens).to_have_text(f"tokens ~{deltas} out")
    await expect(duration).to_have_attribute(
        "data-value", str(_ts(evs, "run_end") - _ts(evs, "run_start"))
    )

    # Completed after an approval: every number from the log.
    run_id = await _start_run(http, a.url, token, sid, "tell me about approvals")
    card = run_card(alice, run_id)
    waited = card.locator('.stat[data-stat="approvals"]')
    await expect(waited).to_contain_text("waiting for approval", timeout=WAIT_MS)
    await card.locator("button.approve").click()
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    evs = await log_events(http, a.url, token, run_id)
    start = _ts(evs, "run_start")
    first = next(int(e["ts"]) for e in evs if e["type"] in ("text_delta", "reasoning_delta"))
    end = evs[-1]
    assert end["type"] == "run_end" and end["usage"]["output_tokens"] > 0
    wait_ms = _ts(evs, "approval_decided") - _ts(evs, "approval_required")
    await expect(card.locator('.stat[data-stat="ttft"]')).to_have_attribute(
        "data-value", str(first - start)
    )
    await expect(card.locator('.stat[data-stat="duration"]')).to_have_attribute(
        "data-value", str(end["ts"] - start)
    )
    await expect(card.locator('.stat[data-stat="duration"]')).to_have_attribute(
        "data-final", "true"
    )
    u = end["usage"]
    await expect(card.locator('.stat[data-stat="tokens"]')).to_have_text(
        f"tokens {u['input_tokens']} in · {u['output_tokens']} out"
    )
    await expect(waited).to_have_attribute("data-value", str(wait_ms))
    await expect(waited).to_contain_text("waited for approval")


async def test_who_is_watching_appears_and_leaves_live(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, b = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token, bob="viewer")
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)
    presence = alice.locator("#presence")
    await expect(presence).to_have_attribute("data-users", "alice", timeout=WAIT_MS)
    # Bob opens the session through the other gateway: alice sees him.
    bob = await pages.open("bob", console_url(b.url, cluster.token("bob"), session=sid))
    await _live(bob)
    await expect(presence).to_have_attribute("data-users", "alice,bob", timeout=WAIT_MS)
    await expect(presence.locator('.viewer[data-user="bob"]')).to_have_text("Bbob")
    await expect(bob.locator("#presence")).to_have_attribute("data-users", "alice,bob")
    # Bob closes his tab: he leaves (within the bound, here a message's latency).
    await bob.close()
    await expect(presence).to_have_attribute("data-users", "alice", timeout=15_000)
