"""One appending worker process of `bench append --worker-procs` (no figures here).

`python -m bench._appendproc` reads a JSON `Job` line on stdin, claims the
job's runs with its own `Broker` (its own appender and connections), commits
each run's `run_start` (warm-up), prints `ready`, waits for a `go` line (so
that every process starts at once), streams `events_per_run` token deltas into
every run as `bench append` does in-process, waits until they are committed
and published, prints a JSON `Report` line, waits for a `bye` line (the parent
reads every process's CPU before any exits), ends its runs and exits.
"""

from __future__ import annotations

import asyncio
import sys
import time

import msgspec
from prometheus_client import CollectorRegistry

from broker import events
from broker.runtime import Broker
from broker.settings import Settings

from . import append


class Job(msgspec.Struct):
    nats_url: str
    database_url: str
    run_ids: list[str]
    events_per_run: int
    burst: int
    settings: dict[str, int | float]  # the swept settings of `bench append`


class Report(msgspec.Struct):
    events: int
    committed_s: float  # go → every event committed
    published_s: float  # go → publish backlog empty


async def _readline() -> str:
    return (await asyncio.to_thread(sys.stdin.readline)).strip()


async def main() -> None:
    job = msgspec.json.decode((await _readline()).encode(), type=Job)
    settings = Settings.from_env(
        {}, nats_url=job.nats_url, database_url=job.database_url, **job.settings
    )
    b = await Broker.connect(settings, registry=CollectorRegistry(), name="runlog-bench-proc")
    try:
        writers = [await b.claim(r, "bench-worker") for r in job.run_ids]
        for w in writers:
            await w.append(events.RunStart(model="bench", started_by="bench"))
        await asyncio.gather(*(w.flush() for w in writers))
        await append.wait_published(b)
        print("ready", flush=True)
        if await _readline() != "go":
            return
        feed = append.Feed(
            job.events_per_run, job.burst, sample_every=job.events_per_run + 1, rate_per_run=0.0
        )
        feed.t0 = t0 = time.perf_counter()
        await asyncio.gather(*(append.stream_tokens(w, k, feed) for k, w in enumerate(writers)))
        committed_s = time.perf_counter() - t0
        await append.wait_published(b)
        report = Report(
            events=len(writers) * job.events_per_run,
            committed_s=committed_s,
            published_s=time.perf_counter() - t0,
        )
        print(msgspec.json.encode(report).decode(), flush=True)
        await _readline()  # bye
        for w in writers:
            await w.append(events.RunEnd(status="completed"))
        await asyncio.gather(*(w.flush() for w in writers))
    finally:
        await b.close()


if __name__ == "__main__":
    asyncio.run(main())
