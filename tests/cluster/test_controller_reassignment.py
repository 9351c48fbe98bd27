"""Partition reassignment by the controller against a real ZooKeeper, as Kafka's ZooKeeper-mode
controller does it (KIP-455): RS = ORS + TRS with AR/RR in the assignment znode and a leader
epoch bump, completion once TRS is in the ISR (watched on the state znode: the test writes the
leader's ISR expansion, as a leader does when the new replica caught up), leadership moved into
TRS and RS = TRS; cancellation back to ORS; ListPartitionReassignments; Kafka's validation
errors; a new controller finishing a reassignment its predecessor started. Brokers are kazoo
sessions (the data copy by real followers is tested with broker processes elsewhere)."""

from __future__ import annotations

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.partition_reassignment import ReplicaAssignment
from headrace.errors import (
    InvalidReplicaAssignment,
    NoReassignmentInProgress,
    UnknownTopicOrPartition,
)
from tests.cluster import test_controller as harness
from tests.cluster.cluster_helpers import WAIT_TIMEOUT_S, partition_state, topic_states, wait_until
from tests.cluster.test_controller import active_seeing, write_rf2_topic
from tests.cluster.test_controller_isr_writes import write_isr_as_leader

# the controller tests' fixtures: brokers as kazoo sessions, each with its controller candidate
connect, admin, cluster = harness.connect, harness.admin, harness.cluster


def assignment_of(zk, topic: str) -> records.TopicAssignment:
    zk.sync(paths.topic_path(topic))
    return records.decode_topic_assignment(topic, zk.get(paths.topic_path(topic))[0])


def alter(controller, targets, **options):
    return controller.submit(lambda: controller.alter_partition_reassignments(targets, **options)
                             ).result(WAIT_TIMEOUT_S)


def listed(controller, partitions=None):
    return controller.submit(lambda: controller.list_partition_reassignments(partitions)
                             ).result(WAIT_TIMEOUT_S)


def started_topic(cluster, admin, topic: str, replicas: tuple[int, ...], controllers=(1, 2, 3)):
    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id, controller=broker_id in controllers)
    controller = active_seeing(cluster)
    write_rf2_topic(admin, topic, {0: replicas})
    wait_until(lambda: topic_states(admin, topic, 1), "the state")
    return controller


def test_reassignment_from_broker_1_to_3_completes_when_3_joins_the_isr(cluster, admin):
    controller = started_topic(cluster, admin, "moved", (1,))
    epoch = partition_state(admin, "moved", 0).leader_epoch
    assert alter(controller, {("moved", 0): (3,)}) == {("moved", 0): None}
    ongoing = assignment_of(admin, "moved")
    assert (ongoing.partitions[0], ongoing.adding_replicas, ongoing.removing_replicas) == (
        (3, 1), {0: (3,)}, {0: (1,)})
    state = partition_state(admin, "moved", 0)
    assert (state.leader, state.isr, state.leader_epoch) == (1, (1,), epoch + 1)
    assert listed(controller) == {("moved", 0): ReplicaAssignment((3, 1), (3,), (1,))}
    assert listed(controller, [("moved", 0), ("moved", 7), ("other", 0)]) == listed(controller)

    write_isr_as_leader(admin, "moved", 0, (1, 3))  # broker 3 caught up
    wait_until(lambda: assignment_of(admin, "moved").partitions[0] == (3,), "RS = TRS")
    done = assignment_of(admin, "moved")
    assert (done.adding_replicas, done.removing_replicas) == ({}, {})
    state = wait_until(lambda: (s := partition_state(admin, "moved", 0)).isr == (3,) and s,
                       "broker 1 out of the ISR")
    assert state.leader == 3 and state.leader_epoch > epoch + 1
    assert listed(controller) == {}


def test_cancelling_returns_to_the_original_replicas(cluster, admin):
    controller = started_topic(cluster, admin, "undone", (1, 2))
    assert alter(controller, {("undone", 0): (2, 3)}) == {("undone", 0): None}
    assert assignment_of(admin, "undone").partitions[0] == (2, 3, 1)
    assert alter(controller, {("undone", 0): None}) == {("undone", 0): None}
    back = assignment_of(admin, "undone")
    # ORS = RS - AR, in RS's order: Kafka cannot restore the original order either
    assert (back.partitions[0], back.adding_replicas, back.removing_replicas) == ((2, 1), {}, {})
    state = partition_state(admin, "undone", 0)
    assert state.leader == 1 and set(state.isr) == {1, 2}
    [again] = alter(controller, {("undone", 0): None}).values()
    assert isinstance(again, NoReassignmentInProgress)


def test_invalid_reassignments_get_kafkas_errors(cluster, admin):
    controller = started_topic(cluster, admin, "checked", (1,))
    answers = alter(controller, {("checked", 0): (), ("checked", 1): (2,), ("none", 0): (2,)})
    assert isinstance(answers[("checked", 0)], InvalidReplicaAssignment)
    assert isinstance(answers[("checked", 1)], UnknownTopicOrPartition)
    assert isinstance(answers[("none", 0)], UnknownTopicOrPartition)
    [duplicate] = alter(controller, {("checked", 0): (2, 2)}).values()
    assert str(duplicate) == "Duplicate replica ids in partition reassignment replica list: [2, 2]"
    [dead] = alter(controller, {("checked", 0): (1, 9)}).values()
    assert str(dead) == ("Replica assignment has brokers that are not alive. Replica list: [9], "
                         "live broker list: [1, 2, 3]")
    [fixed_rf] = alter(controller, {("checked", 0): (1, 2)}, allow_replication_factor_change=False).values()
    assert fixed_rf.code == 38  # INVALID_REPLICATION_FACTOR (KIP-860)
    assert assignment_of(admin, "checked").partitions[0] == (1,)


def test_a_new_controller_completes_a_reassignment_its_predecessor_started(cluster, admin):
    controller = started_topic(cluster, admin, "handed", (1,), controllers=(2,))
    assert alter(controller, {("handed", 0): (3,)}) == {("handed", 0): None}
    cluster.add_broker(4)  # a candidate that takes over once broker 2 is gone
    cluster.kill_broker(2)
    successor = wait_until(cluster.active, "a new controller")
    assert successor.broker_id == 4
    write_isr_as_leader(admin, "handed", 0, (1, 3))
    wait_until(lambda: assignment_of(admin, "handed").partitions[0] == (3,), "RS = TRS")
    assert partition_state(admin, "handed", 0).leader == 3
