// One AG-UI front end, driven by tests/test_compat_agui.py: the real
// `@ag-ui/client` HttpAgent against a runlog gateway.
//
// stdin: a plan, JSON:
//   {base, url, token, threadId, runlogRunId?, messages?: [Message], steps: [Step]}
//   Step: {url?, attach?: true (POST base/v1/compat/agui/runs/<the runlog run
//          id: plan.runlogRunId, or the last RUN_STARTED's>),
//          message?: "text" (added as a user message first),
//          after?: "cursor" | N (forwardedProps.runlog.after),
//          lastEventId?: "cursor" | N (the Last-Event-ID header),
//          resume?: {status, payload?} (answers every pending interrupt),
//          cut?: {type, count, settle?} (the body fails right after the frame
//                holding the count-th event of that type: a cut connection),
//          runId?: "..."}
// stdout: JSON {steps: [...], messages, pending, warnings, errors, unhandled}.
//
// The cursor of a step is what the client APPLIED (Quirks in agui.md): the
// largest metadata.runlog.seq folded into agent.messages (messages and tool
// calls), and that of the stateless events (RUN_*, CUSTOM) the reducer saw.

import { HttpAgent } from "@ag-ui/client";

const warnings = [];
const errors = [];
const unhandled = [];
console.warn = (...args) => warnings.push(args.map(String).join(" "));
console.error = (...args) => errors.push(args.map(String).join(" "));
// A cut body leaves an unhandled rejection inside the client (agui.md, Quirks):
// recorded, not counted against the server.
process.on("unhandledRejection", (e) => unhandled.push(String(e)));

const plan = JSON.parse(await new Promise((resolve) => {
  let s = "";
  process.stdin.on("data", (d) => (s += d));
  process.stdin.on("end", () => resolve(s));
}));

function cuttingFetch(cut) {
  // One frame per chunk, so the client takes them one at a time; after the
  // frame holding the cut.count-th event of cut.type the connection is
  // cancelled and the body fails: with cut.settle once the client applied
  // that frame's event, else at once (dropping whatever the client had not
  // applied yet, as a real cut does).
  return async (url, init) => {
    const res = await fetch(url, init);
    if (!cut || !res.ok || !res.body) return res;
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    const enc = new TextEncoder();
    let buf = "";
    let seen = 0;
    let failing = false;
    let cutSeq = 0;
    const frames = [];
    const body = new ReadableStream({
      async pull(controller) {
        if (failing) {
          const deadline = Date.now() + 10000;
          while (cut.settle && appliedCursor() < cutSeq && Date.now() < deadline) {
            await new Promise((resolve) => setTimeout(resolve, 5));
          }
          controller.error(new TypeError("terminated"));
          return;
        }
        while (frames.length === 0) {
          const { done, value } = await reader.read();
          if (done) {
            controller.close();
            return;
          }
          buf += dec.decode(value, { stream: true });
          let i;
          while ((i = buf.indexOf("\n\n")) >= 0) {
            frames.push(buf.slice(0, i + 2));
            buf = buf.slice(i + 2);
          }
        }
        const frame = frames.shift();
        controller.enqueue(enc.encode(frame));
        const data = frame.split("\n").find((l) => l.startsWith("data: "));
        const event = data ? JSON.parse(data.slice(6)) : null;
        if (event?.type === cut.type && ++seen === cut.count) {
          cutSeq = seqOf(event);
          failing = true; // delivered; then the connection dies
          reader.cancel().catch(() => {});
        }
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
    return new Response(body, { status: res.status, headers: res.headers });
  };
}

const agent = new HttpAgent({
  url: plan.url,
  threadId: plan.threadId,
  headers: { Authorization: "Bearer " + plan.token },
  initialMessages: plan.messages ?? [],
});

let statelessSeq = 0;
function seqOf(x) {
  const s = x?.metadata?.runlog?.seq;
  return typeof s === "number" ? s : 0;
}
function appliedCursor() {
  let best = statelessSeq;
  for (const m of agent.messages) {
    best = Math.max(best, seqOf(m));
    for (const tc of m.toolCalls ?? []) best = Math.max(best, seqOf(tc));
  }
  return best;
}
function resolveCursor(v) {
  return v === "cursor" ? appliedCursor() : v;
}

let runlogRunId = plan.runlogRunId ?? null;
const results = [];
for (const [n, step] of plan.steps.entries()) {
  agent.url = step.attach ? `${plan.base}/v1/compat/agui/runs/${runlogRunId}` : (step.url ?? plan.url);
  agent.fetch = cuttingFetch(step.cut);
  agent.headers = { Authorization: "Bearer " + plan.token };
  if (step.lastEventId !== undefined) agent.headers["Last-Event-ID"] = String(resolveCursor(step.lastEventId));
  if (step.message !== undefined) {
    agent.addMessage({ id: `user-${n}`, role: "user", content: step.message });
  }
  const r = { types: [], outcome: null, interrupts: [], runError: null, failed: null, runlogRunId: null };
  const params = { runId: step.runId ?? `agui-run-${n}` };
  if (step.after !== undefined) params.forwardedProps = { runlog: { after: resolveCursor(step.after) } };
  if (step.resume !== undefined) {
    params.resume = agent.pendingInterrupts.map((i) => ({ interruptId: i.id, ...step.resume }));
  }
  const seen = (event) => (statelessSeq = Math.max(statelessSeq, seqOf(event)));
  try {
    await agent.runAgent(params, {
      onEvent: ({ event }) => {
        r.types.push(event.type);
      },
      onRunStartedEvent: ({ event }) => {
        seen(event);
        r.runlogRunId = event.metadata?.runlog?.run_id ?? null;
        runlogRunId = r.runlogRunId ?? runlogRunId;
      },
      onRunFinishedEvent: ({ event }) => {
        seen(event);
        r.outcome = event.outcome?.type ?? "success";
        if (event.outcome?.type === "interrupt") r.interrupts = event.outcome.interrupts;
      },
      onRunErrorEvent: ({ event }) => {
        seen(event);
        r.runError = { code: event.code ?? null, message: event.message };
      },
      onCustomEvent: ({ event }) => seen(event),
      onRunFailed: ({ error }) => {
        r.failed = String(error?.message ?? error);
        return { stopPropagation: true };
      },
    });
  } catch (e) {
    r.failed = String(e?.message ?? e);
  }
  r.cursor = appliedCursor();
  r.pending = agent.pendingInterrupts.map((i) => i.id);
  results.push(r);
}

// Let a cut body's leftover rejection surface before reporting.
await new Promise((resolve) => setTimeout(resolve, 50));
process.stdout.write(
  JSON.stringify({
    steps: results,
    messages: agent.messages,
    pending: agent.pendingInterrupts.map((i) => i.id),
    warnings,
    errors,
    unhandled,
  }),
);
process.exit(0);
