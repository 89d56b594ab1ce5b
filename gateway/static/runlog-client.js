/**
 * runlog-client.js — a browser client for the runlog wire protocol, version 1
 * (docs/protocol.md). One ES module, no dependencies, no build step:
 *
 *   import { RunlogClient } from "/static/runlog-client.js";
 *   const client = new RunlogClient({ baseUrls: ["http://127.0.0.1:8080"], token });
 *   const sub = client.subscribe({
 *     sessionId,                     // or runId
 *     after: 0,                      // the cursor to start after
 *     onEvent(cursor, event, { from }) { ... },
 *     onState(state, info) { ... },  // "connecting" | "live" | "reconnecting" |
 *                                    // "resumed from #N" | "stopped"; info.code: why
 *     onNotice(msg) { ... },         // a session's `presence` / `run_queued` (not in the log)
 *   });
 *   sub.unsubscribe();
 *
 * Delivery contract, per subscription: every event exactly once, in cursor
 * order, across reconnects and gateway switches. The client keeps the last
 * cursor it delivered, resubscribes from it after any drop (on the next
 * gateway of `baseUrls`), and drops any event whose cursor is not above it.
 * A frame with `from` < cursor stands for several merged deltas (a lagging
 * connection); it is delivered once, as `cursor`.
 *
 * Connection: one WebSocket (`/v1/ws`, subprotocols `runlog.v1` and
 * `bearer.<token>`) carries every subscription. It reconnects with
 * exponential backoff and full jitter, also after server-initiated closes,
 * and obeys the `disconnect` message's `reconnect` field: `resume` (back off,
 * reconnect, resubscribe), `reauth` (ask `onAuthNeeded` for a new token
 * first), `stop` (give up until `reconnect()` is called). An error reply to
 * a subscribe that is `retryable` (e.g. `storage_unavailable` while
 * PostgreSQL is down) is retried with backoff for as long as it lasts; a
 * non-retryable one ends that subscription (`onError`, state "stopped").
 * It pings every `heartbeat_s` (from `hello`) and drops a connection that
 * has been silent for 2.5 times that. When the WebSocket cannot be
 * established `sseFallbackAfter` times in a row it falls back to Server-Sent Events
 * (one EventSource per subscription, resumed with `?after=`), and tries the
 * WebSocket again every `wsRetryMs`.
 *
 * REST helpers (createSession, listSessions, sessionsPage, getSession,
 * updateSession, addMember, setMemberRole, removeMember, startRun,
 * getRun, runEvents, sessionEvents, interrupt, decide) go to the gateway the
 * WebSocket is connected to; reads and idempotent writes fail over to the
 * other gateways, starting a run or creating a session does not (a retry
 * elsewhere could do it twice). Errors are thrown as `RunlogError` with the
 * protocol's stable `code`.
 */

const SUBPROTOCOL = "runlog.v1";
const BEARER_PREFIX = "bearer.";

// What a close without a `disconnect` message means (docs/protocol.md,
// "Disconnect codes"); anything else, e.g. 1006 after a kill -9, is "resume".
const CLOSE_ACTIONS = {
  4000: "resume", 4001: "resume", 4002: "resume", 4429: "resume", 4500: "resume",
  4401: "reauth", 4402: "reauth", 4408: "reauth", 4409: "reauth",
  4403: "stop", 4400: "stop",
};
// Disconnects after which the server asks us to back off before coming back.
const BACK_OFF_FIRST = new Set(["rate_limited", "internal", "storage_unavailable", 4429, 4500, 4002]);
const AUTH_CODES = new Set(["unauthorized", "token_expired", "token_revoked"]);

/** Exponential backoff with full jitter: a random delay in [0, min(max, base·2^attempt)). */
export function backoffDelay(attempt, { baseMs = 250, maxMs = 10000 } = {}, random = Math.random) {
  const cap = Math.min(maxMs, baseMs * 2 ** Math.min(attempt, 30));
  return Math.floor(random() * cap);
}

/**
 * How long a connect attempt waits for `hello`: `baseMs`, doubled with each
 * failed attempt in a row up to 8 times it. In a reconnect storm (a gateway
 * fleet restarted under many clients) the gateways answer slowly; a client
 * that gave up at a fixed bound and came back only queued its handshake
 * again (docs/performance.md, "100k connections").
 */
export function connectTimeout(attempt, baseMs = 10000) {
  return baseMs * 2 ** Math.min(Math.max(attempt - 1, 0), 3);
}

/** The claims of a JWT (unverified: for display and expiry checks only), or null. */
export function tokenClaims(token) {
  try {
    const part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
    const padded = part + "=".repeat((4 - (part.length % 4)) % 4);
    const bytes = Uint8Array.from(atob(padded), (c) => c.charCodeAt(0));
    return JSON.parse(new TextDecoder().decode(bytes));
  } catch {
    return null;
  }
}

/** An error from the gateway (`code` is the protocol's stable code) or the network. */
export class RunlogError extends Error {
  constructor({ code = "network_error", message = "", retryable = false, hint = "", status = 0, ...extra } = {}) {
    super(message || code);
    this.name = "RunlogError";
    this.code = code;
    this.retryable = retryable;
    this.hint = hint;
    this.status = status;
    this.extra = extra;
  }
}

/** One followed topic (`run:<id>` or `session:<id>`); made by `RunlogClient.subscribe`. */
export class Subscription {
  constructor(client, opts, n) {
    if (!opts.runId === !opts.sessionId) throw new TypeError("give exactly one of runId or sessionId");
    this.kind = opts.runId ? "run" : "session";
    this.id = opts.runId || opts.sessionId;
    this.topic = `${this.kind}:${this.id}`;
    this.cursor = Number(opts.after ?? 0); // the last cursor delivered
    this.batch = opts.batch ?? true;
    this.head = null; // the head the server reported at the last subscribe
    this.state = null;
    this.stateCode = null; // the reason given with the state, if any
    this.ended = false; // a run subscription that delivered run_end
    this.closed = false;
    this.subscribedOnce = false;
    this.ref = `sub${n}`;
    this._client = client;
    this._onEvent = opts.onEvent || (() => {});
    this._onState = opts.onState || (() => {});
    this._onError = opts.onError || ((e) => console.warn("runlog subscription failed", this.topic, e));
    // Session news that is not in the log: `presence`, `run_queued` (docs/protocol.md).
    this._onNotice = opts.onNotice || (() => {});
    this._sse = null; // { es, disconnect } in SSE mode
    this._sseAttempt = 0;
    this._sseTimer = null;
  }

  unsubscribe() {
    this._client._unsubscribe(this);
  }

  _setState(state, info = {}) {
    // The same state again is news only with another reason (`info.code`).
    const code = info.code ?? null;
    if ((state === this.state && code === this.stateCode) || this.closed) return;
    this.state = state;
    this.stateCode = code;
    try {
      this._onState(state, { topic: this.topic, cursor: this.cursor, ...info });
    } catch (e) {
      console.error("runlog onState handler failed", e);
    }
  }

  /** Deliver one event unless it is a duplicate; true if delivered. */
  _deliver(cursor, event, from) {
    if (this.closed || !(cursor > this.cursor)) return false;
    this.cursor = cursor;
    if (this.kind === "run" && event && event.type === "run_end") this.ended = true;
    try {
      this._onEvent(cursor, event, { from: from ?? cursor });
    } catch (e) {
      console.error("runlog onEvent handler failed", e);
    }
    if (this.head !== null && cursor >= this.head && this.state !== "live") this._setState("live");
    return true;
  }

  _notice(msg) {
    if (this.closed) return;
    try {
      this._onNotice(msg);
    } catch (e) {
      console.error("runlog onNotice handler failed", e);
    }
  }

  _fail(err) {
    this._setState("stopped", { error: err });
    try {
      this._onError(err);
    } catch (e) {
      console.error("runlog onError handler failed", e);
    }
  }
}

export class RunlogClient {
  /**
   * @param {object} o
   * @param {string} [o.baseUrl]   one gateway, e.g. "http://127.0.0.1:8080"
   * @param {string[]|string} [o.baseUrls]  several (failover order); a comma-separated string works
   * @param {string} o.token       bearer token (JWT)
   * @param {(info) => Promise<string|null>} [o.onAuthNeeded]  a new token, or null to stop
   * @param {(info) => void} [o.onConnection]  {state, transport, baseUrl, attempt, delayMs}
   * @param {number} [o.sseFallbackAfter=3]  failed WebSocket attempts in a row before SSE
   * @param {number} [o.backoffBaseMs=250]  @param {number} [o.backoffMaxMs=10000]
   * @param {number} [o.connectTimeoutMs=10000]  no `hello` by then counts as a failure
   *   (doubled with each failed attempt in a row, up to 8 times: see connectTimeout)
   * @param {number} [o.heartbeatS]  override the server's heartbeat_s
   * @param {number} [o.wsRetryMs=30000]  in SSE mode, how often to try the WebSocket again
   */
  constructor(o = {}) {
    let urls = o.baseUrls ?? (o.baseUrl ? [o.baseUrl] : [globalThis.location?.origin]);
    if (typeof urls === "string") urls = urls.split(",");
    this.baseUrls = urls.map((u) => String(u).trim().replace(/\/+$/, "")).filter(Boolean);
    if (!this.baseUrls.length) throw new TypeError("give baseUrl or baseUrls");
    this.token = o.token || "";
    this.onAuthNeeded = o.onAuthNeeded || null;
    this.onConnection = o.onConnection || (() => {});
    this.sseFallbackAfter = o.sseFallbackAfter ?? 3;
    this.backoff = { baseMs: o.backoffBaseMs ?? 250, maxMs: o.backoffMaxMs ?? 10000 };
    this.connectTimeoutMs = o.connectTimeoutMs ?? 10000;
    this.heartbeatS = o.heartbeatS ?? null;
    this.heartbeatFactor = 2.5;
    this.wsRetryMs = o.wsRetryMs ?? 30000;
    this._WS = o.WebSocket ?? globalThis.WebSocket;
    this._ES = o.EventSource ?? globalThis.EventSource;
    this._fetch = o.fetch ?? globalThis.fetch.bind(globalThis);

    this.user = tokenClaims(this.token)?.sub ?? null;
    this.transport = "ws"; // or "sse" after the fallback
    this._idx = 0; // the gateway to try next
    this._subs = new Map(); // topic -> Subscription
    this._n = 0;
    this._conn = null; // the current WebSocket attempt or connection
    this._attempt = 0; // backoff exponent
    this._wsFailures = 0; // WebSocket attempts in a row that never got `hello`
    this._timer = null; // pending reconnect
    this._probeTimer = null; // pending WebSocket retry in SSE mode
    this._stopped = false;
    this._reauthing = null;
    this._connState = "idle";
  }

  /** The gateway in use (connected WebSocket, else the next to try). */
  get baseUrl() {
    return this._conn?.hello ? this._conn.base : this.baseUrls[this._idx];
  }

  /** Follow a run or a session; see the module comment. */
  subscribe(opts) {
    const sub = new Subscription(this, opts, ++this._n);
    if (this._subs.has(sub.topic)) throw new Error(`already subscribed to ${sub.topic}`);
    this._subs.set(sub.topic, sub);
    sub._setState("connecting");
    if (this._stopped) return sub;
    if (this.transport === "sse") this._openSse(sub);
    else if (this._conn?.hello) this._sendSubscribe(this._conn, sub);
    else if (!this._conn && !this._timer) this._connect();
    return sub;
  }

  /** Use a new token from now on (the next connection and REST call). */
  setToken(token) {
    this.token = token;
    this.user = tokenClaims(token)?.sub ?? this.user;
  }

  /** After a `stop` (or close()), connect again and resume every subscription. */
  reconnect() {
    this._stopped = false;
    this._attempt = 0;
    this._wsFailures = 0;
    this._dropConn("reconnect requested", { quiet: true });
    for (const sub of this._subs.values()) this._closeSse(sub);
    this.transport = "ws";
    if (this._subs.size) this._connect();
  }

  /** Stop everything: close the connection, forget the subscriptions. */
  close() {
    this._stopped = true;
    clearTimeout(this._timer);
    clearTimeout(this._probeTimer);
    this._timer = this._probeTimer = null;
    for (const sub of [...this._subs.values()]) this._unsubscribe(sub);
    this._dropConn("client closed", { quiet: true });
    this._emitConn("closed");
  }

  // -- WebSocket

  _connect({ probe = false } = {}) {
    clearTimeout(this._timer);
    this._timer = null;
    if (this._stopped || this._conn) return;
    if (this._tokenExpired()) {
      this._reauth({ code: "token_expired" });
      return;
    }
    const base = this.baseUrls[this._idx];
    const url = base.replace(/^http/, "ws") + "/v1/ws";
    const conn = { ws: null, base, probe, hello: false, disconnect: null, lastRecv: Date.now(), timers: [] };
    this._conn = conn;
    if (!probe) this._emitConn(this._connState === "open" || this._everOpen ? "reconnecting" : "connecting");
    try {
      conn.ws = new this._WS(url, [SUBPROTOCOL, BEARER_PREFIX + this.token]);
    } catch (e) {
      queueMicrotask(() => this._onClosed(conn, { code: 1006, reason: String(e) }));
      return;
    }
    conn.connectTimer = setTimeout(
      () => this._drop(conn, "no hello in time"), connectTimeout(this._attempt, this.connectTimeoutMs));
    conn.ws.onmessage = (m) => this._onMessage(conn, m);
    conn.ws.onclose = (ev) => this._onClosed(conn, ev);
    conn.ws.onerror = () => {}; // a close event follows
  }

  _send(conn, msg) {
    if (conn.ws && conn.ws.readyState === 1) conn.ws.send(JSON.stringify(msg));
  }

  _sendSubscribe(conn, sub) {
    if (sub.ended || sub.closed) return;
    this._send(conn, {
      type: "subscribe", [`${sub.kind}_id`]: sub.id, after: sub.cursor, batch: sub.batch, ref: sub.ref,
    });
  }

  _onMessage(conn, m) {
    if (conn !== this._conn) return;
    conn.lastRecv = Date.now();
    let msg;
    try {
      msg = JSON.parse(m.data);
    } catch {
      return;
    }
    switch (msg.type) {
      case "hello":
        this._onHello(conn, msg);
        break;
      case "subscribed": {
        const sub = this._subs.get(msg.topic);
        if (!sub) break;
        this._attempt = 0; // a confirmed subscription: the connection works
        sub.head = msg.head;
        if (sub.subscribedOnce || msg.cursor > 0) {
          sub._setState(`resumed from #${msg.cursor}`, { resumedFrom: msg.cursor, head: msg.head });
        }
        sub.subscribedOnce = true;
        if (sub.cursor >= msg.head) sub._setState("live");
        break;
      }
      case "event":
        this._subs.get(msg.topic)?._deliver(msg.cursor, msg.event, msg.from);
        break;
      case "events": {
        const sub = this._subs.get(msg.topic);
        if (sub) msg.events.forEach((e, i) => sub._deliver(msg.cursor + i, e));
        break;
      }
      case "error":
        this._onError(conn, msg);
        break;
      case "disconnect":
        conn.disconnect = msg;
        break;
      case "presence":
      case "run_queued":
        this._subs.get(msg.topic)?._notice(msg);
        break;
      case "unsubscribed": {
        // With a code, the server ended it (access removed or lowered): final.
        const sub = msg.code ? this._subs.get(msg.topic) : undefined;
        if (sub) {
          this._subs.delete(msg.topic);
          sub._fail(new RunlogError(msg));
        }
        break;
      }
      default: // pong, ack, and types added later
        break;
    }
  }

  _onHello(conn, msg) {
    conn.hello = true;
    clearTimeout(conn.connectTimer);
    this._wsFailures = 0;
    this._everOpen = true;
    if (conn.probe) {
      // The WebSocket works again: leave SSE.
      conn.probe = false;
      clearTimeout(this._probeTimer);
      this._probeTimer = null;
      for (const sub of this._subs.values()) this._closeSse(sub);
      this.transport = "ws";
    }
    if (msg.user) this.user = msg.user;
    this._startHeartbeat(conn, this.heartbeatS ?? msg.heartbeat_s ?? 15);
    this._emitConn("open");
    if (!this._subs.size) this._attempt = 0;
    for (const sub of this._subs.values()) this._sendSubscribe(conn, sub);
  }

  _onError(conn, msg) {
    const sub = [...this._subs.values()].find((s) => s.ref && s.ref === msg.ref);
    const err = new RunlogError(msg);
    if (!sub) {
      if (AUTH_CODES.has(msg.code)) this._reauth(msg);
      else console.warn("runlog:", msg.code, msg.message);
      return;
    }
    if (msg.code === "conflict") return; // already subscribed on this connection
    if (AUTH_CODES.has(msg.code)) {
      this._reauth(msg);
    } else if (msg.retryable) {
      // "Not now" (e.g. PostgreSQL is down): say why, and ask again for as long as it takes.
      const delayMs = Math.max(500, backoffDelay(this._attempt++, this.backoff));
      sub._setState(sub.subscribedOnce ? "reconnecting" : "connecting",
        { code: msg.code, message: msg.message, retryable: true, delayMs, gateway: conn.base });
      const t = setTimeout(() => conn === this._conn && this._sendSubscribe(conn, sub), delayMs);
      conn.timers.push(t);
    } else {
      this._subs.delete(sub.topic);
      sub._fail(err);
    }
  }

  _startHeartbeat(conn, heartbeatS) {
    const periodMs = Math.max(100, heartbeatS * 1000);
    const tickMs = Math.min(1000, periodMs / 4);
    conn.lastPing = conn.lastTick = Date.now();
    const tick = () => {
      const now = Date.now();
      if (now - conn.lastTick > 5 * tickMs) {
        // Timers were throttled (background tab) or the machine slept: the
        // silence may be ours, so ping and give the server a fresh window.
        conn.lastRecv = now;
        conn.lastPing = now;
        this._send(conn, { type: "ping" });
      } else {
        if (now - conn.lastPing >= periodMs) {
          conn.lastPing = now;
          this._send(conn, { type: "ping" });
        }
        if (now - conn.lastRecv > this.heartbeatFactor * periodMs) {
          this._drop(conn, "heartbeat timeout");
          return;
        }
      }
      conn.lastTick = now;
    };
    conn.timers.push(setInterval(tick, tickMs));
  }

  /** Close a connection we no longer trust, without waiting for the close handshake. */
  _drop(conn, reason) {
    if (conn !== this._conn) return;
    const ws = conn.ws;
    if (ws) {
      ws.onmessage = ws.onclose = ws.onerror = null;
      try {
        ws.close(4000, reason.slice(0, 100));
      } catch {
        /* already closed */
      }
    }
    this._onClosed(conn, { code: 1006, reason });
  }

  _dropConn(reason, { quiet = false } = {}) {
    const conn = this._conn;
    if (!conn) return;
    if (quiet) {
      this._conn = null;
      this._clearConnTimers(conn);
      if (conn.ws) {
        conn.ws.onmessage = conn.ws.onclose = conn.ws.onerror = null;
        try {
          conn.ws.close(1000, reason);
        } catch {
          /* already closed */
        }
      }
    } else {
      this._drop(conn, reason);
    }
  }

  _clearConnTimers(conn) {
    clearTimeout(conn.connectTimer);
    for (const t of conn.timers) {
      clearTimeout(t);
      clearInterval(t);
    }
    conn.timers = [];
  }

  _onClosed(conn, ev) {
    if (conn !== this._conn) return;
    this._conn = null;
    this._clearConnTimers(conn);
    if (this._stopped) return;
    if (conn.probe && !conn.hello) {
      // Still no WebSocket: stay on SSE, try again later.
      this._idx = (this._idx + 1) % this.baseUrls.length;
      this._scheduleProbe();
      return;
    }
    if (!conn.hello) this._wsFailures++;
    const d = conn.disconnect;
    const action = d?.reconnect ?? CLOSE_ACTIONS[ev.code] ?? "resume";
    const info = { code: d?.code ?? ev.code, message: d?.message ?? ev.reason ?? "", gateway: conn.base };
    if (action === "stop") {
      this._stopAll(info);
      return;
    }
    if (action === "reauth") {
      this._reauth(info);
      return;
    }
    const active = [...this._subs.values()].filter((s) => !s.ended);
    if (!active.length) {
      this._emitConn("idle");
      return; // nothing to resume; the next subscribe connects
    }
    for (const sub of active) sub._setState(sub.subscribedOnce ? "reconnecting" : "connecting", info);
    // Any gateway serves any client: try the next one.
    this._idx = (this._idx + 1) % this.baseUrls.length;
    if (this._ES && this._wsFailures >= this.sseFallbackAfter) {
      this._startSse();
      return;
    }
    const first = BACK_OFF_FIRST.has(d?.code ?? ev.code) ? 1000 : 0;
    this._scheduleReconnect(first);
  }

  _scheduleReconnect(minMs = 0) {
    if (this._timer || this._stopped) return;
    const delayMs = Math.max(minMs, backoffDelay(this._attempt++, this.backoff));
    this._emitConn("reconnecting", { delayMs });
    this._timer = setTimeout(() => {
      this._timer = null;
      this._connect();
    }, delayMs);
  }

  _stopAll(info) {
    this._stopped = true;
    clearTimeout(this._timer);
    this._timer = null;
    for (const sub of this._subs.values()) {
      this._closeSse(sub);
      sub._setState("stopped", info);
    }
    this._emitConn("stopped", info);
  }

  async _reauth(info) {
    if (this._reauthing) return this._reauthing;
    for (const sub of this._subs.values()) sub._setState("reconnecting", { ...info, reauth: true });
    this._emitConn("auth_needed", info);
    this._reauthing = (async () => {
      let token = null;
      try {
        token = this.onAuthNeeded ? await this.onAuthNeeded(info) : null;
      } catch (e) {
        console.warn("runlog onAuthNeeded failed", e);
      }
      this._reauthing = null;
      if (!token) {
        this._stopAll(info);
        return null;
      }
      this.setToken(token);
      this._stopped = false;
      this._attempt = 0;
      this._wsFailures = 0;
      if (this.transport === "sse") {
        for (const sub of this._subs.values()) {
          this._closeSse(sub);
          this._openSse(sub);
        }
      } else if (this._subs.size) {
        this._dropConn("new token", { quiet: true });
        this._connect();
      }
      return token;
    })();
    return this._reauthing;
  }

  _tokenExpired() {
    const exp = tokenClaims(this.token)?.exp;
    return typeof exp === "number" && exp * 1000 < Date.now();
  }

  _emitConn(state, extra = {}) {
    this._connState = state;
    try {
      this.onConnection({ state, transport: this.transport, baseUrl: this.baseUrl, attempt: this._attempt, ...extra });
    } catch (e) {
      console.error("runlog onConnection handler failed", e);
    }
  }

  _unsubscribe(sub) {
    if (sub.closed) return;
    sub.closed = true;
    this._subs.delete(sub.topic);
    this._closeSse(sub);
    if (this._conn?.hello) this._send(this._conn, { type: "unsubscribe", [`${sub.kind}_id`]: sub.id });
  }

  // -- Server-Sent Events (fallback)

  _startSse() {
    this.transport = "sse";
    this._emitConn("open", { fallback: true });
    for (const sub of this._subs.values()) this._openSse(sub);
    this._scheduleProbe();
  }

  _scheduleProbe() {
    clearTimeout(this._probeTimer);
    this._probeTimer = setTimeout(() => {
      this._probeTimer = null;
      if (this.transport === "sse" && !this._conn && !this._stopped) this._connect({ probe: true });
    }, this.wsRetryMs);
  }

  _openSse(sub) {
    if (sub.closed || sub.ended || this._stopped || sub._sse) return;
    const base = this.baseUrls[this._idx];
    const q = `after=${sub.cursor}&access_token=${encodeURIComponent(this.token)}`;
    const url = `${base}/v1/${sub.kind}s/${encodeURIComponent(sub.id)}/events?${q}`;
    const es = new this._ES(url);
    const rec = { es, base, disconnect: null, opened: false };
    sub._sse = rec;
    es.onopen = () => {
      rec.opened = true;
      sub._sseAttempt = 0;
      if (sub.subscribedOnce || sub.cursor > 0) {
        sub._setState(`resumed from #${sub.cursor}`, { resumedFrom: sub.cursor, transport: "sse" });
      }
      sub.subscribedOnce = true;
      sub._setState("live", { transport: "sse" });
    };
    es.onmessage = (e) => {
      let event;
      try {
        event = JSON.parse(e.data);
      } catch {
        return;
      }
      sub._deliver(Number(e.lastEventId), event);
    };
    for (const type of ["presence", "run_queued"]) {
      es.addEventListener(type, (e) => {
        try {
          sub._notice(JSON.parse(e.data));
        } catch {
          /* ignore */
        }
      });
    }
    es.addEventListener("disconnect", (e) => {
      try {
        rec.disconnect = JSON.parse(e.data);
      } catch {
        /* ignore */
      }
    });
    es.onerror = () => {
      // Take reconnection into our own hands: EventSource would retry the
      // same gateway forever, and gives up silently on an HTTP error.
      es.close();
      if (sub._sse !== rec) return;
      sub._sse = null;
      if (sub.closed || sub.ended || this._stopped) return;
      const action = rec.disconnect?.reconnect ?? "resume";
      const info = { code: rec.disconnect?.code ?? "network", gateway: base, transport: "sse" };
      if (action === "stop") {
        this._subs.delete(sub.topic);
        sub._fail(new RunlogError({ code: info.code, message: rec.disconnect?.message }));
        return;
      }
      if (action === "reauth" || (!rec.opened && this._tokenExpired())) {
        this._reauth(info);
        return;
      }
      sub._setState(sub.subscribedOnce ? "reconnecting" : "connecting", info);
      this._idx = (this._idx + 1) % this.baseUrls.length;
      const delay = backoffDelay(sub._sseAttempt++, this.backoff);
      sub._sseTimer = setTimeout(() => this.transport === "sse" && this._openSse(sub), delay);
    };
  }

  _closeSse(sub) {
    clearTimeout(sub._sseTimer);
    if (sub._sse) {
      sub._sse.es.close();
      sub._sse = null;
    }
  }

  // -- REST

  /** The gateways to try for a request: the connected one first. */
  _restOrder() {
    const first = this._conn?.hello ? this._conn.base : this.baseUrls[this._idx];
    return [first, ...this.baseUrls.filter((u) => u !== first)];
  }

  /**
   * One REST call. `failover`: on a network error, try the next gateway
   * (only for reads and idempotent writes).
   */
  async request(method, path, body, { failover = method === "GET", retryAuth = true } = {}) {
    let lastErr = null;
    const bases = this._restOrder();
    for (let i = 0; i < bases.length; i++) {
      let res;
      try {
        res = await this._fetch(bases[i] + path, {
          method,
          headers: {
            Authorization: `Bearer ${this.token}`,
            Accept: "application/json",
            ...(body === undefined ? {} : { "Content-Type": "application/json" }),
          },
          body: body === undefined ? undefined : JSON.stringify(body),
        });
      } catch (e) {
        lastErr = new RunlogError({ code: "network_error", message: `cannot reach ${bases[i]}: ${e.message}`, retryable: true });
        if (!failover) break;
        continue;
      }
      const text = await res.text();
      let data = null;
      try {
        data = text ? JSON.parse(text) : null;
      } catch {
        data = null;
      }
      if (res.ok) return data;
      const err = new RunlogError({
        code: `http_${res.status}`, message: res.statusText, ...(data?.error ?? {}), status: res.status,
      });
      if (retryAuth && AUTH_CODES.has(err.code) && this.onAuthNeeded) {
        const token = await this._reauth({ code: err.code, message: err.message });
        if (token) return this.request(method, path, body, { failover, retryAuth: false });
      }
      throw err;
    }
    throw lastErr;
  }

  createSession({ title = "", runPolicy } = {}) {
    return this.request("POST", "/v1/sessions", { title, ...(runPolicy ? { run_policy: runPolicy } : {}) });
  }

  /** The first page of your sessions (newest first; see sessionsPage). */
  async listSessions() {
    return (await this.request("GET", "/v1/sessions")).sessions;
  }

  /**
   * One page of your sessions: `{sessions, next_before}`. `q`: the title
   * contains it (any case); `archived`: only the archived ones; `before`: a
   * page's `next_before` (null on the last page).
   */
  sessionsPage({ q = "", archived = false, before = null } = {}) {
    const params = new URLSearchParams();
    if (q) params.set("q", q);
    if (archived) params.set("archived", "true");
    if (before) params.set("before", before);
    const query = params.toString();
    return this.request("GET", `/v1/sessions${query ? `?${query}` : ""}`);
  }

  getSession(sessionId) {
    return this.request("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`);
  }

  /** Owners: `{title?, run_policy?, include_thinking?, include_tool_calls?, archived?}`. */
  updateSession(sessionId, changes) {
    return this.request("PATCH", `/v1/sessions/${encodeURIComponent(sessionId)}`, changes, { failover: true });
  }

  addMember(sessionId, userId, role) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/members`,
      { user_id: userId, role }, { failover: true });
  }

  /** Owners: change a member's role (409 `last_owner` for the last owner). */
  setMemberRole(sessionId, userId, role) {
    return this.request("PATCH",
      `/v1/sessions/${encodeURIComponent(sessionId)}/members/${encodeURIComponent(userId)}`,
      { role }, { failover: true });
  }

  /** Owners: remove a member (its streams of the session end on every gateway). */
  removeMember(sessionId, userId) {
    return this.request("DELETE",
      `/v1/sessions/${encodeURIComponent(sessionId)}/members/${encodeURIComponent(userId)}`,
      undefined, { failover: true });
  }

  startRun(sessionId, { input = "", model } = {}) {
    return this.request("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/runs`,
      { input, ...(model ? { model } : {}) });
  }

  getRun(runId) {
    return this.request("GET", `/v1/runs/${encodeURIComponent(runId)}`);
  }

  runEvents(runId, { after = 0, limit } = {}) {
    const q = `after=${after}${limit ? `&limit=${limit}` : ""}`;
    return this.request("GET", `/v1/runs/${encodeURIComponent(runId)}/events?${q}`);
  }

  sessionEvents(sessionId, { after = 0, limit } = {}) {
    const q = `after=${after}${limit ? `&limit=${limit}` : ""}`;
    return this.request("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/events?${q}`);
  }

  /** Stop a run (a repeat is accepted and changes nothing). */
  interrupt(runId, reason = "") {
    return this.request("POST", `/v1/runs/${encodeURIComponent(runId)}/interrupt`, { reason }, { failover: true });
  }

  /** Decide an approval: "approve" or "reject" (the same decision again is a no-op).
   * `callDigest`: the approval_required's call_digest, i.e. what the approver was
   * shown; if the approval now guards another call, the answer is 409 approval_stale. */
  decide(runId, approvalId, decision, comment = "", callDigest = "") {
    const body = callDigest ? { decision, comment, call_digest: callDigest } : { decision, comment };
    return this.request("POST",
      `/v1/runs/${encodeURIComponent(runId)}/approvals/${encodeURIComponent(approvalId)}`,
      body, { failover: true });
  }
}
