"""The send queue without servers: bound, coalescing, dropping, cursors."""

from __future__ import annotations

import json

from broker import events
from broker.store import StoredEvent
from gateway.frames import EncodedBatch, ws_wire
from gateway.sendq import Item, SendQueue


def stored(seq: int, ev: events.Event, run_id: str = "r_1") -> StoredEvent:
    ev.run_id, ev.session_id, ev.seq, ev.ts = run_id, "s_1", seq, 0
    tag = type(ev).__struct_config__.tag
    assert isinstance(tag, str)
    return StoredEvent(run_id, seq, seq, tag, events.encode(ev))


def batch(*evs: events.Event, first: int = 1) -> EncodedBatch:
    return EncodedBatch("run:r_1", [stored(first + i, e) for i, e in enumerate(evs)], True)


def unwire(frame: bytes) -> bytes:
    """The payload of a server WebSocket frame (what WebSocket items are)."""
    n = frame[1] & 0x7F
    return frame[{126: 4, 127: 10}.get(n, 2) :]


def frames(q: SendQueue) -> list[dict]:
    return [json.loads(unwire(it.render())) for it in q.take()]


def test_shared_frames_when_keeping_up() -> None:
    q = SendQueue(max_bytes=10_000, lag_bytes=5_000)
    b = batch(events.TextDelta(message_id="m", delta="a"), events.Progress(label="x"))
    assert q.put_events("ws", b, 0)
    out = frames(q)
    assert [f["cursor"] for f in out] == [1, 2] and out[1]["event"]["type"] == "progress"
    assert b.ws_single_wire()[0] is b.ws_single_wire()[0]  # encoded once, shared
    assert q.put_events("ws_batch", b, 1)
    (f,) = frames(q)
    assert f["type"] == "events" and f["cursor"] == 2 and len(f["events"]) == 1


def test_lagging_merges_deltas_and_drops_progress() -> None:
    q = SendQueue(max_bytes=1_000_000, lag_bytes=10)
    q.put_message(ws_wire(b'{"type":"pad","x":"xxxxxxxxxxxxxxxx"}'))  # now lagging
    b = batch(
        events.TextDelta(message_id="m", delta="Hel"),
        events.TextDelta(message_id="m", delta="lo"),
        events.Progress(label="p", done=1, total=2),
        events.TextDelta(message_id="m", delta="!"),
        events.ToolArgsDelta(tool_call_id="c", partial_json='{"a"'),
        events.ToolArgsDelta(tool_call_id="c", partial_json=":1}"),
        events.TextDelta(message_id="other", delta="x"),
        events.RunEnd(status="completed"),
    )
    assert q.put_events("ws", b, 0)
    out = frames(q)[1:]
    assert [(f["cursor"], f.get("from")) for f in out] == [(4, 1), (6, 5), (7, None), (8, None)]
    assert out[0]["event"]["delta"] == "Hello!" and out[0]["event"]["seq"] == 4
    assert out[1]["event"]["partial_json"] == '{"a":1}'
    assert q.coalesced == 3 and q.dropped == 1


def test_sse_lagging_frames_carry_the_last_cursor() -> None:
    q = SendQueue(max_bytes=1_000_000, lag_bytes=0)
    q.put_message(b": x\n\n")
    b = batch(events.ReasoningDelta(message_id="m", delta="a"),
              events.ReasoningDelta(message_id="m", delta="b"))  # fmt: skip
    q.put_events("sse", b, 0)
    items = q.take()
    assert items[1].render().startswith(b"id: 2\ndata: ")
    assert json.loads(items[1].render().split(b"data: ", 1)[1])["delta"] == "ab"


def test_bound_is_reported_and_written_bytes_are_released() -> None:
    q = SendQueue(max_bytes=500, lag_bytes=400)
    big = events.TextDelta(message_id="m", delta="y" * 300)
    assert q.put_events("ws", batch(big), 0)
    assert not q.put_events("ws", batch(big, first=2), 0)  # past the bound
    q.written(q.take())
    assert q.nbytes == 0


async def test_several_tasks_can_wait_for_the_queue_to_drain() -> None:
    import asyncio

    q = SendQueue(max_bytes=1_000_000, lag_bytes=10)
    q.put_events("ws", batch(events.TextDelta(message_id="m", delta="z" * 50)), 0)
    woken: list[int] = []

    async def waiter(i: int) -> None:
        await q.wait_below(0)
        woken.append(i)

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0)
    q.written(q.take())
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert sorted(woken) == [0, 1, 2]


def test_coalescing_never_merges_deltas_of_different_runs() -> None:
    q = SendQueue(max_bytes=1_000_000, lag_bytes=0)
    q.put_message(ws_wire(b'{"type":"pad"}'))
    items = [
        stored(1, events.ToolArgsDelta(tool_call_id="call_1_0", partial_json='{"a"'), "r_a"),
        stored(2, events.ToolArgsDelta(tool_call_id="call_1_0", partial_json='{"b"'), "r_b"),
    ]
    q.put_events("ws", EncodedBatch("session:s_1", items, False), 0)
    out = frames(q)[1:]
    assert [f["event"]["run_id"] for f in out] == ["r_a", "r_b"]


async def test_merged_and_dropped_events_reach_the_metrics_when_written() -> None:
    import dataclasses

    from prometheus_client import CollectorRegistry

    from broker.settings import Settings
    from gateway._malloc import Trimmer
    from gateway.connection import Connection, State
    from gateway.metrics import GatewayMetrics

    written: list[bytes] = []

    @dataclasses.dataclass
    class Host:  # what a Connection uses of its gateway
        settings: Settings
        metrics: GatewayMetrics
        connections: set[Connection]
        trimmer: Trimmer = dataclasses.field(default_factory=lambda: Trimmer(0))

    class Capture(Connection):
        kind = "ws"

        def transport(self) -> None:
            return None

        async def send(self, items: list[Item]) -> None:
            written.extend(it.render() for it in items)

        async def goodbye(self, code: str | None, cursors: dict[str, int]) -> None:
            pass

    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    host = Host(Settings.from_env({}, send_queue_lag_bytes=0), metrics, set())
    conn = Capture(host, "u", "ws")  # type: ignore[arg-type]
    conn.queue.put_message(ws_wire(b'{"type":"pad"}'))
    conn.queue.put_events("ws", batch(
        events.TextDelta(message_id="m", delta="a"),
        events.TextDelta(message_id="m", delta="b"),
        events.Progress(label="p"),
    ), 0)  # fmt: skip
    items = conn.queue.take()
    await conn.send(items)
    conn.queue.written(items)
    conn._count(items)
    assert len(written) == 2
    assert registry.get_sample_value("runlog_gateway_coalesced_events_total") == 1
    assert registry.get_sample_value("runlog_gateway_dropped_progress_events_total") == 1
    assert metrics.frames_queued["ws"] == 2 and conn.queue.nbytes == 0
    assert conn in host.connections  # registered until its teardown ends
    await conn.close(None)  # the writer task that queueing started ends with it
    assert conn.state is State.CLOSED and conn not in host.connections
    assert registry.get_sample_value("runlog_gateway_connections", {"kind": "ws"}) == 0
