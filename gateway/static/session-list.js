// The session list (the left column): your sessions, newest first, a page of
// 100 at a time ("More sessions"), searched by title (case-insensitive
// substring, on the server), archived ones apart ("Archived" shows only
// them). Titles are untrusted: they go in through dom.js.

import { h, untrusted, shortId, showError, clearError } from "./dom.js";

const $ = (id) => document.getElementById(id);
const SEARCH_DELAY_MS = 250;

export class SessionList {
  /** `onSelect(id)`: a session was clicked; `activeId()`: the open one. */
  constructor(client, { onSelect, activeId }) {
    this.client = client;
    this.onSelect = onSelect;
    this.activeId = activeId;
    this.items = [];
    this.next = null; // the next page's `before`, null on the last page
    this.loads = 0; // a later load wins over an earlier one still in flight
    this.timer = null;
    $("session-search").addEventListener("input", () => {
      clearTimeout(this.timer);
      this.timer = setTimeout(() => this.load(), SEARCH_DELAY_MS);
    });
    $("show-archived").addEventListener("change", () => this.load());
    $("sessions-more").addEventListener("click", () => this.more());
  }

  get query() {
    return $("session-search").value.trim();
  }

  get archived() {
    return $("show-archived").checked;
  }

  /** The first page again, or as many pages as are shown (a refresh keeps "More").
   * Whether it loaded; a failure goes to `onError`, else to the list's error line. */
  async load({ keep = false, onError = null } = {}) {
    const n = ++this.loads;
    const want = keep ? Math.max(1, this.items.length) : 1;
    clearError($("sessions-error"));
    const items = [];
    let next = null;
    try {
      do {
        const page = await this.client.sessionsPage({ q: this.query, archived: this.archived, before: next });
        items.push(...page.sessions);
        next = page.next_before;
      } while (next && items.length < want);
    } catch (e) {
      if (n === this.loads) {
        if (onError) onError(e);
        else showError($("sessions-error"), e, () => this.load({ keep }));
      }
      return false;
    }
    if (n !== this.loads) return false;
    this.items = items;
    this.next = next;
    this.render();
    return true;
  }

  async more() {
    if (!this.next) return;
    const n = ++this.loads;
    const btn = $("sessions-more");
    btn.disabled = true;
    try {
      const page = await this.client.sessionsPage({ q: this.query, archived: this.archived, before: this.next });
      if (n !== this.loads) return;
      const seen = new Set(this.items.map((s) => s.session_id));
      this.items.push(...page.sessions.filter((s) => !seen.has(s.session_id)));
      this.next = page.next_before;
      this.render();
    } catch (e) {
      showError($("sessions-error"), e);
    } finally {
      btn.disabled = false;
    }
  }

  find(id) {
    return this.items.find((s) => s.session_id === id);
  }

  render() {
    const ul = $("sessions");
    ul.replaceChildren();
    $("sessions-more").hidden = !this.next;
    if (!this.items.length) {
      const q = this.query;
      ul.append(h("li", { class: "muted small" },
        q ? ["No ", this.archived ? "archived " : "", "session title contains “", untrusted(q), "”."]
          : this.archived ? "No archived sessions." : "No sessions yet."));
      return;
    }
    const active = this.activeId();
    for (const s of this.items) {
      ul.append(h("li", {},
        h("button", {
          type: "button",
          class: `session-item${active === s.session_id ? " active" : ""}`,
          "data-session-id": s.session_id,
          "data-archived": s.archived_at ? "true" : null,
          onclick: () => this.onSelect(s.session_id),
        },
        h("span", { class: "session-name" }, s.title ? untrusted(s.title) : "Untitled session"),
        h("span", { class: "session-meta" },
          `${s.your_role}${s.archived_at ? " · archived" : ""} · ${shortId(s.session_id)}`)),
      ));
    }
  }
}
