"""The live publish's acks (broker/bus.py `Bus.publish_live`): what the
appender's publish loop relies on — a future per message that resolves on
JetStream's ack, deduplicated by msg id, and fails when nothing stores the
message (real NATS)."""

from __future__ import annotations

import asyncio
import secrets

import nats.js.errors
import pytest

from broker import constants
from broker.runtime import Broker


def _subject() -> str:
    return constants.events_subject(f"s{secrets.token_hex(6)}", f"r{secrets.token_hex(6)}")


async def test_publish_live_resolves_with_the_stream_seq_and_dedupes_by_msg_id(
    broker: Broker,
) -> None:
    subject = _subject()
    seqs = [
        await asyncio.wait_for(await broker.bus.publish_live(subject, b"x", f"{subject}:{i}"), 10)
        for i in range(3)
    ]
    assert seqs[1] == seqs[0] + 1 and seqs[2] == seqs[1] + 1, seqs
    info = await broker.bus.js.stream_info(constants.EVENTS_STREAM)
    assert info.state.last_seq >= seqs[2]
    # The same msg id again: JetStream stores nothing and acks the first copy.
    again = await asyncio.wait_for(await broker.bus.publish_live(subject, b"x", f"{subject}:1"), 10)
    assert again == seqs[1]
    msg = await broker.bus.js.get_last_msg(constants.EVENTS_STREAM, subject)
    assert msg.seq == seqs[2]


async def test_publish_live_fails_when_no_stream_takes_the_subject(broker: Broker) -> None:
    fut = await broker.bus.publish_live(f"runlog-test.nostream.{secrets.token_hex(4)}", b"x", "m")
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await asyncio.wait_for(fut, 10)


async def test_an_abandoned_publish_does_not_hold_up_the_next_ones(broker: Broker) -> None:
    """The appender cancels a future it stopped waiting for; its ack, when it
    comes, is dropped, and later publishes still resolve (each its own)."""
    subject = _subject()
    first = await broker.bus.publish_live(subject, b"x", f"{subject}:a")
    first.cancel()
    second = await broker.bus.publish_live(subject, b"x", f"{subject}:b")
    third = await broker.bus.publish_live(subject, b"x", f"{subject}:a")  # first's copy
    s2, s3 = await asyncio.wait_for(asyncio.gather(second, third), 10)
    # The cancelled one was stored (it was sent): its copy is a duplicate of it.
    assert s3 == s2 - 1
