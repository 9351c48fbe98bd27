"""The cleaner's throttler (log.cleaner.io.max.bytes.per.second) against an injected clock:
the sleeps it asks for keep the byte rate at the desired one, a burst never exceeds one
check interval's worth of bytes, and an unthrottled rate never sleeps."""

from __future__ import annotations

from headrace.broker.cleaner_service import THROTTLE_CHECK_INTERVAL_MS, Throttler
from headrace.storage.clock import ManualClock


class SleepRecorder:
    """A sleep that moves the manual clock instead of waiting, and remembers each sleep."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.slept_ms: list[int] = []

    def __call__(self, seconds: float) -> None:
        millis = max(1, round(seconds * 1000))
        self.slept_ms.append(millis)
        self.clock.advance(millis)


def _throttler(bytes_per_second: float) -> tuple[Throttler, ManualClock, SleepRecorder]:
    clock = ManualClock()
    sleep = SleepRecorder(clock)
    return Throttler(bytes_per_second, clock, sleep), clock, sleep


def test_a_burst_within_one_check_interval_is_throttled_once_it_reaches_a_period():
    throttler, clock, sleep = _throttler(600_000)
    period_bytes = 600_000 * THROTTLE_CHECK_INTERVAL_MS // 1000
    chunk_bytes = 32_768
    read_bytes = 0
    while read_bytes + chunk_bytes < period_bytes:
        throttler.maybe_throttle(chunk_bytes)
        read_bytes += chunk_bytes
    assert sleep.slept_ms == []  # still inside the period's allowance, no time has passed
    throttler.maybe_throttle(chunk_bytes)
    read_bytes += chunk_bytes
    assert sum(sleep.slept_ms) >= 1000 * read_bytes // 600_000 - 1


def test_sleeps_keep_a_long_read_at_the_desired_rate():
    throttler, clock, _sleep = _throttler(1_000_000)
    start_ms = clock.monotonic_ms()
    for _ in range(1000):
        throttler.maybe_throttle(10_000)
        clock.advance(1)  # the reading itself takes 1 ms per 10 kB: 10 MB/s unthrottled
    elapsed_s = (clock.monotonic_ms() - start_ms) / 1000
    rate = 10_000_000 / elapsed_s
    assert 900_000 <= rate <= 1_050_000


def test_a_slow_reader_is_never_put_to_sleep():
    throttler, clock, sleep = _throttler(1_000_000)
    for _ in range(100):
        clock.advance(100)
        throttler.maybe_throttle(50_000)  # 500 kB/s: under the limit
    assert sleep.slept_ms == []


def test_the_default_rate_never_sleeps():
    throttler, _clock, sleep = _throttler(1.7976931348623157e308)
    for _ in range(1000):
        throttler.maybe_throttle(1 << 30)
    assert sleep.slept_ms == []
