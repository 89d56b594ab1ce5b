"""`runlog tail RUN_ID [--after N]`: print a run's events live, readably.

Text and reasoning stream inline (reasoning dimmed), everything else gets a
line of its own with its seq. Ends after `run_end`; resumes by itself across
gateway restarts (see runlog.client).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from .client import Client

_DIM, _BOLD, _RESET = "\x1b[2m", "\x1b[1m", "\x1b[0m"


class Printer:
    def __init__(self, out: TextIO, color: bool) -> None:
        self.out = out
        self.color = color
        self.inline: str | None = None  # the stream a partial line belongs to

    def _style(self, text: str, style: str) -> str:
        return f"{style}{text}{_RESET}" if self.color else text

    def _line(self, seq: int, text: str) -> None:
        if self.inline is not None:
            self.out.write("\n")
            self.inline = None
        self.out.write(f"{self._style(f'#{seq:<5}', _DIM)} {text}\n")

    def event(self, seq: int, ev: dict[str, Any]) -> None:
        t = ev.get("type")
        if t in ("text_delta", "reasoning_delta"):
            key = f"{t}:{ev.get('message_id')}"
            if self.inline != key:
                label = "assistant" if t == "text_delta" else "thinking"
                self._line(seq, self._style(label + ":", _BOLD))
                self.inline = key
            delta = str(ev.get("delta", ""))
            self.out.write(self._style(delta, _DIM) if t == "reasoning_delta" else delta)
        elif t == "tool_args_delta":
            return  # shown whole at tool_call_end would need state; keep the stream quiet
        elif t == "run_start":
            self._line(seq, f"run started by {ev.get('started_by')} (model {ev.get('model')})")
        elif t == "status":
            self._line(seq, f"[{ev.get('code')}] {ev.get('summary', '')}")
        elif t == "progress":
            self._line(seq, f"{ev.get('label')}: {ev.get('done')}/{ev.get('total')}")
        elif t == "tool_call_start":
            self._line(seq, f"tool {ev.get('tool_name')} ({ev.get('risk_level')} risk) called")
        elif t == "tool_call_end":
            pass
        elif t == "tool_result":
            self._line(seq, f"tool result: {ev.get('status')} — {ev.get('summary', '')}")
        elif t == "approval_required":
            self._line(seq, self._style(f"APPROVAL NEEDED {ev.get('approval_id')}: "
                                        f"{ev.get('summary', '')}", _BOLD))  # fmt: skip
        elif t == "approval_decided":
            self._line(seq, f"approval {ev.get('decision')} by {ev.get('decided_by')}")
        elif t == "interrupt_requested":
            self._line(seq, f"stop requested by {ev.get('requested_by')}: {ev.get('reason', '')}")
        elif t == "run_error":
            self._line(seq, f"error {ev.get('code')}: {ev.get('message', '')}")
        elif t == "run_end":
            usage = ev.get("usage") or {}
            tokens = f" ({usage.get('output_tokens', 0)} output tokens)" if usage else ""
            self._line(seq, self._style(f"run ended: {ev.get('status')}{tokens}", _BOLD))
        else:
            self._line(seq, str(t))
        self.out.flush()


async def tail(base_urls: list[str], token: str, run_id: str, after: int) -> None:
    printer = Printer(sys.stdout, sys.stdout.isatty())
    # A few tries of each gateway before the first subscription (one that is
    # restarting answers within them); patient resumes after it.
    async with Client(base_urls, token, max_first_attempts=5 * len(base_urls)) as c:
        async for item in c.follow(run_id=run_id, after=after):
            printer.event(item.cursor, item.event)
