"""Server-sent events from model providers: an incremental parser (pure) and
the thin HTTP shell both adapters share (and the AG-UI bridge,
workers/frameworks/agui.py, for its upstream).

`SSEParser` follows the WHATWG event-stream rules (CRLF, LF or CR line ends,
`:` comments, multi-line `data` joined with LF, a leading BOM ignored) with
two deliberate differences: lines and events are bounded in bytes (a
provider, or a proxy in front of it, must not be able to grow a worker's
memory), and at end of stream an event whose lines are all complete but
lacks the final blank line is still dispatched (some servers omit it; a cut
event then fails JSON decoding, which reports it as truncated anyway).

`SSEClient.post()` maps every transport failure to `ModelError`, so an
adapter only ever raises `ModelError`, and it closes the connection (rather
than returning it to the pool) when the body was not read to the end, so a
cancelled stream stops the provider generating.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import aiohttp
import msgspec

from workers.model import ModelError, ModelItem

MAX_EVENT_BYTES = 1 << 20
ERROR_BODY_BYTES = 64 << 10
_MESSAGE_CHARS = 500

_LINE_END = re.compile(rb"\r\n|\r|\n")


def malformed(message: str) -> ModelError:
    return ModelError("model_malformed", message, retryable=True)


class SSEEvent(NamedTuple):
    event: str  # "message" when the frame had no `event:` line
    data: str
    id: str  # the last event id seen so far, per the spec


class SSEParser:
    """Bytes in, complete events out. Raises only `ModelError`."""

    def __init__(self, max_event_bytes: int = MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._rest = b""  # an incomplete line carried to the next chunk
        self._skip_lf = False  # the last chunk ended in CR: a following LF is part of it
        self._first_line = True
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0
        self._last_id = ""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if not chunk:
            return []
        buf = self._rest + chunk if self._rest else chunk
        pos = 0
        if self._skip_lf and buf[:1] == b"\n":
            pos = 1
        self._skip_lf = False
        out: list[SSEEvent] = []
        end = len(buf)
        for m in _LINE_END.finditer(buf, pos):
            if m.start() - pos > self._max:
                raise malformed(f"SSE line longer than {self._max} bytes")
            self._line(buf[pos : m.start()], out)
            pos = m.end()
            if pos == end and m.group() == b"\r":
                self._skip_lf = True
        if end - pos > self._max:
            raise malformed(f"SSE line longer than {self._max} bytes")
        self._rest = buf[pos:]
        return out

    def finish(self) -> list[SSEEvent]:
        """End of stream: an unterminated last line is dropped (it may be cut)."""
        self._rest = b""
        out: list[SSEEvent] = []
        self._dispatch(out)
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if not raw:
            self._dispatch(out)
            return
        line = raw.decode("utf-8", "replace")
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if line.startswith(":"):
            return  # comment: keep-alives, OpenRouter's "PROCESSING" notes
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "data":
            self._data_bytes += len(raw) + 1
            if self._data_bytes > self._max:
                raise malformed(f"SSE event larger than {self._max} bytes")
            self._data.append(value)
        elif field == "event":
            self._event = value
        elif field == "id" and "\0" not in value:
            self._last_id = value
        # `retry` and unknown fields are ignored, as the spec says.

    def _dispatch(self, out: list[SSEEvent]) -> None:
        if self._data:
            out.append(SSEEvent(self._event or "message", "\n".join(self._data), self._last_id))
        self._event = ""
        self._data = []
        self._data_bytes = 0


# -- provider error bodies, shared by both vendors


class ErrorInfo(msgspec.Struct):
    """The `error` object of OpenAI and Anthropic error bodies and events."""

    message: str | None = None
    type: str | None = None
    code: str | int | None = None


class _ErrorBody(msgspec.Struct):
    error: ErrorInfo | str | None = None
    message: str | None = None  # some compatible servers put it at the top level
    detail: str | None = None  # FastAPI-based servers


_ERROR_BODY = msgspec.json.Decoder(_ErrorBody)

# Error types that mean "this request is wrong": retrying cannot help.
# Anything else inside a 200 stream is a provider-side failure.
_CLIENT_FAULT = frozenset(
    {
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "request_too_large",
        "billing_error",
        "insufficient_quota",
        "invalid_api_key",
        "context_length_exceeded",
    }
)

_KEYLIKE = re.compile(r"\bsk-[\w\-*.]{6,}")


def clean_message(text: str, redact: Sequence[str] = ()) -> str:
    """Provider text made safe for logs and clients: keys out, short, one line."""
    for secret in redact:
        if len(secret) >= 8:  # a toy key like "x" would garble every message
            text = text.replace(secret, "[redacted]")
    text = _KEYLIKE.sub("[redacted]", text)
    text = " ".join(text.split())
    return text[:_MESSAGE_CHARS]


def _error_info(body: bytes) -> tuple[ErrorInfo, str]:
    """(structured error, fallback text) from an error body of any shape."""
    try:
        parsed = _ERROR_BODY.decode(body)
    except msgspec.DecodeError:
        return ErrorInfo(), body.decode("utf-8", "replace")
    if isinstance(parsed.error, ErrorInfo):
        return parsed.error, ""
    return ErrorInfo(), parsed.error or parsed.message or parsed.detail or ""


def stream_error(info: ErrorInfo, redact: Sequence[str] = ()) -> ModelError:
    """An error reported inside a 200 stream (OpenAI error chunk, Anthropic `error`)."""
    kind = str(info.type or info.code or "")
    message = clean_message(f"{kind}: {info.message or ''}" if kind else info.message or "", redact)
    if kind in ("overloaded_error", "overloaded"):
        return ModelError("model_overloaded", message, retryable=True)
    return ModelError("model_stream_error", message, retryable=kind not in _CLIENT_FAULT)


def http_error(status: int, body: bytes, redact: Sequence[str] = ()) -> ModelError:
    """Map a non-200 response to a `ModelError`, keeping the provider's message."""
    info, text = _error_info(body)
    detail = clean_message(info.message or text, redact)
    message = f"HTTP {status}: {detail}" if detail else f"HTTP {status}"
    if status in (401, 403):
        return ModelError("model_auth", message, retryable=False)
    if status == 429:
        # OpenAI's out-of-credit answer is a 429 too; waiting does not fix it.
        return ModelError(
            "model_rate_limited", message, retryable=info.code != "insufficient_quota"
        )
    if status == 529 or info.type == "overloaded_error":
        return ModelError("model_overloaded", message, retryable=True)
    if status == 408:
        return ModelError("model_timeout", message, retryable=True)
    if status >= 500:
        return ModelError("model_unavailable", message, retryable=True)
    if 300 <= status < 500:
        # 3xx: redirects are not followed (a POST must not turn into a GET);
        # a redirecting base URL is a configuration error.
        return ModelError("model_bad_request", message, retryable=False)
    return malformed(f"unexpected {message}")


def transport_error(e: Exception) -> ModelError:
    """A connection-level failure. Messages name the failure, never the URL
    (some providers take keys in query strings)."""
    if isinstance(e, ModelError):
        return e
    if isinstance(e, TimeoutError):
        return ModelError("model_timeout", "no data from the provider in time", retryable=True)
    if isinstance(e, ValueError):  # aiohttp.InvalidURL and friends: configuration
        return ModelError(
            "model_bad_request", f"bad provider URL ({type(e).__name__})", retryable=False
        )
    if isinstance(e, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        return ModelError("model_unavailable", "the provider closed the connection", retryable=True)
    return ModelError(
        "model_unavailable", f"cannot reach the provider ({type(e).__name__})", retryable=True
    )


_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, ValueError)


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 10.0  # TCP (and TLS) connect
    # Request sent → response headers and the first body byte. Generous
    # because long prompts are processed before the first byte.
    first_byte_s: float = 60.0
    # Between two body reads. Reasoning models can stay silent for minutes
    # while thinking (OpenAI sends nothing meanwhile; Anthropic sends pings).
    read_s: float = 300.0


class StreamDecoder(Protocol):
    """A vendor's event decoder: SSE events in, model items out."""

    done: bool  # the vendor's end-of-stream marker was seen

    def feed_event(self, ev: SSEEvent) -> list[ModelItem]: ...

    def end(self) -> list[ModelItem]: ...


class SSEClient:
    """POSTs JSON and yields the SSE events of the answer, in batches (one per
    network read) so the per-event cost stays in plain loops."""

    async def items(
        self, url: str, *, headers: Mapping[str, str], body: bytes, decoder: StreamDecoder
    ) -> AsyncGenerator[ModelItem, None]:
        """The model items of one streamed answer, decoded by `decoder`."""
        async with aclosing(self.post(url, headers=headers, body=body)) as batches:
            async for events in batches:
                for ev in events:
                    for item in decoder.feed_event(ev):
                        yield item
                    if decoder.done:
                        break
                if decoder.done:
                    break
        # After the connection is released, so a consumer that stops at
        # Finish does not hold it.
        for item in decoder.end():
            yield item

    def __init__(
        self,
        session: aiohttp.ClientSession | None,
        timeouts: Timeouts,
        *,
        redact: Sequence[str] = (),
        max_event_bytes: int = MAX_EVENT_BYTES,
    ) -> None:
        self._session = session
        self._owns_session = session is None
        self._timeouts = timeouts
        self._redact = tuple(redact)
        self._max_event_bytes = max_event_bytes

    def _get_session(self) -> aiohttp.ClientSession:
        # Created on first use: constructors do no I/O and need no running loop.
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return self._session

    async def aclose(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def post(
        self, url: str, *, headers: Mapping[str, str], body: bytes
    ) -> AsyncGenerator[list[SSEEvent], None]:
        t = self._timeouts
        loop = asyncio.get_running_loop()
        first_byte_deadline = loop.time() + t.first_byte_s
        # Only the socket connect is bounded by aiohttp; the rest by the
        # deadlines below. Never `total`: a stream may legitimately run long.
        client_timeout = aiohttp.ClientTimeout(
            total=None, connect=None, sock_connect=t.connect_s, sock_read=None
        )
        try:
            async with asyncio.timeout_at(first_byte_deadline):
                resp = await self._get_session().post(
                    url,
                    data=body,
                    headers=headers,
                    timeout=client_timeout,
                    allow_redirects=False,
                )
        except _TRANSPORT_ERRORS as e:
            raise transport_error(e) from e
        async with resp:
            try:
                if resp.status != 200:
                    raise http_error(resp.status, await self._error_body(resp), self._redact)
                if resp.content_type != "text/event-stream":
                    raise self._not_sse(resp.content_type, await self._error_body(resp))
                parser = SSEParser(self._max_event_bytes)
                deadline: float | None = first_byte_deadline
                while True:
                    # A fresh timeout per read, never one spanning a `yield`:
                    # it would fire in the consumer's code instead of here.
                    try:
                        if deadline is not None:
                            async with asyncio.timeout_at(deadline):
                                chunk = await resp.content.readany()
                            deadline = None
                        else:
                            async with asyncio.timeout(t.read_s):
                                chunk = await resp.content.readany()
                    except _TRANSPORT_ERRORS as e:
                        raise transport_error(e) from e
                    if not chunk:
                        tail = parser.finish()
                        if tail:
                            yield tail
                        return
                    events = parser.feed(chunk)
                    if events:
                        yield events
            finally:
                # Cancelled, closed early or failed: close the socket so the
                # provider sees the client gone and stops generating. A body
                # read to its end returns the connection to the pool instead.
                if not resp.content.at_eof():
                    resp.close()

    async def _error_body(self, resp: aiohttp.ClientResponse) -> bytes:
        """Up to ERROR_BODY_BYTES of the body; best effort (the status decides)."""
        parts: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(min(self._timeouts.read_s, 10.0)):
                while size < ERROR_BODY_BYTES:
                    part = await resp.content.read(ERROR_BODY_BYTES - size)
                    if not part:
                        break
                    parts.append(part)
                    size += len(part)
        except _TRANSPORT_ERRORS:
            pass
        return b"".join(parts)

    def _not_sse(self, content_type: str, body: bytes) -> ModelError:
        info, _ = _error_info(body)
        if info.message or info.type:
            return stream_error(info, self._redact)
        return malformed(f"expected an event stream, got {content_type or 'no content type'}")
