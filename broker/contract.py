"""What runlog relies on beyond a dependency's public API, checked at import.

broker/_nats.py and gateway/_aio.py use private names of nats-py and aiohttp
(their docstrings say why). Each lists those names as `Guard`s and calls
`check` when it is imported: a release that renamed or reshaped one fails
there, in one sentence naming the dependency, the name, the version runlog
was tested with and the pin that brings it back, not later as an
AttributeError in a connection's reader (nor silently: an `assert` is gone
under `python -O`). A guard checks what can be checked without a server: a
method's parameters, that a function stores or calls a name, the attributes
of a freshly built object. tests/test_dependency_contracts.py checks the rest
against real servers, and breaks each name in turn to show its guard refuses
the import, under `-O` too. Upgrading one: README, "Upgrading a dependency".
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata


class IncompatibleDependency(RuntimeError):
    """An installed dependency lacks, or changed, a private name runlog uses."""


@dataclass(frozen=True, slots=True)
class Guard:
    name: str  # as the error says it: "Client._pongs"
    shape: str  # what runlog relies on: "a list of the futures waiting for a PONG"
    holds: Callable[[], bool]  # False, or raising, when the installed version differs


def incompatible(dist: str, tested: str, name: str, shape: str) -> IncompatibleDependency:
    try:
        installed = metadata.version(dist)
    except metadata.PackageNotFoundError:
        installed = "(version unknown)"
    return IncompatibleDependency(
        f"runlog needs {dist}'s {name} ({shape}; tested with {dist} {tested}); "
        f"this {dist} {installed} lacks it or changed it: pin {dist}~={tested}"
    )


def check(dist: str, tested: str, guards: Sequence[Guard]) -> None:
    """Raise IncompatibleDependency for the first guard that does not hold."""
    for g in guards:
        try:
            ok = g.holds()
        except Exception:  # a missing name, a signature that cannot be read
            ok = False
        if not ok:
            raise incompatible(dist, tested, g.name, g.shape)


def params(fn: Callable[..., object]) -> list[str]:
    """The parameter names of `fn`, `self` first for a method."""
    return list(inspect.signature(fn).parameters)


def uses(fn: Callable[..., object], *names: str) -> bool:
    """`fn`'s own code stores, loads or calls each of `names` (attribute or global)."""
    return set(names) <= set(fn.__code__.co_names)
