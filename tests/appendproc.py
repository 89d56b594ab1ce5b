"""A separate appending process for tests (no tests here).

`python -m tests.appendproc` reads a JSON `Job` line on stdin, claims the
job's runs with its own `Broker`, prints `ready`, waits for a `go` line (so
that several processes start appending at once), then appends in rounds:
one event to every run, in a random order, then a flush — one transaction
per round over all the sessions of its runs. It prints one JSON `Report`
line: what it committed and its append-path counters.
"""

from __future__ import annotations

import asyncio
import random
import sys

import msgspec
from prometheus_client import CollectorRegistry

from broker import events
from broker.metrics import FLUSH_ERROR_KINDS
from broker.runtime import Broker
from broker.settings import Settings


class Job(msgspec.Struct):
    nats_url: str
    database_url: str
    run_ids: list[str]
    events_per_run: int
    seed: int


class Report(msgspec.Struct):
    committed: dict[str, int]
    deadlocks: float  # runlog_append_flush_errors_total{kind="deadlock"}
    flush_errors: float  # every kind
    fenced: float
    transactions: float


async def main(job: Job) -> Report:
    settings = Settings.from_env({}, nats_url=job.nats_url, database_url=job.database_url)
    registry = CollectorRegistry()
    b = await Broker.connect(settings, registry=registry, name="test-appendproc")
    try:
        writers = [await b.claim(r, f"appendproc-{job.seed}") for r in job.run_ids]
        sys.stdout.buffer.write(b"ready\n")
        sys.stdout.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.readline)
        rng = random.Random(job.seed)
        for i in range(job.events_per_run):
            rng.shuffle(writers)
            for w in writers:
                await w.append(events.TextDelta(message_id="m", delta=f"{i} "))
            for w in writers:
                await w.flush()

        def counter(name: str, **labels: str) -> float:
            value = registry.get_sample_value(name, labels)
            assert value is not None, name
            return value

        return Report(
            committed={w.run_id: w.committed_seq for w in writers},
            deadlocks=counter("runlog_append_flush_errors_total", kind="deadlock"),
            flush_errors=sum(
                counter("runlog_append_flush_errors_total", kind=k) for k in FLUSH_ERROR_KINDS
            ),
            fenced=counter("runlog_append_fenced_total"),
            transactions=counter("runlog_append_commit_seconds_count"),
        )
    finally:
        await b.close()


if __name__ == "__main__":
    report = asyncio.run(main(msgspec.json.decode(sys.stdin.buffer.readline(), type=Job)))
    sys.stdout.buffer.write(msgspec.json.encode(report) + b"\n")
