"""The WebSocket protocol (version 1): client messages, decoded strictly.

Every client message is a JSON object with a `type`; `ref` (optional, ≤ 64
chars) is echoed in the reply so a client can match replies to requests.
Unknown types, unknown fields, wrong field types and oversize messages get an
`error` reply with a stable code; the connection stays open unless the
disconnect table in docs/protocol.md says otherwise.

Server messages are built as bytes in `frames.py` (events are pre-encoded and
shared by every client of a topic).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from broker import errors

from . import inputs

PROTOCOL_VERSION = 1
SUBPROTOCOL = "runlog.v1"
BEARER_SUBPROTOCOL_PREFIX = "bearer."

Ref = inputs.Ref
# Checked against broker/ids.py where the gateway authorizes the message: a
# malformed id gets the answer an unknown one gets (`not_a_member`).
Id = str
Cursor = inputs.Count
Digest = inputs.Digest
Text = inputs.Text  # no NUL (see inputs.py)


class _Msg(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, tag_field="type"):
    ref: Ref = ""


class Auth(_Msg, tag="auth"):
    token: Annotated[str, msgspec.Meta(max_length=8192)]


class Subscribe(_Msg, tag="subscribe"):
    run_id: Id | None = None
    session_id: Id | None = None
    after: Cursor = 0
    batch: bool = False  # several events per frame


class Unsubscribe(_Msg, tag="unsubscribe"):
    run_id: Id | None = None
    session_id: Id | None = None


class InterruptMsg(_Msg, tag="interrupt"):
    run_id: Id
    reason: Text = ""


class DecideMsg(_Msg, tag="decide"):
    approval_id: Id
    decision: Literal["approve", "reject"]
    comment: Text = ""
    call_digest: Digest = ""  # what the approver was shown; approval_stale if it changed


class Ping(_Msg, tag="ping"):
    pass


ClientMessage = Auth | Subscribe | Unsubscribe | InterruptMsg | DecideMsg | Ping
CLIENT_TYPES = frozenset({"auth", "subscribe", "unsubscribe", "interrupt", "decide", "ping"})

_decoder = msgspec.json.Decoder(ClientMessage)


class _Typed(msgspec.Struct):
    type: object = None
    ref: object = None


_peek = msgspec.json.Decoder(_Typed)


class UnknownMessageType(errors.ClientError):
    code = "unknown_message_type"


class InvalidMessage(errors.ClientError):
    code = "invalid_message"


class MessageTooLarge(errors.ClientError):
    code = "message_too_large"


def decode(data: str | bytes, *, max_bytes: int) -> ClientMessage:
    if len(data) > max_bytes:
        raise MessageTooLarge(f"message is {len(data)} bytes; the limit is {max_bytes}")
    try:
        return _decoder.decode(data)
    except msgspec.ValidationError as e:
        tag = peek(data)[0]
        if tag not in CLIENT_TYPES:
            raise UnknownMessageType(f"unknown message type {tag!r}") from e
        raise InvalidMessage(inputs.describe(e)) from e
    except msgspec.DecodeError as e:
        raise InvalidMessage("malformed JSON") from e


def peek(data: str | bytes) -> tuple[str | None, str]:
    """(type, ref) of a message that failed to decode, for the error reply."""
    try:
        t = _peek.decode(data)
    except msgspec.DecodeError:
        return None, ""
    tag = t.type if isinstance(t.type, str) else None
    ref = t.ref if isinstance(t.ref, str) and len(t.ref) <= 64 else ""
    return tag, ref


def topic_of(msg: Subscribe | Unsubscribe) -> tuple[str, str]:
    """(kind, id) of the stream a message names: exactly one of run_id/session_id."""
    if (msg.run_id is None) == (msg.session_id is None):
        raise InvalidMessage("give exactly one of run_id or session_id")
    if msg.run_id is not None:
        return "run", msg.run_id
    return "session", msg.session_id or ""
