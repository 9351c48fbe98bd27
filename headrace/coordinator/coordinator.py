"""The classic group coordinator and offset store as a socket-free state machine.

Owns every consumer group of this broker: the JoinGroup / SyncGroup / Heartbeat / LeaveGroup
protocol (Kafka's GroupCoordinator semantics: MEMBER_ID_REQUIRED handshake, initial rebalance
delay, protocol vote, leader election, session and rebalance timeouts, static membership),
committed offsets (served from memory, persisted to ``__consumer_offsets``), offset retention,
the admin calls (ListGroups, DescribeGroups, DeleteGroups, OffsetDelete) and loading groups
back from the offsets topic.

Every call takes ``now_ms`` and returns an ``Outcome``: the response (or ``Pending(token)``
for a parked JoinGroup/SyncGroup/OffsetCommit) plus effects for the broker to carry out.
Parked requests complete on later calls, on ``tick(now_ms)`` or on an ``AppendResult``;
``next_deadline_ms()`` says when the next timer falls due. A response always carries a
``headrace.errors`` code; calls never raise for a client's mistake.

Durability before visibility (Kafka's GroupMetadataManager.storeOffsets / storeGroup): an
OffsetCommit keeps its offsets pending (invisible to OffsetFetch) until its append succeeds,
then moves them to the committed cache; a leader's SyncGroup assignment is applied (group
Stable, members answered) only once its group record is appended; a static member that
rejoins a Stable group without a rebalance gets its new member id answered only once the group
record carrying it is appended. On a failed append the pending offsets are dropped, the
members get the error and the group rebalances, or the static member's instance goes back to
its old member id (Kafka's updateStaticMemberAndRebalance revert); append errors are mapped
to client errors as Kafka does (``commit_append_error_code``, ``group_append_error_code``).
Other appends (tombstones, Empty-group records) follow the state change, as in Kafka, and
their results are not waited for.

Not thread-safe: call from one thread (the broker's event loop).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from headrace import errors
from headrace.coordinator import store
from headrace.coordinator.config import CoordinatorConfig
from headrace.coordinator.group import CommittedOffset, Group, GroupState, Member
from headrace.coordinator.messages import (
    NO_ERROR,
    NO_LEADER_EPOCH,
    NO_OFFSET,
    UNKNOWN_MEMBER_ID,
    AppendResult,
    AppendToOffsetsTopic,
    Completed,
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribedGroup,
    DescribedMember,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    Effect,
    FetchedOffset,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeaveMemberResult,
    ListedGroup,
    ListGroupsRequest,
    ListGroupsResponse,
    MemberIdentity,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    Outcome,
    Pending,
    SyncGroupRequest,
    SyncGroupResponse,
    TopicPartition,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    TxnOffsetsCompleted,
)
from headrace.coordinator.records import partition_for_group

OFFSET_DELETE_SUBSCRIBED_ERROR = errors.GroupSubscribedToTopic

_REBALANCE_STATES = (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY)

NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20  # Kafka's code; headrace.errors has no class for it
_UNAVAILABLE_APPEND_CODES = frozenset(
    {errors.UnknownTopicOrPartition.code, errors.NotEnoughReplicas.code,
     NOT_ENOUGH_REPLICAS_AFTER_APPEND}
)
_NOT_LEADER_APPEND_CODES = frozenset({errors.NotLeaderOrFollower.code, errors.KafkaStorageError.code})
_TOO_LARGE_APPEND_CODES = frozenset(
    {errors.MessageTooLarge.code, errors.RecordListTooLarge.code, errors.InvalidFetchSize.code}
)


def commit_append_error_code(append_error_code: int) -> int:
    """What an OffsetCommit answers when its append failed (GroupMetadataManager's mapping)."""
    if append_error_code in _UNAVAILABLE_APPEND_CODES:
        return errors.CoordinatorNotAvailable.code
    if append_error_code in _NOT_LEADER_APPEND_CODES:
        return errors.NotCoordinator.code
    if append_error_code in _TOO_LARGE_APPEND_CODES:
        return errors.InvalidCommitOffsetSize.code
    if append_error_code == errors.RequestTimedOut.code:
        return append_error_code
    return errors.UnknownServerError.code


def group_append_error_code(append_error_code: int) -> int:
    """What SyncGroup members get when the group record's append failed (storeGroup)."""
    if append_error_code in _UNAVAILABLE_APPEND_CODES:
        return errors.CoordinatorNotAvailable.code
    if append_error_code in _NOT_LEADER_APPEND_CODES:
        return errors.NotCoordinator.code
    if append_error_code == errors.RequestTimedOut.code:
        return errors.RebalanceInProgress.code
    return errors.UnknownServerError.code


@dataclass(slots=True)
class _CommitAwaitingAppend:
    group: Group
    token: int
    partition_errors: dict[TopicPartition, int]


@dataclass(slots=True)
class _AssignmentAwaitingAppend:
    group: Group
    generation_id: int
    assignments: dict[str, bytes]


@dataclass(frozen=True, slots=True)
class _MemberSettings:
    """What a static rejoin overwrites in its member, kept to restore on a failed append."""

    protocols: tuple[tuple[str, bytes], ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str

    @classmethod
    def of(cls, member: Member) -> _MemberSettings:
        return cls(
            member.protocols, member.session_timeout_ms, member.rebalance_timeout_ms,
            member.client_id, member.client_host,
        )

    def restore(self, member: Member) -> None:
        member.protocols = self.protocols
        member.session_timeout_ms = self.session_timeout_ms
        member.rebalance_timeout_ms = self.rebalance_timeout_ms
        member.client_id = self.client_id
        member.client_host = self.client_host


@dataclass(slots=True)
class _StaticRejoinAwaitingAppend:
    group: Group
    token: int
    old_member_id: str
    new_member_id: str
    previous: _MemberSettings
    leader_before: str | None
    supports_skip_assignment: bool


@dataclass(slots=True)
class _TxnCommitAwaitingAppend:
    group: Group
    token: int
    partition_errors: dict[TopicPartition, int]
    producer_id: int
    offsets: dict[TopicPartition, CommittedOffset]


_AwaitingAppend = (_CommitAwaitingAppend | _AssignmentAwaitingAppend
                   | _StaticRejoinAwaitingAppend | _TxnCommitAwaitingAppend)
# errors of a transactional append the producer must see as they are (fenced, no transaction)
_TXN_APPEND_CODES_PASSED_ON = frozenset({
    errors.InvalidProducerEpoch.code, errors.ProducerFenced.code, errors.InvalidTxnState.code})


def random_member_id(client_id: str) -> str:
    """Kafka's member id: ``<client_id>-<uuid4>``."""
    return f"{client_id}-{uuid.uuid4()}"


class GroupCoordinator:
    def __init__(
        self,
        config: CoordinatorConfig | None = None,
        member_id_factory: Callable[[str], str] = random_member_id,
        owns_every_partition: bool = True,
    ) -> None:
        """``owns_every_partition``: a single node coordinates the groups of every offsets
        partition; in a cluster it owns those it ``begin_loading`` until ``unload_partition``
        (the partitions its broker leads) and answers NOT_COORDINATOR for the others."""
        self._config = config or CoordinatorConfig()
        self._owned: set[int] | None = None if owns_every_partition else set()
        self._new_member_id = member_id_factory
        self._groups: dict[str, Group] = {}
        self._loading: dict[int, store.PartitionLoader] = {}
        self._tokens = itertools.count(1)
        self._append_ids = itertools.count(1)
        self._awaiting_append: dict[int, _AwaitingAppend] = {}
        self._next_retention_check_ms: int | None = None
        self.loaded_record_count = 0  # records replayed from the offsets topic so far

    # --- lookup and validation -------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for_group(group_id, self._config.offsets_topic_num_partitions)

    def group_state(self, group_id: str) -> GroupState:
        group = self._groups.get(group_id)
        return group.state if group is not None else GroupState.DEAD

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def _check_available(self, group_id: str, require_non_empty_id: bool = True) -> None:
        if require_non_empty_id and not group_id:
            raise errors.InvalidGroupId("group id must not be empty")
        partition = self.partition_for(group_id)
        if self._owned is not None and partition not in self._owned:
            raise errors.NotCoordinator(f"this broker is not the coordinator of {group_id!r}")
        if partition in self._loading:
            raise errors.CoordinatorLoadInProgress(f"loading the partition of {group_id!r}")

    def _validate_current_member(
        self, group: Group, member_id: str, group_instance_id: str | None, generation_id: int
    ) -> Member:
        if group_instance_id is not None:
            known_member_id = group.static_members.get(group_instance_id)
            if known_member_id is None:
                raise errors.UnknownMemberId(f"unknown group.instance.id {group_instance_id!r}")
            if known_member_id != member_id:
                raise errors.FencedInstanceId(f"{member_id!r} fenced by {known_member_id!r}")
        member = group.members.get(member_id)
        if member is None:
            raise errors.UnknownMemberId(f"unknown member {member_id!r}")
        if generation_id != group.generation_id:
            raise errors.IllegalGeneration(f"generation {generation_id} != {group.generation_id}")
        return member

    def _append(
        self,
        group_id: str,
        records: tuple,
        effects: list[Effect],
        follow_up: _AwaitingAppend | None = None,
    ) -> int:
        """Queue an append to the group's offsets-topic partition; its ``AppendResult`` runs
        ``follow_up`` (none: the result changes nothing)."""
        append_id = next(self._append_ids)
        effects.append(AppendToOffsetsTopic(self.partition_for(group_id), records, append_id))
        if follow_up is not None:
            self._awaiting_append[append_id] = follow_up
        return append_id

    def _persist_group(self, group: Group, effects: list[Effect]) -> None:
        self._append(group.group_id, (store.group_metadata_record(group),), effects)

    def _heartbeat_refreshed(self, member: Member, now_ms: int) -> None:
        member.heartbeat_deadline_ms = now_ms + member.session_timeout_ms

    # --- JoinGroup ---------------------------------------------------------------------------

    def join_group(self, request: JoinGroupRequest, now_ms: int) -> Outcome:
        effects: list[Effect] = []
        try:
            response = self._join(request, now_ms, effects)
        except errors.KafkaError as error:
            response = JoinGroupResponse(error.code, request.member_id)
        group = self._groups.get(request.group_id)
        if group is not None:
            self._run_group_timers(group, now_ms, effects)
        return _resolve_own_pending(response, effects)

    def _join(self, request: JoinGroupRequest, now_ms: int, effects: list[Effect]):
        self._check_available(request.group_id)
        config = self._config
        if not (
            config.group_min_session_timeout_ms
            <= request.session_timeout_ms
            <= config.group_max_session_timeout_ms
        ):
            raise errors.InvalidSessionTimeout(f"session timeout {request.session_timeout_ms} ms")
        group = self._groups.get(request.group_id)
        if group is None:
            if request.member_id != UNKNOWN_MEMBER_ID:
                raise errors.UnknownMemberId(f"group {request.group_id!r} has no members")
            group = Group(request.group_id, GroupState.EMPTY, state_timestamp_ms=now_ms)
        protocol_names = [name for name, _ in request.protocols]
        if not group.supports_protocols(request.protocol_type, protocol_names):
            raise errors.InconsistentGroupProtocol("no protocol in common with the group")
        self._groups.setdefault(group.group_id, group)
        if request.member_id == UNKNOWN_MEMBER_ID:
            return self._join_new_member(group, request, now_ms, effects)
        return self._join_known_member(group, request, now_ms, effects)

    def _join_new_member(
        self, group: Group, request: JoinGroupRequest, now_ms: int, effects: list[Effect]
    ):
        if request.group_instance_id in group.static_members:
            return self._rejoin_static_member(group, request, now_ms, effects)
        if len(group.members) + len(group.pending_members) >= self._config.group_max_size:
            raise errors.GroupMaxSizeReached(f"group.max.size {self._config.group_max_size}")
        member_id = self._new_member_id(request.client_id)
        if request.group_instance_id is None and request.require_known_member_id:
            group.pending_members[member_id] = now_ms + request.session_timeout_ms
            return JoinGroupResponse(errors.MemberIdRequired.code, member_id)
        return self._add_member_and_rebalance(group, request, member_id, now_ms, effects)

    def _join_known_member(
        self, group: Group, request: JoinGroupRequest, now_ms: int, effects: list[Effect]
    ):
        if request.member_id in group.pending_members:
            del group.pending_members[request.member_id]
            return self._add_member_and_rebalance(
                group, request, request.member_id, now_ms, effects
            )
        if group.is_static_member_fenced(request.group_instance_id, request.member_id):
            raise errors.FencedInstanceId(f"{request.member_id!r} was replaced")
        member = group.members.get(request.member_id)
        if member is None:
            raise errors.UnknownMemberId(f"unknown member {request.member_id!r}")
        unchanged = member.protocols == request.protocols
        if group.is_in(GroupState.COMPLETING_REBALANCE) and unchanged:
            is_leader = member.member_id == group.leader_id
            return self._join_response(group, member, include_members=is_leader)
        if group.is_in(GroupState.STABLE) and unchanged and member.member_id != group.leader_id:
            return self._join_response(group, member, include_members=False)
        return self._update_member_and_rebalance(group, member, request, now_ms, effects)

    def _rejoin_static_member(
        self, group: Group, request: JoinGroupRequest, now_ms: int, effects: list[Effect]
    ) -> Pending:
        """A known group.instance.id joins with an unknown member id: the member takes a new
        id (the old one is fenced). A Stable group whose selected protocol stays is not
        rebalanced: the new id is persisted first and the join answered by the append's result
        (Kafka's updateStaticMemberAndRebalance); otherwise the group rebalances."""
        old_member_id = group.static_members[request.group_instance_id]
        old_member = group.members[old_member_id]
        self._complete_parked(old_member, errors.FencedInstanceId.code, effects)
        previous = _MemberSettings.of(old_member)
        leader_before = group.leader_id
        member = group.replace_static_member(old_member_id, self._new_member_id(request.client_id))
        _update_member(member, request, now_ms)
        token = member.join_token = next(self._tokens)
        if group.is_in(GroupState.STABLE) and group.select_protocol() == group.protocol_name:
            follow_up = _StaticRejoinAwaitingAppend(
                group, token, old_member_id, member.member_id, previous, leader_before,
                request.supports_skip_assignment,
            )
            self._append(group.group_id, (store.group_metadata_record(group),), effects, follow_up)
            return Pending(token)
        self._maybe_prepare_rebalance(group, now_ms, effects)
        self._try_complete_join(group, now_ms, effects)
        return Pending(token)

    def _on_static_rejoin_appended(
        self, waiting: _StaticRejoinAwaitingAppend, error_code: int, now_ms: int,
        effects: list[Effect],
    ) -> None:
        """Answer the rejoined static member, or on failure give the instance back to its old
        member id (which keeps its place and its session) and answer the mapped error."""
        group = waiting.group
        member = group.members.get(waiting.new_member_id)
        if member is None or member.join_token != waiting.token:
            return  # the join was already answered: the member left, was replaced or rebalanced
        member.join_token = None
        if error_code == NO_ERROR:
            self._heartbeat_refreshed(member, now_ms)
            effects.append(Completed(waiting.token, self._static_rejoin_response(group, waiting)))
            return
        group.replace_static_member(waiting.new_member_id, waiting.old_member_id)
        waiting.previous.restore(member)
        self._heartbeat_refreshed(member, now_ms)
        response = JoinGroupResponse(
            group_append_error_code(error_code),
            UNKNOWN_MEMBER_ID,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            waiting.leader_before or "",
        )
        effects.append(Completed(waiting.token, response))

    def _static_rejoin_response(
        self, group: Group, waiting: _StaticRejoinAwaitingAppend
    ) -> JoinGroupResponse:
        """JoinGroup v9+ tells a rejoined static leader to skip the assignment; older versions
        name the leader as it was before the rejoin, so a rejoined leader does not assign."""
        member = group.members[waiting.new_member_id]
        if waiting.supports_skip_assignment:
            is_leader = member.member_id == group.leader_id
            response = self._join_response(group, member, include_members=is_leader)
            return replace(response, skip_assignment=is_leader)
        response = self._join_response(group, member, include_members=False)
        return replace(response, leader=waiting.leader_before or "")

    def _add_member_and_rebalance(
        self,
        group: Group,
        request: JoinGroupRequest,
        member_id: str,
        now_ms: int,
        effects: list[Effect],
    ) -> Pending:
        member = Member(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            heartbeat_deadline_ms=now_ms + request.session_timeout_ms,
            joined_at_ms=now_ms,
            join_token=next(self._tokens),
        )
        token = member.join_token
        group.add_member(member)
        if group.initial_delay_remaining_ms is not None:
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, now_ms, effects)
        self._try_complete_join(group, now_ms, effects)
        return Pending(token)

    def _update_member_and_rebalance(
        self,
        group: Group,
        member: Member,
        request: JoinGroupRequest,
        now_ms: int,
        effects: list[Effect],
    ) -> Pending:
        if member.join_token is not None:  # a retried join replaces the parked one
            effects.append(
                Completed(
                    member.join_token,
                    JoinGroupResponse(errors.RebalanceInProgress.code, member.member_id),
                )
            )
        _update_member(member, request, now_ms)
        token = member.join_token = next(self._tokens)
        self._maybe_prepare_rebalance(group, now_ms, effects)
        self._try_complete_join(group, now_ms, effects)
        return Pending(token)

    def _join_response(self, group: Group, member: Member, include_members: bool):
        members = ()
        if include_members:
            members = tuple(
                JoinGroupMember(
                    m.member_id, m.group_instance_id, m.metadata_for(group.protocol_name)
                )
                for m in group.members.values()
            )
        return JoinGroupResponse(
            NO_ERROR,
            member.member_id,
            group.generation_id,
            group.protocol_type,
            group.protocol_name,
            group.leader_id or "",
            members,
        )

    # --- rebalance machinery -----------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, now_ms: int, effects: list[Effect]) -> None:
        if group.is_in(*_REBALANCE_STATES):
            self._prepare_rebalance(group, now_ms, effects)

    def _prepare_rebalance(self, group: Group, now_ms: int, effects: list[Effect]) -> None:
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            for member in group.members.values():
                member.assignment = b""
                if member.sync_token is not None:
                    response = SyncGroupResponse(errors.RebalanceInProgress.code)
                    effects.append(Completed(member.sync_token, response))
                    member.sync_token = None
        if group.is_in(GroupState.EMPTY):
            delay_ms = self._config.group_initial_rebalance_delay_ms
            group.initial_delay_remaining_ms = max(group.max_rebalance_timeout_ms() - delay_ms, 0)
            group.new_member_added = False
            group.join_deadline_ms = now_ms + delay_ms
        else:
            group.initial_delay_remaining_ms = None
            group.join_deadline_ms = now_ms + group.max_rebalance_timeout_ms()
        group.transition_to(GroupState.PREPARING_REBALANCE, now_ms)

    def _try_complete_join(self, group: Group, now_ms: int, effects: list[Effect]) -> None:
        if (
            group.is_in(GroupState.PREPARING_REBALANCE)
            and group.initial_delay_remaining_ms is None
            and group.all_members_joined()
        ):
            self._complete_join(group, now_ms, effects)

    def _on_join_deadline(self, group: Group, now_ms: int, effects: list[Effect]) -> None:
        remaining_ms = group.initial_delay_remaining_ms
        if remaining_ms is not None and group.new_member_added and remaining_ms > 0:
            delay_ms = min(self._config.group_initial_rebalance_delay_ms, remaining_ms)
            group.initial_delay_remaining_ms = max(remaining_ms - delay_ms, 0)
            group.new_member_added = False
            group.join_deadline_ms = now_ms + delay_ms
            return
        self._complete_join(group, now_ms, effects)

    def _complete_join(self, group: Group, now_ms: int, effects: list[Effect]) -> None:
        group.join_deadline_ms = None
        group.initial_delay_remaining_ms = None
        group.new_member_added = False
        for member in list(group.members.values()):
            if member.join_token is None and member.group_instance_id is None:
                group.remove_member(member.member_id)
        joined = [m for m in group.members.values() if m.join_token is not None]
        if group.leader_id is not None and group.members[group.leader_id].join_token is None:
            group.leader_id = joined[0].member_id if joined else group.leader_id
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.leader_id = None
            group.transition_to(GroupState.EMPTY, now_ms)
            self._persist_group(group, effects)
            return
        group.protocol_name = group.select_protocol()
        group.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        for member in joined:
            is_leader = member.member_id == group.leader_id
            response = self._join_response(group, member, include_members=is_leader)
            effects.append(Completed(member.join_token, response))
            member.join_token = None
            member.is_new = False
            self._heartbeat_refreshed(member, now_ms)

    def _complete_parked(self, member: Member, error_code: int, effects: list[Effect]) -> None:
        if member.join_token is not None:
            effects.append(
                Completed(member.join_token, JoinGroupResponse(error_code, member.member_id))
            )
            member.join_token = None
        if member.sync_token is not None:
            effects.append(Completed(member.sync_token, SyncGroupResponse(error_code)))
            member.sync_token = None

    def _remove_member_and_update_group(
        self, group: Group, member_id: str, now_ms: int, effects: list[Effect]
    ) -> None:
        self._complete_parked(group.members[member_id], errors.UnknownMemberId.code, effects)
        group.remove_member(member_id)
        if group.is_in(GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, now_ms, effects)
        self._try_complete_join(group, now_ms, effects)

    # --- SyncGroup / Heartbeat / LeaveGroup --------------------------------------------------

    def sync_group(self, request: SyncGroupRequest, now_ms: int) -> Outcome:
        effects: list[Effect] = []
        try:
            response = self._sync(request, now_ms, effects)
        except errors.KafkaError as error:
            response = SyncGroupResponse(error.code)
        return _resolve_own_pending(response, effects)

    def _sync(self, request: SyncGroupRequest, now_ms: int, effects: list[Effect]):
        self._check_available(request.group_id)
        group = self._groups.get(request.group_id)
        if group is None:
            raise errors.UnknownMemberId(f"unknown group {request.group_id!r}")
        member = self._validate_current_member(
            group, request.member_id, request.group_instance_id, request.generation_id
        )
        if request.protocol_type is not None and request.protocol_type != group.protocol_type:
            raise errors.InconsistentGroupProtocol(f"protocol type {request.protocol_type!r}")
        if request.protocol_name is not None and request.protocol_name != group.protocol_name:
            raise errors.InconsistentGroupProtocol(f"protocol {request.protocol_name!r}")
        if group.is_in(GroupState.PREPARING_REBALANCE):
            raise errors.RebalanceInProgress("the group is rebalancing")
        self._heartbeat_refreshed(member, now_ms)
        if group.is_in(GroupState.STABLE):
            return self._sync_response(group, member)
        if member.sync_token is not None:
            effects.append(
                Completed(member.sync_token, SyncGroupResponse(errors.RebalanceInProgress.code))
            )
        member.sync_token = next(self._tokens)
        token = member.sync_token
        if member.member_id == group.leader_id:
            self._store_leader_assignment(group, request, effects)
        return Pending(token)

    def _store_leader_assignment(
        self, group: Group, request: SyncGroupRequest, effects: list[Effect]
    ) -> None:
        """Append the group record with the leader's assignment; it is applied on success."""
        assignments = {
            member_id: bytes(request.assignments.get(member_id, b"")) for member_id in group.members
        }
        record = store.group_metadata_record(group, assignments)
        follow_up = _AssignmentAwaitingAppend(group, group.generation_id, assignments)
        self._append(group.group_id, (record,), effects, follow_up)

    def _on_assignment_appended(
        self, waiting: _AssignmentAwaitingAppend, error_code: int, now_ms: int,
        effects: list[Effect],
    ) -> None:
        group = waiting.group
        if (
            self._groups.get(group.group_id) is not group
            or not group.is_in(GroupState.COMPLETING_REBALANCE)
            or group.generation_id != waiting.generation_id
        ):
            return  # the group moved on while the append was in flight (Kafka: do nothing)
        if error_code != NO_ERROR:
            self._propagate_assignment_error(group, group_append_error_code(error_code), effects)
            self._maybe_prepare_rebalance(group, now_ms, effects)
            return
        for member in group.members.values():
            member.assignment = waiting.assignments.get(member.member_id, b"")
        group.transition_to(GroupState.STABLE, now_ms)
        for member in group.members.values():
            if member.sync_token is not None:
                effects.append(Completed(member.sync_token, self._sync_response(group, member)))
                member.sync_token = None

    def _propagate_assignment_error(
        self, group: Group, client_error_code: int, effects: list[Effect]
    ) -> None:
        for member in group.members.values():
            member.assignment = b""
            if member.sync_token is not None:
                effects.append(Completed(member.sync_token, SyncGroupResponse(client_error_code)))
                member.sync_token = None

    def _sync_response(self, group: Group, member: Member) -> SyncGroupResponse:
        return SyncGroupResponse(
            NO_ERROR, member.assignment, group.protocol_type, group.protocol_name
        )

    def heartbeat(self, request: HeartbeatRequest, now_ms: int) -> Outcome:
        try:
            self._check_available(request.group_id)
            group = self._groups.get(request.group_id)
            if group is None:
                raise errors.UnknownMemberId(f"unknown group {request.group_id!r}")
            member = self._validate_current_member(
                group, request.member_id, request.group_instance_id, request.generation_id
            )
            self._heartbeat_refreshed(member, now_ms)
            if group.is_in(GroupState.PREPARING_REBALANCE):
                raise errors.RebalanceInProgress("rejoin the group")
            return Outcome(HeartbeatResponse(NO_ERROR))
        except errors.KafkaError as error:
            return Outcome(HeartbeatResponse(error.code))

    def leave_group(self, request: LeaveGroupRequest, now_ms: int) -> Outcome:
        effects: list[Effect] = []
        try:
            self._check_available(request.group_id)
        except errors.KafkaError as error:
            return Outcome(LeaveGroupResponse(error.code))
        group = self._groups.get(request.group_id)
        results = []
        for identity in request.members:
            error_code = NO_ERROR
            try:
                if group is None:
                    raise errors.UnknownMemberId(f"unknown group {request.group_id!r}")
                self._leave_one(group, identity, now_ms, effects)
            except errors.KafkaError as error:
                error_code = error.code
            results.append(
                LeaveMemberResult(identity.member_id, identity.group_instance_id, error_code)
            )
        return Outcome(LeaveGroupResponse(NO_ERROR, tuple(results)), tuple(effects))

    def _leave_one(
        self, group: Group, identity: MemberIdentity, now_ms: int, effects: list[Effect]
    ) -> None:
        member_id = identity.member_id
        if member_id == UNKNOWN_MEMBER_ID:
            member_id = group.static_members.get(identity.group_instance_id or "", "")
            if not member_id:
                raise errors.UnknownMemberId(f"unknown instance {identity.group_instance_id!r}")
        elif group.is_static_member_fenced(identity.group_instance_id, member_id):
            raise errors.FencedInstanceId(f"{member_id!r} was replaced")
        if member_id in group.pending_members:
            del group.pending_members[member_id]
            self._try_complete_join(group, now_ms, effects)
            return
        if member_id not in group.members:
            raise errors.UnknownMemberId(f"unknown member {member_id!r}")
        self._remove_member_and_update_group(group, member_id, now_ms, effects)

    # --- timers ------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> tuple[Effect, ...]:
        """Fire every timer due at ``now_ms``: session and join-handshake expiry, rebalance
        deadlines, and the periodic offset retention check."""
        effects: list[Effect] = []
        for group in list(self._groups.values()):
            self._run_group_timers(group, now_ms, effects)
        if self._next_retention_check_ms is None:
            self._next_retention_check_ms = (
                now_ms + self._config.offsets_retention_check_interval_ms
            )
        elif now_ms >= self._next_retention_check_ms:
            self._expire_offsets(now_ms, effects)
            self._next_retention_check_ms = (
                now_ms + self._config.offsets_retention_check_interval_ms
            )
        return tuple(effects)

    def next_deadline_ms(self) -> int | None:
        """The earliest time at which ``tick`` has work to do, if any."""
        deadlines = [self._next_retention_check_ms]
        for group in self._groups.values():
            deadlines.extend(group.pending_members.values())
            if group.join_deadline_ms is not None:
                deadlines.append(group.join_deadline_ms)
            deadlines.extend(self._member_deadline_ms(m) for m in group.members.values())
        return min((d for d in deadlines if d is not None), default=None)

    def _member_deadline_ms(self, member: Member) -> int | None:
        if member.join_token is not None:
            if not member.is_new:
                return None
            return member.joined_at_ms + self._config.new_member_join_timeout_ms
        if member.sync_token is not None:
            return None
        return member.heartbeat_deadline_ms

    def _run_group_timers(self, group: Group, now_ms: int, effects: list[Effect]) -> None:
        if self.partition_for(group.group_id) in self._loading:
            return
        for member_id, deadline_ms in list(group.pending_members.items()):
            if now_ms >= deadline_ms:
                del group.pending_members[member_id]
                self._try_complete_join(group, now_ms, effects)
        for member in list(group.members.values()):
            deadline_ms = self._member_deadline_ms(member)
            if (
                member.member_id in group.members
                and deadline_ms is not None
                and now_ms >= deadline_ms
            ):
                self._remove_member_and_update_group(group, member.member_id, now_ms, effects)
        deadline_ms = group.join_deadline_ms
        if group.is_in(GroupState.PREPARING_REBALANCE) and deadline_ms is not None:
            if now_ms >= deadline_ms:
                self._on_join_deadline(group, now_ms, effects)
                self._run_group_timers(group, now_ms, effects)

    # --- offsets -----------------------------------------------------------------------------

    def commit_offsets(self, request: OffsetCommitRequest, now_ms: int) -> Outcome:
        try:
            group = self._group_for_commit(request, now_ms)
        except errors.KafkaError as error:
            return Outcome(OffsetCommitResponse({tp: error.code for tp in request.offsets}))
        partition_errors, pending = self._offsets_to_store(request.offsets, now_ms)
        if not pending:
            return Outcome(OffsetCommitResponse(partition_errors))
        self._groups.setdefault(group.group_id, group)
        records = tuple(
            store.offset_commit_record(group.group_id, tp, committed)
            for tp, committed in pending.items()
        )
        token = next(self._tokens)
        effects: list[Effect] = []
        follow_up = _CommitAwaitingAppend(group, token, partition_errors)
        append_id = self._append(group.group_id, records, effects, follow_up)
        group.pending_offset_commits[append_id] = pending
        return Outcome(Pending(token), tuple(effects))

    def _offsets_to_store(self, requested, now_ms: int):
        """Each requested offset's error code (OFFSET_METADATA_TOO_LARGE or none) and the
        offsets to store, stamped ``now_ms`` unless the request carries a timestamp."""
        partition_errors: dict[TopicPartition, int] = {}
        offsets: dict[TopicPartition, CommittedOffset] = {}
        for tp, offset in requested.items():
            if len(offset.metadata.encode("utf-8")) > self._config.offset_metadata_max_bytes:
                partition_errors[tp] = errors.OffsetMetadataTooLarge.code
                continue
            timestamp_ms = offset.commit_timestamp_ms if offset.commit_timestamp_ms >= 0 else now_ms
            offsets[tp] = CommittedOffset(
                offset.offset, offset.leader_epoch, offset.metadata, timestamp_ms
            )
            partition_errors[tp] = NO_ERROR
        return partition_errors, offsets

    def _on_commit_appended(
        self, append_id: int, waiting: _CommitAwaitingAppend, error_code: int, now_ms: int,
        effects: list[Effect],
    ) -> None:
        group = waiting.group
        pending = group.pending_offset_commits.pop(append_id, {})
        partition_errors = dict(waiting.partition_errors)
        if error_code == NO_ERROR:
            if self._groups.get(group.group_id) is group:
                group.offsets.update(pending)
        else:
            client_error_code = commit_append_error_code(error_code)
            for tp, code in partition_errors.items():
                if code == NO_ERROR:
                    partition_errors[tp] = client_error_code
            self._drop_if_unused(group, now_ms)
        effects.append(Completed(waiting.token, OffsetCommitResponse(partition_errors)))

    # --- transactional offsets (TxnOffsetCommit) -----------------------------------------------

    def commit_txn_offsets(self, request: TxnOffsetCommitRequest, now_ms: int) -> Outcome:
        """Kafka's doTxnCommitOffsets: the offsets are appended in a transactional batch of the
        producer and held pending until its transaction's marker (``TxnOffsetsCompleted``)."""
        try:
            group = self._group_for_txn_commit(request, now_ms)
        except errors.KafkaError as error:
            return Outcome(TxnOffsetCommitResponse({tp: error.code for tp in request.offsets}))
        partition_errors, offsets = self._offsets_to_store(request.offsets, now_ms)
        if not offsets:
            return Outcome(TxnOffsetCommitResponse(partition_errors))
        self._groups.setdefault(group.group_id, group)
        group.pending_txn_offsets.setdefault(request.producer_id, {}).update(offsets)
        records = tuple(store.offset_commit_record(group.group_id, tp, committed)
                        for tp, committed in offsets.items())
        token = next(self._tokens)
        append_id = next(self._append_ids)
        self._awaiting_append[append_id] = _TxnCommitAwaitingAppend(
            group, token, partition_errors, request.producer_id, offsets)
        effect = AppendToOffsetsTopic(self.partition_for(group.group_id), records, append_id,
                                      request.producer_id, request.producer_epoch)
        return Outcome(Pending(token), (effect,))

    def _group_for_txn_commit(self, request: TxnOffsetCommitRequest, now_ms: int) -> Group:
        self._check_available(request.group_id)
        group = self._groups.get(request.group_id)
        if group is None:
            return Group(request.group_id, GroupState.EMPTY, state_timestamp_ms=now_ms)
        if request.group_instance_id is not None:
            known_member_id = group.static_members.get(request.group_instance_id)
            if known_member_id is not None and known_member_id != request.member_id:
                raise errors.FencedInstanceId(f"{request.member_id!r} fenced")
        if request.member_id != UNKNOWN_MEMBER_ID and request.member_id not in group.members:
            raise errors.UnknownMemberId(f"unknown member {request.member_id!r}")
        if request.generation_id >= 0 and request.generation_id != group.generation_id:
            raise errors.IllegalGeneration(
                f"generation {request.generation_id} != {group.generation_id}")
        return group

    def _on_txn_commit_appended(self, waiting: _TxnCommitAwaitingAppend, error_code: int,
                                now_ms: int, effects: list[Effect]) -> None:
        partition_errors = dict(waiting.partition_errors)
        if error_code != NO_ERROR:
            group = waiting.group
            pending = group.pending_txn_offsets.get(waiting.producer_id, {})
            for tp, committed in waiting.offsets.items():
                if pending.get(tp) is committed:
                    del pending[tp]
            if not pending:
                group.pending_txn_offsets.pop(waiting.producer_id, None)
            client_error_code = (error_code if error_code in _TXN_APPEND_CODES_PASSED_ON
                                 else commit_append_error_code(error_code))
            for tp, code in partition_errors.items():
                if code == NO_ERROR:
                    partition_errors[tp] = client_error_code
            self._drop_if_unused(group, now_ms)
        effects.append(Completed(waiting.token, TxnOffsetCommitResponse(partition_errors)))

    def complete_txn_offsets(self, request: TxnOffsetsCompleted, now_ms: int) -> Outcome:
        """A marker reached offsets partition ``request.partition``: the producer's pending
        offsets in its groups become committed (commit) or are dropped (abort). Unlike
        Kafka, which keeps whichever of a transactional and a plain commit was appended
        later, a committed transaction's offset always replaces the cached one."""
        for group in list(self._groups.values()):
            if self.partition_for(group.group_id) != request.partition:
                continue
            offsets = group.pending_txn_offsets.pop(request.producer_id, None)
            if offsets and request.commit:
                group.offsets.update(offsets)
            elif offsets is not None:
                self._drop_if_unused(group, now_ms)
        return Outcome(None)

    def _drop_if_unused(self, group: Group, now_ms: int) -> None:
        """A group that only a failed commit created leaves the cache, nothing having been
        written for it (Kafka's cleanup would remove it at the next retention check)."""
        if (
            self._groups.get(group.group_id) is group
            and group.is_in(GroupState.EMPTY)
            and group.protocol_type is None
            and not group.has_offsets()
            and not group.pending_members
        ):
            group.transition_to(GroupState.DEAD, now_ms)
            del self._groups[group.group_id]

    # --- append results ------------------------------------------------------------------------

    def append_completed(self, result: AppendResult, now_ms: int) -> Outcome:
        """Apply or roll back what waited on an append; answers parked requests as effects."""
        waiting = self._awaiting_append.pop(result.append_id, None)
        effects: list[Effect] = []
        if isinstance(waiting, _CommitAwaitingAppend):
            self._on_commit_appended(result.append_id, waiting, result.error_code, now_ms, effects)
        elif isinstance(waiting, _AssignmentAwaitingAppend):
            self._on_assignment_appended(waiting, result.error_code, now_ms, effects)
        elif isinstance(waiting, _StaticRejoinAwaitingAppend):
            self._on_static_rejoin_appended(waiting, result.error_code, now_ms, effects)
        elif isinstance(waiting, _TxnCommitAwaitingAppend):
            self._on_txn_commit_appended(waiting, result.error_code, now_ms, effects)
        return Outcome(None, tuple(effects))

    def _group_for_commit(self, request: OffsetCommitRequest, now_ms: int) -> Group:
        self._check_available(request.group_id, require_non_empty_id=False)
        group = self._groups.get(request.group_id)
        if group is None:
            if request.generation_id >= 0:
                raise errors.IllegalGeneration(f"group {request.group_id!r} has no generation")
            return Group(request.group_id, GroupState.EMPTY, state_timestamp_ms=now_ms)
        if request.member_id != UNKNOWN_MEMBER_ID or request.generation_id >= 0:
            member = self._validate_current_member(
                group, request.member_id, request.group_instance_id, request.generation_id
            )
            self._heartbeat_refreshed(member, now_ms)
        elif not group.is_in(GroupState.EMPTY):
            raise errors.UnknownMemberId("commits without a member id need an empty group")
        if group.is_in(GroupState.COMPLETING_REBALANCE):
            raise errors.RebalanceInProgress("the group is completing a rebalance")
        return group

    def fetch_offsets(self, request: OffsetFetchRequest, now_ms: int) -> Outcome:
        try:
            self._check_available(request.group_id, require_non_empty_id=False)
        except errors.KafkaError as error:
            return Outcome(OffsetFetchResponse(error.code))
        group = self._groups.get(request.group_id)
        committed = group.offsets if group is not None else {}
        wanted = request.partitions if request.partitions is not None else tuple(committed)
        offsets = {}
        for tp in wanted:
            found = committed.get(tp)
            if request.require_stable and group is not None and group.has_pending_commit(tp):
                offsets[tp] = FetchedOffset(NO_OFFSET, NO_LEADER_EPOCH, "",
                                            errors.UnstableOffsetCommit.code)
            elif found is None:
                offsets[tp] = FetchedOffset(NO_OFFSET, NO_LEADER_EPOCH, "")
            else:
                offsets[tp] = FetchedOffset(found.offset, found.leader_epoch, found.metadata)
        return Outcome(OffsetFetchResponse(NO_ERROR, offsets))

    def delete_offsets(self, request: OffsetDeleteRequest, now_ms: int) -> Outcome:
        try:
            self._check_available(request.group_id)
            group = self._groups.get(request.group_id)
            if group is None:
                raise errors.GroupIdNotFound(f"group {request.group_id!r} does not exist")
            subscribed = self._topics_blocking_offset_delete(group)
        except errors.KafkaError as error:
            return Outcome(OffsetDeleteResponse(error.code))
        partition_errors: dict[TopicPartition, int] = {}
        tombstones = []
        for tp in request.partitions:
            if subscribed is None or tp[0] in subscribed:
                partition_errors[tp] = OFFSET_DELETE_SUBSCRIBED_ERROR.code
                continue
            partition_errors[tp] = NO_ERROR
            if group.remove_offset(tp) is not None:
                tombstones.append(store.offset_tombstone(group.group_id, tp))
        effects: list[Effect] = []
        if tombstones:
            self._append(group.group_id, tuple(tombstones), effects)
        return Outcome(OffsetDeleteResponse(NO_ERROR, partition_errors), tuple(effects))

    def _topics_blocking_offset_delete(self, group: Group) -> set[str] | None:
        """Topics whose offsets may not be deleted; None means all of them."""
        if group.is_in(GroupState.EMPTY):
            return set()
        if group.protocol_type != "consumer":
            raise errors.NonEmptyGroup(f"group {group.group_id!r} has members")
        return group.subscribed_topics()

    def _expire_offsets(self, now_ms: int, effects: list[Effect]) -> None:
        retention_ms = self._config.offsets_retention_ms
        for group in list(self._groups.values()):
            if self.partition_for(group.group_id) in self._loading:
                continue
            records = []
            for tp in store.expired_offsets(group, now_ms, retention_ms):
                group.remove_offset(tp)
                records.append(store.offset_tombstone(group.group_id, tp))
            if (
                group.is_in(GroupState.EMPTY)
                and not group.has_offsets()
                and not group.pending_members
            ):
                group.transition_to(GroupState.DEAD, now_ms)
                del self._groups[group.group_id]
                records.append(store.group_tombstone(group.group_id))
            if records:
                self._append(group.group_id, tuple(records), effects)

    # --- admin -------------------------------------------------------------------------------

    def list_groups(self, request: ListGroupsRequest, now_ms: int) -> Outcome:
        wanted_states = {state.lower() for state in request.states_filter}
        listed = []
        for group in self._groups.values():
            if self.partition_for(group.group_id) in self._loading:
                continue
            if wanted_states and group.state.value.lower() not in wanted_states:
                continue
            listed.append(ListedGroup(group.group_id, group.protocol_type or "", group.state.value))
        error_code = errors.CoordinatorLoadInProgress.code if self._loading else NO_ERROR
        return Outcome(ListGroupsResponse(error_code, tuple(sorted(listed, key=_group_id_of))))

    def describe_groups(self, request: DescribeGroupsRequest, now_ms: int) -> Outcome:
        return Outcome(DescribeGroupsResponse(tuple(map(self._describe, request.group_ids))))

    def _describe(self, group_id: str) -> DescribedGroup:
        try:
            self._check_available(group_id, require_non_empty_id=False)
        except errors.KafkaError as error:
            return DescribedGroup(error.code, group_id, "", "", "")
        group = self._groups.get(group_id)
        if group is None:
            return DescribedGroup(NO_ERROR, group_id, GroupState.DEAD.value, "", "")
        stable = group.is_in(GroupState.STABLE)
        members = tuple(
            DescribedMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata_for(group.protocol_name) if stable else b"",
                m.assignment if stable else b"",
            )
            for m in group.members.values()
        )
        protocol = (group.protocol_name or "") if stable else ""
        return DescribedGroup(
            NO_ERROR, group_id, group.state.value, group.protocol_type or "", protocol, members
        )

    def delete_groups(self, request: DeleteGroupsRequest, now_ms: int) -> Outcome:
        results: dict[str, int] = {}
        effects: list[Effect] = []
        for group_id in request.group_ids:
            try:
                self._delete_group(group_id, now_ms, effects)
                results[group_id] = NO_ERROR
            except errors.KafkaError as error:
                results[group_id] = error.code
        return Outcome(DeleteGroupsResponse(results), tuple(effects))

    def _delete_group(self, group_id: str, now_ms: int, effects: list[Effect]) -> None:
        self._check_available(group_id, require_non_empty_id=False)
        group = self._groups.get(group_id)
        if group is None:
            raise errors.GroupIdNotFound(f"group {group_id!r} does not exist")
        if not group.is_in(GroupState.EMPTY) or group.pending_members:
            raise errors.NonEmptyGroup(f"group {group_id!r} has members")
        group.transition_to(GroupState.DEAD, now_ms)
        del self._groups[group_id]
        records = [store.offset_tombstone(group_id, tp) for tp in group.offsets]
        records.append(store.group_tombstone(group_id))
        self._append(group_id, tuple(records), effects)

    # --- dispatch ------------------------------------------------------------------------------

    def handle(self, request: object, now_ms: int) -> Outcome:
        """Dispatch any coordinator request to its handler by type."""
        handler = _HANDLERS.get(type(request))
        if handler is None:
            raise TypeError(f"not a coordinator request: {type(request).__name__}")
        return handler(self, request, now_ms)

    # --- loading -----------------------------------------------------------------------------

    def begin_loading(self, partition: int) -> None:
        """Start (re)loading an offsets-topic partition: its groups are dropped from memory and
        requests for them answer COORDINATOR_LOAD_IN_PROGRESS until ``finish_loading``."""
        if self._owned is not None:
            self._owned.add(partition)
        if partition in self._loading:
            return
        for group_id in [g for g in self._groups if self.partition_for(g) == partition]:
            del self._groups[group_id]
        self._loading[partition] = store.PartitionLoader()

    def unload_partition(self, partition: int, now_ms: int) -> tuple[Effect, ...]:
        """This broker no longer leads the offsets partition (Kafka's
        ``removeGroupsForPartition``): its groups leave memory (Dead), their parked JoinGroup
        and SyncGroup requests answer NOT_COORDINATOR, and later requests for them too."""
        if self._owned is not None:
            self._owned.discard(partition)
        self._loading.pop(partition, None)
        effects: list[Effect] = []
        for group_id in [g for g in self._groups if self.partition_for(g) == partition]:
            group = self._groups.pop(group_id)
            for member in group.members.values():
                self._complete_parked(member, errors.NotCoordinator.code, effects)
            group.transition_to(GroupState.DEAD, now_ms)
        return tuple(effects)

    def abandon_loading(self, partition: int) -> None:
        """Give up a failed load: the partition is available again without any of its groups."""
        self._loading.pop(partition, None)

    def load_partition(self, partition: int, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Replay records of an offsets-topic partition in log order; may be called repeatedly
        with successive chunks (they are decoded in ``finish_loading``)."""
        self.begin_loading(partition)
        self._loading[partition].apply(records)

    def load_transactional(self, partition: int, producer_id: int,
                           records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Replay a producer's transactional records (TxnOffsetCommit): held until its marker."""
        self.begin_loading(partition)
        self._loading[partition].apply_transactional(producer_id, records)

    def load_marker(self, partition: int, producer_id: int, commit: bool) -> None:
        """Replay an end-transaction marker: the producer's held records apply or vanish."""
        self.begin_loading(partition)
        self._loading[partition].apply_marker(producer_id, commit)

    def finish_loading(self, partition: int, now_ms: int) -> int:
        """Make the loaded groups live; members' session timers start at ``now_ms``. Returns
        the number of records the partition's load replayed (also added to
        ``loaded_record_count``). Raises CorruptMessage for a record it cannot decode; the
        partition is then available again without any of its groups."""
        loader = self._loading.pop(partition, None)
        if loader is None:
            return 0
        self.loaded_record_count += loader.record_count
        for group in loader.build_groups(now_ms):
            self._groups[group.group_id] = group
        return loader.record_count


def _update_member(member: Member, request: JoinGroupRequest, now_ms: int) -> None:
    member.protocols = request.protocols
    member.protocol_type = request.protocol_type
    member.session_timeout_ms = request.session_timeout_ms
    member.rebalance_timeout_ms = request.rebalance_timeout_ms
    member.client_id = request.client_id
    member.client_host = request.client_host
    member.heartbeat_deadline_ms = now_ms + request.session_timeout_ms


def _group_id_of(listed: ListedGroup) -> str:
    return listed.group_id


def _resolve_own_pending(response: object, effects: list[Effect]) -> Outcome:
    """A request parked and completed within the same call is answered directly."""
    if isinstance(response, Pending):
        for index, effect in enumerate(effects):
            if isinstance(effect, Completed) and effect.token == response.token:
                del effects[index]
                return Outcome(effect.response, tuple(effects))
    return Outcome(response, tuple(effects))


_HANDLERS: dict[type, Callable[[GroupCoordinator, object, int], Outcome]] = {
    JoinGroupRequest: GroupCoordinator.join_group,
    SyncGroupRequest: GroupCoordinator.sync_group,
    HeartbeatRequest: GroupCoordinator.heartbeat,
    LeaveGroupRequest: GroupCoordinator.leave_group,
    OffsetCommitRequest: GroupCoordinator.commit_offsets,
    TxnOffsetCommitRequest: GroupCoordinator.commit_txn_offsets,
    TxnOffsetsCompleted: GroupCoordinator.complete_txn_offsets,
    OffsetFetchRequest: GroupCoordinator.fetch_offsets,
    OffsetDeleteRequest: GroupCoordinator.delete_offsets,
    ListGroupsRequest: GroupCoordinator.list_groups,
    DescribeGroupsRequest: GroupCoordinator.describe_groups,
    DeleteGroupsRequest: GroupCoordinator.delete_groups,
    AppendResult: GroupCoordinator.append_completed,
}
