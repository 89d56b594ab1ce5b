// The runlog console: sessions, members, and every run of a session, live.
//
// Sign-in: the page reads `#token=<jwt>` (and optionally `&gateways=url1,url2`
// for failover, `&session=<id>`), keeps them in sessionStorage (this tab
// only) and removes the token from the address bar. Everything the model or
// another user wrote is untrusted: it is put in the page through dom.js only
// (text nodes, never parsed as HTML; each value isolated, its invisible
// control characters shown as markers).
//
// A link is anyone's to write, so its gateways are not taken on trust: the
// page talks only to its own origin and the gateways this deployment lists
// (GET /v1/config, asked of the page's own origin before any token is sent);
// others are dropped with a visible notice. The page's CSP connect-src, set
// by the gateway from the same list, refuses anything else anyway.

import { RunlogClient, tokenClaims } from "./runlog-client.js";
import { RunView } from "./run-view.js";
import { RunQueue } from "./queue.js";
import { PresenceView } from "./presence.js";
import { wirePanels } from "./panels.js";
import { h, setText, untrusted, plainText, firstVisible, shortId, showError, clearError } from "./dom.js";

const TOKEN_KEY = "runlog.token";
const GATEWAYS_KEY = "runlog.gateways";
const $ = (id) => document.getElementById(id);

// -- configuration from the URL hash

function hashParams() {
  return new URLSearchParams(location.hash.slice(1));
}

function readConfig() {
  const params = hashParams();
  const token = params.get("token");
  if (token) {
    sessionStorage.setItem(TOKEN_KEY, token);
    // Gateways only come with a token: a link without one must not be able
    // to send the stored token somewhere else.
    const gateways = splitList(params.get("gateways") || "");
    if (gateways.length) sessionStorage.setItem(GATEWAYS_KEY, gateways.join(","));
    else sessionStorage.removeItem(GATEWAYS_KEY);
    const session = params.get("session");
    history.replaceState(null, "", location.pathname + location.search +
      (session ? `#session=${encodeURIComponent(session)}` : ""));
  }
  const stored = splitList(sessionStorage.getItem(GATEWAYS_KEY) || "");
  return { token: sessionStorage.getItem(TOKEN_KEY), gateways: stored };
}

function splitList(list) {
  return list.split(",").map((s) => s.trim()).filter(Boolean);
}

// The gateways this page may use: those of `requested` that this deployment
// lists (its own origin always), in the link's order; [own origin] if none.
async function allowedGateways(requested) {
  if (!requested.length) return [location.origin];
  const listed = new Set([location.origin, ...(await deploymentGateways())].map(gatewayKey));
  listed.delete(null);
  const allowed = [...new Set(requested.map(gatewayKey).filter((k) => listed.has(k)))];
  const ignored = requested.filter((u) => !listed.has(gatewayKey(u)));
  const use = allowed.length ? allowed : [location.origin];
  if (ignored.length) {
    // Origins only: the rest of a stranger's URL is theirs to word.
    const names = [...new Set(ignored.map((u) => httpUrl(u)?.origin ?? "a malformed entry"))];
    showNotice(`Ignored ${names.join(", ")}: not a gateway of this deployment, so your ` +
      `token is not sent there. Connecting to ${use.join(", ")}.`);
    if (allowed.length) sessionStorage.setItem(GATEWAYS_KEY, allowed.join(","));
    else sessionStorage.removeItem(GATEWAYS_KEY);
  }
  return use;
}

// GET /v1/config of the page's own origin (no token). Fails closed: without
// the list, only this origin is used.
async function deploymentGateways() {
  try {
    const res = await fetch("/v1/config", { cache: "no-store", headers: { Accept: "application/json" } });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    const { gateways } = await res.json();
    return Array.isArray(gateways) ? gateways.map(String) : [];
  } catch (e) {
    console.warn("runlog: cannot read /v1/config; using this page's gateway only", e);
    return [];
  }
}

function httpUrl(u) {
  try {
    const url = new URL(u);
    return url.protocol === "http:" || url.protocol === "https:" ? url : null;
  } catch {
    return null;
  }
}

// One gateway URL however it is spelled (no user, query or fragment), or null.
function gatewayKey(u) {
  const url = httpUrl(u);
  return url && url.origin + url.pathname.replace(/\/+$/, "");
}

function showNotice(text) {
  setText($("notice-text"), text);
  $("notice").hidden = false;
}

// -- connection indicator

const indicator = {
  resumedAt: 0,
  hold: null,
  set(state, info = {}) {
    clearTimeout(this.hold);
    const el = $("conn");
    if (state.startsWith("resumed from")) {
      this.resumedAt = Date.now();
      el.dataset.lastResume = String(info.resumedFrom ?? "");
      this.show("resumed", state);
      return;
    }
    const shown = Date.now() - this.resumedAt;
    if (state === "live" && shown < 4000) {
      // Keep "resumed from #N" readable for a moment before it turns live.
      this.hold = setTimeout(() => this.show("live", "live"), 4000 - shown);
      return;
    }
    const text = { connecting: "connecting…", reconnecting: "reconnecting…", stopped: "disconnected" }[state] ?? state;
    this.show(state, text);
  },
  show(kind, text) {
    $("conn").dataset.state = kind;
    setText($("conn-text"), text);
  },
};

// -- the app

const app = {
  client: null,
  me: null,
  role: null,
  sessions: [],
  view: null, // SessionView
};

async function start() {
  wireForms();
  wirePanels();
  const cfg = readConfig();
  const gateways = await allowedGateways(cfg.gateways); // before any token goes anywhere
  const claims = cfg.token ? tokenClaims(cfg.token) : null;
  if (!cfg.token || !claims || (claims.exp && claims.exp * 1000 < Date.now())) {
    askForToken(cfg.token ? "Your sign-in has expired. Open a new console link, or paste a token:" : null)
      .then((token) => signIn(token, gateways));
    return;
  }
  signIn(cfg.token, gateways);
}

function signIn(token, gateways) {
  app.me = tokenClaims(token)?.sub ?? "?";
  setText($("me"), untrusted(app.me));
  $("me").title = `signed in as ${plainText(app.me)}`;
  app.client = new RunlogClient({
    baseUrls: gateways,
    token,
    onAuthNeeded: () => askForToken("Your sign-in has expired. Open a new console link, or paste a token:"),
    onConnection: (c) => {
      let host = c.baseUrl;
      try {
        host = new URL(c.baseUrl).host;
      } catch {
        /* keep it */
      }
      setText($("gateway"), host, c.transport === "sse" ? " · SSE" : "");
      $("gateway").dataset.gateway = c.baseUrl;
      $("gateway").dataset.transport = c.transport;
    },
  });
  window.runlogClient = app.client; // for the developer console
  loadSessions().then(() => {
    const sid = hashParams().get("session");
    if (sid) openSession(sid);
  });
}

let pendingAuth = null;
function askForToken(message) {
  if (pendingAuth) return pendingAuth.promise;
  const banner = $("auth-banner");
  if (message) setText($("auth-text"), message);
  banner.hidden = false;
  let resolve;
  const promise = new Promise((r) => (resolve = r));
  pendingAuth = { promise, resolve };
  return promise;
}

function wireForms() {
  $("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const token = $("auth-token").value.trim();
    if (!token || !pendingAuth) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("auth-token").value = "";
    $("auth-banner").hidden = true;
    const { resolve } = pendingAuth;
    pendingAuth = null;
    if (app.client) app.client.setToken(token);
    resolve(token);
  });

  $("new-session").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    if (!app.client) return;
    const btn = ev.submitter;
    if (btn) btn.disabled = true;
    clearError($("sessions-error"));
    try {
      const title = $("new-session-title").value.trim();
      const { session_id } = await app.client.createSession({ title });
      $("new-session-title").value = "";
      await loadSessions();
      selectSession(session_id);
    } catch (e) {
      showError($("sessions-error"), e);
    } finally {
      if (btn) btn.disabled = false;
    }
  });

  $("add-member").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const view = app.view;
    if (!view) return;
    clearError($("member-error"));
    const user = $("member-user").value.trim();
    const role = $("member-role").value;
    try {
      await app.client.addMember(view.id, user, role);
      $("member-user").value = "";
      await view.refreshMembers();
    } catch (e) {
      showError($("member-error"), e);
    }
  });

  const composer = $("composer");
  composer.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const view = app.view;
    const input = $("run-input").value;
    if (!view || !input.trim()) return;
    $("start-run").disabled = true;
    clearError($("composer-error"));
    try {
      const started = await app.client.startRun(view.id, { input });
      $("run-input").value = "";
      if (started?.ahead > 0 && app.view === view) {
        view.queue.add({ run_id: started.run_id, started_by: app.me, input, created_at: Date.now() });
      }
    } catch (e) {
      showError($("composer-error"), e);
    } finally {
      $("start-run").disabled = !view.canAct;
    }
  });
  $("run-input").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) {
      ev.preventDefault();
      composer.requestSubmit();
    }
  });

  window.addEventListener("hashchange", () => {
    const params = hashParams();
    if (params.get("token")) {
      readConfig();
      location.reload();
      return;
    }
    const sid = params.get("session");
    if (sid && sid !== app.view?.id) openSession(sid);
  });
  window.addEventListener("focus", () => {
    if (app.client) loadSessions();
    app.view?.refreshMembers();
  });
  setInterval(() => app.view?.tick(), 1000);
}

async function loadSessions() {
  clearError($("sessions-error"));
  try {
    app.sessions = await app.client.listSessions();
  } catch (e) {
    showError($("sessions-error"), e);
    return;
  }
  renderSessions();
}

function renderSessions() {
  const ul = $("sessions");
  ul.replaceChildren();
  if (!app.sessions.length) {
    ul.append(h("li", { class: "muted small" }, "No sessions yet."));
    return;
  }
  for (const s of app.sessions) {
    const active = app.view?.id === s.session_id;
    ul.append(h("li", {},
      h("button", {
        type: "button",
        class: `session-item${active ? " active" : ""}`,
        "data-session-id": s.session_id,
        onclick: () => selectSession(s.session_id),
      },
      h("span", { class: "session-name" }, s.title ? untrusted(s.title) : "Untitled session"),
      h("span", { class: "session-meta" }, `${s.your_role} · ${shortId(s.session_id)}`)),
    ));
  }
}

function selectSession(id) {
  if (hashParams().get("session") === id) openSession(id);
  else location.hash = `session=${encodeURIComponent(id)}`;
}

async function openSession(id) {
  app.view?.close();
  app.view = null;
  let info;
  try {
    info = await app.client.getSession(id);
  } catch (e) {
    $("session").hidden = true;
    $("composer").hidden = true;
    $("members-panel").hidden = true;
    $("empty").hidden = false;
    $("empty").replaceChildren(h("h1", {}, "Cannot open this session"),
      h("p", { class: "error-text" }, `${e.code}: `, untrusted(e.message)));
    return;
  }
  if (app.view) app.view.close(); // a later click won the race
  app.view = new SessionView(info);
  renderSessions();
}

// -- one session: members, runs (from the session's event stream), composer

class SessionView {
  constructor(info) {
    this.id = info.session_id;
    this.role = info.your_role;
    this.canAct = this.role === "owner" || this.role === "approver";
    this.runs = new Map();
    this.members = info.members;
    const listed = app.sessions.find((s) => s.session_id === this.id);
    const title = listed?.title;
    document.title = `${title ? plainText(title) : "Untitled session"} · runlog`;
    setText($("session-title"), title ? untrusted(title) : "Untitled session");
    setText($("session-id"), this.id);
    setText($("session-role"), this.role);
    $("session-role").dataset.role = this.role;
    setText($("session-policy"), `new runs: ${info.run_policy}`);
    $("runs").replaceChildren();
    $("runs-empty").hidden = false;
    $("empty").hidden = true;
    $("session").hidden = false;
    $("composer").hidden = false;
    $("members-panel").hidden = false;
    $("add-member").hidden = this.role !== "owner";
    $("run-input").disabled = !this.canAct;
    $("start-run").disabled = !this.canAct;
    $("composer-note").hidden = this.canAct;
    setText($("composer-note"), this.canAct ? "" : "You are a viewer: you can watch runs, not start or stop them.");
    clearError($("composer-error"));
    this.renderMembers();
    this.presence = new PresenceView($("presence"), app.me);
    this.queue = new RunQueue($("runs"), { client: app.client, me: app.me, role: this.role },
      (runId) => this.runs.has(runId));
    this.queue.load(info.queued);
    if (this.queue.cards.size) $("runs-empty").hidden = true;
    indicator.set("connecting");
    this.sub = app.client.subscribe({
      sessionId: this.id,
      after: 0,
      onEvent: (cursor, event) => this.apply(cursor, event),
      onNotice: (msg) => this.notice(msg),
      onState: (state, i) => {
        indicator.set(state, i);
        if (state.startsWith("resumed from")) this.refreshQueue(); // notices missed while away
      },
      onError: (e) => {
        indicator.set("stopped");
        showError($("composer-error"), e);
      },
    });
  }

  close() {
    this.sub.unsubscribe();
    $("runs").replaceChildren();
  }

  apply(cursor, event) {
    let run = this.runs.get(event.run_id);
    if (!run) {
      run = new RunView(event.run_id, { client: app.client, canAct: this.canAct, me: app.me });
      this.runs.set(event.run_id, run);
      this.queue.place(event.run_id, run.el);
      $("runs-empty").hidden = true;
    }
    keepScrolledDown();
    run.apply(event, cursor);
    if (event.type === "run_start" && !this.members.some((m) => m.user_id === event.started_by)) {
      this.refreshMembers();
    }
  }

  tick() {
    for (const run of this.runs.values()) run.tick();
  }

  notice(msg) {
    if (msg.type === "presence") this.presence.show(msg.users || []);
    else if (msg.type === "run_queued") {
      this.queue.add(msg.run);
      $("runs-empty").hidden = true;
    }
  }

  async refreshQueue() {
    try {
      const info = await app.client.getSession(this.id);
      if (app.view === this) this.queue.load(info.queued);
    } catch {
      /* the next run_start says it anyway */
    }
  }

  async refreshMembers() {
    try {
      const info = await app.client.getSession(this.id);
      if (app.view !== this) return;
      this.members = info.members;
      this.renderMembers();
    } catch {
      /* keep the last list */
    }
  }

  renderMembers() {
    const ul = $("members");
    ul.replaceChildren();
    for (const m of this.members) {
      ul.append(h("li", { class: "member", "data-user": m.user_id, "data-role": m.role },
        h("span", { class: "avatar", "aria-hidden": "true" }, (firstVisible(m.user_id) || "?").toUpperCase()),
        h("span", { class: "member-name" }, untrusted(m.user_id),
          m.user_id === app.me ? h("span", { class: "muted" }, " (you)") : null),
        h("span", { class: `role role-${m.role}` }, m.role)));
    }
  }
}

// Follow new output when the reader is at the bottom; leave them alone otherwise.
let scrollQueued = false;
function keepScrolledDown() {
  if (scrollQueued) return;
  const main = $("main");
  const atBottom = main.scrollHeight - main.scrollTop - main.clientHeight < 150;
  scrollQueued = true;
  requestAnimationFrame(() => {
    scrollQueued = false;
    if (atBottom) main.scrollTop = main.scrollHeight;
  });
}

start();
