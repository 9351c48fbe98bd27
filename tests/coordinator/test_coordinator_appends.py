"""Durability before visibility: offset commits and SyncGroup assignments take effect only when
their ``__consumer_offsets`` append succeeds; failed appends roll back and answer Kafka's
mapped error codes; the loader counts the records it replays."""

from __future__ import annotations

import pytest
from coordinator_driver import GROUP, GROUP_APPEND_ERRORS, form_group

from headrace import errors
from headrace.coordinator.coordinator import commit_append_error_code, group_append_error_code
from headrace.coordinator.group import CommittedOffset, GroupState
from headrace.coordinator.messages import (
    FetchedOffset,
    ListGroupsRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    Pending,
)
from headrace.coordinator.store import offset_commit_record, offset_tombstone

ORDERS_0, ORDERS_1 = ("orders", 0), ("orders", 1)


def fetch(driver, partitions=(ORDERS_0, ORDERS_1)):
    response = driver.call(OffsetFetchRequest(GROUP, partitions))
    assert response.error_code == 0
    return response.offsets


def commit_parked(driver, offsets, metadata=""):
    request = OffsetCommitRequest(
        GROUP, {tp: OffsetAndMetadata(offset, metadata=metadata) for tp, offset in offsets.items()}
    )
    response = driver.call(request)
    assert isinstance(response, Pending)
    assert driver.result(response) is None
    return response


@pytest.mark.parametrize(
    ("append_error", "client_error"),
    [
        (errors.UnknownTopicOrPartition, errors.CoordinatorNotAvailable),
        (errors.NotEnoughReplicas, errors.CoordinatorNotAvailable),
        (errors.NotLeaderOrFollower, errors.NotCoordinator),
        (errors.KafkaStorageError, errors.NotCoordinator),
        (errors.MessageTooLarge, errors.InvalidCommitOffsetSize),
        (errors.RecordListTooLarge, errors.InvalidCommitOffsetSize),
        (errors.InvalidFetchSize, errors.InvalidCommitOffsetSize),
        (errors.RequestTimedOut, errors.RequestTimedOut),
        (errors.CorruptMessage, errors.UnknownServerError),
    ],
)
def test_failed_commit_append_leaves_the_cache_unchanged(driver, append_error, client_error):
    assert driver.commit({ORDERS_0: (5,)}) == {ORDERS_0: 0}
    driver.hold_appends = True
    parked = commit_parked(driver, {ORDERS_0: 9, ORDERS_1: 3})
    driver.finish_appends(append_error.code)
    assert driver.result(parked).partition_errors == {
        ORDERS_0: client_error.code,
        ORDERS_1: client_error.code,
    }
    assert fetch(driver) == {ORDERS_0: FetchedOffset(5, -1, ""), ORDERS_1: FetchedOffset(-1, -1, "")}


def test_too_large_metadata_keeps_its_own_error_when_the_append_fails(driver):
    driver.hold_appends = True
    request = OffsetCommitRequest(
        GROUP,
        {ORDERS_0: OffsetAndMetadata(1), ORDERS_1: OffsetAndMetadata(2, metadata="x" * 4097)},
    )
    parked = driver.call(request)
    driver.finish_appends(errors.MessageTooLarge.code)
    assert driver.result(parked).partition_errors == {
        ORDERS_0: errors.InvalidCommitOffsetSize.code,
        ORDERS_1: errors.OffsetMetadataTooLarge.code,
    }


def test_pending_commit_is_not_visible_until_its_append_succeeds(driver):
    assert driver.commit({ORDERS_0: (5,)}) == {ORDERS_0: 0}
    driver.hold_appends = True
    parked = commit_parked(driver, {ORDERS_0: 9, ORDERS_1: 3}, metadata="m")
    assert fetch(driver) == {ORDERS_0: FetchedOffset(5, -1, ""), ORDERS_1: FetchedOffset(-1, -1, "")}
    assert driver.call(OffsetFetchRequest(GROUP)).offsets.keys() == {ORDERS_0}
    driver.finish_appends()
    assert driver.result(parked).partition_errors == {ORDERS_0: 0, ORDERS_1: 0}
    assert fetch(driver) == {ORDERS_0: FetchedOffset(9, -1, "m"), ORDERS_1: FetchedOffset(3, -1, "m")}


def test_group_created_by_a_failed_commit_does_not_linger(driver):
    driver.hold_appends = True
    commit_parked(driver, {ORDERS_0: 1})
    driver.finish_appends(errors.NotLeaderOrFollower.code)
    assert driver.call(ListGroupsRequest()).groups == ()
    assert driver.coordinator.group_state(GROUP) is GroupState.DEAD


def test_offset_deleted_while_its_commit_is_pending_stays_deleted(driver):
    driver.hold_appends = True
    parked = commit_parked(driver, {ORDERS_0: 7})
    deleted = driver.call(OffsetDeleteRequest(GROUP, (ORDERS_0,)))
    assert deleted.partition_errors == {ORDERS_0: 0}
    driver.finish_appends()
    assert driver.result(parked).partition_errors == {ORDERS_0: 0}
    assert fetch(driver, (ORDERS_0,)) == {ORDERS_0: FetchedOffset(-1, -1, "")}


def test_commits_apply_in_append_order(driver):
    driver.hold_appends = True
    first = commit_parked(driver, {ORDERS_0: 1})
    second = commit_parked(driver, {ORDERS_0: 2})
    driver.finish_appends()
    assert driver.result(first).partition_errors == driver.result(second).partition_errors
    assert fetch(driver, (ORDERS_0,)) == {ORDERS_0: FetchedOffset(2, -1, "")}


def two_member_group_awaiting_sync(driver):
    members, leader, generation = form_group(driver, 2)
    follower = next(m for m in members if m != leader)
    driver.hold_appends = True
    follower_sync = driver.sync(follower, generation)
    leader_sync = driver.sync(leader, generation, {leader: b"L", follower: b"F"})
    assert isinstance(follower_sync, Pending) and isinstance(leader_sync, Pending)
    assert driver.coordinator.group_state(GROUP) is GroupState.COMPLETING_REBALANCE
    return leader, follower, generation, leader_sync, follower_sync


def test_sync_answers_only_after_the_assignment_is_stored(driver):
    leader, follower, generation, leader_sync, follower_sync = two_member_group_awaiting_sync(
        driver
    )
    assert driver.result(leader_sync) is None and driver.result(follower_sync) is None
    assert driver.heartbeat(follower, generation) == 0
    driver.finish_appends()
    assert driver.result(leader_sync).assignment == b"L"
    assert driver.result(follower_sync).assignment == b"F"
    assert driver.coordinator.group_state(GROUP) is GroupState.STABLE


@pytest.mark.parametrize(("append_error", "client_error"), GROUP_APPEND_ERRORS)
def test_failed_sync_append_answers_the_error_and_rebalances(driver, append_error, client_error):
    leader, follower, generation, leader_sync, follower_sync = two_member_group_awaiting_sync(
        driver
    )
    driver.finish_appends(append_error.code)
    assert driver.result(leader_sync).error_code == client_error.code
    assert driver.result(follower_sync).error_code == client_error.code
    assert driver.coordinator.group_state(GROUP) is GroupState.PREPARING_REBALANCE
    assert driver.heartbeat(leader, generation) == errors.RebalanceInProgress.code


def test_assignment_stored_after_the_group_moved_on_is_ignored(driver):
    leader, follower, generation, leader_sync, follower_sync = two_member_group_awaiting_sync(
        driver
    )
    driver.join_new(client_id="late")  # a new member: the group prepares a new rebalance
    assert driver.result(follower_sync).error_code == errors.RebalanceInProgress.code
    driver.finish_appends()
    assert driver.coordinator.group_state(GROUP) is GroupState.PREPARING_REBALANCE
    assert driver.result(leader_sync).error_code == errors.RebalanceInProgress.code


def test_error_mappings_match_kafkas_for_unlisted_codes():
    assert commit_append_error_code(errors.InvalidRecord.code) == errors.UnknownServerError.code
    assert group_append_error_code(errors.RecordListTooLarge.code) == errors.UnknownServerError.code
    assert group_append_error_code(20) == errors.CoordinatorNotAvailable.code


def test_loader_counts_every_replayed_record_tombstones_included(driver):
    coordinator = driver.coordinator
    partition = coordinator.partition_for(GROUP)
    committed = CommittedOffset(3, -1, "", 0)
    records = [offset_commit_record(GROUP, ORDERS_0, committed)] * 5
    records.append(offset_tombstone(GROUP, ORDERS_1))
    coordinator.load_partition(partition, records[:2])
    coordinator.load_partition(partition, records[2:])
    assert coordinator.finish_loading(partition, driver.now_ms) == 6
    assert coordinator.loaded_record_count == 6
    assert fetch(driver, (ORDERS_0,)) == {ORDERS_0: FetchedOffset(3, -1, "")}
