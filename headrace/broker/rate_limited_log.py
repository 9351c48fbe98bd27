"""``RateLimitedLog``: one log line per interval at most for an event that repeats.

Used wherever a failure can repeat once per request or per second (a full disk, a failing
accept, a maintenance task that keeps failing), so the broker's log stays bounded and every
line says how many events it stands for. Thread-safety: ``event`` may be called from any
thread (appends fail on the append thread and on the event loop); a lock guards the counters.
"""

from __future__ import annotations

import logging
import threading
import time


class RateLimitedLog:
    """One line on ``logger`` per ``interval_ms`` at most for a repeating event, carrying how
    many events it stands for (the first event is logged at once)."""

    def __init__(self, logger: logging.Logger, interval_ms: int) -> None:
        self.logger = logger
        self.interval_ms = interval_ms
        self.unreported = 0
        self._last_monotonic_s = -float("inf")
        self._lock = threading.Lock()

    def event(self, level: int, message: str, *args, exc_info: bool = False) -> None:
        with self._lock:
            self.unreported += 1
            now = time.monotonic()
            if (now - self._last_monotonic_s) * 1000 < self.interval_ms:
                return
            count, self.unreported, self._last_monotonic_s = self.unreported, 0, now
        self.logger.log(level, message + " (%d times since the last report)", *args, count,
                        exc_info=exc_info)
