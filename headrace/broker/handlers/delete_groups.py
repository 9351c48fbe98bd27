"""DeleteGroups (key 42), versions 0-2: delete empty groups and their committed offsets.

Per group: GROUP_ID_NOT_FOUND for an unknown group, NON_EMPTY_GROUP while it has members;
otherwise tombstones for its offsets and metadata are appended to ``__consumer_offsets``
before the answer. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import DeleteGroupsRequest

API_KEY = 42
MIN_VERSION = 0
MAX_VERSION = 2


async def handle(ctx, request):
    names = tuple(request.groups_names)
    response = await ctx.broker.groups.call(DeleteGroupsRequest(names))
    return ctx.respond({
        "throttle_time": 0,
        "results": [{"group_id": name, "error_code": response.results.get(name, 0)}
                    for name in dict.fromkeys(names)],
    })
