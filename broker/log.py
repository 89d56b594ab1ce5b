"""The append path: micro-batched, fenced commits to PostgreSQL, then publish.

Contract:
- A run's events get `seq` 1, 2, 3, ... with no hole. The writer that owns
  the run assigns them when they are appended; the commit checks that the
  run's last committed seq and owner epoch are what the writer expects, so a
  writer that lost ownership (a newer epoch exists) appends nothing and gets
  StaleEpoch, for this and every later append. The commit of a `run_end`
  also clears `runs.checkpoint` in the same statement (workers before the
  one engine wrote it; none do now, and it stays NULL), and sets the run's
  status.
- Every event also gets its session's `cursor`, contiguous per session across
  all runs and all writers. Cursors are taken under the session row's lock,
  which is held until commit, so cursors commit in order: once cursor N is
  visible, every cursor below N is too. The same holds for seq per run.
- One transaction per flush, across runs: one statement (`_APPEND`) in its
  own implicit transaction, so either every accepted run's slice of the batch
  is committed or none is. Commits start at most once per
  `flush_interval_ms` unless a batch is full or urgent.
- Up to `append_flushers` flushes are in flight at once, on as many
  connections, and no two of them share a session: a batch takes the pending
  events of sessions that have none in flight (whole sessions, oldest first),
  and a session's later events wait until its flush is resolved. So a
  session's (and a run's) events still commit one flush after the other, in
  append order, and concurrent flushes of one process lock disjoint run and
  session rows. Below saturation one flush is done before the next is due, so
  there is one statement per interval, as with one flusher. After an ambiguous
  failure (connection lost before the statement's reply) the batch is simply
  retried: a slice the lost attempt committed is refused by the retry's
  fence, and every refused slice is looked up (`runs.last_seq, owner_epoch`
  = its last seq and epoch) by a later statement, after the fence waited out
  the lost attempt's row locks. So the writer learns it committed, not that
  it was fenced; nothing is written twice or lost.
- A PostgreSQL outage is ridden out: the batch's commit is retried for up
  to `storage_outage_grace_s` (nobody else can write meanwhile, and the
  fence decides once PostgreSQL is back), and appends go on into the pending
  list until `max_pending_events`, then wait — which pauses whatever
  produces them (a model stream). Past the grace the writers fail with
  StorageError.
- Only after commit is a run's slice published to JetStream (one message per
  run per flush, deduplicated by `Nats-Msg-Id`). A failed publish is retried;
  a dropped one is harmless, since subscribers fill holes from PostgreSQL.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import asyncpg
import msgspec
import nats.errors

from . import errors, events
from .bus import MAX_SLICE_BYTES, Bus, LiveBatch, encode_batch
from .constants import events_subject
from .metrics import BrokerMetrics
from .settings import Settings
from .store import TRANSIENT_DB_ERRORS as _TRANSIENT
from .store import Ownership, Store

log = logging.getLogger(__name__)

# Errors after which the transaction surely rolled back and can be retried.
_RETRY_SAFE = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)

# Committed without the linger: someone is waiting on these.
_URGENT_TYPES = frozenset(
    {"run_start", "approval_required", "approval_decided", "interrupt_requested", "run_end"}
)

# One flush is this one statement, in its own implicit transaction: one round
# trip, no BEGIN, no COMMIT (its reply is the commit's). In order:
# - `r`, the fence: a run's slice is accepted only while the run's epoch and
#   last seq are the writer's and it has not ended; the commit of a run_end
#   sets the status, ends the run and clears its checkpoint. (`= ANY` lets
#   PostgreSQL fetch just these rows by key, whatever its statistics say: a
#   join with the unnest alone was planned as a scan of every active run.)
# - `locked`, then `s`: each session with an accepted slice takes its cursors
#   under its row's lock, held until commit. The rows are locked in
#   session_id order whatever plan PostgreSQL picks (the CTE is materialized
#   and locks its rows one by one after the sort; the update joins every row
#   through it, so it never reaches a row the CTE has not locked), so
#   concurrent appenders never deadlock on them. `r` is read in full first
#   (the aggregate), so run rows are always locked before session rows.
# - `c`: each accepted slice's first cursor, slices of one session in array
#   order; `i` writes the accepted slices' events with their seqs and cursors
#   (the event arrays hold every slice, refused ones too, run after run: a
#   slice's events start after `off` others).
# A run's session always exists (runs.session_id references it, and deleting
# a session deletes its runs), so an accepted slice always gets its cursors.
_APPEND = """
WITH u AS (
    SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::int[], $5::text[], $6::int[])
        WITH ORDINALITY AS u(run_id, epoch, base, n, end_status, off, ord)
), r AS (
    UPDATE runs SET
        last_seq = u.base + u.n,
        status = COALESCE(u.end_status, runs.status),
        ended_at = CASE WHEN u.end_status IS NULL THEN runs.ended_at ELSE now() END,
        checkpoint = CASE WHEN u.end_status IS NULL THEN runs.checkpoint END
    FROM u
    WHERE runs.run_id = ANY($1::text[])
        AND runs.run_id = u.run_id AND runs.owner_epoch = u.epoch
        AND runs.last_seq = u.base AND runs.ended_at IS NULL
    RETURNING runs.run_id, runs.session_id, u.base, u.n, u.off, u.ord
), per_session AS (
    SELECT session_id, sum(n)::bigint AS n FROM r GROUP BY session_id
), locked AS MATERIALIZED (
    SELECT sessions.session_id FROM sessions JOIN per_session USING (session_id)
    ORDER BY sessions.session_id FOR NO KEY UPDATE OF sessions
), s AS (
    UPDATE sessions SET last_cursor = sessions.last_cursor + p.n
    FROM locked JOIN per_session AS p USING (session_id)
    WHERE sessions.session_id = locked.session_id
    RETURNING sessions.session_id, sessions.last_cursor - p.n AS before
), c AS (
    SELECT r.run_id, r.session_id, r.base, r.n, r.off,
        s.before + 1 - r.n
            + sum(r.n) OVER (PARTITION BY r.session_id ORDER BY r.ord) AS first_cursor
    FROM r JOIN s USING (session_id)
), i AS (
    INSERT INTO events (run_id, seq, session_id, cursor, ts, type, payload)
    SELECT c.run_id, c.base + k, c.session_id, c.first_cursor + k - 1, e.ts, e.type, e.payload
    FROM c CROSS JOIN LATERAL generate_series(1, c.n) AS k
    JOIN unnest($7::bigint[], $8::text[], $9::bytea[]) WITH ORDINALITY AS e(ts, type, payload, i)
        ON e.i = c.off + k
)
SELECT run_id, first_cursor FROM c
"""


class _Entry(NamedTuple):
    writer: RunWriter
    seq: int
    ts: int
    type: str
    payload: bytes
    t_append: float  # monotonic


class _Publish(NamedTuple):
    subject: str
    msg_id: str
    data: bytes
    t_commit: float  # monotonic


class RunWriter:
    """The handle through which the owner of one run appends to its log.

    `append` assigns the next seq and returns it at once (after waiting only
    if the process-wide backlog is full); `flush` waits until everything
    appended so far is committed. After a failure (StaleEpoch, RunEnded,
    StorageError) the writer is dead: every later call raises that error.
    """

    def __init__(self, appender: Appender, ownership: Ownership) -> None:
        self._appender = appender
        self.run_id = ownership.run_id
        self.session_id = ownership.session_id
        self.epoch = ownership.epoch
        self.committed_seq = ownership.last_seq
        self._next_seq = ownership.last_seq + 1
        self._error: errors.RunlogError | None = None
        self._end_status: str | None = None
        self._waiters: list[tuple[int, asyncio.Future[int]]] = []

    @property
    def last_seq(self) -> int:
        """The seq given to the latest append (committed or not)."""
        return self._next_seq - 1

    @property
    def error(self) -> errors.RunlogError | None:
        return self._error

    async def append(self, event: events.Event) -> int:
        """Append `event` (its run_id, session_id, seq and ts are set here)."""
        self._check()
        await self._appender.wait_for_space()
        self._check()
        event.run_id = self.run_id
        event.session_id = self.session_id
        event.seq = self._next_seq
        event.ts = self._appender.now_ms()
        payload = events.encode(event)
        # Strict check of what was built: a field of the wrong type in code
        # would otherwise reach the log and break every reader.
        typed = events.validate(payload, max_bytes=self._appender.settings.max_event_bytes)
        return self._enqueue(typed, payload)

    async def append_json(self, data: bytes) -> int:
        """Append an event given as JSON from outside (decoded strictly)."""
        self._check()
        typed = events.validate(data, max_bytes=self._appender.settings.max_event_bytes)
        return await self.append(typed)

    def _enqueue(self, event: events.AnyEvent, payload: bytes) -> int:
        seq = self._next_seq
        self._next_seq += 1
        tag = event.__struct_config__.tag
        assert isinstance(tag, str)
        if tag in events.TERMINAL_TYPES:
            self._end_status = getattr(event, "status", "completed")
        self._appender.enqueue(_Entry(self, seq, event.ts, tag, payload, time.monotonic()))
        return seq

    async def flush(self) -> int:
        """Wait until every event appended so far is committed; return its seq."""
        target = self._next_seq - 1
        if self._error is not None:
            raise self._error
        if self.committed_seq >= target:
            return self.committed_seq
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiters.append((target, fut))
        return await fut

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._end_status is not None:
            raise errors.RunEnded(f"run {self.run_id} has ended; nothing can follow run_end")

    def _committed(self, last_seq: int) -> None:
        self.committed_seq = last_seq
        if self._waiters:
            keep = []
            for target, fut in self._waiters:
                if target <= last_seq:
                    if not fut.done():
                        fut.set_result(last_seq)
                else:
                    keep.append((target, fut))
            self._waiters = keep

    def _fail(self, error: errors.RunlogError) -> None:
        if self._error is None:
            self._error = error
        for _, fut in self._waiters:
            if not fut.done():
                fut.set_exception(error)
        self._waiters = []


class Appender:
    """One per process: batches the appends of all its writers into
    transactions and publishes what committed.

    One dispatcher decides when a flush starts (the cadence) and what it
    takes (whole sessions with nothing in flight, oldest first); up to
    `append_flushers` flusher tasks commit the batches, one each. The pending
    bound (`max_pending_events`) counts what waits, not the batches being
    committed (at most `append_flushers` x `flush_max_events` more).
    """

    def __init__(
        self,
        store: Store,
        bus: Bus | None,
        settings: Settings,
        metrics: BrokerMetrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.metrics = metrics
        self._clock = clock
        # Pending events by session; sessions in the order their oldest
        # pending event arrived (a session stays in place after a partial take).
        self._pending: dict[str, list[_Entry]] = {}
        self._n_pending = 0
        self._n_takeable = 0  # pending events of sessions with no flush in flight
        self._in_flight: set[str] = set()  # sessions with a flush in flight
        self._urgent: set[str] = set()  # sessions with an urgent event pending
        self._flushers = max(1, settings.append_flushers)
        self._busy = 0  # flushes in flight
        self._batches: asyncio.Queue[tuple[list[_Entry], list[str]]] = asyncio.Queue()
        # Something changed for the dispatcher: a first event to take, a full
        # batch to take, an urgent event, a flush resolved.
        self._wake = asyncio.Event()
        self._free = asyncio.Event()  # a flusher became free
        self._space = asyncio.Event()
        self._space.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._publish_q: collections.deque[_Publish] = collections.deque()
        self._publish_wake = asyncio.Event()
        self._published_idle = asyncio.Event()
        self._published_idle.set()
        self._closing = False
        self._napping: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    def writer(self, ownership: Ownership) -> RunWriter:
        return RunWriter(self, ownership)

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._dispatch_loop(), name="runlog-append-dispatch"),
            *(
                asyncio.create_task(self._flush_loop(), name=f"runlog-append-flush-{i}")
                for i in range(self._flushers)
            ),
            asyncio.create_task(self._publish_loop(), name="runlog-append-publish"),
        ]

    async def close(self, timeout_s: float = 10.0) -> None:
        """Commit what is pending, publish what committed (bounded), stop."""
        self._closing = True
        self._wake.set()
        self._end_nap()
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
                if self.bus is not None:
                    await self._published_idle.wait()
        except TimeoutError:
            log.warning(
                "appender closed with %d events uncommitted, %d messages unpublished",
                self._n_pending,
                len(self._publish_q),
            )
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def wait_for_space(self) -> None:
        while self._n_pending >= self.settings.max_pending_events:
            # Full: PostgreSQL is slow or away, and the flushers, stuck in
            # commits, cannot update the gauge meanwhile.
            self.metrics.pending_events.set(self._n_pending)
            self._space.clear()
            await self._space.wait()

    def enqueue(self, entry: _Entry) -> None:
        if self._closing:
            raise errors.StorageError("this process is shutting down; append refused")
        sid = entry.writer.session_id
        queue = self._pending.get(sid)
        if queue is None:
            self._pending[sid] = [entry]
        else:
            queue.append(entry)
        self._n_pending += 1
        self._idle.clear()
        if sid in self._in_flight:
            # It waits for its session's flush; the dispatcher hears of it then.
            if entry.type in _URGENT_TYPES:
                self._urgent.add(sid)
            return
        self._n_takeable += 1
        if entry.type in _URGENT_TYPES:
            self._urgent.add(sid)
            self._wake.set()
            self._end_nap()
        elif self._n_takeable == 1 or self._n_takeable == self.settings.flush_max_events:
            self._wake.set()
            self._end_nap()

    # -- flush

    async def _dispatch_loop(self) -> None:
        interval_s = self.settings.flush_interval_ms / 1000
        last_start = -interval_s
        while True:
            if not self._n_takeable:
                if self._busy == 0 and not self._n_pending:
                    self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._busy >= self._flushers:
                self._free.clear()
                await self._free.wait()
                continue
            if self._busy and not self._flush_now():
                # A flush is in flight: another starts only for a full batch
                # (or an urgent event, or a close). So below saturation there
                # is one flush at a time and one statement per interval, as
                # with a single flusher; several run only when one cannot
                # keep up.
                self._wake.clear()
                await self._wake.wait()
                continue
            # At most one flush starts per interval: a commit's cost is per
            # transaction (a round trip, a WAL flush), and at a model's pace
            # each carries a few events of many runs. An event waits at most
            # the interval (or the flush in flight); after idle, what is
            # pending commits at once. Full batches, events that people wait
            # on (a run starting, an approval, the end) and a close cut the
            # wait short.
            delay = last_start + interval_s - time.monotonic()
            if delay > 0 and not self._flush_now():
                await self._nap(delay)
                continue
            last_start = time.monotonic()
            self._busy += 1
            self._batches.put_nowait(self._take())

    def _flush_now(self) -> bool:
        return (
            self._closing
            or self._n_takeable >= self.settings.flush_max_events
            or not self._urgent <= self._in_flight
        )

    def _take(self) -> tuple[list[_Entry], list[str]]:
        """The next batch: the pending events of sessions with nothing in
        flight, whole sessions in order, up to `flush_max_events` (the last
        session's in part); those sessions are in flight from now on."""
        budget = self.settings.flush_max_events
        batch: list[_Entry] = []
        sessions: list[str] = []
        for sid, queue in self._pending.items():
            if sid in self._in_flight:
                continue
            sessions.append(sid)
            room = budget - len(batch)
            if len(queue) <= room:
                batch.extend(queue)
                queue.clear()
            else:
                batch.extend(queue[:room])
                del queue[:room]
            if len(batch) >= budget:
                break
        for sid in sessions:
            queue = self._pending[sid]
            if not queue:
                del self._pending[sid]
                self._urgent.discard(sid)
            elif sid in self._urgent and not any(e.type in _URGENT_TYPES for e in queue):
                self._urgent.discard(sid)
        self._in_flight.update(sessions)
        self._n_pending -= len(batch)
        # What is left of the last session waits for this flush.
        self._n_takeable -= len(batch) + len(self._pending.get(sessions[-1], ()))
        self.metrics.pending_events.set(self._n_pending)
        if self._n_pending < self.settings.max_pending_events:
            self._space.set()
        return batch, sessions

    async def _flush_loop(self) -> None:
        while True:
            batch, sessions = await self._batches.get()
            try:
                await self._commit_batch(batch)
            except Exception as e:  # a bug: fail the batch's writers, keep serving
                log.exception("append batch failed")
                err = errors.InternalError(f"append failed: {type(e).__name__}")
                for entry in batch:
                    entry.writer._fail(err)
            finally:
                self._in_flight.difference_update(sessions)
                for sid in sessions:
                    self._n_takeable += len(self._pending.get(sid, ()))
                self._busy -= 1
                self._free.set()
                self._wake.set()

    async def _nap(self, delay_s: float) -> None:
        """Sleep `delay_s`, or less if `_end_nap` is called (a timer and a
        future: no task per nap)."""
        loop = asyncio.get_running_loop()
        fut = self._napping = loop.create_future()
        timer = loop.call_later(delay_s, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._napping = None

    def _end_nap(self) -> None:
        if self._napping is not None:
            _resolve(self._napping)

    async def _commit_batch(self, batch: list[_Entry]) -> None:
        groups: dict[RunWriter, list[_Entry]] = {}
        for entry in batch:
            if entry.writer._error is None:
                groups.setdefault(entry.writer, []).append(entry)
        if not groups:
            return
        # An outage is ridden out: nobody else can write while PostgreSQL is
        # away, and fencing decides the commit once it is back.
        deadline = time.monotonic() + self.settings.storage_outage_grace_s
        backoff = 0.05
        while True:
            try:
                accepted = await self._commit(groups)
                break
            except _RETRY_SAFE:
                self.metrics.flush_errors.labels("deadlock").inc()
                await asyncio.sleep(0.001)
                continue
            except _TRANSIENT as e:
                self.metrics.flush_errors.labels("connection").inc()
                log.warning("append commit failed (%s); retrying", type(e).__name__)
            except asyncpg.PostgresError as e:
                self.metrics.flush_errors.labels("other").inc()
                log.warning("append commit failed (%s); retrying", e)
            # Unknown outcome. Retrying is safe: if this attempt did commit,
            # the retry's fence refuses every slice and `_commit` recognizes
            # them as committed (it asks, for every refused writer).
            if time.monotonic() > deadline:
                # A last look: the lost reply may have been a COMMIT that
                # succeeded, and those events must not be reported as lost.
                try:
                    async with self.store.pool.acquire() as conn:
                        accepted = await _slices_committed(conn, groups)
                except (*_TRANSIENT, asyncpg.PostgresError):
                    accepted = {}
                if accepted:
                    break
                err = errors.StorageError(
                    "PostgreSQL unavailable: the commit of these events is not confirmed",
                    hint="the writer is unusable: take the run again (claim) to go on",
                )
                for w in groups:
                    w._fail(err)
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)
        self._after_commit(groups, accepted, batch)

    async def _commit(self, groups: dict[RunWriter, list[_Entry]]) -> dict[RunWriter, int]:
        """One statement, one transaction. Returns each accepted writer's first cursor."""
        writers = list(groups)
        run_ids, epochs, bases, counts, end_status, offsets = [], [], [], [], [], []
        e_ts: list[int] = []
        e_types: list[str] = []
        e_payloads: list[bytes] = []
        for w in writers:
            entries = groups[w]
            run_ids.append(w.run_id)
            epochs.append(w.epoch)
            bases.append(entries[0].seq - 1)
            counts.append(len(entries))
            end_status.append(w._end_status if entries[-1].type in events.TERMINAL_TYPES else None)
            offsets.append(len(e_ts))
            for e in entries:
                e_ts.append(e.ts)
                e_types.append(e.type)
                e_payloads.append(e.payload)
        t0 = time.monotonic()
        async with self.store.pool.acquire() as conn:
            rows = await conn.fetch(
                _APPEND,
                run_ids,
                epochs,
                bases,
                counts,
                end_status,
                offsets,
                e_ts,
                e_types,
                e_payloads,
            )
            first = dict(rows)
            accepted = {w: first[w.run_id] for w in writers if w.run_id in first}
            if len(accepted) < len(writers):
                # A refused slice is fenced, or was committed by an earlier
                # attempt of this batch whose reply was lost. The fence waited
                # for that attempt's row locks if it was still in flight, so
                # this later statement sees its outcome.
                refused = {w: groups[w] for w in writers if w not in accepted}
                accepted.update(await _slices_committed(conn, refused))
        self.metrics.commit_seconds.observe(time.monotonic() - t0)
        return accepted

    def _after_commit(
        self,
        groups: dict[RunWriter, list[_Entry]],
        accepted: dict[RunWriter, int],
        batch: list[_Entry],
    ) -> None:
        now = time.monotonic()
        wall_ms = self._clock() * 1000
        m = self.metrics
        n_committed = sum(len(groups[w]) for w in accepted)
        m.events_appended.inc(n_committed)
        m.batch_events.observe(n_committed)
        m.append_latency_seconds.observe(now - batch[0].t_append)
        for w, entries in groups.items():
            if w not in accepted:
                m.fenced.inc()
                w._fail(
                    errors.StaleEpoch(
                        f"run {w.run_id}: epoch {w.epoch} is no longer the owner's; "
                        "nothing was appended"
                    )
                )
                continue
            w._committed(entries[-1].seq)
            if self.bus is not None:
                self._queue_publish(w, entries, accepted[w], now, wall_ms)
        if self.bus is not None:
            self._publish_wake.set()

    # -- publish

    def _queue_publish(
        self, w: RunWriter, entries: list[_Entry], cursor: int, now: float, wall_ms: float
    ) -> None:
        subject = events_subject(w.session_id, w.run_id)
        start = 0
        while start < len(entries):
            size = 0
            end = start
            while end < len(entries) and (end == start or size < MAX_SLICE_BYTES):
                size += len(entries[end].payload)
                end += 1
            chunk = entries[start:end]
            first = chunk[0]
            data = encode_batch(
                LiveBatch(
                    run_id=w.run_id,
                    session_id=w.session_id,
                    seq=first.seq,
                    cursor=cursor + start,
                    events=[msgspec.Raw(e.payload) for e in chunk],
                    types=[e.type for e in chunk],
                    ended=chunk[-1].type in events.TERMINAL_TYPES,
                    committed_ms=wall_ms,
                )
            )
            self._publish_q.append(_Publish(subject, f"{w.run_id}:{first.seq}", data, now))
            start = end
        while len(self._publish_q) > self.settings.publish_backlog_max:
            self._publish_q.popleft()
            self.metrics.publish_dropped.inc()
        self._published_idle.clear()
        self.metrics.publish_backlog.set(len(self._publish_q))

    async def _publish_loop(self) -> None:
        backoff = 0.05
        while True:
            await self._publish_wake.wait()
            self._publish_wake.clear()
            while self._publish_q and self.bus is not None:
                items = [self._publish_q[i] for i in range(min(256, len(self._publish_q)))]
                acked = await self._publish_some(items)
                # By identity: while we waited, a full backlog may have
                # dropped some of these from the front already.
                done = {id(it) for it in items[:acked]}
                while self._publish_q and id(self._publish_q[0]) in done:
                    self._publish_q.popleft()
                self.metrics.publish_backlog.set(len(self._publish_q))
                if acked < len(items):
                    self.metrics.publish_retries.inc(len(items) - acked)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, self.settings.publish_retry_max_s)
                else:
                    backoff = 0.05
            self._published_idle.set()

    async def _publish_some(self, items: list[_Publish]) -> int:
        """Publish `items` pipelined; return how many from the front were acked."""
        assert self.bus is not None
        futures = []
        try:
            for it in items:
                futures.append(await self.bus.publish_live(it.subject, it.data, it.msg_id))
        except (nats.errors.Error, OSError) as e:
            log.warning("live publish failed: %s", e)
        if not futures:
            return 0
        done, pending = await asyncio.wait(futures, timeout=5.0)
        for f in pending:
            f.cancel()
        ok = [f in done and not f.cancelled() and f.exception() is None for f in futures]
        acked = 0
        now = time.monotonic()
        for it, good in zip(items, ok, strict=False):
            if not good:
                break
            acked += 1
            self.metrics.publish_lag_seconds.observe(now - it.t_commit)
        self.metrics.published_messages.inc(acked)
        return acked


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def _slices_committed(
    conn: asyncpg.Connection, groups: dict[RunWriter, list[_Entry]]
) -> dict[RunWriter, int]:
    """Which writers' slices are committed already, with each one's first
    cursor (what `_commit` returns for them). A run whose `(last_seq,
    owner_epoch)` is its writer's slice's last seq and epoch holds that slice:
    only this writer appends under its epoch, and nothing follows its slice
    until the slice's batch is resolved."""
    writers = list(groups)
    rows = await conn.fetch(
        "SELECT run_id, last_seq, owner_epoch FROM runs WHERE run_id = ANY($1::text[])",
        [w.run_id for w in writers],
    )
    state = {r[0]: (r[1], r[2]) for r in rows}
    done = [w for w in writers if state.get(w.run_id) == (groups[w][-1].seq, w.epoch)]
    if not done:
        return {}
    crow = await conn.fetch(
        "SELECT e.run_id, e.cursor FROM events e"
        " JOIN unnest($1::text[], $2::bigint[]) AS u(run_id, seq)"
        " ON e.run_id = u.run_id AND e.seq = u.seq",
        [w.run_id for w in done],
        [groups[w][0].seq for w in done],
    )
    first = {r[0]: r[1] for r in crow}
    return {w: first[w.run_id] for w in done if w.run_id in first}
