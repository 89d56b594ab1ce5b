"""What every projection is: a state machine from stored events to wire items.

Contract (every format follows it; docs/compat.md):
- `track(event)` applies an event at or before the answer's cursor: state
  only, nothing is sent. `start()` is called once, at the cursor: the
  format's envelope (AG-UI `RUN_STARTED`, AI SDK `start{messageId}`, ...) and
  the re-opening of the spans open there, with the same ids. `feed(event)`
  applies an event after the cursor and returns what goes on the wire.
- A runlog event may become several wire items; only the LAST one carries the
  event's seq (`Wire.seq`), so a cursor never lands inside a half-sent event.
  Items synthesised to open or close spans carry none.
- `done` turns true when the answer must end after what was just returned
  (the run ended or failed, or an undecided approval ended the answer with
  the format's native interrupt). Nothing is fed after that.
- runlog-only events go to the format's extension slot (`CUSTOM`, `data-*`,
  `custom`, `extra`), never an unknown top-level type.
- Pure: no I/O, no clock; unit-tested without servers.

`decided` is the set of approval ids decided when the answer started (a
replayed approval that is already decided streams inline instead of ending
the answer); the serving layer fills it from the log it read.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from broker import events

from .spans import Spans


class Wire(NamedTuple):
    """One SSE frame: its `data:` payload (one JSON document, or b"[DONE]"),
    the seq it completes (None for synthesised items) and its `event:` name
    (None: no `event:` line)."""

    data: bytes
    seq: int | None = None
    event: str | None = None


@dataclass
class Context:
    """What a projection knows of the answer it serves."""

    run_id: str
    session_id: str
    options: dict[str, object] = field(default_factory=dict)  # the format's request options
    decided: set[str] = field(default_factory=set)  # approvals decided when the answer began


_enc = msgspec.json.Encoder()


def json(obj: object) -> bytes:
    return _enc.encode(obj)


class Projection(abc.ABC):
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.spans = Spans()
        self.done = False

    def track(self, ev: events.Event) -> None:
        """An event at or before the cursor: state only."""
        self.spans.advance(ev)
        if isinstance(ev, events.ApprovalDecided):
            self.ctx.decided.add(ev.approval_id)

    @abc.abstractmethod
    def start(self) -> list[Wire]:
        """The answer's envelope and the re-opening of the spans open now."""

    @abc.abstractmethod
    def feed(self, ev: events.Event) -> list[Wire]:
        """An event after the cursor: what goes on the wire (the last item
        carries `ev.seq`)."""
