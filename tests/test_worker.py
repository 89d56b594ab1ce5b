"""The agent loop with the scripted adapter: events, tools, errors, limits,
double-texting (real NATS + PostgreSQL, an in-process worker)."""

from __future__ import annotations

import asyncio
import itertools

import aiohttp
import msgspec

from broker import events
from broker.settings import Settings
from broker.sockets import free_port
from workers.http import start_http

from .helpers import KillableStack, make_settings, sample
from .workerkit import of, read_run, running_worker, start, stored, text_of, wait_event


async def test_scripted_run_streams_identically_to_two_subscribers(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=400.0) as (b, w):
        _, run_id = await start(b, "how does the log work? no approval")
        first, second = await asyncio.gather(read_run(b, run_id), read_run(b, run_id))
        in_pg = await stored(b, run_id)
    assert [msgspec.json.encode(e) for e in first] == [msgspec.json.encode(e) for e in second]
    assert [msgspec.json.encode(e) for e in first] == [msgspec.json.encode(e) for e in in_pg]
    types = [e.__struct_config__.tag for e in first]
    assert types[0] == "run_start" and types[-1] == "run_end"
    assert first[-1].status == "completed"  # type: ignore[union-attr]
    assert "reasoning_delta" in types and "text_delta" in types
    # The low-risk tool: start (with its risk), argument deltas split across
    # chunks that join into valid JSON, end, progress from the tool, result.
    (call,) = of(first, events.ToolCallStart)
    assert (call.tool_name, call.risk_level) == ("search_docs", "low")
    args = "".join(d.partial_json for d in of(first, events.ToolArgsDelta))
    assert len(of(first, events.ToolArgsDelta)) > 1
    assert msgspec.json.decode(args)["query"]
    assert [p.done for p in of(first, events.Progress)] == [1, 2, 3]
    (result,) = of(first, events.ToolResult)
    assert result.status == "ok" and result.summary and result.output is None  # no raw by default
    assert types.index("tool_call_end") < types.index("progress") < types.index("tool_result")
    end = first[-1]
    assert isinstance(end, events.RunEnd) and end.usage is not None and end.usage.output_tokens > 0
    assert w.metrics is not None
    assert sample(w.metrics, "runlog_worker_runs_total", outcome="completed") == 1
    assert w.metrics.time_to_first_token._sum.get() > 0


async def test_echo_and_text_only_runs(settings: Settings) -> None:
    payload = "<script>alert('x')</script> & <b>bold</b>\n  spaced"
    async with running_worker(settings) as (b, _):
        _, echo_run = await start(b, "echo:" + payload)
        _, text_run = await start(b, "no tools, please")
        echo, text = await asyncio.gather(read_run(b, echo_run), read_run(b, text_run))
    assert text_of(echo) == payload
    assert [e.__struct_config__.tag for e in echo if not isinstance(e, events.TextDelta)] == [
        "run_start",
        "run_end",
    ]
    start_ev = echo[0]
    assert isinstance(start_ev, events.RunStart)
    assert start_ev.input == "echo:" + payload and start_ev.started_by == "alice"
    assert start_ev.model == "scripted-demo" and len(start_ev.trace_id) == 32
    assert not of(text, events.ToolCallStart) and of(text, events.ReasoningDelta)
    assert text[-1].status == "completed"  # type: ignore[union-attr]


async def test_text_before_tools_is_reset_when_configured(settings: Settings) -> None:
    async with running_worker(settings, discard_text_before_tools=True, tool_raw_output=True) as (
        b,
        _,
    ):
        _, run_id = await start(b, "search things, no approval")
        evs = await read_run(b, run_id)
    (reset,) = of(evs, events.MessageReset)
    texts = of(evs, events.TextDelta)
    before = [t for t in texts if t.seq < reset.seq]
    after = [t for t in texts if t.seq > reset.seq]
    assert before and {t.message_id for t in before} == {reset.message_id}
    assert after and reset.message_id not in {t.message_id for t in after}
    assert reset.seq < of(evs, events.ToolCallStart)[0].seq
    (result,) = of(evs, events.ToolResult)
    assert result.output and msgspec.json.decode(result.output)  # raw output allowed


async def test_model_errors_end_the_run_with_a_code(settings: Settings) -> None:
    async with running_worker(settings, model_timeout_s=1.0) as (b, w):
        _, failing = await start(b, "fail model")
        _, stalled = await start(b, "stall")
        f_evs, s_evs = await asyncio.gather(read_run(b, failing), read_run(b, stalled))
    for evs, code, retryable in (
        (f_evs, "model_unavailable", True),
        (s_evs, "model_timeout", True),
    ):
        err, end = evs[-2], evs[-1]
        assert isinstance(err, events.RunError) and (err.code, err.retryable) == (code, retryable)
        assert "Traceback" not in err.message and err.message
        assert isinstance(end, events.RunEnd) and end.status == "failed"
        assert text_of(evs)  # what streamed before the failure is kept
    assert w.metrics is not None and sample(w.metrics, "runlog_worker_stalled_streams_total") == 1


async def test_tool_and_run_timeouts_have_their_own_codes(settings: Settings) -> None:
    async with running_worker(settings, tool_timeout_s=0.5) as (b, _):
        _, run_id = await start(b, "slow tool")
        evs = await read_run(b, run_id)
    (result,) = of(evs, events.ToolResult)
    assert (result.status, result.summary) == ("error", "timed out")
    assert of(evs, events.RunError)[0].code == "tool_timeout"
    async with running_worker(settings, run_timeout_s=1.0) as (b, _):
        _, run_id = await start(b, "slow tool")
        evs = await read_run(b, run_id)
    assert of(evs, events.RunError)[0].code == "run_timeout"
    assert evs[-1].status == "failed"  # type: ignore[union-attr]


async def test_step_limit(settings: Settings) -> None:
    async with running_worker(settings, max_steps=1) as (b, _):
        _, run_id = await start(b, "no approval")
        evs = await read_run(b, run_id)
    err = of(evs, events.RunError)[0]
    assert (err.code, err.retryable) == ("step_limit", False)
    assert of(evs, events.ToolResult)  # the first turn's tool ran


async def test_enqueue_policy_runs_a_session_one_run_at_a_time(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=200.0) as (b, _):
        session_id, first = await start(b, "no tools")
        second = await b.start_run(session_id, "alice", input="echo:second")
        third = await b.start_run(session_id, "alice", input="echo:third")
        runs = await asyncio.gather(*(read_run(b, r) for r in (first, second, third)))
        assert await b.store.session_run_policy(session_id) == "enqueue"  # the default
    for earlier, later in itertools.pairwise(runs):
        assert earlier[-1].ts <= later[0].ts  # run_end of one before run_start of the next
    assert text_of(runs[2]) == "third"


async def test_a_queued_run_that_is_stopped_ends_at_once_behind_a_waiting_run(
    settings: Settings,
) -> None:
    """Under 'enqueue', a stop of a queued run ends it at once, though the
    run ahead of it waits for an approval that nobody gives."""
    async with running_worker(settings) as (b, _):
        session_id, first = await start(b, "tell me about approvals")
        await wait_event(b, first, "approval_required")
        queued = await b.start_run(session_id, "bob", input="echo:later")
        assert await b.interrupt(queued, "alice", "not needed any more")
        evs = await read_run(b, queued, timeout_s=10.0)
        assert (await b.store.get_run(first)).status == "waiting_approval"
    assert [type(e) for e in evs] == [events.RunStart, events.InterruptRequested, events.RunEnd]
    start_, stop, end = evs
    assert isinstance(start_, events.RunStart) and start_.started_by == "bob"
    assert isinstance(stop, events.InterruptRequested) and stop.requested_by == "alice"
    assert isinstance(end, events.RunEnd) and end.status == "aborted" and end.stop is not None
    assert (end.stop.requested_by, end.stop.reason, end.stop.at_seq) == (
        "alice",
        "not needed any more",
        1,
    )


async def test_interrupt_policy_stops_the_running_run_first(settings: Settings) -> None:
    async with running_worker(settings, scripted_tokens_per_s=40.0) as (b, _):
        session_id, first = await start(b, "a long answer")
        await b.store.set_run_policy(session_id, "interrupt")
        await wait_event(b, first, "text_delta", count=3)
        second = await b.start_run(session_id, "bob", input="echo:my turn")
        old, new = await asyncio.gather(read_run(b, first), read_run(b, second))
    end = old[-1]
    assert isinstance(end, events.RunEnd) and end.status == "aborted" and end.stop is not None
    assert (end.stop.requested_by, end.stop.reason) == ("bob", "superseded by a new run")
    assert end.ts <= new[0].ts and text_of(new) == "my turn"


async def test_metrics_and_health_endpoint(settings: Settings) -> None:
    port = free_port()
    async with running_worker(settings) as (b, w):
        runner = await start_http(w, "127.0.0.1", port)
        try:
            _, run_id = await start(b, "no tools")
            await read_run(b, run_id)
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
                    body = await r.text()
                    assert r.status == 200
                assert 'runlog_worker_runs_total{outcome="completed"} 1.0' in body
                assert "runlog_worker_time_to_first_event_seconds_bucket" in body
                assert "runlog_events_appended_total" in body  # the broker's, same registry
                async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                    assert r.status == 200 and (await r.json())["status"] == "ok"
                await w.drain(timeout_s=0)
                async with http.get(f"http://127.0.0.1:{port}/healthz") as r:
                    assert r.status == 503 and (await r.json())["status"] == "draining"
        finally:
            await runner.cleanup()


async def test_a_lost_job_is_sent_again(killable: KillableStack) -> None:
    # The private stack: re-sending jobs of old queued runs must not touch
    # runs that other tests left queued in the shared one.
    async with running_worker(make_settings(killable), worker_stale_queued_s=1.0) as (b, w):
        session_id = await b.store.create_session("alice")
        run_id = await b.store.create_run(session_id, "alice", input="echo:found")  # no job sent
        evs = await read_run(b, run_id)
    assert text_of(evs) == "found" and evs[-1].status == "completed"  # type: ignore[union-attr]
    # At least once: each reaper round re-sends it until a worker takes it.
    assert (
        w.metrics is not None
        and sample(w.metrics, "runlog_worker_jobs_total", outcome="requeued") >= 1
    )
