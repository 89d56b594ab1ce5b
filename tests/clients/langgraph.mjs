// The real LangGraph SDK (@langchain/langgraph-sdk Client) against runlog's
// /v1/compat/langgraph (driven by tests/test_compat_langgraph.py).
//
// argv[2]: {"url", "token", "modes"?, "steps": [...]}, each step one of
//   {"op": "run", "thread_id", "input"}           runs.stream with input
//   {"op": "resume", "thread_id", "resume"?}      runs.stream with command.resume
//                                                 (default: approve the last interrupt)
//   {"op": "join", "thread_id", "run_id", "last_event_id"?}   runs.joinStream
//   {"op": "cancel", "thread_id", "run_id"}       runs.cancel(action=interrupt)
//   {"op": "get", "thread_id", "run_id"}          runs.get
//   {"op": "thread"}                              threads.create
// stdout: one {"part": {event, id}} line per stream part as it arrives (the
// test cuts the connection on them), then {"result": ...}: the messages as
// MessageTupleManager assembled them (@langchain/core AIMessageChunk.concat),
// the interrupts, ends, `error` events (run_errors), runs seen, and every
// console warning the SDK logged (and, in errors, every step that threw).
import { Client } from "@langchain/langgraph-sdk";
import { MessageTupleManager } from "@langchain/langgraph-sdk/ui";

const cfg = JSON.parse(process.argv[2]);
const warnings = [];
console.warn = (...args) => warnings.push(args.map(String).join(" "));
console.error = (...args) => warnings.push(args.map(String).join(" "));

const client = new Client({
  apiUrl: cfg.url,
  apiKey: null,
  defaultHeaders: { Authorization: `Bearer ${cfg.token}` },
});
// "modes": null sends none (the server's default).
const streamMode = cfg.modes === null ? undefined : cfg.modes ?? ["messages-tuple", "updates", "custom"];
const messages = new MessageTupleManager();
const out = { parts: [], interrupts: [], ends: [], errors: [], run_errors: [], created: [], custom: [],
              updates: [], values: [], metadata: [], results: [] };

async function consume(stream) {
  for await (const part of stream) {
    const id = part.id ?? null;
    out.parts.push({ event: part.event, id });
    console.log(JSON.stringify({ part: { event: part.event, id } }));
    switch (part.event) {
      case "messages": {
        const [chunk, metadata] = part.data;
        messages.add(chunk, metadata);
        break;
      }
      case "updates":
        out.updates.push(part.data);
        if (part.data.__interrupt__) out.interrupts.push(...part.data.__interrupt__);
        break;
      case "custom": out.custom.push(part.data); break;
      case "values": out.values.push(part.data); break;
      case "metadata": out.metadata.push(part.data); break;
      case "end": out.ends.push(part.data); break;
      case "error": out.run_errors.push(part.data); break;
      default: out.errors.push({ unexpected: part.event });
    }
  }
}

const onRunCreated = (m) => out.created.push(m);
for (const step of cfg.steps) {
  try {
    if (step.op === "run") {
      await consume(client.runs.stream(step.thread_id, "runlog", {
        input: { messages: [{ role: "user", content: step.input }] },
        streamMode, streamResumable: true, onRunCreated,
      }));
    } else if (step.op === "resume") {
      const last = out.interrupts[out.interrupts.length - 1];
      const resume = step.resume ?? { [last.id]: { decision: "approve" } };
      await consume(client.runs.stream(step.thread_id, "runlog", {
        command: { resume }, streamMode, onRunCreated,
      }));
    } else if (step.op === "join") {
      await consume(client.runs.joinStream(step.thread_id, step.run_id, {
        streamMode, lastEventId: step.last_event_id,
      }));
    } else if (step.op === "cancel") {
      out.results.push(await client.runs.cancel(step.thread_id, step.run_id, false, "interrupt") ?? null);
    } else if (step.op === "get") {
      out.results.push(await client.runs.get(step.thread_id, step.run_id));
    } else if (step.op === "thread") {
      out.results.push(await client.threads.create());
    }
  } catch (e) {
    out.errors.push({ step: step.op, error: String(e), status: e?.status ?? null });
  }
}

out.messages = Object.keys(messages.chunks).map((id) => {
  const m = messages.get(id).chunk;
  return {
    id,
    type: m.type ?? m._getType?.(),
    content: m.content,
    reasoning: m.additional_kwargs?.reasoning_content ?? "",
    tool_calls: (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.name, args: c.args })),
    tool_args: (m.tool_call_chunks ?? []).map((c) => ({ id: c.id, index: c.index, args: c.args })),
  };
});
out.warnings = warnings;
console.log(JSON.stringify({ result: out }));
