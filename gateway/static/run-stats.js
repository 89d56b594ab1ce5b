// The numbers people ask about a run, from its events only:
//   first token  — the first text or reasoning delta's ts − run_start's ts
//   duration     — run_end's ts − run_start's ts (counting up while it runs)
//   tokens       — run_end's usage; before it (or when it reports none after
//                  text streamed: a stopped run), the deltas counted, with "~"
//   approvals    — the time spent waiting for approvals: each
//                  approval_required → approval_decided (or run_end), summed;
//                  still counting while one is pending
// Each number is also in a data- attribute (ms or a count), for tests.

import { h, setText } from "./dom.js";

function seconds(ms) {
  const s = ms / 1000;
  if (s < 10) return `${s.toFixed(1)} s`;
  if (s < 120) return `${Math.round(s)} s`;
  return `${Math.floor(s / 60)} min ${String(Math.round(s % 60)).padStart(2, "0")} s`;
}

export class RunStats {
  constructor() {
    this.startTs = 0;
    this.firstTokenTs = 0;
    this.endTs = 0;
    this.deltas = 0;
    this.usage = null;
    this.waitedMs = 0; // decided approvals
    this.pending = new Map(); // approval_id -> approval_required ts
    this.ttft = h("span", { class: "stat", "data-stat": "ttft" });
    this.duration = h("span", { class: "stat", "data-stat": "duration" });
    this.tokens = h("span", { class: "stat", "data-stat": "tokens" });
    this.approvals = h("span", { class: "stat", "data-stat": "approvals" });
    this.el = h("div", { class: "run-stats", "aria-label": "run numbers" },
      this.ttft, this.duration, this.tokens, this.approvals);
    this.render();
  }

  apply(e) {
    switch (e.type) {
      case "run_start":
        this.startTs = e.ts;
        break;
      case "text_delta":
      case "reasoning_delta":
        if (!this.firstTokenTs) this.firstTokenTs = e.ts;
        this.deltas++;
        break;
      case "approval_required":
        this.pending.set(e.approval_id, e.ts);
        break;
      case "approval_decided": {
        const since = this.pending.get(e.approval_id);
        if (since !== undefined) {
          this.waitedMs += Math.max(0, e.ts - since);
          this.pending.delete(e.approval_id);
        }
        break;
      }
      case "run_end":
        this.endTs = e.ts;
        this.usage = e.usage ?? null;
        for (const since of this.pending.values()) this.waitedMs += Math.max(0, e.ts - since);
        this.pending.clear();
        break;
      default:
        return;
    }
    this.render();
  }

  tick() {
    if (this.startTs && !this.endTs) this.render();
  }

  render() {
    const now = Date.now();
    const stat = (el, label, value, data) => {
      el.hidden = value === null;
      el.dataset.value = data ?? "";
      if (value !== null) setText(el, h("span", { class: "stat-label" }, label), " ", h("strong", {}, value));
    };
    stat(this.ttft, "first token", this.firstTokenTs && this.startTs ? seconds(this.firstTokenTs - this.startTs) : null,
      this.firstTokenTs && this.startTs ? String(this.firstTokenTs - this.startTs) : "");
    const endOrNow = this.endTs || now;
    const dur = this.startTs ? Math.max(0, endOrNow - this.startTs) : null;
    stat(this.duration, this.endTs ? "took" : "running for", dur === null ? null : seconds(dur), dur === null ? "" : String(dur));
    this.duration.dataset.final = this.endTs ? "true" : "false";
    const u = this.usage;
    if (u && (u.output_tokens || u.input_tokens) && !(this.deltas && !u.output_tokens)) {
      stat(this.tokens, "tokens", `${u.input_tokens} in · ${u.output_tokens} out`, String(u.output_tokens));
      this.tokens.dataset.estimate = "false";
    } else {
      stat(this.tokens, "tokens", this.deltas ? `~${this.deltas} out` : null, String(this.deltas));
      this.tokens.dataset.estimate = "true";
    }
    let waited = this.waitedMs;
    for (const since of this.pending.values()) waited += Math.max(0, now - since);
    const any = this.waitedMs > 0 || this.pending.size > 0;
    stat(this.approvals, this.pending.size ? "waiting for approval" : "waited for approval",
      any ? seconds(waited) : null, any ? String(waited) : "");
  }
}
