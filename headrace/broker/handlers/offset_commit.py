"""OffsetCommit (key 8), versions 0-10: commit consumed offsets with metadata strings.

Members of a group commit with their generation and member id (checked by the coordinator:
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID);
consumers using assign() commit with generation -1 and an empty member id. The answer waits
for the append to ``__consumer_offsets``; a failed append answers Kafka's mapped error
(INVALID_COMMIT_OFFSET_SIZE for a batch over the offsets topic's max.message.bytes,
COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR...). v2-4's retention_time is ignored, as in
Kafka 2.1+ (offsets.retention.minutes applies). v6+ leader epochs; v7+ group.instance.id;
v9+ names the generation ``generation_id_or_member_epoch`` (KIP-848; a classic group reads it
as the generation); v10+ names topics by id: an id this broker does not know answers
UNKNOWN_TOPIC_ID for its partitions. As Kafka's ``KafkaApis.handleOffsetCommitRequest``, a topic
that does not exist, or a partition index beyond its partition count, answers
UNKNOWN_TOPIC_OR_PARTITION and is not stored (admin clients' AlterConsumerGroupOffsets is this
request too); only the existing partitions reach the coordinator, and when none does the
coordinator is not asked at all.

v0-1 (clients that skip ApiVersions; decoded by hand in wire.py, kio lacks them; their
response is v2's). v1 commits to the coordinator like v2, its per-partition commit_timestamp
(-1: now) becoming the commit's timestamp, as Kafka's. v0 stored offsets in ZooKeeper: a
Kafka 3.9 broker without ZooKeeper (KRaft, like this one) answers it, once the unknown topics
and partitions are sorted out as above, UNSUPPORTED_VERSION on every partition of the
request, storing nothing. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import OffsetAndMetadata, OffsetCommitRequest
from headrace.errors import UnknownTopicId, UnknownTopicOrPartition, UnsupportedVersion

API_KEY = 8
MIN_VERSION = 0
MAX_VERSION = 10

ZOOKEEPER_VERSION = 0  # stored in ZooKeeper by Kafka, refused without it
TOPIC_ID_VERSION = 10


def _topic_names(ctx, request) -> list[str | None]:
    """Each request topic's name (None: an unknown topic id)."""
    if ctx.api_version < TOPIC_ID_VERSION:
        return [topic.name for topic in request.topics]
    names_by_id = {info.topic_id: name for name, info in ctx.broker.log_manager.topics().items()}
    return [names_by_id.get(topic.topic_id) for topic in request.topics]


def _partition_error(partition_counts: dict[str, int], name: str | None, index: int) -> int:
    """The error answered without asking the coordinator; 0 when the partition exists."""
    if name is None:
        return UnknownTopicId.code
    if not 0 <= index < partition_counts.get(name, 0):
        return UnknownTopicOrPartition.code
    return 0


def _to_coordinator(request, names: list[str | None],
                    partition_counts: dict[str, int]) -> OffsetCommitRequest:
    offsets = {}
    for topic, name in zip(request.topics, names, strict=True):
        for p in topic.partitions:
            if _partition_error(partition_counts, name, p.partition_index):
                continue
            offsets[(name, p.partition_index)] = OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=getattr(p, "committed_leader_epoch", -1),
                metadata=p.committed_metadata or "",
                commit_timestamp_ms=getattr(p, "commit_timestamp", -1),
            )
    return OffsetCommitRequest(
        group_id=request.group_id,
        offsets=offsets,
        generation_id=request.generation_id_or_member_epoch,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
    )


async def handle(ctx, request):
    names = _topic_names(ctx, request)
    partition_counts = {name: info.partitions
                        for name, info in ctx.broker.log_manager.topics().items()}
    commit = _to_coordinator(request, names, partition_counts)
    errors = {}
    if commit.offsets and ctx.api_version == ZOOKEEPER_VERSION:
        return _every_partition_error(ctx, request, UnsupportedVersion.code)
    if commit.offsets:
        errors = (await ctx.broker.groups.call(commit)).partition_errors
    topics = []
    for topic, name in zip(request.topics, names, strict=True):
        partitions = [
            {"partition_index": p.partition_index,
             "error_code": _partition_error(partition_counts, name, p.partition_index)
             or errors.get((name, p.partition_index), 0)}
            for p in topic.partitions
        ]
        named = {"topic_id": topic.topic_id} if ctx.api_version >= TOPIC_ID_VERSION else {
            "name": name}
        topics.append({**named, "partitions": partitions})
    return ctx.respond({"throttle_time": 0, "topics": topics})


def _every_partition_error(ctx, request, error_code: int):
    """Kafka's error response (``OffsetCommitRequest.getErrorResponse``): one error on every
    partition of a (topic-named) request."""
    return ctx.respond({"throttle_time": 0, "topics": [
        {"name": topic.name,
         "partitions": [{"partition_index": p.partition_index, "error_code": error_code}
                        for p in topic.partitions]}
        for topic in request.topics]})
