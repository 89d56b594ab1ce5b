// Runs waiting their turn (run policy `enqueue`): a card for each, in the
// run list after the runs that started, in the order they will start, with
// its place in line ("queued · 2nd in line") and, for its starter and the
// session's owners, Cancel (an interrupt: the gateway ends a queued run at
// once, docs/protocol.md "Queued runs").
//
// A queued run has no event yet. The console learns of it from the POST
// answer (`ahead` > 0), the session's `run_queued` notice (another member's
// run), or GET /v1/sessions/{id} (`queued`: on open and after a resume).
// When its first event arrives the run view takes the card's place.

import { h, setText, untrusted, prose, shortId, showError, clearError, timeOf } from "./dom.js";

const INPUT_PREVIEW_CHARS = 280;

function ordinal(n) {
  const tens = n % 100;
  const suffix = tens >= 11 && tens <= 13 ? "th" : ({ 1: "st", 2: "nd", 3: "rd" }[n % 10] ?? "th");
  return `${n}${suffix}`;
}

// Why a queued run has not started (`queued[].waiting_for`); behind an
// earlier run of the session, its place in line says it.
function waitingFor(info, me) {
  if (info.waiting_for === "worker") return " · waiting for a free worker";
  if (info.waiting_for === "user_limit") {
    return info.started_by === me ? " · your runs are at your limit"
      : ` · ${info.started_by}'s runs are at their limit`;
  }
  return "";
}

class QueuedCard {
  constructor(info, queue) {
    this.id = info.run_id;
    this.queue = queue;
    this.badge = h("span", { class: "badge run-status", "data-status": "queued" });
    const ctx = queue.ctx;
    const mayCancel = info.started_by === ctx.me || ctx.role === "owner";
    this.cancelBtn = h("button", { type: "button", class: "stop cancel-queued", onclick: () => this.cancel() },
      "Cancel");
    this.cancelBtn.hidden = !mayCancel;
    this.error = h("p", { class: "error-text" });
    this.error.hidden = true;
    const input = String(info.input ?? "");
    const preview = input.length > INPUT_PREVIEW_CHARS ? `${input.slice(0, INPUT_PREVIEW_CHARS)}…` : input;
    this.el = h("article", { class: "run run-queued", "data-run-id": info.run_id, "data-status": "queued" },
      h("header", { class: "run-head" },
        h("span", { class: "run-title" }, "Run ", h("span", { class: "mono" }, shortId(info.run_id))),
        h("span", { class: "run-meta" }, "queued by ", untrusted(info.started_by || "?"),
          info.created_at ? ` · ${timeOf(info.created_at)}` : ""),
        h("span", { class: "spacer" }), this.badge, this.cancelBtn),
      preview ? h("div", { class: "run-input" },
        h("span", { class: "input-label" }, untrusted(info.started_by || "input")), prose(preview)) : null,
      this.error);
    this.why = waitingFor(info, ctx.me);
    if (info.stop_requested_by) this.cancelling();
  }

  position(n) {
    this.el.dataset.position = String(n);
    if (!this.stopping) setText(this.badge, `queued · ${ordinal(n)} in line${this.why}`);
  }

  cancelling() {
    this.stopping = true;
    this.el.dataset.status = "cancelling";
    this.badge.dataset.status = "stopping";
    setText(this.badge, "cancelling…");
    this.cancelBtn.disabled = true;
    setText(this.cancelBtn, "Cancelling…");
  }

  async cancel() {
    this.cancelling();
    clearError(this.error);
    try {
      await this.queue.ctx.client.interrupt(this.id, "cancelled while queued");
    } catch (e) {
      showError(this.error, e);
      if (e.code !== "run_ended") {
        this.stopping = false;
        this.el.dataset.status = "queued";
        this.badge.dataset.status = "queued";
        this.cancelBtn.disabled = false;
        setText(this.cancelBtn, "Cancel");
        this.queue.render();
      }
    }
  }
}

export class RunQueue {
  /** ctx: { client, me, role }; runsEl: the run list; started(runId): has this run an event yet? */
  constructor(runsEl, ctx, started) {
    this.runsEl = runsEl;
    this.ctx = ctx;
    this.started = started;
    this.cards = new Map(); // run_id -> QueuedCard, in line order
  }

  /** A run known to be queued ({run_id, started_by, input, created_at, stop_requested_by?}). */
  add(info) {
    if (!info?.run_id || this.cards.has(info.run_id) || this.started(info.run_id)) return;
    const card = new QueuedCard(info, this);
    this.cards.set(info.run_id, card);
    this.runsEl.append(card.el);
    this.render();
  }

  /** GET /v1/sessions/{id}'s `queued`: add what we lack; the server's order first. */
  load(list = []) {
    for (const q of list) this.add(q);
    const listed = list.map((q) => q.run_id).filter((id) => this.cards.has(id));
    const ids = [...listed, ...[...this.cards.keys()].filter((id) => !listed.includes(id))];
    this.cards = new Map(ids.map((id) => [id, this.cards.get(id)]));
    for (const c of this.cards.values()) this.runsEl.append(c.el); // queued ones stay last
    this.render();
  }

  /** Put a run's view in the list: where its queued card was, else before the queued ones. */
  place(runId, el) {
    const card = this.cards.get(runId);
    if (card) {
      card.el.replaceWith(el);
      this.cards.delete(runId);
      this.render();
      return;
    }
    const first = this.cards.values().next().value;
    if (first) this.runsEl.insertBefore(el, first.el);
    else this.runsEl.append(el);
  }

  render() {
    let n = 0;
    for (const card of this.cards.values()) card.position(++n);
  }
}
