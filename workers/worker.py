"""`Worker`: takes run jobs, owns runs, executes them, hands them over.

Job intake: a durable pull consumer (`runlog-workers`) on the JOBS stream, a
work queue shared by every worker; each fetch asks for as many jobs as the
worker has free slots (`concurrency`). For a job:

1. an earlier run of the same session is still active (session run policy
   'enqueue') → the job is nak'ed with a short delay and comes back later,
   unless a stop was requested for it: then it is taken at once and ends
   `aborted` (a queued run is cancelled within one redelivery delay);
2. `claim_queued` takes the run (epoch + lease) → None means another worker
   has it or it ended: the job is acked and dropped;
3. the job is acked, then the run executes (`agent.py`).

Ownership: one lease per owned run, renewed every `lease_s / 3`
(`lease.py`); a lost lease cancels the run at once. Every
`reaper_interval_s` each worker looks for runs whose lease ran out and takes
them over (`takeover.py`), and re-sends jobs of runs queued for longer than
`stale_queued_s` (a job message lost between PostgreSQL and JetStream).
Every `liveness_interval_s` it looks for runs whose owner's liveness lock
nobody holds — the owner's process died (`liveness.py`) — and takes them
over at once.

Takeover bound: a worker whose process died (kill -9, OOM) has its runs
taken over within about `liveness_interval_s` plus the resume (a second or
two); a worker that is paused or cut off (its connections open), within
`lease_s + reaper_interval_s` (17 s by default) of its last renewal; a drained worker's
waiting runs within `reaper_interval_s` — by a worker that has reached
PostgreSQL without a failure for `lease_s` (since it started, or since an
outage): after an outage, the owners renew first.

PostgreSQL outages (up to `storage_outage_grace_s`) are ridden out: a
worker keeps its runs while renewals fail (lease.py), their events wait in
the appender's bounded buffer (the model is paused when it is full) and are
committed when PostgreSQL is back, where the fence decides.

Drain (SIGTERM): no new jobs; runs waiting for an approval are released at
once (another worker resumes them from their checkpoint); streaming runs get
`drain_timeout_s` to finish; the rest are ended with run_error
`worker_draining` (retryable) + run_end failed. Every event appended before
is committed before the worker exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from typing import NamedTuple

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from prometheus_client import CollectorRegistry

from broker import control, errors
from broker.constants import JOBS_STREAM, JOBS_SUBJECT
from broker.runtime import Broker
from broker.settings import Settings
from broker.store import DB_ERRORS, Ownership, RunInfo

from .adapters.factory import close_adapter, make_adapter, model_name
from .api import Agent as AgentFn
from .context import RunContext
from .follower import ControlFollower
from .lease import keep_lease
from .liveness import Liveness
from .loop import MODEL_STEP, BuiltinAgent
from .metrics import WorkerMetrics
from .model import ModelAdapter
from .runner import Outcome, load_agent, run_agent
from .signals import RunSignals
from .takeover import plan_takeover
from .tools import ToolRegistry, load_tools

log = logging.getLogger(__name__)

CONSUMER = "runlog-workers"
_JOB_ACK_WAIT_S = 10.0
_FETCH_TIMEOUT_S = 1.0


class _Owned(NamedTuple):
    ownership: Ownership
    signals: RunSignals
    task: asyncio.Task[None]


class Worker:
    def __init__(
        self,
        broker: Broker,
        settings: Settings,
        *,
        concurrency: int | None = None,
        registry: CollectorRegistry | None = None,
        adapter: ModelAdapter | None = None,
        tools: ToolRegistry | None = None,
        worker_id: str | None = None,
        agent: AgentFn | None = None,
    ) -> None:
        self.broker = broker
        self.settings = settings
        self.concurrency = max(1, concurrency or settings.worker_concurrency)
        self._drain_requested = asyncio.Event()
        self.worker_id = worker_id or settings.worker_id or _default_id()
        self.registry = registry if registry is not None else CollectorRegistry()
        self._adapter = adapter
        self._tools = tools
        # An agent written against workers.api (setting `agent`); none: the
        # built-in one (`loop.py`), made at start.
        self._agent = agent
        self._default_model = ""  # run_start's model for runs that ask for none
        self.metrics: WorkerMetrics | None = None
        self._runs: dict[str, _Owned] = {}
        self._slot_freed = asyncio.Event()
        self._draining = False
        self._closed = False
        self._tasks: list[asyncio.Task[None]] = []
        self._psub: JetStreamContext.PullSubscription | None = None
        # When this worker last saw PostgreSQL fail (monotonic; its start
        # counts): its reaper takes nothing over for a lease after it.
        self._storage_trouble_at = 0.0
        self._taking: set[str] = set()  # runs a takeover is claiming right now
        self._liveness = Liveness(settings.database_url, settings.worker_liveness_grace_s)

    @property
    def active_runs(self) -> list[str]:
        return list(self._runs)

    @property
    def draining(self) -> bool:
        return self._draining

    async def start(self) -> None:
        if self._tools is None:
            self._tools = load_tools(self.settings.tools)
        if self._agent is None and self.settings.agent:
            self._agent = load_agent(self.settings.agent)
        if self._adapter is None:
            self._adapter = make_adapter(self.settings)
        if self._agent is None:  # the built-in agent: the model adapter and the tools
            self._default_model = model_name(self._adapter, self.settings)
            self._agent = BuiltinAgent(self._adapter, self._tools, model_name=self._default_model)
        self.metrics = WorkerMetrics(self.registry, self._tools.names())
        self._storage_trouble_at = time.monotonic()
        await self._liveness.start()  # before any claim: every run we own records its key
        self._psub = await self.broker.bus.js.pull_subscribe(
            JOBS_SUBJECT,
            durable=CONSUMER,
            stream=JOBS_STREAM,
            config=api.ConsumerConfig(
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=_JOB_ACK_WAIT_S,
                max_deliver=-1,
                max_ack_pending=10000,
            ),
        )
        self._tasks = [
            asyncio.create_task(self._intake_loop(), name="runlog-worker-intake"),
            asyncio.create_task(self._reaper_loop(), name="runlog-worker-reaper"),
            asyncio.create_task(self._orphan_loop(), name="runlog-worker-orphans"),
        ]
        log.info("worker %s started (concurrency %d)", self.worker_id, self.concurrency)

    async def drain(self, timeout_s: float | None = None) -> None:
        """Stop taking jobs; release waiting runs; let the others finish within
        `timeout_s` (default drain_timeout_s), then end them (worker_draining)."""
        if self._draining:
            return
        self._draining = True
        timeout_s = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        # The intake loop notices the flag within one fetch (≤ 1 s) and naks
        # anything it fetched meanwhile; the reaper finishes its round.
        self._drain_requested.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for owned in self._runs.values():
            owned.signals.release()
        pending = [o.task for o in self._runs.values()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=timeout_s)
            if still:
                log.info("drain: ending %d run(s) still running", len(still))
                for owned in list(self._runs.values()):
                    owned.signals.end_for_drain()
                _, stuck = await asyncio.wait(still, timeout=10.0)
                for t in stuck:  # cannot write (PostgreSQL down?): a takeover ends them
                    t.cancel()
                await asyncio.gather(*stuck, return_exceptions=True)
        log.info("worker %s drained", self.worker_id)

    async def close(self) -> None:
        """Drain (if not done), then let go of NATS resources and the adapter.
        The broker is the caller's to close."""
        if self._closed:
            return
        await self.drain()
        self._closed = True
        psub, self._psub = self._psub, None
        if psub is not None:
            try:
                await psub.unsubscribe()
            except (nats.errors.Error, OSError, TimeoutError):
                pass
        await self._liveness.close()
        if self._adapter is not None:
            await close_adapter(self._adapter)
        # An agent holding resources (a pool, a client) lets go of them here.
        aclose = getattr(self._agent, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                log.exception("the agent's aclose() failed")

    # -- intake

    async def _intake_loop(self) -> None:
        assert self._psub is not None
        while not self._draining:
            free = self.concurrency - len(self._runs)
            if free <= 0:
                self._slot_freed.clear()
                try:
                    async with asyncio.timeout(_FETCH_TIMEOUT_S):
                        await self._slot_freed.wait()
                except TimeoutError:
                    pass
                continue
            try:
                msgs = await self._psub.fetch(batch=free, timeout=_FETCH_TIMEOUT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except (nats.errors.Error, OSError) as e:
                log.warning("job fetch failed: %s", e)
                await asyncio.sleep(0.5)
                continue
            for msg in msgs:
                try:
                    await self._take_job(msg)
                except (nats.errors.Error, OSError, TimeoutError) as e:
                    log.warning("job ack failed: %s (it will be redelivered)", e)
                except Exception:
                    # Intake must outlive any one job: the job is redelivered
                    # (not acked) or reconciled from PostgreSQL.
                    log.exception("job intake failed for one job; going on")

    async def _take_job(self, msg: Msg) -> None:
        m = self.metrics
        assert m is not None
        if self._draining:
            await msg.nak()
            return
        try:
            job = control.decode_job(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.error("undecodable job message; dropped")
            m.jobs.labels("bad").inc()
            await msg.term()
            return
        store = self.broker.store
        if job.wake:
            await self._take_wake_job(msg, job.run_id)
            return
        try:
            # A stopped run does not wait its turn: it only has to end (it is
            # claimed and ends at once, run_start then the stop, see agent.py).
            if await store.earlier_active_runs(
                job.session_id, job.run_id
            ) and not await store.interrupt_request(job.run_id):
                m.jobs.labels("deferred").inc()
                await msg.nak(delay=self._retry_delay(msg))
                return
            if await self._take_fairer(msg, job.run_id):
                return
            own = await store.claim_queued(
                job.run_id, self.worker_id, self.settings.worker_lease_s, self._liveness.key
            )
        except DB_ERRORS as e:
            log.warning("job %s: PostgreSQL unavailable (%s); offered again later", job.run_id, e)
            await msg.nak(delay=1.0)
            return
        try:
            await msg.ack()
        except (nats.errors.Error, OSError, TimeoutError) as e:
            # Redelivered later; claim_queued then finds the run taken.
            log.warning("job %s: ack failed (%s)", job.run_id, e)
        if own is None:
            m.jobs.labels("duplicate").inc()
            return
        m.jobs.labels("started").inc()
        self._spawn(own)

    async def _take_fairer(self, msg: Msg, run_id: str) -> bool:
        """Fair shares between users: a run whose user has
        `worker_user_max_runs` executing waits (the job comes back later); a
        queued run of a user with fewer runs executing than this one's, or
        as many and served less recently, is taken first (round robin; this
        job comes back at once). True if the job was handled."""
        m, store, s = self.metrics, self.broker.store, self.settings
        assert m is not None
        load = await store.starter_load(run_id)
        if load is None:
            return False  # taken already, or ended: claim_queued says so
        user, executing, last_started = load
        cap = s.worker_user_max_runs
        if cap > 0 and executing >= cap:
            m.jobs.labels("capped").inc()
            await msg.nak(delay=self._retry_delay(msg))
            return True
        fairer = await store.fairer_queued_run(user, executing, last_started)
        if fairer is None:
            return False
        own = await store.claim_queued(
            fairer[0], self.worker_id, s.worker_lease_s, self._liveness.key
        )
        if own is None:
            return False  # someone took it meanwhile: this one's turn after all
        m.jobs.labels("yielded").inc()
        m.jobs.labels("started").inc()
        self._spawn(own)
        await msg.nak()
        return True

    async def _take_wake_job(self, msg: Msg, run_id: str) -> None:
        """A parked run has something to act on: resume it here. Acked first:
        lost, the reapers find the run anyway (ready_parked_runs)."""
        try:
            await msg.ack()
        except (nats.errors.Error, OSError, TimeoutError) as e:
            log.warning("wake-up of run %s: ack failed (%s)", run_id, e)
        try:
            await self._take_over(run_id, parked=True)
        except DB_ERRORS as e:
            log.warning("run %s: cannot wake it (%s); a reaper will", run_id, e)

    def _retry_delay(self, msg: Msg) -> float:
        """Offer a deferred job again soon, then less often (a session's earlier
        run may wait for an approval for a long time)."""
        base = self.settings.worker_enqueue_retry_s
        try:
            delivered = msg.metadata.num_delivered or 1
        except (ValueError, TypeError, AttributeError):
            delivered = 1
        return min(base * delivered, max(base, 2.0))

    # -- execution

    def _spawn(
        self, own: Ownership, *, resumed: bool = False, woken: bool = False, counted: bool = False
    ) -> None:
        """`counted`: a takeover whose outcome the resume tells."""
        signals = RunSignals()
        task = asyncio.create_task(
            self._execute(own, signals, resumed, woken, counted), name=f"run-{own.run_id}"
        )
        self._runs[own.run_id] = _Owned(own, signals, task)
        assert self.metrics is not None
        self.metrics.runs_active.set(len(self._runs))

    async def _execute(
        self,
        own: Ownership,
        signals: RunSignals,
        resumed: bool,
        woken: bool,
        counted: bool,
    ) -> None:
        b = self.broker
        m = self.metrics
        assert m is not None and self._adapter is not None and self._tools is not None
        task = asyncio.current_task()
        assert task is not None
        follower = ControlFollower(b.bus, own.run_id, signals)
        lease: asyncio.Task[None] | None = None
        outcome: Outcome = "lost"

        def lost() -> None:
            task.cancel()  # nothing more may be appended by this worker

        try:
            lease = asyncio.create_task(
                keep_lease(
                    b.store, own, self.settings.worker_lease_s, signals, lost,
                    outage_grace_s=self.settings.storage_outage_grace_s,
                )
            )  # fmt: skip
            # Concurrently: they are all on the path to run_start.
            # return_exceptions: every call finishes before we go on (or out),
            # so `follower.close()` below never races a start still in flight.
            results = await asyncio.gather(
                follower.start(),
                b.store.interrupt_request(own.run_id),
                b.store.get_run(own.run_id),
                return_exceptions=True,
            )
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            stop, run = results[1], results[2]
            assert not isinstance(stop, BaseException) and isinstance(run, RunInfo)
            if stop is not None:
                signals.request_stop(*stop)
            ctx = RunContext(
                writer=b.writer(own),
                run=run,
                signals=signals,
                store=b.store,
                settings=self.settings,
                metrics=m,
                registry=self._tools,
            )
            if counted:
                ctx.on_resume = lambda outcome: m.takeovers.labels(outcome).inc()
            assert self._agent is not None
            outcome = await run_agent(
                ctx, self._agent, resumed=resumed, woken=woken, model=self._default_model
            )
        except asyncio.CancelledError:
            log.info("run %s: cancelled (ownership lost or worker closing)", own.run_id)
        except Exception:
            log.exception("run %s: could not execute", own.run_id)
        finally:
            if lease is not None:
                lease.cancel()
                await asyncio.gather(lease, return_exceptions=True)
            await follower.close()
            if outcome == "released":
                await self._release(own)
            elif outcome == "parked":
                await self._park(own, signals.parked_on)
            m.runs.labels(outcome).inc()
            self._runs.pop(own.run_id, None)
            m.runs_active.set(len(self._runs))
            self._slot_freed.set()

    async def _release(self, own: Ownership) -> None:
        try:
            await self.broker.store.release(own.run_id, own.epoch)
        except DB_ERRORS as e:
            log.warning("run %s: release failed (%s); its lease will run out", own.run_id, e)

    async def _park(self, own: Ownership, approval_id: str) -> None:
        try:
            parked = await self.broker.store.park(own.run_id, own.epoch, approval_id)
        except DB_ERRORS as e:
            log.warning("run %s: cannot park it (%s); its lease will run out", own.run_id, e)
            return
        if parked:
            log.debug("run %s: parked on approval %s", own.run_id, approval_id)

    # -- takeovers and lost jobs

    async def _reaper_loop(self) -> None:
        while not self._draining:
            try:
                await self._reap_once()
            except DB_ERRORS as e:
                self._storage_trouble_at = time.monotonic()
                log.warning("reaper round failed: %s", e)
            except nats.errors.Error as e:
                log.warning("reaper round failed: %s", e)
            except Exception:
                log.exception("reaper round failed")
            # Drain wakes this sleep; a round in progress is never cancelled
            # (a claim without its spawn or its end would strand the run).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.worker_reaper_interval_s):
                    await self._drain_requested.wait()

    def _side_effect_tools(self) -> frozenset[str]:
        reg = self._tools
        if reg is None:
            return frozenset()
        return frozenset(n for n in reg.names() if (t := reg.get(n)) is not None and t.side_effects)

    def _may_take_over(self) -> bool:
        """Expired leases are taken over only once this worker has reached
        PostgreSQL without a failure for `worker_lease_s` — since it started,
        or since it last saw PostgreSQL fail. After an outage every lease in
        the table has run out, but the owners still hold their runs
        (lease.py) and renew within a second or so of PostgreSQL's return:
        this gives them a lease's time to. It only decides who gets a run,
        never safety: that is the fence's."""
        return time.monotonic() - self._storage_trouble_at >= self.settings.worker_lease_s

    async def _orphan_loop(self) -> None:
        """Take over, at once, the runs of owners that died (liveness.py)."""
        while not self._draining:
            try:
                if self._liveness.settled and len(self._runs) < self.concurrency:
                    for run_id, lock in await self.broker.store.orphaned_runs():
                        if self._draining or len(self._runs) >= self.concurrency:
                            break
                        await self._take_over(run_id, orphan_of=lock)
            except DB_ERRORS as e:
                log.warning("orphaned runs round failed: %s", e)
            except nats.errors.Error as e:
                log.warning("orphaned runs round failed: %s", e)
            except Exception:
                log.exception("orphaned runs round failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.worker_liveness_interval_s):
                    await self._drain_requested.wait()

    async def _take_over(
        self, run_id: str, *, orphan_of: int | None = None, parked: bool = False
    ) -> None:
        """Claim a run from an owner whose lease ran out (or, `orphan_of`, whose
        process died), or a parked run to wake (`parked`), and resume or end
        it. The claim fences the old owner."""
        if run_id in self._runs or run_id in self._taking:
            return  # ours, or being taken by the other loop
        self._taking.add(run_id)
        try:
            await self._claim_and_plan(run_id, orphan_of, parked)
        finally:
            self._taking.discard(run_id)

    async def _claim_and_plan(self, run_id: str, orphan_of: int | None, parked: bool) -> None:
        store, m, s = self.broker.store, self.metrics, self.settings
        assert m is not None
        key = self._liveness.key
        if parked:
            own = await store.claim_parked(run_id, self.worker_id, s.worker_lease_s, key)
            if own is None:
                m.jobs.labels("duplicate").inc()  # woken already, or ended
                return
            m.jobs.labels("woken").inc()
        else:
            own = await store.claim_expired(
                run_id, self.worker_id, s.worker_lease_s, key, orphan_of=orphan_of
            )
            if own is None:
                m.takeovers.labels("lost_race").inc()
                return
        why = (
            "parked, and woken"
            if parked
            else "its owner's lease ran out"
            if orphan_of is None
            else "its owner's process is gone"
        )
        try:
            plan = await plan_takeover(store, own)
            log.info("run %s: taken over (%s; %s)", run_id, plan.outcome, why)
            if plan.run:
                resumed = plan.outcome != "restarted"  # resumed, or failed by its replay
                # A resume is counted once its replay knows whether it can go
                # on (`resumed`) or must end the run (`failed`): run_agent.
                self._spawn(own, resumed=resumed, woken=parked, counted=resumed and not parked)
            else:
                turns = MODEL_STEP if isinstance(self._agent, BuiltinAgent) else ""
                await plan.end(
                    store, self.broker.writer(own), m, self._side_effect_tools(), turn_step=turns
                )
        except errors.RunlogError as e:
            # Another worker took it meanwhile, or PostgreSQL is away: the
            # lease we just took runs out and the run is taken over again.
            log.warning("run %s: takeover failed (%s)", run_id, e)
            return
        if not parked and not (plan.run and plan.outcome != "restarted"):
            m.takeovers.labels(plan.outcome).inc()

    async def _reap_once(self) -> None:
        store = self.broker.store
        m = self.metrics
        assert m is not None
        s = self.settings
        # Bounded: a round that hangs through an outage and then succeeds
        # must still count as having seen it.
        async with asyncio.timeout(s.worker_lease_s / 3):
            expired = await store.expired_runs()
        if not self._may_take_over():
            expired = []
        for run_id in expired:
            if self._draining or len(self._runs) >= self.concurrency:
                return  # full: the other workers take the rest
            await self._take_over(run_id)
        for run_id in await store.ready_parked_runs():
            if self._draining or len(self._runs) >= self.concurrency:
                return
            await self._take_over(run_id, parked=True)
        for run_id, session_id in await store.stale_queued_runs(s.worker_stale_queued_s):
            if await store.earlier_active_runs(session_id, run_id):
                continue  # waiting its turn, not lost
            m.jobs.labels("requeued").inc()
            await self.broker.bus.enqueue_job(
                control.RunJob(run_id=run_id, session_id=session_id, requested_at=_now_ms())
            )


def _default_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def _now_ms() -> int:
    return int(time.time() * 1000)
