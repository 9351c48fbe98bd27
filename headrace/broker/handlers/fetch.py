"""Fetch (key 1), versions 0-17: read records, long-polling until min_bytes or max_wait.

Limits: each partition returns at most ``partition_max_bytes`` and the response at most
``max_bytes`` (v3+; none before), except that from v3 on the first partition with data
returns at least one whole batch (KIP-74) so a consumer always progresses (v0-2 have a hard
limit, as in Kafka: a first batch larger than it is not returned). Every partition carries
the high watermark, the last stable offset (``Log.last_stable_offset``) and the log start
offset; errors are per partition (OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION,
UNKNOWN_TOPIC_ID for v13+ requests by an unknown topic id or the zero id, echoing the id
sent, in a cluster NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH for a
``current_leader_epoch`` older / newer than the leader's (v9+), KAFKA_STORAGE_ERROR when reading the log raises an ``OSError`` or the partition is
offline -- NOT_LEADER_OR_FOLLOWER instead before v6, as Kafka answers).
read_committed (v4+) reads only below the last stable offset and lists the aborted
transactions (producer id, first offset) overlapping [fetch offset, LSO) -- Kafka bounds the
list by the end of the returned data or the next segment; the LSO bound may list a few more,
which a consumer ignores past the records it got. v17 (KIP-853) only adds a
follower's ``replica_directory_id`` tagged field, which a consumer does not send; its response
is v16's.

In a cluster a fetch with ``replica_id`` >= 0 (v0-14 body field, v15+ ``replica_state``) is a
follower's: it reads up to the log end offset, and its fetch offset (within the log) is the
follower's log end offset for the leader (``cluster.leader_replicas``: ISR, high watermark;
a broker outside the assignment is NOT_LEADER_OR_FOLLOWER, or UNKNOWN_LEADER_EPOCH when it
named an epoch). Consumers read below the high watermark (read_committed: the last stable
offset); a long poll also wakes when the high watermark advances.

Topic ids (v13+) resolve through ``_TopicIds``, a per-broker id -> name map rebuilt from the
log manager only when an id is missing from it or names a topic that no longer has that id.

Long poll: only when the first read has fewer than ``min_bytes`` (a consumer that is behind
never registers anything): the request registers an ``asyncio.Event`` with the broker's
AppendHub for its partitions (appends wake it through ``loop.call_soon_threadsafe``),
re-reads, and waits until enough data or ``max_wait_ms``.

A follower's fetch of a partition under leader-side replication throttling
(``replication_quota.LeaderReplicationThrottle``: leader.replication.throttled.replicas and
.rate, the follower not in the ISR) gets no records while the leader's quota is exceeded; the
bytes sent for throttled partitions are recorded in it.

Fetch sessions (KIP-227) are not kept: every response has session_id 0, which tells clients
to send full fetch requests; a request naming a session id gets FETCH_SESSION_ID_NOT_FOUND.
Responses are ``RawResponse``s from fetch_response.py: record bytes go out by sendfile --
except for v0-3, whose clients cannot read v2 batches: their records are down-converted
(v0-1 to magic 0, v2-3 to magic 1, ``message_format.down_converted_records``) on a worker
thread and sent as bytes (a topic with message.downconversion.enable=false answers them
UNSUPPORTED_VERSION instead). As in Kafka's KafkaApis: a topic whose compression.type is zstd
answers UNSUPPORTED_COMPRESSION_TYPE to every version below 10, a zstd batch met first in a
down-conversion does too, and KAFKA_STORAGE_ERROR is sent as NOT_LEADER_OR_FOLLOWER to
versions 0-5, which do not know it.
Event loop thread; ``Log.read`` is lock-free and safe concurrently with appends.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
import weakref

from headrace.broker.context import RawResponse
from headrace.broker.fetch_response import (
    FIRST_TOPIC_ID_VERSION,
    PartitionData,
    TopicData,
    encode_fetch_body,
)
from headrace.broker.rate_limited_log import RateLimitedLog
from headrace.errors import (
    FetchSessionIdNotFound,
    KafkaError,
    KafkaStorageError,
    NotLeaderOrFollower,
    UnknownTopicId,
    UnknownTopicOrPartition,
    UnsupportedCompressionType,
    UnsupportedVersion,
)
from headrace.protocol import message_format, wire

API_KEY = 1
MIN_VERSION = 0
MAX_VERSION = 17

FIRST_MAX_BYTES_VERSION = 3  # v0-2: no response limit, a hard partition limit (no KIP-74)
NO_RESPONSE_MAX_BYTES = 2**31 - 1  # Kafka's max_bytes for v0-2
LAST_MAGIC_V0_VERSION = 1  # v0-1 read magic 0, v2-3 magic 1 (down-converted)
LAST_MAGIC_V1_VERSION = 3
FIRST_ZSTD_VERSION = 10
LAST_VERSION_WITHOUT_STORAGE_ERROR = 5
FIRST_ISOLATION_VERSION = 4
READ_COMMITTED = 1
FIRST_REPLICA_STATE_VERSION = 15  # v0-14: a replica_id field; v15+: replica_state (KIP-903)
CONSUMER_REPLICA_ID = -1

NO_SESSION_ID = 0
ZERO_TOPIC_ID = uuid.UUID(int=0)
logger = logging.getLogger(__name__)
STORAGE_ERROR_LOG_INTERVAL_MS = 5000
# A failed disk fails every read: one line per interval, counting the rest.
_storage_errors = RateLimitedLog(logger, STORAGE_ERROR_LOG_INTERVAL_MS)


class _TopicIds:
    """topic id -> name for one log manager, refreshed from it when an id is not found or
    its topic was deleted or re-created under another id."""

    __slots__ = ("_manager", "_names")

    def __init__(self, manager) -> None:
        self._manager = manager
        self._names: dict[uuid.UUID, str] = {}

    def name(self, topic_id: uuid.UUID) -> str | None:
        name = self._names.get(topic_id)
        if name is not None and self._still_names(name, topic_id):
            return name
        self._names = {info.topic_id: info.name for info in self._manager.topics().values()}
        return self._names.get(topic_id)

    def _still_names(self, name: str, topic_id: uuid.UUID) -> bool:
        try:
            return self._manager.topic(name).topic_id == topic_id
        except UnknownTopicOrPartition:
            return False


_topic_ids_by_manager: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _topic_ids(manager) -> _TopicIds:
    topic_ids = _topic_ids_by_manager.get(manager)
    if topic_ids is None:
        topic_ids = _topic_ids_by_manager[manager] = _TopicIds(manager)
    return topic_ids


class _FetchPlan:
    """The partitions of one request, resolved to logs, and how to read them."""

    __slots__ = ("max_bytes", "min_one_batch", "read_committed", "from_follower", "topics",
                 "logs", "held_back", "throttled")

    def __init__(self, ctx, request) -> None:
        manager = ctx.broker.log_manager
        has_max_bytes = ctx.api_version >= FIRST_MAX_BYTES_VERSION
        self.max_bytes = request.max_bytes if has_max_bytes else NO_RESPONSE_MAX_BYTES
        self.min_one_batch = has_max_bytes
        self.read_committed = ctx.api_version >= FIRST_ISOLATION_VERSION and \
            request.isolation_level == READ_COMMITTED
        topic_ids = _topic_ids(manager) if ctx.api_version >= FIRST_TOPIC_ID_VERSION else None
        cluster = ctx.broker.cluster
        replica_id = _replica_id(request, ctx.api_version)
        self.from_follower = cluster is not None and replica_id >= 0
        self.topics: list[tuple[str | None, uuid.UUID, list]] = []
        self.logs: list = []
        # leader-side replication throttling (broker.replication_quota): partitions answered
        # without records, and all throttled ones, whose bytes the quota records
        self.held_back: set[tuple[str, int]] = set()
        self.throttled: set[tuple[str, int]] = set()
        for topic in request.topics:
            if topic_ids is None:
                topic_id, name = ZERO_TOPIC_ID, topic.topic
            else:  # the codec reads the zero id as None; Kafka knows no topic by it
                topic_id = topic.topic_id or ZERO_TOPIC_ID
                name = topic_ids.name(topic_id) if topic_id != ZERO_TOPIC_ID else None
            entries = []
            for partition in topic.partitions:
                log = None
                error: KafkaError | None = None
                if name is None:
                    error = UnknownTopicId(f"unknown topic id {topic_id}")
                else:
                    try:
                        log = manager.get_log(name, partition.partition)
                        if cluster is not None:
                            current_leader_epoch = getattr(partition, "current_leader_epoch", -1)
                            cluster.check_leader_epoch(name, partition.partition,
                                                       current_leader_epoch)
                            if self.from_follower:
                                _record_follower_fetch(cluster, log, name, partition,
                                                       replica_id, current_leader_epoch)
                                self._throttle(cluster.leader_throttle, log, partition,
                                               replica_id, ctx.broker.clock.now_ms())
                    except KafkaError as caught:
                        log = None
                        error = caught
                if log is not None:
                    self.logs.append(log)
                entries.append((partition, log, error))
            self.topics.append((name, topic_id, entries))

    def _throttle(self, throttle, log, partition, replica_id: int, now_ms: int) -> None:
        name, index = log.topic, partition.partition
        if throttle.is_throttled(name, index):
            self.throttled.add((name, index))
            throttle.note_follower_position(name, index, replica_id, partition.fetch_offset,
                                            log.log_end_offset, now_ms)
            if throttle.holds_back(name, index, replica_id, now_ms):
                self.held_back.add((name, index))

    def throttled_bytes(self, topics: list[TopicData]) -> int:
        return sum(data.size_bytes for topic in topics for data in topic.partitions
                   if (topic.name, data.partition_index) in self.throttled)

    def read(self) -> tuple[list[TopicData], int, bool]:
        """(topics, record bytes found, whether any partition has an error)."""
        remaining_bytes = self.max_bytes
        total_bytes = 0
        any_error = False
        topics = []
        for name, topic_id, entries in self.topics:
            answer = TopicData(name, topic_id)
            for partition, log, error in entries:
                held_back = (name, partition.partition) in self.held_back
                data = _read_partition(partition, log, error,
                                       0 if held_back else remaining_bytes,
                                       self.min_one_batch and total_bytes == 0 and not held_back,
                                       self.read_committed, self.from_follower)
                any_error = any_error or data.error_code != 0
                total_bytes += data.size_bytes
                remaining_bytes -= data.size_bytes
                answer.partitions.append(data)
            topics.append(answer)
        return topics, total_bytes, any_error


def _replica_id(request, version: int) -> int:
    """The fetching broker's id (v15+: ``replica_state``), -1 for a consumer."""
    if version >= FIRST_REPLICA_STATE_VERSION:
        state = request.replica_state
        return state.replica_id if state is not None else CONSUMER_REPLICA_ID
    return getattr(request, "replica_id", CONSUMER_REPLICA_ID)


def _record_follower_fetch(cluster, log, name: str, partition, replica_id: int,
                           current_leader_epoch: int) -> None:
    """The leader's record of a follower's position (``leader_replicas``), when its fetch
    offset lies in the log (else the read answers OFFSET_OUT_OF_RANGE, recording nothing)."""
    fetch_offset = partition.fetch_offset
    if log.log_start_offset <= fetch_offset <= log.log_end_offset:
        cluster.leader_replicas.record_follower_fetch(
            name, partition.partition, replica_id, fetch_offset,
            getattr(partition, "log_start_offset", -1), current_leader_epoch)


def _read_partition(partition, log, error, remaining_bytes: int, first_data: bool,
                    read_committed: bool, from_follower: bool) -> PartitionData:
    index = partition.partition
    if log is None:
        return PartitionData(index, error_code=error.code)
    try:
        limit_bytes = min(partition.partition_max_bytes, max(remaining_bytes, 0))
        if limit_bytes > 0 or first_data:
            return _read_records(partition, log, limit_bytes, first_data, read_committed,
                                 from_follower)
        error_code = 0
    except KafkaError as caught:
        error_code = caught.code
    except OSError as caught:
        _storage_errors.event(logging.ERROR, "storage error reading %s-%d: %s", log.topic,
                              log.partition, caught)
        error_code = KafkaStorageError.code
    return PartitionData(index, error_code, log.high_watermark, log.last_stable_offset,
                         log.log_start_offset)


def _read_records(partition, log, limit_bytes: int, first_data: bool,
                  read_committed: bool, from_follower: bool) -> PartitionData:
    """The partition's records from its fetch offset: a follower's up to the log end, a
    consumer's below the high watermark, under read_committed below the last stable offset,
    with the aborted transactions that overlap [fetch offset, LSO)."""
    high_watermark = log.high_watermark  # before the read: never past its data
    last_stable_offset = min(log.last_stable_offset, high_watermark)
    fetch_offset = partition.fetch_offset
    max_offset = None if from_follower else (
        last_stable_offset if read_committed else high_watermark)
    result = log.read(fetch_offset, limit_bytes, min_one_batch=first_data,
                      max_offset=max_offset)
    aborted = ()
    if read_committed and result.size_bytes:
        aborted = tuple((txn.producer_id, txn.first_offset) for txn in
                        log.collect_aborted_transactions(fetch_offset, last_stable_offset))
    return PartitionData(partition.partition, 0, high_watermark, last_stable_offset,
                         result.log_start_offset, result.slices, result.size_bytes, aborted)


async def _long_poll(ctx, plan: _FetchPlan, min_bytes: int, max_wait_ms: int):
    hub = ctx.broker.appended
    keys = [(log.topic, log.partition) for log in plan.logs]
    for log in plan.logs:
        hub.watch(log)
    event = asyncio.Event()
    hub.register(keys, event)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_wait_ms / 1000
    try:
        while True:
            event.clear()
            topics, total_bytes, any_error = plan.read()
            remaining_s = deadline - loop.time()
            if total_bytes >= min_bytes or any_error or remaining_s <= 0:
                return topics
            try:
                await asyncio.wait_for(event.wait(), remaining_s)
            except TimeoutError:
                return plan.read()[0]
    finally:
        hub.unregister(keys, event)


def _down_convert(partition, log, data: PartitionData, to_magic: int) -> PartitionData:
    """``data`` with its records as magic ``to_magic`` messages (bytes), or the error Kafka
    answers when they have no such form (UNSUPPORTED_COMPRESSION_TYPE)."""
    try:
        batches = b"".join(piece.read_bytes() for piece in data.slices)
        records = message_format.down_converted_records(batches, to_magic, partition.fetch_offset)
    except UnsupportedCompressionType:
        return PartitionData(data.partition_index, UnsupportedCompressionType.code)
    except KafkaError as caught:
        logger.error("cannot down-convert %s-%d: %s", log.topic, log.partition, caught)
        return PartitionData(data.partition_index, caught.code, data.high_watermark,
                             data.last_stable_offset, data.log_start_offset)
    except OSError as caught:
        _storage_errors.event(logging.ERROR, "storage error reading %s-%d: %s", log.topic,
                              log.partition, caught)
        return PartitionData(data.partition_index, KafkaStorageError.code, data.high_watermark,
                             data.last_stable_offset, data.log_start_offset)
    return PartitionData(data.partition_index, data.error_code, data.high_watermark,
                         data.last_stable_offset, data.log_start_offset,
                         (records,) if records else (), len(records))


def _has_records(topics: list[TopicData]) -> bool:
    return any(data.slices for topic in topics for data in topic.partitions)


def _for_old_clients(version: int, plan: _FetchPlan, topics: list[TopicData]) -> None:
    """Adapt ``topics`` in place to a version below 10 (see the module docstring): zstd
    topics, down-conversion for v0-3, storage errors for v0-5. Runs on a worker thread
    when it down-converts (the topics and slices are this request's own), else inline."""
    to_magic = 0 if version <= LAST_MAGIC_V0_VERSION else 1
    for (_, _, entries), answer in zip(plan.topics, topics, strict=True):
        for index, ((partition, log, _), data) in enumerate(zip(entries, answer.partitions,
                                                                strict=True)):
            if log is not None and log.config.compression_type == "zstd":
                data = PartitionData(data.partition_index, UnsupportedCompressionType.code)
            elif (log is not None and version <= LAST_MAGIC_V1_VERSION
                  and not log.config.message_downconversion_enable):
                data = PartitionData(data.partition_index, UnsupportedVersion.code)
            elif data.slices and version <= LAST_MAGIC_V1_VERSION:
                data = _down_convert(partition, log, data, to_magic)
            if data.error_code == KafkaStorageError.code and \
                    version <= LAST_VERSION_WITHOUT_STORAGE_ERROR:
                data.error_code = NotLeaderOrFollower.code
            answer.partitions[index] = data


async def handle(ctx, request):
    version = ctx.api_version
    if version >= 7 and request.session_id != NO_SESSION_ID:
        parts, size = encode_fetch_body(version, FetchSessionIdNotFound.code, NO_SESSION_ID, [])
        return RawResponse(tuple(parts), size)
    plan = _FetchPlan(ctx, request)
    topics, total_bytes, any_error = plan.read()
    min_bytes, max_wait_ms = request.min_bytes, wire.milliseconds(request.max_wait)
    if total_bytes < min_bytes and not any_error and max_wait_ms > 0 and plan.logs:
        topics = await _long_poll(ctx, plan, min_bytes, max_wait_ms)
    if plan.throttled:
        ctx.broker.cluster.leader_throttle.quota.record(plan.throttled_bytes(topics),
                                                        ctx.broker.clock.now_ms())
    if version <= LAST_MAGIC_V1_VERSION and _has_records(topics):
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, _for_old_clients, version, plan, topics)
    elif version < FIRST_ZSTD_VERSION:
        _for_old_clients(version, plan, topics)
    parts, size = encode_fetch_body(version, 0, NO_SESSION_ID, topics)
    return RawResponse(tuple(parts), size)

