"""Replication throttling, as Kafka's ``ReplicationQuotaManager``: ``ReplicationQuota``.

One quota per direction per broker: the leader's (``leader.replication.throttled.rate``, the
bytes/s this broker sends to throttled followers) and the follower's
(``follower.replication.throttled.rate``, the bytes/s it fetches for throttled replicas);
both broker dynamic configs, default Long.MAX_VALUE (no throttle). Which replicas are
throttled is the topic configs' ``leader.replication.throttled.replicas`` /
``follower.replication.throttled.replicas``: ``*`` (every replica of the topic) or a list of
``partition:broker`` -- a follower's entry names the follower broker, a leader's names the
leader broker (``throttled_replicas``; this broker's id decides).

The rate is Kafka's ``Rate`` over a ``SampledStat``: ``replication.quota.window.num`` (11)
samples of ``replication.quota.window.size.seconds`` (1 s) each; bytes recorded go into the
current sample, samples older than the window count fall out, and the rate is their total
over the elapsed time, taken as at least ``(samples - 1) * window`` (Kafka's
``Rate.windowSize``), so a burst at start-up is not judged over a few milliseconds. The
quota is exceeded while that rate is above the bound (``is_exceeded``). Throttled replicas
that are not in the ISR are then left out: the follower stops adding them to its fetches,
the leader leaves their bytes out of follower fetch responses; both record the bytes they do
move for throttled replicas (``record``). Its own accounting (``recorded_bytes``,
``throttled_ms``: time during which ``is_exceeded`` answered true) is what tests read.

``LeaderReplicationThrottle`` is the leader's side, used by Fetch for followers: a partition
whose ``leader.replication.throttled.replicas`` names this broker, fetched by a follower not in
its ISR (ZooKeeper's partition state) while ``leader.replication.throttled.rate`` is exceeded,
is answered without records (its high watermark and offsets still); the bytes sent for
throttled partitions are recorded.

Clock injected (``now_ms``). Event loop thread only.
"""

from __future__ import annotations

import logging
from collections import deque

LONG_MAX = 2**63 - 1
DEFAULT_WINDOW_COUNT = 11  # Kafka's replication.quota.window.num
DEFAULT_WINDOW_SIZE_MS = 1000  # Kafka's replication.quota.window.size.seconds, 1
ALL_REPLICAS = "*"
LEADER_THROTTLED_REPLICAS = "leader.replication.throttled.replicas"
LEADER_THROTTLED_RATE = "leader.replication.throttled.rate"
MAX_TRACKED_FOLLOWERS = 100_000  # (partition, follower) pairs remembered as behind
log = logging.getLogger(__name__)


def throttled_replicas(config_value: str | None, broker_id: int) -> frozenset[int] | str:
    """The partitions of a topic whose replicas on ``broker_id`` a ``*.throttled.replicas``
    value throttles: ALL_REPLICAS, or a set of partition indexes."""
    text = (config_value or "").strip()
    if text == ALL_REPLICAS:
        return ALL_REPLICAS
    partitions = set()
    for entry in text.split(","):
        partition, _, broker = entry.strip().partition(":")
        if broker.strip() and int(broker) == broker_id:
            partitions.add(int(partition))
    return frozenset(partitions)


def is_throttled(config_value: str | None, broker_id: int, partition: int) -> bool:
    throttled = throttled_replicas(config_value, broker_id)
    return throttled == ALL_REPLICAS or partition in throttled


class ReplicationQuota:
    def __init__(self, bound_bytes_per_second: int, window_count: int = DEFAULT_WINDOW_COUNT,
                 window_size_ms: int = DEFAULT_WINDOW_SIZE_MS) -> None:
        self.bound_bytes_per_second = bound_bytes_per_second
        self._window_count = window_count
        self._window_size_ms = window_size_ms
        self._samples: deque[list[int]] = deque()  # [window start ms, bytes]
        self.recorded_bytes = 0
        self.throttled_ms = 0
        self._exceeded_since_ms: int | None = None

    @property
    def unbounded(self) -> bool:
        return self.bound_bytes_per_second >= LONG_MAX

    def record(self, size_bytes: int, now_ms: int) -> None:
        """Count bytes moved for throttled replicas."""
        self._expire(now_ms)
        if not self._samples or now_ms - self._samples[-1][0] >= self._window_size_ms:
            self._samples.append([now_ms, 0])
        self._samples[-1][1] += size_bytes
        self.recorded_bytes += size_bytes

    def rate_bytes_per_second(self, now_ms: int) -> float:
        self._expire(now_ms)
        if not self._samples:
            return 0.0
        elapsed_ms = now_ms - self._samples[0][0]
        minimum_ms = (self._window_count - 1) * self._window_size_ms
        elapsed_ms = max(elapsed_ms, minimum_ms, 1)
        return sum(sample[1] for sample in self._samples) * 1000 / elapsed_ms

    def is_exceeded(self, now_ms: int) -> bool:
        """Whether throttled replicas must wait; also accounts the time spent throttled."""
        exceeded = not self.unbounded and \
            self.rate_bytes_per_second(now_ms) > self.bound_bytes_per_second
        if exceeded and self._exceeded_since_ms is None:
            self._exceeded_since_ms = now_ms
        elif not exceeded and self._exceeded_since_ms is not None:
            self.throttled_ms += now_ms - self._exceeded_since_ms
            self._exceeded_since_ms = None
        return exceeded

    def throttled_ms_at(self, now_ms: int) -> int:
        """The time ``is_exceeded`` has answered true, up to ``now_ms``."""
        ongoing_ms = 0 if self._exceeded_since_ms is None else now_ms - self._exceeded_since_ms
        return self.throttled_ms + ongoing_ms

    def _expire(self, now_ms: int) -> None:
        horizon_ms = now_ms - self._window_count * self._window_size_ms
        while self._samples and self._samples[0][0] + self._window_size_ms <= horizon_ms:
            self._samples.popleft()


class LeaderReplicationThrottle:
    """The leader's replication quota and Kafka's ``shouldLeaderThrottle``."""

    def __init__(self, broker_id: int, config, cache) -> None:
        self._broker_id = broker_id
        self._config = config
        self._cache = cache  # headrace.cluster.metadata_cache.MetadataCache
        # (topic, partition, follower) of throttled partitions whose follower is behind
        self._behind: set[tuple[str, int, int]] = set()
        self.quota = ReplicationQuota(
            config.get_int(LEADER_THROTTLED_RATE), config.get_int("replication.quota.window.num"),
            config.get_int("replication.quota.window.size.seconds") * 1000)

    def is_throttled(self, topic: str, partition: int) -> bool:
        cluster_topic = self._cache.current.topics.get(topic)
        return cluster_topic is not None and is_throttled(
            cluster_topic.configs.get(LEADER_THROTTLED_REPLICAS), self._broker_id, partition)

    def holds_back(self, topic: str, partition: int, follower_id: int, now_ms: int) -> bool:
        """Whether a follower's fetch of the partition gets no records now."""
        if not self.is_throttled(topic, partition):
            return False
        state = self._cache.current.states.get((topic, partition))
        if state is not None and follower_id in state.isr:
            return False
        self.quota.bound_bytes_per_second = self._config.get_int(LEADER_THROTTLED_RATE)
        return self.quota.is_exceeded(now_ms)

    def note_follower_position(self, topic: str, partition: int, follower_id: int,
                               fetch_offset: int, log_end_offset: int, now_ms: int) -> None:
        """Log the quota's accounting when a follower of a throttled partition reaches the
        log end after being behind."""
        key = (topic, partition, follower_id)
        if fetch_offset < log_end_offset:
            if len(self._behind) < MAX_TRACKED_FOLLOWERS:
                self._behind.add(key)
            return
        if key in self._behind:
            self._behind.discard(key)
            quota = self.quota
            quota.bound_bytes_per_second = self._config.get_int(LEADER_THROTTLED_RATE)
            log.info("follower %d caught up with %s-%d under the leader replication quota: "
                     "window rate %d bytes/s (bound %d), %d bytes recorded, throttled %d ms",
                     follower_id, topic, partition, quota.rate_bytes_per_second(now_ms),
                     quota.bound_bytes_per_second, quota.recorded_bytes,
                     quota.throttled_ms_at(now_ms))
