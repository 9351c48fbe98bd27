"""OffsetCommit / OffsetFetch / OffsetDelete, retention, the admin calls, and loading."""

from __future__ import annotations

from coordinator_driver import GROUP, Driver, consumer_protocols, form_group

from headrace import errors
from headrace.coordinator.config import CoordinatorConfig
from headrace.coordinator.coordinator import GroupCoordinator
from headrace.coordinator.group import GroupState
from headrace.coordinator.messages import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    FetchedOffset,
    JoinGroupRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    MemberIdentity,
    OffsetDeleteRequest,
    OffsetFetchRequest,
)
from headrace.coordinator.records import (
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_key,
    decode_offset_commit_value,
)

ORDERS_0, ORDERS_1, AUDIT_0 = ("orders", 0), ("orders", 1), ("audit", 0)
MINUTE_MS = 60_000


def fetch(driver, partitions=None, group=GROUP):
    return driver.call(OffsetFetchRequest(group, partitions))


def stable_group(driver, topics=("orders",)):
    members, leader, generation = form_group(driver, 1, topics=topics)
    driver.sync(leader, generation, {leader: b""})
    return leader, generation


def keep_alive(driver, member_id, generation, duration_ms, interval_ms=5000):
    for _ in range(duration_ms // interval_ms):
        driver.advance(interval_ms)
        assert driver.heartbeat(member_id, generation) == 0


def test_simple_commit_without_membership_is_stored_and_persisted(driver):
    errors_by_tp = driver.commit({ORDERS_0: (10, 3, "note"), ORDERS_1: (20,)})
    assert errors_by_tp == {ORDERS_0: 0, ORDERS_1: 0}
    fetched = fetch(driver, (ORDERS_0, ORDERS_1, AUDIT_0))
    assert fetched.error_code == 0
    assert fetched.offsets == {
        ORDERS_0: FetchedOffset(10, 3, "note"),
        ORDERS_1: FetchedOffset(20, -1, ""),
        AUDIT_0: FetchedOffset(-1, -1, ""),
    }
    assert fetch(driver).offsets.keys() == {ORDERS_0, ORDERS_1}
    records = driver.appended[driver.coordinator.partition_for(GROUP)]
    assert [decode_key(k) for k, _ in records] == [
        OffsetCommitKey(GROUP, "orders", 0),
        OffsetCommitKey(GROUP, "orders", 1),
    ]
    assert decode_offset_commit_value(records[0][1]) == OffsetCommitValue(10, 3, "note", 0)


def test_fetch_for_unknown_group_returns_no_offsets(driver):
    assert fetch(driver, (ORDERS_0,)).offsets == {ORDERS_0: FetchedOffset(-1, -1, "")}
    assert fetch(driver).offsets == {}


def test_commit_with_generation_for_unknown_group_is_illegal_generation(driver):
    assert driver.commit({ORDERS_0: (1,)}, generation_id=3, member_id="m") == {
        ORDERS_0: errors.IllegalGeneration.code
    }


def test_metadata_over_the_limit_fails_only_that_partition():
    driver = Driver(
        CoordinatorConfig(group_initial_rebalance_delay_ms=0, offset_metadata_max_bytes=8)
    )
    result = driver.commit({ORDERS_0: (1, -1, "x" * 9), ORDERS_1: (2, -1, "y" * 8)})
    assert result == {ORDERS_0: errors.OffsetMetadataTooLarge.code, ORDERS_1: 0}
    assert fetch(driver, (ORDERS_0,)).offsets[ORDERS_0].offset == -1


def test_member_commit_checks(driver):
    leader, generation = stable_group(driver)
    assert driver.commit({ORDERS_0: (5,)}, generation, leader) == {ORDERS_0: 0}
    assert driver.commit({ORDERS_0: (6,)}) == {ORDERS_0: errors.UnknownMemberId.code}
    assert driver.commit({ORDERS_0: (6,)}, generation, "ghost") == {
        ORDERS_0: errors.UnknownMemberId.code
    }
    assert driver.commit({ORDERS_0: (6,)}, generation + 1, leader) == {
        ORDERS_0: errors.IllegalGeneration.code
    }
    driver.join_new(client_id="newcomer")  # PreparingRebalance: commits still allowed
    assert driver.commit({ORDERS_0: (7,)}, generation, leader) == {ORDERS_0: 0}
    rejoined = driver.result(driver.join(member_id=leader, client_id="c0"))
    assert driver.coordinator.group_state(GROUP) is GroupState.COMPLETING_REBALANCE
    assert driver.commit({ORDERS_0: (8,)}, rejoined.generation_id, leader) == {
        ORDERS_0: errors.RebalanceInProgress.code
    }
    assert fetch(driver, (ORDERS_0,)).offsets[ORDERS_0].offset == 7


def test_commit_from_fenced_static_member(driver):
    joined = driver.result(driver.join(instance_id="i", client_id="a"))
    driver.sync(joined.member_id, joined.generation_id, {joined.member_id: b""})
    replacement = driver.result(driver.join(instance_id="i", client_id="a"))
    assert replacement.member_id != joined.member_id
    result = driver.commit(
        {ORDERS_0: (1,)}, joined.generation_id, joined.member_id, instance_id="i"
    )
    assert result == {ORDERS_0: errors.FencedInstanceId.code}


def test_offsets_expire_after_retention_once_the_group_is_empty():
    config = CoordinatorConfig(
        group_initial_rebalance_delay_ms=0,
        offsets_retention_minutes=10,
        offsets_retention_check_interval_ms=MINUTE_MS,
    )
    driver = Driver(config)
    leader, generation = stable_group(driver)
    driver.commit({ORDERS_0: (5,)}, generation, leader)
    keep_alive(driver, leader, generation, 3 * MINUTE_MS)
    driver.call(LeaveGroupRequest(GROUP, (MemberIdentity(leader),)))  # empty since t = 3 min
    driver.advance(9 * MINUTE_MS)
    assert fetch(driver, (ORDERS_0,)).offsets[ORDERS_0].offset == 5
    driver.advance(MINUTE_MS)
    assert fetch(driver, (ORDERS_0,)).offsets[ORDERS_0].offset == -1
    assert driver.coordinator.group_state(GROUP) is GroupState.DEAD
    tail = driver.appended[driver.coordinator.partition_for(GROUP)][-2:]
    assert [(decode_key(k), v) for k, v in tail] == [
        (OffsetCommitKey(GROUP, "orders", 0), None),
        (GroupMetadataKey(GROUP), None),
    ]


def test_stable_consumer_group_expires_only_unsubscribed_topics():
    config = CoordinatorConfig(
        group_initial_rebalance_delay_ms=0,
        offsets_retention_minutes=1,
        offsets_retention_check_interval_ms=MINUTE_MS,
    )
    driver = Driver(config)
    members, leader, generation = form_group(driver, 1)
    driver.sync(leader, generation, {leader: b""})
    driver.commit({ORDERS_0: (1,), AUDIT_0: (2,)}, generation, leader)
    keep_alive(driver, leader, generation, 3 * MINUTE_MS)
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE
    offsets = fetch(driver).offsets
    assert offsets.keys() == {ORDERS_0}


def test_offset_delete(driver):
    missing = driver.call(OffsetDeleteRequest("nobody", (ORDERS_0,)))
    assert missing.error_code == errors.GroupIdNotFound.code
    leader, generation = stable_group(driver)
    driver.commit({ORDERS_0: (1,), AUDIT_0: (2,)}, generation, leader)
    response = driver.call(OffsetDeleteRequest(GROUP, (ORDERS_0, AUDIT_0)))
    assert response.error_code == 0
    assert response.partition_errors == {
        ORDERS_0: errors.GroupSubscribedToTopic.code,
        AUDIT_0: 0,
    }
    assert fetch(driver).offsets.keys() == {ORDERS_0}
    key, value = driver.appended[driver.coordinator.partition_for(GROUP)][-1]
    assert decode_key(key) == OffsetCommitKey(GROUP, "audit", 0) and value is None
    driver.call(LeaveGroupRequest(GROUP, (MemberIdentity(leader),)))
    emptied = driver.call(OffsetDeleteRequest(GROUP, (ORDERS_0,)))
    assert emptied.partition_errors == {ORDERS_0: 0}
    assert fetch(driver).offsets == {}


def test_offset_delete_on_a_non_consumer_group_with_members(driver):
    joined = driver.result(driver.join(protocol_type="connect", require_known_member_id=False))
    assert joined.error_code == 0
    response = driver.call(OffsetDeleteRequest(GROUP, (ORDERS_0,)))
    assert response.error_code == errors.NonEmptyGroup.code


def test_list_and_describe_groups(driver):
    leader, generation = stable_group(driver)
    driver.commit({ORDERS_0: (1,)}, group="standalone")
    everything = driver.call(ListGroupsRequest())
    assert [(g.group_id, g.protocol_type, g.state) for g in everything.groups] == [
        (GROUP, "consumer", "Stable"),
        ("standalone", "", "Empty"),
    ]
    only_empty = driver.call(ListGroupsRequest(frozenset({"empty"})))
    assert [g.group_id for g in only_empty.groups] == ["standalone"]
    described = driver.call(DescribeGroupsRequest((GROUP, "ghost"))).groups
    assert described[0].state == "Stable" and described[0].protocol_data == "range"
    assert described[0].members[0].member_id == leader
    assert described[0].members[0].metadata == consumer_protocols()[0][1]
    assert (described[1].error_code, described[1].state) == (0, "Dead")


def test_delete_groups(driver):
    leader, generation = stable_group(driver)
    driver.commit({ORDERS_0: (4,)}, group="finished")
    response = driver.call(DeleteGroupsRequest((GROUP, "finished", "ghost")))
    assert response.results == {
        GROUP: errors.NonEmptyGroup.code,
        "finished": 0,
        "ghost": errors.GroupIdNotFound.code,
    }
    assert driver.coordinator.group_state("finished") is GroupState.DEAD
    assert fetch(driver, (ORDERS_0,), group="finished").offsets[ORDERS_0].offset == -1
    tail = driver.appended[driver.coordinator.partition_for("finished")][-2:]
    assert [(decode_key(k), v) for k, v in tail] == [
        (OffsetCommitKey("finished", "orders", 0), None),
        (GroupMetadataKey("finished"), None),
    ]


def test_loading_rebuilds_groups_and_offsets_and_respects_tombstones(driver):
    leader, generation = stable_group(driver)
    driver.commit({ORDERS_0: (11,), ORDERS_1: (12, 4, "meta")}, generation, leader)
    driver.commit({ORDERS_0: (13,)}, generation, leader)
    driver.call(OffsetDeleteRequest(GROUP, (AUDIT_0,)))
    driver.commit({AUDIT_0: (1,)}, group="gone")
    driver.call(DeleteGroupsRequest(("gone",)))
    restarted = Driver()
    for partition, records in driver.appended.items():
        restarted.coordinator.load_partition(partition, records)
        restarted.coordinator.finish_loading(partition, now_ms=0)
    assert fetch(restarted).offsets == {
        ORDERS_0: FetchedOffset(13, -1, ""),
        ORDERS_1: FetchedOffset(12, 4, "meta"),
    }
    assert restarted.coordinator.group_ids() == [GROUP]
    assert restarted.coordinator.group_state(GROUP) is GroupState.STABLE
    assert restarted.heartbeat(leader, generation) == 0
    assert restarted.sync(leader, generation).error_code == 0
    original = driver.call(DescribeGroupsRequest((GROUP,)))
    assert restarted.call(DescribeGroupsRequest((GROUP,))) == original


def test_requests_during_loading_answer_coordinator_load_in_progress():
    coordinator = GroupCoordinator(CoordinatorConfig(group_initial_rebalance_delay_ms=0))
    partition = coordinator.partition_for(GROUP)
    coordinator.begin_loading(partition)
    loading = errors.CoordinatorLoadInProgress.code
    join = JoinGroupRequest(GROUP, "", "consumer", consumer_protocols(), 10_000, 30_000)
    assert coordinator.join_group(join, 0).response.error_code == loading
    assert coordinator.handle(OffsetFetchRequest(GROUP), 0).response.error_code == loading
    assert coordinator.handle(ListGroupsRequest(), 0).response.error_code == loading
    described = coordinator.handle(DescribeGroupsRequest((GROUP,)), 0).response
    assert described.groups[0].error_code == loading
    coordinator.finish_loading(partition, now_ms=0)
    assert coordinator.join_group(join, 0).response.error_code == errors.MemberIdRequired.code
