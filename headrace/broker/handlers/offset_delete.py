"""OffsetDelete (key 47), version 0: delete a group's committed offsets of some partitions.

Allowed when the group is empty, or for topics its members do not subscribe to
(GROUP_SUBSCRIBED_TO_TOPIC per partition otherwise); GROUP_ID_NOT_FOUND for an unknown group.
Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import OffsetDeleteRequest

API_KEY = 47
MIN_VERSION = 0
MAX_VERSION = 0


async def handle(ctx, request):
    partitions = tuple((t.name, p.partition_index) for t in request.topics for p in t.partitions)
    response = await ctx.broker.groups.call(OffsetDeleteRequest(request.group_id, partitions))
    errors = response.partition_errors
    return ctx.respond({
        "throttle_time": 0,
        "error_code": response.error_code,
        "topics": [{"name": t.name,
                    "partitions": [{"partition_index": p.partition_index,
                                    "error_code": errors.get((t.name, p.partition_index), 0)}
                                   for p in t.partitions]}
                   for t in request.topics],
    })
