"""Answers rendered as Markdown in the console (gateway/static/markdown.js), in
a real browser: what renders, the Copy button, and what never becomes HTML.

Runs are written straight into the log (the worker's path), so a test can put
any text in a model's mouth; the page is served by a gateway in this process.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Page, expect

from broker import events
from broker.log import RunWriter
from broker.runtime import Broker
from broker.settings import Settings

from .browser_helpers import (
    ARTIFACTS,
    DOCS_IMG,
    WAIT_MS,
    Pages,
    console_url,
    page_text,
    pages_for,
    publish_screenshot,
    run_card,
)
from .gw import RunningGateway, running_gateway

# Installed before the page's own scripts (Playwright's init scripts are not
# subject to the page's CSP): every CSP violation the page reports.
_CSP_LOG_JS = """
window.__csp = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`));
"""

CODE = 'async for event in client.events(run_id):\n    print(f"{event.seq}: <{event.type}>")'
ANSWER = f"""## Findings

The log keeps **every** event, see [the protocol](https://example.com/protocol).

- durable before visible
- one writer per run

| setting | unit | default |
|:---|:---:|---:|
| flush interval | ms | 2 |

```python
{CODE}
```
"""


@pytest_asyncio.fixture(loop_scope="session")
async def pages(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Pages]:
    async with pages_for(browser, request) as p:
        yield p


@pytest_asyncio.fixture(loop_scope="session")
async def gw(settings: Settings) -> AsyncIterator[RunningGateway]:
    async with running_gateway(settings) as g:
        yield g


async def _open(pages: Pages, gw: RunningGateway, sid: str, *, clipboard: bool = False) -> Page:
    perms = ["clipboard-read", "clipboard-write"] if clipboard else []
    ctx = await pages.browser.new_context(viewport={"width": 1280, "height": 800},
                                          permissions=perms)  # fmt: skip
    pages.contexts.append(ctx)
    await ctx.add_init_script(_CSP_LOG_JS)
    page = await pages.open_in(ctx, "alice", console_url(gw.url, gw.token("alice"), session=sid))
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT_MS)
    return page


async def _run(broker: Broker, sid: str, input: str) -> tuple[str, RunWriter]:
    run_id = await broker.store.create_run(sid, "alice", input=input)
    w = await broker.claim(run_id, "test-writer")
    await w.append(events.RunStart(started_by="alice", input=input, model="scripted"))
    return run_id, w


async def _text(w: RunWriter, text: str, chunk: int = 3) -> None:
    """`text` as a model streams it: deltas of `chunk` characters."""
    for i in range(0, len(text), chunk):
        await w.append(events.TextDelta(message_id="m1", delta=text[i : i + chunk]))
    await w.flush()


_RENDERED_JS = """(runId) => {
  const m = document.querySelector(`.run[data-run-id="${runId}"] .message`);
  const cells = (sel) => [...m.querySelectorAll(sel)].map((c) => [c.textContent, c.className]);
  return {
    h2: [...m.querySelectorAll("h2")].map((e) => e.textContent),
    strong: [...m.querySelectorAll("p strong")].map((e) => e.textContent),
    items: [...m.querySelectorAll("ul > li")].map((e) => e.textContent),
    head: cells("table thead th"),
    row: cells("table tbody td"),
    links: [...m.querySelectorAll("a")].map((a) => [a.textContent, a.getAttribute("href"),
      a.getAttribute("rel"), a.getAttribute("target")]),
    code: [...m.querySelectorAll(".code-block pre code")].map((c) => [c.className, c.textContent]),
    lang: [...m.querySelectorAll(".code-block .code-lang")].map((e) => e.textContent),
    styled: m.querySelectorAll("[style]").length,
    reasoningMarkup: document.querySelectorAll(".reasoning-text *").length,
    reasoning: document.querySelector(".reasoning-text").textContent,
    inputMarkup: document.querySelectorAll(".run-input h1, .run-input strong").length,
    csp: window.__csp,
  };
}"""


async def test_an_answer_renders_as_markdown_live_and_its_code_copies_exactly(
    gw: RunningGateway, broker: Broker, pages: Pages
) -> None:
    sid = await broker.store.create_session("alice", "markdown")
    alice = await _open(pages, gw, sid, clipboard=True)
    run_id, w = await _run(broker, sid, "# not a heading, **the user's own words**")
    await w.append(events.ReasoningDelta(message_id="r1", delta="**thinking** stays _plain_"))
    # Half the answer, live: the heading is drawn while the run still streams.
    await _text(w, ANSWER[:60])
    card = run_card(alice, run_id)
    await expect(card.locator(".message h2")).to_have_text("Findings", timeout=WAIT_MS)
    assert await card.get_attribute("data-status") == "running"
    await _text(w, ANSWER[60:])
    await w.append(events.RunEnd(status="completed"))
    await w.flush()
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)

    got = await alice.evaluate(_RENDERED_JS, run_id)
    assert got["h2"] == ["Findings"]
    assert got["strong"] == ["every"]
    assert got["items"] == ["durable before visible", "one writer per run"]
    assert got["head"] == [
        ["setting", "md-align-left"], ["unit", "md-align-center"], ["default", "md-align-right"],
    ]  # fmt: skip
    assert got["row"] == [
        ["flush interval", "md-align-left"], ["ms", "md-align-center"], ["2", "md-align-right"],
    ]  # fmt: skip
    assert got["links"] == [
        ["the protocol", "https://example.com/protocol", "noopener noreferrer", "_blank"]
    ]
    assert got["code"] == [["language-python", CODE + "\n"]]
    assert got["lang"] == ["python"]
    assert got["styled"] == 0  # alignment is a class: the CSP allows no style attribute
    assert got["csp"] == []
    # Reasoning and the user's input stay plain text.
    assert got["reasoningMarkup"] == 0
    assert got["reasoning"] == "**thinking** stays _plain_"
    assert got["inputMarkup"] == 0
    await expect(card.locator(".run-input")).to_contain_text(
        "# not a heading, **the user's own words**"
    )
    assert await page_text(alice, run_id) == ANSWER

    copy = card.locator(".code-block button.copy")
    await expect(copy).to_have_text("Copy")
    await copy.click()
    await expect(copy).to_have_attribute("data-state", "copied", timeout=WAIT_MS)
    await expect(copy).to_have_text("Copied")
    assert await alice.evaluate("() => navigator.clipboard.readText()") == CODE
    await expect(copy).to_have_attribute("data-state", "idle", timeout=WAIT_MS)
    await card.screenshot(path=str(_SHOT))
    publish_screenshot(_SHOT, DOCS_IMG / "console-markdown.png", force=_UPDATE)


_SHOT = ARTIFACTS / "console-markdown.png"
_UPDATE = bool(os.environ.get("RUNLOG_UPDATE_SCREENSHOT"))


# Markdown and raw HTML that must never run, load or link anywhere unsafe.
HOSTILE = """[a](javascript:window.__pwned=1) [b](JavaScript:window.__pwned=2)
[c](java&#x09;script:window.__pwned=3) [d](&#106;avascript:window.__pwned=4)
[e](vbscript:msgbox(1)) [f](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)
[g](file:///etc/passwd) [h](/v1/sessions)

<img src=x onerror="window.__pwned=5">

<script>window.__pwned=6</script>

<a href="https://example.com/raw" onclick="window.__pwned=7">raw link</a>

![pixel](https://example.com/pixel.png) ![inline](data:image/png;base64,iVBORw0KGgo=)
![js](javascript:window.__pwned=8)

[ok](https://example.com/ok "a title") <https://example.com/auto> mail@example.com
"""

_HOSTILE_JS = """(runId) => {
  const m = document.querySelector(`.run[data-run-id="${runId}"] .message`);
  return {
    pwned: window.__pwned ?? null,
    csp: window.__csp,
    tags: [...new Set([...m.querySelectorAll("*")].map((e) => e.tagName.toLowerCase()))].sort(),
    handlers: [...m.querySelectorAll("*")].flatMap((e) =>
      [...e.attributes].map((a) => a.name).filter((n) => n.startsWith("on") || n === "style" || n === "src")),
    links: [...m.querySelectorAll("a[href]")].map((a) => [a.textContent, a.getAttribute("href"),
      a.getAttribute("rel"), a.getAttribute("target")]),
    text: m.textContent,
  };
}"""


async def test_hostile_markdown_never_runs_loads_or_links_to_script(
    gw: RunningGateway, broker: Broker, pages: Pages
) -> None:
    sid = await broker.store.create_session("alice", "hostile")
    alice = await _open(pages, gw, sid)
    run_id, w = await _run(broker, sid, "echo: hostile")
    await _text(w, HOSTILE, chunk=7)
    await w.append(events.RunEnd(status="completed"))
    await w.flush()
    card = run_card(alice, run_id)
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)

    got = await alice.evaluate(_HOSTILE_JS, run_id)
    assert got["pwned"] is None
    assert got["csp"] == []  # nothing was even tried: no inline script, handler or style
    assert got["tags"] == ["a", "br", "p", "span"]  # no img, no script
    assert got["handlers"] == []
    ok = ["noopener noreferrer", "_blank"]
    assert got["links"] == [
        # Only http(s) and mailto links keep an href. A raw <a> is text, not a
        # link: only the URL in that text is (linkified, as any URL in the text).
        ["https://example.com/raw", "https://example.com/raw", *ok],
        ["image: pixel", "https://example.com/pixel.png", *ok],
        ["ok", "https://example.com/ok", *ok],
        ["https://example.com/auto", "https://example.com/auto", *ok],
        ["mail@example.com", "mailto:mail@example.com", *ok],
    ]
    # Raw HTML is shown as the text it is.
    for raw in (
        '<img src=x onerror="window.__pwned=5">',
        "<script>window.__pwned=6</script>",
        '<a href="https://example.com/raw" onclick="window.__pwned=7">raw link</a>',
    ):
        assert raw in got["text"]
    assert await page_text(alice, run_id) == HOSTILE
