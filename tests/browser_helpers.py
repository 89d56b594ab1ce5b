"""Helpers for the browser tests: Debian's Chromium driven by Playwright.

Playwright's own browser download is never used (`playwright install` cannot
work here): Chromium comes from the distribution (`make test` installs it).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from playwright.async_api import Browser, BrowserContext, ConsoleMessage, Locator, Page

CHROMIUM = Path("/usr/bin/chromium")
LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
DOCS_IMG = ROOT / "docs" / "img"  # screenshots the docs show (published by tests)
WAIT_MS = 45_000  # generous: a slow, noisy 2-core machine


def console_url(
    gateway: str, token: str, *, session: str | None = None, gateways: list[str] | None = None
) -> str:
    frag = f"token={token}"
    if gateways:
        frag += "&gateways=" + quote(",".join(gateways), safe=",:/")
    if session:
        frag += f"&session={session}"
    return f"{gateway}/#{frag}"


class Pages:
    """The pages of one test, each with its console log; on failure their
    screenshots and logs go to test-artifacts/<test>/."""

    def __init__(self, browser: Browser, test_name: str) -> None:
        self.browser = browser
        self.test_name = re.sub(r"[^\w.-]+", "_", test_name)
        self.contexts: list[BrowserContext] = []
        self.pages: dict[str, Page] = {}
        self.logs: dict[str, list[str]] = {}
        self.page_errors: list[str] = []

    async def open(self, name: str, url: str, *, viewport: tuple[int, int] = (1280, 800)) -> Page:
        """A page in its own browser context (its own sessionStorage: one user)."""
        width, height = viewport
        ctx = await self.browser.new_context(viewport={"width": width, "height": height})
        self.contexts.append(ctx)
        return await self.open_in(ctx, name, url)

    async def open_in(self, ctx: BrowserContext, name: str, url: str) -> Page:
        page = await ctx.new_page()
        log = self.logs.setdefault(name, [])

        def on_console(m: ConsoleMessage) -> None:
            log.append(f"{m.type}: {m.text}")

        def on_error(e: Exception) -> None:
            log.append(f"pageerror: {e}")
            self.page_errors.append(f"{name}: {e}")

        page.on("console", on_console)
        page.on("pageerror", on_error)
        self.pages[name] = page
        await page.goto(url)
        return page

    async def save_artifacts(self) -> Path:
        out = ARTIFACTS / self.test_name
        out.mkdir(parents=True, exist_ok=True)
        for name, page in self.pages.items():
            try:
                await page.screenshot(path=str(out / f"{name}.png"), timeout=10_000)
            except Exception as e:
                self.logs.setdefault(name, []).append(f"(no screenshot: {e})")
            (out / f"{name}.console.log").write_text("\n".join(self.logs.get(name, [])) + "\n")
        return out

    async def close(self) -> None:
        for ctx in self.contexts:
            await ctx.close()


def run_card(page: Page, run_id: str) -> Locator:
    return page.locator(f'.run[data-run-id="{run_id}"]')


# The answer text a page shows for a run: its messages, in order. A message
# is rendered as Markdown (gateway/static/markdown.js), so its text is the
# source of its last render (`data-source`), not what the markup reads.
_PAGE_TEXT_JS = """(runId) => {
  const run = document.querySelector(`.run[data-run-id="${runId}"]`);
  if (!run) return null;
  return [...run.querySelectorAll('.message')].map((m) => m.dataset.source ?? m.textContent).join('');
}"""

_WORDS_JS = """([runId, n]) => {
  const run = document.querySelector(`.run[data-run-id="${runId}"]`);
  if (!run) return false;
  const text = [...run.querySelectorAll('.message')].map((m) => m.textContent).join('');
  return text.split(/\\s+/).filter(Boolean).length >= n;
}"""


async def page_text(page: Page, run_id: str) -> str | None:
    text: str | None = await page.evaluate(_PAGE_TEXT_JS, run_id)
    return text


async def wait_for_words(page: Page, run_id: str, n: int) -> None:
    await page.wait_for_function(_WORDS_JS, arg=[run_id, n], timeout=WAIT_MS)


async def first_run_id(page: Page) -> str:
    card = page.locator(".run").first
    await card.wait_for(timeout=WAIT_MS)
    run_id = await card.get_attribute("data-run-id")
    assert run_id
    return run_id


async def log_events(
    http: aiohttp.ClientSession, url: str, token: str, run_id: str
) -> list[dict[str, Any]]:
    """Every stored event of a run, through the REST API."""
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        async with http.get(
            f"{url}/v1/runs/{run_id}/events",
            params={"after": str(after)},
            headers={"Authorization": f"Bearer {token}"},
        ) as r:
            assert r.status == 200, await r.text()
            page = await r.json()
        if not page["events"]:
            return out
        out.extend(page["events"])
        after = page["next_after"]


def answer_text(events: list[dict[str, Any]]) -> str:
    """The text a reader should see: text deltas by message, minus reset messages."""
    messages: dict[str, str] = {}
    for e in events:
        if e["type"] == "text_delta":
            messages[e["message_id"]] = messages.get(e["message_id"], "") + e["delta"]
        elif e["type"] == "message_reset":
            messages.pop(e["message_id"], None)
    return "".join(messages.values())


def publish_screenshot(src: Path, dest: Path, *, force: bool) -> None:
    """Copy a screenshot into the docs when it is missing, or when asked to."""
    if force or not dest.exists():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


@contextlib.asynccontextmanager
async def pages_for(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Pages]:
    """A test's `Pages` (a `pages` fixture's body): fails the test on an uncaught
    error in a page, saves the artifacts when it failed, closes every context."""
    p = Pages(browser, request.node.name)
    failed_before = request.session.testsfailed
    try:
        yield p
        if p.page_errors:
            where = await p.save_artifacts()
            pytest.fail(f"uncaught errors in the page (see {where}): {p.page_errors}")
    finally:
        if request.session.testsfailed > failed_before:
            await p.save_artifacts()
        await p.close()
