"""The replication quota (Kafka's ReplicationQuotaManager) on a hand-driven clock: the windowed
rate and its minimum window, when it is exceeded, the time accounted as throttled, and the
``*.throttled.replicas`` topic config values."""

from __future__ import annotations

import pytest

from headrace.broker.replication_quota import (
    ALL_REPLICAS,
    LONG_MAX,
    ReplicationQuota,
    is_throttled,
    throttled_replicas,
)

WINDOW_MS = 1000
START_MS = 1_000_000


def test_rate_is_taken_over_at_least_the_windows_but_one():
    quota = ReplicationQuota(1000, window_count=11, window_size_ms=WINDOW_MS)
    quota.record(5000, START_MS)
    # 5000 bytes in the first millisecond count as spread over (11 - 1) windows: 500 B/s.
    assert quota.rate_bytes_per_second(START_MS + 1) == 500
    assert not quota.is_exceeded(START_MS + 1)
    quota.record(6000, START_MS + 2)
    assert quota.rate_bytes_per_second(START_MS + 2) == 1100
    assert quota.is_exceeded(START_MS + 2)


def test_old_samples_fall_out_of_the_window():
    quota = ReplicationQuota(100, window_count=3, window_size_ms=WINDOW_MS)
    quota.record(1000, START_MS)
    assert quota.is_exceeded(START_MS + 500)
    # The sample of START_MS is past the three windows once 4 s have gone by.
    assert quota.rate_bytes_per_second(START_MS + 4 * WINDOW_MS) == 0
    assert not quota.is_exceeded(START_MS + 4 * WINDOW_MS)
    assert quota.recorded_bytes == 1000


def test_throttled_time_is_the_time_it_answered_exceeded():
    quota = ReplicationQuota(100, window_count=3, window_size_ms=WINDOW_MS)
    quota.record(300, START_MS)  # 150 B/s over the 2 s minimum
    assert quota.is_exceeded(START_MS)
    assert quota.throttled_ms_at(START_MS + 700) == 700
    assert quota.is_exceeded(START_MS + 1000)  # 300 B over 2 s: still 150 B/s
    assert not quota.is_exceeded(START_MS + 3000)  # 300 B over 3 s: 100 B/s, not above
    assert quota.throttled_ms_at(START_MS + 5000) == 3000


def test_the_default_bound_never_throttles():
    quota = ReplicationQuota(LONG_MAX)
    quota.record(2**40, START_MS)
    assert not quota.is_exceeded(START_MS)


@pytest.mark.parametrize(("value", "broker_id", "expected"), [
    ("*", 3, ALL_REPLICAS),
    ("0:1,0:3,2:3", 3, frozenset({0, 2})),
    ("0:1, 1:2", 3, frozenset()),
    ("", 3, frozenset()),
    (None, 3, frozenset()),
])
def test_throttled_replicas_name_this_brokers_partitions(value, broker_id, expected):
    assert throttled_replicas(value, broker_id) == expected


def test_is_throttled():
    assert is_throttled("*", 1, 7)
    assert is_throttled("7:1", 1, 7)
    assert not is_throttled("7:2", 1, 7)
