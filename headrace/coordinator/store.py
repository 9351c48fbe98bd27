"""Mapping between in-memory groups and their ``__consumer_offsets`` records.

Owns: the records a group's state and committed offsets become (via ``records``), the offset
expiration rule (Kafka's GroupMetadata.removeExpiredOffsets), and ``PartitionLoader``, which
replays one offsets-topic partition (later records win, tombstones delete) and rebuilds the
groups it holds. Transactional records (TxnOffsetCommit) are held per producer until its
marker: a commit applies them in the marker's place, an abort drops them, and those still
held at the end come back as the groups' pending transactional offsets. A loaded group with members comes back Stable, one without members Empty.

Not thread-safe: ``PartitionLoader`` accumulates state; use one per loading partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from headrace.coordinator.group import CommittedOffset, Group, GroupState, Member
from headrace.coordinator.messages import TopicPartition
from headrace.coordinator.records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataRecord,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
)
from headrace.protocol.consumer_protocol import CONSUMER_PROTOCOL_TYPE

Record = tuple[bytes, bytes | None]


def offset_commit_record(group_id: str, tp: TopicPartition, committed: CommittedOffset) -> Record:
    key = encode_offset_commit_key(OffsetCommitKey(group_id, tp[0], tp[1]))
    value = OffsetCommitValue(
        committed.offset, committed.leader_epoch, committed.metadata, committed.commit_timestamp_ms
    )
    return key, encode_offset_commit_value(value)


def offset_tombstone(group_id: str, tp: TopicPartition) -> Record:
    return encode_offset_commit_key(OffsetCommitKey(group_id, tp[0], tp[1])), None


def group_metadata_record(group: Group, assignments: Mapping[str, bytes] | None = None) -> Record:
    """The group's metadata record; ``assignments`` (member id -> bytes) replaces the members'
    current assignments in the record without touching the group (a SyncGroup not yet stored)."""
    members = tuple(
        MemberMetadataRecord(
            member.member_id,
            member.group_instance_id,
            member.client_id,
            member.client_host,
            member.rebalance_timeout_ms,
            member.session_timeout_ms,
            member.metadata_for(group.protocol_name),
            member.assignment if assignments is None else assignments.get(member.member_id, b""),
        )
        for member in group.members.values()
    )
    value = GroupMetadataValue(
        group.protocol_type or "",
        group.generation_id,
        group.protocol_name,
        group.leader_id,
        group.state_timestamp_ms,
        members,
    )
    return encode_group_metadata_key(GroupMetadataKey(group.group_id)), encode_group_metadata_value(
        value
    )


def group_tombstone(group_id: str) -> Record:
    return encode_group_metadata_key(GroupMetadataKey(group_id)), None


def expired_offsets(group: Group, now_ms: int, retention_ms: int) -> list[TopicPartition]:
    """Offsets past retention: for an Empty group counted from when it became empty (or the
    commit, if unknown); for a Stable consumer group only topics it no longer consumes; for a
    group without a protocol type (assign()-style commits) from the commit."""
    subscribed: set[str] = set()
    use_state_timestamp = False
    if group.protocol_type is not None and group.is_in(GroupState.EMPTY):
        use_state_timestamp = group.state_timestamp_ms >= 0
    elif group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.is_in(GroupState.STABLE):
        topics = group.subscribed_topics()
        if topics is None:
            return []
        subscribed = topics
    elif group.protocol_type is not None:
        return []
    expired = []
    for tp, committed in group.offsets.items():
        base_ms = group.state_timestamp_ms if use_state_timestamp else committed.commit_timestamp_ms
        if tp[0] not in subscribed and now_ms - base_ms >= retention_ms:
            expired.append(tp)
    return expired


def _member_from_record(record: MemberMetadataRecord, value: GroupMetadataValue, now_ms: int):
    return Member(
        member_id=record.member_id,
        group_instance_id=record.group_instance_id,
        client_id=record.client_id,
        client_host=record.client_host,
        session_timeout_ms=record.session_timeout_ms,
        rebalance_timeout_ms=record.rebalance_timeout_ms,
        protocol_type=value.protocol_type,
        protocols=((value.protocol_name or "", record.subscription),),
        heartbeat_deadline_ms=now_ms + record.session_timeout_ms,
        joined_at_ms=now_ms,
        assignment=record.assignment,
        is_new=False,
    )


def group_from_record(group_id: str, value: GroupMetadataValue, now_ms: int) -> Group:
    state = GroupState.STABLE if value.members else GroupState.EMPTY
    group = Group(
        group_id=group_id,
        state=state,
        state_timestamp_ms=value.current_state_timestamp_ms,
        generation_id=value.generation_id,
        protocol_type=value.protocol_type or None,
        protocol_name=value.protocol_name,
    )
    for record in value.members:
        group.add_member(_member_from_record(record, value, now_ms))
    if value.leader_id in group.members:
        group.leader_id = value.leader_id
    return group


class PartitionLoader:
    """Replays one ``__consumer_offsets`` partition in log order. Replay keeps only the latest
    value bytes per key bytes (a dictionary update per chunk); the survivors are decoded once,
    in ``build_groups``, so a topic of many overwritten commits costs little per record."""

    def __init__(self) -> None:
        self._latest: dict[bytes, bytes | None] = {}
        # producer id -> its transactional records not yet ended by a marker
        self._transactional: dict[int, dict[bytes, bytes | None]] = {}
        self.record_count = 0  # records replayed so far, tombstones included

    def apply(self, records: Iterable[Record]) -> None:
        records = list(records)
        self._latest.update(records)
        self.record_count += len(records)

    def apply_transactional(self, producer_id: int, records: Iterable[Record]) -> None:
        records = list(records)
        self._transactional.setdefault(producer_id, {}).update(records)
        self.record_count += len(records)

    def apply_marker(self, producer_id: int, commit: bool) -> None:
        records = self._transactional.pop(producer_id, {})
        if commit:
            self._latest.update(records)

    def pending_transactional_offsets(self) -> dict[str, dict[int, dict]]:
        """group id -> producer id -> offsets of transactions without a marker yet."""
        pending: dict[str, dict[int, dict]] = {}
        for producer_id, records in self._transactional.items():
            for key_bytes, value_bytes in records.items():
                key = decode_key(key_bytes)
                if not isinstance(key, OffsetCommitKey) or value_bytes is None:
                    continue
                v = decode_offset_commit_value(value_bytes)
                pending.setdefault(key.group_id, {}).setdefault(producer_id, {})[
                    (key.topic, key.partition)] = CommittedOffset(
                        v.offset, v.leader_epoch, v.metadata, v.commit_timestamp_ms)
        return pending

    def _decoded(self):
        group_values: dict[str, GroupMetadataValue | None] = {}
        offset_values: dict[str, dict[TopicPartition, OffsetCommitValue | None]] = {}
        for key_bytes, value_bytes in self._latest.items():
            key = decode_key(key_bytes)
            if isinstance(key, OffsetCommitKey):
                value = None if value_bytes is None else decode_offset_commit_value(value_bytes)
                offset_values.setdefault(key.group_id, {})[(key.topic, key.partition)] = value
            else:
                decoded = None if value_bytes is None else decode_group_metadata_value(value_bytes)
                group_values[key.group_id] = decoded
        return group_values, offset_values

    def build_groups(self, now_ms: int) -> list[Group]:
        """The groups replayed. Raises CorruptMessage for a record it cannot decode."""
        group_values, offset_values = self._decoded()
        pending = self.pending_transactional_offsets()
        groups = []
        for group_id in group_values.keys() | offset_values.keys() | pending.keys():
            offsets = {
                tp: CommittedOffset(v.offset, v.leader_epoch, v.metadata, v.commit_timestamp_ms)
                for tp, v in offset_values.get(group_id, {}).items()
                if v is not None
            }
            value = group_values.get(group_id)
            if value is None and not offsets and group_id not in pending:
                continue
            if value is None:
                group = Group(group_id, GroupState.EMPTY, state_timestamp_ms=-1)
            else:
                group = group_from_record(group_id, value, now_ms)
            group.offsets = offsets
            group.pending_txn_offsets = pending.get(group_id, {})
            groups.append(group)
        return groups
