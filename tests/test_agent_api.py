"""The agent API (workers/api.py): agents of our own run as runlog workers,
in-process and as `runlog worker` processes killed mid-run.

The stop tests every adapter shares are tests/test_agent_contract.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker import events, ids
from broker.runtime import Broker
from broker.settings import Settings
from workers.api import AgentError

from .agents import api_agents
from .helpers import sample
from .workerkit import (
    DOOMED,
    WorkerProcess,
    of,
    read_run,
    running_worker,
    start,
    text_of,
    wait_event,
    wait_until,
)

AGENTS = "tests.agents.api_agents"
_DOOMED = DOOMED


def _count(d: Path, name: str) -> int:
    p = d / name
    return len(p.read_text()) if p.exists() else 0


def _spec(d: Path, **kw: object) -> str:
    return json.dumps({"dir": str(d), **kw})


async def test_events_steps_and_usage_of_an_agent_reach_the_log(
    settings: Settings, tmp_path: Path
) -> None:
    async with running_worker(settings, agent=f"{AGENTS}:scripted") as (b, _):
        _, run_id = await start(b, _spec(tmp_path, words=3))
        evs = await read_run(b, run_id)
    assert [type(e).__name__ for e in evs] == [
        "RunStart", "TextDelta", "TextDelta", "TextDelta", "TextDelta", "TextDelta", "RunEnd",
    ]  # fmt: skip
    assert text_of(evs) == "Looking. w0 w1 w2 end."
    first, second = dict.fromkeys(e.message_id for e in of(evs, events.TextDelta))
    assert ids.is_valid(first) and ids.is_valid(second) and first != second
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"
    assert end.usage == events.Usage(input_tokens=7, output_tokens=3)
    assert (_count(tmp_path, "search"), _count(tmp_path, "report")) == (1, 1)


async def test_an_approval_decides_the_agents_step(settings: Settings, tmp_path: Path) -> None:
    async with running_worker(settings, agent=f"{AGENTS}:scripted") as (b, _):
        for d in ("a", "r"):
            (tmp_path / d).mkdir()
        _, approved = await start(b, _spec(tmp_path / "a", approval=True))
        _, rejected = await start(b, _spec(tmp_path / "r", approval=True))
        for run_id, decision in ((approved, "approve"), (rejected, "reject")):
            req = await wait_event(b, run_id, "approval_required")
            assert isinstance(req, events.ApprovalRequired)
            assert req.summary == "delete 3 rows?"
            assert (await b.store.get_run(run_id)).status == "waiting_approval"
            await b.decide(
                req.approval_id, decision, "bob", "fine" if decision == "approve" else "no"
            )
        ok = await read_run(b, approved)
        no = await read_run(b, rejected)
    (card,) = of(ok, events.ToolCallStart)
    assert (card.tool_name, card.risk_level) == ("delete_rows", "high")
    assert "".join(a.partial_json for a in of(ok, events.ToolArgsDelta)) == '{"rows": [1, 2, 3]}'
    assert [(r.status, r.summary) for r in of(ok, events.ToolResult)] == [("ok", "deleted 3 rows")]
    assert [(r.status, r.summary) for r in of(no, events.ToolResult)] == [("denied", "no")]
    assert [d.decision for d in of(ok, events.ApprovalDecided)] == ["approve"]
    assert (_count(tmp_path / "a", "delete"), _count(tmp_path / "r", "delete")) == (1, 0)
    assert ok[-1].status == no[-1].status == "completed"  # type: ignore[union-attr]


async def test_an_agent_that_ignores_its_cancellation_is_aborted_after_the_grace(
    settings: Settings,
) -> None:
    async with running_worker(settings, agent=f"{AGENTS}:stubborn", agent_stop_grace_s=0.5) as (
        b,
        _,
    ):
        _, run_id = await start(b, "x")
        await wait_event(b, run_id, "text_delta")
        await b.interrupt(run_id, "alice", "")
        evs = await read_run(b, run_id, timeout_s=30)
        # Ended while the agent still ran (after the 0.5 s grace, not its 1 s).
        assert api_agents.SEEN[run_id] == ["ignored a cancellation"]
        await wait_until(lambda: _gave_up(run_id))
    assert evs[-1].status == "aborted"  # type: ignore[union-attr]


async def _gave_up(run_id: str) -> bool:
    return api_agents.SEEN[run_id][-1] == "gave up"


@pytest.mark.parametrize(
    ("spec", "code", "retryable", "message"),
    [
        ({"code": "index_offline"}, "index_offline", True, "the search index is offline"),
        ({}, "agent_error", False, "the agent raised KeyError"),
    ],
)
async def test_an_agents_exception_becomes_a_coded_run_error(
    settings: Settings,
    spec: dict[str, str],
    code: str,
    retryable: bool,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running_worker(settings, agent=f"{AGENTS}:fails") as (b, _):
        _, run_id = await start(b, json.dumps(spec))
        evs = await read_run(b, run_id, timeout_s=30)
    (err,) = of(evs, events.RunError)
    assert (err.code, err.retryable, err.message) == (code, retryable, message)
    assert evs[-1].status == "failed"  # type: ignore[union-attr]
    assert "secret-api-key-123" not in err.message


def test_error_codes_are_checked() -> None:
    with pytest.raises(ValueError, match="must match"):
        AgentError("Bad Code")


@pytest.mark.parametrize(("park_after_s", "swallowed"), [(-1.0, "Stopped"), (0.0, "Parked")])
async def test_runlogs_outcome_wins_over_an_agent_that_swallows_it(
    settings: Settings, park_after_s: float, swallowed: str
) -> None:
    """Waiting in its slot, the agent swallows the stop; parked (the
    default), it swallows the parking, and the stop ends the parked run."""
    async with running_worker(
        settings, agent=f"{AGENTS}:swallows", approval_park_after_s=park_after_s
    ) as (b, _):
        _, run_id = await start(b, "x")
        await wait_event(b, run_id, "approval_required")
        if park_after_s >= 0:

            async def parked() -> bool:
                return await b.store.parked_session(run_id) is not None

            await wait_until(parked)
        await b.interrupt(run_id, "alice", "no")
        evs = await read_run(b, run_id, timeout_s=30)
    assert api_agents.SEEN[run_id] == [swallowed]
    assert "carrying on" not in text_of(evs)
    assert evs[-1].status == "aborted"  # type: ignore[union-attr]
    # The card opened before the approval gets its result before the end.
    assert [r.status for r in of(evs, events.ToolResult)] == ["skipped"]


async def test_the_run_timeout_cuts_an_agent_short_but_not_while_it_waits(
    settings: Settings,
) -> None:
    async with running_worker(settings, agent=f"{AGENTS}:stalls", run_timeout_s=1.0) as (b, _):
        _, run_id = await start(b, "forever")
        evs = await read_run(b, run_id, timeout_s=30)
    (err,) = of(evs, events.RunError)
    assert err.code == "run_timeout"
    async with running_worker(
        settings, agent=f"{AGENTS}:swallows", run_timeout_s=1.0, approval_timeout_s=2.5
    ) as (b, _):
        _, run_id = await start(b, "x")
        evs = await read_run(b, run_id, timeout_s=30)
    # The approval expired (2.5 s > the 1 s budget): the wait did not count.
    assert [d.decision for d in of(evs, events.ApprovalDecided)] == ["expired"]
    assert of(evs, events.RunError) == [] and evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_an_agent_reads_the_sessions_conversation(settings: Settings) -> None:
    async with running_worker(settings, agent=f"{AGENTS}:chat") as (b, _):
        session_id, first = await start(b, "hello")
        evs = await read_run(b, first)
        assert text_of(evs) == "(nothing)"
        second = await b.start_run(session_id, "alice", input="again")
        evs = await read_run(b, second)
    assert text_of(evs) == "user:hello | assistant:(nothing)"


# -- takeovers: `runlog worker` processes killed


async def test_kill_9_mid_stream_resumes_from_the_last_step(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:scripted", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, words=400, delay_s=0.01))
        await wait_event(client, run_id, "text_delta", count=20)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:scripted") as (_, w):
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
    # The step before the kill ran once; the one after it, once, on the new worker.
    assert (_count(tmp_path, "search"), _count(tmp_path, "report")) == (1, 1)
    # The partial answer was retracted and streamed again, whole.
    (reset,) = of(evs, events.MessageReset)
    deltas = of(evs, events.TextDelta)
    assert deltas[0].delta == "Looking. "
    partial = [d for d in deltas if d.message_id == reset.message_id]
    assert 0 < len(partial) < 401
    after = [d for d in deltas if d.seq > reset.seq]
    assert "".join(d.delta for d in after) == "".join(f"w{i} " for i in range(400)) + "end."
    (again,) = {d.message_id for d in after}
    assert again != reset.message_id
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]


async def test_kill_9_while_waiting_for_an_approval_resumes_and_acts_once(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:scripted", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, approval=True, once=True))
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:scripted") as (_, w):
        await wait_until(
            lambda: _status_is(client, run_id, "waiting_approval", after_epoch=1), timeout_s=60
        )
        await client.decide(req.approval_id, "approve", "bob", "ok")
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    assert [a.approval_id for a in of(evs, events.ApprovalRequired)] == [req.approval_id]
    assert [d.decision for d in of(evs, events.ApprovalDecided)] == ["approve"]
    assert (_count(tmp_path, "search"), _count(tmp_path, "delete")) == (1, 1)
    assert [r.status for r in of(evs, events.ToolResult)] == ["ok"]
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_a_step_that_must_not_run_twice_fails_the_takeover(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The worker dies inside a retryable=False step (it is slow: the
    approval came, the step began): the new owner does not run it again."""
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:scripted", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, _spec(tmp_path, approval=True, once=True, hold_s=600))
        req = await wait_event(client, run_id, "approval_required")
        assert isinstance(req, events.ApprovalRequired)
        await client.decide(req.approval_id, "approve", "bob", "")
        await wait_until(lambda: _has_started_step(client, run_id, "delete"), timeout_s=30)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:scripted"):
        evs = await read_run(client, run_id)
    (err,) = of(evs, events.RunError)
    assert (err.code, err.retryable) == ("step_interrupted", False)
    assert evs[-1].status == "failed"  # type: ignore[union-attr]


async def test_a_replay_that_calls_other_steps_fails_nondeterministic(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:swerves", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, json.dumps({"delay_s": 0.05}))
        await wait_event(client, run_id, "text_delta", count=3)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, agent=f"{AGENTS}:swerves"):
        evs = await read_run(client, run_id)
    (err,) = of(evs, events.RunError)
    assert err.code == "agent_nondeterministic"
    assert "step 'first'" in err.message and "step 'second'" in err.message


async def _status_is(b: Broker, run_id: str, status: str, *, after_epoch: int) -> bool:
    run = await b.store.get_run(run_id)
    return run.status == status and run.owner_epoch > after_epoch


async def _has_started_step(b: Broker, run_id: str, name: str) -> bool:
    row = await b.store.pool.fetchrow(
        "SELECT done FROM run_steps WHERE run_id = $1 AND name = $2", run_id, name
    )
    return row is not None and not row["done"]


async def test_steps_are_fenced_by_the_owners_epoch(broker: Broker) -> None:
    from broker import errors, steps

    session_id = await broker.store.create_session("alice")
    run_id = await broker.start_run(session_id, "alice", input="x")
    with pytest.raises(errors.StaleEpoch):
        await steps.record(
            broker.store, run_id=run_id, epoch=7, idx=0, name="s", kind="step",
            done=True, result=b"{}", seq=0,
        )  # fmt: skip
    assert await steps.load(broker.store, run_id) == []


async def test_an_agent_stops_at_once_when_its_worker_loses_the_run(settings: Settings) -> None:
    """Another worker took the run (this one's lease ran out): the agent is
    cancelled with the run's task, not left to run on (a tool, a model call)
    for a run that is not this worker's any more."""
    async with running_worker(settings, agent=f"{AGENTS}:stalls") as (b, _):
        _, run_id = await start(b, "never again")
        await wait_event(b, run_id, "text_delta")
        await b.store.pool.execute(
            "UPDATE runs SET lease_until = now() - interval '1 minute' WHERE run_id = $1", run_id
        )
        thief = await b.store.claim_expired(run_id, "thief", 60.0)
        assert thief is not None

        async def cancelled() -> bool:
            return api_agents.SEEN.get(run_id) == ["cancelled"]

        await wait_until(cancelled)
        w = b.writer(thief)  # the new owner ends it, so no later test finds it
        await w.append(events.RunEnd(status="aborted"))
        await w.flush()


async def test_a_resumed_run_goes_on_with_the_time_its_first_owner_used(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """run_timeout_s counts the run's time across a takeover: 2.5 s used
    before the last durable point, then 1 s more on the new owner, is past a
    3 s budget (from zero again it would fit)."""
    marker = tmp_path / "second-started"
    doomed = WorkerProcess(settings, tmp_path / "a.log", agent=f"{AGENTS}:timed", **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, str(marker))

        async def second_started() -> bool:
            return marker.exists()

        await wait_until(second_started)
    finally:
        await doomed.kill()
    async with running_worker(
        settings, purge=False, agent=f"{AGENTS}:timed", run_timeout_s=3.0
    ) as (_, w):
        evs = await read_run(client, run_id)
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    err = evs[-2]
    assert isinstance(err, events.RunError) and err.code == "run_timeout"
    assert not of(evs, events.TextDelta)  # the second step never finished
