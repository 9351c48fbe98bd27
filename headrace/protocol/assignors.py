"""The consumer protocol's byte formats and Kafka's range / roundrobin partition assignors.

Owns:

* ``FieldReader`` / ``FieldWriter``: the primitives of Kafka's non-flexible (classic) schemas,
  big-endian: int16/int32/int64, STRING (int16 length), NULLABLE_STRING (length -1 = null),
  BYTES / NULLABLE_BYTES (int32 length), ARRAY (int32 count). The coordinator's
  ``__consumer_offsets`` record codecs use them too.
* ConsumerProtocolSubscription v0-v3, each prefixed by an int16 version::

      v0: topics [STRING], user_data NULLABLE_BYTES
      v1: + owned_partitions [topic STRING, partitions [INT32]]
      v2: + generation_id INT32 (default -1)
      v3: + rack_id NULLABLE_STRING

* ConsumerProtocolAssignment v0-v3 (the same layout in every version)::

      assigned_partitions [topic STRING, partitions [INT32]], user_data NULLABLE_BYTES

  As Kafka does, a newer version than we know is read with the newest layout we know and
  trailing bytes are ignored.
* ``range_assign`` and ``round_robin_assign``: Kafka's RangeAssignor and RoundRobinAssignor,
  with members ordered as Kafka orders them (static members by group.instance.id first, then
  dynamic members by member id).

Pure functions over bytes; thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from headrace.errors import CorruptMessage

CONSUMER_PROTOCOL_TYPE = "consumer"
SUBSCRIPTION_VERSION_LATEST = 3
ASSIGNMENT_VERSION_LATEST = 3

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


class FieldReader:
    """Reads classic Kafka schema fields from a buffer; raises CorruptMessage on truncation."""

    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)
        self._position = 0

    @property
    def remaining_bytes(self) -> int:
        return len(self._data) - self._position

    def _take(self, size_bytes: int) -> memoryview:
        if size_bytes < 0 or self._position + size_bytes > len(self._data):
            raise CorruptMessage(
                f"truncated field: need {size_bytes} bytes at {self._position} of {len(self._data)}"
            )
        chunk = self._data[self._position : self._position + size_bytes]
        self._position += size_bytes
        return chunk

    def int16(self) -> int:
        return _INT16.unpack(self._take(2))[0]

    def int32(self) -> int:
        return _INT32.unpack(self._take(4))[0]

    def int64(self) -> int:
        return _INT64.unpack(self._take(8))[0]

    def nullable_string(self) -> str | None:
        length = self.int16()
        if length == -1:
            return None
        return bytes(self._take(length)).decode("utf-8")

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise CorruptMessage("null in a non-nullable string field")
        return value

    def nullable_bytes(self) -> bytes | None:
        length = self.int32()
        if length == -1:
            return None
        return bytes(self._take(length))

    def bytes_(self) -> bytes:
        value = self.nullable_bytes()
        if value is None:
            raise CorruptMessage("null in a non-nullable bytes field")
        return value

    def array_length(self) -> int:
        count = self.int32()
        if count < -1:
            raise CorruptMessage(f"negative array length {count}")
        return max(count, 0)

    def int32_array(self) -> tuple[int, ...]:
        return tuple(self.int32() for _ in range(self.array_length()))


class FieldWriter:
    """Appends classic Kafka schema fields to a growing buffer."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def to_bytes(self) -> bytes:
        return b"".join(self._parts)

    def int16(self, value: int) -> FieldWriter:
        self._parts.append(_INT16.pack(value))
        return self

    def int32(self, value: int) -> FieldWriter:
        self._parts.append(_INT32.pack(value))
        return self

    def int64(self, value: int) -> FieldWriter:
        self._parts.append(_INT64.pack(value))
        return self

    def nullable_string(self, value: str | None) -> FieldWriter:
        if value is None:
            return self.int16(-1)
        encoded = value.encode("utf-8")
        self.int16(len(encoded))
        self._parts.append(encoded)
        return self

    def string(self, value: str) -> FieldWriter:
        return self.nullable_string(value)

    def nullable_bytes(self, value: bytes | None) -> FieldWriter:
        if value is None:
            return self.int32(-1)
        self.int32(len(value))
        self._parts.append(bytes(value))
        return self

    def bytes_(self, value: bytes) -> FieldWriter:
        return self.nullable_bytes(value)

    def int32_array(self, values: Sequence[int]) -> FieldWriter:
        self.int32(len(values))
        for value in values:
            self.int32(value)
        return self


TopicPartitions = tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class Subscription:
    """A consumer's JoinGroup metadata for the "consumer" protocol type."""

    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: TopicPartitions = ()
    generation_id: int = -1
    rack_id: str | None = None


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


def _read_topic_partitions(reader: FieldReader) -> TopicPartitions:
    return tuple((reader.string(), reader.int32_array()) for _ in range(reader.array_length()))


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


def decode_subscription(data: bytes) -> Subscription:
    """Decode ConsumerProtocolSubscription; raises CorruptMessage on malformed bytes."""
    reader = FieldReader(data)
    version = reader.int16()
    if version < 0:
        raise CorruptMessage(f"negative ConsumerProtocolSubscription version {version}")
    topics = tuple(reader.string() for _ in range(reader.array_length()))
    user_data = reader.nullable_bytes()
    owned = _read_topic_partitions(reader) if version >= 1 else ()
    generation_id = reader.int32() if version >= 2 else -1
    rack_id = reader.nullable_string() if version >= 3 else None
    return Subscription(topics, user_data, owned, generation_id, rack_id)


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
    partitions = _read_topic_partitions(reader)
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
