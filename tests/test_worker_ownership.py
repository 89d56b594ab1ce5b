"""One writer per run, takeovers and drain, with real `runlog worker`
processes killed (SIGKILL), paused (SIGSTOP) and drained (SIGTERM)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from broker import approvals, events
from broker.runtime import Broker
from broker.settings import Settings

from .helpers import sample
from .workerkit import (
    DOOMED,
    IN_SLOT,
    TOOL_LOG_ENV,
    WorkerProcess,
    killed_while_waiting,
    of,
    read_run,
    running_worker,
    scripted_text,
    start,
    stored,
    text_of,
    tool_runs,
    wait_event,
    wait_until,
)

_DOOMED = DOOMED


async def test_kill_9_while_waiting_for_approval_resumes_elsewhere(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    run_id, req = await killed_while_waiting(settings, client, tmp_path / "a.log")
    # Decided while no worker owns the run: stored, and sent to nobody.
    await client.decide(req.approval_id, "approve", "bob", "ok")
    async with running_worker(settings, purge=False) as (_, w):
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    (dec,) = of(evs, events.ApprovalDecided)
    assert (dec.approval_id, dec.decision, dec.decided_by) == (req.approval_id, "approve", "bob")
    sent = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
    assert [r.status for r in sent] == ["ok"]
    assert "the summary was sent" in text_of(evs)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


def _resumed_mid_stream(evs: list[events.AnyEvent], expected: str) -> None:
    """A run taken over mid-stream and resumed: the dead owner's partial
    message was reset, and after the reset the whole answer comes once."""
    partial = of(evs, events.TextDelta)[0].message_id
    (reset,) = [e for e in of(evs, events.MessageReset) if e.message_id == partial]
    before, after = evs[: evs.index(reset)], evs[evs.index(reset) :]
    assert len(text_of(before).split()) >= 10  # what streamed before the crash is kept
    assert [d.message_id for d in of(after, events.TextDelta) if d.message_id == partial] == []
    assert text_of(after) == expected  # complete, exactly once
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    assert of(evs, events.RunError) == []
    end = evs[-1]
    assert isinstance(end, events.RunEnd) and end.status == "completed"


async def test_kill_9_mid_stream_resumes_the_run(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    doomed = WorkerProcess(settings, tmp_path / "a.log", scripted_tokens_per_s=40.0, **_DOOMED)
    await doomed.start()
    try:
        _, run_id = await start(client, "long story")
        await wait_event(client, run_id, "text_delta", count=10)
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False) as (_, w):
        evs = await read_run(client, run_id)  # contiguous, each seq once
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    _resumed_mid_stream(evs, await scripted_text("long story"))
    assert (await client.store.get_run(run_id)).status == "completed"


async def test_kill_9_is_taken_over_in_seconds_not_after_the_lease(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """The dead worker's connections closed with its process: its run is
    resumed within seconds, though its lease (15 s, renewed every 5 s) has
    10 s or more to go at the kill."""
    doomed = WorkerProcess(
        settings, tmp_path / "a.log", worker_lease_s=15.0, scripted_tokens_per_s=40.0
    )
    await doomed.start()
    try:
        _, run_id = await start(client, "long story")
        await wait_event(client, run_id, "text_delta", count=10)
        # The survivor answers at full speed: the takeover is what is timed,
        # not the 2,000 tokens it streams after (50 s at the doomed one's pace).
        async with running_worker(settings, purge=False, worker_lease_s=15.0) as (_, w):
            await asyncio.sleep(1.5)  # the survivor has been up for its liveness grace (1 s)
            killed = time.monotonic()
            await doomed.kill()
            resumed = await wait_event(client, run_id, "status", timeout_s=30)
            took = time.monotonic() - killed
            evs = await read_run(client, run_id)
        assert isinstance(resumed, events.Status) and resumed.code == "resumed"
        assert took < 5.0, f"resumed {took:.1f} s after the kill"
        _resumed_mid_stream(evs, await scripted_text("long story"))
        run = await client.store.get_run(run_id)
        assert (run.owner_id, run.owner_epoch, run.takeovers) == (w.worker_id, 2, 1)
    finally:
        await doomed.kill()


async def test_kill_9_while_a_tool_runs_runs_it_again_but_not_the_finished_one(
    settings: Settings, client: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """save_note finished (its result is durable), search_docs was running:
    the new owner runs search_docs again, never save_note, and goes on."""
    runs = tmp_path / "tool-runs"
    monkeypatch.setenv(TOOL_LOG_ENV, str(runs))
    tools = "tests.workerkit:COUNTED_TOOLS"
    doomed = WorkerProcess(settings, tmp_path / "a.log", **_DOOMED)
    doomed.env["RUNLOG_TOOLS"] = tools
    await doomed.start()
    try:
        _, run_id = await start(client, "slow tool: note it, no approval")
        await wait_event(client, run_id, "progress")  # search_docs is running
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, tools=tools) as (_, w):
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert tool_runs(runs) == ["save_note call_1_0", "search_docs call_1_1", "search_docs call_1_1"]
    results = [(r.tool_call_id, r.status) for r in of(evs, events.ToolResult)]
    assert results == [("call_1_0", "ok"), ("call_1_1", "ok")]
    assert [s.code for s in of(evs, events.Status)] == ["resumed"]
    assert "Here is what I know" in text_of(evs)
    assert evs[-1].status == "completed"  # type: ignore[union-attr]


async def test_kill_9_while_a_not_retryable_tool_runs_fails_tool_interrupted(
    settings: Settings, client: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "tool-runs"
    monkeypatch.setenv(TOOL_LOG_ENV, str(runs))
    tools = "tests.workerkit:FRAGILE_TOOLS"
    doomed = WorkerProcess(settings, tmp_path / "a.log", **_DOOMED)
    doomed.env["RUNLOG_TOOLS"] = tools
    await doomed.start()
    try:
        _, run_id = await start(client, "slow tool please")
        await wait_event(client, run_id, "progress")
    finally:
        await doomed.kill()
    async with running_worker(settings, purge=False, tools=tools) as (_, w):
        evs = await read_run(client, run_id)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="failed") == 1
    )
    assert tool_runs(runs) == ["search_docs call_1_0"]  # never again
    (result,) = of(evs, events.ToolResult)
    assert (result.tool_call_id, result.status) == ("call_1_0", "error")
    err, end = evs[-2], evs[-1]
    assert isinstance(err, events.RunError)
    assert (err.code, err.retryable) == ("tool_interrupted", False)
    assert isinstance(end, events.RunEnd) and end.status == "failed"


async def test_paused_worker_cannot_append_after_takeover(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """A worker owning several streaming runs is paused (SIGSTOP) until they
    are taken over: each is resumed and completes elsewhere, and after
    SIGCONT the paused worker appends nothing to any of them."""
    paused = WorkerProcess(settings, tmp_path / "a.log", scripted_tokens_per_s=40.0, **_DOOMED)
    await paused.start(concurrency=4)
    try:
        run_ids = [(await start(client, "long story"))[1] for _ in range(4)]
        for run_id in run_ids:
            await wait_event(client, run_id, "text_delta", count=10)
        paused.signal(signal.SIGSTOP)
        async with running_worker(settings, purge=False) as (_, w):
            logs = await asyncio.gather(*(read_run(client, r) for r in run_ids))
        assert (
            w.metrics is not None
            and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 4
        )
        expected = await scripted_text("long story")
        for evs in logs:
            _resumed_mid_stream(evs, expected)
        paused.signal(signal.SIGCONT)

        # The resumed worker finds out it was fenced, and writes nothing.
        async def noticed() -> bool:
            out = paused.output()
            return all(
                f"run {r}: lease lost" in out or f"run {r}: cancelled (ownership lost" in out
                or f"run {r}: ownership lost" in out
                for r in run_ids
            )  # fmt: skip

        await wait_until(noticed, timeout_s=30)
        for run_id, evs in zip(run_ids, logs, strict=True):
            after = await stored(client, run_id)
            assert len(after) == len(evs) and isinstance(after[-1], events.RunEnd)
            assert await client.store.run_head(run_id) == (len(evs), True)
        assert await paused.terminate() == 0  # still healthy: drains and exits
    finally:
        await paused.kill()


async def test_paused_worker_writes_no_approval_after_takeover(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    """A worker paused (SIGSTOP) with two runs: one waiting for an approval,
    one whose approval create is on its way to PostgreSQL. Another worker
    takes both over; only then does PostgreSQL run the create. It must be
    refused there, by the statement itself (the paused worker can check
    nothing), and the approvals the new owner waits on must stay its own:
    the waiting run's, and the one it asks for when it resumes the other."""
    paused = WorkerProcess(settings, tmp_path / "a.log", **IN_SLOT)
    # One connection, so the second create goes out on the connection the
    # first one was prepared on: PostgreSQL then has the whole statement (not
    # just its parse, after which the client still has to send the rest) and
    # runs it as soon as the lock below lets it, with no word from the paused
    # worker. (A write the worker would only send after SIGCONT never goes
    # out: its lease task runs first on waking and cancels the run.)
    paused.env["RUNLOG_DB_POOL_SIZE"] = "1"
    await paused.start()
    pool = client.store.pool
    try:
        _, waiting = await start(client, "send the report")
        req = await wait_event(client, waiting, "approval_required")
        assert isinstance(req, events.ApprovalRequired)

        async with pool.acquire() as conn:
            # Holds back every write to approvals (and nothing else).
            hold = conn.transaction()
            await hold.start()
            held = True
            try:
                await conn.execute("LOCK TABLE approvals IN SHARE MODE")
                _, creating = await start(client, "send the report")

                async def create_sent() -> bool:
                    return bool(
                        await pool.fetchval(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND query LIKE '%INSERT INTO approvals%'"
                        )
                    )

                await wait_until(create_sent)
                paused.signal(signal.SIGSTOP)
                async with running_worker(settings, purge=False):

                    async def taken_over() -> bool:
                        return (await client.store.get_run(creating)).owner_epoch == 2

                    await wait_until(taken_over)
                    await hold.rollback()  # the zombie's create runs now
                    held = False
                    # Resumed by the new owner, which asks for its own approval.
                    req_c = await wait_event(client, creating, "approval_required")
                    assert isinstance(req_c, events.ApprovalRequired)
                    resumed = await wait_event(client, waiting, "status")
                    assert isinstance(resumed, events.Status) and resumed.code == "resumed"
                    paused.signal(signal.SIGCONT)

                    async def noticed() -> bool:
                        out = paused.output()
                        return all(f"run {r}: cancelled (ownership lost" in out or
                                   f"run {r}: ownership lost" in out
                                   for r in (waiting, creating))  # fmt: skip

                    await wait_until(noticed, timeout_s=30)
                    await client.decide(req.approval_id, "approve", "bob", "ok")
                    await client.decide(req_c.approval_id, "approve", "carol", "ok")
                    waiting_evs = await read_run(client, waiting)
                    evs = await read_run(client, creating)
            finally:
                if held:
                    await hold.rollback()
        # The run whose create was held: nothing of the zombie's create; the
        # one approval is the new owner's, decided by carol and acted on.
        (c_stored,) = await approvals.open_for_run(client.store, creating)
        assert (c_stored.approval_id, c_stored.decision, c_stored.decided_by) == (
            req_c.approval_id, "approve", "carol",
        )  # fmt: skip
        assert [r.approval_id for r in of(evs, events.ApprovalRequired)] == [req_c.approval_id]
        sent = [r for r in of(evs, events.ToolResult) if r.tool_call_id == req_c.tool_call_id]
        assert [r.status for r in sent] == ["ok"]
        assert evs[-1].status == "completed"  # type: ignore[union-attr]
        assert await client.store.run_head(creating) == (len(evs), True)
        # The waiting one: its approval was decided by bob and acted on.
        (stored,) = await approvals.open_for_run(client.store, waiting)
        assert (stored.approval_id, stored.decision, stored.decided_by) == (
            req.approval_id, "approve", "bob",
        )  # fmt: skip
        (dec,) = of(waiting_evs, events.ApprovalDecided)
        assert (dec.decision, dec.decided_by) == ("approve", "bob")
        sent = [r for r in of(waiting_evs, events.ToolResult) if r.tool_call_id == req.tool_call_id]
        assert [r.status for r in sent] == ["ok"]
        assert waiting_evs[-1].status == "completed"  # type: ignore[union-attr]
        assert await paused.terminate() == 0
    finally:
        await paused.kill()


async def test_sigterm_drains_releases_waiting_runs_and_ends_streaming_ones(
    settings: Settings, client: Broker, tmp_path: Path
) -> None:
    draining = WorkerProcess(
        settings,
        tmp_path / "a.log",
        # The long story (2,000 tokens: 20 s) still streams past the drain's
        # 1 s; the other run reaches its approval in under a second.
        scripted_tokens_per_s=100.0,
        drain_timeout_s=1.0,
        worker_lease_s=30.0,  # a released run must not wait for its lease
        **IN_SLOT,
    )
    await draining.start()
    try:
        _, waiting = await start(client, "send the report")
        req = await wait_event(client, waiting, "approval_required")
        _, streaming = await start(client, "long story")
        await wait_event(client, streaming, "text_delta", count=3)
        assert await draining.terminate() == 0
    finally:
        await draining.kill()
    # The streaming run was ended with a retryable code; nothing was lost.
    evs = await stored(client, streaming)
    err, end = evs[-2], evs[-1]
    assert isinstance(err, events.RunError) and (err.code, err.retryable) == (
        "worker_draining",
        True,
    )
    assert isinstance(end, events.RunEnd) and end.status == "failed"
    # The waiting run was handed over as it was, and resumes on another worker.
    waiting_evs = await stored(client, waiting)
    assert waiting_evs[-1].seq == req.seq
    async with running_worker(settings, purge=False) as (_, w):
        await client.decide(req.approval_id, "reject", "bob")  # type: ignore[union-attr]
        evs = await read_run(client, waiting, timeout_s=60)
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_takeovers_total", outcome="resumed") == 1
    )
    assert of(evs, events.ApprovalDecided)[0].decision == "reject"
    assert evs[-1].status == "completed"  # type: ignore[union-attr]
