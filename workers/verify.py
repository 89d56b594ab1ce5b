"""A replay's events, compared with the log they were first written to.

A resumed agent runs again from the top. Up to the last durable point the
log holds what it emitted the first time, outside its steps (a replayed
step returns its stored value without running, so what it emitted inside
is not emitted again). `Replay` holds those events in order and takes each
one the agent emits while the journal replays:

| the agent emits | the log has there | |
|---|---|---|
| the same event (type, ids, content) | | dropped: it is in the log |
| a text or reasoning delta | another event, or nothing more | the first divergence: every message of the log from there on is retracted (`message_reset`; what of a message had matched is appended again under a new id, so a client's copy stays whole) and text and reasoning go on live |
| a tool card event or a tool result | another one, or nothing more | the run fails `agent_nondeterministic`: something a step or an approval depended on came out differently |
| `status`, `progress` | | dropped, never compared (they said something true at the time) |

and at each durable point the replay passes, the log's events before it
must all have been emitted again: a tool card the replay skipped fails the
run, text it skipped is retracted as above. Messages the log reset (by the
agent, or a takeover's retraction) and tool cards a retraction closed are
left out on both sides: their ids are never emitted again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import NoReturn

import msgspec

from broker import events

from .api import stable_id
from .resume import RETRACTED

_Soft = events.TextDelta | events.ReasoningDelta
_Hard = events.ToolCallStart | events.ToolArgsDelta | events.ToolCallEnd | events.ToolResult
# Exact types, for the per-event checks (a set lookup, not isinstance on a union).
_SOFT_TYPES = frozenset({events.TextDelta, events.ReasoningDelta})
_HARD_TYPES = frozenset(
    {events.ToolCallStart, events.ToolArgsDelta, events.ToolCallEnd, events.ToolResult}
)
_QUIET_TYPES = frozenset({events.Status, events.Progress})


def _key(ev: events.Event) -> bytes:
    """What a comparison looks at: the event without its place in the log."""
    return msgspec.json.encode(msgspec.structs.replace(ev, run_id="", session_id="", seq=0, ts=0))


def _tag(ev: events.Event) -> str:
    return str(ev.__struct_config__.tag)


def _what(ev: events.Event) -> str:
    if isinstance(ev, _Hard):
        return f"{_tag(ev)} for {ev.tool_call_id}"
    if isinstance(ev, _Soft):
        return f"{_tag(ev)} of {ev.message_id}"
    return _tag(ev)


class Replay:
    def __init__(
        self,
        logged: list[events.AnyEvent],
        inside_steps: list[tuple[int, int]],
        *,
        run_id: str,
        epoch: int,
        append: Callable[[events.Event], Awaitable[None]],
        fail: Callable[[str], NoReturn],
        guarded: dict[str, str] | None = None,
    ) -> None:
        """`logged`: the log up to the last durable point; `inside_steps`:
        the (after, through] seq ranges the steps' own events hold;
        `guarded`: tool call id → the approval that guards it."""
        self._guarded = guarded or {}
        self._run_id, self._epoch = run_id, epoch
        self._append, self._fail = append, fail
        self.gone_messages = {e.message_id for e in logged if isinstance(e, events.MessageReset)}
        self.gone_calls = {
            e.tool_call_id
            for e in logged
            if isinstance(e, events.ToolResult) and e.summary == RETRACTED
        }

        self._soft: deque[_Soft] = deque()
        self._hard: deque[_Hard] = deque()
        # One pass, the step ranges walked alongside (both in seq order).
        ranges = sorted(inside_steps)
        r = 0
        for e in logged:
            while r < len(ranges) and ranges[r][1] < e.seq:
                r += 1
            if r < len(ranges) and ranges[r][0] < e.seq:
                continue  # a step's own event: the replay does not emit it again
            t = type(e)
            if t in _SOFT_TYPES:
                if e.message_id not in self.gone_messages:  # type: ignore[union-attr]
                    self._soft.append(e)  # type: ignore[arg-type]
            elif t in _HARD_TYPES and e.tool_call_id not in self.gone_calls:  # type: ignore[union-attr]
                self._hard.append(e)  # type: ignore[arg-type]
        self._matched: dict[str, list[_Soft]] = {}  # by message: the deltas that matched
        self._aliases: dict[str, str] = {}  # a retracted message → the id it goes on under
        self.diverged = False

    async def take(self, event: events.Event) -> bool:
        """Whether `event` is in the log already (drop it). False: the
        caller appends it; it may have been given another message id."""
        t = type(event)
        if t in _SOFT_TYPES and not self.diverged:
            # The common case first, compared field by field: a delta as logged.
            want = self._soft[0] if self._soft else None
            if (
                want is not None
                and type(want) is t
                and want.message_id == event.message_id  # type: ignore[attr-defined]
                and want.delta == event.delta  # type: ignore[attr-defined]
            ):
                self._soft.popleft()
                self._matched.setdefault(want.message_id, []).append(want)
                return True
        if t in _QUIET_TYPES:
            return True
        if isinstance(event, _Hard):
            if event.tool_call_id in self.gone_calls:
                return True
            card = self._hard[0] if self._hard else None
            if card is None or _key(card) != _key(event):
                where = (
                    f"the log has {_what(card)} at seq {card.seq}" if card else "the log has none"
                )
                aid = self._guarded.get(event.tool_call_id)
                why = f"; approval {aid} was decided on the log's call" if aid else ""
                self._fail(f"the replay emitted {_what(event)} where {where}{why}")
            self._hard.popleft()
            return True
        if isinstance(event, events.MessageReset):
            if event.message_id in self.gone_messages:
                return True
            await self._diverge(event.message_id)
            event.message_id = self._aliases.get(event.message_id, event.message_id)
            return False
        if not isinstance(event, _Soft):
            return False  # nothing else is the agent's to emit
        if event.message_id in self.gone_messages:
            return True
        await self._diverge(event.message_id)
        event.message_id = self._aliases.get(event.message_id, event.message_id)
        return False

    async def until(self, seq: int) -> None:
        """The replay passed the durable point at `seq`: all the log holds
        before it must have been emitted again."""
        if self._hard and self._hard[0].seq <= seq:
            e = self._hard[0]
            self._fail(f"the log has {_what(e)} at seq {e.seq} the replay did not emit")
        if self._soft and self._soft[0].seq <= seq:
            await self._diverge(None)

    async def _diverge(self, message_id: str | None) -> None:
        """Retract what the replay does not reproduce: every message of the
        log not yet matched, and `message_id` (whose replay goes another way)."""
        ids: dict[str, None] = dict.fromkeys(e.message_id for e in self._soft)
        self._soft.clear()
        self.diverged = True
        if message_id is not None and (message_id in self._matched or message_id in ids):
            ids[message_id] = None
        for m in ids:
            if m in self._aliases:
                continue
            prefix = m.split("_", 1)[0] if "_" in m else "m"
            alias = stable_id(prefix, self._run_id, "replayed", m, self._epoch)
            self._aliases[m] = alias
            await self._append(events.MessageReset(message_id=m))
            for d in self._matched.pop(m, []):  # what matched stays, under the new id
                await self._append(msgspec.structs.replace(d, message_id=alias, seq=0, ts=0))
