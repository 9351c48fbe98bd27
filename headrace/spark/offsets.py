"""Offset planning for the Spark source: resolving positions on a broker, and pure range plans.

Owns:
- ``BrokerOffsets``: the driver's view of a cluster through a confluent-kafka AdminClient
  (topic-partitions of a subscription, earliest / latest offsets, offsets for timestamps),
  asked at the ``isolation.level`` of the options: latest is the last stable offset under
  read_committed.
- ``resolve_offsets``: an ``OffsetSpec`` (earliest, latest, per-partition JSON with -2/-1,
  timestamps) turned into concrete offsets.
- Pure functions used by batch and streaming plans: ``plan_ranges`` (one ``OffsetRange`` per
  topic-partition, with Spark's data-loss checks), ``split_ranges`` (minPartitions),
  ``rate_limit`` (maxOffsetsPerTrigger), and the JSON form Spark checkpoints:
  ``{"topic": {"0": 42, "1": 7}}``.

Semantics follow Spark's Kafka source (KafkaOffsetReaderAdmin, KafkaOffsetRangeCalculator,
KafkaMicroBatchStream.rateLimit). A partition new to a stream starts at offset 0; if the log no
longer starts there, the executor reports data loss, so plans never depend on broker state and
replaying ``plan_ranges(start, end)`` during recovery yields the same ranges.

``BrokerOffsets`` holds one client and is not thread-safe; the pure functions are.
``BrokerOffsets.shared`` takes its AdminClient from a process-wide cache (``AdminClientCache``,
locked) instead of creating one: Spark plans batch queries in a reused Python worker, and
planning a query with a fresh AdminClient (set-up, first metadata, teardown) measured a
median 59 ms against 7 ms on a warm client (busy 2-core machine). Cached clients unused for
``ADMIN_CLIENT_IDLE_MS`` are dropped at the next lookup (at most ``ADMIN_CLIENTS_KEPT`` kept).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import OffsetSpec as AdminOffsetSpec

from headrace.client.broker_connection import DEFAULT_REQUEST_TIMEOUT_MS
from headrace.errors import OffsetOutOfRange, UnknownTopicOrPartition
from headrace.spark.options import (
    EARLIEST_OFFSET_SENTINEL,
    LATEST_OFFSET_SENTINEL,
    OffsetSpec,
    OptionError,
    Subscription,
)
from headrace.spark.wire_fetch import isolation_level_of
from headrace.storage.clock import Clock, SystemClock

PartitionKey = tuple[str, int]
PartitionOffsets = dict[PartitionKey, int]
DEFAULT_REQUEST_TIMEOUT_S = DEFAULT_REQUEST_TIMEOUT_MS / 1000
ADMIN_CLIENT_IDLE_MS = 60_000
ADMIN_CLIENTS_KEPT = 4
NO_OFFSET_FOR_TIMESTAMP = -1

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Records [from_offset, until_offset) of one topic-partition: one Spark input partition."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


def offsets_to_json(offsets: PartitionOffsets) -> dict[str, dict[str, int]]:
    document: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        document.setdefault(topic, {})[str(partition)] = int(offset)
    return document


def offsets_from_json(document: dict) -> PartitionOffsets:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in document.items()
        for partition, offset in partitions.items()
    }


def report_data_loss(message: str, fail_on_data_loss: bool, error=OffsetOutOfRange) -> None:
    """Raise with Spark's advice when failOnDataLoss is true; otherwise log and carry on."""
    if fail_on_data_loss:
        raise error(
            f"{message}. Some data may have been lost because they are not available in Kafka "
            "any more; either the data was aged out by Kafka or the topic may have been deleted "
            "before all the data in the topic was processed. If you don't want your query to "
            "fail on such cases, set the source option \"failOnDataLoss\" to \"false\"."
        )
    _log.warning("%s. Some data may have been lost.", message)


def plan_ranges(
    start: PartitionOffsets,
    end: PartitionOffsets,
    fail_on_data_loss: bool,
    new_partition_start: Callable[[PartitionKey], int] = lambda key: 0,
) -> list[OffsetRange]:
    """One range per topic-partition of ``end``; Spark's checks for deleted or rewound logs."""
    deleted = sorted(set(start) - set(end))
    if deleted:
        report_data_loss(f"{_names(deleted)} are gone", fail_on_data_loss,
                         UnknownTopicOrPartition)
    ranges = []
    for key in sorted(end):
        from_offset = start[key] if key in start else new_partition_start(key)
        until_offset = end[key]
        if until_offset < from_offset:
            report_data_loss(
                f"Partition {key[0]}-{key[1]}'s offset was changed from {from_offset} to "
                f"{until_offset}", fail_on_data_loss)
            continue
        if until_offset > from_offset:
            ranges.append(OffsetRange(key[0], key[1], from_offset, until_offset))
    return ranges


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator: split large ranges until minPartitions is reached."""
    ranges = [offset_range for offset_range in ranges if offset_range.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total_size = sum(offset_range.size for offset_range in ranges)
    split = []
    for offset_range in ranges:
        parts = max(round(offset_range.size / total_size * min_partitions), 1)
        split.extend(_split_one(offset_range, parts))
    return split


def _split_one(offset_range: OffsetRange, parts: int) -> list[OffsetRange]:
    pieces = []
    remaining = offset_range.size
    from_offset = offset_range.from_offset
    for part in range(parts):
        piece_size = remaining // (parts - part)
        remaining -= piece_size
        until_offset = min(from_offset + piece_size, offset_range.until_offset)
        if until_offset > from_offset:
            pieces.append(OffsetRange(offset_range.topic, offset_range.partition,
                                      from_offset, until_offset))
        from_offset = until_offset
    return pieces


def rate_limit(
    max_offsets: int, start: PartitionOffsets, latest: PartitionOffsets,
    new_partition_start: Callable[[PartitionKey], int] = lambda key: 0,
) -> PartitionOffsets:
    """Spark's maxOffsetsPerTrigger: share the limit across partitions by backlog size."""
    sizes = {}
    for key, until_offset in latest.items():
        from_offset = start[key] if key in start else new_partition_start(key)
        if until_offset - from_offset > 0:
            sizes[key] = until_offset - from_offset
    total = sum(sizes.values())
    if total < 1:
        return dict(latest)
    limited = {}
    for key, until_offset in latest.items():
        if key not in sizes:
            limited[key] = until_offset
            continue
        from_offset = start[key] if key in start else new_partition_start(key)
        share = max_offsets * sizes[key] / total
        # Do not starve small partitions completely: Spark rounds a share below 1 up.
        share_records = int(share) if share >= 1 else 1
        limited[key] = min(until_offset, from_offset + share_records)
    return limited


def _names(keys: Iterable[PartitionKey]) -> str:
    return ", ".join(f"{topic}-{partition}" for topic, partition in keys)


def _admin_config(client_config: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in client_config.items()
            if key in _ADMIN_SAFE_KEYS or key.startswith(("ssl.", "sasl."))}


class AdminClientCache:
    """AdminClients by configuration, each dropped once unused for ``idle_ms`` (checked at
    every lookup); at most ``max_clients``, the least recently used dropped first."""

    def __init__(self, max_clients: int = ADMIN_CLIENTS_KEPT,
                 idle_ms: int = ADMIN_CLIENT_IDLE_MS, clock: Clock | None = None) -> None:
        self.max_clients = max_clients
        self.idle_ms = idle_ms
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._clients: dict[tuple, tuple[AdminClient, int]] = {}  # oldest use first

    def client(self, admin_config: dict[str, str]) -> AdminClient:
        key = tuple(sorted(admin_config.items()))
        now_ms = self._clock.monotonic_ms()
        with self._lock:
            for stale_key in [cached_key for cached_key, (_, used_ms) in self._clients.items()
                              if now_ms - used_ms >= self.idle_ms]:
                del self._clients[stale_key]
            cached = self._clients.pop(key, None)
            admin = cached[0] if cached else AdminClient(admin_config)
            self._clients[key] = (admin, now_ms)
            while len(self._clients) > self.max_clients:
                del self._clients[next(iter(self._clients))]
        return admin


_ADMIN_CLIENTS = AdminClientCache()


class BrokerOffsets:
    """The driver's metadata and offset queries against one cluster."""

    def __init__(self, client_config: dict[str, str],
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 admin: AdminClient | None = None) -> None:
        self._admin = admin if admin is not None else AdminClient(_admin_config(client_config))
        self._request_timeout_s = request_timeout_s
        self._isolation_level = IsolationLevel(isolation_level_of(client_config))

    @classmethod
    def shared(cls, client_config: dict[str, str],
               cache: AdminClientCache = _ADMIN_CLIENTS) -> BrokerOffsets:
        """Queries through the process's cached AdminClient for this configuration."""
        return cls(client_config, admin=cache.client(_admin_config(client_config)))

    def topic_partitions(self, subscription: Subscription) -> list[PartitionKey]:
        """The partitions a subscription covers now; unknown subscribed topics have none."""
        if subscription.strategy == "assign":
            return list(subscription.assigned)
        metadata = self._admin.list_topics(timeout=self._request_timeout_s)
        if subscription.strategy == "subscribe":
            wanted = set(subscription.topics)
            matches = [name for name in metadata.topics if name in wanted]
        else:
            pattern = re.compile(subscription.pattern)
            matches = [name for name in metadata.topics if pattern.fullmatch(name)]
        keys = []
        for name in matches:
            topic = metadata.topics[name]
            if topic.error is None:
                keys.extend((name, partition) for partition in topic.partitions)
        return sorted(keys)

    def earliest(self, keys: Iterable[PartitionKey]) -> PartitionOffsets:
        return self._list_offsets({key: AdminOffsetSpec.earliest() for key in keys})

    def latest(self, keys: Iterable[PartitionKey]) -> PartitionOffsets:
        return self._list_offsets({key: AdminOffsetSpec.latest() for key in keys})

    def for_timestamps(self, timestamps_ms: dict[PartitionKey, int]) -> PartitionOffsets:
        """First offset whose timestamp >= the given epoch ms, or -1 where there is none."""
        return self._list_offsets(
            {key: AdminOffsetSpec.for_timestamp(ts) for key, ts in timestamps_ms.items()})

    def _list_offsets(self, specs: dict[PartitionKey, AdminOffsetSpec]) -> PartitionOffsets:
        if not specs:
            return {}
        request = {TopicPartition(topic, partition): spec
                   for (topic, partition), spec in specs.items()}
        futures = self._admin.list_offsets(request, isolation_level=self._isolation_level,
                                           request_timeout=self._request_timeout_s)
        offsets = {}
        for topic_partition, future in futures.items():
            try:
                offsets[(topic_partition.topic, topic_partition.partition)] = (
                    future.result().offset)
            except KafkaException as error:
                raise UnknownTopicOrPartition(
                    f"cannot list offsets of {topic_partition.topic}-"
                    f"{topic_partition.partition}: {error}") from None
        return offsets


_ADMIN_SAFE_KEYS = frozenset({
    "bootstrap.servers", "security.protocol", "client.id", "socket.timeout.ms",
    "metadata.max.age.ms", "broker.address.family", "request.timeout.ms",
    "socket.keepalive.enable", "api.version.request",
})


def resolve_offsets(
    spec: OffsetSpec,
    keys: list[PartitionKey],
    broker: BrokerOffsets,
    is_starting: bool,
    starting_timestamp_strategy: str = "error",
) -> PartitionOffsets:
    """Concrete offsets for ``keys`` (Spark's rules for each kind of specification)."""
    if spec.kind == "earliest":
        return broker.earliest(keys)
    if spec.kind == "latest":
        return broker.latest(keys)
    if spec.kind == "offsets":
        return _resolve_sentinels(spec.partition_values(), keys, broker)
    if spec.kind == "timestamp":
        wanted = {key: spec.timestamp_ms for key in keys}
    else:
        wanted = _require_all_partitions(spec.partition_values(), keys, "timestamps")
    found = broker.for_timestamps(wanted)
    missing = [key for key, offset in found.items() if offset == NO_OFFSET_FOR_TIMESTAMP]
    if missing and is_starting and starting_timestamp_strategy == "error":
        raise OffsetOutOfRange(
            f"no offset matched the starting timestamp in {_names(sorted(missing))}")
    latest = broker.latest(missing) if missing else {}
    return {key: latest.get(key, offset) for key, offset in found.items()}


def _require_all_partitions(
    values: dict[PartitionKey, int], keys: list[PartitionKey], what: str
) -> dict[PartitionKey, int]:
    absent = sorted(set(keys) - set(values))
    unknown = sorted(set(values) - set(keys))
    if unknown:
        raise OptionError(f"{what} given for partitions not in the subscription: "
                          f"{_names(unknown)}")
    if absent:
        raise OptionError(f"{what} missing for partitions {_names(absent)}")
    return values


def _resolve_sentinels(
    values: dict[PartitionKey, int], keys: list[PartitionKey], broker: BrokerOffsets
) -> PartitionOffsets:
    values = _require_all_partitions(values, keys, "offsets")
    earliest_keys = [key for key, value in values.items() if value == EARLIEST_OFFSET_SENTINEL]
    latest_keys = [key for key, value in values.items() if value == LATEST_OFFSET_SENTINEL]
    resolved = dict(values)
    resolved.update(broker.earliest(earliest_keys))
    resolved.update(broker.latest(latest_keys))
    return resolved
