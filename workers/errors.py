"""Stable `run_error` codes a worker emits (see docs/workers.md, "Error codes").

Model failures keep the code their adapter gave (`workers.model.ModelError`,
`model_*`). The codes below are the worker's own. Code branches on the class
or the code, never on the message, and messages never carry internals.
"""

from __future__ import annotations

# code -> (retryable, message shown to clients)
CODES: dict[str, tuple[bool, str]] = {
    "worker_lost": (True, "the worker running this run stopped; it was ended by another worker"),
    "worker_draining": (True, "the worker running this run shut down before it finished"),
    "run_timeout": (False, "the run took longer than its time limit"),
    "model_timeout": (True, "the model sent nothing for too long"),
    "tool_timeout": (True, "a tool took longer than its time limit"),
    "tool_interrupted": (
        False,
        "a tool that must not run twice was running when its worker stopped",
    ),
    "step_limit": (False, "the run reached its limit of model turns"),
    "model_not_allowed": (False, "the model this run asked for is not allowed here"),
    "internal": (True, "internal error in the worker"),
    # Agents written against workers.api (docs/agents.md):
    "agent_error": (False, "the agent failed"),
    "agent_nondeterministic": (
        False,
        "the agent called other steps on a replay than the log holds; it cannot be resumed",
    ),
    "step_interrupted": (
        False,
        "the worker stopped while a step that must not run twice was running",
    ),
}

# Every code a worker may put in run_error: its own, then the adapters'.
MODEL_CODES = (
    "model_unavailable",
    "model_rate_limited",
    "model_overloaded",
    "model_timeout",
    "model_auth",
    "model_bad_request",
    "model_stream_error",
    "model_malformed",
)
ALL_CODES = tuple(dict.fromkeys((*CODES, *MODEL_CODES)))


class RunFailure(Exception):
    """Ends the run with run_error(code) + run_end(failed)."""

    def __init__(self, code: str, message: str = "", *, retryable: bool | None = None) -> None:
        default_retryable, default_message = CODES.get(code, (False, code))
        super().__init__(code)
        self.code = code
        self.message = message or default_message
        self.retryable = default_retryable if retryable is None else retryable


class ToolError(Exception):
    """Raised by a tool for a failure whose message is safe to show to clients;
    it becomes tool_result(status "error", summary=message) and the run goes on."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
