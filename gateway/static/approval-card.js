// One approval, drawn from its events (approval_required, approval_decided,
// then the tool_result of its tool call).
//
// What the card shows, top to bottom: the tool and a countdown to
// `expires_at`; the summary; the tool's arguments as formatted JSON (from the
// tool card's streamed argument text: pretty-printed when it parses, raw when
// not); for owners and approvers a comment box and Approve / Reject (the
// comment goes with the decision); once decided, the decision, who made it
// and when (the approval_decided event's `ts`) and the comment; then what
// happened next: the tool's result status and summary.
//
// The countdown uses this browser's clock against the worker's `expires_at`:
// when it passes, the card says "expired" and the buttons are disabled at
// once (the worker's own `expired` decision follows within its poll). A
// decision that arrives anyway wins: the log is the truth.
//
// Every value from the log goes in through dom.js (untrusted(), TextStream
// with markers for the arguments).

import { h, setText, untrusted, TextStream, showError, clearError, timeOf } from "./dom.js";

const DECISION_LABELS = { approve: "Approved", reject: "Rejected", expired: "Expired" };
// After the decision, what the tool's result means for the call.
const OUTCOMES = {
  ok: "the tool ran: ok",
  error: "the tool ran and failed",
  denied: "not run: denied",
  skipped: "not run: skipped",
};
// A decide error after which deciding again cannot work.
const FINAL_CODES = ["approval_conflict", "approval_stale", "approval_expired", "run_ended", "forbidden"];

/** `raw` pretty-printed as JSON (2 spaces), or null when it does not parse. */
export function prettyJson(raw) {
  try {
    return JSON.stringify(JSON.parse(raw), null, 2);
  } catch {
    return null;
  }
}

export class ApprovalCard {
  /** `tool`: the ToolCard of e.tool_call_id, if the log had it. */
  constructor(e, run, tool) {
    this.run = run;
    this.id = e.approval_id;
    this.toolCallId = e.tool_call_id;
    this.callDigest = e.call_digest || "";  // what this card shows: sent back with the decision
    this.expiresAt = e.expires_at;
    this.pending = true;
    this.expires = h("span", { class: "expires" });
    this.title = h("strong", {}, "Approval needed");
    this.error = h("p", { class: "error-text" });
    this.error.hidden = true;
    this.decision = h("div", { class: "approval-decision" });
    this.decidedAt = h("time", { class: "decided-at" });
    this.decidedRow = h("div", { class: "approval-decided" }, this.decision, this.decidedAt);
    this.decidedRow.hidden = true;
    this.outcomeEl = h("div", { class: "approval-outcome" });
    this.outcomeEl.hidden = true;
    this.comment = h("textarea", {
      class: "approval-comment", rows: "2", maxlength: "4000",
      placeholder: "Comment (optional): sent with your decision, seen by everyone",
      "aria-label": "Comment on the decision",
    });
    this.approveBtn = h("button", { type: "button", class: "approve", onclick: () => this.decide("approve") }, "Approve");
    this.rejectBtn = h("button", { type: "button", class: "reject", onclick: () => this.decide("reject") }, "Reject");
    this.actions = run.ctx.canAct
      ? h("div", { class: "approval-form" }, this.comment,
        h("div", { class: "approval-actions" }, this.approveBtn, this.rejectBtn))
      : h("div", { class: "approval-actions readonly" }, "Waiting for an owner or approver to decide.");
    this.el = h("div", { class: "approval", "data-approval-id": e.approval_id, "data-state": "pending" },
      h("div", { class: "approval-head" },
        h("span", { class: "approval-icon", "aria-hidden": "true" }, "!"),
        this.title,
        tool?.name ? h("span", { class: "tool-name" }, untrusted(tool.name)) : null,
        h("span", { class: "spacer" }), this.expires),
      h("div", { class: "approval-summary" }, untrusted(e.summary)),
      tool ? this.argsBlock(tool.argsText.text) : null,
      this.actions, this.decidedRow, this.outcomeEl, this.error);
    this.tick();
  }

  /** The arguments as a code block: formatted JSON, or the raw text. */
  argsBlock(raw) {
    if (!raw) return null;
    const pretty = prettyJson(raw);
    const code = h("code", {});
    // With markers: pretty-printing decodes \u escapes into the characters.
    new TextStream(code, { escape: true }).set(pretty ?? raw);
    return h("pre", { class: "approval-args", dir: "ltr", "data-format": pretty === null ? "raw" : "json" }, code);
  }

  tick() {
    if (!this.pending || !this.expiresAt) return;
    const left = Math.ceil((this.expiresAt - Date.now()) / 1000);
    if (left <= 0) {
      this.expire();
      return;
    }
    const mm = Math.floor(left / 60);
    const ss = String(left % 60).padStart(2, "0");
    setText(this.expires, `expires in ${mm}:${ss}`);
    this.expires.dataset.left = String(left);
  }

  /** The countdown passed: nobody can decide any more. */
  expire() {
    setText(this.expires, "expired");
    this.expires.dataset.left = "0";
    this.el.dataset.countdown = "expired";
    this.disable(true);
  }

  disable(off) {
    this.approveBtn.disabled = this.rejectBtn.disabled = this.comment.disabled = off;
  }

  async decide(decision) {
    this.disable(true);
    clearError(this.error);
    try {
      await this.run.ctx.client.decide(this.run.id, this.id, decision, this.comment.value.trim(),
        this.callDigest);
    } catch (e) {
      const final = FINAL_CODES.includes(e.code);
      showError(this.error, e, final ? null : () => this.decide(decision));
      if (this.pending && !final && this.el.dataset.countdown !== "expired") this.disable(false);
    }
  }

  decided(e) {
    this.pending = false;
    this.el.dataset.state = e.decision;
    setText(this.title, "Approval");
    this.actions.hidden = true;
    clearError(this.error);
    if (e.decision === "expired") this.expire();
    else setText(this.expires);
    const who = e.decision === "expired" ? " — nobody decided in time"
      : [" by ", e.decided_by ? untrusted(e.decided_by) : "?"];
    setText(this.decision, h("strong", {}, DECISION_LABELS[e.decision] ?? untrusted(e.decision)), who,
      e.comment ? [" — “", untrusted(e.comment), "”"] : "");
    this.decision.dataset.decision = e.decision;
    this.decision.dataset.decidedBy = e.decided_by || "";
    if (e.ts) {
      this.decidedAt.dateTime = new Date(e.ts).toISOString();
      this.decidedAt.dataset.ts = String(e.ts);
      this.decidedAt.title = new Date(e.ts).toLocaleString();
      setText(this.decidedAt, `at ${timeOf(e.ts)}`);
    }
    this.decidedRow.hidden = false;
  }

  /** The tool_result of this approval's call: what happened next. */
  toolResult(e) {
    this.el.dataset.outcome = e.status;
    this.outcomeEl.dataset.status = e.status;
    setText(this.outcomeEl, h("span", { class: "outcome-label" }, "Then: "),
      h("strong", {}, OUTCOMES[e.status] ?? untrusted(e.status)),
      e.summary ? [" — ", untrusted(e.summary)] : "");
    this.outcomeEl.hidden = false;
  }

  runEnded(status) {
    if (this.pending) {
      this.pending = false;
      setText(this.expires);
      this.actions.hidden = true;
      this.el.dataset.state = "closed";
      setText(this.decision, "The run ended before a decision.");
      this.decidedRow.hidden = false;
    }
    if (this.outcomeEl.hidden && this.el.dataset.state !== "closed") {
      // Decided, but the tool never reported: say so rather than nothing.
      this.el.dataset.outcome = "none";
      setText(this.outcomeEl, h("span", { class: "outcome-label" }, "Then: "),
        h("strong", {}, "no result"), ` — the run ended (${status})`);
      this.outcomeEl.hidden = false;
    }
  }
}
