"""Raw limits of the building blocks, measured on the scenario's own servers.

Each function measures one thing the product is built on, with the plainest
client calls, so a scenario can print its figure next to what the same
servers did in the same run:

- `copy_rows`: asyncpg `copy_records_to_table` of `--raw-pg-batch`-row batches
  (one commit each) into a scratch table shaped like `events`;
- `jetstream_publish`: nats-py `js.publish_async` of 150-byte messages to a
  scratch file-storage stream, `--raw-js-inflight` in flight;
- `core_pub_sub`: core NATS publish → subscribe, both ends in this process.

They read the `--raw-*` flags added by `add_arguments` (and `--runs` /
`--sessions` to shape the COPY rows like the scenario's). Scratch tables and
streams are dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from typing import Any

import asyncpg
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import api

from broker import events

from . import _lib
from ._lib import CpuMeter, Stack, Timer

RAW_TABLE = "bench_raw"
RAW_COLUMNS = ("run_id", "seq", "session_id", "cursor", "ts", "type", "payload")
RAW_STREAM = "RUNLOG_BENCH_RAW"
RAW_JS_SUBJECT = "runlog-bench.js"
RAW_CORE_SUBJECT = "runlog-bench.core"
RAW_MSG_BYTES = 150


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--raw-pg-rows",
        type=int,
        default=0,
        help="(default: 0, as many as the scenario appends: --runs x --events-per-run)",
    )
    p.add_argument("--raw-pg-batch", type=int, default=1000, help="(default: 1000)")
    p.add_argument("--raw-js-msgs", type=int, default=50_000, help="(default: 50000)")
    p.add_argument("--raw-js-inflight", type=int, default=256, help="(default: 256)")
    p.add_argument("--raw-core-msgs", type=int, default=200_000, help="(default: 200000)")
    p.add_argument("--no-raw", action="store_true", help="skip the raw-limit measurements")


async def copy_rows(st: Stack, meter: CpuMeter, args: argparse.Namespace) -> dict[str, Any]:
    n = args.raw_pg_rows or args.runs * args.events_per_run
    batch = args.raw_pg_batch
    sessions = [f"s_bench{j:017d}" for j in range(args.sessions)]
    runs = [f"r_bench{j:017d}" for j in range(args.runs)]
    now_ms = int(time.time() * 1000)
    cursors = [0] * len(sessions)
    rows: list[tuple[Any, ...]] = []
    # Interleaved over the runs like a product batch; real event JSON as payload.
    for k in range(n):
        r, seq = k % len(runs), k // len(runs) + 1
        s = r % len(sessions)
        cursors[s] += 1
        payload = events.encode(
            events.TextDelta(
                message_id=f"m_{r:04d}",
                delta=_lib.TOKENS[seq % len(_lib.TOKENS)],
                run_id=runs[r],
                session_id=sessions[s],
                seq=seq,
                ts=now_ms,
            )
        )
        rows.append((runs[r], seq, sessions[s], cursors[s], now_ms, "text_delta", payload))
    conn = await asyncpg.connect(st.database_url)
    try:
        await conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        await conn.execute(
            f'CREATE TABLE {RAW_TABLE} (run_id text COLLATE "C", seq bigint,'
            ' session_id text COLLATE "C", cursor bigint, ts bigint, type text,'
            " payload bytea, PRIMARY KEY (run_id, seq))"
        )
        await conn.execute(f"CREATE UNIQUE INDEX ON {RAW_TABLE} (session_id, cursor)")
        timer = Timer(meter)
        timer.start()
        for i in range(0, n, batch):
            # Outside a transaction block each COPY is its own commit.
            await conn.copy_records_to_table(
                RAW_TABLE, records=rows[i : i + batch], columns=RAW_COLUMNS
            )
        timer.stop()
    finally:
        with contextlib.suppress(asyncpg.PostgresError, OSError):
            await conn.execute(f"DROP TABLE IF EXISTS {RAW_TABLE}")
        await conn.close()
    return {
        "rows": n,
        "batch": batch,
        "rows_s": n / timer.wall_s,
        "client_cpu_us_per_row": timer.us_per(n, "client"),
        "pg_cpu_us_per_row": timer.us_per(n, "postgres"),
        "others_cpu_cores": timer.others_cores(),
    }


async def jetstream_publish(st: Stack, meter: CpuMeter, args: argparse.Namespace) -> dict[str, Any]:
    n, window = args.raw_js_msgs, args.raw_js_inflight
    payload = b"x" * RAW_MSG_BYTES
    nc = await nats.connect(st.nats_url, name="runlog-bench-raw")
    js = nc.jetstream(timeout=30, publish_async_max_pending=max(4000, window))
    try:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(RAW_STREAM)
        # File storage and one replica, like the product's live-feed stream.
        await js.add_stream(
            name=RAW_STREAM,
            subjects=[RAW_JS_SUBJECT],
            storage=api.StorageType.FILE,
            num_replicas=1,
        )
        await js.publish(RAW_JS_SUBJECT, payload)  # warm-up: ack inbox, stream files
        timer = Timer(meter)
        timer.start()
        sent = 0
        while sent < n:
            # `window` publishes in flight, then their acks: the product's
            # publish loop works the same way.
            futs = [
                await js.publish_async(RAW_JS_SUBJECT, payload)
                for _ in range(min(window, n - sent))
            ]
            await asyncio.gather(*futs)
            sent += len(futs)
        timer.stop()
    finally:
        with contextlib.suppress(nats.errors.Error):
            await js.delete_stream(RAW_STREAM)
        await nc.close()
    return {
        "msgs": n,
        "inflight": window,
        "msgs_s": n / timer.wall_s,
        "client_cpu_us_per_msg": timer.us_per(n, "client"),
        "nats_cpu_us_per_msg": timer.us_per(n, "nats"),
        "others_cpu_cores": timer.others_cores(),
    }


async def core_pub_sub(st: Stack, meter: CpuMeter, args: argparse.Namespace) -> dict[str, Any]:
    n = args.raw_core_msgs
    payload = b"x" * RAW_MSG_BYTES
    sub_nc = await nats.connect(st.nats_url, name="runlog-bench-sub")
    pub_nc = await nats.connect(st.nats_url, name="runlog-bench-pub", pending_size=64 * 1024**2)
    received = 0
    all_in = asyncio.Event()

    async def on_msg(_msg: Msg) -> None:
        nonlocal received
        received += 1
        if received >= n:
            all_in.set()

    try:
        # Limits past n: this measures throughput, not slow-consumer drops.
        await sub_nc.subscribe(
            RAW_CORE_SUBJECT, cb=on_msg, pending_msgs_limit=n + 1, pending_bytes_limit=-1
        )
        await sub_nc.flush()
        timer = Timer(meter)
        timer.start()
        for _ in range(n):
            await pub_nc.publish(RAW_CORE_SUBJECT, payload)
        await pub_nc.flush()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(60):
                await all_in.wait()
        timer.stop()
    finally:
        await pub_nc.close()
        await sub_nc.close()
    return {
        "msgs": n,
        "received": received,
        "msgs_s": received / timer.wall_s,
        "client_cpu_us_per_msg": timer.us_per(received, "client"),
        "nats_cpu_us_per_msg": timer.us_per(received, "nats"),
        "others_cpu_cores": timer.others_cores(),
    }
