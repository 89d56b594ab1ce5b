// The AI SDK's own client code (npm `ai`) against runlog's projection, for
// tests/test_compat_aisdk.py. One JSON request on stdin, one JSON answer on
// stdout. Modes:
//   assemble  {chunks, message?}: each chunk checked against the client's
//             chunk schema, then the stream read with readUIMessageStream.
//   chat      {base, token, steps: [...]}: an AbstractChat (what useChat
//             wraps) with DefaultChatTransport and an in-memory ChatState,
//             driven by the steps (see `runStep`).
import {
  AbstractChat,
  DefaultChatTransport,
  asSchema,
  lastAssistantMessageIsCompleteWithApprovalResponses,
  readUIMessageStream,
  uiMessageChunkSchema,
} from "ai";

const warnings = [];
for (const level of ["warn", "error"]) {
  const original = console[level];
  console[level] = (...args) => {
    warnings.push(args.map(String).join(" "));
    original.apply(console, args);
  };
}

async function readStdin() {
  let data = "";
  for await (const chunk of process.stdin) data += chunk;
  return JSON.parse(data);
}

async function assemble({ chunks, message }) {
  const schema = asSchema(uiMessageChunkSchema);
  const invalid = [];
  for (const chunk of chunks) {
    const r = await schema.validate(chunk);
    if (!r.success) invalid.push({ chunk, error: String(r.error.message).slice(0, 500) });
  }
  const errors = [];
  const stream = new ReadableStream({
    start(controller) {
      for (const c of chunks) controller.enqueue(c);
      controller.close();
    },
  });
  let last = message;
  for await (const m of readUIMessageStream({
    message,
    stream,
    terminateOnError: true,
    onError: (e) => errors.push(String(e.message ?? e)),
  })) {
    last = m;
  }
  return { invalid, errors, message: last };
}

// -- the chat

class State {
  constructor(messages = []) {
    this.messages = messages;
    this.status = "ready";
    this.error = undefined;
  }
  pushMessage = (m) => {
    this.messages = this.messages.concat(m);
  };
  popMessage = () => {
    this.messages = this.messages.slice(0, -1);
  };
  replaceMessage = (i, m) => {
    this.messages = [...this.messages.slice(0, i), m, ...this.messages.slice(i + 1)];
  };
  snapshot = (v) => structuredClone(v);
}

class Chat extends AbstractChat {
  constructor(opts) {
    super({ ...opts, state: new State() });
  }
}

function sleep(ms) {
  return new Promise((r) => setTimeout(r, ms));
}

async function until(cond, what, timeoutMs = 20000) {
  const t0 = Date.now();
  while (!cond()) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

function textOf(message) {
  return (message?.parts ?? []).filter((p) => p.type === "text").map((p) => p.text).join("");
}

function summary(chat) {
  const m = chat.messages.filter((x) => x.role === "assistant");
  return m.map((msg) => ({
    id: msg.id,
    metadata: msg.metadata ?? null,
    text: textOf(msg),
    reasoning: msg.parts.filter((p) => p.type === "reasoning").map((p) => p.text).join(""),
    steps: msg.parts.filter((p) => p.type === "step-start").length,
    tools: msg.parts
      .filter((p) => p.type === "dynamic-tool")
      .map((p) => ({
        toolCallId: p.toolCallId,
        toolName: p.toolName,
        state: p.state,
        input: p.input ?? null,
        output: p.output ?? null,
        approval: p.approval ?? null,
      })),
    parts: msg.parts.map((p) => p.type),
  }));
}

// A fetch that cuts the response body after `cutAfter` bytes of it (once),
// like a dropped connection: the chat sees a stream error.
function cuttingFetch(state) {
  return async (url, init) => {
    state.requests.push({ method: init?.method ?? "GET", url: String(url), accept: init?.headers?.Accept ?? null });
    const resp = await fetch(url, init);
    state.statuses.push(resp.status);
    state.headers.push(Object.fromEntries(resp.headers.entries()));
    if (state.cutAfter == null || !resp.body) return resp;
    const limit = state.cutAfter;
    state.cutAfter = null;
    const reader = resp.body.getReader();
    let seen = 0;
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        if (seen + value.length >= limit) {
          controller.enqueue(value.slice(0, limit - seen));
          await reader.cancel();
          controller.error(new TypeError("terminated"));
          return;
        }
        seen += value.length;
        controller.enqueue(value);
      },
      cancel() {
        return reader.cancel();
      },
    });
    return new Response(body, { status: resp.status, headers: resp.headers });
  };
}

async function chatMode({ base, token, chatId, api, steps, sessionReconnect, lastOnly }) {
  const state = { requests: [], statuses: [], headers: [], cutAfter: null };
  const seen = { data: [], finishes: [], errors: [] };
  const transport = new DefaultChatTransport({
    api: base + api,
    headers: { Authorization: "Bearer " + token },
    fetch: cuttingFetch(state),
    // The docs' quickstart for a session-keyed chat (docs/compat.md).
    ...(sessionReconnect
      ? { prepareReconnectToStreamRequest: ({ api: a }) => ({ api: a + "/stream" }) }
      : {}),
    ...(lastOnly
      ? {
          prepareSendMessagesRequest: ({ id, messages, trigger, messageId }) => ({
            body: { id, messages: messages.slice(-1), trigger, messageId },
          }),
        }
      : {}),
  });
  const chat = new Chat({
    id: chatId,
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onData: (d) => seen.data.push({ type: d.type, data: d.data }),
    onFinish: (f) =>
      seen.finishes.push({ finishReason: f.finishReason ?? null, isAbort: f.isAbort, isError: f.isError }),
    onError: (e) => seen.errors.push(String(e.message ?? e)),
  });
  const log = [];
  const ctx = { chat, state, seen, pending: null, token, base };
  for (const step of steps) log.push(await runStep(ctx, step));
  return {
    log,
    messages: summary(chat),
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
    ...seen,
    requests: state.requests,
    statuses: state.statuses,
    headers: state.headers,
  };
}

// Steps: {do: "send", text} (not awaited) | {do: "settle"} (await it) |
// {do: "resume"} | {do: "cut", after: bytes} (the next response is cut) |
// {do: "approve", approved, reason?} | {do: "wait", text: n} | {do: "stop"} |
// {do: "interrupt"} (runlog's stop, for the last assistant message's run).
async function runStep(ctx, step) {
  const { chat, state, seen } = ctx;
  const last = () => chat.messages.filter((m) => m.role === "assistant").at(-1);
  switch (step.do) {
    case "send":
      ctx.pending = chat.sendMessage({ text: step.text });
      return { did: "send" };
    case "settle":
      await ctx.pending;
      return { did: "settle", status: chat.status };
    case "resume":
      await chat.resumeStream();
      return { did: "resume", status: chat.status };
    case "resume-bg":
      ctx.pending = chat.resumeStream();
      return { did: "resume-bg" };
    case "cut":
      state.cutAfter = step.after;
      return { did: "cut" };
    case "wait":
      await until(() => textOf(last()).length >= step.text, `${step.text} characters of text`);
      return { did: "wait", text: textOf(last()) };
    case "approve": {
      const part = last().parts.find((p) => p.state === "approval-requested");
      const before = seen.finishes.length;
      await chat.addToolApprovalResponse({ id: part.approval.id, approved: step.approved, reason: step.reason });
      await until(() => seen.finishes.length > before || seen.errors.length > 0, "the answer");
      await until(() => chat.status === "ready" || chat.status === "error", "ready");
      return { did: "approve", approvalId: part.approval.id, status: chat.status };
    }
    case "stop":
      await chat.stop();
      await ctx.pending;
      return { did: "stop", status: chat.status, text: textOf(last()) };
    case "interrupt": {
      const runId = last().metadata.runlog.run_id;
      const r = await fetch(`${ctx.base}/v1/runs/${runId}/interrupt`, {
        method: "POST",
        headers: { Authorization: "Bearer " + ctx.token, "content-type": "application/json" },
        body: JSON.stringify({ reason: "enough" }),
      });
      return { did: "interrupt", status: r.status };
    }
    case "decide-as": {
      // Another member decides through runlog's REST API (a competing decision).
      const part = last().parts.find((p) => p.state === "approval-requested");
      const runId = last().metadata.runlog.run_id;
      const r = await fetch(`${ctx.base}/v1/runs/${runId}/approvals/${part.approval.id}`, {
        method: "POST",
        headers: { Authorization: "Bearer " + step.token, "content-type": "application/json" },
        body: JSON.stringify({ decision: step.decision }),
      });
      return { did: "decide-as", status: r.status };
    }
    case "run-status": {
      const runId = last().metadata.runlog.run_id;
      const r = await fetch(`${ctx.base}/v1/runs/${runId}`, {
        headers: { Authorization: "Bearer " + ctx.token },
      });
      return { did: "run-status", status: (await r.json()).status };
    }
    default:
      throw new Error(`unknown step ${JSON.stringify(step)}`);
  }
}

const req = await readStdin();
let out;
if (req.mode === "assemble") out = await assemble(req);
else out = await chatMode(req);
process.stdout.write(JSON.stringify({ ...out, warnings }) + "\n");
