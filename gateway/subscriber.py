"""What the fan-out needs of a client connection: the hub (hub.py) offers a
`Subscriber` its frames, and session notices (notices.py) tell it who watches.

The hub sits below the connections and never imports them: a connection
(connection.py, the one implementation) holds the hub's `Member`s, not the
other way round. Contract, as the hub relies on it:

- `write_now` and the queue's `put_*` never await; False from either means
  the frames were not taken (queue them, or, from the queue, the connection
  is past its bound and is told `overflow()`).
- `close(code)` never blocks (the teardown runs on its own) and may be called
  any number of times; `notice` is a no-op once the connection is ending.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from .sendq import SendQueue


class Subscriber(Protocol):
    user: str  # "" until a WebSocket authenticates
    queue: SendQueue

    def write_now(self, frames: list[bytes], topic: str | None, last: int) -> bool: ...

    def overflow(self) -> None: ...

    def close(self, code: str | None) -> Awaitable[None]: ...

    def notice(self, type_: str, **fields: object) -> None: ...
