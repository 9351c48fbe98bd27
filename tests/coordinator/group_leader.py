"""The group leader's half of Kafka's consumer protocol, for tests that drive the coordinator
as a consumer group's leader client would.

Owns what Kafka runs in the client and headrace's own code never needs (its clients are
librdkafka's): encoding ConsumerProtocolSubscription v0-v3 (the layouts are documented in
``headrace.protocol.consumer_protocol``, which decodes them for the coordinator),
ConsumerProtocolAssignment v0-v3 (the same layout in every version)::

    assigned_partitions [topic STRING, partitions [INT32]], user_data NULLABLE_BYTES

and Kafka's RangeAssignor and RoundRobinAssignor (``range_assign``, ``round_robin_assign``),
with members ordered as Kafka orders them (static members by group.instance.id first, then
dynamic members by member id). Pure functions over bytes; thread-safe.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from headrace.errors import CorruptMessage
from headrace.protocol.consumer_protocol import (
    SUBSCRIPTION_VERSION_LATEST,
    FieldReader,
    FieldWriter,
    Subscription,
    TopicPartitions,
    read_topic_partitions,
)

ASSIGNMENT_VERSION_LATEST = 3


@dataclass(frozen=True, slots=True)
class Assignment:
    """A member's SyncGroup assignment for the "consumer" protocol type."""

    partitions: TopicPartitions = ()
    user_data: bytes | None = None

    def topic_partitions(self) -> list[tuple[str, int]]:
        return [(topic, p) for topic, partitions in self.partitions for p in partitions]


def _write_topic_partitions(writer: FieldWriter, topic_partitions: TopicPartitions) -> None:
    writer.int32(len(topic_partitions))
    for topic, partitions in topic_partitions:
        writer.string(topic).int32_array(partitions)


def encode_subscription(
    subscription: Subscription, version: int = SUBSCRIPTION_VERSION_LATEST
) -> bytes:
    if not 0 <= version <= SUBSCRIPTION_VERSION_LATEST:
        raise ValueError(f"ConsumerProtocolSubscription version {version} is not 0-3")
    writer = FieldWriter().int16(version)
    writer.int32(len(subscription.topics))
    for topic in subscription.topics:
        writer.string(topic)
    writer.nullable_bytes(subscription.user_data)
    if version >= 1:
        _write_topic_partitions(writer, subscription.owned_partitions)
    if version >= 2:
        writer.int32(subscription.generation_id)
    if version >= 3:
        writer.nullable_string(subscription.rack_id)
    return writer.to_bytes()


def encode_assignment(assignment: Assignment, version: int = ASSIGNMENT_VERSION_LATEST) -> bytes:
    if not 0 <= version <= ASSIGNMENT_VERSION_LATEST:
        raise ValueError(f"ConsumerProtocolAssignment version {version} is not 0-3")
    writer = FieldWriter().int16(version)
    _write_topic_partitions(writer, assignment.partitions)
    writer.nullable_bytes(assignment.user_data)
    return writer.to_bytes()


def decode_assignment(data: bytes) -> Assignment:
    """Decode ConsumerProtocolAssignment; empty bytes (no assignment yet) decode as empty."""
    if not data:
        return Assignment()
    reader = FieldReader(data)
    version = reader.int16()
    if version < 0:
        raise CorruptMessage(f"negative ConsumerProtocolAssignment version {version}")
    partitions = read_topic_partitions(reader)
    return Assignment(partitions, reader.nullable_bytes())


@dataclass(frozen=True, slots=True)
class AssignorMember:
    """One group member as an assignor sees it."""

    member_id: str
    subscription: Subscription
    group_instance_id: str | None = None

    def sort_key(self) -> tuple[int, str, str]:
        # Kafka's MemberInfo order: static members (by instance id) before dynamic ones.
        if self.group_instance_id is not None:
            return (0, self.group_instance_id, self.member_id)
        return (1, "", self.member_id)


@dataclass(slots=True)
class _AssignmentBuilder:
    partitions_by_topic: dict[str, list[int]] = field(default_factory=dict)

    def add(self, topic: str, partition: int) -> None:
        self.partitions_by_topic.setdefault(topic, []).append(partition)

    def build(self) -> Assignment:
        return Assignment(
            tuple(
                (topic, tuple(parts)) for topic, parts in sorted(self.partitions_by_topic.items())
            )
        )


def range_assign(
    partitions_per_topic: Mapping[str, int], members: Sequence[AssignorMember]
) -> dict[str, Assignment]:
    """Kafka's RangeAssignor: per topic, contiguous ranges; the first members get one extra."""
    builders = {member.member_id: _AssignmentBuilder() for member in members}
    ordered = sorted(members, key=AssignorMember.sort_key)
    for topic in sorted({t for m in members for t in m.subscription.topics}):
        partition_count = partitions_per_topic.get(topic)
        if not partition_count:
            continue
        subscribers = [m for m in ordered if topic in m.subscription.topics]
        per_member, extra = divmod(partition_count, len(subscribers))
        for index, member in enumerate(subscribers):
            start = per_member * index + min(index, extra)
            length = per_member + (1 if index < extra else 0)
            for partition in range(start, start + length):
                builders[member.member_id].add(topic, partition)
    return {member_id: builder.build() for member_id, builder in builders.items()}


def round_robin_assign(
    partitions_per_topic: Mapping[str, int], members: Sequence[AssignorMember]
) -> dict[str, Assignment]:
    """Kafka's RoundRobinAssignor: all partitions in (topic, partition) order, dealt in turn to
    the next member subscribed to the partition's topic."""
    builders = {member.member_id: _AssignmentBuilder() for member in members}
    ordered = sorted(members, key=AssignorMember.sort_key)
    subscribed = sorted({t for m in members for t in m.subscription.topics})
    next_index = 0
    for topic in subscribed:
        for partition in range(partitions_per_topic.get(topic, 0)):
            for step in range(len(ordered)):
                candidate = ordered[(next_index + step) % len(ordered)]
                if topic in candidate.subscription.topics:
                    builders[candidate.member_id].add(topic, partition)
                    next_index = (next_index + step + 1) % len(ordered)
                    break
    return {member_id: builder.build() for member_id, builder in builders.items()}


AssignorFunction = Callable[[Mapping[str, int], Sequence[AssignorMember]], dict[str, Assignment]]
ASSIGNORS: dict[str, AssignorFunction] = {"range": range_assign, "roundrobin": round_robin_assign}
