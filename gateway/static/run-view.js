// One run, drawn from its events (the event contract: docs/protocol.md).
//
// Blocks appear in the order their first event arrives: the user's input,
// reasoning (collapsible), text (by message_id; `message_reset` discards a
// message's text), status lines, one card per tool call (arguments fill in
// as `tool_args_delta` streams, then the result), approval cards, errors,
// and the end with its usage and stop audit.
//
// Every value from the log goes in through dom.js: untrusted() for names,
// tool calls, approvals, reasons and codes (isolated, controls as markers),
// TextStream for text that streams (prose kept as written, arguments with
// markers), each in an element with its own `dir`. Answer text is Markdown,
// rendered and sanitized by markdown.js (MarkdownStream), the one exception.

import { h, setText, untrusted, prose, TextStream, shortId, showError, clearError, timeOf } from "./dom.js";
import { ApprovalCard, prettyJson } from "./approval-card.js";
import { usageText, copyButton } from "./states.js";
import { RunStats } from "./run-stats.js";
import { MarkdownStream } from "./markdown.js";

const STATUS_LABELS = {
  running: "running",
  waiting: "waiting for approval",
  stopping: "stopping…",
  completed: "completed",
  aborted: "aborted",
  failed: "failed",
  waiting_approval: "waiting for approval",
};

export class RunView {
  /** ctx: { client, canAct, me } */
  constructor(runId, ctx) {
    this.id = runId;
    this.ctx = ctx;
    this.ended = false;
    this.startTs = 0;
    this.streamed = 0; // text and reasoning deltas seen (≈ tokens), for a run_end without usage
    this.texts = new Map(); // message_id -> { el, node }
    this.reasonings = new Map(); // message_id -> { el, node, touched }
    this.tools = new Map(); // tool_call_id -> ToolCard
    this.approvals = new Map(); // approval_id -> ApprovalCard
    this.openReasoning = null;

    this.badge = h("span", { class: "badge run-status" });
    this.stopBtn = h("button", { type: "button", class: "stop", onclick: () => this.stop() }, "Stop");
    this.stopBtn.hidden = !ctx.canAct;
    this.meta = h("span", { class: "run-meta" });
    this.input = h("div", { class: "run-input" });
    this.input.hidden = true;
    this.body = h("div", { class: "run-body" });
    this.error = h("p", { class: "error-text" });
    this.error.hidden = true;
    this.footer = h("footer", { class: "run-end" });
    this.footer.hidden = true;
    this.stats = new RunStats(); // first token, duration, tokens, approvals waited
    this.el = h("article", { class: "run", "data-run-id": runId },
      h("header", { class: "run-head" },
        h("span", { class: "run-title" }, "Run ", h("span", { class: "mono run-id", title: runId }, shortId(runId)),
          copyButton(runId, "run id")),
        this.meta, h("span", { class: "spacer" }), this.badge, this.stopBtn),
      this.stats.el, this.input, this.body, this.error, this.footer);
    this.setStatus("running");
  }

  setStatus(status) {
    this.status = status;
    this.el.dataset.status = status;
    this.badge.dataset.status = status;
    setText(this.badge, STATUS_LABELS[status] ?? status);
  }

  apply(e, cursor) {
    this.el.dataset.cursor = String(cursor);
    this.el.dataset.seq = String(e.seq);
    this.stats.apply(e);
    switch (e.type) {
      case "run_start": {
        this.startTs = e.ts;
        setText(this.meta, "started by ", e.started_by ? untrusted(e.started_by) : "?", ` · ${timeOf(e.ts)}`,
          e.model ? [" · ", untrusted(e.model)] : "");
        if (e.input) {
          setText(this.input, h("span", { class: "input-label" }, e.started_by ? untrusted(e.started_by) : "input"),
            prose(e.input));
          this.input.hidden = false;
        }
        break;
      }
      case "reasoning_delta":
        this.streamed++;
        this.reasoning(e.message_id).stream.append(e.delta);
        break;
      case "text_delta":
        this.streamed++;
        this.text(e.message_id).stream.append(e.delta);
        break;
      case "message_reset": {
        const t = this.texts.get(e.message_id);
        if (t) {
          t.stream.cancel();
          t.el.remove();
          this.texts.delete(e.message_id);
        }
        break;
      }
      case "status":
        this.add(h("div", { class: "status-line", "data-code": e.code },
          h("span", { class: "status-code" }, untrusted(e.code)), e.summary ? [" ", untrusted(e.summary)] : ""));
        break;
      case "progress": {
        const card = [...this.tools.values()].reverse().find((c) => !c.done);
        if (card) card.progress(e);
        break;
      }
      case "tool_call_start": {
        const card = new ToolCard(e);
        this.tools.set(e.tool_call_id, card);
        this.add(card.el);
        break;
      }
      case "tool_args_delta":
        this.tools.get(e.tool_call_id)?.args(e.partial_json);
        break;
      case "tool_call_end":
        this.tools.get(e.tool_call_id)?.called();
        break;
      case "tool_result":
        this.tools.get(e.tool_call_id)?.result(e);
        for (const a of this.approvals.values()) if (a.toolCallId === e.tool_call_id) a.toolResult(e);
        break;
      case "approval_required": {
        const tool = this.tools.get(e.tool_call_id);
        tool?.awaitingApproval();
        const card = new ApprovalCard(e, this, tool);
        this.approvals.set(e.approval_id, card);
        this.add(card.el);
        if (!this.ended) this.setStatus("waiting");
        break;
      }
      case "approval_decided":
        this.approvals.get(e.approval_id)?.decided(e);
        if (!this.ended && this.status === "waiting") this.setStatus("running");
        break;
      case "interrupt_requested":
        this.add(h("div", { class: "status-line stop-line" },
          h("span", { class: "status-code" }, "stop"),
          " requested by ", e.requested_by ? untrusted(e.requested_by) : "?",
          e.reason ? [" — ", untrusted(e.reason)] : ""));
        if (!this.ended) {
          this.setStatus("stopping");
          this.stopBtn.disabled = true;
          setText(this.stopBtn, "Stopping…");
        }
        break;
      case "run_error":
        this.add(h("div", { class: "run-error", "data-code": e.code },
          h("strong", {}, untrusted(e.code)), e.message ? [" — ", untrusted(e.message)] : "",
          e.retryable ? " (retryable)" : ""));
        break;
      case "run_end":
        this.end(e);
        break;
      default:
        break; // a type added later: ignore what we don't know
    }
  }

  /** Append a block; an open reasoning block folds away once something else follows it. */
  add(el) {
    this.foldReasoning();
    this.body.append(el);
  }

  foldReasoning() {
    const r = this.openReasoning;
    if (r && !r.touched) r.el.open = false;
    this.openReasoning = null;
  }

  reasoning(messageId) {
    let r = this.reasonings.get(messageId);
    if (!r) {
      const textEl = h("div", { class: "reasoning-text", dir: "auto" });
      const summary = h("summary", {}, "Reasoning");
      const el = h("details", { class: "reasoning", "data-message-id": messageId, open: true },
        summary, textEl);
      r = { el, stream: new TextStream(textEl), touched: false };
      summary.addEventListener("click", () => (r.touched = true));
      this.reasonings.set(messageId, r);
      this.add(el);
      this.openReasoning = r;
    }
    return r;
  }

  text(messageId) {
    let t = this.texts.get(messageId);
    if (!t) {
      const el = h("div", { class: "message", dir: "auto", "data-message-id": messageId });
      t = { el, stream: new MarkdownStream(el) };
      this.texts.set(messageId, t);
      this.add(el);
    }
    return t;
  }

  /** All the answer text shown, in order (tests compare it with the log). */
  get answerText() {
    return [...this.texts.values()].map((t) => t.stream.text).join("");
  }

  async stop() {
    this.stopBtn.disabled = true;
    setText(this.stopBtn, "Stopping…");
    clearError(this.error);
    try {
      await this.ctx.client.interrupt(this.id, "stopped from the console");
    } catch (e) {
      showError(this.error, e, () => this.stop());
      if (!this.ended) {
        this.stopBtn.disabled = false;
        setText(this.stopBtn, "Stop");
      }
    }
  }

  end(e) {
    this.ended = true;
    for (const t of this.texts.values()) t.stream.flush();
    this.foldReasoning();
    this.setStatus(e.status);
    this.stopBtn.hidden = true;
    for (const a of this.approvals.values()) a.runEnded(e.status);
    const parts = [h("strong", {}, STATUS_LABELS[e.status] ?? e.status)];
    if (this.startTs && e.ts) parts.push(` · ${((e.ts - this.startTs) / 1000).toFixed(1)} s`);
    parts.push(" · ", h("span", { class: "usage" }, usageText(e.usage, this.streamed)));
    const children = [h("div", { class: "end-line" }, parts)];
    if (e.stop) children.push(this.stopAudit(e.stop));
    setText(this.footer, ...children);
    this.footer.dataset.status = e.status;
    this.footer.hidden = false;
  }

  stopAudit(s) {
    const effects = (s.side_effects || []).map((id, i) => {
      const name = this.tools.get(id)?.name;
      return [i ? ", " : "", name ? [untrusted(name), " (", untrusted(id), ")"] : untrusted(id)];
    });
    const row = (k, ...v) => [h("dt", {}, k), h("dd", {}, ...v)];
    return h("div", { class: "stop-audit" },
      h("div", { class: "audit-title" }, "Stop audit"),
      h("dl", {},
        row("Stopped by", s.requested_by ? untrusted(s.requested_by) : "?"),
        row("Requested at", timeOf(s.requested_at)),
        s.reason ? row("Reason", untrusted(s.reason)) : null,
        row("Stopped at", `event #${s.at_seq}, step ${s.step}`),
        row("Side effects done", effects.length ? effects : "none")));
  }

  tick() {
    for (const a of this.approvals.values()) a.tick();
    this.stats.tick();
  }
}

class ToolCard {
  constructor(e) {
    this.name = e.tool_name;
    this.done = false;
    const argsEl = h("pre", { class: "tool-args", dir: "ltr" }); // code reads left to right
    this.argsText = new TextStream(argsEl, { escape: true });
    this.state = h("span", { class: "tool-state" }, "preparing…");
    this.bar = h("progress", { class: "tool-progress", max: "1", value: "0" });
    this.bar.hidden = true;
    this.resultEl = h("div", { class: "tool-result" });
    this.resultEl.hidden = true;
    this.el = h("div", { class: "tool", "data-tool-call-id": e.tool_call_id, "data-state": "args" },
      h("div", { class: "tool-head" },
        h("span", { class: "tool-icon", "aria-hidden": "true" }, "⚙"),
        h("span", { class: "tool-name" }, untrusted(e.tool_name)),
        h("span", { class: `badge risk risk-${e.risk_level}` }, untrusted(e.risk_level), " risk"),
        h("span", { class: "spacer" }), this.state),
      argsEl, this.bar, this.resultEl);
  }

  args(part) {
    this.argsText.append(part);
  }

  called() {
    this.el.dataset.state = "called";
    setText(this.state, "running…");
    const raw = this.argsText.text;
    if (raw.length <= 100) return; // short arguments read best on one line
    // Decodes \u escapes: shown through the stream, with markers, like the rest.
    const pretty = prettyJson(raw);
    if (pretty !== null) this.argsText.set(pretty);
  }

  awaitingApproval() {
    if (!this.done) setText(this.state, "awaiting approval");
  }

  progress(e) {
    this.bar.hidden = false;
    this.bar.max = Math.max(1, e.total);
    this.bar.value = e.done;
    setText(this.state, e.label ? untrusted(e.label) : "working", ` ${e.done}/${e.total}`);
  }

  result(e) {
    this.done = true;
    this.bar.hidden = true;
    this.el.dataset.state = e.status;
    setText(this.state, untrusted(e.status));
    this.state.dataset.status = e.status;
    const parts = [];
    if (e.summary) parts.push(untrusted(e.summary));
    if (e.output != null) {
      const out = h("pre", { dir: "ltr" });
      new TextStream(out, { escape: true }).set(e.output);
      parts.push(h("details", { class: "tool-output" }, h("summary", {}, "output"), out));
    }
    setText(this.resultEl, ...parts);
    this.resultEl.hidden = !parts.length;
  }
}
