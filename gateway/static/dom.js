// Small DOM helpers for the console. Text is always added as text nodes:
// nothing here parses a string as HTML.

/**
 * h("div", { class: "x", "data-id": id, onclick: fn }, "text", child, ...)
 * Strings among the children become text nodes; null/false children are skipped.
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
  for (const c of children.flat()) {
    if (c !== null && c !== undefined && c !== false) el.append(c); // a string becomes a Text node
  }
  return el;
}

export function shortId(id) {
  return id.length > 12 ? `${id.slice(0, 10)}…` : id;
}

export function timeOf(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : "";
}

export function showError(el, err) {
  el.textContent = err?.code ? `${err.code}: ${err.message}` : String(err?.message ?? err);
  el.hidden = false;
}

export function clearError(el) {
  el.textContent = "";
  el.hidden = true;
}
