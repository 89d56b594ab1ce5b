"""Test clients for the two seed formats that have no published client, written
from the rules the seeds state (no tests here):

- S0 AgentUiEvent (`useAgentStream`, seed 000): fetch + ReadableStream; the
  buffer is split on blank lines, each frame's first `data:` line is
  JSON-parsed (comments and `id:` lines are skipped as the seed's parser
  skips them); events are merged idempotently by `toolCallId` (a repeated
  `tool_call_start` is the same card, `tool_args_delta` appends).
- S1 Sim agent-events-v1 (`agent-stream-protocol.ts`, seed 001): the frame
  type guards, ported one by one, applied in the order Sim's chat client
  applies them (error, stream_error, thinking, tool, final, chunk_reset,
  chunk); answer text is kept per `blockId` in arrival order and a
  `chunk_reset` drops that block's text; the stream ends with `[DONE]`.

Both keep the cursor of the last frame that carried one (S0: the `seq` in the
JSON; S1: the SSE `id:` line) and, when cut, forget whatever arrived after it
(frames without a seq belong to the next seq-bearing one), so that a resume
from that cursor neither loses nor doubles anything.
"""

from __future__ import annotations

import asyncio
import codecs
import copy
import json
from dataclasses import dataclass, field
from typing import Any

import aiohttp


@dataclass
class Frame:
    data: str
    id: int | None


class Cut(Exception):
    """The test cut the stream (it stopped reading after `cut_after` frames)."""


async def sse_frames(resp: aiohttp.ClientResponse, *, first_data_line_only: bool = False,
                     timeout_s: float = 60, comments: list[str] | None = None) -> Any:  # fmt: skip
    """The frames of an SSE body as a fetch reader sees them: the decoded text
    is buffered and split on "\\n\\n"; comments yield nothing (they are
    appended to `comments`)."""
    buf = ""
    decoder = codecs.getincrementaldecoder("utf-8")()
    async with asyncio.timeout(timeout_s):
        async for chunk in resp.content.iter_any():
            assert b"\r" not in chunk  # LF-only framing
            buf += decoder.decode(chunk)
            *complete, buf = buf.split("\n\n")
            for raw in complete:
                lines = raw.split("\n")
                data = [ln[5:].lstrip() for ln in lines if ln.startswith("data:")]
                ids = [ln[3:].strip() for ln in lines if ln.startswith("id:")]
                if not data:
                    if comments is not None:
                        comments += [ln for ln in lines if ln.startswith(":")]
                    continue  # a heartbeat comment, or `retry:`
                yield Frame(data[0] if first_data_line_only else "\n".join(data),
                            int(ids[-1]) if ids else None)  # fmt: skip


# -- S0: AgentUiEvent


@dataclass
class ToolCard:
    name: str
    risk: str
    args: str = ""
    result: dict[str, Any] | None = None


@dataclass
class AgentUiState:
    run_id: str | None = None
    trace_id: str | None = None
    session_id: str | None = None
    text: dict[str, str] = field(default_factory=dict)  # messageId -> text, in arrival order
    reasoning: dict[str, str] = field(default_factory=dict)
    tools: dict[str, ToolCard] = field(default_factory=dict)  # toolCallId -> card
    approvals: dict[str, dict[str, Any]] = field(default_factory=dict)  # approvalId -> event
    decided: dict[str, str] = field(default_factory=dict)  # approvalId -> decision
    errors: list[dict[str, Any]] = field(default_factory=list)
    status: str | None = None  # run_end's
    seq: int = 0  # the cursor: the last seq applied
    types: list[str] = field(default_factory=list)

    def apply(self, ev: dict[str, Any]) -> None:
        t = ev["type"]
        self.types.append(t)
        if t == "run_start":
            self.run_id, self.trace_id, self.session_id = (
                ev["runId"],
                ev["traceId"],
                ev["sessionId"],
            )
        elif t == "text_delta":
            self.text[ev["messageId"]] = self.text.get(ev["messageId"], "") + ev["delta"]
        elif t == "text_reset":
            self.text.pop(ev["messageId"], None)
        elif t == "reasoning_delta":
            self.reasoning[ev["messageId"]] = self.reasoning.get(ev["messageId"], "") + ev["delta"]
        elif t == "tool_call_start":
            # Idempotent by toolCallId: the same card again, never a second one.
            card = self.tools.setdefault(
                ev["toolCallId"], ToolCard(ev["toolName"], ev["riskLevel"])
            )
            card.name, card.risk = ev["toolName"], ev["riskLevel"]
        elif t == "tool_args_delta":
            self.tools.setdefault(ev["toolCallId"], ToolCard("", "low")).args += ev["partialJson"]
        elif t == "tool_result":
            self.tools.setdefault(ev["toolCallId"], ToolCard("", "low")).result = ev
        elif t == "approval_required":
            self.approvals[ev["approvalId"]] = ev
        elif t == "approval_decided":
            self.decided[ev["approvalId"]] = ev["decision"]
        elif t == "run_error":
            self.errors.append(ev)
        elif t == "run_end":
            self.status = ev["status"]
        # Other types (status, progress, tool_call_end, interrupt_requested): shown, not kept.
        if isinstance(ev.get("seq"), int):
            self.seq = ev["seq"]

    @property
    def all_text(self) -> str:
        return "".join(self.text.values())


class AgentUiClient:
    """One front end: its state survives cuts; each request fills it in."""

    def __init__(self, http: aiohttp.ClientSession, token: str) -> None:
        self.http = http
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.state = AgentUiState()
        self.comments: list[str] = []

    async def start(self, base: str, session_id: str, goal: str, *,
                    cut_after: int | None = None, until: str | None = None) -> int:  # fmt: skip
        async with self.http.post(f"{base}/v1/compat/agent-ui/sessions/{session_id}/runs",
                                  json={"goal": goal, "sessionId": session_id},
                                  headers=self.headers) as resp:  # fmt: skip
            return await self._read(resp, cut_after, until)

    async def resume(self, base: str, run_id: str, *, cut_after: int | None = None,
                     until: str | None = None) -> int:  # fmt: skip
        async with self.http.get(f"{base}/v1/compat/agent-ui/runs/{run_id}/events",
                                 params={"after": str(self.state.seq)},
                                 headers=self.headers) as resp:  # fmt: skip
            return await self._read(resp, cut_after, until)

    async def _read(self, resp: aiohttp.ClientResponse, cut_after: int | None,
                    until: str | None) -> int:  # fmt: skip
        """The response's status; frames applied as they come. `cut_after`:
        stop reading after that many frames (the connection is dropped);
        `until`: stop after the first event of that type."""
        if resp.status != 200:
            return resp.status
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        n = 0
        async for f in sse_frames(resp, first_data_line_only=True, comments=self.comments):
            ev = json.loads(f.data)
            assert ev["runId"] and isinstance(ev["type"], str)
            assert f.id == ev["seq"]  # one frame per event: `id:` and `seq` agree
            self.state.apply(ev)
            n += 1
            if (cut_after is not None and n >= cut_after) or ev["type"] == until:
                resp.close()
                break
        return resp.status


# -- S1: Sim agent-events-v1, the type guards of the seed, ported


def _is_record(v: Any) -> bool:
    return isinstance(v, dict)


TOOL_CALL_END_STATUSES = ("success", "error", "cancelled")


def is_chunk_frame(v: Any) -> bool:
    return (_is_record(v) and isinstance(v.get("blockId"), str)
            and isinstance(v.get("chunk"), str) and len(v["chunk"]) > 0
            and "event" not in v)  # fmt: skip


def is_chunk_reset_frame(v: Any) -> bool:
    return _is_record(v) and v.get("event") == "chunk_reset" and isinstance(v.get("blockId"), str)


def is_thinking_frame(v: Any) -> bool:
    return (_is_record(v) and v.get("event") == "thinking" and isinstance(v.get("blockId"), str)
            and isinstance(v.get("data"), str))  # fmt: skip


def is_tool_frame(v: Any) -> bool:
    return (_is_record(v) and v.get("event") == "tool" and isinstance(v.get("blockId"), str)
            and v.get("phase") in ("start", "end")
            and isinstance(v.get("id"), str) and len(v["id"]) > 0
            and isinstance(v.get("name"), str) and len(v["name"]) > 0
            and ("status" not in v or v["status"] in TOOL_CALL_END_STATUSES))  # fmt: skip


def is_final_frame(v: Any) -> bool:
    return _is_record(v) and v.get("event") == "final" and _is_record(v.get("data"))


def is_error_frame(v: Any) -> bool:
    return _is_record(v) and v.get("event") == "error"


def is_stream_error_frame(v: Any) -> bool:
    return _is_record(v) and v.get("event") == "stream_error"


@dataclass
class SimState:
    blocks: dict[str, str] = field(default_factory=dict)  # blockId -> answer text, arrival order
    thinking: str = ""
    tools: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (blockId, id)
    final: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    done: bool = False  # `[DONE]` seen
    resets: int = 0
    unknown: list[Any] = field(default_factory=list)  # frames no guard accepts: must stay empty
    kinds: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.blocks.values())

    def apply(self, v: Any) -> None:
        """One frame, in the guard order of Sim's chat client."""
        if is_error_frame(v):
            self.kinds.append("error")
            self.error = v
        elif is_stream_error_frame(v):
            self.kinds.append("stream_error")
        elif is_thinking_frame(v):
            self.kinds.append("thinking")
            self.thinking += v["data"]
        elif is_tool_frame(v):
            self.kinds.append("tool")
            key = (v["blockId"], v["id"])
            chip = self.tools.setdefault(key, {"name": v["name"], "phase": v["phase"]})
            chip["phase"] = v["phase"]
            if "status" in v:
                chip["status"] = v["status"]
        elif is_final_frame(v):
            self.kinds.append("final")
            self.final = v["data"]
        elif is_chunk_reset_frame(v):
            self.kinds.append("chunk_reset")
            self.resets += 1
            self.blocks.pop(v["blockId"], None)  # re-registers at the end if it streams again
        elif is_chunk_frame(v):
            self.kinds.append("chunk")
            self.blocks[v["blockId"]] = self.blocks.get(v["blockId"], "") + v["chunk"]
        else:
            self.unknown.append(v)


class SimClient:
    """One Sim chat front end; its state survives cuts (rolled back to the
    last frame with an `id:`), each request fills it in."""

    def __init__(self, http: aiohttp.ClientSession, token: str, *, negotiate: bool = True) -> None:
        self.http = http
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        if negotiate:
            self.headers["X-Sim-Stream-Protocol"] = "agent-events-v1"
        self.state = SimState()
        self.cursor = 0
        self.run_id: str | None = None  # from the chat answer's X-Runlog-Run-Id
        self.comments: list[str] = []
        self._committed = (SimState(), 0)
        self.frames: list[Frame] = []

    async def chat(self, base: str, session_id: str, body: dict[str, Any], *,
                   cut_after: int | None = None) -> tuple[int, Any]:  # fmt: skip
        async with self.http.post(f"{base}/v1/compat/sim/sessions/{session_id}/chat", json=body,
                                  headers=self.headers) as resp:  # fmt: skip
            return await self._read(resp, cut_after)

    async def stream(self, base: str, run_id: str, *, params: dict[str, str] | None = None,
                     cut_after: int | None = None) -> tuple[int, Any]:  # fmt: skip
        q = {"after": str(self.cursor), **(params or {})}
        async with self.http.get(f"{base}/v1/compat/sim/runs/{run_id}/stream", params=q,
                                 headers=self.headers) as resp:  # fmt: skip
            return await self._read(resp, cut_after)

    async def _read(self, resp: aiohttp.ClientResponse, cut_after: int | None) -> tuple[int, Any]:
        """(status, the JSON error body or None)."""
        if resp.status != 200:
            body = await resp.json() if resp.content_type == "application/json" else None
            return resp.status, body
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        self.run_id = resp.headers.get("X-Runlog-Run-Id", self.run_id)
        n = 0
        async for f in sse_frames(resp, comments=self.comments):
            self.frames.append(f)
            n += 1
            if f.data == "[DONE]":
                self.state.done = True
                self._commit(self.cursor)
                break
            self.state.apply(json.loads(f.data))
            if f.id is not None:
                self._commit(f.id)
            if cut_after is not None and n >= cut_after:
                resp.close()
                self._rollback()
                break
        return resp.status, None

    def _commit(self, cursor: int) -> None:
        self.cursor = cursor
        self._committed = (copy.deepcopy(self.state), cursor)

    def _rollback(self) -> None:
        state, self.cursor = self._committed
        self.state = copy.deepcopy(state)


def expected(wires: list[Any], done: bytes | None = None) -> list[tuple[str, int | None]]:
    """A projection's items as these clients record frames: (data, id)."""
    out = [(w.data.decode(), w.seq) for w in wires]
    if done is not None:
        out.append((done.decode().removeprefix("data: ").strip(), None))
    return out


def recorded(frames: list[Frame]) -> list[tuple[str, int | None]]:
    return [(f.data, f.id) for f in frames]


async def native_events(http: aiohttp.ClientSession, base: str, token: str,
                        run_id: str) -> list[dict[str, Any]]:  # fmt: skip
    """The run's stored events through the native REST page."""
    async with http.get(f"{base}/v1/runs/{run_id}/events", params={"after": "0"},
                        headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
        assert r.status == 200, await r.text()
        events: list[dict[str, Any]] = (await r.json())["events"]
        return events


async def decide(http: aiohttp.ClientSession, base: str, token: str, run_id: str,
                 approval_id: str, decision: str) -> tuple[int, dict[str, Any]]:  # fmt: skip
    async with http.post(f"{base}/v1/runs/{run_id}/approvals/{approval_id}",
                         json={"decision": decision},
                         headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
        body: dict[str, Any] = await r.json()
        return r.status, body


async def interrupt(http: aiohttp.ClientSession, base: str, token: str, run_id: str) -> int:
    async with http.post(f"{base}/v1/runs/{run_id}/interrupt", json={"reason": "enough"},
                         headers={"Authorization": f"Bearer {token}"}) as r:  # fmt: skip
        return r.status
