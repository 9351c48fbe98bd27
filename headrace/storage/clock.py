"""Clocks injected into storage, coordinator and broker logic.

Owns the tiny clock interface (``now_ms()`` wall time, ``monotonic_ms()`` for intervals) and
the real implementation. Tests pass a ``ManualClock`` they advance by hand.
Both clocks are thread-safe (reads of an int; ManualClock is advanced by the test thread).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds since the epoch and a monotonic counter."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to; for deterministic tests."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise ValueError("a clock never goes back")
        self._now_ms += delta_ms
