"""OffsetCommit (key 8), versions 2-9: commit consumed offsets with metadata strings.

Members of a group commit with their generation and member id (checked by the coordinator:
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, REBALANCE_IN_PROGRESS, FENCED_INSTANCE_ID);
consumers using assign() commit with generation -1 and an empty member id. Commits are
appended to ``__consumer_offsets`` before the answer. v2-4's retention_time is ignored, as
in Kafka 2.1+ (offsets.retention.minutes applies). v6+ leader epochs; v7+ group.instance.id.
Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import OffsetAndMetadata, OffsetCommitRequest

API_KEY = 8
MIN_VERSION = 2
MAX_VERSION = 9


def _to_coordinator(request) -> OffsetCommitRequest:
    offsets = {}
    for topic in request.topics:
        for p in topic.partitions:
            offsets[(topic.name, p.partition_index)] = OffsetAndMetadata(
                offset=p.committed_offset,
                leader_epoch=getattr(p, "committed_leader_epoch", -1),
                metadata=p.committed_metadata or "",
            )
    return OffsetCommitRequest(
        group_id=request.group_id,
        offsets=offsets,
        generation_id=request.generation_id_or_member_epoch,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
    )


async def handle(ctx, request):
    response = await ctx.broker.groups.call(_to_coordinator(request))
    errors = response.partition_errors
    return ctx.respond({
        "throttle_time": 0,
        "topics": [
            {"name": topic.name,
             "partitions": [{"partition_index": p.partition_index,
                             "error_code": errors.get((topic.name, p.partition_index), 0)}
                            for p in topic.partitions]}
            for topic in request.topics
        ],
    })
