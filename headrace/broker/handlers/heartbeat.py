"""Heartbeat (key 12), versions 0-4: a member says it is alive; the answer says whether a
rebalance is in progress (REBALANCE_IN_PROGRESS), or why the member is no longer in the group.
v3+ group.instance.id. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import HeartbeatRequest

API_KEY = 12
MIN_VERSION = 0
MAX_VERSION = 4


async def handle(ctx, request):
    response = await ctx.broker.groups.call(HeartbeatRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        generation_id=request.generation_id,
        group_instance_id=getattr(request, "group_instance_id", None),
    ))
    return ctx.respond({"throttle_time": 0, "error_code": response.error_code})
