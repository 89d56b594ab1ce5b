"""The JetStream bus: live feed, run jobs and control messages.

Delivery contract of the live feed: best effort, in publish order per
publisher connection, possibly duplicated (a retried publish) or missing (NATS
down, backlog dropped). Subscribers therefore dedupe by position and fill
holes from PostgreSQL; the live feed only makes delivery fast, never decides
what the log holds.

Each live message is published with a reply subject, so JetStream acks it
(the appender retries one not acked, and measures commit → ack). The acks
come back to one reply subscription of the bus (`_Acks`): no task, queue,
JSON parse or done callback per ack, as nats-py's `publish_async` has.

One live message carries one run's slice of one committed micro-batch: its
events' JSON (as stored), the first `seq` and first session `cursor` (both are
contiguous within the slice), and whether the slice ends the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext, api

from . import _nats, control, errors
from . import constants as C
from .settings import Settings

log = logging.getLogger(__name__)

# NATS' default max_payload is 1 MiB; a slice stays well under it.
MAX_SLICE_BYTES = 512 * 1024
_MSG_ID_LINE = f"{C.MSG_ID_HEADER}: ".encode()
# How long a starting process waits for JetStream to accept its streams (a
# cluster electing its meta leader takes a few seconds).
STREAMS_READY_TIMEOUT_S = 30.0
# JetStream's answer while the cluster has fewer live nodes than the stream's
# replicas (a node starting late or being replaced): wait for it, like the
# meta leader.
_NO_PEERS_FOR_PLACEMENT = 10005


class _NotPlacedYet(Exception):
    pass


class LiveBatch(msgspec.Struct, kw_only=True):
    run_id: str
    session_id: str
    seq: int  # seq of events[0]
    cursor: int  # session cursor of events[0]
    events: list[msgspec.Raw]
    types: list[str]
    ended: bool = False
    committed_ms: float = 0.0  # wall clock when the slice committed (for latency metrics)


_batch_encoder = msgspec.json.Encoder()
_batch_decoder = msgspec.json.Decoder(LiveBatch)


class _PubAck(msgspec.Struct):
    """JetStream's reply to a publish: the stored message's stream seq, or an error."""

    seq: int = 0
    error: dict[str, object] | None = None


_ack_decoder = msgspec.json.Decoder(_PubAck)
# Past this many unanswered entries, the ones already done (cancelled by a
# publisher that gave up on them) are dropped.
_ACKS_SWEEP_AT = 4096


class _Acks:
    """The futures of live publishes waiting for their JetStream ack, by the
    token that ends their reply subject (`<inbox>.<token>`)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self._plen = len(prefix)
        self._n = 0
        self._waiting: dict[int, asyncio.Future[int]] = {}

    def expect(self) -> tuple[str, asyncio.Future[int]]:
        """A reply subject and the future its ack resolves."""
        if len(self._waiting) >= _ACKS_SWEEP_AT:
            self._waiting = {k: f for k, f in self._waiting.items() if not f.done()}
        self._n += 1
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._waiting[self._n] = fut
        return f"{self.prefix}{self._n}", fut

    def on_reply(self, subject: bytes, data: bytes, headers: bytes | None) -> None:
        try:
            fut = self._waiting.pop(int(subject[self._plen :]))
        except (KeyError, ValueError):
            return  # answered already, or not ours
        if fut.done():
            return
        if not data:
            # A status-only reply: 503, no stream takes the subject.
            fut.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            ack = _ack_decoder.decode(data)
        except msgspec.DecodeError as e:
            fut.set_exception(nats.js.errors.APIError(description=f"bad publish ack: {e}"))
            return
        if ack.error is not None:
            try:
                nats.js.errors.APIError.from_error(ack.error)
            except nats.js.errors.APIError as e:
                fut.set_exception(e)
            return
        fut.set_result(ack.seq)

    def __len__(self) -> int:
        return len(self._waiting)


def encode_batch(batch: LiveBatch) -> bytes:
    return _batch_encoder.encode(batch)


def decode_batch(data: bytes) -> LiveBatch:
    return _batch_decoder.decode(data)


class Bus:
    def __init__(self, nc: _nats.Client, settings: Settings) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self._acks: _Acks | None = None

    @classmethod
    async def connect(cls, url: str, settings: Settings, *, name: str = "runlog") -> Bus:
        async def _error_cb(e: Exception) -> None:
            log.warning("nats: %s", e)

        nc = _nats.Client()  # live-feed subscriptions without a task per message
        try:
            await nc.connect(
                servers=url.split(","),
                name=name,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,  # type: ignore[arg-type]  # seconds; annotated int
                connect_timeout=5,
                error_cb=_error_cb,
                # Keep publishes buffered while reconnecting; the publisher
                # times out their acks and retries.
                pending_size=64 * 1024 * 1024,
            )
        except (OSError, nats.errors.Error) as e:
            raise errors.BusUnavailable(f"cannot connect to NATS at {url}: {e}") from e
        return cls(nc, settings)

    async def close(self) -> None:
        try:
            await self.nc.drain()
        except (TimeoutError, nats.errors.Error, OSError):
            await self.nc.close()

    async def ensure_streams(self, replicas: int = 1) -> None:
        """Create or update the streams runlog needs (idempotent)."""
        s = self.settings
        configs = [
            api.StreamConfig(
                name=C.EVENTS_STREAM,
                subjects=[f"{C.EVENTS_SUBJECT_PREFIX}.>"],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                max_age=s.events_max_age_s,
                duplicate_window=s.dedupe_window_s,
                num_replicas=replicas,
                discard=api.DiscardPolicy.OLD,
            ),
            api.StreamConfig(
                name=C.JOBS_STREAM,
                subjects=[C.JOBS_SUBJECT],
                retention=api.RetentionPolicy.WORK_QUEUE,
                storage=api.StorageType.FILE,
                duplicate_window=s.dedupe_window_s,
                num_replicas=replicas,
            ),
            api.StreamConfig(
                name=C.CONTROL_STREAM,
                subjects=[f"{C.CONTROL_SUBJECT_PREFIX}.>"],
                retention=api.RetentionPolicy.LIMITS,
                storage=api.StorageType.FILE,
                max_age=s.events_max_age_s,
                duplicate_window=s.dedupe_window_s,
                num_replicas=replicas,
            ),
        ]
        for cfg in configs:
            await self._ensure_stream(cfg)

    async def _ensure_stream(self, cfg: api.StreamConfig) -> None:
        # A NATS cluster answers JetStream requests only once it has elected a
        # meta leader (a few seconds after its nodes start, or after the
        # leader's node died); until then requests time out or get 503. Every
        # process starts with this call, so wait here rather than crash-loop.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAMS_READY_TIMEOUT_S
        while True:
            try:
                try:
                    await self.js.add_stream(cfg)
                except nats.js.errors.BadRequestError as e:
                    if e.err_code == _NO_PEERS_FOR_PLACEMENT:
                        raise _NotPlacedYet(e.description) from e
                    # Exists with another config: bring it to ours.
                    await self.js.update_stream(cfg)
                return
            except (
                nats.errors.TimeoutError,
                nats.errors.NoRespondersError,
                nats.js.errors.ServiceUnavailableError,
                _NotPlacedYet,
            ) as e:
                if loop.time() > deadline:
                    raise errors.BusUnavailable(
                        f"JetStream did not accept stream {cfg.name} within "
                        f"{STREAMS_READY_TIMEOUT_S:.0f} s: {e!r}"
                    ) from e
                log.info("JetStream not ready for stream %s (%r); retrying", cfg.name, e)
                await asyncio.sleep(0.5)

    async def publish_live(self, subject: str, data: bytes, msg_id: str) -> asyncio.Future[int]:
        """Send one live-feed message (deduplicated by `msg_id`); the returned
        future resolves with its stream seq when JetStream acks it, or fails
        (no stream, an API error). It never times out: the caller cancels it."""
        if self._acks is None:
            acks = _Acks(self.nc.new_inbox() + ".")
            # Before any publish on this connection: its acks cannot overtake
            # the SUB. (The appender's publish loop is the only caller.)
            await self.nc.subscribe_replies(acks.prefix + "*", acks.on_reply)
            self._acks = acks
        reply, fut = self._acks.expect()
        hdr = b"NATS/1.0\r\n" + _MSG_ID_LINE + msg_id.encode() + b"\r\n\r\n"
        try:
            await self.nc.publish_headed(subject, reply, hdr, data)
        except BaseException:
            fut.cancel()
            raise
        return fut

    async def enqueue_job(self, job: control.RunJob) -> None:
        # A run's job once (a retried publish is deduplicated); each wake-up
        # of a parked run is its own message (a duplicate is harmless: the
        # claim takes the run once).
        msg_id = f"wake:{job.run_id}:{job.requested_at}" if job.wake else f"job:{job.run_id}"
        await self.js.publish(
            C.JOBS_SUBJECT, control.encode(job), headers={C.MSG_ID_HEADER: msg_id}
        )

    async def publish_control(self, msg: control.Interrupt | control.Decision) -> None:
        if isinstance(msg, control.Decision):
            msg_id = f"decision:{msg.approval_id}"
        else:
            msg_id = f"interrupt:{msg.run_id}"
        await self.js.publish(
            C.control_subject(msg.run_id), control.encode(msg), headers={C.MSG_ID_HEADER: msg_id}
        )

    async def publish_access(self, msg: control.AccessChange) -> None:
        """Tell every gateway about an access change (core NATS: at most once;
        flushed, so it has reached the server when this returns)."""
        await self.nc.publish(C.ACCESS_SUBJECT, control.encode(msg))
        await self.nc.flush(timeout=2)

    async def subscribe_access(
        self, callback: Callable[[control.AccessChange], Awaitable[None] | None]
    ) -> Subscription:
        async def on_msg(msg: Msg) -> None:
            try:
                change = control.decode_access(msg.data)
            except msgspec.DecodeError:
                log.error("undecodable access message on %s", msg.subject)
                return
            result = callback(change)
            if result is not None:
                await result

        return await self.nc.subscribe(C.ACCESS_SUBJECT, cb=on_msg)

    async def publish_notice(self, msg: control.SessionNotice) -> None:
        """Tell the gateways that follow a session (core NATS: at most once)."""
        await self.nc.publish(C.notice_subject(msg.session_id), control.encode(msg))

    async def subscribe_notices(
        self, session_id: str, callback: Callable[[control.SessionNotice], None]
    ) -> Subscription:
        async def on_msg(msg: Msg) -> None:
            try:
                notice = control.decode_notice(msg.data)
            except msgspec.DecodeError:
                log.error("undecodable session notice on %s", msg.subject)
                return
            if notice.session_id == session_id:
                callback(notice)

        sub = await self.nc.subscribe(C.notice_subject(session_id), cb=on_msg)
        # Live at the server before the caller announces or tells its watchers
        # who is there: an announcement sent after that must reach us.
        await self.nc.flush()
        return sub

    async def subscribe_live(
        self, subject: str, callback: Callable[[LiveBatch], None]
    ) -> Subscription:
        """A core-NATS subscription on live-feed subjects (no JetStream consumer:
        gaps are filled from PostgreSQL, so the cheap path is enough). Each
        batch goes to `callback` straight from the connection's reader, in
        order, with no task or queue in between (broker/_nats.py): it must
        not block."""

        def on_data(data: bytes) -> None:
            try:
                batch = decode_batch(data)
            except msgspec.DecodeError:
                log.error("undecodable live-feed message on %s", subject)
                return
            callback(batch)

        return await self.nc.subscribe_direct(subject, on_data)
