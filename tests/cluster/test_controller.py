"""The controller against a real ZooKeeper: election and epochs, partition states of new
topics, broker loss and return, deletion, fencing of a stale controller, controlled shutdown,
ElectLeaders and NOT_CONTROLLER. Brokers here are kazoo sessions holding ``/brokers/ids/<id>``
(the broker processes are in test_cluster_brokers.py)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from types import SimpleNamespace

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError

from headrace.broker.controller_service import ControllerService
from headrace.cluster import topic_admin
from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.controller import ELECTION_TYPE_PREFERRED, Controller, ControllerFenced
from headrace.cluster.zookeeper_session import COMMAND_RETRY
from headrace.errors import (
    ElectionNotNeeded,
    KafkaError,
    NotController,
    PreferredLeaderNotAvailable,
    RequestTimedOut,
)
from tests.cluster.cluster_helpers import (
    SESSION_TIMEOUT_S,
    WAIT_TIMEOUT_S,
    ConnectionLossOnce,
    close,
    controller_epoch,
    controller_id,
    partition_state,
    register_broker,
    topic_states,
    wait_until,
    zookeeper_client,
)


@pytest.fixture
def connect(zookeeper_ensemble, zookeeper_chroot, zookeeper_client):
    zookeeper_client.ensure_path(zookeeper_chroot)
    return zookeeper_ensemble.connect_string + zookeeper_chroot


@pytest.fixture
def admin(connect):
    client = zookeeper_client(connect)
    yield client
    close(client)


class Cluster:
    """Brokers (sessions) and their controllers, each controller on its own kazoo client."""

    def __init__(self, connect: str) -> None:
        self.connect = connect
        self.sessions = {}
        self.controllers = {}

    def add_broker(self, broker_id: int, controller: bool = True, wrap=lambda client: client,
                   **controller_options) -> None:
        """A broker's session; with ``controller`` its controller candidate, on the session
        as ``wrap`` returns it (a fault-injecting wrapper)."""
        self.sessions[broker_id] = register_broker(self.connect, broker_id)
        if controller:
            self.controllers[broker_id] = Controller(wrap(self.sessions[broker_id]), broker_id,
                                                     **controller_options)
            self.controllers[broker_id].start()

    def kill_broker(self, broker_id: int) -> None:
        controller = self.controllers.pop(broker_id, None)
        if controller is not None:
            controller.stop()
        close(self.sessions.pop(broker_id))

    def active(self) -> Controller | None:
        actives = [c for c in self.controllers.values() if c.is_active]
        assert len(actives) <= 1, "two active controllers"
        return actives[0] if actives else None

    def close(self) -> None:
        for broker_id in list(self.sessions):
            self.kill_broker(broker_id)


@pytest.fixture
def cluster(connect):
    cluster = Cluster(connect)
    yield cluster
    cluster.close()


def active_seeing(cluster: Cluster) -> Controller:
    """The active controller once it sees every broker of ``cluster`` (its ensemble node may
    apply another client's registration a little later)."""
    controller = wait_until(cluster.active, "a controller")
    wait_until(lambda: set(cluster.sessions) <= set(
        controller.submit(controller.live_broker_ids).result(WAIT_TIMEOUT_S)), "every broker seen")
    return controller


def create_topic(controller: Controller, name: str, partitions: int, **kwargs):
    return controller.submit(lambda: controller.create_topic(name, partitions, 1, {}, **kwargs)
                             ).result(WAIT_TIMEOUT_S)


def test_one_broker_wins_and_increments_the_epoch_then_another_takes_over(cluster, admin):
    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id)
    first = wait_until(cluster.active, "a controller")
    assert controller_id(admin) == first.broker_id
    assert controller_epoch(admin) == first.epoch == 1
    cluster.kill_broker(first.broker_id)
    second = wait_until(cluster.active, "a new controller")
    assert second.broker_id != first.broker_id and second.epoch == 2
    assert wait_until(lambda: controller_id(admin) == second.broker_id, "/controller moved")
    assert controller_epoch(admin) == 2


def test_new_topic_gets_states_leader_first_live_replica_and_4_4_4_leaders(cluster, admin):
    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id)
    controller = active_seeing(cluster)
    create_topic(controller, "orders", 12)
    states = topic_states(admin, "orders", 12)
    assert Counter(state.leader for state in states.values()) == {1: 4, 2: 4, 3: 4}
    assignment = records.decode_topic_assignment("orders", admin.get(paths.topic_path("orders"))[0])
    for partition, state in states.items():
        assert state.isr == assignment.partitions[partition] == (state.leader,)
        assert (state.leader_epoch, state.controller_epoch) == (0, controller.epoch)


def test_topic_written_by_another_broker_gets_states_from_the_watch(cluster, admin):
    cluster.add_broker(1)
    controller = wait_until(cluster.active, "a controller")
    topic_admin.create_topic_assignment(admin, "auto", 3, 1, {"retention.ms": "1000"})
    states = wait_until(lambda: topic_states(admin, "auto", 3), "states of an auto-created topic")
    assert {state.leader for state in states.values()} == {1}
    assert {state.controller_epoch for state in states.values()} == {controller.epoch}
    assert topic_admin.read_topic_config(admin, "auto") == {"retention.ms": "1000"}


def test_rf1_partitions_of_a_dead_broker_go_offline_and_return_with_it(cluster, admin):
    cluster.add_broker(1)
    cluster.add_broker(2, controller=False)
    controller = active_seeing(cluster)
    create_topic(controller, "t", 4)
    before = topic_states(admin, "t", 4)
    on_two = [p for p, state in before.items() if state.leader == 2]
    assert on_two
    cluster.kill_broker(2)
    for p in on_two:
        state = wait_until(lambda p=p: (s := partition_state(admin, "t", p)) and not s.has_leader and s,
                           "leader -1")
        assert state.isr == (2,) and state.leader_epoch == before[p].leader_epoch + 1
    untouched = [p for p in before if p not in on_two]
    assert all(partition_state(admin, "t", p) == before[p] for p in untouched)
    cluster.add_broker(2, controller=False)
    for p in on_two:
        state = wait_until(lambda p=p: (s := partition_state(admin, "t", p)) and s.has_leader and s,
                           "leader back")
        assert state.leader == 2 and state.leader_epoch == before[p].leader_epoch + 2


def test_deletion_removes_the_topics_znodes_and_config(cluster, admin):
    cluster.add_broker(1)
    controller = wait_until(cluster.active, "a controller")
    create_topic(controller, "doomed", 2)
    create_topic(controller, "kept", 1)
    topic_admin.change_topic_config(admin, "doomed", {"retention.ms": "5"})
    topic_admin.request_topic_deletion(admin, "doomed")
    wait_until(lambda: admin.exists(paths.topic_path("doomed")) is None, "topic znode deleted")
    assert admin.exists(paths.topic_config_path("doomed")) is None
    assert wait_until(lambda: admin.get_children(paths.DELETE_TOPICS) == [], "request removed")
    assert topic_states(admin, "kept", 1)


def test_config_change_writes_config_and_a_version_2_notification(cluster, admin):
    cluster.add_broker(1)
    create_topic(wait_until(cluster.active, "a controller"), "c", 1)
    topic_admin.change_topic_config(admin, "c", {"cleanup.policy": "compact"})
    assert topic_admin.read_topic_config(admin, "c") == {"cleanup.policy": "compact"}
    [change] = admin.get_children(paths.CONFIG_CHANGES)
    assert change.startswith("config_change_")
    data = admin.get(f"{paths.CONFIG_CHANGES}/{change}")[0]
    assert records.decode_config_change_notification(data) == ("topics", "c")


def test_a_controller_fenced_by_a_newer_epoch_writes_nothing(cluster, admin):
    cluster.add_broker(1)
    stale = wait_until(cluster.active, "a controller")
    gate = threading.Event()
    stale.submit(lambda: gate.wait(WAIT_TIMEOUT_S))  # holds the controller's event thread
    topic_admin.create_topic_assignment(admin, "late", 2, 1, {})
    wait_until(lambda: stale.queued_event_count >= 1, "the topic event queued behind the gate")
    # A newer controller wins: /controller moves and the epoch goes up (as its election does).
    newer = records.ControllerRegistration(broker_id=99, timestamp_ms=0)
    transaction = admin.transaction()
    transaction.delete(paths.CONTROLLER)
    transaction.create(paths.CONTROLLER, records.encode_controller_registration(newer))
    transaction.set_data(paths.CONTROLLER_EPOCH, records.encode_controller_epoch(2))
    assert not any(isinstance(result, Exception) for result in transaction.commit())
    epoch_stat = admin.exists(paths.CONTROLLER_EPOCH)
    gate.set()
    wait_until(lambda: not stale.is_active, "the stale controller resigns")
    wait_until(lambda: stale.queued_event_count == 0, "its queue drained")
    assert stale.submit(lambda: None).exception(WAIT_TIMEOUT_S) is not None  # drained, inactive
    admin.sync("/")
    assert admin.exists(paths.topic_partitions_path("late")) is None
    assert admin.exists(paths.CONTROLLER_EPOCH).mzxid == epoch_stat.mzxid


def test_non_controller_answers_not_controller(cluster):
    cluster.add_broker(1)
    wait_until(cluster.active, "a controller")
    cluster.add_broker(2)
    follower = cluster.controllers[2]
    with pytest.raises(NotController):
        follower.submit(lambda: follower.create_topic("x", 1, 1, {})).result(WAIT_TIMEOUT_S)


def write_rf2_topic(admin, topic: str, replicas: dict[int, tuple[int, ...]]) -> None:
    """RF 2 is refused by CreateTopics in this release; the controller's elections for it are
    tested on an assignment written directly."""
    assignment = records.TopicAssignment(topic_id=records.new_topic_id(), partitions=replicas)
    admin.create(paths.topic_path(topic), records.encode_topic_assignment(assignment))


def test_controlled_shutdown_moves_leadership_to_another_isr_member(cluster, admin):
    for broker_id in (1, 2):
        cluster.add_broker(broker_id, controller=broker_id == 1)
    active_seeing(cluster)
    write_rf2_topic(admin, "r", {0: (2, 1), 1: (1, 2)})
    wait_until(lambda: topic_states(admin, "r", 2), "states")
    assert partition_state(admin, "r", 0).leader == 2
    path = topic_admin.request_controlled_shutdown(
        cluster.sessions[2], 2, cluster.sessions[2].exists(paths.broker_id_path(2)).czxid)
    admin.sync(path)  # the request was written through another ensemble node
    answer = wait_until(lambda: topic_admin.decode_controlled_shutdown(admin.get(path)[0])[1] is not None
                        and admin.get(path)[0], "the controller's answer")
    assert topic_admin.decode_controlled_shutdown(answer)[1] == []
    assert partition_state(admin, "r", 0).leader == 1 and partition_state(admin, "r", 0).isr == (1,)
    assert partition_state(admin, "r", 1).isr == (1,)


def test_preferred_leader_election(cluster, admin):
    for broker_id in (1, 2):
        cluster.add_broker(broker_id, controller=broker_id == 1)
    controller = active_seeing(cluster)
    write_rf2_topic(admin, "p", {0: (2, 1)})
    wait_until(lambda: topic_states(admin, "p", 1), "states")
    cluster.kill_broker(2)
    wait_until(lambda: partition_state(admin, "p", 0).leader == 1, "leader moved to 1")
    elect = lambda: controller.submit(  # noqa: E731
        lambda: controller.elect_leaders(ELECTION_TYPE_PREFERRED, [("p", 0)])).result(WAIT_TIMEOUT_S)
    assert isinstance(elect()[("p", 0)], PreferredLeaderNotAvailable)
    cluster.add_broker(2, controller=False)
    wait_until(lambda: 2 in controller._context.live_brokers, "broker 2 seen")
    # it returned out of the ISR (no replication yet): preferred election needs it in the ISR
    assert isinstance(elect()[("p", 0)], PreferredLeaderNotAvailable)
    state = partition_state(admin, "p", 0)
    admin.set(paths.partition_state_path("p", 0), records.encode_partition_state(
        records.PartitionState(1, state.leader_epoch, (1, 2), state.controller_epoch)))
    controller._zk.sync(paths.partition_state_path("p", 0))  # its node may lag the test's
    controller.submit(lambda: controller._refresh_state(controller._context, "p", 0)).result(WAIT_TIMEOUT_S)
    assert elect() == {("p", 0): None}
    assert partition_state(admin, "p", 0).leader == 2
    assert isinstance(elect()[("p", 0)], ElectionNotNeeded)


def test_controller_epoch_znode_is_created_at_zero_when_missing(cluster, admin):
    with pytest.raises(NoNodeError):
        admin.get(paths.CONTROLLER_EPOCH)
    cluster.add_broker(1)
    wait_until(cluster.active, "a controller")
    assert controller_epoch(admin) == 1


def test_new_partition_without_a_live_replica_waits_for_it(cluster, admin):
    cluster.add_broker(1)
    controller = wait_until(cluster.active, "a controller")
    assignment = records.TopicAssignment(topic_id=records.new_topic_id(), partitions={0: (1,), 1: (7,)})
    admin.create(paths.topic_path("waiting"), records.encode_topic_assignment(assignment))
    wait_until(lambda: partition_state(admin, "waiting", 0), "state of the live replica's partition")
    controller.submit(lambda: None).result(WAIT_TIMEOUT_S)  # the topic event has been handled
    assert partition_state(admin, "waiting", 1) is None
    cluster.add_broker(7, controller=False)
    state = wait_until(lambda: partition_state(admin, "waiting", 1), "state once broker 7 is up")
    assert (state.leader, state.isr, state.leader_epoch) == (7, (7,), 0)


def test_a_controller_fenced_while_it_still_holds_controller_makes_way_for_an_election(cluster, admin):
    cluster.add_broker(1)
    controller = wait_until(cluster.active, "a controller")
    epoch = controller.epoch
    # the epoch moves on under it (as a competing controller would move it)
    admin.set(paths.CONTROLLER_EPOCH, records.encode_controller_epoch(epoch + 5))
    topic_admin.create_topic_assignment(admin, "after", 1, 1, {})
    # its next write is refused: it resigns, gives up /controller, and the election starts over
    wait_until(lambda: controller.epoch == epoch + 6, "a new election after the fencing")
    assert controller_epoch(admin) == epoch + 6 and controller_id(admin) == 1
    state = wait_until(lambda: partition_state(admin, "after", 0), "the topic's state")
    assert state.controller_epoch == epoch + 6


def test_a_fenced_controller_never_adopts_the_epoch_that_fenced_it(cluster, admin):
    cluster.add_broker(1)
    controller = wait_until(cluster.active, "a controller")
    epoch = controller.epoch
    admin.set(paths.CONTROLLER_EPOCH, records.encode_controller_epoch(epoch + 5))
    controller._zk.sync(paths.CONTROLLER_EPOCH)

    def fenced_then_stale_controller_event():
        with pytest.raises(ControllerFenced):
            controller.create_topic("late", 1, 1, {})
        # a /controller event queued before the fencing runs before the "move" event
        controller._on_controller_changed()
        return controller.is_active, controller.epoch

    active, adopted = controller.submit(fenced_then_stale_controller_event).result(WAIT_TIMEOUT_S)
    assert (active, adopted) == (False, None)
    wait_until(lambda: controller.epoch == epoch + 6, "a new election after the fencing")


def test_partitions_added_to_an_assignment_by_another_writer_get_states(cluster, admin):
    cluster.add_broker(1)
    active_seeing(cluster)
    topic_admin.create_topic_assignment(admin, "extended", 1, 1, {})
    wait_until(lambda: topic_states(admin, "extended", 1), "the first partition's state")
    topic_admin.add_partitions(admin, "extended", 3)
    states = wait_until(lambda: topic_states(admin, "extended", 3), "the added partitions' states")
    assert {state.leader for state in states.values()} == {1}


def test_the_broker_side_maps_zookeeper_failures_to_kafka_errors(cluster):
    cluster.add_broker(1)
    wait_until(cluster.active, "a controller")
    membership = SimpleNamespace(session=SimpleNamespace(client=cluster.sessions[1]), broker_id=1)
    service = ControllerService(membership, SimpleNamespace(get_bool=lambda _name: False,
                                                            get_int=lambda _name: 300))
    service.controller = cluster.controllers[1]  # the running one, not a second candidate

    def failing(error):
        def action(_controller):
            raise error
        return action

    async def outcome(action) -> type:
        try:
            await service.run(action, 10_000)
        except KafkaError as error:
            return type(error)
        return type(None)

    assert asyncio.run(outcome(failing(ConnectionLoss()))) is RequestTimedOut
    assert asyncio.run(outcome(failing(SessionExpiredError()))) is NotController
    assert asyncio.run(outcome(failing(ControllerFenced("fenced")))) is NotController


def test_a_controller_whose_zookeeper_calls_lose_the_connection_retries_and_is_elected(
        connect, admin):
    registration = register_broker(connect, 1)
    session = KazooClient(hosts=connect, timeout=SESSION_TIMEOUT_S,  # the broker's retry bounds
                          command_retry={**COMMAND_RETRY, "deadline": SESSION_TIMEOUT_S})
    session.start(timeout=WAIT_TIMEOUT_S)
    flaky = ConnectionLossOnce(session)
    controller = Controller(flaky, 1)
    try:
        controller.start()
        wait_until(lambda: controller.is_active, "the controller elected")
        assert controller_id(admin) == 1
        assert ("ensure_path", paths.DELETE_TOPICS) in flaky.failed
        assert ("get", paths.CONTROLLER_EPOCH) in flaky.failed
    finally:
        controller.stop()
        close(session)
        close(registration)


def test_a_topic_created_while_its_reads_lose_the_connection_is_written(connect, admin):
    registration = register_broker(connect, 1)
    session = KazooClient(hosts=connect, timeout=SESSION_TIMEOUT_S,  # the broker's retry bounds
                          command_retry={**COMMAND_RETRY, "deadline": SESSION_TIMEOUT_S})
    session.start(timeout=WAIT_TIMEOUT_S)
    flaky = ConnectionLossOnce(session)
    try:
        topic_admin.create_topic_assignment(flaky, "flaky", 2, 1, {})
        assert ("get_children", paths.BROKER_IDS) in flaky.failed
        admin.sync(paths.topic_path("flaky"))  # admin's ensemble node may lag the session's
        assignment = records.decode_topic_assignment(
            "flaky", admin.get(paths.topic_path("flaky"))[0])
        assert assignment.partitions == {0: (1,), 1: (1,)}
    finally:
        close(session)
        close(registration)
