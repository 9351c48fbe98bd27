"""DescribeGroups (key 15), versions 0-5: state, protocol and members of groups.

Unknown groups are described as state "Dead" with no error, as Kafka does. Authorized
operations are not computed (no ACLs): -2147483648, Kafka's "not requested" value.
Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import DescribeGroupsRequest

API_KEY = 15
MIN_VERSION = 0
MAX_VERSION = 5

AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


def _member(member) -> dict:
    return {"member_id": member.member_id, "group_instance_id": member.group_instance_id,
            "client_id": member.client_id, "client_host": member.client_host,
            "member_metadata": member.metadata, "member_assignment": member.assignment}


async def handle(ctx, request):
    response = await ctx.broker.groups.call(DescribeGroupsRequest(tuple(request.groups)))
    return ctx.respond({
        "throttle_time": 0,
        "groups": [{"error_code": g.error_code, "group_id": g.group_id, "group_state": g.state,
                    "protocol_type": g.protocol_type, "protocol_data": g.protocol_data,
                    "members": [_member(m) for m in g.members],
                    "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}
                   for g in response.groups],
    })
