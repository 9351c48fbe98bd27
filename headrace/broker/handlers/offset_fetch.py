"""OffsetFetch (key 9), versions 1-9: committed offsets of a group, from the coordinator's
in-memory cache.

v1-7 ask for one group (v2+: null topics = every committed partition, and a top-level error
code); v8+ batch groups (``groups``), each with its own error code. A partition without a
commit answers offset -1 and empty metadata. Errors such as COORDINATOR_LOAD_IN_PROGRESS go
in the group error (v2+) and, for v1, on every partition. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import NO_OFFSET, FetchedOffset, OffsetFetchRequest

API_KEY = 9
MIN_VERSION = 1
MAX_VERSION = 9

BATCHED_GROUPS_VERSION = 8
TOP_LEVEL_ERROR_VERSION = 2
_NO_COMMIT = FetchedOffset(NO_OFFSET, -1, "")


def _requested_partitions(topics) -> tuple | None:
    if topics is None:
        return None
    return tuple((t.name, index) for t in topics for index in t.partition_indexes)


def _topics(response, requested, partition_error: int) -> list[dict]:
    keys = requested if requested is not None else tuple(sorted(response.offsets))
    by_topic: dict[str, list[dict]] = {}
    for topic, index in keys:
        fetched = response.offsets.get((topic, index), _NO_COMMIT)
        by_topic.setdefault(topic, []).append({
            "partition_index": index, "committed_offset": fetched.offset,
            "committed_leader_epoch": fetched.leader_epoch, "metadata": fetched.metadata,
            "error_code": fetched.error_code or partition_error,
        })
    return [{"name": name, "partitions": partitions} for name, partitions in by_topic.items()]


async def _fetch_group(ctx, group_id: str, topics, per_partition_errors: bool) -> dict:
    requested = _requested_partitions(topics)
    response = await ctx.broker.groups.call(OffsetFetchRequest(group_id, requested))
    partition_error = response.error_code if per_partition_errors else 0
    return {"group_id": group_id, "error_code": response.error_code,
            "topics": _topics(response, requested, partition_error)}


async def handle(ctx, request):
    if ctx.api_version >= BATCHED_GROUPS_VERSION:
        groups = [await _fetch_group(ctx, g.group_id, g.topics, False) for g in request.groups]
        return ctx.respond({"throttle_time": 0, "groups": groups})
    per_partition_errors = ctx.api_version < TOP_LEVEL_ERROR_VERSION
    group = await _fetch_group(ctx, request.group_id, request.topics, per_partition_errors)
    return ctx.respond({"throttle_time": 0, "topics": group["topics"],
                        "error_code": group["error_code"]})
