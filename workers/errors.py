"""Stable `run_error` codes a worker emits (see docs/workers.md, "Error codes").

The codes are broker/codes.py's (kind `run`, or a request code that is also
a `run_error`): the worker's own, the model adapters' (`workers.model.ModelError`,
`model_*`, kept as the adapter gave them) and the agent frameworks'. An
agent's own `AgentError` codes are its own and not listed. Code branches on
the class or the code, never on the message, and messages never carry
internals.
"""

from __future__ import annotations

from broker import codes

# Every code a worker may put in run_error, in the registry's order.
ALL_CODES = codes.run_error_codes()
# code -> (retryable, message shown to clients)
CODES: dict[str, tuple[bool, str]] = {
    name: (codes.get(name).retryable, codes.get(name).meaning) for name in ALL_CODES
}


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
