"""JoinGroup / SyncGroup / Heartbeat / LeaveGroup, timeouts and static membership."""

from __future__ import annotations

import itertools

import pytest
from coordinator_driver import (
    GROUP,
    REBALANCE_TIMEOUT_MS,
    SESSION_TIMEOUT_MS,
    Driver,
    consumer_protocols,
    form_group,
    rejoin_all,
)

from headrace import errors
from headrace.coordinator.config import CoordinatorConfig
from headrace.coordinator.group import (
    VALID_PREVIOUS_STATES,
    Group,
    GroupState,
    IllegalStateTransition,
)
from headrace.coordinator.messages import (
    JoinGroupResponse,
    LeaveGroupRequest,
    MemberIdentity,
    Pending,
    SyncGroupRequest,
)
from headrace.coordinator.records import GroupMetadataKey, decode_group_metadata_value, decode_key
from headrace.protocol.consumer_protocol import decode_subscription
from tests.coordinator.group_leader import (
    AssignorMember,
    decode_assignment,
    encode_assignment,
    range_assign,
)

KAFKA_TRANSITIONS = {
    (GroupState.STABLE, GroupState.PREPARING_REBALANCE),
    (GroupState.COMPLETING_REBALANCE, GroupState.PREPARING_REBALANCE),
    (GroupState.EMPTY, GroupState.PREPARING_REBALANCE),
    (GroupState.PREPARING_REBALANCE, GroupState.COMPLETING_REBALANCE),
    (GroupState.PREPARING_REBALANCE, GroupState.EMPTY),
    (GroupState.COMPLETING_REBALANCE, GroupState.STABLE),
} | {(source, GroupState.DEAD) for source in GroupState}


@pytest.mark.parametrize(
    "source,target", list(itertools.product(GroupState, GroupState)), ids=lambda s: s.value
)
def test_transition_table_is_kafkas(source, target):
    group = Group("g", source, state_timestamp_ms=0)
    if (source, target) in KAFKA_TRANSITIONS:
        group.transition_to(target, 5)
        assert group.state is target and group.state_timestamp_ms == 5
    else:
        with pytest.raises(IllegalStateTransition):
            group.transition_to(target, 5)
        assert group.state is source
    assert (source in VALID_PREVIOUS_STATES[target]) == ((source, target) in KAFKA_TRANSITIONS)


def test_join_without_member_id_gets_generated_id_and_member_id_required(driver):
    response = driver.join(client_id="consumer-1")
    assert response.error_code == errors.MemberIdRequired.code
    assert response.member_id == "consumer-1-0001"
    assert driver.coordinator.group_state(GROUP) is GroupState.EMPTY
    joined = driver.join(member_id=response.member_id, client_id="consumer-1")
    assert joined.error_code == 0
    assert joined.generation_id == 1
    assert joined.leader == joined.member_id == "consumer-1-0001"
    assert joined.protocol_name == "range"
    assert [m.member_id for m in joined.members] == ["consumer-1-0001"]
    assert driver.coordinator.group_state(GROUP) is GroupState.COMPLETING_REBALANCE


def test_join_before_v4_joins_without_handshake(driver):
    response = driver.join(require_known_member_id=False)
    assert response.error_code == 0 and response.generation_id == 1


def test_pending_member_expires_after_session_timeout(driver):
    pending_id = driver.join().member_id
    driver.advance(SESSION_TIMEOUT_MS)
    assert driver.join(member_id=pending_id).error_code == errors.UnknownMemberId.code


@pytest.mark.parametrize("session_timeout_ms", [5999, 1_800_001])
def test_session_timeout_outside_bounds_is_rejected(driver, session_timeout_ms):
    response = driver.join(session_timeout_ms=session_timeout_ms)
    assert response.error_code == errors.InvalidSessionTimeout.code


def test_empty_group_id_is_invalid(driver):
    assert driver.join(group="").error_code == errors.InvalidGroupId.code


def test_join_with_unknown_member_id(driver):
    assert driver.join(member_id="ghost").error_code == errors.UnknownMemberId.code
    driver.join_new()
    assert driver.join(member_id="ghost").error_code == errors.UnknownMemberId.code


def test_inconsistent_protocols_are_rejected(driver):
    assert driver.join(protocol_type="").error_code == errors.InconsistentGroupProtocol.code
    assert driver.join(protocols=()).error_code == errors.InconsistentGroupProtocol.code
    driver.join_new(protocols=consumer_protocols(names=("range",)))
    other = driver.join(protocols=consumer_protocols(names=("roundrobin",)))
    assert other.error_code == errors.InconsistentGroupProtocol.code
    wrong_type = driver.join(protocol_type="connect")
    assert wrong_type.error_code == errors.InconsistentGroupProtocol.code


def test_protocol_is_chosen_by_vote_among_common_protocols():
    driver = Driver(CoordinatorConfig(group_initial_rebalance_delay_ms=1000))
    preferences = [
        ("range", "roundrobin"),
        ("roundrobin", "range"),
        ("roundrobin", "sticky", "range"),
    ]
    parked = []
    for index, names in enumerate(preferences):
        _, response = driver.join_new(
            client_id=f"c{index}", protocols=consumer_protocols(names=names)
        )
        parked.append(response)
    driver.advance(1000)
    driver.advance(1000)
    results = [driver.result(p) for p in parked]
    assert {r.protocol_name for r in results} == {"roundrobin"}
    assert {r.generation_id for r in results} == {1}


def test_group_max_size_reached():
    driver = Driver(CoordinatorConfig(group_initial_rebalance_delay_ms=0, group_max_size=2))
    driver.join_new(client_id="a")
    driver.join_new(client_id="b")
    assert driver.join(client_id="c").error_code == errors.GroupMaxSizeReached.code


def test_initial_rebalance_delay_collects_members_into_one_generation():
    driver = Driver(CoordinatorConfig(group_initial_rebalance_delay_ms=3000))
    parked = []
    for index in range(3):
        _, response = driver.join_new(client_id=f"c{index}")
        assert isinstance(response, Pending)
        parked.append(response)
        driver.advance(1000)
    # t=3000: a member arrived during the delay, so the delay is extended once more
    assert [driver.result(p) for p in parked] == [None, None, None]
    driver.advance(2999)
    assert [driver.result(p) for p in parked] == [None, None, None]
    driver.advance(1)
    results = [driver.result(p) for p in parked]
    assert {r.generation_id for r in results} == {1}
    leaders = [r for r in results if r.members]
    assert len(leaders) == 1 and len(leaders[0].members) == 3
    assert all(r.leader == leaders[0].member_id for r in results)


def test_sync_distributes_the_leaders_assignment_and_followers_wait(driver):
    members, leader, generation = form_group(driver, 2)
    follower = next(m for m in members if m != leader)
    parked = driver.sync(follower, generation)
    assert isinstance(parked, Pending) and driver.result(parked) is None
    assignments = {leader: b"to-leader", follower: b"to-follower"}
    leader_response = driver.sync(leader, generation, assignments)
    assert leader_response.error_code == 0 and leader_response.assignment == b"to-leader"
    follower_response = driver.result(parked)
    assert follower_response.error_code == 0 and follower_response.assignment == b"to-follower"
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    again = driver.sync(follower, generation)
    assert again.assignment == b"to-follower" and again.protocol_name == "range"
    records = driver.appended[driver.coordinator.partition_for(GROUP)]
    key, value = records[-1]
    assert decode_key(key) == GroupMetadataKey(GROUP)
    stored = decode_group_metadata_value(value)
    assert stored.generation_id == generation and stored.leader_id == leader
    assert {m.member_id: m.assignment for m in stored.members} == assignments


def test_sync_errors(driver):
    members, leader, generation = form_group(driver, 1)
    assert driver.sync("ghost", generation).error_code == errors.UnknownMemberId.code
    assert driver.sync(leader, generation + 1).error_code == errors.IllegalGeneration.code
    assert driver.sync(leader, generation, group="nope").error_code == errors.UnknownMemberId.code
    wrong_protocol = driver.call(
        SyncGroupRequest(GROUP, leader, generation, {}, protocol_name="roundrobin")
    )
    assert wrong_protocol.error_code == errors.InconsistentGroupProtocol.code
    driver.sync(leader, generation, {leader: b""})
    driver.join_new(client_id="late")
    assert driver.coordinator.group_state(GROUP) is GroupState.PREPARING_REBALANCE
    assert driver.sync(leader, generation).error_code == errors.RebalanceInProgress.code


def test_parked_syncs_get_rebalance_in_progress_when_a_rebalance_starts(driver):
    members, leader, generation = form_group(driver, 2)
    follower = next(m for m in members if m != leader)
    parked = driver.sync(follower, generation)
    driver.join_new(client_id="newcomer")
    assert driver.result(parked).error_code == errors.RebalanceInProgress.code


def test_heartbeat_errors_and_rebalance_signal(driver):
    members, leader, generation = form_group(driver, 1)
    assert driver.heartbeat(leader, generation) == 0  # CompletingRebalance
    driver.sync(leader, generation, {leader: b"a"})
    assert driver.heartbeat(leader, generation) == 0
    assert driver.heartbeat(leader, generation - 1) == errors.IllegalGeneration.code
    assert driver.heartbeat("ghost", generation) == errors.UnknownMemberId.code
    assert driver.heartbeat(leader, generation, group="other") == errors.UnknownMemberId.code
    driver.join_new(client_id="newcomer")
    assert driver.heartbeat(leader, generation) == errors.RebalanceInProgress.code
    rejoined = driver.result(driver.join(member_id=leader, client_id="c0"))
    assert rejoined.generation_id == generation + 1
    assert len(rejoined.members) == 2


def test_leave_group_batch_with_per_member_errors(driver):
    members, leader, generation = form_group(driver, 3)
    driver.sync(leader, generation, {m: b"" for m in members})
    request = LeaveGroupRequest(
        GROUP, (MemberIdentity(members[0]), MemberIdentity(members[1]), MemberIdentity("ghost"))
    )
    response = driver.call(request)
    assert response.error_code == 0
    assert [m.error_code for m in response.members] == [0, 0, errors.UnknownMemberId.code]
    survivor = members[2]
    assert driver.heartbeat(survivor, generation) == errors.RebalanceInProgress.code
    rejoined = driver.result(driver.join(member_id=survivor, client_id="c2"))
    assert rejoined.leader == survivor and rejoined.generation_id == generation + 1


def test_last_member_leaving_empties_the_group(driver):
    members, leader, generation = form_group(driver, 1)
    driver.sync(leader, generation, {leader: b""})
    response = driver.call(LeaveGroupRequest(GROUP, (MemberIdentity(leader),)))
    assert response.members[0].error_code == 0
    assert driver.coordinator.group_state(GROUP) is GroupState.EMPTY
    stored = decode_group_metadata_value(
        driver.appended[driver.coordinator.partition_for(GROUP)][-1][1]
    )
    assert stored.generation_id == generation + 1 and stored.members == ()


def test_leave_unknown_group_reports_unknown_member(driver):
    response = driver.call(LeaveGroupRequest("nobody", (MemberIdentity("m"),)))
    assert response.error_code == 0
    assert response.members[0].error_code == errors.UnknownMemberId.code


def test_member_that_stops_heartbeating_is_removed_and_the_group_rebalances(driver):
    members, leader, generation = form_group(driver, 2)
    driver.sync(leader, generation, {m: b"" for m in members})
    silent, alive = members[0], members[1]
    driver.advance(SESSION_TIMEOUT_MS // 2)
    assert driver.heartbeat(alive, generation) == 0
    driver.advance(SESSION_TIMEOUT_MS // 2)  # a full session since the silent member's sync
    assert driver.heartbeat(silent, generation) == errors.UnknownMemberId.code
    assert driver.heartbeat(alive, generation) == errors.RebalanceInProgress.code
    rejoined = driver.result(driver.join(member_id=alive, client_id="c1"))
    assert rejoined.generation_id == generation + 1
    assert [m.member_id for m in rejoined.members] == [alive]


def test_member_that_does_not_rejoin_within_rebalance_timeout_is_removed(driver):
    members, leader, generation = form_group(driver, 2)
    driver.sync(leader, generation, {m: b"" for m in members})
    follower = next(m for m in members if m != leader)
    rejoining = driver.join(member_id=leader, client_id=leader.rsplit("-", 1)[0])
    assert driver.result(rejoining) is None
    for _ in range(REBALANCE_TIMEOUT_MS // 5000 - 1):
        driver.advance(5000)
        driver.heartbeat(follower, generation)  # heartbeats alone do not rejoin
    assert driver.result(rejoining) is None
    driver.advance(5000)
    response = driver.result(rejoining)
    assert response.generation_id == generation + 1
    assert [m.member_id for m in response.members] == [leader]
    assert driver.heartbeat(follower, generation) == errors.UnknownMemberId.code


def test_static_member_rejoin_replaces_member_id_without_rebalance(driver):
    first_id_response = driver.result(driver.join(instance_id="instance-a", client_id="a"))
    old_id, generation = first_id_response.member_id, first_id_response.generation_id
    other_id, _ = driver.join_new(client_id="b")
    rejoin_all(driver, [old_id, other_id])
    generation += 1
    driver.sync(old_id, generation, {old_id: b"A", other_id: b"B"})
    driver.sync(other_id, generation)
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    rejoin = driver.result(driver.join(instance_id="instance-a", client_id="a"))
    assert rejoin.error_code == 0 and rejoin.member_id != old_id
    assert rejoin.generation_id == generation
    assert rejoin.skip_assignment and rejoin.leader == rejoin.member_id
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    assert driver.sync(rejoin.member_id, generation, instance_id="instance-a").assignment == b"A"
    fenced = driver.heartbeat(old_id, generation, instance_id="instance-a")
    assert fenced == errors.FencedInstanceId.code
    assert driver.heartbeat(other_id, generation) == 0
    fenced_join = driver.join(member_id=old_id, instance_id="instance-a", client_id="a")
    assert fenced_join.error_code == errors.FencedInstanceId.code


def test_static_member_rejoin_with_new_protocol_triggers_rebalance(driver):
    joined = driver.result(driver.join(instance_id="i", client_id="a"))
    driver.sync(joined.member_id, joined.generation_id, {joined.member_id: b""})
    changed = consumer_protocols(names=("roundrobin", "range"))
    parked = driver.join(instance_id="i", client_id="a", protocols=changed)
    response = driver.result(parked)
    assert isinstance(response, JoinGroupResponse) and response.protocol_name == "roundrobin"
    assert response.generation_id == joined.generation_id + 1


def test_static_member_survives_rebalance_timeout_without_rejoining(driver):
    static = driver.result(driver.join(instance_id="i", client_id="a"))
    dynamic_id, _ = driver.join_new(client_id="b")
    parked = driver.join(member_id=dynamic_id, client_id="b")
    for _ in range(REBALANCE_TIMEOUT_MS // 5000 - 1):
        driver.advance(5000)
        heartbeat = driver.heartbeat(static.member_id, static.generation_id, instance_id="i")
        assert heartbeat == errors.RebalanceInProgress.code
    driver.advance(5000)
    response = driver.result(parked)
    assert response.leader == dynamic_id
    assert response.generation_id == static.generation_id + 1
    assert driver.heartbeat(static.member_id, response.generation_id, instance_id="i") == 0


def test_three_members_share_six_partitions_with_the_range_assignor(driver):
    partitions = {"orders": 6}
    members, leader, generation = form_group(driver, 3)
    ownership = run_generation(driver, members, leader, generation, partitions)
    assert sorted(ownership) == [("orders", p) for p in range(6)]
    assert sorted(ownership.values()) == sorted(members * 2)
    # member 0 goes silent; the other two keep heartbeating and rebalance
    alive = members[1:]
    for _ in range(4):
        driver.advance(3000)
        for member_id in alive:
            driver.heartbeat(member_id, generation)
    responses = rejoin_all(driver, alive)
    new_generation = responses[0].generation_id
    assert new_generation == generation + 1
    new_leader = responses[0].leader
    ownership = run_generation(driver, alive, new_leader, new_generation, partitions)
    assert sorted(ownership) == [("orders", p) for p in range(6)]
    assert sorted(ownership.values()) == sorted(alive * 3)


def run_generation(driver, members, leader, generation, partitions_per_topic):
    """The leader computes a range assignment from its JoinGroup member list; everyone syncs."""
    leader_view = driver.result(driver.join(member_id=leader, client_id=leader.rsplit("-", 1)[0]))
    assert leader_view.generation_id == generation and leader_view.leader == leader
    assignor_members = [
        AssignorMember(m.member_id, decode_subscription(m.metadata), m.group_instance_id)
        for m in leader_view.members
    ]
    plan = range_assign(partitions_per_topic, assignor_members)
    parked = [driver.sync(m, generation) for m in members if m != leader]
    encoded = {m: encode_assignment(a) for m, a in plan.items()}
    results = [driver.sync(leader, generation, encoded)] + [driver.result(p) for p in parked]
    ownership = {}
    for member_id, result in zip(
        [leader] + [m for m in members if m != leader], results, strict=True
    ):
        assert result.error_code == 0
        for tp in decode_assignment(result.assignment).topic_partitions():
            assert tp not in ownership
            ownership[tp] = member_id
    return ownership
