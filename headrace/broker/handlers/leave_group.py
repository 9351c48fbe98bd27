"""LeaveGroup (key 13), versions 0-5: members leave a group, triggering a rebalance.

v0-2 carry one ``member_id`` and answer with its error at the top level; v3+ batch members
(with group.instance.id) and answer per member. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import LeaveGroupRequest, MemberIdentity

API_KEY = 13
MIN_VERSION = 0
MAX_VERSION = 5

BATCHED_MEMBERS_VERSION = 3


async def handle(ctx, request):
    batched = ctx.api_version >= BATCHED_MEMBERS_VERSION
    if batched:
        members = tuple(MemberIdentity(m.member_id, m.group_instance_id) for m in request.members)
    else:
        members = (MemberIdentity(request.member_id),)
    response = await ctx.broker.groups.call(LeaveGroupRequest(request.group_id, members))
    error_code = response.error_code
    if not batched and error_code == 0 and response.members:
        error_code = response.members[0].error_code
    return ctx.respond({
        "throttle_time": 0,
        "error_code": error_code,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "error_code": m.error_code} for m in response.members],
    })
