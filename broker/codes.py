"""Every error and disconnect code runlog can send, defined once.

A code is a stable string a client branches on (never the message). Each has
its HTTP status (`http`, None where it is no HTTP answer: a WebSocket reply,
a CLI refusal, a run's `run_error`), `retryable` (the same request, or the
same run, may succeed later unchanged: a client may repeat it with backoff),
whose fault it is (`client`: the request or the deployment's configuration,
`server`: runlog or its PostgreSQL/NATS, `upstream`: a model provider or a
remote agent), and a one-line meaning. A code that ends a connection also has
its WebSocket close code and `reconnect`:

  resume  reconnect (to any gateway) with the cursors it has; nothing is lost
  reauth  get a fresh token, then reconnect and resume
  stop    do not reconnect; fix the request first

`kind` says where a code is sent: `request` (the answer to a request: REST,
SSE before its stream, a WebSocket `error` reply), `disconnect` (only ever
the reason a connection ends), `process` (a CLI command or a process at
start, exit 2), `run` (a `run_error` a worker emits: its own codes, then the
model adapters' and the agent frameworks'; `AgentError` codes an agent
chooses are its own and are not listed), `projection` (a compat format's
own code). A `request` code may also end a connection (`close`), and may
also be a `run_error` code (`run_error`).

Everything that answers takes its codes from here: broker/errors.py's
classes, the gateway's error bodies and aiohttp's refusals
(gateway/error_answer.py, gateway/_aio.py), the disconnect codes
(gateway/disconnect.py), the compat formats, the workers' `run_error` codes
(workers/errors.py) and the error metric's label set. docs/protocol.md's
error tables are rendered by `markdown()` (`python -m broker.codes --write
docs/protocol.md`); tests/test_error_registry.py fails on drift.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Literal

import msgspec

Fault = Literal["client", "server", "upstream"]
Kind = Literal["request", "disconnect", "process", "run", "projection"]
Reconnect = Literal["resume", "reauth", "stop"]


class Code(msgspec.Struct, frozen=True, gc=False):
    kind: Kind
    http: int | None
    retryable: bool
    fault: Fault
    meaning: str
    # What to do, after "yes"/"no" in the docs' retry column ("" for nothing).
    advice: str = ""
    close: int | None = None
    reconnect: Reconnect | None = None
    # The message of its `disconnect` (WebSocket and SSE), when not `meaning`.
    on_close: str = ""
    run_error: bool = False


def _req(http: int | None, retryable: bool, fault: Fault, meaning: str, advice: str = "",
         **kw: object) -> Code:  # fmt: skip
    return Code("request", http, retryable, fault, meaning, advice, **kw)  # type: ignore[arg-type]


def _run(retryable: bool, fault: Fault, meaning: str) -> Code:
    return Code("run", None, retryable, fault, meaning)


def _proc(meaning: str, advice: str = "") -> Code:
    return Code("process", None, False, "client", meaning, advice)


CODES: dict[str, Code] = {
    # -- the answer to a request (REST, SSE, WebSocket)
    "bad_request": _req(
        400, False, "client",
        "the request is not allowed as sent; also a request that is not valid HTTP/1.1 (bad "
        "`Content-Length` or chunk size, invalid method, URL or header, too many headers, TLS "
        "sent to the HTTP port)",
    ),
    "uri_too_long": _req(
        414, False, "client", "the request line (method, path and query) is over 8190 bytes"
    ),
    "headers_too_large": _req(
        431, False, "client", "a header line (or a chunk-size line) is over 8192 bytes"
    ),
    "method_not_allowed": _req(
        405, False, "client",
        "the path does not take this method; the `Allow` header lists those it takes",
    ),
    "invalid_request": _req(
        400, False, "client",
        "the body is not valid JSON of the expected shape, a text field has a NUL, a `user_id` "
        "is not a user id, `limit` is not 1..`page_max_events` in ASCII digits, or the session "
        "list's `q` / `archived` is not as described (see \"Input rules\")",
    ),
    "invalid_message": _req(
        None, False, "client", "WebSocket message malformed / wrong field types"
    ),
    "unknown_message_type": _req(None, False, "client", "WebSocket message type unknown"),
    "message_too_large": _req(None, False, "client", "WebSocket message over the limit"),
    "payload_too_large": _req(413, False, "client", "body over the limit"),
    "invalid_cursor": _req(
        400, False, "client",
        "not a non-negative integer in ASCII digits, or past the head; for the session list, a "
        "`before` that is not a `next_before`",
        "resume from a cursor the stream gave",
    ),
    "invalid_event": _req(
        400, False, "client", "an event that does not fit the contract (append path)"
    ),
    "unknown_event_type": _req(
        400, False, "client", "an event of a type the contract does not have (append path)"
    ),
    "unauthorized": _req(
        401, False, "client",
        "missing or invalid token (bad signature or issuer, no `iat`, issued in the future, "
        "lifetime over `jwt_max_ttl_s`), or `?access_token=` where it is not accepted",
        "re-authenticate (with the header)", close=4401, reconnect="reauth",
        on_close="missing or invalid token",
    ),
    "token_expired": _req(
        401, False, "client", "the token expired (past `exp + jwt_leeway_s`)",
        "re-authenticate", close=4402, reconnect="reauth",
        on_close="the token expired during the connection",
    ),
    "token_revoked": _req(
        401, False, "client",
        "the token was issued before its user's tokens were revoked (`runlog revoke`)",
        "with a new token (issued after the revocation)", close=4409, reconnect="reauth",
        on_close="the user's tokens were revoked: get a new token",
    ),
    "model_not_allowed": _req(
        400, False, "client", "the run's `model` is not in the allow-list", run_error=True
    ),
    "forbidden": _req(
        403, False, "client", "the role does not allow it, or bad Origin", close=4403,
        reconnect="stop",
        on_close="not allowed: bad Origin, or your access to the session was removed or lowered "
        "(subscribe again if your role still lets you read)",
    ),
    "stream_protocol_required": _req(
        400, False, "client",
        "(Sim agent-events-v1) thinking or tool frames asked for without "
        "`X-Sim-Stream-Protocol: agent-events-v1`",
        "negotiate, or do not ask",
    ),
    "frames_not_allowed": _req(
        403, False, "client",
        "(Sim agent-events-v1) frames asked for that the session's `include_thinking` / "
        "`include_tool_calls` does not allow",
        "an owner may change the policy",
    ),
    "not_a_member": _req(
        403, False, "client",
        "not a member of the session (or no such session, run or approval, or a malformed id)",
    ),
    "not_found": _req(404, False, "client", "no such resource"),
    "run_not_found": _req(404, False, "client", "no such run"),
    "session_not_found": _req(404, False, "client", "no such session"),
    "approval_not_found": _req(
        404, False, "client", "no such approval in this run (for a member of its session)"
    ),
    "member_not_found": _req(
        404, False, "client",
        "removing or changing the role of a user who is not a member",
    ),
    "conflict": _req(409, False, "client", "e.g. already subscribed"),
    "last_owner": _req(
        409, False, "client", "the change would leave the session without an owner",
        "make another member owner first",
    ),
    "approval_conflict": _req(
        409, False, "client", "a different decision was stored first (`stored` carries it)"
    ),
    "approval_stale": _req(
        409, False, "client",
        "the decision's `call_digest` is not the call the approval guards (the approver saw "
        "another call); the error carries the approval's `call_digest`; nothing is stored",
        "show the approval's call again",
    ),
    # Not retryable: repeating the start until it passes would turn the
    # owner's `reject` policy into `enqueue` on the client's side.
    "run_busy": _req(
        409, False, "client", "session policy `reject` and a run is in progress",
        "start it once the run has ended (or interrupt that one)",
    ),
    "session_archived": _req(
        409, False, "client", "the session is archived: it takes no new run",
        "an owner may unarchive it",
    ),
    "run_ended": _req(
        409, False, "client", "the run has ended (an interrupt, a decision or an append too late)"
    ),
    "stale_epoch": _req(409, False, "client", "(workers) ownership lost; nothing appended"),
    "approval_expired": _req(410, False, "client", "decided too late"),
    "too_many_connections": _req(
        429, True, "client",
        "this user (`max_connections_per_user`, 100) or client address "
        "(`max_connections_per_ip`, 500) already holds that many WebSocket + SSE connections on "
        "this gateway; the error carries `retry_after_s`, the response a `Retry-After` header",
        "after `retry_after_s`, or after closing a connection", close=4429, reconnect="resume",
        on_close="too many connections for this user or address; retry after retry_after_s",
    ),
    "client_gone": _req(
        499, True, "client",
        "the client closed the connection before the answer was written (logged and counted, "
        "never read: nobody is there)",
    ),
    "storage_unavailable": _req(
        503, True, "server",
        "PostgreSQL unreachable (any storage failure, on every endpoint and message)",
        'with backoff, from your cursor (see "PostgreSQL outages")', close=4002,
        reconnect="resume", on_close="PostgreSQL unreachable for too long",
    ),
    "server_draining": _req(
        503, True, "server", "this gateway is shutting down: connect to another", "elsewhere",
        close=4000, reconnect="resume",
        on_close="this gateway is shutting down",
    ),
    "bus_unavailable": _req(503, True, "server", "NATS unreachable"),
    # Retryable: an unexpected error is most often one request's bad luck (a
    # race, a process in a bad state that another gateway is not in), so one
    # retry with backoff of an idempotent request is worth it; streams resume.
    "internal": _req(
        500, True, "server", "a bug; no internals are shown", "with backoff", close=4500,
        reconnect="resume", on_close="unexpected server error; back off, then resume",
        run_error=True,
    ),
    # -- only the reason a connection ends
    "slow_consumer": Code(
        "disconnect", None, True, "client", "the client read too slowly; its queue overflowed",
        close=4001, reconnect="resume",
    ),
    "auth_timeout": Code(
        "disconnect", None, False, "client", "no auth message in time", close=4408,
        reconnect="reauth",
    ),
    "rate_limited": Code(
        "disconnect", None, True, "client", "far too many messages; back off, then resume",
        close=4429,
        reconnect="resume",
    ),
    "protocol_error": Code(
        "disconnect", None, False, "client", "binary frames or repeated malformed messages",
        close=4400, reconnect="stop",
    ),
    # -- a CLI command or a process at start (one line, exit 2)
    "token_ttl_too_long": _proc("(`runlog token`) a lifetime over `jwt_max_ttl_s` was asked for"),
    "insecure_secret": _proc(
        "(`runlog gateway`, exit 2) the public default or an empty `jwt_secret` on a "
        "non-loopback `gateway_host`",
        "set `RUNLOG_JWT_SECRET`",
    ),
    "port_in_use": _proc("a port the process must listen on is taken", "move it with the setting named"),
    "invalid_setting": _proc("a setting's value cannot be used (the setting is named)"),
    "bad_agent": _proc("the `agent` setting names nothing that can be imported and called"),
    "migration_failed": _proc("a migration failed (`runlog migrate`)"),
    "migration_checksum_mismatch": _proc(
        "an applied migration's file changed since it was applied (`runlog migrate`)"
    ),
    # -- run_error: the worker's own codes
    "worker_lost": _run(
        True, "server", "the worker running this run stopped; it was ended by another worker"
    ),
    "worker_draining": _run(
        True, "server", "the worker running this run shut down before it finished"
    ),
    "run_timeout": _run(False, "client", "the run took longer than its time limit"),
    "tool_timeout": _run(True, "server", "a tool took longer than its time limit"),
    "tool_interrupted": _run(
        False, "server", "a tool that must not run twice was running when its worker stopped"
    ),
    "step_limit": _run(False, "client", "the run reached its limit of model turns"),
    "agent_error": _run(False, "server", "the agent failed"),
    "agent_nondeterministic": _run(
        False, "server",
        "the agent called other steps on a replay than the log holds; it cannot be resumed",
    ),
    "step_interrupted": _run(
        False, "server", "the worker stopped while a step that must not run twice was running"
    ),
    # -- run_error: the model adapters' (workers.model.ModelError; the
    # retryable flag here is the usual one, an adapter may say otherwise)
    "model_unavailable": _run(True, "upstream", "the model provider cannot be reached (or 5xx)"),
    "model_rate_limited": _run(True, "upstream", "the model provider rate-limited the call (429)"),
    "model_overloaded": _run(True, "upstream", "the model provider says it is overloaded"),
    "model_timeout": _run(True, "upstream", "the model sent nothing for too long"),
    "model_auth": _run(False, "upstream", "the model provider refused the key (401/403)"),
    "model_bad_request": _run(False, "upstream", "the model provider refused the request (4xx)"),
    "model_stream_error": _run(True, "upstream", "an error event inside the model's stream"),
    "model_malformed": _run(
        True, "upstream", "a model chunk that cannot be parsed, or a stream that ended early"
    ),
    # -- run_error: the agent frameworks' (workers/frameworks, docs/agents.md)
    "model_error": _run(False, "upstream", "the model provider answered an error status"),
    "model_behavior_error": _run(False, "upstream", "the model's output could not be used"),
    "model_content_filter": _run(False, "upstream", "the provider's content filter stopped it"),
    "agent_misconfigured": _run(False, "server", "the agent is misconfigured"),
    "agent_state_incompatible": _run(
        False, "server", "the agent's stored state does not fit the agent any more"
    ),
    "agent_cancelled": _run(False, "server", "the agent cancelled its run"),
    "agents_sdk_error": _run(False, "server", "the OpenAI Agents SDK failed"),
    "pydantic_ai_error": _run(False, "server", "Pydantic AI failed"),
    "max_turns_exceeded": _run(False, "client", "the agent reached its limit of turns"),
    "usage_limit": _run(False, "client", "the agent reached its usage limit"),
    "guardrail_tripped": _run(False, "client", "a guardrail of the agent stopped it"),
    "deferred_call_unsupported": _run(
        False, "server", "a tool deferred its call for external execution; only approvals resume"
    ),
    "graph_error": _run(False, "server", "the LangGraph graph raised"),
    "graph_recursion_limit": _run(False, "server", "the graph reached its recursion limit"),
    "checkpoint_unavailable": _run(True, "server", "the graph's checkpoints cannot be reached"),
    "upstream_not_configured": _run(
        False, "server", "no upstream URL (RUNLOG_AGUI_URL) or bad headers"
    ),
    "upstream_unavailable": _run(True, "upstream", "cannot connect, connection lost, or HTTP 5xx"),
    "upstream_timeout": _run(True, "upstream", "nothing from the upstream within model_timeout_s"),
    "upstream_auth": _run(False, "upstream", "HTTP 401/403"),
    "upstream_rate_limited": _run(True, "upstream", "HTTP 429"),
    "upstream_bad_request": _run(False, "upstream", "another HTTP 3xx/4xx"),
    "upstream_bad_response": _run(
        True, "upstream", "not an event stream, or an event that is not AG-UI 1.0"
    ),
    "upstream_incomplete": _run(
        True, "upstream", "the stream ended without RUN_FINISHED or RUN_ERROR"
    ),
    "upstream_error": _run(False, "upstream", "the upstream answered RUN_ERROR"),
    # -- a compat format's own
    "run_failed": Code(
        "projection", None, False, "server",
        "(AG-UI RUN_ERROR) the run ended failed; its run_error, if any, came before",
    ),
}  # fmt: skip


def get(code: str) -> Code:
    """The registered code (KeyError for one that is not: a bug)."""
    return CODES[code]


def body(code: str, message: str = "", **extra: object) -> dict[str, object]:
    """The error object of `code`: `{"code", "message", "retryable", ...}`."""
    return {"code": code, "message": message or code, "retryable": CODES[code].retryable, **extra}


def http_code(status: int) -> str:
    """The generic code of an HTTP error status aiohttp raised itself
    (`bad_request` for a status no generic code has)."""
    return _BY_STATUS.get(status, "bad_request")


_BY_STATUS = {
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    414: "uri_too_long",
    431: "headers_too_large",
}


def run_error_codes() -> tuple[str, ...]:
    """Every code a worker may put in `run_error`, in registry order."""
    return tuple(c for c, v in CODES.items() if v.kind == "run" or v.run_error)


def disconnect_codes() -> tuple[str, ...]:
    """Every code that ends a connection (it has a WebSocket close code)."""
    return tuple(c for c, v in CODES.items() if v.close is not None)


# -- docs/protocol.md's tables

BEGIN = "<!-- error codes: generated by `python -m broker.codes --write docs/protocol.md` -->"
END = "<!-- end of error codes -->"
_DISCONNECT_BEGIN = (
    "<!-- disconnect codes: generated by `python -m broker.codes --write docs/protocol.md` -->"
)
_DISCONNECT_END = "<!-- end of disconnect codes -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def errors_table() -> str:
    """Every code a client or an operator is answered with (not run_error's)."""
    lines = ["| code | HTTP | fault | meaning | retry? |", "|---|---|---|---|---|"]
    for name, c in CODES.items():
        if c.kind not in ("request", "process"):
            continue
        retry = ("yes" if c.retryable else "no") + (f": {c.advice}" if c.advice else "")
        http = str(c.http) if c.http is not None else "\u2013"  # an en dash: none
        lines.append(f"| `{name}` | {http} | {c.fault} | {_cell(c.meaning)} | {_cell(retry)} |")
    return "\n".join(lines) + "\n"


def disconnect_table() -> str:
    lines = ["| code | WebSocket close | reconnect | meaning |", "|---|---|---|---|"]
    for name in sorted(disconnect_codes(), key=lambda n: CODES[n].close or 0):
        c = CODES[name]
        meaning = c.on_close or c.meaning
        lines.append(f"| `{name}` | {c.close} | {c.reconnect} | {_cell(meaning)} |")
    return "\n".join(lines) + "\n"


def _section(text: str, begin: str, end: str, table: str) -> str:
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"the document has no {begin!r} … {end!r} section")
    return pattern.sub(lambda _: f"{begin}\n\n{table}\n{end}", text, count=1)


def markdown(text: str) -> str:
    """`text` (docs/protocol.md) with its two generated tables current."""
    text = _section(text, BEGIN, END, errors_table())
    return _section(text, _DISCONNECT_BEGIN, _DISCONNECT_END, disconnect_table())


def main(argv: list[str]) -> int:
    """`python -m broker.codes`: print both tables; `--write PATH`: bring
    PATH's generated sections up to date."""
    if argv[:1] == ["--write"] and len(argv) == 2:
        path = Path(argv[1])
        path.write_text(markdown(path.read_text()))
        return 0
    if argv:
        print("usage: python -m broker.codes [--write docs/protocol.md]", file=sys.stderr)
        return 2
    sys.stdout.write(errors_table() + "\n" + disconnect_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
