"""What a takeover does with the dead owner's in-flight work: the tail.

A run is durable up to its last stored step (`durable.py`; every agent,
the built-in loop included), which records the seq the log ended at. Whatever the old owner appended after that seq — the tail
— is work in flight when it died. The new owner repeats that work, so the
tail is retracted first, with events clients already handle:

- a message with text or reasoning deltas in the tail → `message_reset`;
- a tool card opened in the tail → `tool_result` skipped ("retracted").

`status` and `progress` lines stay (they said something true at the time).
A tail holding anything else cannot be retracted: a `tool_result` means a
tool ran (and must not run twice), an approval event means a decision was
asked for or taken outside the step that records it. Such a run is not
resumed: it fails `worker_lost`.
"""

from __future__ import annotations

from broker import events
from broker.backend import RunLog, RunStore

# Events a tail may hold (retracted or left as they are); run_start is kept.
_RETRACTABLE = (
    events.RunStart,
    events.TextDelta,
    events.ReasoningDelta,
    events.MessageReset,
    events.Status,
    events.Progress,
    events.ToolCallStart,
    events.ToolArgsDelta,
    events.ToolCallEnd,
)

_PAGE = 1000
RETRACTED = "retracted: the worker running it stopped; the call is made again"


async def read_tail(store: RunStore, run_id: str, after_seq: int) -> list[events.AnyEvent]:
    """Every event of the run's log after `after_seq`, decoded."""
    out: list[events.AnyEvent] = []
    while True:
        page = await store.run_page(run_id, after_seq, _PAGE)
        out.extend(events.decode_stored(item.payload) for item in page)
        if len(page) < _PAGE:
            return out
        after_seq = page[-1].seq


def unretractable(tail: list[events.AnyEvent], *, approval_id: str = "") -> str | None:
    """Why `tail` cannot be retracted, or None if it can. The events of the
    approval `approval_id` (the one the resumed run waits for) are allowed."""
    for ev in tail:
        if isinstance(ev, _RETRACTABLE):
            continue
        if approval_id and isinstance(ev, events.ApprovalRequired | events.ApprovalDecided):
            if ev.approval_id == approval_id:
                continue
        return f"{ev.__struct_config__.tag} at seq {ev.seq} after the last durable point"
    return None


async def retract(writer: RunLog, tail: list[events.AnyEvent]) -> int:
    """Append the retractions of `tail` (see the module doc); how many."""
    messages: dict[str, None] = {}
    reset: set[str] = set()
    opened: dict[str, None] = {}
    resulted: set[str] = set()
    for ev in tail:
        if isinstance(ev, events.TextDelta | events.ReasoningDelta):
            messages[ev.message_id] = None
            reset.discard(ev.message_id)
        elif isinstance(ev, events.MessageReset):
            reset.add(ev.message_id)
        elif isinstance(ev, events.ToolCallStart):
            opened[ev.tool_call_id] = None
        elif isinstance(ev, events.ToolResult):
            resulted.add(ev.tool_call_id)
    n = 0
    for message_id in messages:
        if message_id not in reset:  # already retracted by its own turn
            await writer.append(events.MessageReset(message_id=message_id))
            n += 1
    for call_id in opened:
        if call_id not in resulted:
            await writer.append(
                events.ToolResult(tool_call_id=call_id, status="skipped", summary=RETRACTED)
            )
            n += 1
    return n
