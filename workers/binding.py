"""What an approval is bound to: the digest of the tool call it guards.

An approver decides on what they were shown: the tool's name and its
complete argument text, as the log stores them (the `tool_call_start` name
and the `tool_args_delta` pieces joined), or, for an approval that guards no
tool call, its summary. The digest of that is stored with the approval
(`approvals.call_digest`, `approval_required.call_digest`), and:

- a replay after a takeover applies the stored decision only when the call
  the agent produces again has the same digest; another one fails the run
  `agent_nondeterministic` before anything runs (`workers/durable.py`, for
  every agent, the built-in loop included);
- a decision request may carry the digest the approver saw; if the approval
  now guards something else, it gets 409 `approval_stale` (`broker/approvals.py`).
"""

from __future__ import annotations

import hashlib

import msgspec


def call_digest(tool_name: str, arguments: str) -> str:
    """The digest of a tool call: name and complete argument text."""
    return hashlib.sha256(msgspec.json.encode(["tool_call", tool_name, arguments])).hexdigest()


def summary_digest(summary: str) -> str:
    """The digest of an approval that guards no tool call: its summary."""
    return hashlib.sha256(msgspec.json.encode(["summary", summary])).hexdigest()


class Calls:
    """The tool calls a run's agent emitted in this execution, by id: what a
    digest is computed from."""

    def __init__(self) -> None:
        self._name: dict[str, str] = {}
        self._args: dict[str, list[str]] = {}

    def start(self, call_id: str, tool_name: str) -> None:
        self._name[call_id] = tool_name
        self._args[call_id] = []

    def args(self, call_id: str, partial_json: str) -> None:
        self._args.setdefault(call_id, []).append(partial_json)

    def digest(self, call_id: str) -> str | None:
        """The call's digest, or None if this execution did not emit it."""
        if call_id not in self._name:
            return None
        return call_digest(self._name[call_id], "".join(self._args[call_id]))
