"""ListGroups (key 16), versions 0-5: every group this coordinator knows.

v4+ filter by state (case-insensitive, Kafka's state names); v5+ filter by type: only
"classic" groups exist here, so a types filter without "classic" lists nothing.
Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import ListGroupsRequest

API_KEY = 16
MIN_VERSION = 0
MAX_VERSION = 5

CLASSIC_GROUP_TYPE = "classic"


async def handle(ctx, request):
    states = frozenset(getattr(request, "states_filter", ()))
    types = {t.lower() for t in getattr(request, "types_filter", ())}
    response = await ctx.broker.groups.call(ListGroupsRequest(states))
    groups = [] if types and CLASSIC_GROUP_TYPE not in types else response.groups
    return ctx.respond({
        "throttle_time": 0,
        "error_code": response.error_code,
        "groups": [{"group_id": g.group_id, "protocol_type": g.protocol_type,
                    "group_state": g.state, "group_type": CLASSIC_GROUP_TYPE} for g in groups],
    })
