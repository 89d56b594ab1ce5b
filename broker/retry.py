"""How the store's calls fail: retried while PostgreSQL is away, and told as
the log's errors, never as the driver's.

Contract (of every function wrapped by `reads` / `writes`, the `Store`'s
methods and the modules that run SQL for it: approvals, steps, sessions,
members, retention, census): no asyncpg error leaves it.

- A read (`reads`) is retried while PostgreSQL is unreachable, for
  `db_retry_s`; a write (`writes`) is tried once (whether it took effect is
  unknown, so repeating it is the caller's call), and so is a poll (a read
  whose caller tries again at its next round). Then either raises
  `errors.StorageError` (`storage_unavailable`, retryable), which is itself
  in `TRANSIENT_DB_ERRORS` for callers that retry (`retry_transient`).
- A statement PostgreSQL refuses (a constraint, a schema older than this
  version: not an outage) is `errors.DatabaseError` (`internal`), raised
  from asyncpg's error, naming its class and SQLSTATE, never its text.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import asyncpg

from . import errors
from .settings import Settings

# Errors after which the server or connection is gone for now: whether a
# transaction in flight committed is unknown, and the same call may work later.
TRANSIENT_DB_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.OperatorInterventionError,
    # Raised by asyncpg when the connection broke in the middle of an operation.
    asyncpg.InternalClientError,
    # What the store's methods raise for the above (see the module's contract).
    errors.StorageError,
)

# What a store call fails with that is PostgreSQL's doing: an outage (above)
# or a statement it refused (see the module's contract). For loops that log
# it and go on.
DB_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_DB_ERRORS, errors.DatabaseError)

T = TypeVar("T")
P = ParamSpec("P")


class HasSettings(Protocol):
    """What `reads` / `writes` need of the object they are called on (the Store)."""

    @property
    def settings(self) -> Settings: ...


S = TypeVar("S", bound=HasSettings)


class Database(Protocol):
    """What the modules holding the store's SQL (approvals, steps, fence,
    members, sessions, retention) use of the Store they are given: a Protocol,
    so that they do not import the store, which imports them."""

    @property
    def settings(self) -> Settings: ...

    @property
    def pool(self) -> asyncpg.Pool: ...


def unavailable(what: str) -> errors.StorageError:
    """The coded error for a transient failure during `what` (raise it from that)."""
    return errors.StorageError(f"PostgreSQL unavailable during {what}")


def refused(what: str, e: asyncpg.PostgresError) -> errors.DatabaseError:
    """The coded error for a statement PostgreSQL refused during `what` (raise it from `e`)."""
    return errors.DatabaseError(
        f"PostgreSQL refused the {what} ({type(e).__name__}, SQLSTATE {e.sqlstate})"
    )


async def retry_transient(
    call: Callable[[], Awaitable[T]], *, for_s: float, what: str = "read"
) -> T:
    """Run a read, retrying it while PostgreSQL is unreachable (at most `for_s`)."""
    deadline = time.monotonic() + for_s
    backoff = 0.05
    while True:
        try:
            return await call()
        except TRANSIENT_DB_ERRORS as e:
            if time.monotonic() > deadline:
                if isinstance(e, errors.StorageError):
                    raise
                raise unavailable(what) from e
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


async def retry_read(call: Callable[[], Awaitable[T]], *, for_s: float, what: str) -> T:
    """`retry_transient`, and a refused statement is DatabaseError (a read's whole contract)."""
    try:
        return await retry_transient(call, for_s=for_s, what=what)
    except asyncpg.PostgresError as e:
        raise refused(what, e) from e


_Fn = Callable[Concatenate[S, P], Awaitable[T]]


def reads(what: str) -> Callable[[_Fn[S, P, T]], _Fn[S, P, T]]:
    """A call that only reads: retried for `db_retry_s`, then StorageError."""

    def wrap(fn: _Fn[S, P, T]) -> _Fn[S, P, T]:
        @functools.wraps(fn)
        async def call(store: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
            return await retry_read(
                lambda: fn(store, *args, **kwargs), for_s=store.settings.db_retry_s, what=what
            )

        return call

    return wrap


def writes(what: str) -> Callable[[_Fn[S, P, T]], _Fn[S, P, T]]:
    """A call that writes: tried once, a transient failure is StorageError.
    Also for a read whose caller retries it itself (a poll: its next round)."""

    def wrap(fn: _Fn[S, P, T]) -> _Fn[S, P, T]:
        @functools.wraps(fn)
        async def call(store: S, /, *args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return await fn(store, *args, **kwargs)
            except errors.StorageError:
                raise
            except TRANSIENT_DB_ERRORS as e:
                raise unavailable(what) from e
            except asyncpg.PostgresError as e:
                raise refused(what, e) from e

        return call

    return wrap
