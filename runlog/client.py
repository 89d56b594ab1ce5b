"""The Python client: start runs, follow them with automatic resume, stop them,
decide approvals.

    async with Client(["http://127.0.0.1:8080"], token) as c:
        sid = await c.create_session("demo")
        run_id = await c.start_run(sid, "hello")
        async for item in c.follow(run_id=run_id):
            print(item.cursor, item.event["type"])

`follow` speaks the WebSocket protocol (docs/protocol.md): it keeps the last
cursor, reconnects on any drop, server-initiated close with `reconnect:
resume`, or retryable error (e.g. `storage_unavailable` while PostgreSQL is
down) — to the next gateway in the list, with exponential backoff and full
jitter — resubscribes from that cursor, and drops anything at or below it, so
the caller sees every event exactly once, in order. It gives up only on a
non-retryable error (raised as `ClientError`, also when the server ends the
subscription because the user's access to the session ended: `forbidden`), a
disconnect saying not to
come back (`Unrecoverable`), or `max_reconnects` attempts in a row that
never got subscribed (`ConnectionError`; `max_first_attempts` before the
first subscription, for a command a user waits on). A run's stream ends after `run_end`.

REST calls do not retry: a failure is a `ClientError` whose `retryable` says
whether the same call may work later.
"""

from __future__ import annotations

import asyncio
import json
import random
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp


class ClientError(Exception):
    """An error reply from the gateway (code as in docs/protocol.md)."""

    def __init__(
        self, status: int, code: str, message: str, body: dict[str, Any], retryable: bool = False
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.body = body
        self.retryable = retryable


class Unrecoverable(ClientError):
    """The server said not to reconnect (reconnect 'stop' or 'reauth')."""


@dataclass(frozen=True)
class Received:
    cursor: int
    event: dict[str, Any]
    from_cursor: int | None = None  # set when lagging deltas were merged


@dataclass
class Backoff:
    base_s: float = 0.1
    max_s: float = 5.0
    attempt: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self) -> float:
        """Exponential backoff with full jitter."""
        cap = min(self.max_s, self.base_s * (2**self.attempt))
        self.attempt += 1
        return self.rng.uniform(0, cap)

    def reset(self) -> None:
        self.attempt = 0


def check_base_url(url: str) -> None:
    """ValueError unless `url` is a gateway's base URL: http:// or https://
    with a host (and a port that is one)."""
    try:
        u = urllib.parse.urlsplit(url)
        ok = u.scheme in ("http", "https") and bool(u.hostname) and (u.port or 1) > 0
    except ValueError:  # a port that is none or out of range
        ok = False
    if not ok:
        raise ValueError(f"{url!r} is not an http:// or https:// URL (http://host:port)")


class Client:
    def __init__(
        self,
        base_urls: str | Sequence[str],
        token: str,
        *,
        session: aiohttp.ClientSession | None = None,
        max_reconnects: int = 50,
        max_first_attempts: int | None = None,
    ) -> None:
        self.base_urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not self.base_urls:
            raise ValueError("no gateway URL")
        for url in self.base_urls:
            check_base_url(url)
        self.token = token
        self._http = session
        self._own_http = session is None
        self._current = 0
        self.max_reconnects = max_reconnects  # in a row, without getting subscribed
        # Before a follow was first subscribed (None: as max_reconnects): a
        # command a user waits on tells at once that no gateway answers.
        self.max_first_attempts = max_first_attempts
        self.reconnects = 0  # in all, for this client's life
        # Why they happened: a server's code, or the transport error's type.
        self.reconnect_reasons: Counter[str] = Counter()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_http and self._http is not None:
            await self._http.close()
            self._http = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    @property
    def base_url(self) -> str:
        return self.base_urls[self._current % len(self.base_urls)]

    # -- REST

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with self.http.request(method, self.base_url + path, json=body, headers=headers) as r:
            data = await r.json(content_type=None)
            if r.status >= 400:
                err = (data or {}).get("error", {})
                raise ClientError(r.status, err.get("code", "?"), err.get("message", ""), data,
                                  bool(err.get("retryable", False)))  # fmt: skip
            return data

    async def create_session(self, title: str = "", run_policy: str = "enqueue") -> str:
        data = await self._call("POST", "/v1/sessions", {"title": title, "run_policy": run_policy})
        return str(data["session_id"])

    async def list_sessions(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/v1/sessions"))["sessions"])

    async def get_session(self, session_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/sessions/{session_id}"))

    async def add_member(self, session_id: str, user_id: str, role: str) -> None:
        await self._call(
            "POST", f"/v1/sessions/{session_id}/members", {"user_id": user_id, "role": role}
        )

    async def set_role(self, session_id: str, user_id: str, role: str) -> str:
        """Change a member's role; returns the one it had."""
        data = await self._call(
            "PATCH", f"/v1/sessions/{session_id}/members/{user_id}", {"role": role}
        )
        return str(data["previous_role"])

    async def remove_member(self, session_id: str, user_id: str) -> str:
        """Remove a member; returns the role it had."""
        data = await self._call("DELETE", f"/v1/sessions/{session_id}/members/{user_id}")
        return str(data["previous_role"])

    async def start_run(self, session_id: str, input: str = "", model: str = "") -> str:
        data = await self._call(
            "POST", f"/v1/sessions/{session_id}/runs", {"input": input, "model": model}
        )
        return str(data["run_id"])

    async def get_run(self, run_id: str) -> dict[str, Any]:
        return dict(await self._call("GET", f"/v1/runs/{run_id}"))

    async def page(self, run_id: str, after: int = 0, limit: int = 1000) -> dict[str, Any]:
        return dict(
            await self._call("GET", f"/v1/runs/{run_id}/events?after={after}&limit={limit}")
        )

    async def interrupt(self, run_id: str, reason: str = "") -> bool:
        data = await self._call("POST", f"/v1/runs/{run_id}/interrupt", {"reason": reason})
        return bool(data["first"])

    async def decide(
        self, run_id: str, approval_id: str, decision: str, comment: str = ""
    ) -> dict[str, Any]:
        return dict(
            await self._call(
                "POST",
                f"/v1/runs/{run_id}/approvals/{approval_id}",
                {"decision": decision, "comment": comment},
            )
        )

    # -- following a stream

    async def follow(
        self,
        *,
        run_id: str | None = None,
        session_id: str | None = None,
        after: int = 0,
        batch: bool = True,
    ) -> AsyncIterator[Received]:
        """Every event after `after`, exactly once, in order, across reconnects."""
        if (run_id is None) == (session_id is None):
            raise ValueError("follow exactly one of run_id or session_id")
        topic = f"run:{run_id}" if run_id else f"session:{session_id}"
        sub = {"type": "subscribe", "ref": "follow", "batch": batch}
        sub["run_id" if run_id else "session_id"] = run_id or session_id
        cursor = after
        backoff = Backoff()
        failures = 0  # attempts in a row that did not get subscribed
        subscribed_once = False
        while True:
            conn = _Connection()
            try:
                async for item in self._one_connection(topic, sub, cursor, conn):
                    if item.cursor <= cursor:
                        continue  # dedupe across reconnects
                    cursor = item.cursor
                    backoff.reset()
                    yield item
                    if run_id and item.event.get("type") == "run_end":
                        return
                reason = conn.reason
            except _Retry as e:
                reason = e.reason
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as e:
                reason = type(e).__name__
            failures = 0 if conn.subscribed else failures + 1
            subscribed_once = subscribed_once or conn.subscribed
            self.reconnects += 1
            self.reconnect_reasons[reason] += 1
            if (
                not subscribed_once
                and self.max_first_attempts is not None
                and failures >= self.max_first_attempts
            ):
                raise ConnectionError(
                    f"no gateway of {', '.join(self.base_urls)} answered in {failures} "
                    f"attempts (last: {reason})"
                )
            if failures > self.max_reconnects:
                raise ConnectionError(
                    f"gave up after {self.max_reconnects} reconnects in a row (last: {reason})"
                )
            self._current += 1  # try the next gateway
            await asyncio.sleep(backoff.next_delay())

    async def _one_connection(
        self, topic: str, sub: dict[str, Any], cursor: int, conn: _Connection
    ) -> AsyncIterator[Received]:
        url = self.base_url.replace("http", "ws", 1) + "/v1/ws"
        headers = {"Authorization": f"Bearer {self.token}"}
        try:
            ws_cm = await self.http.ws_connect(url, headers=headers, heartbeat=20)
        except aiohttp.WSServerHandshakeError as e:
            if e.status in (401, 403):  # the token: trying again will not change it
                code = "unauthorized" if e.status == 401 else "forbidden"
                body = {"code": code, "message": f"the gateway refused the token ({code})"}
                raise ClientError(e.status, code, body["message"], body) from e
            raise
        async with ws_cm as ws:
            await ws.send_str(json.dumps({**sub, "after": cursor}))
            async for msg in ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    break
                m = json.loads(msg.data)
                kind = m.get("type")
                if kind == "event" and m["topic"] == topic:
                    yield Received(m["cursor"], m["event"], m.get("from"))
                elif kind == "events" and m["topic"] == topic:
                    for i, ev in enumerate(m["events"]):
                        yield Received(m["cursor"] + i, ev)
                elif kind == "subscribed" and m.get("topic") == topic:
                    conn.subscribed = True
                elif kind == "error" and m.get("ref") == "follow":
                    if m.get("retryable"):
                        raise _Retry(m["code"])  # e.g. storage_unavailable: wait it out
                    raise ClientError(400, m["code"], m.get("message", ""), m)
                elif kind == "unsubscribed" and m.get("topic") == topic and m.get("code"):
                    # The server ended it: access to the session was removed or lowered.
                    raise ClientError(403, m["code"], m.get("message", ""), m)
                elif kind == "disconnect":
                    if m.get("reconnect") != "resume":
                        raise Unrecoverable(0, m["code"], m.get("message", ""), m)
                    conn.reason = m["code"]


class _Connection:
    """What one connection of `follow` found out."""

    def __init__(self) -> None:
        self.subscribed = False
        self.reason = "dropped"  # why it ended, unless the server said


class _Retry(Exception):
    """A retryable error: reconnect and resume. `reason` is the server's code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
