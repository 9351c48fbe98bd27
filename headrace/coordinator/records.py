"""The ``__consumer_offsets`` record formats, byte-compatible with Kafka's.

Owns the keys and values the group coordinator writes to and reads from the offsets topic,
and which partition of it a group lives in. Every key and value starts with an int16 version;
fields are classic (non-flexible) Kafka schema fields (see ``headrace.protocol.consumer_protocol``)::

    OffsetCommitKey   v0-1: group STRING, topic STRING, partition INT32          (we write v1)
    GroupMetadataKey  v2:   group STRING
    OffsetCommitValue v0:   offset INT64, metadata STRING, commit_timestamp INT64
                      v1:   offset, metadata, commit_timestamp, expire_timestamp INT64
                      v2:   offset, metadata, commit_timestamp
                      v3:   offset, leader_epoch INT32, metadata, commit_timestamp   (we write v3)
    GroupMetadataValue v0-3 (we write v3): protocol_type STRING, generation INT32,
        protocol NULLABLE_STRING, leader NULLABLE_STRING, current_state_timestamp INT64 (v2+),
        members [member_id STRING, group_instance_id NULLABLE_STRING (v3+), client_id STRING,
                 client_host STRING, rebalance_timeout INT32 (v1+), session_timeout INT32,
                 subscription BYTES, assignment BYTES]

A tombstone is a record with a null value. The partition of a group is
``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions`` with Java's String.hashCode.

Pure functions and frozen dataclasses; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import CorruptMessage
from headrace.protocol.consumer_protocol import FieldReader, FieldWriter

OFFSETS_TOPIC_NAME = "__consumer_offsets"
OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT = 50

OFFSET_COMMIT_KEY_VERSION = 1
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3
GROUP_METADATA_VALUE_VERSION = 3
NO_TIMESTAMP = -1
NO_LEADER_EPOCH = -1


def java_string_hashcode(text: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, as a signed int32."""
    code_units = text.encode("utf-16-be")
    hash_value = 0
    for index in range(0, len(code_units), 2):
        unit = (code_units[index] << 8) | code_units[index + 1]
        hash_value = (31 * hash_value + unit) & 0xFFFFFFFF
    return hash_value - (1 << 32) if hash_value >= 1 << 31 else hash_value


def kafka_utils_abs(value: int) -> int:
    """Kafka's Utils.abs: Math.abs, except Integer.MIN_VALUE maps to 0."""
    return 0 if value == -(1 << 31) else abs(value)


def partition_for_group(
    group_id: str, num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT
) -> int:
    return kafka_utils_abs(java_string_hashcode(group_id)) % num_partitions


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group_id: str


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp_ms: int = NO_TIMESTAMP
    expire_timestamp_ms: int = NO_TIMESTAMP  # only in value version 1


@dataclass(frozen=True, slots=True)
class MemberMetadataRecord:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation_id: int
    protocol_name: str | None
    leader_id: str | None
    current_state_timestamp_ms: int
    members: tuple[MemberMetadataRecord, ...]


def encode_offset_commit_key(key: OffsetCommitKey) -> bytes:
    writer = FieldWriter().int16(OFFSET_COMMIT_KEY_VERSION)
    return writer.string(key.group_id).string(key.topic).int32(key.partition).to_bytes()


def encode_group_metadata_key(key: GroupMetadataKey) -> bytes:
    return FieldWriter().int16(GROUP_METADATA_KEY_VERSION).string(key.group_id).to_bytes()


def decode_key(data: bytes) -> OffsetCommitKey | GroupMetadataKey:
    """Decode any ``__consumer_offsets`` key; CorruptMessage for unknown versions."""
    reader = FieldReader(data)
    version = reader.int16()
    if version in (0, 1):
        return OffsetCommitKey(reader.string(), reader.string(), reader.int32())
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(reader.string())
    raise CorruptMessage(f"unknown __consumer_offsets key version {version}")


def encode_offset_commit_value(value: OffsetCommitValue) -> bytes:
    writer = FieldWriter().int16(OFFSET_COMMIT_VALUE_VERSION).int64(value.offset)
    writer.int32(value.leader_epoch).string(value.metadata).int64(value.commit_timestamp_ms)
    return writer.to_bytes()


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    reader = FieldReader(data)
    version = reader.int16()
    if not 0 <= version <= 3:
        raise CorruptMessage(f"unknown OffsetCommitValue version {version}")
    offset = reader.int64()
    leader_epoch = reader.int32() if version >= 3 else NO_LEADER_EPOCH
    metadata = reader.string()
    commit_timestamp_ms = reader.int64()
    expire_timestamp_ms = reader.int64() if version == 1 else NO_TIMESTAMP
    return OffsetCommitValue(
        offset, leader_epoch, metadata, commit_timestamp_ms, expire_timestamp_ms
    )


def encode_group_metadata_value(value: GroupMetadataValue) -> bytes:
    writer = FieldWriter().int16(GROUP_METADATA_VALUE_VERSION)
    writer.string(value.protocol_type).int32(value.generation_id)
    writer.nullable_string(value.protocol_name).nullable_string(value.leader_id)
    writer.int64(value.current_state_timestamp_ms).int32(len(value.members))
    for member in value.members:
        writer.string(member.member_id).nullable_string(member.group_instance_id)
        writer.string(member.client_id).string(member.client_host)
        writer.int32(member.rebalance_timeout_ms).int32(member.session_timeout_ms)
        writer.bytes_(member.subscription).bytes_(member.assignment)
    return writer.to_bytes()


def _read_member(reader: FieldReader, version: int) -> MemberMetadataRecord:
    member_id = reader.string()
    group_instance_id = reader.nullable_string() if version >= 3 else None
    client_id = reader.string()
    client_host = reader.string()
    rebalance_timeout_ms = reader.int32() if version >= 1 else None
    session_timeout_ms = reader.int32()
    if rebalance_timeout_ms is None:  # v0 had one timeout; Kafka uses it for both
        rebalance_timeout_ms = session_timeout_ms
    return MemberMetadataRecord(
        member_id,
        group_instance_id,
        client_id,
        client_host,
        rebalance_timeout_ms,
        session_timeout_ms,
        reader.bytes_(),
        reader.bytes_(),
    )


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    reader = FieldReader(data)
    version = reader.int16()
    if not 0 <= version <= 3:
        raise CorruptMessage(f"unknown GroupMetadataValue version {version}")
    protocol_type = reader.string()
    generation_id = reader.int32()
    protocol_name = reader.nullable_string()
    leader_id = reader.nullable_string()
    state_timestamp_ms = reader.int64() if version >= 2 else NO_TIMESTAMP
    members = tuple(_read_member(reader, version) for _ in range(reader.array_length()))
    return GroupMetadataValue(
        protocol_type, generation_id, protocol_name, leader_id, state_timestamp_ms, members
    )
