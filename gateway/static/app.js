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
import { SessionList } from "./session-list.js";
import { wireSettings, showSettings, memberControls, noAccessScreen } from "./session-admin.js";
import { authProblem } from "./states.js";

const TOKEN_KEY = "runlog.token";
const AUTH_CODES = new Set(["unauthorized", "token_expired", "token_revoked"]);
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
  show(kind, ...text) {
    clearTimeout(this.hold);
    $("conn").dataset.state = kind;
    setText($("conn-text"), ...text);
  },
  // No session open, so no stream to be connected to: say what is true.
  home() {
    if (!app.view) this.show("idle", "signed in as ", untrusted(app.me), " · pick or create a session");
  },
};

// -- the app

const app = {
  client: null,
  me: null,
  role: null,
  list: null, // SessionList
  view: null, // SessionView
};

async function start() {
  wireForms();
  wirePanels();
  const cfg = readConfig();
  const gateways = await allowedGateways(cfg.gateways); // before any token goes anywhere
  const problem = cfg.token ? tokenProblem(cfg.token) : "signed_out";
  if (problem) {
    askForToken(problem).then((token) => signIn(token, gateways));
    return;
  }
  signIn(cfg.token, gateways);
}

// What is wrong with a token before any gateway sees it: "malformed" (not a
// JWT), "token_expired" (its exp has passed), or null. A bad signature only
// the gateway can tell (401 unauthorized).
function tokenProblem(token) {
  const claims = tokenClaims(token);
  if (!claims || typeof claims !== "object") return "malformed";
  if (typeof claims.exp === "number" && claims.exp * 1000 < Date.now()) return "token_expired";
  return null;
}

function showMe(token) {
  app.me = tokenClaims(token)?.sub ?? "?";
  setText($("me"), untrusted(app.me));
  $("me").title = `signed in as ${plainText(app.me)}`;
}

function signIn(token, gateways) {
  showMe(token);
  indicator.home();
  app.client = new RunlogClient({
    baseUrls: gateways,
    token,
    onAuthNeeded: (info) => askForToken(info?.code, info?.message),
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
  app.list = new SessionList(app.client, { onSelect: selectSession, activeId: () => app.view?.id });
  loadSessions().then(() => {
    const sid = hashParams().get("session");
    if (sid) openSession(sid);
  });
}

function showAuthProblem(code, message = "") {
  if (code !== "signed_out") setText($("auth-text"), authProblem(code, message));
  $("auth-banner").dataset.code = code ?? "";
}

let pendingAuth = null;
// `code`: why a token is needed (authProblem); "signed_out" keeps the page's own words.
function askForToken(code, message = "") {
  if (pendingAuth) return pendingAuth.promise;
  const banner = $("auth-banner");
  showAuthProblem(code, message);
  if (app.client) indicator.show("stopped", "sign-in needed"); // a token was in use: it no longer is
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
    const problem = tokenProblem(token);
    if (problem) {
      // Told here, before the token goes anywhere; the banner stays for another.
      showAuthProblem(problem);
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    $("auth-token").value = "";
    $("auth-banner").hidden = true;
    const { resolve } = pendingAuth;
    pendingAuth = null;
    if (app.client) {
      app.client.setToken(token);
      showMe(token);
    }
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
      await app.list.load();
      selectSession(session_id);
    } catch (e) {
      showError($("sessions-error"), e, () => $("new-session").requestSubmit());
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
      showError($("member-error"), e, () => $("add-member").requestSubmit());
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
      showError($("composer-error"), e, () => composer.requestSubmit());
    } finally {
      $("start-run").disabled = !view.canAct || view.archived;
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
  wireSettings();
  setInterval(() => app.view?.tick(), 1000);
}

// A refresh keeps the pages shown ("More sessions") and the search.
async function loadSessions() {
  if (!app.list) return;
  const ok = await app.list.load({
    keep: true,
    onError: (e) => {
      if (AUTH_CODES.has(e.code)) {
        // Refused again after a new token (the client asks once per request): ask again.
        askForToken(e.code, e.message).then(() => loadSessions());
        return;
      }
      showError($("sessions-error"), e, () => loadSessions());
      if (!app.view) {
        indicator.show("stopped", e.code === "network_error" ? "cannot reach the gateway" : `gateway error: ${e.code}`);
      }
    },
  });
  if (ok) indicator.home();
}

function renderSessions() {
  app.list?.render();
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
    if (e.code === "not_a_member") {
      $("empty").replaceChildren(...noAccessScreen(e));
      loadSessions(); // it leaves the list too
    } else {
      const err = h("p", { class: "error-text" });
      showError(err, e, () => openSession(id));
      $("empty").replaceChildren(h("h1", {}, "Cannot open this session"), err);
    }
    indicator.home();
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
    this.client = app.client;
    this.showInfo(info);
    setText($("session-id"), this.id);
    setText($("session-role"), this.role);
    $("session-role").dataset.role = this.role;
    $("runs").replaceChildren();
    $("runs-empty").hidden = false;
    $("empty").hidden = true;
    $("session").hidden = false;
    $("composer").hidden = false;
    $("members-panel").hidden = false;
    $("add-member").hidden = this.role !== "owner";
    clearError($("composer-error"));
    clearError($("members-error"));
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
        // `forbidden`: an owner removed or demoted me (the server ended the
        // stream): open the session again, as what I am now.
        // (Not for a refused subscribe: opening again would be refused again.)
        if (e.code === "forbidden" && this.sub?.subscribedOnce && app.view === this) {
          return openSession(this.id);
        }
        indicator.set("stopped");
        showError($("composer-error"), e);
      },
    });
  }

  // Title, policy, archived state (GET /v1/sessions/{id}): also for a session
  // opened by link that is not in the list's pages.
  showInfo(info) {
    const title = info.title;
    document.title = `${title ? plainText(title) : "Untitled session"} · runlog`;
    setText($("session-title"), title ? untrusted(title) : "Untitled session");
    setText($("session-policy"), `new runs: ${info.run_policy}`);
    this.archived = Boolean(info.archived_at);
    const canStart = this.canAct && !this.archived;
    $("run-input").disabled = !canStart;
    $("start-run").disabled = !canStart;
    $("composer-note").hidden = canStart;
    setText($("composer-note"), canStart ? ""
      : this.archived ? "This session is archived: no new runs."
        : "You are a viewer: you can watch runs, not start or stop them.");
    showSettings(this, info);
  }

  // After an owner's change here: the settings, the members and the list.
  async refresh() {
    await this.refreshMembers();
    await loadSessions();
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
      if (info.your_role !== this.role) return openSession(this.id); // redraw as what I am now
      this.members = info.members;
      this.showInfo(info);
      this.renderMembers();
    } catch (e) {
      if (e?.code === "not_a_member" && app.view === this) return openSession(this.id);
      /* keep the last list */
    }
  }

  renderMembers() {
    const ul = $("members");
    ul.replaceChildren();
    for (const m of this.members) {
      // You, once: a user whose id is "you" (runlog up's) is not "you (you)".
      const me = m.user_id === app.me;
      ul.append(h("li", {
        class: `member${me ? " member-me" : ""}`, "data-user": m.user_id, "data-role": m.role,
        "data-me": me ? "true" : null, title: me ? `you are signed in as ${plainText(m.user_id)}` : null,
      },
        h("span", { class: "avatar", "aria-hidden": "true" }, (firstVisible(m.user_id) || "?").toUpperCase()),
        h("span", { class: "member-name" }, untrusted(m.user_id),
          me && m.user_id !== "you" ? h("span", { class: "muted you" }, " (you)") : null),
        this.role === "owner"
          ? memberControls(this, m, () => this.refreshMembers())
          : h("span", { class: `role role-${m.role}` }, m.role)));
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
