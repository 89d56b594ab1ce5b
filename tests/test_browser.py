"""The web console in a real browser (Debian's Chromium, driven by Playwright),
against real gateway and worker processes on the test stack.

Every wait is for a condition on the page, with a generous timeout; nothing
sleeps and then asserts. On failure each page's screenshot and console log
are saved under test-artifacts/<test>/.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, Page, WebSocketRoute, expect

from broker import events, ids
from broker.runtime import Broker
from broker.settings import Settings
from broker.sockets import free_port
from gateway import auth

from .browser_helpers import (
    ARTIFACTS,
    ROOT,
    WAIT_MS,
    Pages,
    answer_text,
    console_url,
    first_run_id,
    log_events,
    page_text,
    pages_for,
    publish_screenshot,
    run_card,
    wait_for_words,
)
from .procs import RunlogProcess

TOKENS_PER_S = 40
DOCS_SCREENSHOT = ROOT / "docs" / "img" / "console.png"


def _gateway_pair(settings: Settings, log_dir: Path) -> list[RunlogProcess]:
    """Two gateways of one deployment, each listing both (a page served by one
    may fail over to the other) and allowing the other's Origin."""
    gws = [RunlogProcess("gateway", settings, log_dir) for _ in range(2)]
    for g in gws:
        g.env["RUNLOG_GATEWAY_URLS"] = g.env["RUNLOG_ALLOWED_ORIGINS"] = ",".join(
            x.url for x in gws
        )
    return gws


async def _start(procs: list[RunlogProcess]) -> None:
    for p in procs:
        await p.start()
    for p in procs:
        if p.kind == "gateway":
            await p.wait_ready()
        else:
            async with asyncio.timeout(30):
                while " ready" not in p.log_tail():
                    assert p.proc is not None and p.proc.returncode is None, p.log_tail()
                    await asyncio.sleep(0.1)


@dataclasses.dataclass
class Cluster:
    settings: Settings
    gateways: list[RunlogProcess]

    def token(self, user: str) -> str:
        return auth.mint(self.settings, user)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cluster(settings: Settings, tmp_root: Path) -> AsyncIterator[Cluster]:
    gws = _gateway_pair(settings, tmp_root)
    worker = RunlogProcess(
        "worker", settings, tmp_root,
        RUNLOG_MODEL_ADAPTER="scripted", RUNLOG_SCRIPTED_TOKENS_PER_S=str(TOKENS_PER_S),
    )  # fmt: skip
    try:
        await _start([worker, *gws])
        yield Cluster(settings, gws)
    finally:
        for p in [*gws, worker]:
            await p.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def pages(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Pages]:
    async with pages_for(browser, request) as p:
        yield p


async def _session(http: aiohttp.ClientSession, url: str, token: str, title: str = "browser test",
                   **members: str) -> str:  # fmt: skip
    headers = {"Authorization": f"Bearer {token}"}
    async with http.post(f"{url}/v1/sessions", json={"title": title}, headers=headers) as r:
        assert r.status == 201, await r.text()
        sid: str = (await r.json())["session_id"]
    for user, role in members.items():
        async with http.post(f"{url}/v1/sessions/{sid}/members",
                             json={"user_id": user, "role": role}, headers=headers) as r:  # fmt: skip
            assert r.status == 201, await r.text()
    return sid


async def _start_run(http: aiohttp.ClientSession, url: str, token: str, sid: str, text: str) -> str:
    async with http.post(f"{url}/v1/sessions/{sid}/runs", json={"input": text},
                         headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
        assert r.status == 202, await r.text()
        run_id: str = (await r.json())["run_id"]
    return run_id


async def _live(page: Page) -> None:
    await expect(page.locator("#conn")).to_have_attribute("data-state", "live", timeout=WAIT_MS)


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


async def test_owner_and_approver_see_the_approval_and_who_decided(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, b = cluster.gateways
    alice = await pages.open("alice", console_url(a.url, cluster.token("alice")))
    # The owner creates the session and adds its members through the console.
    await alice.fill("#new-session-title", "Release review")
    await alice.click("#new-session button[type=submit]")
    await expect(alice.locator("#session")).to_be_visible(timeout=WAIT_MS)
    for user, role in (("bob", "approver"), ("carol", "viewer")):
        await alice.fill("#member-user", user)
        await alice.select_option("#member-role", role)
        await alice.click("#add-member button[type=submit]")
        await expect(alice.locator(f'.member[data-user="{user}"]')).to_have_attribute(
            "data-role", role, timeout=WAIT_MS
        )
    sid = await alice.locator("#session-id").text_content()
    assert sid and sid.startswith("s_")
    # The approver watches through the other gateway; the viewer through the first.
    bob = await pages.open("bob", console_url(b.url, cluster.token("bob"), session=sid))
    carol = await pages.open("carol", console_url(a.url, cluster.token("carol"), session=sid))
    for p in (alice, bob, carol):
        await _live(p)
    await expect(carol.locator("#start-run")).to_be_disabled()

    await alice.fill("#run-input", "tell me about approvals")
    await alice.click("#start-run")
    run_id = await first_run_id(alice)
    for p in (alice, bob, carol):
        card = run_card(p, run_id)
        await expect(card.locator(".approval")).to_have_attribute(
            "data-state", "pending", timeout=WAIT_MS
        )
        await expect(card).to_have_attribute("data-status", "waiting")
        # The tool calls so far: a low-risk search with its result, then the
        # high-risk call waiting for the approval.
        await expect(card.locator('.tool[data-state="ok"] .tool-name')).to_have_text("search_docs")
        await expect(card.locator(".tool .risk-high")).to_have_count(1)
    await expect(run_card(carol, run_id).locator(".approval button")).to_have_count(0)
    await expect(run_card(carol, run_id).locator(".approval-actions.readonly")).to_be_visible()
    await expect(run_card(carol, run_id).locator("button.stop")).to_be_hidden()
    await expect(run_card(alice, run_id).locator("button.approve")).to_be_visible()

    # The console mid-run, for the README.
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "console.png"
    await alice.screenshot(path=str(shot))
    publish_screenshot(
        shot, DOCS_SCREENSHOT, force=bool(os.environ.get("RUNLOG_UPDATE_SCREENSHOT"))
    )

    await run_card(bob, run_id).locator("button.approve").click()
    for p in (alice, bob, carol):
        card = run_card(p, run_id)
        decision = card.locator(".approval-decision")
        await expect(decision).to_have_attribute("data-decided-by", "bob", timeout=WAIT_MS)
        await expect(decision).to_contain_text("Approved by bob")
        await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        await expect(card.locator(".message").last).to_contain_text(
            "Done: the summary was sent to the team."
        )
        await expect(card.locator('.tool[data-state="ok"]')).to_have_count(2)
    expected = answer_text(await log_events(http, a.url, cluster.token("alice"), run_id))
    for p in (alice, bob, carol):
        assert await page_text(p, run_id) == expected


async def test_stop_mid_stream_shows_aborted_and_keeps_the_partial_text(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, b = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token, bob="approver")
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    bob = await pages.open("bob", console_url(b.url, cluster.token("bob"), session=sid))
    for p in (alice, bob):
        await _live(p)
    run_id = await _start_run(http, a.url, token, sid, "echo: " + _words(400))
    await wait_for_words(alice, run_id, 15)
    await run_card(alice, run_id).locator("button.stop").click()

    for p in (alice, bob):
        card = run_card(p, run_id)
        await expect(card).to_have_attribute("data-status", "aborted", timeout=WAIT_MS)
        await expect(card.locator(".run-status")).to_have_text("aborted")
        await expect(card.locator(".stop-line")).to_contain_text("requested by alice")
        audit = card.locator(".stop-audit")
        await expect(audit).to_contain_text("Stopped by")
        await expect(audit).to_contain_text("alice")
        await expect(audit).to_contain_text("Side effects done")
        await expect(card.locator("button.stop")).to_be_hidden()
    expected = answer_text(await log_events(http, a.url, token, run_id))
    assert 15 <= len(expected.split()) < 400, expected  # partial: stopped mid-stream
    for p in (alice, bob):
        assert await page_text(p, run_id) == expected


async def test_reload_mid_run_restores_history_without_duplicates_then_live(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token)
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)
    text = _words(400)
    run_id = await _start_run(http, a.url, token, sid, "echo: " + text)
    await wait_for_words(alice, run_id, 30)

    await alice.reload()  # the token and session come back from sessionStorage and the URL
    assert "token=" not in alice.url
    await wait_for_words(alice, run_id, 30)  # the history is back...
    card = run_card(alice, run_id)
    assert await card.get_attribute("data-status") == "running"  # ...before the run ended
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    got = await page_text(alice, run_id)
    assert got == text  # exactly once, in order
    assert got == answer_text(await log_events(http, a.url, token, run_id))
    await expect(card.locator(".message")).to_have_count(1)


async def test_gateway_killed_page_resumes_on_the_other_without_gap_or_duplicate(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession, tmp_root: Path
) -> None:
    c, d = _gateway_pair(cluster.settings, tmp_root)  # this test kills one of its own
    try:
        await _start([c, d])
        token = cluster.token("alice")
        sid = await _session(http, c.url, token)
        alice = await pages.open("alice", console_url(c.url, token, session=sid,
                                                      gateways=[c.url, d.url]))  # fmt: skip
        await _live(alice)
        gateway = alice.locator("#gateway")
        await expect(gateway).to_have_attribute("data-gateway", c.url)
        text = _words(400)
        run_id = await _start_run(http, d.url, token, sid, "echo: " + text)
        await wait_for_words(alice, run_id, 40)

        c.kill()  # no goodbye: the page just sees its connection drop
        await c.wait()
        await expect(gateway).to_have_attribute("data-gateway", d.url, timeout=WAIT_MS)
        card = run_card(alice, run_id)
        await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        resumed = await alice.locator("#conn").get_attribute("data-last-resume")
        assert resumed is not None and int(resumed) > 40, resumed
        got = await page_text(alice, run_id)
        assert got == text
        assert got == answer_text(await log_events(http, d.url, token, run_id))
    finally:
        await d.stop()
        await c.stop()


async def test_model_text_with_html_is_shown_as_text(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = cluster.gateways
    token = cluster.token("alice")
    payload = (
        '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'
        '<b id="injected">bold</b> &amp; <a href="javascript:window.__xss=3">link</a>'
    )
    sid = await _session(http, a.url, token, title=payload)
    alice = await pages.open("alice", console_url(a.url, token, session=sid))
    await _live(alice)
    await expect(alice.locator("#session-title")).to_have_text(payload)
    await alice.fill("#run-input", "echo: " + payload)
    await alice.click("#start-run")
    run_id = await first_run_id(alice)
    card = run_card(alice, run_id)
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    assert await page_text(alice, run_id) == payload
    await expect(card.locator(".run-input")).to_contain_text(payload)
    assert await alice.evaluate("window.__xss") is None
    for selector in ("img", "b", "a", "#injected", "body script:not([src])", "main script"):
        assert await alice.locator(selector).count() == 0, selector


# What the console shows of untrusted text (docs/console.md, "Untrusted
# text"): each value isolated, and in names, tool calls and approvals every
# bidi, zero-width or control character as a visible marker.
RLO, PDF, ZWSP = "\u202e", "\u202c", "\u200b"
TITLE = f"Quarterly {RLO}troper{ZWSP}"  # "Quarterly report" at a glance
TOOL_NAME = f"send_{RLO}liame"  # reads "send_email"
SHORT_ARGS = json.dumps({"to": "team@example.com", "note": f"{RLO}/ fr- mr{ZWSP}"},
                        ensure_ascii=False)  # fmt: skip
# Over 100 characters and JSON-escaped (U+202E as six ASCII characters): the
# console pretty-prints it once the call ends, which decodes the escapes.
LONG_ARGS = json.dumps({"command": f"rm -rf / {RLO}# tidy the temp folder{ZWSP}",
                        "cwd": "/srv/app/releases/2024-06-01/build-output"})  # fmt: skip
SUMMARY = f"run_shell: tidy the temp folder {RLO}/ fr- mr{PDF}{ZWSP}"
BOB = f"bob{ZWSP}"  # looks like "bob"
COMMENT = f"not {RLO}yako{PDF}"
PROSE = f"Done. שלום {RLO}olleh"

_RENDERED_JS = r"""(runId) => {
  const run = document.querySelector(`.run[data-run-id="${runId}"]`);
  const tool = (id) => run.querySelector(`.tool[data-tool-call-id="${id}"]`);
  const approval = run.querySelector(".approval");
  // The nearest element that isolates the text node holding `needle` (its
  // parent or an ancestor up to `root`): tag, dir and computed unicode-bidi.
  // Blocks (div, h1, li, pre) are isolates by the UA style sheet, so which
  // element it is matters: a value must be isolated from its own line.
  const isolation = (root, needle) => {
    const walk = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    let node;
    while ((node = walk.nextNode()) && !node.data.includes(needle));
    if (!node) return `no text ${needle}`;
    for (let el = node.parentElement; el; el = el === root ? null : el.parentElement) {
      const bidi = getComputedStyle(el).unicodeBidi;
      if (bidi === "isolate") return [el.tagName.toLowerCase(), el.getAttribute("dir"), bidi];
    }
    return "not isolated";
  };
  const controls = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u200b-\u200f\u202a-\u202e\u2060\u2066-\u2069\ufeff]/u;
  // Everything but the prose (model text, the user's input) is free of raw controls.
  const rest = run.cloneNode(true);
  rest.querySelectorAll(".message, .run-input").forEach((e) => e.remove());
  const message = run.querySelector(".message");
  return {
    documentTitle: document.title,
    sessionTitle: document.getElementById("session-title").textContent,
    sessionName: document.querySelector(".session-item.active .session-name").textContent,
    members: [...document.querySelectorAll(".member-name")].map((e) => e.textContent).sort(),
    toolNames: [tool("call_1"), tool("call_2")].map((t) => t.querySelector(".tool-name").textContent),
    shortArgs: tool("call_1").querySelector(".tool-args").textContent,
    longArgs: tool("call_2").querySelector(".tool-args").textContent,
    approvalTool: approval.querySelector(".tool-name").textContent,
    summary: approval.querySelector(".approval-summary").textContent,
    decision: approval.querySelector(".approval-decision").textContent,
    markers: [...approval.querySelectorAll(".ctl")].map((e) => e.textContent),
    rawInApproval: controls.test(approval.textContent) || controls.test(approval.innerText),
    rawOutsideProse: controls.test(rest.textContent),
    message: message.textContent,
    isolated: {
      sessionTitle: isolation(document.getElementById("session-title"), "Quarterly"),
      sessionName: isolation(document.querySelector(".session-item.active"), "Quarterly"),
      member: isolation(document.getElementById("members"), "bob"),
      toolName: isolation(tool("call_1").querySelector(".tool-head"), "send_"),
      args: isolation(tool("call_2"), "rm -rf"),
      approvalArgs: isolation(approval.querySelector(".approval-args"), "rm -rf"),
      approvalTool: isolation(approval.querySelector(".approval-head"), "run_shell"),
      summary: isolation(approval, "tidy the temp folder"),
      decidedBy: isolation(approval.querySelector(".approval-decision"), "bob"),
      comment: isolation(approval.querySelector(".approval-decision"), "yako"),
      message: isolation(message, "Done."),
    },
  };
}"""


async def _write_untrusted_run(broker: Broker, sid: str) -> str:
    """A run, straight into the log, whose tool calls, approval and text carry
    bidi overrides and zero-width characters (as a model, a tool or another
    user could write them, whatever the gateway accepts today)."""
    run_id = await broker.store.create_run(sid, "alice", input="echo: שלום")
    w = await broker.claim(run_id, "test-writer")
    approval_id = ids.approval_id()
    expires = int(time.time() * 1000) + 600_000
    for e in [
        events.RunStart(started_by="alice", input="echo: שלום", model="scripted"),
        events.ToolCallStart(tool_call_id="call_1", tool_name=TOOL_NAME, risk_level="high"),
        events.ToolArgsDelta(tool_call_id="call_1", partial_json=SHORT_ARGS[:20]),
        events.ToolArgsDelta(tool_call_id="call_1", partial_json=SHORT_ARGS[20:]),
        events.ToolCallEnd(tool_call_id="call_1"),
        events.ToolResult(tool_call_id="call_1", status="ok"),
        events.ToolCallStart(tool_call_id="call_2", tool_name="run_shell", risk_level="high"),
        events.ToolArgsDelta(tool_call_id="call_2", partial_json=LONG_ARGS),
        events.ToolCallEnd(tool_call_id="call_2"),
        events.ApprovalRequired(
            approval_id=approval_id, tool_call_id="call_2", summary=SUMMARY, expires_at=expires
        ),
        events.ApprovalDecided(
            approval_id=approval_id, decision="reject", decided_by=BOB, comment=COMMENT
        ),
        events.ToolResult(tool_call_id="call_2", status="denied"),
        events.TextDelta(message_id="m1", delta=PROSE[:9]),
        events.TextDelta(message_id="m1", delta=PROSE[9:]),
        events.RunEnd(status="completed"),
    ]:
        await w.append(e)
    await w.flush()
    return run_id


async def test_untrusted_text_is_isolated_and_controls_are_shown_as_markers(
    cluster: Cluster, pages: Pages, broker: Broker
) -> None:
    a, _ = cluster.gateways
    # Straight into the store: the console must hold whatever the edge lets in.
    sid = await broker.store.create_session("alice", TITLE)
    await broker.store.add_member(sid, BOB, "approver", "alice")
    run_id = await _write_untrusted_run(broker, sid)
    alice = await pages.open("alice", console_url(a.url, cluster.token("alice"), session=sid))
    card = run_card(alice, run_id)
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    await expect(card.locator(".approval")).to_have_attribute("data-state", "reject")
    await expect(alice.locator(".session-item.active")).to_have_count(1)
    await expect(alice.locator(".member")).to_have_count(2)
    got = await alice.evaluate(_RENDERED_JS, run_id)

    title = "Quarterly ⟨U+202E⟩troper⟨U+200B⟩"
    assert got["documentTitle"] == f"{title} · runlog"
    assert got["sessionTitle"] == title
    assert got["sessionName"] == title
    assert got["members"] == ["alice (you)", "bob⟨U+200B⟩"]
    assert got["toolNames"] == ["send_⟨U+202E⟩liame", "run_shell"]
    assert got["shortArgs"] == '{"to": "team@example.com", "note": "⟨U+202E⟩/ fr- mr⟨U+200B⟩"}'
    assert got["longArgs"] == (
        "{\n"
        '  "command": "rm -rf / ⟨U+202E⟩# tidy the temp folder⟨U+200B⟩",\n'
        '  "cwd": "/srv/app/releases/2024-06-01/build-output"\n'
        "}"
    )
    assert got["approvalTool"] == "run_shell"
    assert got["summary"] == "run_shell: tidy the temp folder ⟨U+202E⟩/ fr- mr⟨U+202C⟩⟨U+200B⟩"
    assert got["decision"] == "Rejected by bob⟨U+200B⟩ — “not ⟨U+202E⟩yako⟨U+202C⟩”"
    assert got["markers"] == [
        "⟨U+202E⟩", "⟨U+202C⟩", "⟨U+200B⟩",  # the summary
        "⟨U+202E⟩", "⟨U+200B⟩",  # the arguments, pretty-printed (the escapes decoded)
        "⟨U+200B⟩", "⟨U+202E⟩", "⟨U+202C⟩",  # who decided, the comment
    ]  # fmt: skip
    assert got["rawInApproval"] is False
    assert got["rawOutsideProse"] is False
    assert got["message"] == PROSE  # prose keeps its characters, RTL and all...
    auto = ["bdi", "auto", "isolate"]
    assert got["isolated"] == {
        "sessionTitle": auto, "sessionName": auto, "member": auto, "toolName": auto,
        "args": ["pre", "ltr", "isolate"],  # code reads left to right
        "approvalArgs": ["pre", "ltr", "isolate"],
        "approvalTool": auto, "summary": auto, "decidedBy": auto, "comment": auto,
        "message": ["p", "auto", "isolate"],  # ...isolated (a Markdown paragraph)
    }  # fmt: skip


# Each character dom.js shows as a marker, and what it leaves alone.
MARKED = [
    *range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0),  # C0 but tab and LF, DEL, C1
    0xAD, 0x61C, 0x180E, *range(0x200B, 0x2010), 0x2028, 0x2029,
    *range(0x202A, 0x202F), *range(0x2060, 0x2065), *range(0x2066, 0x2070),
    0xFEFF, 0xFFF9, 0xFFFA, 0xFFFB, 0xE0001, 0xE0041, 0xE007F,
]  # fmt: skip
KEPT = ["\t", "\n", " ", "é", "ש", "م", "😀", "\u034f", "\ufe0f"]

_DOM_JS = """async ([marked, kept]) => {
  const { h, setText, untrusted, prose, plainText, firstVisible, TextStream } = await import("/static/dom.js");
  const el = document.createElement("div");
  const shown = (cp) => h("span", {}, `a${String.fromCodePoint(cp)}b`).textContent;
  const stream = (parts, escape) => {
    const s = new TextStream(document.createElement("pre"), { escape });
    for (const p of parts) s.append(p);
    return [s.el.textContent, s.text, s.el.querySelectorAll(".ctl").length, s.el.childNodes.length];
  };
  setText(el, "x", untrusted("y\\u202ez"), prose("\\u202e"));
  return {
    marked: marked.map(shown),
    kept: kept.map((c) => h("span", {}, c).textContent),
    untrusted: [untrusted("a\\u202eb").outerHTML, el.innerHTML],
    // A tag character split between two deltas is still caught.
    split: stream(["x\\udb40", "\\udc41y", "z"], true),
    prose: stream(["\\u202ea", "b\\u200d"], false),
    plain: plainText("bob\\u200b \\u202e"),
    first: [firstVisible("\\u200b\\u202e\\u00e9x"), firstVisible("\\ud83d\\ude00!"), firstVisible("\\u200b")],
  };
}"""


async def test_dom_shows_each_control_character_as_a_marker(cluster: Cluster, pages: Pages) -> None:
    a, _ = cluster.gateways
    page = await pages.open("dom", a.url + "/healthz")
    got = await page.evaluate(_DOM_JS, [MARKED, KEPT])
    assert got["marked"] == [f"a⟨U+{cp:04X}⟩b" for cp in MARKED]
    assert got["kept"] == KEPT
    marker = (
        '<span class="ctl" dir="ltr" title="RIGHT-TO-LEFT OVERRIDE, an invisible character'
        ' shown in its place">⟨U+202E⟩</span>'
    )
    assert got["untrusted"] == [
        f'<bdi class="untrusted" dir="auto">a{marker}b</bdi>',
        f'x<bdi class="untrusted" dir="auto">y{marker}z</bdi><bdi class="prose" dir="auto">\u202e</bdi>',
    ]  # fmt: skip
    assert got["split"] == ["x⟨U+E0041⟩yz", "x\U000e0041yz", 1, 3]
    assert got["prose"] == ["\u202eab\u200d", "\u202eab\u200d", 0, 1]
    assert got["plain"] == "bob⟨U+200B⟩ ⟨U+202E⟩"
    assert got["first"] == ["é", "😀", ""]


async def test_falls_back_to_sse_when_websockets_are_blocked(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, _ = cluster.gateways
    token = cluster.token("alice")
    sid = await _session(http, a.url, token)
    attempts = 0

    async def refuse(ws: WebSocketRoute) -> None:
        nonlocal attempts
        attempts += 1
        await ws.close(code=1011, reason="blocked by the test")

    ctx = await pages.browser.new_context(viewport={"width": 1280, "height": 800})
    pages.contexts.append(ctx)
    await ctx.route_web_socket(re.compile(r".*/v1/ws$"), refuse)
    alice = await pages.open_in(ctx, "alice", console_url(a.url, token, session=sid))
    await expect(alice.locator("#gateway")).to_have_attribute(
        "data-transport", "sse", timeout=WAIT_MS
    )
    await _live(alice)
    assert attempts >= 3
    text = _words(60)
    run_id = await _start_run(http, a.url, token, sid, "echo: " + text)
    card = run_card(alice, run_id)
    await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
    got = await page_text(alice, run_id)
    assert got == text
    assert got == answer_text(await log_events(http, a.url, token, run_id))


async def test_silent_connection_is_dropped_after_the_heartbeat_timeout_and_resumed(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession, tmp_root: Path
) -> None:
    # heartbeat_s 2: the page pings every 2 s and gives up after 5 s of silence.
    g = RunlogProcess("gateway", cluster.settings, tmp_root, RUNLOG_WS_HEARTBEAT_S="2")
    try:
        await _start([g])
        token = cluster.token("alice")
        sid = await _session(http, g.url, token)
        muted = asyncio.Event()
        connections = 0

        async def proxy(ws: WebSocketRoute) -> None:
            """Pass frames through, except that the first connection goes
            silent (towards the page) once `muted` is set: a half-dead link."""
            nonlocal connections
            first = connections == 0
            connections += 1
            server = ws.connect_to_server()
            ws.on_message(server.send)
            server.on_message(lambda m: None if first and muted.is_set() else ws.send(m))

        ctx = await pages.browser.new_context(viewport={"width": 1280, "height": 800})
        pages.contexts.append(ctx)
        await ctx.route_web_socket(re.compile(r".*/v1/ws$"), proxy)
        alice = await pages.open_in(ctx, "alice", console_url(g.url, token, session=sid))
        await _live(alice)
        text = _words(320)
        run_id = await _start_run(http, g.url, token, sid, "echo: " + text)
        await wait_for_words(alice, run_id, 20)
        muted.set()
        card = run_card(alice, run_id)
        await expect(card).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        assert connections >= 2
        resumed = await alice.locator("#conn").get_attribute("data-last-resume")
        assert resumed is not None and int(resumed) >= 20, resumed
        got = await page_text(alice, run_id)
        assert got == text
        assert got == answer_text(await log_events(http, g.url, token, run_id))
    finally:
        await g.stop()


# The client's rules against fake sockets, in the browser: the paths the
# end-to-end tests above cannot provoke on demand (reauth, stop, batches).
_CLIENT_RULES_JS = """async () => {
  const { RunlogClient, backoffDelay, connectTimeout } = await import("/static/runlog-client.js");
  const tick = (ms = 0) => new Promise((r) => setTimeout(r, ms));
  const until = async (cond, what) => {
    const t0 = Date.now();
    while (!cond()) {
      if (Date.now() - t0 > 10000) throw new Error(`timed out waiting for ${what}`);
      await tick(5);
    }
  };
  const out = {};
  out.backoffMax = [0, 1, 2, 3, 10, 40].map((a) => backoffDelay(a, { baseMs: 250, maxMs: 10000 }, () => 0.999999));
  out.backoffMin = backoffDelay(5, {}, () => 0);
  out.connectTimeouts = [0, 1, 2, 3, 4, 10].map((a) => connectTimeout(a, 10000));

  const sockets = [];
  class FakeWS {
    constructor(url, protocols) { Object.assign(this, { url, protocols, sent: [], readyState: 0 }); sockets.push(this); }
    send(d) { this.sent.push(JSON.parse(d)); }
    close() { this.readyState = 3; }
    recv(msg) { this.readyState = 1; this.onmessage?.({ data: JSON.stringify(msg) }); }
    drop(code) { this.readyState = 3; this.onclose?.({ code, reason: "" }); }
  }
  const got = [], states = [], errors = [];
  const client = new RunlogClient({
    baseUrls: "http://gw-a, http://gw-b/", token: "tok1", WebSocket: FakeWS,
    backoffBaseMs: 1, backoffMaxMs: 5, onAuthNeeded: async () => "tok2",
  });
  client.subscribe({ runId: "r1", onEvent: (c, e, { from }) => got.push([c, e.type, from]),
                     onState: (s) => states.push(s) });
  client.subscribe({ sessionId: "s-refused", onError: (e) => errors.push(e.code) });
  await until(() => sockets.length === 1, "a socket");
  const s1 = sockets[0];
  s1.recv({ type: "hello", heartbeat_s: 15 });
  out.first = { url: s1.url, protocols: s1.protocols, sent: s1.sent };
  s1.recv({ type: "error", ref: s1.sent[1].ref, code: "not_a_member", message: "no", retryable: false });
  s1.recv({ type: "subscribed", topic: "run:r1", cursor: 0, head: 6 });
  for (const [c, from] of [[1], [2], [2], [1], [4, 3], [5]]) {
    s1.recv({ type: "event", topic: "run:r1", cursor: c, from, event: { type: `e${c}` } });
  }
  s1.recv({ type: "events", topic: "run:r1", cursor: 5, events: [{ type: "e5" }, { type: "e6" }] });
  // The server asks for a new token: onAuthNeeded, then resume from 6.
  s1.recv({ type: "disconnect", code: "token_expired", reconnect: "reauth", cursors: {} });
  s1.drop(4402);
  await until(() => sockets.length === 2, "a socket after reauth");
  const s2 = sockets[1];
  s2.recv({ type: "hello", heartbeat_s: 15 });
  out.second = { url: s2.url, protocols: s2.protocols, sent: s2.sent };
  s2.recv({ type: "subscribed", topic: "run:r1", cursor: 6, head: 6 });
  // A drop without a goodbye (kill -9): resume on the next gateway.
  s2.drop(1006);
  await until(() => sockets.length === 3, "a socket after a drop");
  const s3 = sockets[2];
  s3.recv({ type: "hello", heartbeat_s: 15 });
  out.third = { url: s3.url, sent: s3.sent };
  // "stop": no reconnection.
  s3.recv({ type: "disconnect", code: "forbidden", reconnect: "stop", cursors: {} });
  s3.drop(4403);
  await tick(100);
  out.socketsAfterStop = sockets.length;
  out.got = got; out.states = states; out.errors = errors;

  // Three WebSocket attempts without hello: fall back to SSE from the cursor.
  const sources = [];
  class DeadWS extends FakeWS { constructor(...a) { super(...a); setTimeout(() => this.drop(1006), 0); } }
  class FakeES {
    constructor(url) { this.url = url; sources.push(this); }
    addEventListener() {}
    close() {}
  }
  const got2 = [];
  const c2 = new RunlogClient({ baseUrl: "http://gw-a", token: "tok", WebSocket: DeadWS, EventSource: FakeES,
                                backoffBaseMs: 1, backoffMaxMs: 5 });
  c2.subscribe({ sessionId: "s1", after: 7, onEvent: (c) => got2.push(c) });
  await until(() => sources.length === 1, "an EventSource");
  const es = sources[0];
  es.onopen();
  for (const id of ["7", "8", "9"]) es.onmessage({ data: JSON.stringify({ type: "x" }), lastEventId: id });
  out.sse = { url: es.url, transport: c2.transport, attempts: sockets.length - 3, got: got2 };
  c2.close();

  // The server ends one subscription (access removed): final for it, the
  // socket and the other subscription stay.
  const before = sockets.length, ended = [], got3 = [];
  const c3 = new RunlogClient({ baseUrl: "http://gw-a", token: "tok", WebSocket: FakeWS });
  c3.subscribe({ sessionId: "s-gone", onError: (e) => ended.push(e.code) });
  c3.subscribe({ runId: "r-kept", onEvent: (c) => got3.push(c) });
  await until(() => sockets.length === before + 1, "a socket for c3");
  const s4 = sockets[before];
  s4.recv({ type: "hello", heartbeat_s: 15 });
  s4.recv({ type: "subscribed", topic: "session:s-gone", cursor: 0, head: 0 });
  s4.recv({ type: "subscribed", topic: "run:r-kept", cursor: 0, head: 0 });
  s4.recv({ type: "unsubscribed", topic: "session:s-gone", code: "forbidden", message: "m", cursor: 0 });
  s4.recv({ type: "event", topic: "run:r-kept", cursor: 1, event: { type: "x" } });
  await tick(50);
  out.ended = { errors: ended, got: got3, sockets: sockets.length - before };
  c3.close();
  return out;
}"""


class Recorder:
    """A stranger's server on loopback ("evil") that records every request.
    It lets a bearer token through CORS preflights, then makes each request
    fail as a network error would, and closes WebSockets before `hello`: a
    page that tries it moves on to the next gateway and works on."""

    def __init__(self) -> None:
        self.requests: list[str] = []  # request line, then every header
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        lines = [f"{request.method} {request.path_qs}"]
        self.requests.append("\n".join(lines + [f"{k}: {v}" for k, v in request.headers.items()]))
        if request.method == "OPTIONS":
            return web.Response(status=204, headers={
                "Access-Control-Allow-Origin": request.headers.get("Origin", "*"),
                "Access-Control-Allow-Methods": "GET, POST",
                "Access-Control-Allow-Headers": "Authorization, Content-Type, Accept",
            })  # fmt: skip
        if request.headers.get("Upgrade", "").lower() == "websocket":
            ws = web.WebSocketResponse(protocols=["runlog.v1"])
            await ws.prepare(request)
            await ws.close()
            return ws
        return web.Response(text="thanks")  # no CORS header: the page's fetch fails

    def received(self, token: str) -> list[str]:
        """Each request line, marked where the token came with it."""
        return [
            r.splitlines()[0] + (" WITH THE TOKEN" if token in r else "") for r in self.requests
        ]

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self.runner.setup()
        port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


# Every connection the CSP refuses, as the page saw it.
_RECORD_VIOLATIONS_JS = """
window.__violations = [];
document.addEventListener("securitypolicyviolation",
  (e) => window.__violations.push(`${e.effectiveDirective} ${e.blockedURI}`));
"""

_TRY_EVIL_JS = """async (url) => {
  const out = {};
  try { await fetch(url + "/v1/sessions"); out.fetch = "sent"; } catch { out.fetch = "blocked"; }
  out.ws = await new Promise((resolve) => {
    try {
      const ws = new WebSocket(url.replace(/^http/, "ws") + "/v1/ws");
      ws.onopen = () => { ws.close(); resolve("open"); };
      ws.onerror = () => resolve("blocked");
    } catch { resolve("blocked"); }
  });
  return out;
}"""


async def test_unlisted_gateways_in_the_link_are_ignored_and_never_see_the_token(
    cluster: Cluster, pages: Pages, http: aiohttp.ClientSession
) -> None:
    a, b = cluster.gateways
    async with http.get(a.url + "/") as r:
        csp = r.headers["Content-Security-Policy"]
    connect = next(d.split()[1:] for d in csp.split(";") if d.split()[0] == "connect-src")
    ws = [g.url.replace("http://", "ws://") for g in (a, b)]
    assert connect == ["'self'", a.url, ws[0], b.url, ws[1]]
    token = cluster.token("alice")
    sid = await _session(http, a.url, token)
    ctx = await pages.browser.new_context(viewport={"width": 1280, "height": 800})
    pages.contexts.append(ctx)
    await ctx.add_init_script(_RECORD_VIOLATIONS_JS)
    async with Recorder() as evil:
        # An attacker's link: the real console, with the stranger's server first.
        link = console_url(a.url, token, session=sid, gateways=[evil.url, a.url])
        page = await pages.open_in(ctx, "alice", link)
        # Live through `a`: a page that tried `evil` first has done so by now.
        await _live(page)
        await expect(page.locator("#gateway")).to_have_attribute("data-gateway", a.url)
        assert evil.received(token) == [], evil.received(token)
        assert await page.evaluate("window.runlogClient.baseUrls") == [a.url]
        assert await page.evaluate("window.__violations") == []  # it never even tried
        notice = page.locator("#notice")
        await expect(notice).to_be_visible()
        await expect(notice).to_contain_text(f"Ignored {evil.url}")
        # Nor can anything else in the page: connect-src refuses the stranger.
        tried = await page.evaluate(_TRY_EVIL_JS, evil.url)
        assert tried == {"fetch": "blocked", "ws": "blocked"}
        ws_url = evil.url.replace("http://", "ws://") + "/v1/ws"
        assert await page.evaluate("window.__violations") == [
            f"connect-src {evil.url}/v1/sessions", f"connect-src {ws_url}",
        ]  # fmt: skip
        assert evil.received(token) == [], evil.received(token)


async def test_client_rules_with_fake_sockets(cluster: Cluster, pages: Pages) -> None:
    a, _ = cluster.gateways
    page = await pages.open("rules", a.url + "/healthz")
    out = await page.evaluate(_CLIENT_RULES_JS)
    assert out["backoffMax"] == [249, 499, 999, 1999, 9999, 9999]
    assert out["backoffMin"] == 0
    # A first attempt and the first reconnect wait 10 s for hello, later ones longer.
    assert out["connectTimeouts"] == [10000, 10000, 20000, 40000, 80000, 80000]
    assert out["first"]["url"] == "ws://gw-a/v1/ws"
    assert out["first"]["protocols"] == ["runlog.v1", "bearer.tok1"]
    assert out["first"]["sent"][0] == {
        "type": "subscribe", "run_id": "r1", "after": 0, "batch": True, "ref": "sub1",
    }  # fmt: skip
    assert out["errors"] == ["not_a_member"]
    # Each cursor once, in order; a merged frame (from 3) counts as cursor 4.
    assert out["got"] == [[1, "e1", 1], [2, "e2", 2], [4, "e4", 3], [5, "e5", 5], [6, "e6", 6]]
    assert out["second"]["protocols"] == ["runlog.v1", "bearer.tok2"]
    assert out["second"]["sent"] == [
        {"type": "subscribe", "run_id": "r1", "after": 6, "batch": True, "ref": "sub1"}
    ]
    assert out["third"]["url"] == "ws://gw-b/v1/ws"
    assert out["third"]["sent"][0]["after"] == 6
    assert out["states"] == [
        "connecting", "live", "reconnecting", "resumed from #6", "live", "reconnecting", "stopped",
    ]  # fmt: skip
    assert out["socketsAfterStop"] == 3
    assert out["sse"]["url"] == "http://gw-a/v1/sessions/s1/events?after=7&access_token=tok"
    assert out["sse"]["transport"] == "sse" and out["sse"]["attempts"] == 3
    assert out["sse"]["got"] == [8, 9]
    assert out["ended"] == {"errors": ["forbidden"], "got": [1], "sockets": 1}
