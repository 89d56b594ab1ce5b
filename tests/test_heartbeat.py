"""The gateway's WebSocket heartbeat (gateway/heartbeat.py): one sweep for
every connection. The sweep's phases on their own (pure), then over real
sockets: a quiet client that answers pings stays, pinged once a period; one
that stops answering is cut; a client that talks is never pinged."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from broker.settings import Settings
from gateway.heartbeat import sweep

from .gw import eventually, running_gateway
from .rawclient import RawWs

OP_PING, OP_PONG = 0x9, 0xA


@dataclass(eq=False)
class _Conn:
    heard: bool = True
    pinged: bool = False
    log: list[str] = field(default_factory=list)

    def ping(self) -> None:
        self.log.append("ping")

    def dead(self) -> None:
        self.log.append("dead")


def test_a_quiet_connection_is_pinged_once_a_period_and_cut_when_the_pong_is_late() -> None:
    answers, silent = _Conn(), _Conn()
    conns = [answers, silent]
    cut: list[list[str]] = []
    for phase in range(8):  # ping, check, ping, check, ...
        dead = sweep(conns, phase % 2 == 0)
        cut.append(["answers" if c is answers else "silent" for c in dead])
        conns = [c for c in conns if c not in dead]
        if answers.log[-1:] == ["ping"] and phase % 2 == 0:
            answers.heard = True  # its pong, before the check
    # Heard at the upgrade: the first ping phase only clears that; then a
    # ping every other phase (once a period).
    assert answers.log == ["ping", "ping", "ping"]
    assert silent.log == ["ping", "dead"]  # pinged at phase 2, cut at 3
    assert cut == [[], [], [], ["silent"], [], [], [], []]


def test_a_connection_that_talks_is_never_pinged() -> None:
    talker = _Conn()
    for phase in range(8):
        talker.heard = True  # a message in every half period
        sweep([talker], phase % 2 == 0)
    assert talker.log == []


async def _pings(c: RawWs, n: int, answer: bool) -> int:
    """Read frames until `n` pings came (answering each if `answer`); the
    text messages seen meanwhile."""
    texts = 0
    while n:
        op, data = await c.frame()
        if op == OP_PING:
            assert data == b""
            n -= 1
            if answer:
                await c.send_frame(OP_PONG, data)
        else:
            texts += 1
    return texts


async def test_the_sweep_keeps_a_client_that_answers_and_cuts_one_that_stops(
    settings: Settings,
) -> None:
    async with running_gateway(settings, ws_heartbeat_s=0.4) as g:
        c, _ = await RawWs.connect(g.port, g.token("alice"))
        try:
            assert (await c.message())["type"] == "hello"
            # Three periods answered: still open on the server's side.
            assert await asyncio.wait_for(_pings(c, 3, answer=True), 30) == 0
            assert c.server_side_open(g.port)
            # Then silent: the next ping goes unanswered and the server cuts it.
            await asyncio.wait_for(_pings(c, 1, answer=False), 30)
            await eventually(lambda: not c.server_side_open(g.port), what="cut for a late pong")
            await eventually(
                lambda: g.sample("runlog_gateway_connections", {"kind": "ws"}) == 0,
                what="connection gone",
            )
        finally:
            await c.close()


async def test_a_client_that_pings_is_not_pinged(settings: Settings) -> None:
    async with running_gateway(settings, ws_heartbeat_s=0.4) as g:
        c, _ = await RawWs.connect(g.port, g.token("alice"))
        try:
            assert (await c.message())["type"] == "hello"
            # Its own `ping` every 0.1 s (a quarter period) for 2 s: 5 periods.
            for k in range(20):
                await c.send(type="ping", ref=str(k))
                op, _ = await asyncio.wait_for(c.frame(), 10)
                assert op != OP_PING, "pinged although it talks"
                await asyncio.sleep(0.1)
            assert c.server_side_open(g.port)
        finally:
            await c.close()
