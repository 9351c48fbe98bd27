"""In a cluster the coordinator owns only the offsets partitions its broker leads: requests for
other groups answer NOT_COORDINATOR, a partition being loaded COORDINATOR_LOAD_IN_PROGRESS, and
a partition whose leadership is lost unloads its groups, answering parked requests
NOT_COORDINATOR (Kafka's GroupMetadataManager.removeGroupsForPartition)."""

from __future__ import annotations

import itertools

from coordinator_driver import GROUP, Driver

from headrace import errors
from headrace.coordinator.config import CoordinatorConfig
from headrace.coordinator.coordinator import GroupCoordinator
from headrace.coordinator.group import GroupState
from headrace.coordinator.messages import OffsetFetchRequest


def cluster_driver() -> Driver:
    driver = Driver()
    ids = itertools.count(1)
    driver.coordinator = GroupCoordinator(
        CoordinatorConfig(group_initial_rebalance_delay_ms=0),
        member_id_factory=lambda client_id: f"{client_id}-{next(ids):04d}",
        owns_every_partition=False)
    return driver


def own(driver: Driver, partition: int) -> None:
    driver.coordinator.begin_loading(partition)
    driver.coordinator.finish_loading(partition, driver.now_ms)


def test_groups_of_partitions_not_led_here_answer_not_coordinator():
    driver = cluster_driver()
    assert driver.join().error_code == errors.NotCoordinator.code
    fetched = driver.call(OffsetFetchRequest(GROUP, None))
    assert fetched.error_code == errors.NotCoordinator.code


def test_a_partition_being_loaded_answers_load_in_progress_then_serves():
    driver = cluster_driver()
    partition = driver.coordinator.partition_for(GROUP)
    driver.coordinator.begin_loading(partition)
    assert driver.join().error_code == errors.CoordinatorLoadInProgress.code
    driver.coordinator.finish_loading(partition, driver.now_ms)
    assert driver.join().error_code == errors.MemberIdRequired.code


def test_unloading_drops_the_groups_and_answers_parked_joins_not_coordinator():
    driver = cluster_driver()
    partition = driver.coordinator.partition_for(GROUP)
    own(driver, partition)
    first_id, _ = driver.join_new(client_id="first")
    second = driver.join(client_id="second")  # a second member: the group rebalances
    second_id = second.member_id
    parked = driver.join(member_id=second_id, client_id="second")
    assert driver.result(parked) is None  # waits for the first member to rejoin
    driver.carry_out(driver.coordinator.unload_partition(partition, driver.now_ms))
    assert driver.result(parked).error_code == errors.NotCoordinator.code
    assert driver.coordinator.group_state(GROUP) is GroupState.DEAD
    assert driver.heartbeat(first_id, 1) == errors.NotCoordinator.code
    assert driver.coordinator.group_ids() == []


def test_a_single_node_owns_every_partition():
    driver = Driver()
    assert driver.join().error_code == errors.MemberIdRequired.code
