"""Static membership (KIP-345): a known group.instance.id that rejoins a Stable group with an
unknown member id takes a new member id without a rebalance, and is answered only once the
group record carrying that id is appended to ``__consumer_offsets``. A failed append gives the
instance back to its old member id, which keeps working, and answers Kafka's mapped error."""

from __future__ import annotations

import pytest
from coordinator_driver import GROUP, GROUP_APPEND_ERRORS, consumer_protocols, rejoin_all

from headrace import errors
from headrace.coordinator.group import GroupState
from headrace.coordinator.messages import (
    DescribeGroupsRequest,
    LeaveGroupRequest,
    MemberIdentity,
    Pending,
)
from headrace.coordinator.records import decode_group_metadata_value
from headrace.protocol.consumer_protocol import decode_subscription

INSTANCE = "instance-a"
REJOIN_TOPICS = ("orders", "refunds")


def stable_group_with_static_leader(driver):
    """A Stable two-member group: the static leader (assigned b"A") and a dynamic follower."""
    first = driver.result(driver.join(instance_id=INSTANCE, client_id="a"))
    static_id = first.member_id
    follower_id, _ = driver.join_new(client_id="b")
    generation = rejoin_all(driver, [static_id, follower_id])[0].generation_id
    driver.sync(static_id, generation, {static_id: b"A", follower_id: b"B"}, instance_id=INSTANCE)
    driver.sync(follower_id, generation)
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    return static_id, follower_id, generation


def rejoin_parked(driver, **kwargs):
    """The static member's restart: a join with its instance id and no member id, held
    while its append is in flight."""
    driver.hold_appends = True
    parked = driver.join(
        instance_id=INSTANCE, client_id="a-restarted",
        protocols=consumer_protocols(topics=REJOIN_TOPICS), **kwargs,
    )
    assert isinstance(parked, Pending) and driver.result(parked) is None
    assert len(driver.in_flight) == 1
    return parked


def stored_member_ids(driver):
    _key, value = driver.appended[driver.coordinator.partition_for(GROUP)][-1]
    return [member.member_id for member in decode_group_metadata_value(value).members]


def described_static_member(driver):
    group = driver.call(DescribeGroupsRequest((GROUP,))).groups[0]
    return next(m for m in group.members if m.group_instance_id == INSTANCE)


def test_rejoin_is_answered_after_its_new_member_id_is_stored(driver):
    old_id, follower_id, generation = stable_group_with_static_leader(driver)
    parked = rejoin_parked(driver)
    new_id = next(m for m in stored_member_ids(driver) if m != follower_id)
    assert new_id != old_id
    assert driver.heartbeat(old_id, generation, instance_id=INSTANCE) == (
        errors.FencedInstanceId.code
    )
    driver.finish_appends()
    response = driver.result(parked)
    assert (response.error_code, response.member_id, response.generation_id) == (
        0, new_id, generation
    )
    assert response.skip_assignment and response.leader == new_id
    assert {m.member_id for m in response.members} == {new_id, follower_id}
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    assert driver.sync(new_id, generation, instance_id=INSTANCE).assignment == b"A"
    assert driver.heartbeat(new_id, generation, instance_id=INSTANCE) == 0
    assert driver.heartbeat(old_id, generation, instance_id=INSTANCE) == (
        errors.FencedInstanceId.code
    )
    assert driver.heartbeat(follower_id, generation) == 0


@pytest.mark.parametrize(("append_error", "client_error"), GROUP_APPEND_ERRORS)
def test_failed_append_reverts_to_the_old_member_id(driver, append_error, client_error):
    old_id, follower_id, generation = stable_group_with_static_leader(driver)
    parked = rejoin_parked(driver)
    driver.finish_appends(append_error.code)
    response = driver.result(parked)
    assert (response.error_code, response.member_id, response.generation_id) == (
        client_error.code, "", generation
    )
    assert response.leader == old_id and response.members == ()
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    assert driver.heartbeat(old_id, generation, instance_id=INSTANCE) == 0
    assert driver.sync(old_id, generation, instance_id=INSTANCE).assignment == b"A"
    restored = described_static_member(driver)
    assert (restored.member_id, restored.client_id) == (old_id, "a")
    assert decode_subscription(restored.metadata).topics == ("orders",)
    assert driver.heartbeat(follower_id, generation) == 0


def test_reverted_member_keeps_its_session_and_a_later_rejoin_fences_it(driver):
    old_id, _, generation = stable_group_with_static_leader(driver)
    rejoin_parked(driver)
    driver.finish_appends(errors.NotLeaderOrFollower.code)
    driver.hold_appends = False
    driver.advance(9_000)  # within the 10 s session, counted from the revert
    assert driver.heartbeat(old_id, generation, instance_id=INSTANCE) == 0
    retried = driver.result(driver.join(instance_id=INSTANCE, client_id="a-restarted"))
    assert retried.error_code == 0 and retried.member_id not in ("", old_id)
    assert driver.heartbeat(old_id, generation, instance_id=INSTANCE) == (
        errors.FencedInstanceId.code
    )
    assert driver.heartbeat(retried.member_id, generation, instance_id=INSTANCE) == 0


def test_before_v9_the_rejoined_leader_is_not_named_leader(driver):
    old_id, _, _generation = stable_group_with_static_leader(driver)
    parked = rejoin_parked(driver, supports_skip_assignment=False)
    driver.finish_appends()
    response = driver.result(parked)
    assert response.error_code == 0 and response.member_id not in ("", old_id)
    assert response.leader == old_id and response.members == ()
    assert not response.skip_assignment


def test_rejoin_answered_by_a_rebalance_is_not_reverted_by_its_append(driver):
    old_id, follower_id, generation = stable_group_with_static_leader(driver)
    parked = rejoin_parked(driver)
    left = driver.call(LeaveGroupRequest(GROUP, (MemberIdentity(follower_id),)))
    assert left.members[0].error_code == 0
    rebalanced = driver.result(parked)
    assert rebalanced.error_code == 0 and rebalanced.generation_id == generation + 1
    driver.finish_appends(errors.NotLeaderOrFollower.code)
    assert driver.result(parked) is rebalanced
    assert described_static_member(driver).member_id == rebalanced.member_id
    assert driver.heartbeat(old_id, generation + 1, instance_id=INSTANCE) == (
        errors.FencedInstanceId.code
    )
