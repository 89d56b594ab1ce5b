// What the console says about its own state: sign-in problems, a run's token
// usage, and a copy button for ids. Each says only what is known to be true.

import { h, setText } from "./dom.js";

const PASTE = "Open a new console link, or paste a token:";

/**
 * The sign-in banner's words for why a token cannot be used. `code` is the
 * gateway's 401 code (docs/protocol.md, "Error codes"), or one of the
 * console's own checks before any request: `malformed` (not a JWT).
 */
export function authProblem(code, message = "") {
  switch (code) {
    case "token_expired":
      return `Your sign-in has expired. ${PASTE}`;
    case "token_revoked":
      return `This token was revoked (runlog revoke): get a new one. ${PASTE}`;
    case "malformed":
      return `That is not a token (it does not read as a JWT). ${PASTE}`;
    case "unauthorized":
      // The gateway says why (bad signature or issuer, no iat, ...): its words, not ours.
      return `The gateway refused this token${message ? ` (${message})` : ""}. ${PASTE}`;
    default:
      return `You are not signed in. ${PASTE}`;
  }
}

/**
 * The usage part of a run's end line. A run stopped or failed mid-stream
 * often has no usage, or zeros, though text streamed: then count what
 * streamed (each text or reasoning delta is about one token) rather than
 * claim "0 tokens".
 */
export function usageText(usage, streamedDeltas) {
  const inTok = usage?.input_tokens || 0;
  const outTok = usage?.output_tokens || 0;
  if (outTok || (inTok && !streamedDeltas)) {
    return `${inTok} tokens in, ${outTok} out`
      + (usage.reasoning_tokens ? ` (${usage.reasoning_tokens} reasoning)` : "");
  }
  if (streamedDeltas) return `${inTok ? `${inTok} tokens in, ` : "usage unknown · "}~${streamedDeltas} tokens streamed`;
  return "usage unknown";
}

/** A small button that copies `text` (an id) to the clipboard and says so. */
export function copyButton(text, what = "id") {
  const btn = h("button", { type: "button", class: "copy", title: `Copy the ${what}`, "aria-label": `Copy the ${what}` }, "Copy");
  btn.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(text);
      setText(btn, "Copied");
    } catch {
      setText(btn, "Copy failed"); // no clipboard (an insecure origin): the id is in the title
    }
    setTimeout(() => setText(btn, "Copy"), 1500);
  });
  return btn;
}
