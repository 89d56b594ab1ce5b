"""Memory backends: `MemoryLog` (a backend.LogStore) and `MemoryBus` (a
backend.LiveBus), for tests that need the log's and the live feed's
behaviour but no server. They keep the contracts of backend.py, nothing
more: what only PostgreSQL or NATS can show (durability, outages, fencing,
the retry of reads) stays tested against the real servers.

`MemoryLog` appends the way the appender commits (log.py): per run `seq`
1, 2, 3, …, per session `cursor` across its runs, atomically, nothing after
`run_end`; `prune` deletes an ended run whole, leaving a hole of its cursors
in its session, as `runlog prune` does. `unavailable = True` makes every read
raise StorageError (the store after `db_retry_s` of outage).

`MemoryBus` fans each published batch out to the subscriptions whose filter
matches its subject (NATS subject wildcards `*` and `>`), each delivery a
callback from the event loop (`loop.call_soon`, in publish order), as the
NATS reader does. Its fault knobs, drawn from a seeded `random.Random`, make
the feed as bad as backend.LiveBus allows: `drop` (the batch reaches no
subscriber), `duplicate` (it reaches them twice), `reorder` (it is held and
delivered after the next published batch). `hold()` keeps every batch from
then on until `release()` (optionally shuffled); `settle()` waits until all
scheduled deliveries have run.

A server-free test (see docs/architecture.md):

    log, bus = MemoryLog(), MemoryBus()
    log.create_run("r1", "s1")
    sub = await Subscription(log, bus, settings, metrics, run_id="r1").start()
    await bus.publish(log.append("r1", events.RunStart(), events.RunEnd(status="completed")))
    assert [e.seq async for items in sub for e in items] == [1, 2]
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections.abc import Callable, Sequence

import msgspec

from . import approvals, errors, events
from .approvals import ApprovalInfo
from .bus import LiveBatch, decode_batch, encode_batch
from .constants import events_subject
from .rows import PageRow, StoredEvent
from .steps import StepKind, StepRecord
from .store import Ownership, RunInfo

__all__ = [
    "MemoryBus", "MemoryLog", "MemoryRunWriter", "MemoryStore", "MemorySubscription",
]  # fmt: skip


class _Run:
    __slots__ = ("ended", "epoch", "events", "session_id")

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.events: list[StoredEvent] = []  # events[i].seq == i + 1
        self.ended = False
        self.epoch = 0  # the owner's (runs.owner_epoch): `claim` raises it


class _Session:
    __slots__ = ("cursors", "events", "last_cursor")

    def __init__(self) -> None:
        self.last_cursor = 0
        self.events: list[StoredEvent] = []  # in cursor order
        self.cursors: list[int] = []  # events' cursors, for bisect


class MemoryLog:
    """A LogStore in memory (contract: backend.py; behaviour: this module)."""

    def __init__(self, *, clock_ms: Callable[[], int] | None = None) -> None:
        self._runs: dict[str, _Run] = {}
        self._sessions: dict[str, _Session] = {}
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.unavailable = False  # True: every read raises StorageError
        self.reads = 0  # page reads served (stream_page and stream_rows)

    # -- writing (what the appender and retention do to PostgreSQL)

    def create_session(self, session_id: str) -> None:
        self._sessions.setdefault(session_id, _Session())

    def create_run(self, run_id: str, session_id: str) -> None:
        """A run of `session_id` (created too if new) with no event yet."""
        if run_id in self._runs:
            raise ValueError(f"run {run_id} exists")
        self.create_session(session_id)
        self._runs[run_id] = _Run(session_id)

    def append(self, run_id: str, *evs: events.Event) -> LiveBatch:
        """Commit `evs` to the run at once (their run_id, session_id, seq and
        ts are set here, as RunWriter.append does) and return the live batch
        the appender would publish for them (publish it with MemoryBus.publish,
        or don't: a batch lost on the way)."""
        if not evs:
            raise ValueError("append at least one event")
        run = self._run(run_id)
        if run.ended:
            raise errors.RunEnded(f"run {run_id} has ended; nothing can follow run_end")
        now = self._clock_ms()
        for i, ev in enumerate(evs):
            ev.run_id, ev.session_id, ev.ts = run_id, run.session_id, now
            ev.seq = len(run.events) + 1 + i
        return self._store(run_id, run, evs)

    def claim(self, run_id: str) -> int:
        """Give the run a new owner (as claiming it does in PostgreSQL): its
        epoch goes up, so the previous owner's commits are refused; the new one."""
        run = self._run(run_id)
        run.epoch += 1
        return run.epoch

    def owner_epoch(self, run_id: str) -> int:
        return self._run(run_id).epoch

    def ended(self, run_id: str) -> bool:
        return self._run(run_id).ended

    def commit(self, run_id: str, epoch: int, evs: list[events.Event]) -> LiveBatch:
        """Commit events a writer stamped (MemoryRunWriter: their seqs follow
        the run's last), fenced as the appender's commit is (log.py): while
        `epoch` owns the unended run and the seqs follow on, all of them are
        stored; else none, and StaleEpoch. StorageError while `unavailable`."""
        self._check()
        run = self._run(run_id)
        if run.epoch != epoch or run.ended or evs[0].seq != len(run.events) + 1:
            raise errors.StaleEpoch(
                f"run {run_id}: epoch {epoch} is no longer the owner's, or the run has ended;"
                " nothing was written"
            )
        return self._store(run_id, run, evs)

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None:
            raise errors.RunNotFound(f"no run {run_id}")
        return run

    def _store(self, run_id: str, run: _Run, evs: Sequence[events.Event]) -> LiveBatch:
        session = self._sessions[run.session_id]
        first_seq, first_cursor = len(run.events) + 1, session.last_cursor + 1
        now = self._clock_ms()
        payloads, types = [], []
        ended = False
        for ev in evs:  # all or nothing: checked before any is stored
            if ended:
                raise errors.RunEnded(f"run {run_id}: nothing can follow run_end")
            tag = ev.__struct_config__.tag
            assert isinstance(tag, str)
            payloads.append(events.encode(ev))
            types.append(tag)
            ended = tag in events.TERMINAL_TYPES
        run.ended = ended
        for i, (tag, payload) in enumerate(zip(types, payloads, strict=True)):
            stored = StoredEvent(run_id, first_seq + i, first_cursor + i, tag, payload)
            run.events.append(stored)
            session.events.append(stored)
            session.cursors.append(stored.cursor)
        session.last_cursor += len(evs)
        return LiveBatch(
            run_id=run_id,
            session_id=run.session_id,
            seq=first_seq,
            cursor=first_cursor,
            events=[msgspec.Raw(p) for p in payloads],
            types=types,
            ended=run.ended,
            committed_ms=float(now),
        )

    def prune(self, run_id: str) -> int:
        """Delete an ended run and its events (its session keeps a hole of
        their cursors); how many events. A run not ended is never pruned."""
        run = self._runs.get(run_id)
        if run is None:
            return 0
        if not run.ended:
            raise ValueError(f"run {run_id} has not ended: retention never prunes it")
        del self._runs[run_id]
        session = self._sessions[run.session_id]
        session.events = [e for e in session.events if e.run_id != run_id]
        session.cursors = [e.cursor for e in session.events]
        return len(run.events)

    # -- LogStore

    async def stream_page(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float = 0.0
    ) -> list[StoredEvent]:
        return self._page(by_run, ident, after, limit)

    async def stream_rows(
        self, by_run: bool, ident: str, after: int, limit: int, *, retry_s: float = 0.0
    ) -> list[PageRow]:
        return list(self._page(by_run, ident, after, limit))

    async def stream_head(
        self, by_run: bool, ident: str, *, retry_s: float = 0.0
    ) -> tuple[int, bool]:
        self._check()
        if by_run:
            run = self._runs.get(ident)
            if run is None:
                raise errors.RunNotFound(f"no run {ident}")
            return len(run.events), run.ended
        session = self._sessions.get(ident)
        if session is None:
            raise errors.SessionNotFound(f"no session {ident}")
        return session.last_cursor, False

    def _page(self, by_run: bool, ident: str, after: int, limit: int) -> list[StoredEvent]:
        self._check()
        self.reads += 1
        after = max(after, 0)
        if by_run:
            run = self._runs.get(ident)
            return run.events[after : after + limit] if run is not None else []
        session = self._sessions.get(ident)
        if session is None:
            return []
        i = bisect.bisect_right(session.cursors, after)
        return session.events[i : i + limit]

    def _check(self) -> None:
        if self.unavailable:
            raise errors.StorageError("the memory log is unavailable (MemoryLog.unavailable)")


def _matches(pattern: list[str], subject: list[str]) -> bool:
    for i, token in enumerate(pattern):
        if token == ">":
            return len(subject) > i
        if i >= len(subject) or (token != "*" and token != subject[i]):
            return False
    return len(pattern) == len(subject)


class MemorySubscription:
    """One MemoryBus.subscribe_live (a backend.LiveSubscription)."""

    def __init__(self, bus: MemoryBus, pattern: str, callback: Callable[[LiveBatch], None]) -> None:
        self.bus = bus
        self.pattern = pattern.split(".")
        self.callback = callback
        self.delivered = 0  # batches handed to the callback

    async def unsubscribe(self) -> None:
        self.bus._subscriptions.discard(self)


class MemoryBus:
    """A LiveBus in memory, with fault knobs (behaviour: this module's docstring)."""

    def __init__(
        self, *, drop: float = 0.0, duplicate: float = 0.0, reorder: float = 0.0, seed: int = 0
    ) -> None:
        self.drop = drop  # the chance a batch reaches no subscriber
        self.duplicate = duplicate  # the chance it reaches them twice
        self.reorder = reorder  # the chance it is delivered after the next one
        self._random = random.Random(seed)
        self._subscriptions: set[MemorySubscription] = set()
        self._seq = 0  # the bus's own stream position (publish acks)
        self._late: list[tuple[str, bytes]] = []  # held by `reorder`
        self._held: list[tuple[str, bytes]] | None = None  # held by `hold()`
        self._scheduled = 0
        self._idle = asyncio.Event()  # set while no delivery is scheduled
        self._idle.set()
        self.published = 0
        self.dropped = 0

    # -- LiveBus

    async def publish_live(self, subject: str, data: bytes, msg_id: str) -> asyncio.Future[int]:
        loop = asyncio.get_running_loop()
        self._seq += 1
        self.published += 1
        fut: asyncio.Future[int] = loop.create_future()
        fut.set_result(self._seq)
        if self._held is not None:
            self._held.append((subject, data))
            return fut
        r = self._random
        if self.drop and r.random() < self.drop:
            self.dropped += 1
            return fut
        if self.reorder and r.random() < self.reorder:
            self._late.append((subject, data))
            return fut
        self._schedule(subject, data)
        if self.duplicate and r.random() < self.duplicate:
            self._schedule(subject, data)
        late, self._late = self._late, []
        for msg in late:
            self._schedule(*msg)
        return fut

    async def subscribe_live(
        self, subject: str, callback: Callable[[LiveBatch], None]
    ) -> MemorySubscription:
        sub = MemorySubscription(self, subject, callback)
        self._subscriptions.add(sub)
        return sub

    # -- for tests

    async def publish(self, batch: LiveBatch) -> None:
        """Publish `batch` as the appender does (MemoryLog.append returns it)."""
        msg_id = f"{batch.run_id}:{batch.seq}"
        await self.publish_live(
            events_subject(batch.session_id, batch.run_id), encode_batch(batch), msg_id
        )

    def hold(self) -> None:
        """Keep every batch published from now on until `release`."""
        if self._held is None:
            self._held = []

    def release(self, *, shuffle: bool = False) -> None:
        """Deliver what `hold` kept (in publish order, or shuffled) and stop holding."""
        held, self._held = self._held or [], None
        if shuffle:
            self._random.shuffle(held)
        for msg in held:
            self._schedule(*msg)

    def flush_late(self) -> None:
        """Deliver the batches `reorder` holds back now (the last publish's)."""
        late, self._late = self._late, []
        for msg in late:
            self._schedule(*msg)

    async def settle(self) -> None:
        """Return once every delivery scheduled so far (and any they caused) has run."""
        while self._scheduled:
            await self._idle.wait()

    def _schedule(self, subject: str, data: bytes) -> None:
        self._scheduled += 1
        self._idle.clear()
        asyncio.get_running_loop().call_soon(self._deliver, subject, data)

    def _deliver(self, subject: str, data: bytes) -> None:
        try:
            tokens = subject.split(".")
            for sub in list(self._subscriptions):
                if sub in self._subscriptions and _matches(sub.pattern, tokens):
                    sub.delivered += 1
                    # Decoded per subscriber, as each NATS subscription decodes its copy.
                    sub.callback(decode_batch(data))
        finally:
            self._scheduled -= 1
            if not self._scheduled:
                self._idle.set()


class MemoryRunWriter:
    """A backend.RunLog over a MemoryLog: the owner's writer of one run.

    As `log.RunWriter`: `append` stamps the event (ids, the next seq, ts),
    checks it strictly and returns its seq at once; the events are committed
    soon after (a task of the loop, as the appender's flush) or by `flush`,
    through `MemoryLog.commit`, fenced by the writer's epoch, and each commit's
    batch is published on `bus` if one is given. After a failure (StaleEpoch
    from the fence, RunEnded once its own run_end is appended, StorageError
    while the log is `unavailable`: the outage grace is not modelled) the
    writer is dead: every later call raises that error.
    """

    def __init__(
        self,
        log: MemoryLog,
        *,
        run_id: str,
        session_id: str,
        epoch: int,
        last_seq: int,
        bus: MemoryBus | None = None,
        clock_ms: Callable[[], int] | None = None,
        max_event_bytes: int = 1024 * 1024,
    ) -> None:
        self._log = log
        self._bus = bus
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self._max_event_bytes = max_event_bytes
        self.run_id = run_id
        self.session_id = session_id
        self.epoch = epoch
        self.committed_seq = last_seq
        self._next_seq = last_seq + 1
        self._pending: list[events.Event] = []
        self._ended = False
        self._error: errors.RunlogError | None = None
        self._soon: asyncio.Task[None] | None = None

    @property
    def last_seq(self) -> int:
        return self._next_seq - 1

    @property
    def error(self) -> errors.RunlogError | None:
        return self._error

    async def append(self, event: events.Event) -> int:
        if self._error is not None:
            raise self._error
        if self._ended:
            raise errors.RunEnded(f"run {self.run_id} has ended; nothing can follow run_end")
        event.run_id, event.session_id = self.run_id, self.session_id
        event.seq, event.ts = self._next_seq, self._clock_ms()
        typed = events.validate(events.encode(event), max_bytes=self._max_event_bytes)
        self._next_seq += 1
        self._pending.append(typed)
        if typed.__struct_config__.tag in events.TERMINAL_TYPES:
            self._ended = True
        if self._soon is None:
            self._soon = asyncio.get_running_loop().create_task(self._commit_soon())
        return event.seq

    async def flush(self) -> int:
        await self._commit()
        return self.committed_seq

    async def _commit_soon(self) -> None:
        await asyncio.sleep(0)
        self._soon = None
        try:
            await self._commit()
        except errors.RunlogError:
            pass  # the writer is dead; its next call says why

    async def _commit(self) -> None:
        if self._error is not None:
            raise self._error
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            live = self._log.commit(self.run_id, self.epoch, batch)
        except errors.RunlogError as e:
            self._error = e
            raise
        self.committed_seq = batch[-1].seq
        if self._bus is not None:
            await self._bus.publish(live)


class _RunRow:
    __slots__ = (
        "created", "created_at_ms", "input", "interrupt", "model", "started_by", "status",
        "takeovers",
    )  # fmt: skip

    def __init__(self, created: int, created_at_ms: int, input: str, model: str, by: str) -> None:
        self.created = created  # creation order (runs.created_at)
        self.created_at_ms = created_at_ms
        self.input = input
        self.model = model
        self.started_by = by
        self.status = "queued"
        self.interrupt: tuple[str, int, str] | None = None
        self.takeovers = 0


class _Approval:
    __slots__ = (
        "approval_id", "call_digest", "comment", "decided_at_ms", "decided_by", "decision",
        "expires_at_ms", "run_id", "summary", "tool_call_id",
    )  # fmt: skip

    def __init__(
        self, approval_id: str, run_id: str, tool_call_id: str, summary: str, expires_at_ms: int,
        call_digest: str,
    ) -> None:  # fmt: skip
        self.approval_id = approval_id
        self.run_id = run_id
        self.tool_call_id = tool_call_id
        self.summary = summary
        self.expires_at_ms = expires_at_ms
        self.call_digest = call_digest
        self.decision: str | None = None
        self.decided_by: str | None = None
        self.decided_at_ms: int | None = None
        self.comment = ""


class MemoryStore:
    """A backend.RunStore in memory, over a MemoryLog (the runs' events):
    runs (created, claimed, stopped), their steps and approvals, with the
    contracts of the Store's (backend.py; approvals.py's `decide`): the
    owner's writes fenced by its epoch and the run's end (StaleEpoch, nothing
    written), an approval decided once. While `log.unavailable`, every call
    raises StorageError. `claim` and `writer` are what the worker does when
    it takes a run: a new epoch, and a MemoryRunWriter holding it.
    """

    def __init__(
        self,
        log: MemoryLog | None = None,
        *,
        bus: MemoryBus | None = None,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._clock_ms = clock_ms or (lambda: int(time.time() * 1000))
        self.log = log if log is not None else MemoryLog(clock_ms=self._clock_ms)
        self.bus = bus
        self._runs: dict[str, _RunRow] = {}
        self._steps: dict[str, dict[int, StepRecord]] = {}
        self._approvals: dict[str, _Approval] = {}  # in creation order

    # -- runs (what the gateway and the worker's intake do)

    def create_run(
        self, run_id: str, session_id: str, *, input: str = "", model: str = "",
        started_by: str = "u",
    ) -> RunInfo:  # fmt: skip
        self.log.create_run(run_id, session_id)
        self._runs[run_id] = _RunRow(len(self._runs), self._clock_ms(), input, model, started_by)
        self._steps[run_id] = {}
        return self._info(run_id)

    def claim(self, run_id: str) -> Ownership:
        """Take the run (a first claim, or a takeover): the next epoch."""
        row = self._row(run_id)
        epoch = self.log.claim(run_id)
        if epoch > 1:
            row.takeovers += 1
        row.status = "running"
        return Ownership(
            run_id=run_id,
            session_id=self.log._run(run_id).session_id,
            epoch=epoch,
            last_seq=len(self.log._run(run_id).events),
        )

    def writer(self, own: Ownership) -> MemoryRunWriter:
        return MemoryRunWriter(
            self.log, run_id=own.run_id, session_id=own.session_id, epoch=own.epoch,
            last_seq=own.last_seq, bus=self.bus, clock_ms=self._clock_ms,
        )  # fmt: skip

    async def get_run(self, run_id: str) -> RunInfo:
        self._check()
        return self._info(run_id)

    async def request_interrupt(self, run_id: str, requested_by: str, reason: str) -> bool:
        """As Store's: the first request is kept; RunEnded once the run ended."""
        row = self._row(run_id)
        if self.log.ended(run_id):
            raise errors.RunEnded(f"run {run_id} has already ended")
        if row.interrupt is not None:
            return False
        row.interrupt = (requested_by, self._clock_ms(), reason)
        return True

    # -- RunStore

    async def run_page(self, run_id: str, after: int, limit: int) -> list[StoredEvent]:
        return await self.log.stream_page(True, run_id, after, limit)

    async def conversation(
        self, session_id: str, run_id: str, limit: int
    ) -> list[tuple[str, str, list[bytes]]]:
        self._check()
        me = self._row(run_id)
        earlier = [
            (row.created, rid)
            for rid, row in self._runs.items()
            if rid != run_id
            and row.created < me.created
            and self.log._run(rid).session_id == session_id
            and self.log.ended(rid)
        ]
        out = []
        for _, rid in sorted(earlier)[-limit:] if limit > 0 else []:
            texts = [
                e.payload
                for e in self.log._run(rid).events
                if e.type in ("text_delta", "message_reset")
            ]
            out.append((rid, self._runs[rid].input, texts))
        return out

    async def set_status(self, run_id: str, epoch: int, status: str) -> bool:
        self._check()
        if not self._owns(run_id, epoch):
            return False
        self._row(run_id).status = status
        return True

    async def interrupt_request(self, run_id: str) -> tuple[str, int, str] | None:
        self._check()
        return self._row(run_id).interrupt

    async def load_steps(self, run_id: str) -> list[StepRecord]:
        self._check()
        return [rec for _, rec in sorted(self._steps.get(run_id, {}).items())]

    async def record_step(
        self, *, run_id: str, epoch: int, idx: int, name: str, kind: StepKind, done: bool,
        result: bytes | None, seq: int,
    ) -> None:  # fmt: skip
        self._fence(run_id, epoch)
        old = self._steps[run_id].get(idx)
        self._steps[run_id][idx] = StepRecord(
            idx=idx, name=name if old is None else old.name, kind=kind if old is None else old.kind,
            done=done, result=result, seq=seq, epoch=epoch if old is None else old.epoch,
            last_epoch=epoch,
        )  # fmt: skip

    async def create_approval(
        self, *, approval_id: str, run_id: str, epoch: int, tool_call_id: str, summary: str,
        expires_at_ms: int, call_digest: str = "",
    ) -> None:  # fmt: skip
        self._fence(run_id, epoch)
        if approval_id not in self._approvals:
            self._approvals[approval_id] = _Approval(
                approval_id, run_id, tool_call_id, summary, expires_at_ms, call_digest
            )

    async def approval(self, approval_id: str) -> ApprovalInfo:
        self._check()
        a = self._approvals.get(approval_id)
        if a is None:
            raise errors.ApprovalNotFound(f"no approval {approval_id}")
        return self._approval_info(a)

    async def poll_approval(self, approval_id: str) -> ApprovalInfo:
        return await self.approval(approval_id)

    async def expire_approval(self, approval_id: str, *, run_id: str, epoch: int) -> ApprovalInfo:
        self._fence(run_id, epoch)
        a = self._approvals.get(approval_id)
        now = self._clock_ms()
        if a is not None and a.run_id == run_id and a.decision is None and a.expires_at_ms <= now:
            a.decision, a.decided_by, a.decided_at_ms = "expired", "system", now
        return await self.approval(approval_id)

    async def run_approvals(self, run_id: str) -> list[ApprovalInfo]:
        self._check()
        return [self._approval_info(a) for a in self._approvals.values() if a.run_id == run_id]

    async def close_run_approvals(self, run_id: str, epoch: int) -> int:
        self._fence(run_id, epoch)
        closed = 0
        for a in self._approvals.values():
            if a.run_id == run_id and a.decision is None:
                a.decision, a.decided_by, a.decided_at_ms = "expired", "system", self._clock_ms()
                a.comment = "the run ended"
                closed += 1
        return closed

    # -- deciding (what the gateway does: Store.decide_approval)

    async def decide_approval(
        self, approval_id: str, decision: str, decided_by: str, comment: str = "",
        call_digest: str = "",
    ) -> tuple[ApprovalInfo, bool]:  # fmt: skip
        """The first valid decision wins (approvals.py's contract of `decide`)."""
        self._check()
        if decision not in ("approve", "reject"):
            raise errors.ClientError("decision must be 'approve' or 'reject'")
        a = self._approvals.get(approval_id)
        if a is None:
            raise errors.ApprovalNotFound(f"no approval {approval_id}")
        now = self._clock_ms()
        digest_ok = not call_digest or a.call_digest == call_digest
        if a.decision is None and a.expires_at_ms > now and digest_ok:
            a.decision, a.decided_by, a.decided_at_ms, a.comment = (
                decision,
                decided_by,
                now,
                comment,
            )
            return self._approval_info(a), True
        return approvals.not_taken(self._approval_info(a), decision, call_digest)

    # -- helpers

    def _check(self) -> None:
        self.log._check()

    def _row(self, run_id: str) -> _RunRow:
        row = self._runs.get(run_id)
        if row is None:
            raise errors.RunNotFound(f"no run {run_id}")
        return row

    def _owns(self, run_id: str, epoch: int) -> bool:
        return self.log.owner_epoch(run_id) == epoch and not self.log.ended(run_id)

    def _fence(self, run_id: str, epoch: int) -> None:
        self._check()
        if not self._owns(run_id, epoch):
            raise errors.StaleEpoch(
                f"run {run_id}: epoch {epoch} is no longer the owner's, or the run has ended;"
                " nothing was written"
            )

    def _info(self, run_id: str) -> RunInfo:
        row = self._row(run_id)
        run = self.log._run(run_id)
        status = row.status
        if run.ended:
            status = _end_status(run.events[-1].payload)
        return RunInfo(
            run_id=run_id, session_id=run.session_id, status=status, started_by=row.started_by,
            model=row.model, input=row.input, owner_id=None, owner_epoch=run.epoch,
            last_seq=len(run.events), created_at_ms=row.created_at_ms,
            ended_at_ms=None, takeovers=row.takeovers,
        )  # fmt: skip

    def _approval_info(self, a: _Approval) -> ApprovalInfo:
        return ApprovalInfo(
            approval_id=a.approval_id, run_id=a.run_id,
            session_id=self.log._run(a.run_id).session_id, tool_call_id=a.tool_call_id,
            summary=a.summary, expires_at_ms=a.expires_at_ms, decision=a.decision,
            decided_by=a.decided_by, decided_at_ms=a.decided_at_ms, comment=a.comment,
            call_digest=a.call_digest,
        )  # fmt: skip


def _end_status(payload: bytes) -> str:
    end = events.decode_stored(payload)
    return end.status if isinstance(end, events.RunEnd) else "completed"
