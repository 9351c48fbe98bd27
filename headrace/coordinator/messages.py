"""Requests, responses and effects of the group coordinator: plain frozen dataclasses.

Owns the coordinator's interface to the broker. The broker translates kio wire objects into
these requests and these responses back into wire objects; ``error_code`` fields hold Kafka
wire codes taken from ``headrace.errors`` classes (0 = NONE).

Effects are what the broker must carry out, in order, after each call:

* ``AppendToOffsetsTopic(partition, records, append_id)``: append (key, value) records to that
  ``__consumer_offsets`` partition; a None value is a tombstone. When the append has finished
  the broker reports it back with ``handle(AppendResult(append_id, error_code))``: state that
  must not be visible before it is durable (committed offsets, a SyncGroup's assignment) is
  applied, or rolled back, only then; a static member's rejoin is answered, or reverted to
  the old member id, only then. The requests waiting on it are answered through the
  ``Completed`` effects of that call (Kafka's GroupMetadataManager append callbacks).
* ``Completed(token, response)``: answer a request parked earlier (the call returned
  ``Pending(token)``), e.g. a JoinGroup that waited for the rebalance, a follower's SyncGroup
  that waited for the leader's assignment, or an OffsetCommit or static member's JoinGroup
  that waited for its append.

Immutable values; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

NO_ERROR = 0
UNKNOWN_MEMBER_ID = ""  # JoinGroupRequest.UNKNOWN_MEMBER_ID
NO_GENERATION = -1
NO_LEADER_EPOCH = -1
NO_OFFSET = -1

TopicPartition = tuple[str, int]
Protocols = tuple[tuple[str, bytes], ...]


# --- effects -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AppendToOffsetsTopic:
    partition: int
    records: tuple[tuple[bytes, bytes | None], ...]
    append_id: int  # reported back in AppendResult
    producer_id: int = -1  # >= 0: a transactional batch of this producer (TxnOffsetCommit)
    producer_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Input: how the append of ``AppendToOffsetsTopic(append_id=...)`` ended. ``error_code``
    is the log's Kafka error code (0: appended); the coordinator maps it to what clients see."""

    append_id: int
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class Pending:
    """A parked request; its response arrives later as ``Completed(token, response)``."""

    token: int


@dataclass(frozen=True, slots=True)
class Completed:
    token: int
    response: JoinGroupResponse | SyncGroupResponse | OffsetCommitResponse


Effect = AppendToOffsetsTopic | Completed


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one request produced: its response (or a Pending token) and the effects to run."""

    response: object
    effects: tuple[Effect, ...] = ()


# --- JoinGroup / SyncGroup / Heartbeat / LeaveGroup -----------------------------------------


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    member_id: str
    protocol_type: str
    protocols: Protocols
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+
    supports_skip_assignment: bool = True  # JoinGroup v9+ (KIP-814)


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    error_code: int
    member_id: str
    generation_id: int = NO_GENERATION
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinGroupMember, ...] = ()
    skip_assignment: bool = False  # v9+: a static leader rejoining without a rebalance


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    member_id: str
    generation_id: int
    assignments: Mapping[str, bytes] = field(default_factory=dict)
    group_instance_id: str | None = None
    protocol_type: str | None = None  # v5+
    protocol_name: str | None = None  # v5+


@dataclass(frozen=True, slots=True)
class SyncGroupResponse:
    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    generation_id: int
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class MemberIdentity:
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    """v3+ shape; for v0-2 the broker sends one identity and uses its per-member error."""

    group_id: str
    members: tuple[MemberIdentity, ...]


@dataclass(frozen=True, slots=True)
class LeaveMemberResult:
    member_id: str
    group_instance_id: str | None
    error_code: int


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    error_code: int
    members: tuple[LeaveMemberResult, ...] = ()


# --- offsets -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp_ms: int = -1  # -1: the coordinator stamps now_ms


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    offsets: Mapping[TopicPartition, OffsetAndMetadata]
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitResponse:
    partition_errors: Mapping[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    group_id: str
    partitions: tuple[TopicPartition, ...] | None = None  # None: every committed partition
    require_stable: bool = False  # v7+: UNSTABLE_OFFSET_COMMIT for a partition with a pending commit


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitRequest:
    """Offsets committed in a producer's transaction; generation and member checked as
    KIP-447 (-1 and "": not checked)."""

    group_id: str
    producer_id: int
    producer_epoch: int
    offsets: Mapping[TopicPartition, OffsetAndMetadata]
    generation_id: int = NO_GENERATION
    member_id: str = UNKNOWN_MEMBER_ID
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitResponse:
    partition_errors: Mapping[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class TxnOffsetsCompleted:
    """Input: the transaction coordinator wrote a marker for ``producer_id`` to offsets
    partition ``partition``; its groups' pending transactional offsets commit or abort."""

    partition: int
    producer_id: int
    commit: bool


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    error_code: int = NO_ERROR


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    error_code: int
    offsets: Mapping[TopicPartition, FetchedOffset] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OffsetDeleteRequest:
    group_id: str
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class OffsetDeleteResponse:
    error_code: int
    partition_errors: Mapping[TopicPartition, int] = field(default_factory=dict)


# --- admin ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ListGroupsRequest:
    states_filter: frozenset[str] = frozenset()  # empty: every state; matched case-insensitively


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    protocol_type: str
    state: str


@dataclass(frozen=True, slots=True)
class ListGroupsResponse:
    error_code: int
    groups: tuple[ListedGroup, ...]


@dataclass(frozen=True, slots=True)
class DescribeGroupsRequest:
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    error_code: int
    group_id: str
    state: str
    protocol_type: str
    protocol_data: str
    members: tuple[DescribedMember, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeGroupsResponse:
    groups: tuple[DescribedGroup, ...]


@dataclass(frozen=True, slots=True)
class DeleteGroupsRequest:
    group_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DeleteGroupsResponse:
    results: Mapping[str, int]
