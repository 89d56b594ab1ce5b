"""Settings, parsed once into a frozen object and passed explicitly.

This is the only module that reads the environment. Every setting has an
environment variable (`RUNLOG_<NAME>`) and a CLI flag (`--name-with-dashes`);
a flag wins over the variable, the variable over the default. `runlog
settings` prints the table below; `runlog settings --markdown` writes
docs/configuration.md from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import errors

ENV_PREFIX = "RUNLOG_"
# jwt_secret's default, public by definition: gateways refuse it unless they
# listen on loopback only, and `runlog up` replaces it (runlog/secret.py).
DEV_JWT_SECRET = "runlog-development-secret-change-me-in-production"


def _opt(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True, kw_only=True)
class Settings:
    # -- where things are
    data_dir: Path = _opt(
        Path(".runlog"), "Folder for the embedded NATS and PostgreSQL data (kept across restarts)."
    )
    nats_url: str = _opt(
        "", "NATS server URL(s), comma-separated. Empty: `runlog up` starts an embedded one."
    )
    database_url: str = _opt(
        "", "PostgreSQL DSN. Empty: `runlog up` starts an embedded PostgreSQL."
    )
    embedded_nats_port: int = _opt(4222, "Client port of the embedded nats-server (`runlog up`).")
    embedded_postgres_port: int = _opt(
        55432, "Port of the embedded PostgreSQL (`runlog up`), on 127.0.0.1."
    )
    log_level: str = _opt("info", "Log level: debug, info, warning or error.")
    log_format: str = _opt(
        "text",
        "Log format on stderr: text (one line per record, tracebacks indented) or json "
        "(JSON lines: ts, level, logger, message, exc_info). Client values are escaped in both.",
    )
    # -- append path
    flush_interval_ms: float = _opt(
        2.0,
        "Longest an appended event waits for more events before its batch is committed; "
        "commits start at most this often unless a batch is full or urgent (ms).",
    )
    flush_max_events: int = _opt(
        4000, "Most events committed in one transaction (events); a full batch flushes at once."
    )
    append_flushers: int = _opt(
        2,
        "Most flushes (commit transactions) of one process in flight at once, each on its own "
        "PostgreSQL connection and never two of one session (flushers); more only help when "
        "one flush at a time cannot keep up and PostgreSQL has a core to spare. Keep it below "
        "db_pool_size.",
    )
    max_event_bytes: int = _opt(
        65536, "Largest encoded event accepted (bytes); larger ones get payload_too_large."
    )
    max_pending_events: int = _opt(
        12000,
        "Most events waiting to be committed per process (events); appenders wait past it.",
    )
    publish_retry_max_s: float = _opt(
        5.0, "Longest back-off between retries of a live publish that failed after commit (s)."
    )
    publish_backlog_max: int = _opt(
        10000,
        "Most committed batches waiting to be published (messages); older ones are dropped "
        "and subscribers fill the gap from PostgreSQL.",
    )
    db_pool_size: int = _opt(8, "PostgreSQL connections per process (connections).")
    db_idle_in_transaction_timeout_s: float = _opt(
        10.0,
        "PostgreSQL ends a session of ours that sits in a transaction saying nothing for this "
        "long (a paused or frozen process), releasing its locks (s); below worker_lease_s, so "
        "a paused worker never blocks the worker that takes its runs over.",
    )
    db_retry_s: float = _opt(
        30.0,
        "How long a read is retried while PostgreSQL is unreachable (s); commits ride out "
        "storage_outage_grace_s.",
    )
    storage_outage_grace_s: float = _opt(
        120.0,
        "Longest PostgreSQL outage (or failover) ridden out (s): commits are retried and "
        "workers keep their runs, buffering up to max_pending_events, for this long; past it "
        "their writers fail and the runs are left to a takeover.",
    )
    # -- read path
    position_check_s: float = _opt(
        1.0,
        "How often an idle subscription compares its position with PostgreSQL, to catch a "
        "tail that never arrived live (s).",
    )
    page_max_events: int = _opt(1000, "Most events in one page of a replay (events).")
    live_buffer_max: int = _opt(
        10000,
        "Most live events a subscription holds unread (events); past it, newer live batches "
        "are dropped and the subscription fills the gap from PostgreSQL.",
    )
    # -- JetStream retention (the live feed is short-lived; PostgreSQL keeps the log)
    events_max_age_s: float = _opt(
        3600.0, "Age after which JetStream drops live-feed messages (s)."
    )
    dedupe_window_s: float = _opt(120.0, "JetStream duplicate-detection window (s).")
    # -- operations (see docs/operations.md)
    stream_replicas: int = _opt(
        1,
        "Replicas of each JetStream stream (1, or 3 on a 3-node NATS cluster); applied when a "
        "process starts, so raising it on a running cluster takes one restart.",
    )
    runs_sample_interval_s: float = _opt(
        15.0,
        "How often a process counts unfinished runs by status in PostgreSQL for the "
        "runlog_runs_unfinished gauge (s); 0: off.",
    )

    # -- gateway
    gateway_host: str = _opt("127.0.0.1", "Address the gateway listens on.")
    gateway_port: int = _opt(
        8080,
        "Port the gateway listens on (`runlog up`: the first gateway). 0: a free port, bound "
        "by the gateway itself (by `runlog gateway --processes`, for its processes to share) "
        "and printed on its `gateway listening on` line.",
    )
    gateway_processes: int = _opt(
        1,
        "Gateway processes sharing gateway_port (processes): `runlog gateway` starts this many "
        "children, each a full gateway, and supervises them (`runlog gateway --processes`, "
        "`runlog up --gateway-processes`); the kernel spreads connections over them.",
    )
    gateway_metrics_port: int = _opt(
        0,
        "Port of a gateway process's own /metrics, /healthz and /readyz (on gateway_host): "
        "process k (from 0) of a gateway listens on gateway_metrics_port + k, besides the "
        "shared gateway_port. 0: none for a lone process; for each of gateway_processes > 1, "
        "a free port, bound by the parent and kept for the process across its restarts "
        "(gateway_metrics_fd), printed.",
    )
    gateway_metrics_fd: int = _opt(
        -1,
        "An inherited socket, already bound to gateway_metrics_port, that this gateway "
        "process serves that port's endpoints on: set by its parent (`runlog gateway "
        "--processes`, `runlog up`) when it chose the port, so that no other process can take "
        "it in between. -1: none, the process binds gateway_metrics_port itself.",
    )
    gateway_reuse_port: bool = _opt(
        False,
        "Bind gateway_port with SO_REUSEPORT, sharing it with other gateway processes of the "
        "same user (set for its children by `runlog gateway --processes`); a port held by "
        "another such process is then not port_in_use.",
    )
    public_url: str = _opt(
        "",
        "URL clients reach the gateway at (for links and the Origin allow-list); "
        "empty: http://<gateway_host>:<gateway_port>.",
    )
    gateway_urls: str = _opt(
        "",
        "Comma-separated public URLs of this deployment's gateways: the only ones the web "
        "console may connect to (its failover list is checked against them; served at "
        "GET /v1/config; the page's CSP connect-src). Empty: public_url alone.",
    )
    jwt_secret: str = _opt(
        DEV_JWT_SECRET,
        "HMAC secret for bearer tokens (HS256). The default is public: a gateway refuses it "
        "(and an empty one) unless gateway_host is loopback; `runlog up` generates one per "
        "data folder (<data_dir>/jwt_secret) unless this is set.",
    )
    jwt_issuer: str = _opt("runlog", "Issuer (`iss`) tokens must carry.")
    token_ttl_s: float = _opt(
        3600.0, "Lifetime of tokens minted by `runlog token` (s); at most jwt_max_ttl_s."
    )
    jwt_max_ttl_s: float = _opt(
        86400.0,
        "Longest lifetime (`exp - iat`) a token may have (s): gateways refuse longer ones "
        "and `runlog token` mints none.",
    )
    jwt_leeway_s: float = _opt(
        30.0,
        "Clock skew allowed between a token's issuer and the gateway when `exp` and `iat` "
        "are checked (s).",
    )
    trusted_issuers: str = _opt(
        "",
        "Token issuers trusted besides runlog's own (OIDC providers: Keycloak, Auth0, ...): a "
        "JSON list of issuers, or the path of a .json file holding one or of a .toml file of "
        "[[issuers]] tables. Each: issuer (exact iss), audience (required aud), jwks_url or "
        "keys (inline PEM/JWK public keys), algorithms (of RS256, RS384, RS512, PS256, ES256, "
        "ES384, EdDSA), user_claim (default sub), user_prefix, roles_claim, refresh_s (300), "
        "refetch_cooldown_s (60), fetch_timeout_s (5); see docs/security.md. Empty: only "
        "runlog's own HS256 tokens.",
    )
    allowed_origins: str = _opt(
        "",
        "Comma-separated Origins allowed to open WebSockets, besides the gateway's own; "
        "`*` allows any. Requests without an Origin header (non-browser clients) are allowed.",
    )
    sse_heartbeat_s: float = _opt(15.0, "Longest quiet time on an SSE stream before a comment (s).")
    ws_heartbeat_s: float = _opt(
        15.0,
        "WebSocket ping interval (s); a pong that has not come back within half of it "
        "closes the connection (the client resumes).",
    )
    ws_auth_timeout_s: float = _opt(
        10.0, "How long a WebSocket may stay unauthenticated before it is closed (s)."
    )
    max_message_bytes: int = _opt(65536, "Largest client message or request body accepted (bytes).")
    max_subscriptions: int = _opt(64, "Most subscriptions one WebSocket may hold.")
    control_rate_per_s: float = _opt(
        20.0, "Messages per second a WebSocket may send (burst: twice that)."
    )
    send_queue_max_bytes: int = _opt(
        4 * 1024 * 1024,
        "Per-connection send queue bound (bytes); past it the client is disconnected "
        "with its resume cursor.",
    )
    send_queue_lag_bytes: int = _opt(
        256 * 1024,
        "Queue size past which a connection counts as lagging (bytes): deltas are "
        "coalesced and progress events dropped.",
    )
    disconnect_timeout_s: float = _opt(
        5.0,
        "When the server ends a connection (slow client, drain, expiry...): how long the "
        "client has to read its disconnect message and close, after which the socket is cut (s).",
    )
    hub_linger_s: float = _opt(
        5.0, "How long a gateway keeps following a run or session nobody watches (s)."
    )
    presence_refresh_s: float = _opt(
        5.0,
        "How often a gateway re-announces who watches each session through it (s); "
        "others forget an announcement 3 times this after it was sent, so a crashed "
        "gateway's viewers leave within about 4 times this.",
    )
    access_recheck_s: float = _opt(
        30.0,
        "How often a gateway re-checks, in one query, the roles and token revocations of "
        "the users of its open streams (s): the longest a removed member's stream or a "
        "revoked token's connection outlives a lost control message.",
    )
    # -- fair sharing between users (see docs/operations.md, "Fair sharing")
    max_connections_per_user: int = _opt(
        100,
        "Most WebSocket + SSE connections one user may hold on one gateway (connections); "
        "past it, too_many_connections. 0: no cap.",
    )
    max_connections_per_ip: int = _opt(
        500,
        "Most WebSocket + SSE connections from one client address on one gateway "
        "(connections); past it, too_many_connections. 0: no cap.",
    )
    trusted_proxies: str = _opt(
        "",
        "Comma-separated addresses or networks (CIDR) of reverse proxies whose "
        "X-Forwarded-For names the client address for max_connections_per_ip; empty: the "
        "peer address is the client's.",
    )
    connection_retry_after_s: float = _opt(
        10.0, "The retry hint (retry_after_s, Retry-After) sent with too_many_connections (s)."
    )
    max_concurrent_replays: int = _opt(
        2,
        "Most catch-up replay pages a gateway reads from PostgreSQL and queues at once "
        "(pages); the others wait their turn, round-robin between users. Two overlap one "
        "read with one push (a replay alone reads its next page ahead in a free second "
        "slot); more only help a distant PostgreSQL, and must stay below db_pool_size. "
        "0: no bound.",
    )
    replay_loop_share: float = _opt(
        0.5,
        "While replays wait for turns, the share of time a turn's slot is busy: after a "
        "turn that took t, its slot rests t·(1 - share)/share before the next grant "
        "(fraction); 1 (or anything outside 0-1): no rest.",
    )
    malloc_trim_s: float = _opt(
        5.0,
        "Return freed heap memory to the OS (glibc malloc_trim) this long after a connection "
        "closed, at most once per this interval (s); 0: never.",
    )
    gateway_drain_s: float = _opt(
        10.0, "On SIGTERM, how long a gateway waits for clients to leave before exiting (s)."
    )

    # -- workers (see docs/workers.md)
    agent: str = _opt(
        "",
        "The agent every run executes: a `module:attr` import path to an async callable taking "
        "an AgentContext (docs/agents.md); empty: the built-in loop (model adapter + tools).",
    )
    agent_stop_grace_s: float = _opt(
        5.0,
        "After a stop cancels an agent's task, how long it may take to unwind before the run "
        "is ended aborted anyway (s).",
    )
    agent_max_resumes: int = _opt(
        3,
        "Takeovers a run may have without completing a step in between (a run that kills its "
        "worker each time); past it the run fails with worker_lost (resumes).",
    )
    worker_id: str = _opt("", "This worker's name in run ownership; empty: <host>-<pid>-<random>.")
    worker_concurrency: int = _opt(
        32, "Most runs one worker executes at once (runs); `runlog worker --concurrency` wins."
    )
    worker_lease_s: float = _opt(
        15.0,
        "Run ownership lease, renewed every third of it (s). A worker that is paused or cut off "
        "(its connections open) loses its runs within worker_lease_s + worker_reaper_interval_s; "
        "one whose process died, within about a second (worker_liveness_interval_s).",
    )
    worker_reaper_interval_s: float = _opt(
        2.0, "How often a worker looks for runs whose owner's lease ran out (s)."
    )
    worker_liveness_interval_s: float = _opt(
        0.5,
        "How often a worker looks for runs whose owner died: its liveness lock in PostgreSQL "
        "was released when its connection ended (kill -9, OOM); they are taken over at once, "
        "not after the lease (s).",
    )
    worker_liveness_grace_s: float = _opt(
        5.0,
        "A worker takes over runs of dead owners only once it has held its own liveness lock "
        "this long: after a PostgreSQL restart or failover (which drops every lock) the living "
        "owners take theirs back first (s).",
    )
    worker_stale_queued_s: float = _opt(
        30.0, "A queued run no worker took for this long gets its job sent again (s)."
    )
    worker_user_max_runs: int = _opt(
        0,
        "Most runs one user may have executing at once across all workers (runs; 0: no cap). "
        "Runs parked on an approval do not count. Past it the user's further runs wait "
        "queued, and other users' runs take the free slots.",
    )
    worker_enqueue_retry_s: float = _opt(
        0.5,
        "How long a job waits before it is offered again while an earlier run of its "
        "session is still active (session run policy 'enqueue') (s).",
    )
    worker_metrics_port: int = _opt(
        0,
        "Port of the worker's /metrics and /healthz endpoint (on gateway_host); 0: a free "
        "port, printed on the worker's `ready` line (`runlog up` binds one for each worker, "
        "kept across its restarts (worker_metrics_fd), and prints it).",
    )
    worker_metrics_fd: int = _opt(
        -1,
        "An inherited socket, already bound to worker_metrics_port, that the worker serves "
        "/metrics and /healthz on: set by `runlog up` when it chose the port, so that no "
        "other process can take it in between. -1: none, the worker binds "
        "worker_metrics_port itself.",
    )
    drain_timeout_s: float = _opt(
        20.0,
        "On SIGTERM, how long a worker lets streaming runs finish before ending them with "
        "run_error worker_draining (s).",
    )
    run_timeout_s: float = _opt(
        900.0, "Longest a run may be active, not counting approval waits (s); code run_timeout."
    )
    model_timeout_s: float = _opt(
        300.0,
        "Longest wait for a model's first stream item or between two items (s); "
        "code model_timeout.",
    )
    tool_timeout_s: float = _opt(120.0, "Longest one tool call may run (s); code tool_timeout.")
    approval_timeout_s: float = _opt(
        900.0, "How long an approval stays open before it expires (s)."
    )
    approval_poll_s: float = _opt(
        1.0, "How often a worker waiting for an approval checks PostgreSQL for the decision (s)."
    )
    approval_park_after_s: float = _opt(
        0.0,
        "How long a run waiting for an approval keeps its worker slot before it is parked (s): "
        "a parked run costs a row, not a slot, and the decision, the expiry or a stop wakes it "
        "on any worker (a replay; no model call is repeated). Negative: never parked.",
    )
    max_steps: int = _opt(
        24, "Most model turns in one run (turns); past it the run fails with step_limit."
    )
    model_adapter: str = _opt("scripted", "Model adapter: scripted, openai or anthropic.")
    models: str = _opt(
        "",
        "Models a run may name besides the adapter's default, comma-separated; empty: only "
        "the default. Give gateways and workers the same list (and model_adapter).",
    )
    model_max_tokens: int = _opt(4096, "max_tokens asked of the model per turn (tokens).")
    system_prompt: str = _opt("", "System prompt sent first in every run; empty: none.")
    scripted_tokens_per_s: float = _opt(
        50.0, "Token rate of the scripted demo adapter (tokens/s); 0: as fast as possible."
    )
    scripted_slow_tool_s: float = _opt(
        10.0, "How long search_docs takes when a scripted run's input says `slow tool` (s)."
    )
    openai_base_url: str = _opt(
        "https://api.openai.com/v1",
        "Base URL of an OpenAI-compatible Chat Completions API, with its version path.",
    )
    openai_api_key: str = _opt("", "API key for openai_base_url (sent as a bearer token).")
    openai_model: str = _opt("gpt-4o-mini", "Model name for the openai adapter.")
    anthropic_base_url: str = _opt(
        "https://api.anthropic.com", "Base URL of the Anthropic Messages API."
    )
    anthropic_api_key: str = _opt("", "API key for the anthropic adapter (x-api-key).")
    anthropic_model: str = _opt("claude-sonnet-4-5", "Model name for the anthropic adapter.")
    tools: str = _opt(
        "workers.builtin_tools:TOOLS",
        "Tools the agent may call: comma-separated `module:attr` import paths, each a Tool "
        "or a list of Tools.",
    )
    tool_raw_output: bool = _opt(
        False,
        "Send tools' raw output to clients in tool_result.output; off: the summary only "
        "(the model always gets the raw output).",
    )
    discard_text_before_tools: bool = _opt(
        False,
        "When a turn's text is followed by tool calls, emit message_reset so clients discard "
        "that text.",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if f.name.endswith("_port") and not 0 <= getattr(self, f.name) <= 65535:
                value = str(getattr(self, f.name))
                raise errors.InvalidSetting(f.name, value, "is not a port (0 to 65535)")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None and raw != "":
                values[f.name] = _convert(f, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Every setting as a flag of `parser`, left out of its --help (which
        lists the command's own options and points to `runlog settings`)."""
        for f in dataclasses.fields(cls):
            parser.add_argument(
                "--" + f.name.replace("_", "-"),
                dest=f"setting_{f.name}",
                default=None,
                metavar=f.name.upper(),
                help=argparse.SUPPRESS,
            )

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None
    ) -> Settings:
        overrides = {}
        for f in dataclasses.fields(cls):
            raw = getattr(args, f"setting_{f.name}", None)
            if raw is not None:
                overrides[f.name] = _convert(f, raw)
        return cls.from_env(environ, **overrides)

    @classmethod
    def table(cls) -> list[tuple[str, str, str, str]]:
        """(env var, flag, default, doc) for every setting."""
        return [
            (
                ENV_PREFIX + f.name.upper(),
                "--" + f.name.replace("_", "-"),
                str(f.default),
                f.metadata["doc"],
            )
            for f in dataclasses.fields(cls)
        ]


_MARKDOWN_HEAD = """# Configuration

Every setting of every runlog process, generated from `broker/settings.py` by
`runlog settings --markdown > docs/configuration.md` (a test checks that this
page is current). A setting is read from its environment variable, or from
its flag on the command line (the flag wins); the default applies otherwise.
`runlog up` passes its settings on to the processes it starts.

| variable | flag | default | meaning |
|---|---|---|---|
"""


def markdown() -> str:
    """The settings table as docs/configuration.md holds it."""
    rows = []
    for env, flag, default, doc in Settings.table():
        shown = f"`{default}`" if default else "(empty)"
        rows.append(f"| `{env}` | `{flag}` | {shown} | {doc.replace('|', '/')} |\n")
    return _MARKDOWN_HEAD + "".join(rows)


def _convert(f: dataclasses.Field[Any], raw: str) -> Any:
    typ = f.type if isinstance(f.type, str) else f.type.__name__
    why = {"int": "is not an integer", "float": "is not a number"}.get(typ, "is not true or false")
    try:
        if typ == "int":
            return int(raw)
        if typ == "float":
            return float(raw)
        if typ == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if typ == "Path":
            return Path(raw)
    except ValueError as e:
        raise errors.InvalidSetting(f.name, raw, why) from e
    return raw
