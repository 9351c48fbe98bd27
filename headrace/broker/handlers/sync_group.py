"""SyncGroup (key 14), versions 0-5: the leader hands out assignments, everyone gets theirs.

Translates kio's request into ``coordinator.messages.SyncGroupRequest``; followers wait
(parked in the group service) for the leader's assignment, which is persisted to
``__consumer_offsets`` before anyone is answered. v3+ group.instance.id, v5+ protocol
type/name checks. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import SyncGroupRequest

API_KEY = 14
MIN_VERSION = 0
MAX_VERSION = 5


def _to_coordinator(request) -> SyncGroupRequest:
    return SyncGroupRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        generation_id=request.generation_id,
        assignments={a.member_id: bytes(a.assignment) for a in request.assignments},
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=getattr(request, "protocol_type", None),
        protocol_name=getattr(request, "protocol_name", None),
    )


async def handle(ctx, request):
    response = await ctx.broker.groups.call(_to_coordinator(request))
    return ctx.respond({
        "throttle_time": 0,
        "error_code": response.error_code,
        "protocol_type": response.protocol_type,
        "protocol_name": response.protocol_name,
        "assignment": response.assignment,
    })
