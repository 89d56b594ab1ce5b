"""Errors of the log, split by whose fault (client, storage, internal).

Every error a client can see carries a stable `code`, registered with its
HTTP status and `retryable` flag in broker/codes.py (the one table; see
`docs/protocol.md`, "Error codes"): a class names its code, and takes its
status and flag from there. Code branches on the class or the code, never
on the text.
"""

from __future__ import annotations

from . import codes


class RunlogError(Exception):
    """Base class. `code` is stable and documented; `retryable` tells a client
    whether the same request may succeed later unchanged. Both, and
    `http_status`, come from the code's entry in broker/codes.py."""

    code = "internal"
    retryable = codes.get("internal").retryable
    http_status = 500

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        entry = codes.CODES.get(cls.code)
        if entry is not None:  # an unregistered code fails tests/test_error_registry.py
            cls.retryable = entry.retryable
            if entry.http is not None:
                cls.http_status = entry.http

    def __init__(
        self, detail: str = "", *, hint: str = "", extra: dict[str, object] | None = None
    ) -> None:
        super().__init__(detail or self.code)
        self.detail = detail or self.code
        self.hint = hint
        self.extra = extra or {}

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "code": self.code,
            "message": self.detail,
            "retryable": self.retryable,
        }
        if self.hint:
            out["hint"] = self.hint
        out.update(self.extra)
        return out


# -- client errors: the request is wrong; retrying it unchanged will not help.


class ClientError(RunlogError):
    code = "bad_request"


class InvalidRequest(ClientError):
    """A request's body, query or field is not what the endpoint takes (REST
    and every compat format)."""

    code = "invalid_request"


class InvalidEvent(ClientError):
    code = "invalid_event"


class UnknownEventType(InvalidEvent):
    code = "unknown_event_type"


class PayloadTooLarge(ClientError):
    code = "payload_too_large"


class UriTooLong(ClientError):
    """The request line (method, path and query) is longer than the gateway reads."""

    code = "uri_too_long"


class HeadersTooLarge(ClientError):
    """A request header (or a chunk-size line) is longer than the gateway reads."""

    code = "headers_too_large"


class InvalidCursor(ClientError):
    code = "invalid_cursor"


class NotFound(ClientError):
    code = "not_found"


class RunNotFound(NotFound):
    code = "run_not_found"


class SessionNotFound(NotFound):
    code = "session_not_found"


class Conflict(ClientError):
    code = "conflict"


class RunEnded(Conflict):
    """An append to a run that already has `run_end`."""

    code = "run_ended"


class MemberNotFound(NotFound):
    """The user named is not a member of the session (remove / change role)."""

    code = "member_not_found"


class LastOwner(Conflict):
    """The change would leave the session without an owner: the last owner
    can be neither removed nor demoted (make another member owner first)."""

    code = "last_owner"


class ApprovalNotFound(NotFound):
    code = "approval_not_found"


class ApprovalConflict(Conflict):
    """A different decision was already stored; `stored` carries it."""

    code = "approval_conflict"


class ApprovalStale(Conflict):
    """The decision was made for a tool call the approval no longer guards
    (the digest the approver saw differs); `call_digest` carries the current one."""

    code = "approval_stale"


class ApprovalExpired(ClientError):
    code = "approval_expired"


class ModelNotAllowed(ClientError):
    """A run asked for a model outside the allow-list (broker/models.py)."""

    code = "model_not_allowed"


class RunBusy(Conflict):
    """The session already has a running run and its policy is 'reject'."""

    code = "run_busy"


class SessionArchived(Conflict):
    """The session is archived: it takes no new run until an owner unarchives it."""

    code = "session_archived"


class Unauthorized(ClientError):
    """No valid credentials: re-authenticate."""

    code = "unauthorized"


class TokenExpired(Unauthorized):
    code = "token_expired"


class TokenRevoked(Unauthorized):
    """The token was issued before its user's tokens were revoked (`runlog revoke`)."""

    code = "token_revoked"


class TokenTtlTooLong(ClientError):
    """A token asked for with a lifetime over jwt_max_ttl_s (gateways would refuse it)."""

    code = "token_ttl_too_long"


class Forbidden(ClientError):
    """Authenticated, but the role does not allow this."""

    code = "forbidden"


class NotAMember(Forbidden):
    code = "not_a_member"


class StaleEpoch(Conflict):
    """The writer lost ownership of the run: another worker took it over with a
    higher epoch. Nothing was appended. The writer must stop writing this run."""

    code = "stale_epoch"


# -- quota errors: the client asked for more than its share; the same request
# works later, once it holds less (`retry_after_s` says when to try).


class TooManyConnections(RunlogError):
    """A per-user or per-address connection cap of this gateway is reached."""

    code = "too_many_connections"


# -- storage errors: a dependency failed; the same request may work later.


class StorageError(RunlogError):
    code = "storage_unavailable"


class ServerDraining(RunlogError):
    """This process is shutting down: the same request works on another one."""

    code = "server_draining"


class BusUnavailable(StorageError):
    code = "bus_unavailable"


class PortInUse(ClientError):
    """A port this process must listen on is taken: the deployment's fault, told
    in one line with the setting that moves it (`runlog` exits 2)."""

    code = "port_in_use"

    def __init__(self, port: int, what: str, setting: str) -> None:
        env, flag = "RUNLOG_" + setting.upper(), "--" + setting.replace("_", "-")
        super().__init__(f"port {port} is in use ({what}); stop what uses it or set {env} / {flag}")


class InvalidSetting(ClientError):
    """A setting's value cannot be used: the deployment's fault, told in one line
    naming the setting (`runlog` exits 2) before the process serves anything."""

    code = "invalid_setting"

    def __init__(self, setting: str, value: str, why: str) -> None:
        env, flag = "RUNLOG_" + setting.upper(), "--" + setting.replace("_", "-")
        super().__init__(f"{env} / {flag}: {value!r} {why}")


class InsecureSecret(ClientError):
    """The deployment would accept tokens anyone can mint (the public default
    jwt_secret, or an empty one, on a non-loopback address): told in one line
    with the setting to set (`runlog` exits 2)."""

    code = "insecure_secret"


class MigrationError(RunlogError):
    code = "migration_failed"


class BadAgent(RunlogError):
    """The `agent` setting names nothing that can be imported and called."""

    code = "bad_agent"


class MigrationChecksumMismatch(MigrationError):
    code = "migration_checksum_mismatch"


# -- internal: a bug; logged with its trace, never shown with it.


class InternalError(RunlogError):
    code = "internal"


class DatabaseError(InternalError):
    """PostgreSQL refused a statement of the store (a constraint, a schema older
    than this version: not an outage, which is StorageError). Raised from
    asyncpg's error; its detail names the class and SQLSTATE, never the text."""
