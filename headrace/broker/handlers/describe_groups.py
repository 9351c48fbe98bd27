"""DescribeGroups (key 15), versions 0-5: state, protocol and members of groups.

Unknown groups are described as state "Dead" with no error, as Kafka does. v3+ with
``include_authorized_operations`` answer each group described without error with its
authorized operations (``headrace.broker.authorization``), as Kafka's ``KafkaApis``; otherwise
-2147483648, Kafka's "not requested" value. Event loop thread.
"""

from __future__ import annotations

from headrace.broker.authorization import (
    AUTHORIZED_OPERATIONS_OMITTED,
    ResourceType,
    authorized_operations,
)
from headrace.coordinator.messages import DescribeGroupsRequest

API_KEY = 15
MIN_VERSION = 0
MAX_VERSION = 5

AUTHORIZED_OPERATIONS_MIN_VERSION = 3


def _member(member) -> dict:
    return {"member_id": member.member_id, "group_instance_id": member.group_instance_id,
            "client_id": member.client_id, "client_host": member.client_host,
            "member_metadata": member.metadata, "member_assignment": member.assignment}


def _group_operations(ctx, request, group) -> int:
    if (ctx.api_version >= AUTHORIZED_OPERATIONS_MIN_VERSION
            and getattr(request, "include_authorized_operations", False)
            and group.error_code == 0):
        return authorized_operations(ResourceType.GROUP, group.group_id)
    return AUTHORIZED_OPERATIONS_OMITTED


async def handle(ctx, request):
    response = await ctx.broker.groups.call(DescribeGroupsRequest(tuple(request.groups)))
    return ctx.respond({
        "throttle_time": 0,
        "groups": [{"error_code": g.error_code, "group_id": g.group_id, "group_state": g.state,
                    "protocol_type": g.protocol_type, "protocol_data": g.protocol_data,
                    "members": [_member(m) for m in g.members],
                    "authorized_operations": _group_operations(ctx, request, g)}
                   for g in response.groups],
    })
