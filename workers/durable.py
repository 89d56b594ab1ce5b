"""The journal behind an `AgentContext`: steps, approvals, replay, events.

A run's durable operations (`ctx.step`, `ctx.approval`) are numbered by call
order; each one is a row of `run_steps` (`broker/steps.py`) written under the
owner's epoch with the seq the log ended at (and the run time used, so a
resumed run's time budget goes on from there):

| operation | rows |
|---|---|
| retryable step | one, `done`, after `fn` returned and its events were flushed |
| step with `retryable=False` | `started` (with the tool call it runs, if given) before `fn` runs, `done` after |
| approval | `started` (its id, expiry, call digest) before the approval is created and `approval_required` appended, `done` with the decision after `approval_decided` |
| `tool_result` outside a step | one, `done` (named `runlog:tool_result`, the result as stored), after it was flushed |

A `tool_result` is a durable point because it says a side effect happened:
a takeover after it must not find it in the tail (which it could only
retract by running the tool again). On a replay it is compared with the
stored one, and a tool result that made it into the log just before its
row (a kill in between) is verified against the replayed one the same way.

Replay (`prepare`, then the agent from the top): while the agent has not
passed the last row, steps return their stored values, approvals their
stored decisions, and the events it emits outside steps are compared with
the log up to that row's seq (`verify.py`: the same, dropped; text that
differs, retracted from there and live; a tool call or result that
differs, the run fails). What follows that seq — the dead owner's in-flight
work — was retracted by `prepare` (`resume.py`). The last row may be open:

- an approval still waited for: the replay reaches it and waits again (or
  finds the decision in the log), never asking twice;
- a `retryable=False` step that started: the run fails `step_interrupted`.

An approval is bound to the tool call it guards (`binding.py`): its row
holds the digest of the call as this execution emitted it. A replay that
emits that call again with another name or other arguments fails the run
`agent_nondeterministic` at the approval, before the agent can act on the
stored decision; so does a replayed tool result that differs from the log's.

Ids from `new_id` hash (run, operation index, the epoch that ran that part
of the agent, a counter), so a replay gives the same ones.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import msgspec

from broker import errors, events, ids, steps
from broker.steps import StepRecord

from . import approving
from .api import ChatMessage, Decision, encode_result, stable_id
from .binding import Calls, summary_digest
from .context import Released, RunContext, Stopped
from .errors import RunFailure
from .resume import RETRACTED, read_tail, retract, unretractable
from .signals import DecisionInfo
from .verify import Replay

log = logging.getLogger(__name__)

CONVERSATION_RUNS = 50

# Runlog's own outcomes, raised inside the agent's task: the agent may catch
# them (a broad `except Exception`), so the journal remembers the first one
# and the runner acts on it whatever the agent did.
_OURS = (Stopped, Released, RunFailure, errors.StaleEpoch, errors.RunEnded, errors.StorageError)


class _StepResult(msgspec.Struct, kw_only=True):
    value: msgspec.Raw
    usage: tuple[int, int, int] = (0, 0, 0)
    # The log's last seq when the step began: its own events are after it
    # (-1 in rows from before this field: the replay does not compare the
    # events before such a step).
    began: int = -1
    used_s: float = 0.0  # the run's time used when the step ended (run_timeout_s)


class _Started(msgspec.Struct, kw_only=True):
    """A not-retryable step's row while it runs."""

    tool_call_id: str = ""  # the tool call it runs, if any


class _ApprovalRow(msgspec.Struct, kw_only=True):
    approval_id: str
    tool_call_id: str = ""
    summary: str = ""
    expires_at: int = 0
    decision: str = ""
    decided_by: str = ""
    comment: str = ""
    call_digest: str = ""  # binding.py; "" in rows from before it
    used_s: float = 0.0  # the run's time used when it was asked (run_timeout_s)


# The durable point a tool_result outside a step is (a name no step may have).
RESULT_STEP = "runlog:tool_result"


# Events the agent emits that say something of the moment (never compared).
_QUIET_TYPES = frozenset({events.Status, events.Progress})

_step_decoder = msgspec.json.Decoder(_StepResult)
_approval_decoder = msgspec.json.Decoder(_ApprovalRow)
_started_decoder = msgspec.json.Decoder(_Started)

INTERRUPTED = "interrupted: its worker stopped while it ran"


class Journal:
    def __init__(self, ctx: RunContext, records: list[StepRecord]) -> None:
        self.ctx = ctx
        self.records = records
        self.idx = 0  # the next durable operation's index
        self._n = 0  # ids made since the last operation
        self.usage = [0, 0, 0]
        self.fatal: BaseException | None = None
        self.open_approval = ""  # id of the approval being waited on, if any
        self.clock_changed = asyncio.Event()
        self._in_step = False
        # For an open approval that ends the records: what of it the log holds.
        self._tail: list[events.AnyEvent] = []
        self._calls = Calls()  # the tool calls this execution emitted
        # A tool_result the tail starts with (appended, its row not written
        # before the owner died): the replay must emit it again, the same.
        self._logged_result: events.ToolResult | None = None
        # On a resume: the log's events up to the last durable point, which
        # the replay must emit again (verify.py).
        self._replay: Replay | None = None
        # A step with cancellable=False is running: a stop waits for it (runner.py).
        self.uncancellable = False
        # For the stop audit: what the agent counts as its steps (the built-in
        # loop: model turns; None: the durable operations) and the tool calls
        # with side effects that started.
        self.turns: int | None = None
        self.side_effects: list[str] = []

    @classmethod
    async def load(cls, ctx: RunContext) -> Journal:
        return cls(ctx, await ctx.store.load_steps(ctx.run.run_id))

    def used_s(self) -> float:
        """The run time the last durable row recorded (a resumed run's clock
        starts there: the dead owner's time after it is not counted)."""
        for rec in reversed(self.records):
            if rec.kind == "approval" and rec.result:
                return _approval_of(rec).used_s
            if rec.kind == "step" and rec.done and rec.name != RESULT_STEP and rec.result:
                return _step_decoder.decode(rec.result).used_s
        return 0.0

    @property
    def replaying(self) -> bool:
        return self.idx < len(self.records)

    # -- a takeover's first act

    async def prepare(self, *, announce: bool = True) -> None:
        """Check that the run can be resumed and retract the tail (see the
        module doc); RunFailure if it cannot be resumed. `announce`: append
        `status` resumed (not for a parked run woken by its decision)."""
        ctx = self.ctx
        last = self.records[-1] if self.records else None
        waiting = last is not None and last.kind == "approval" and not last.done
        if last is not None and last.kind == "step" and not last.done:
            started = _started_decoder.decode(last.result) if last.result else _Started()
            if started.tool_call_id:
                # Its card is in the log, open: it gets its result, and the
                # run fails without running the call again.
                ctx.resulted.add(started.tool_call_id)
                await ctx.append(
                    events.ToolResult(
                        tool_call_id=started.tool_call_id, status="error", summary=INTERRUPTED
                    )
                )
                raise RunFailure("tool_interrupted")
            raise RunFailure("step_interrupted", f"step {last.name!r} was running")
        progress_epoch = last.last_epoch if last is not None else 1
        if not waiting and ctx.writer.epoch - progress_epoch > ctx.settings.agent_max_resumes:
            raise RunFailure(
                "worker_lost",
                f"taken over more than agent_max_resumes ({ctx.settings.agent_max_resumes}) "
                "times without completing a step",
            )
        tail = await read_tail(ctx.store, ctx.run.run_id, last.seq if last is not None else 1)
        approval_id = _approval_of(last).approval_id if waiting and last is not None else ""
        if not waiting:
            first = next((e for e in tail if not isinstance(e, events.Status)), None)
            if isinstance(first, events.ToolResult) and first.summary != RETRACTED:
                # Died between a tool result's append and its row: the
                # replay emits it again, and it is checked (emit).
                self._logged_result = first
                tail = [e for e in tail if e is not first]
                ctx.resulted.add(first.tool_call_id)
        reason = unretractable(tail, approval_id=approval_id)
        if reason is not None:
            log.warning("run %s: cannot be resumed (%s)", ctx.run.run_id, reason)
            raise RunFailure("worker_lost", f"the run cannot be resumed: {reason}")
        self._tail = tail
        if last is not None:
            self._replay = await self._load_replay(last.seq)
        in_tail = [ev.tool_call_id for ev in tail if isinstance(ev, events.ToolCallStart)]
        ctx.opened.extend(in_tail)
        await retract(ctx.writer, tail)
        ctx.resulted.update(in_tail)  # the retraction gave each its result
        if announce:
            await ctx.append(events.Status(code="resumed", summary="resumed by another worker"))

    async def _load_replay(self, through: int) -> Replay:
        """What the replay is compared with: the log through `through` (the
        last durable point), less what the steps emitted inside."""
        ctx = self.ctx
        logged: list[events.AnyEvent] = []
        after = 0
        while after < through:
            page = await ctx.store.run_page(ctx.run.run_id, after, min(1000, through - after))
            logged.extend(events.decode_stored(e.payload) for e in page if e.seq <= through)
            if not page:
                break
            after = page[-1].seq
        for ev in logged:  # the cards a replayed step opened get their result at the end
            if isinstance(ev, events.ToolCallStart):
                ctx.opened.append(ev.tool_call_id)
            elif isinstance(ev, events.ToolResult):
                ctx.resulted.add(ev.tool_call_id)
        inside: list[tuple[int, int]] = []
        guarded: dict[str, str] = {}
        prev = 0
        for rec in self.records:
            if rec.kind == "step" and rec.done and rec.name != RESULT_STEP and rec.result:
                began = _step_decoder.decode(rec.result).began
                inside.append((began if began >= 0 else prev, rec.seq))
            elif rec.kind == "approval":
                row = _approval_of(rec)
                if row.tool_call_id:
                    guarded[row.tool_call_id] = row.approval_id
            prev = rec.seq
        return Replay(
            logged,
            inside,
            run_id=ctx.run.run_id,
            epoch=ctx.writer.epoch,
            append=lambda e: self._ours(ctx.append(e)),
            fail=self._diverged,
            guarded=guarded,
        )

    # -- events

    async def emit(self, event: events.Event) -> None:
        # Per event of every agent: exact types (events are final structs),
        # and the append awaited here, not through `_ours` (a coroutine more).
        if self.fatal is not None:
            raise self.fatal
        ctx = self.ctx
        kind = type(event)
        if kind is events.ToolCallStart:
            assert isinstance(event, events.ToolCallStart)
            ctx.opened.append(event.tool_call_id)
            self._calls.start(event.tool_call_id, event.tool_name)
        elif kind is events.ToolArgsDelta:
            assert isinstance(event, events.ToolArgsDelta)
            self._calls.args(event.tool_call_id, event.partial_json)
        elif kind is events.ToolResult:
            assert isinstance(event, events.ToolResult)
            ctx.resulted.add(event.tool_call_id)
            if not self._in_step:
                if self.replaying and self._replay is not None:
                    await self._replay.take(event)  # the same as the log's, or the run fails
                return await self._result_point(event)
        if self._logged_result is not None and kind not in _QUIET_TYPES:
            self._check_logged_result(f"a {event.__struct_config__.tag}")
        if self.idx < len(self.records):  # replaying
            if self._replay is None or await self._replay.take(event):
                return  # in the log already
        try:
            await ctx.append(event)
        except _OURS as e:
            if self.fatal is None:
                self.fatal = e
            raise

    async def _result_point(self, event: events.ToolResult) -> None:
        """A tool_result outside a step: a durable point (see the module doc)."""
        idx = self.idx
        blob = msgspec.json.encode([event.tool_call_id, event.status, event.summary, event.output])
        if self.replaying:
            rec = self._expect(idx, "step", RESULT_STEP)
            if rec.result != blob:
                self._diverged(f"the tool result for {event.tool_call_id} differs from the log's")
            await self._replayed(rec)
            self._advance()
            return
        ctx = self.ctx
        logged = self._logged_result
        if logged is not None:
            self._logged_result = None
            same = (logged.tool_call_id, logged.status, logged.summary, logged.output)
            if same != (event.tool_call_id, event.status, event.summary, event.output):
                self._diverged(
                    f"the tool result at seq {logged.seq} differs from the one the replay emitted"
                )
            seq = logged.seq  # in the log: not appended again
        else:
            await self._ours(ctx.append(event))
            seq = await self._ours(ctx.writer.flush())
        await self._record(idx, RESULT_STEP, "step", True, blob, seq)
        self._advance()

    def _check_logged_result(self, what: str) -> None:
        if self._logged_result is not None and not self.replaying:
            self._diverged(
                f"the log has a tool result at seq {self._logged_result.seq} where the "
                f"replay emitted {what}"
            )

    def finish(self) -> None:
        """The agent returned: nothing of the log may be left unverified."""
        self._check()
        self._check_logged_result("nothing more")

    def _diverged(self, what: str) -> NoReturn:
        self.fatal = RunFailure(
            "agent_nondeterministic", f"the resumed agent differed from the log: {what}"
        )
        raise self.fatal

    def add_usage(self, input_tokens: int, output_tokens: int, reasoning_tokens: int) -> None:
        self.usage[0] += max(0, input_tokens)
        self.usage[1] += max(0, output_tokens)
        self.usage[2] += max(0, reasoning_tokens)

    def new_id(self, prefix: str) -> str:
        rec = self.records[self.idx] if self.replaying else None
        epoch = rec.epoch if rec is not None else self.ctx.writer.epoch
        self._n += 1
        return stable_id(prefix, self.ctx.run.run_id, self.idx, epoch, self._n)

    async def conversation(self) -> list[ChatMessage]:
        run = self.ctx.run
        rows = await self.ctx.store.conversation(run.session_id, run.run_id, CONVERSATION_RUNS)
        out: list[ChatMessage] = []
        for run_id, input_, payloads in rows:
            if input_:
                out.append(ChatMessage("user", input_, run_id))
            text = _final_text(payloads)
            if text:
                out.append(ChatMessage("assistant", text, run_id))
        return out

    # -- steps

    async def step(
        self,
        name: str,
        fn: Callable[[], Awaitable[Any]],
        *,
        retryable: bool,
        cancellable: bool = True,
        tool_call_id: str = "",
        type: Any = None,
        keep: Callable[[Any], bool] | None = None,
    ) -> Any:
        """`keep` (runlog's own agents only): a step whose value it refuses
        is not recorded — a replay runs it again, and a takeover retracts
        what it emitted, as for code between steps. The built-in loop's last
        model turn (no tool calls: `run_end` follows at once) saves its
        row's commit so."""
        self._check()
        if self._in_step:
            raise RuntimeError("steps do not nest, and do not run concurrently")
        if self._logged_result is not None and not self.replaying:
            # The tool result the tail starts with was emitted inside this
            # step, which did not finish: running it again would run the tool
            # again, and its stored result is lost.
            seq = self._logged_result.seq
            self.fatal = RunFailure(
                "worker_lost",
                f"the run cannot be resumed: the tool_result at seq {seq} came from step "
                f"{name!r}, which did not finish",
            )
            log.warning("run %s: cannot be resumed (tool_result at seq %d inside step %r)",
                        self.ctx.run.run_id, seq, name)  # fmt: skip
            raise self.fatal
        idx = self.idx
        if self.replaying:
            rec = self._expect(idx, "step", name)
            assert rec.result is not None
            stored = _step_decoder.decode(rec.result)
            self.add_usage(*stored.usage)
            await self._replayed(rec)
            self._advance()
            return _value(stored.value, type)
        ctx = self.ctx
        if not retryable:
            seq = await self._ours(ctx.writer.flush())
            started = msgspec.json.encode(_Started(tool_call_id=tool_call_id))
            await self._record(idx, name, "step", False, started, seq)
        before = list(self.usage)
        began = ctx.writer.last_seq
        self._in_step = True
        self.uncancellable = not cancellable
        try:
            value = await fn()
        finally:
            self._in_step = False
            if not cancellable:
                self.uncancellable = False
                self.clock_changed.set()  # a stop that waited for it goes on
        if keep is not None and not keep(value):
            return value
        data = encode_result(value)
        used = tuple(a - b for a, b in zip(self.usage, before, strict=True))
        result = _StepResult(
            value=msgspec.Raw(data),
            usage=used,  # type: ignore[arg-type]
            began=began,
            used_s=ctx.used_s(),
        )
        blob = msgspec.json.encode(result)
        seq = await self._ours(ctx.writer.flush())
        await self._record(idx, name, "step", True, blob, seq)
        self._advance()
        return _value(msgspec.Raw(data), type)

    async def approval(
        self, summary: str, *, tool_call_id: str, timeout_s: float | None
    ) -> Decision:
        self._check()
        if self._in_step:
            raise RuntimeError("an approval cannot be asked for inside a step")
        self._check_logged_result("an approval")
        idx = self.idx
        digest = self._calls.digest(tool_call_id) if tool_call_id else summary_digest(summary)
        if self.replaying:
            rec = self._expect(idx, "approval", "approval")
            row = _approval_of(rec)
            if row.call_digest and digest is not None and digest != row.call_digest:
                # The call it guards came out differently: the stored
                # decision was taken on something else. Nothing runs.
                what = f"tool call {tool_call_id}" if tool_call_id else "its summary"
                self._diverged(
                    f"approval {row.approval_id} (operation {idx}) was decided on "
                    f"{row.tool_call_id or 'its summary'}; the replay produced another "
                    f"{what} (call digest {digest[:12]}…, approved {row.call_digest[:12]}…)"
                )
            await self._replayed(rec)
            if rec.done:
                self._advance()
                return Decision(row.decision, row.decided_by, row.comment)  # type: ignore[arg-type]
            return await self._finish_approval(idx, row, logged=self._tail)
        ctx = self.ctx
        s = ctx.settings
        timeout = s.approval_timeout_s if timeout_s is None else max(0.0, timeout_s)
        row = _ApprovalRow(
            approval_id=ids.approval_id(),
            tool_call_id=tool_call_id,
            summary=summary,
            expires_at=ctx.now_ms() + int(timeout * 1000),
            # A call this execution did not emit (given by id only) is bound
            # by its id alone: the log holds no arguments to show.
            call_digest=digest or "",
            used_s=ctx.used_s(),
        )
        # The row first, then the approval: a takeover in between finds the
        # row and creates the same approval (create is idempotent), so no
        # approval is ever left behind that no run waits on.
        seq = await self._ours(ctx.writer.flush())
        await self._record(idx, "approval", "approval", False, msgspec.json.encode(row), seq)
        return await self._finish_approval(idx, row, logged=[])

    async def _finish_approval(
        self, idx: int, row: _ApprovalRow, *, logged: list[events.AnyEvent]
    ) -> Decision:
        """From an approval's row on: create it (again, after a takeover: a
        no-op if it exists), request it (unless `logged` has it), wait (unless
        `logged` has the decision), record the decision."""
        ctx = self.ctx
        ask = approving.Ask(
            row.approval_id, row.tool_call_id, row.summary, row.expires_at, row.call_digest
        )
        await self._ours(approving.create(ctx, ask))
        self.open_approval = row.approval_id
        await self._status("waiting_approval")
        requested = any(
            isinstance(e, events.ApprovalRequired) and e.approval_id == row.approval_id
            for e in logged
        )
        decided = next(
            (
                DecisionInfo(e.decision, e.decided_by, e.comment)
                for e in logged
                if isinstance(e, events.ApprovalDecided) and e.approval_id == row.approval_id
            ),
            None,
        )
        if not requested:
            await self._ours(approving.request(ctx, ask))
        if decided is None:
            decided = await self._ours(
                approving.wait(
                    ctx, row.approval_id, row.expires_at, clock_changed=self.clock_changed.set
                )
            )
            await self._ours(approving.record(ctx, row.approval_id, decided))
        seq = await self._ours(ctx.writer.flush())
        row.decision, row.decided_by, row.comment = decided
        await self._record(idx, "approval", "approval", True, msgspec.json.encode(row), seq)
        self.open_approval = ""
        await self._status("running")
        self._advance()
        return Decision(decided.decision, decided.decided_by, decided.comment)  # type: ignore[arg-type]

    # -- bookkeeping

    def _check(self) -> None:
        """Once runlog has decided the run's outcome, the agent does nothing more."""
        if self.fatal is not None:
            raise self.fatal

    async def _replayed(self, rec: StepRecord) -> None:
        """The replay passed `rec`: what the log holds before it was emitted again."""
        if self._replay is not None:
            await self._replay.until(rec.seq)

    def _expect(self, idx: int, kind: str, name: str) -> StepRecord:
        rec = self.records[idx]
        if rec.kind != kind or rec.name != name:
            self.fatal = RunFailure(
                "agent_nondeterministic",
                f"operation {idx} is {rec.kind} {rec.name!r} in the log; the agent asked for "
                f"{kind} {name!r}",
            )
            raise self.fatal
        return rec

    def _advance(self) -> None:
        self.idx += 1
        self._n = 0

    async def _record(
        self, idx: int, name: str, kind: steps.StepKind, done: bool, result: bytes | None, seq: int
    ) -> None:
        ctx = self.ctx
        await self._ours(
            ctx.write(
                lambda: ctx.store.record_step(
                    run_id=ctx.run.run_id,
                    epoch=ctx.writer.epoch,
                    idx=idx,
                    name=name,
                    kind=kind,
                    done=done,
                    result=result,
                    seq=seq,
                ),
                "step record",
            )
        )

    async def _status(self, status: str) -> None:
        ctx = self.ctx
        w = ctx.writer
        ok = await self._ours(
            ctx.write(lambda: ctx.store.set_status(w.run_id, w.epoch, status), "status")
        )
        if not ok:
            self.fatal = errors.StaleEpoch(f"run {w.run_id}: ownership lost")
            raise self.fatal

    async def _ours(self, aw: Awaitable[Any]) -> Any:
        """Await `aw`; remember a runlog outcome it raises (see `_OURS`)."""
        try:
            return await aw
        except _OURS as e:
            if self.fatal is None:
                self.fatal = e
            raise


def _approval_of(rec: StepRecord) -> _ApprovalRow:
    assert rec.result is not None
    return _approval_decoder.decode(rec.result)


def _value(raw: msgspec.Raw, type: Any) -> Any:
    return msgspec.json.decode(raw, type=type) if type is not None else msgspec.json.decode(raw)


def _final_text(payloads: list[bytes]) -> str:
    """A run's text as its clients were left with it: resets drop a message."""
    texts: dict[str, list[str]] = {}
    for p in payloads:
        ev = events.decode_stored(p)
        if isinstance(ev, events.TextDelta):
            texts.setdefault(ev.message_id, []).append(ev.delta)
        elif isinstance(ev, events.MessageReset):
            texts.pop(ev.message_id, None)
    return "".join("".join(parts) for parts in texts.values())
