// A run's answer text as Markdown (docs/console.md, "Markdown answers").
//
// The one place where the console turns untrusted text into HTML, so it is
// the one place that owns the rules:
//
// * markdown-it parses CommonMark + GFM tables and strikethrough, with
//   `html: false`: raw HTML in the text (`<img onerror=…>`, `<script>`) is
//   never HTML, it is shown as the text it is. Its link check drops
//   `javascript:`, `vbscript:`, `file:` and `data:` targets.
// * DOMPurify then sanitizes what markdown-it made (in an inert document,
//   so nothing in it loads or runs) against an allow-list: the tags
//   markdown-it emits, and only `href`, `title`, `start` and a few classes.
//   A link must be http(s) or mailto, or loses its `href`; every link opens
//   in a new tab with `rel="noopener noreferrer"`, its target in its title.
// * Images are not loaded: `![alt](https://…)` becomes a link reading
//   "image: alt" (a picture from anywhere would tell its server who reads the
//   answer, and a model can be talked into putting data in its URL).
// * No style attributes (the CSP forbids them): table alignment is a class.
// * Each block (paragraph, heading, item, cell) is a bidi isolate with
//   dir="auto"; code blocks read left to right.
//
// While a message streams it is re-rendered whole from its text at most once
// per animation frame, however many deltas arrive in that frame.

import MarkdownIt from "./vendor/markdown-it.js";
import DOMPurify from "./vendor/purify.js";
import { h, setText } from "./dom.js";

const md = new MarkdownIt({ html: false, linkify: true, breaks: true, typographer: false });

md.renderer.rules.image = (tokens, idx, options, env, self) => {
  const t = tokens[idx];
  const src = t.attrGet("src") ?? "";
  const alt = self.renderInlineAsText(t.children ?? [], options, env);
  const label = md.utils.escapeHtml(`image: ${alt || src}`);
  return /^https?:/i.test(src)
    ? `<a class="md-image" href="${md.utils.escapeHtml(src)}">${label}</a>`
    : `<span class="md-image">${label}</span>`;
};

md.core.ruler.push("align_as_class", (state) => {
  for (const t of state.tokens) {
    if ((t.type !== "th_open" && t.type !== "td_open") || !t.attrs) continue;
    const align = /text-align:\s*(left|center|right)/.exec(t.attrGet("style") ?? "");
    t.attrs = t.attrs.filter(([name]) => name !== "style");
    if (align) t.attrJoin("class", `md-align-${align[1]}`);
  }
});

const TAGS = [
  "p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "ul", "ol", "li",
  "strong", "em", "s", "code", "pre", "a", "span",
  "table", "thead", "tbody", "tr", "th", "td",
];
const CLASSES = /^(language-[\w#+.-]{1,40}|md-align-(left|center|right)|md-image)$/;
const SAFE_HREF = /^(https?:|mailto:)/i;
const BLOCKS = new Set(["P", "LI", "H1", "H2", "H3", "H4", "H5", "H6", "BLOCKQUOTE", "TH", "TD"]);

const purify = DOMPurify(window); // our own instance: its hooks are ours alone
purify.addHook("uponSanitizeAttribute", (node, data) => {
  if (data.attrName === "class") data.keepAttr = CLASSES.test(data.attrValue);
});
purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    const href = node.getAttribute("href");
    if (href && SAFE_HREF.test(href)) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
      node.setAttribute("title", href); // what the link text may not say
    } else {
      node.removeAttribute("href");
    }
  } else if (BLOCKS.has(node.tagName)) {
    // Each paragraph, item and cell takes its direction from its own first
    // strong letter (a Hebrew paragraph in an English answer reads right to left).
    node.setAttribute("dir", "auto");
  } else if (node.tagName === "PRE") {
    node.setAttribute("dir", "ltr"); // code reads left to right
  }
});

const PURIFY = {
  ALLOWED_TAGS: TAGS,
  ALLOWED_ATTR: ["href", "title", "class", "start"],
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  ALLOWED_URI_REGEXP: SAFE_HREF,
  RETURN_DOM_FRAGMENT: true,
};

/** Markdown `text` as sanitized nodes (a DocumentFragment), code blocks with a Copy button. */
export function renderMarkdown(text) {
  const frag = purify.sanitize(md.render(text), PURIFY);
  // The line breaks markdown-it writes between blocks are not text: without
  // them the message's textContent is its words (a one-line answer's, its source).
  for (const el of [frag, ...frag.querySelectorAll("ul, ol, blockquote, table, thead, tbody, tr")]) {
    for (const n of [...el.childNodes]) if (n.nodeType === Node.TEXT_NODE && !n.data.trim()) n.remove();
  }
  for (const pre of frag.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    if (!code) continue;
    const lang = /(?:^| )language-(\S+)/.exec(code.className)?.[1] ?? "";
    const block = h("div", { class: "code-block" });
    pre.replaceWith(block);
    block.append(h("div", { class: "code-head" },
      h("span", { class: "code-lang" }, lang), copyButton(code)), pre);
  }
  return frag;
}

function copyButton(code) {
  let timer = 0;
  const btn = h("button", { type: "button", class: "copy", "data-state": "idle", onclick: async () => {
    // The code as written: its one trailing newline (the fence's) left out.
    const text = code.textContent.replace(/\n$/, "");
    let state = "copied";
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      state = "failed";
    }
    btn.dataset.state = state;
    setText(btn, state === "copied" ? "Copied" : "Copy failed");
    clearTimeout(timer);
    timer = setTimeout(() => {
      btn.dataset.state = "idle";
      setText(btn, "Copy");
    }, 2000);
  } }, "Copy");
  btn.title = "Copy the code";
  return btn;
}

/**
 * A message's text, growing as deltas arrive, shown as Markdown in `el`
 * (TextStream's interface: append, text). `text` is everything appended, as
 * received; `el.dataset.source` is the text of the last render.
 */
export class MarkdownStream {
  constructor(el) {
    this.el = el;
    this.text = "";
    this.frame = 0;
    el.classList.add("md");
  }

  append(s) {
    this.text += s;
    if (!this.frame) this.frame = requestAnimationFrame(() => this.render());
  }

  /** Render now what is pending (the run ended: the page shows all it has). */
  flush() {
    if (this.frame) this.render();
  }

  cancel() {
    if (this.frame) cancelAnimationFrame(this.frame);
    this.frame = 0;
  }

  render() {
    this.cancel();
    this.el.replaceChildren(renderMarkdown(this.text));
    this.el.dataset.source = this.text;
  }
}
