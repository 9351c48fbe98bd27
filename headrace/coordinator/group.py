"""One classic consumer group's in-memory state: members, generation, protocol, offsets.

Owns the group state names and the one table of legal state transitions (Kafka's
GroupMetadata.validPreviousStates), member bookkeeping (static members by group.instance.id,
members pending the MEMBER_ID_REQUIRED handshake) and protocol selection by vote. The rules
that drive transitions live in ``coordinator``; this module only keeps the state consistent.

Not thread-safe: owned by one ``GroupCoordinator``, called from one thread.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import Enum

from headrace.coordinator.messages import TopicPartition
from headrace.errors import CorruptMessage
from headrace.protocol.consumer_protocol import CONSUMER_PROTOCOL_TYPE, decode_subscription


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# Target state -> the states it may be entered from (Kafka's validPreviousStates).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.DEAD: frozenset(GroupState),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
}


class IllegalStateTransition(RuntimeError):
    """A coordinator bug: a transition the table does not allow."""


@dataclass(slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int


@dataclass(slots=True)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    heartbeat_deadline_ms: int
    joined_at_ms: int
    assignment: bytes = b""
    join_token: int | None = None  # a parked JoinGroup awaiting the rebalance
    sync_token: int | None = None  # a parked SyncGroup awaiting the leader's assignment
    is_new: bool = True  # has not yet received a JoinGroup response

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        return next(name for name in self.protocol_names() if name in candidates)


@dataclass(slots=True)
class Group:
    group_id: str
    state: GroupState
    state_timestamp_ms: int
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: dict[str, int] = field(default_factory=dict)  # member id -> deadline ms
    offsets: dict[TopicPartition, CommittedOffset] = field(default_factory=dict)
    # Commits appended but not yet acknowledged by the log, by append id; invisible to fetches.
    pending_offset_commits: dict[int, dict[TopicPartition, CommittedOffset]] = field(
        default_factory=dict
    )
    # TxnOffsetCommit offsets by producer id, until its transaction's marker commits (moves
    # them to ``offsets``) or aborts them (Kafka's pendingTransactionalOffsetCommits).
    pending_txn_offsets: dict[int, dict[TopicPartition, CommittedOffset]] = field(
        default_factory=dict
    )
    join_deadline_ms: int | None = None
    initial_delay_remaining_ms: int | None = None  # set while in the initial join delay
    new_member_added: bool = False

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalStateTransition(
                f"group {self.group_id!r}: {self.state.value} -> {target.value} is not allowed"
            )
        self.state = target
        self.state_timestamp_ms = now_ms

    def is_in(self, *states: GroupState) -> bool:
        return self.state in states

    def has_offsets(self) -> bool:
        """Committed or pending offsets (Kafka's GroupMetadata.hasOffsets)."""
        return (bool(self.offsets) or any(self.pending_offset_commits.values())
                or any(self.pending_txn_offsets.values()))

    def has_pending_commit(self, tp: TopicPartition) -> bool:
        """A commit of ``tp`` not yet visible, plain or transactional (Kafka's
        hasPendingOffsetCommitsForTopicPartition): OffsetFetch require_stable refuses it."""
        return any(tp in pending for pending in self.pending_offset_commits.values()) or any(
            tp in pending for pending in self.pending_txn_offsets.values())

    def remove_offset(self, tp: TopicPartition) -> CommittedOffset | None:
        """Forget a committed offset and any pending commit of it, so a commit still in flight
        cannot resurrect what a later tombstone deleted."""
        for pending in (*self.pending_offset_commits.values(),
                        *self.pending_txn_offsets.values()):
            pending.pop(tp, None)
        return self.offsets.pop(tp, None)

    def add_member(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove_member(self, member_id: str) -> Member:
        member = self.members.pop(member_id)
        if member.group_instance_id is not None:
            self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def replace_static_member(self, old_member_id: str, new_member_id: str) -> Member:
        member = self.members.pop(old_member_id)
        member.member_id = new_member_id
        self.members[new_member_id] = member
        assert member.group_instance_id is not None
        self.static_members[member.group_instance_id] = new_member_id
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        return member

    def is_static_member_fenced(self, group_instance_id: str | None, member_id: str) -> bool:
        if group_instance_id is None:
            return False
        known = self.static_members.get(group_instance_id)
        return known is not None and known != member_id

    def supports_protocols(self, protocol_type: str, protocol_names: list[str]) -> bool:
        if self.is_in(GroupState.EMPTY):
            return bool(protocol_type) and bool(protocol_names)
        support_counts = Counter(n for m in self.members.values() for n in set(m.protocol_names()))
        return protocol_type == self.protocol_type and any(
            support_counts[name] == len(self.members) for name in protocol_names
        )

    def candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        candidates = set(members[0].protocol_names())
        for member in members[1:]:
            candidates &= set(member.protocol_names())
        return candidates

    def select_protocol(self) -> str:
        """The protocol all members support that most members list first among those."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise IllegalStateTransition(f"group {self.group_id!r}: no common protocol")
        votes = Counter(member.vote(candidates) for member in self.members.values())
        first_member = next(iter(self.members.values()))
        preference = {name: index for index, name in enumerate(first_member.protocol_names())}
        return max(votes, key=lambda name: (votes[name], -preference.get(name, 0)))

    def all_members_joined(self) -> bool:
        return not self.pending_members and all(
            m.join_token is not None for m in self.members.values()
        )

    def max_rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members consume (consumer protocol only); None when unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            try:
                subscription = decode_subscription(member.metadata_for(self.protocol_name))
            except CorruptMessage:
                return None
            topics.update(subscription.topics)
        return topics
