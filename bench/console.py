"""console: the web console's weight and time to interactive on a cold load,
in Debian's Chromium (Playwright), against a real gateway process.

Each trial opens two pages, each in a new browser context with the HTTP cache
disabled (CDP `Network.setCacheDisabled`), so every file comes over the wire:

1. **home**: `/#token=…` (a user with --sessions sessions), until the session
   list has its first entry (the page can be used: sessions can be opened,
   one created).
2. **session**: `/#token=…&session=…`, a session holding one completed run
   whose answer is a Markdown document of --tokens token deltas (headings,
   lists, a table, fenced code), until the answer's last word is on the page.

Time to interactive is measured in the page: a MutationObserver installed
before any of the page's scripts (Playwright's init script) records
`performance.now()` (milliseconds since navigation start) the first time the
condition holds (and counts the answer's renders on the way: how often a
message's content was replaced). Transferred bytes are the page's own Resource Timing: the
navigation's `transferSize` plus every resource's (headers and body as
received: the document, CSS, every ES module, the REST calls). WebSocket
frames (the live feed) are not resources and are not counted.
"""

from __future__ import annotations

import argparse
from typing import Any

from playwright.async_api import Browser, async_playwright

from broker import events

from . import _gw, _lib
from ._gw import progress
from ._lib import Figure
from ._procs import GatewayProc

_CHROMIUM = "/usr/bin/chromium"
_LAUNCH_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-quic",
    "--disable-sync",
]
_LAST_WORD = "answer-ends-here"
_WAIT_MS = 60_000

# Installed before the page's scripts: records when `window.__ready()` first
# holds. The condition is given by the trial (home or session page).
_OBSERVER_JS = """(() => {
  window.__renders = 0; // times an answer's content was replaced (a render)
  const check = (records) => {
    for (const r of records) {
      if (r.type === "childList" && r.target.classList?.contains("message")) window.__renders++;
    }
    if (window.__readyAt !== undefined || !window.__ready || !window.__ready()) return;
    window.__readyAt = performance.now();
    obs.disconnect();
  };
  const obs = new MutationObserver(check);
  obs.observe(document, { childList: true, subtree: true, characterData: true });
})();"""

_HOME_READY_JS = "window.__ready = () => !!document.querySelector('#sessions li');"
_SESSION_READY_JS = (
    "window.__ready = () => [...document.querySelectorAll('.run .message')]"
    f".some((m) => m.textContent.includes('{_LAST_WORD}'));"
)

_WEIGHT_JS = """() => {
  const nav = performance.getEntriesByType('navigation')[0];
  const files = performance.getEntriesByType('resource').map((r) => ({
    name: new URL(r.name).pathname, bytes: r.transferSize, kind: r.initiatorType,
  }));
  return { document: nav.transferSize, files };
}"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=20, help="sessions in the list (default: 20)")
    p.add_argument("--tokens", type=int, default=2000,
                   help="token deltas in the session page's answer (default: 2000)")  # fmt: skip


def markdown_answer(tokens: int) -> list[str]:
    """A Markdown answer as `tokens` deltas (a word and its whitespace each)."""
    block = (
        "## Findings\n\nThe run log keeps **every** event in order, and *each* "
        "reader resumes from its cursor. See [the protocol](https://example.com/protocol).\n\n"
        "- durable before visible\n- one writer per run\n- resume anywhere\n\n"
        "| setting | unit | default |\n|---|---|---:|\n| flush interval | ms | 2 |\n"
        "| queue | bytes | 1048576 |\n\n"
        "```python\nasync for event in client.events(run_id):\n    print(event.seq)\n```\n\n"
    )
    words: list[str] = []
    while len(words) < tokens - 1:
        for part in block.split(" "):
            words.append(part + " ")
    return [*words[: tokens - 1], _LAST_WORD]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    trials: list[dict[str, Any]] = []
    async with _lib.stack(args.work_dir) as st:
        b = await _gw.connect_broker(st)
        gw = await GatewayProc(st).start()
        try:
            for i in range(args.sessions):
                sid = await b.store.create_session(_gw.USER, f"bench console {i}")
            w = await _gw.new_run(b, sid)
            for delta in markdown_answer(args.tokens):
                await w.append(events.TextDelta(message_id="m_0001", delta=delta))
            await w.append(events.RunEnd(status="completed"))
            await w.flush()
            token = _gw.token()
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=_CHROMIUM, args=_LAUNCH_ARGS)
                try:
                    for trial in range(args.trials):
                        home = await _cold_load(browser, f"{gw.url}/#token={token}", _HOME_READY_JS)
                        session = await _cold_load(
                            browser, f"{gw.url}/#token={token}&session={sid}", _SESSION_READY_JS
                        )
                        trials.append({"home": home, "session": session})
                        progress(
                            f"trial {trial + 1}: home {home['bytes']} B in {home['ready_ms']:.0f} ms,"
                            f" session {session['bytes']} B in {session['ready_ms']:.0f} ms"
                        )
                finally:
                    await browser.close()
        finally:
            await gw.stop()
            await b.close()
    return {"figures": _figures(trials), "trials": trials}


async def _cold_load(browser: Browser, url: str, ready_js: str) -> dict[str, Any]:
    ctx = await browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        await ctx.add_init_script(ready_js + _OBSERVER_JS)
        page = await ctx.new_page()
        cdp = await ctx.new_cdp_session(page)
        await cdp.send("Network.enable")
        await cdp.send("Network.setCacheDisabled", {"cacheDisabled": True})
        await page.goto(url)
        await page.wait_for_function("() => window.__readyAt !== undefined", timeout=_WAIT_MS)
        ready_ms: float = await page.evaluate("() => window.__readyAt")
        renders: int = await page.evaluate("() => window.__renders")
        weight: dict[str, Any] = await page.evaluate(_WEIGHT_JS)
        files = weight["files"]
        static = sum(f["bytes"] for f in files if f["name"].startswith("/static/"))
        return {
            "ready_ms": ready_ms,
            "bytes": weight["document"] + sum(f["bytes"] for f in files),
            "static_bytes": weight["document"] + static,
            "requests": 1 + len(files),
            "renders": renders,
            "files": files,
        }
    finally:
        await ctx.close()


def _figures(trials: list[dict[str, Any]]) -> list[Figure]:
    out: list[Figure] = []
    for page in ("home", "session"):
        rows = [t[page] for t in trials]
        out += [
            _lib.summarize(page, "transferred", "bytes", [r["bytes"] for r in rows]),
            _lib.summarize(
                page, "of which the page's files", "bytes", [r["static_bytes"] for r in rows]
            ),
            _lib.summarize(page, "requests", "", [r["requests"] for r in rows]),
            _lib.summarize(page, "time to interactive", "ms", [r["ready_ms"] for r in rows]),
        ]
    out.append(
        _lib.summarize("session", "answer renders", "", [t["session"]["renders"] for t in trials])
    )
    return out
