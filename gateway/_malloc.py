"""Giving freed heap memory back to the OS after connections close (glibc only).

When a flood of connections ends, CPython frees their objects, but glibc's
malloc keeps most of the freed heap mapped for reuse, so the gateway's RSS
stays at its peak. `malloc_trim(0)` returns the free pages of every arena
(bench/flood.py shows the effect). It walks the heap, so it runs in a thread
(ctypes releases the GIL) and at most once per `interval_s`: `interval_s`
after a connection closed, whatever closes after it.

Elsewhere (musl, macOS, no libc.so.6) this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import platform
import sys
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    trim: Callable[[int], int] = fn
    return trim


class Trimmer:
    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._trim = _malloc_trim() if interval_s > 0 else None
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0

    def note_close(self) -> None:
        """A connection closed: trim within `interval_s` (one timer for a burst)."""
        if self._trim is None or self._timer is not None:
            return
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.interval_s, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        if self._trim is not None:
            self.trims += 1
            loop.run_in_executor(None, self._trim, 0)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
