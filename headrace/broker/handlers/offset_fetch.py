"""OffsetFetch (key 9), versions 0-10: committed offsets of a group, from the coordinator's
in-memory cache (a commit whose append has not completed yet is not visible).

v1-7 ask for one group (v2+: null topics = every committed partition, and a top-level error
code); v8+ batch groups (``groups``), each with its own error code; v9+ carry a KIP-848 member
id and epoch, which a classic group does not check; v10+ name topics by id: a requested id
this broker does not know answers UNKNOWN_TOPIC_ID per partition, and committed offsets of
topics that no longer exist are left out of an every-partition answer. ``require_stable``
(v7+): a partition with a commit not yet visible -- a transactional one (TxnOffsetCommit)
before its marker, or a plain one before its append -- answers UNSTABLE_OFFSET_COMMIT.
A partition without a commit answers offset -1 and empty metadata. Errors such as
COORDINATOR_LOAD_IN_PROGRESS go in the group error (v2+) and, for v1, on every partition.
v0 (the same format as v1; kio lacks it) read offsets from ZooKeeper: a Kafka 3.9 broker
without ZooKeeper (KRaft, like this one) answers every requested partition offset -1, empty
metadata and UNSUPPORTED_VERSION (``OffsetFetchRequest.getErrorResponse``), as this one does.
Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import NO_OFFSET, FetchedOffset, OffsetFetchRequest
from headrace.errors import UnknownTopicId, UnsupportedVersion

API_KEY = 9
MIN_VERSION = 0
MAX_VERSION = 10

ZOOKEEPER_VERSION = 0  # read from ZooKeeper by Kafka, refused without it

BATCHED_GROUPS_VERSION = 8
TOP_LEVEL_ERROR_VERSION = 2
TOPIC_ID_VERSION = 10
_NO_COMMIT = FetchedOffset(NO_OFFSET, -1, "")
_UNKNOWN_TOPIC_ID = FetchedOffset(NO_OFFSET, -1, "", UnknownTopicId.code)


class _TopicNaming:
    """Topic names (v1-9) or topic ids (v10+) on the wire, names in the coordinator."""

    def __init__(self, ctx) -> None:
        self.by_id = ctx.api_version >= TOPIC_ID_VERSION
        self.names_by_id = {}
        self.ids_by_name = {}
        if self.by_id:
            for name, info in ctx.broker.log_manager.topics().items():
                self.names_by_id[info.topic_id] = name
                self.ids_by_name[name] = info.topic_id

    def requested(self, topics) -> tuple[list[tuple[object, int]], tuple | None]:
        """The (wire topic, partition) pairs asked for and the named partitions to look up."""
        if topics is None:
            return [], None
        wanted = [(self._wire(t), index) for t in topics for index in t.partition_indexes]
        named = tuple((self.name_of(w), index) for w, index in wanted if self.name_of(w))
        return wanted, named

    def _wire(self, topic):
        return topic.topic_id if self.by_id else topic.name

    def name_of(self, wire_topic) -> str | None:
        return self.names_by_id.get(wire_topic) if self.by_id else wire_topic

    def wire_of(self, name: str):
        return self.ids_by_name.get(name) if self.by_id else name

    def topic_entry(self, wire_topic, partitions: list[dict]) -> dict:
        key = "topic_id" if self.by_id else "name"
        return {key: wire_topic, "partitions": partitions}


def _every_committed(response, naming: _TopicNaming) -> list[tuple[object, int]]:
    pairs = [(naming.wire_of(name), index) for name, index in sorted(response.offsets)]
    return [(wire, index) for wire, index in pairs if wire is not None]


def _topics(response, wanted, naming: _TopicNaming, partition_error: int) -> list[dict]:
    by_topic: dict[object, list[dict]] = {}
    for wire_topic, index in wanted:
        name = naming.name_of(wire_topic)
        fetched = _UNKNOWN_TOPIC_ID if name is None else response.offsets.get(
            (name, index), _NO_COMMIT)
        by_topic.setdefault(wire_topic, []).append({
            "partition_index": index, "committed_offset": fetched.offset,
            "committed_leader_epoch": fetched.leader_epoch, "metadata": fetched.metadata,
            "error_code": fetched.error_code or partition_error,
        })
    return [naming.topic_entry(wire, partitions) for wire, partitions in by_topic.items()]


async def _fetch_group(ctx, naming, group_id: str, topics, per_partition_errors: bool,
                       require_stable: bool) -> dict:
    wanted, named = naming.requested(topics)
    response = await ctx.broker.groups.call(OffsetFetchRequest(group_id, named, require_stable))
    if topics is None:
        wanted = _every_committed(response, naming)
    partition_error = response.error_code if per_partition_errors else 0
    return {"group_id": group_id, "error_code": response.error_code,
            "topics": _topics(response, wanted, naming, partition_error)}


def _every_partition_error(ctx, request, error_code: int):
    """Kafka's error response for v0-1: no offset and ``error_code`` on every partition."""
    return ctx.respond({"topics": [
        {"name": topic.name, "partitions": [
            {"partition_index": index, "committed_offset": NO_OFFSET, "metadata": "",
             "error_code": error_code} for index in topic.partition_indexes]}
        for topic in request.topics]})


async def handle(ctx, request):
    if ctx.api_version == ZOOKEEPER_VERSION:
        return _every_partition_error(ctx, request, UnsupportedVersion.code)
    naming = _TopicNaming(ctx)
    if ctx.api_version >= BATCHED_GROUPS_VERSION:
        groups = [await _fetch_group(ctx, naming, g.group_id, g.topics, False,
                                     request.require_stable)
                  for g in request.groups]
        return ctx.respond({"throttle_time": 0, "groups": groups})
    per_partition_errors = ctx.api_version < TOP_LEVEL_ERROR_VERSION
    group = await _fetch_group(ctx, naming, request.group_id, request.topics,
                               per_partition_errors, getattr(request, "require_stable", False))
    return ctx.respond({"throttle_time": 0, "topics": group["topics"],
                        "error_code": group["error_code"]})
