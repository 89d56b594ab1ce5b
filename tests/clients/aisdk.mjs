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

async function chatMode({ base, token, chatId, api, steps, sessionReconnect }) {
  const state = { requests: [], statuses: [], headers: [], cutAfter: null };
  const data = [];
  const finishes = [];
  const errors = [];
  const transport = new DefaultChatTransport({
    api: base + api,
    headers: { Authorization: "Bearer " + token },
    fetch: cuttingFetch(state),
    ...(sessionReconnect
      ? { prepareReconnectToStreamRequest: ({ api: a }) => ({ api: a + "/stream" }) }
      : {}),
  });
  const chat = new Chat({
    id: chatId,
    transport,
    sendAutomaticallyWhen: lastAssistantMessageIsCompleteWithApprovalResponses,
    onData: (d) => data.push(d),
    onFinish: (f) => finishes.push({ finishReason: f.finishReason ?? null, isAbort: f.isAbort, isError: f.isError }),
    onError: (e) => errors.push(String(e.message ?? e)),
  });
  const log = [];
  for (const step of steps) {
    log.push(await runStep(chat, step, state));
  }
  return {
    log,
    messages: summary(chat),
    status: chat.status,
    error: chat.error ? String(chat.error.message) : null,
    data: data.map((d) => ({ type: d.type, data: d.data })),
    finishes,
    errors,
    requests: state.requests,
    statuses: state.statuses,
    headers: state.headers,
  };
}

// Each step: {do: "send", text} | {do: "resume"} | {do: "approve", approved, reason?}
// | {do: "wait", for: "approval" | "text" | "ready", min?} | {do: "cut", after: bytes}
// | {do: "stop"} | {do: "settle"} (await the chat's current request).
async function runStep(chat, step, state) {
  const last = () => chat.messages.filter((m) => m.role === "assistant").at(-1);
  switch (step.do) {
    case "send":
      chat.sendMessage({ text: step.text });
      await until(() => chat.status !== "ready", "the request");
      return { did: "send" };
    case "resume":
      await chat.resumeStream();
      return { did: "resume", status: chat.status };
    case "resume-bg":
      chat.resumeStream();
      await until(() => chat.status !== "ready", "the resume request");
      return { did: "resume-bg" };
    case "cut":
      state.cutAfter = step.after;
      return { did: "cut" };
    case "wait": {
      if (step.for === "approval") {
        await until(
          () => chat.status === "ready" && last()?.parts.some((p) => p.state === "approval-requested"),
          "an approval request",
        );
      } else if (step.for === "text") {
        await until(() => textOf(last()).length >= (step.min ?? 1), "text");
      } else if (step.for === "error") {
        await until(() => chat.status === "error", "an error");
      } else {
        await until(() => chat.status === "ready" || chat.status === "error", "ready");
      }
      return { did: "wait", status: chat.status, text: textOf(last()) };
    }
    case "approve": {
      const part = last().parts.find((p) => p.state === "approval-requested");
      await chat.addToolApprovalResponse({ id: part.approval.id, approved: step.approved, reason: step.reason });
      await until(() => chat.status !== "ready", "the automatic send", 10000).catch(() => {});
      await until(() => chat.status === "ready" || chat.status === "error", "the answer");
      return { did: "approve", approvalId: part.approval.id, status: chat.status };
    }
    case "stop":
      await chat.stop();
      return { did: "stop", status: chat.status, text: textOf(last()) };
    case "interrupt": {
      const r = await fetch(step.url, {
        method: "POST",
        headers: { Authorization: "Bearer " + step.token, "content-type": "application/json" },
        body: "{}",
      });
      return { did: "interrupt", status: r.status };
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
