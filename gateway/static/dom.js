// The console's one way of putting text in the page. Text is always added as
// text nodes: nothing here parses a string as HTML.
//
// Untrusted text (docs/console.md, "Untrusted text"): user ids, titles, tool
// names and arguments, approval summaries, comments, reasons and messages
// were written by other users, a model or a tool. Two things keep them from
// lying about what they say:
//
// * Isolation. Each value goes in its own `<bdi dir="auto">` (`untrusted()`),
//   or is the only text of an element with a `dir` (`TextStream`, `prose()`),
//   so a right-to-left run or an override inside it cannot reorder the words
//   around it ("approve" + a tool name + "?").
// * Visible controls. In everything but prose, each bidi override, embedding
//   or isolate, zero-width or other invisible formatting character, and
//   every C0/C1 control but tab and newline, is shown as a styled marker
//   `⟨U+202E⟩` (a `span.ctl`), never as itself: "send_\u202Eliame" reads
//   "send_⟨U+202E⟩liame", not "send_email"; "bob\u200B" is not "bob".
//   Prose (model text, reasoning, a run's input) keeps its characters, RTL
//   and joiners included: it is only isolated.
//
// A plain string given to h() or setText() is shown with markers too: the
// console's own words contain no such characters, so a value passed without
// untrusted() is still shown truthfully (only not isolated).

// Bidi_Control, the zero-width and invisible format characters, line and
// paragraph separators, tag characters (invisible "ASCII smuggling"), C0
// (but tab and LF), DEL and C1.
const CONTROLS =
  /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\u{e0000}-\u{e007f}]/gu;

const NAMES = {
  0x200b: "ZERO WIDTH SPACE", 0x200c: "ZERO WIDTH NON-JOINER", 0x200d: "ZERO WIDTH JOINER",
  0x200e: "LEFT-TO-RIGHT MARK", 0x200f: "RIGHT-TO-LEFT MARK",
  0x202a: "LEFT-TO-RIGHT EMBEDDING", 0x202b: "RIGHT-TO-LEFT EMBEDDING",
  0x202c: "POP DIRECTIONAL FORMATTING", 0x202d: "LEFT-TO-RIGHT OVERRIDE",
  0x202e: "RIGHT-TO-LEFT OVERRIDE", 0x2060: "WORD JOINER",
  0x2066: "LEFT-TO-RIGHT ISOLATE", 0x2067: "RIGHT-TO-LEFT ISOLATE",
  0x2068: "FIRST STRONG ISOLATE", 0x2069: "POP DIRECTIONAL ISOLATE",
  0xfeff: "ZERO WIDTH NO-BREAK SPACE",
};

function markerText(ch) {
  return `⟨U+${ch.codePointAt(0).toString(16).toUpperCase().padStart(4, "0")}⟩`;
}

function marker(ch) {
  const el = document.createElement("span");
  el.className = "ctl";
  el.dir = "ltr"; // reads ⟨U+202E⟩ whatever the text around it
  const name = NAMES[ch.codePointAt(0)];
  el.title = `${name ? `${name}, ` : ""}an invisible character shown in its place`;
  el.append(markerText(ch));
  return el;
}

/** `s` as nodes: text, with a marker element for each control character. */
function visibleNodes(s) {
  const out = [];
  let last = 0;
  for (const m of s.matchAll(CONTROLS)) {
    if (m.index > last) out.push(document.createTextNode(s.slice(last, m.index)));
    out.push(marker(m[0]));
    last = m.index + m[0].length;
  }
  if (last < s.length) out.push(document.createTextNode(s.slice(last)));
  return out;
}

/** `s` with control characters replaced by ⟨U+XXXX⟩, for places that take a
 * plain string (document.title, a title attribute). */
export function plainText(s) {
  return String(s).replace(CONTROLS, markerText);
}

/** The first character a reader can see in `s` (an avatar letter), or "". */
export function firstVisible(s) {
  return [...String(s).replace(CONTROLS, "").trim()][0] ?? "";
}

/** A short untrusted value (user id, title, tool name, summary, comment, ...):
 * isolated, with its control characters shown as markers. */
export function untrusted(s) {
  return h("bdi", { class: "untrusted", dir: "auto" }, String(s ?? ""));
}

/** Untrusted prose (a run's input): isolated, its characters kept as written. */
export function prose(s) {
  return h("bdi", { class: "prose", dir: "auto" }, document.createTextNode(String(s ?? "")));
}

/** Children as nodes: strings with markers, nodes as they are; null/false skipped. */
function toNodes(children) {
  const out = [];
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    if (c instanceof Node) out.push(c);
    else out.push(...visibleNodes(String(c)));
  }
  return out;
}

/**
 * h("div", { class: "x", "data-id": id, onclick: fn }, "text", child, ...)
 * Strings among the children become text (controls as markers); null/false
 * children are skipped. Wrap untrusted values in untrusted() or prose().
 */
export function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) {
      if (typeof v !== "function") throw new TypeError(`${k} must be a function`);
      el.addEventListener(k.slice(2), v);
    } else el.setAttribute(k, v === true ? "" : String(v));
  }
  el.append(...toNodes(children));
  return el;
}

/** Replace an element's content, as h() builds children. */
export function setText(el, ...children) {
  el.replaceChildren(...toNodes(children));
}

/**
 * Text that grows as deltas arrive (model text, reasoning, tool arguments),
 * the only content of `el` (give `el` a `dir`: it is the isolate). `escape`:
 * show control characters as markers (tool arguments); without it the text
 * is kept as written (prose). `text` is everything appended, as received.
 */
export class TextStream {
  constructor(el, { escape = false } = {}) {
    this.el = el;
    this.escape = escape;
    this.text = "";
    this.held = ""; // the first half of a character split between two deltas
  }

  append(s) {
    this.text += s;
    if (!this.escape) {
      this.appendNodes([document.createTextNode(s)]);
      return;
    }
    s = this.held + s;
    this.held = "";
    if (/[\ud800-\udbff]$/.test(s)) {
      // Wait for its other half: it may be an (invisible) tag character.
      this.held = s.slice(-1);
      s = s.slice(0, -1);
    }
    this.appendNodes(visibleNodes(s));
  }

  set(s) {
    this.text = "";
    this.held = "";
    this.el.replaceChildren();
    this.append(s);
  }

  appendNodes(nodes) {
    for (const n of nodes) {
      const last = this.el.lastChild;
      // One text node per run of text, however many deltas made it.
      if (n.nodeType === Node.TEXT_NODE && last?.nodeType === Node.TEXT_NODE) last.appendData(n.data);
      else this.el.append(n);
    }
  }
}

export function shortId(id) {
  return id.length > 12 ? `${id.slice(0, 10)}…` : id;
}

export function timeOf(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "";
}

/** Show `err` in `el`. A `retryable` error (the gateway's error bodies carry
 * the flag; a network error is one) gets a Retry button when `retry` is
 * given: it clears the error and calls `retry()`. */
export function showError(el, err, retry = null) {
  // A message may quote what a client sent: an untrusted value.
  if (err?.code) setText(el, `${err.code}: `, untrusted(err.message));
  else setText(el, untrusted(err?.message ?? err));
  if (err?.retryable && retry) {
    el.append(" ", h("button", {
      type: "button", class: "retry",
      onclick: () => {
        clearError(el);
        retry();
      },
    }, "Retry"));
  }
  el.dataset.code = err?.code ?? "";
  el.hidden = false;
}

export function clearError(el) {
  el.replaceChildren();
  el.hidden = true;
}
