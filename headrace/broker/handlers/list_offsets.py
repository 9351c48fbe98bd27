"""ListOffsets (key 2), versions 0-9: offsets by time.

Timestamps: -2 earliest (log start offset), -1 latest (the last fetchable offset, as Kafka's
``fetchOffsetForTimestamp``: the high watermark -- the log end offset on one node --, under
read_committed, v2+, the last stable offset, for a replica (replica_id >= 0) the log end
offset; an offset found by time must lie below it), -3 the record with the
largest timestamp (v7+), -4 earliest local (v8+, KIP-405: without tiered storage the log
start offset, as -2), -5 latest tiered (v9+, KIP-1005: without tiered storage offset -1,
timestamp -1, leader epoch -1), or a time in ms: the first offset whose timestamp is >= it,
or offset -1 / timestamp -1 when there is none. As Kafka's
``handleListOffsetRequestV1AndAbove``, any other negative timestamp, or one older than the
version that introduced it, answers UNSUPPORTED_VERSION for its partition. Errors per
partition (UNKNOWN_TOPIC_OR_PARTITION; in a cluster also NOT_LEADER_OR_FOLLOWER and, for a
stale or unknown ``current_leader_epoch``, FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH).

v0 (clients that skip ApiVersions; decoded by hand in wire.py, kio lacks it) answers Kafka's
legacy "offsets before": up to ``max_num_offsets`` offsets, descending, from the list of
each segment's base offset (at least the log start offset) with the segment's last
modification time, plus the log end offset with the current time when the active segment is
not empty -- -1 starts at the last entry, -2 at the first, a time at the last entry modified
at or before it; a consumer's answer (replica_id -1) never exceeds the high watermark.
Timestamps below -2 get UNSUPPORTED_VERSION. The v0 response is encoded by hand::

    topics [ name string, partitions [ partition_index int32, error_code int16,
                                       old_style_offsets [ int64 ] ] ]

Event loop thread; ``Log.offset_for_timestamp`` is safe to call concurrently with appends.
"""

from __future__ import annotations

import struct

from headrace.broker.context import RawResponse
from headrace.errors import KafkaError, OffsetNotAvailable, UnsupportedVersion

API_KEY = 2
MIN_VERSION = 0
MAX_VERSION = 9

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
EARLIEST_LOCAL_TIMESTAMP = -4
LATEST_TIERED_TIMESTAMP = -5
# Kafka's timestampMinSupportedVersion: the first version taking each special timestamp.
FIRST_VERSION_BY_SPECIAL_TIMESTAMP = {EARLIEST_TIMESTAMP: 1, LATEST_TIMESTAMP: 1,
                                      MAX_TIMESTAMP: 7, EARLIEST_LOCAL_TIMESTAMP: 8,
                                      LATEST_TIERED_TIMESTAMP: 9}
CONSUMER_REPLICA_ID = -1
NO_LEADER_EPOCH = -1
FIRST_ISOLATION_VERSION = 2
READ_COMMITTED = 1
_INT16, _INT32, _INT64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_PARTITION_HEAD = struct.Struct(">ihi")  # partition_index, error_code, offsets count


def _partition(broker, topic: str, partition, version: int, read_committed: bool,
               from_replica: bool) -> dict:
    index = partition.partition_index
    wanted = partition.timestamp
    try:
        if wanted < 0 and version < FIRST_VERSION_BY_SPECIAL_TIMESTAMP.get(wanted, MAX_VERSION + 1):
            raise UnsupportedVersion(f"timestamp {wanted} needs a later version than {version}")
        log = broker.log_manager.get_log(topic, index)
        if broker.cluster is not None:  # v4+ carry the client's leader epoch
            broker.cluster.check_leader_epoch(
                topic, index, getattr(partition, "current_leader_epoch", -1))
        if wanted == LATEST_TIERED_TIMESTAMP:  # nothing is tiered
            return {"partition_index": index, "error_code": 0, "timestamp": -1, "offset": -1,
                    "leader_epoch": -1}
        if wanted == EARLIEST_LOCAL_TIMESTAMP:  # every segment is local
            wanted = EARLIEST_TIMESTAMP
        last_fetchable_offset = _last_fetchable_offset(log, read_committed, from_replica)
        found = _offset_for(log, wanted, last_fetchable_offset)
        leader_epoch = 0
        if broker.cluster is not None:
            leader_epoch = _leader_epoch_of(broker.cluster, log, wanted, found, from_replica)
    except KafkaError as error:
        return {"partition_index": index, "error_code": error.code, "timestamp": -1,
                "offset": -1, "leader_epoch": -1}
    if found is None:
        offset, timestamp = -1, -1
    else:
        offset, timestamp = found
    if wanted in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
        timestamp = -1
    return {"partition_index": index, "error_code": 0, "timestamp": timestamp,
            "offset": offset, "leader_epoch": leader_epoch}


def _leader_epoch_of(cluster, log, wanted: int, found, from_replica: bool) -> int:
    """The leader epoch answered with ``found`` in a cluster, as Kafka's: the leader's for
    latest, else the epoch of the batch holding the offset (the log's epoch cache; -1 when
    unknown). A new leader whose high watermark has not reached the start of its epoch
    answers a client OFFSET_NOT_AVAILABLE for latest (KIP-207,
    ``Partition.fetchOffsetForTimestamp``)."""
    leader = cluster.leader_replicas.leaders.get((log.topic, log.partition))
    if leader is None:
        return NO_LEADER_EPOCH
    lagging = not from_replica and leader.epoch_start_offset > log.high_watermark
    if wanted == LATEST_TIMESTAMP:
        if lagging:
            raise OffsetNotAvailable(
                f"{log.topic}-{log.partition}: the high watermark {log.high_watermark} is "
                f"behind the start offset {leader.epoch_start_offset} of leader epoch "
                f"{leader.leader_epoch}")
        return leader.leader_epoch
    if found is None:
        return NO_LEADER_EPOCH
    epoch = NO_LEADER_EPOCH
    for entry in log.leader_epoch_cache.entries():
        if entry.start_offset > found[0]:
            break
        epoch = entry.epoch
    return epoch


def _last_fetchable_offset(log, read_committed: bool, from_replica: bool) -> int:
    """Kafka's ``fetchOffsetForTimestamp`` bound: the log end offset for a replica, the last
    stable offset under read_committed, else the high watermark."""
    if from_replica:
        return log.log_end_offset
    return log.last_stable_offset if read_committed else log.high_watermark


def _offset_for(log, wanted: int, last_fetchable_offset: int) -> tuple[int, int] | None:
    """As Kafka's ``fetchOffsetForTimestamp``: latest answers the last fetchable offset, and
    an offset found by time (or the max timestamp's) must lie below it."""
    if wanted == LATEST_TIMESTAMP:
        return last_fetchable_offset, -1
    found = log.offset_for_timestamp(wanted)
    if wanted != EARLIEST_TIMESTAMP and found is not None and found[0] >= last_fetchable_offset:
        return None
    return found


def legacy_offsets_before(log, timestamp: int, max_num_offsets: int, now_ms: int,
                          from_consumer: bool) -> list[int]:
    """Kafka's ``legacyFetchOffsetsBefore`` (and a consumer's high-watermark cap) for v0."""
    segments = log.segments
    entries = [(max(segment.base_offset, log.log_start_offset), segment.last_modified_ms())
               for segment in segments]
    if segments[-1].size_bytes > 0:
        entries.append((log.log_end_offset, now_ms))
    if timestamp == LATEST_TIMESTAMP:
        start = len(entries) - 1
    elif timestamp == EARLIEST_TIMESTAMP:
        start = 0
    else:
        start = len(entries) - 1
        while start >= 0 and entries[start][1] > timestamp:
            start -= 1
    count = max(0, min(max_num_offsets, start + 1))
    offsets = sorted((entries[start - j][0] for j in range(count)), reverse=True)
    high_watermark = log.high_watermark
    if from_consumer and any(offset > high_watermark for offset in offsets):
        offsets = [high_watermark] + [offset for offset in offsets if offset <= high_watermark]
    return offsets


def _legacy_partition(manager, topic: str, partition, now_ms: int, from_consumer: bool) -> bytes:
    index = partition.partition_index
    offsets: list[int] = []
    try:
        if partition.timestamp < EARLIEST_TIMESTAMP:
            raise UnsupportedVersion("v0 takes only -1, -2 and times")
        offsets = legacy_offsets_before(manager.get_log(topic, index), partition.timestamp,
                                        partition.max_num_offsets, now_ms, from_consumer)
        error_code = 0
    except KafkaError as error:
        error_code = error.code
    return _PARTITION_HEAD.pack(index, error_code, len(offsets)) + b"".join(
        _INT64.pack(offset) for offset in offsets)


def _handle_v0(ctx, request) -> RawResponse:
    manager = ctx.broker.log_manager
    from_consumer = request.replica_id == CONSUMER_REPLICA_ID
    body = bytearray(_INT32.pack(len(request.topics)))
    for topic in request.topics:
        name = topic.name.encode()
        body += _INT16.pack(len(name)) + name + _INT32.pack(len(topic.partitions))
        for partition in topic.partitions:
            body += _legacy_partition(manager, topic.name, partition, ctx.now_ms, from_consumer)
    return RawResponse((bytes(body),), len(body))


async def handle(ctx, request):
    if ctx.api_version == 0:
        return _handle_v0(ctx, request)
    read_committed = ctx.api_version >= FIRST_ISOLATION_VERSION and \
        request.isolation_level == READ_COMMITTED
    from_replica = request.replica_id != CONSUMER_REPLICA_ID
    return ctx.respond({
        "throttle_time": 0,
        "topics": [
            {"name": topic.name,
             "partitions": [_partition(ctx.broker, topic.name, p, ctx.api_version,
                                       read_committed, from_replica)
                            for p in topic.partitions]}
            for topic in request.topics
        ],
    })
