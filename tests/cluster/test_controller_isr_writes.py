"""The controller and the leaders' ISR changes, against a real ZooKeeper: leaders write ISR
changes to the partition state themselves (conditional on its zkVersion), so every controller
write of a state is a read-modify-write that never overwrites a change it has not seen. The
brokers are kazoo sessions holding ``/brokers/ids/<id>``; the test writes the leaders' ISR
changes as the leaders would (same leader and leader epoch, conditional set). Also unclean
leader election per topic, turned on dynamically by a topic config change."""

from __future__ import annotations

from headrace.cluster import topic_admin
from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.controller import ELECTION_TYPE_PREFERRED
from tests.cluster import test_controller as harness
from tests.cluster.cluster_helpers import WAIT_TIMEOUT_S, partition_state, topic_states, wait_until
from tests.cluster.test_controller import active_seeing, write_rf2_topic

# the controller tests' fixtures: brokers as kazoo sessions, each with its controller candidate
connect, admin, cluster = harness.connect, harness.admin, harness.cluster


def write_isr_as_leader(zk, topic: str, partition: int, isr: tuple[int, ...]) -> int:
    """The leader's ISR change (Kafka's ``Partition.updateLeaderAndIsr`` in ZooKeeper mode):
    leader, leader epoch and controller epoch kept, conditional on the zkVersion read. The new
    zkVersion."""
    path = paths.partition_state_path(topic, partition)
    zk.sync(path)
    data, stat = zk.get(path)
    state = records.decode_partition_state(data)
    changed = records.PartitionState(state.leader, state.leader_epoch, isr, state.controller_epoch)
    return zk.set(path, records.encode_partition_state(changed), version=stat.version).version


class IsrChangeBeforeCommit:
    """A kazoo client whose first multi-op that sets ``path`` is preceded by ``change()``
    (written by another client, as a leader's ISR change racing the controller's write)."""

    def __init__(self, client, path: str, change) -> None:
        self._client = client
        self._path = path
        self._change = change
        self.injected = False

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def transaction(self):
        return _WatchedTransaction(self._client.transaction(), self)

    def before_commit(self, set_paths: list[str]) -> None:
        if not self.injected and self._path in set_paths:
            self.injected = True
            self._change()
            self._client.sync(self._path)


class _WatchedTransaction:
    def __init__(self, inner, owner: IsrChangeBeforeCommit) -> None:
        self._inner = inner
        self._owner = owner
        self._set_paths: list[str] = []

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def set_data(self, path, *args, **kwargs):
        self._set_paths.append(path)
        return self._inner.set_data(path, *args, **kwargs)

    def commit(self):
        self._owner.before_commit(self._set_paths)
        return self._inner.commit()


def test_an_isr_shrink_racing_a_preferred_election_is_kept_and_the_election_retried(cluster, admin):
    path = paths.partition_state_path("raced", 0)
    wrappers = []

    def wrap(client):
        wrappers.append(IsrChangeBeforeCommit(
            client, path, lambda: write_isr_as_leader(admin, "raced", 0, (1, 2))))
        return wrappers[-1]

    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id, controller=broker_id == 1, wrap=wrap)
    controller = active_seeing(cluster)
    write_rf2_topic(admin, "raced", {0: (2, 1, 3)})
    wait_until(lambda: topic_states(admin, "raced", 1), "the state")
    # broker 1 leads (as after a failover), ISR all three
    state = partition_state(admin, "raced", 0)
    moved = records.PartitionState(1, state.leader_epoch + 1, (1, 2, 3), state.controller_epoch)
    admin.set(path, records.encode_partition_state(moved))
    controller._zk.sync(path)
    controller.submit(lambda: controller._refresh_state(controller._context, "raced", 0)).result(WAIT_TIMEOUT_S)

    answer = controller.submit(lambda: controller.elect_leaders(
        ELECTION_TYPE_PREFERRED, [("raced", 0)])).result(WAIT_TIMEOUT_S)
    assert wrappers[0].injected
    assert answer == {("raced", 0): None}
    elected = partition_state(admin, "raced", 0)
    assert (elected.leader, elected.isr) == (2, (1, 2))  # the leader's shrink kept
    assert elected.leader_epoch == moved.leader_epoch + 1


def test_a_dead_broker_leaves_an_isr_the_leader_expanded_since_the_controller_wrote_it(cluster, admin):
    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id, controller=broker_id == 1)
    active_seeing(cluster)
    write_rf2_topic(admin, "grown", {0: (1, 2, 3)})
    wait_until(lambda: topic_states(admin, "grown", 1), "the state")
    write_isr_as_leader(admin, "grown", 0, (1, 2))  # the leader shrinks, then expands again
    write_isr_as_leader(admin, "grown", 0, (1, 2, 3))
    cluster.kill_broker(3)
    state = wait_until(lambda: (s := partition_state(admin, "grown", 0)).isr == (1, 2) and s,
                       "broker 3 out of the ISR")
    assert state.leader == 1


def test_unclean_election_follows_the_topic_config_changed_while_offline(cluster, admin):
    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id, controller=broker_id == 3)
    controller = active_seeing(cluster)
    write_rf2_topic(admin, "lossy", {0: (1, 2)})
    wait_until(lambda: topic_states(admin, "lossy", 1), "the state")
    write_isr_as_leader(admin, "lossy", 0, (1,))  # broker 2 fell behind
    cluster.kill_broker(1)
    wait_until(lambda: partition_state(admin, "lossy", 0).leader == -1, "offline")
    controller.submit(lambda: None).result(WAIT_TIMEOUT_S)  # the broker change is handled
    assert partition_state(admin, "lossy", 0).isr == (1,)  # no clean candidate: stays offline
    topic_admin.change_topic_config(admin, "lossy", {"unclean.leader.election.enable": "true"})
    state = wait_until(lambda: (s := partition_state(admin, "lossy", 0)).leader == 2 and s,
                       "the unclean election once the topic allows it")
    assert state.isr == (2,)


def test_unclean_election_follows_the_brokers_default_when_the_topic_has_none(cluster, admin):
    for broker_id in (1, 2, 3):
        cluster.add_broker(broker_id, controller=broker_id == 3,
                           unclean_leader_election=lambda: True)
    active_seeing(cluster)
    write_rf2_topic(admin, "loose", {0: (1, 2)})
    write_rf2_topic(admin, "strict", {0: (1, 2)})
    topic_admin.change_topic_config(admin, "strict", {"unclean.leader.election.enable": "false"})
    for topic in ("loose", "strict"):
        wait_until(lambda t=topic: topic_states(admin, t, 1), "the state")
        write_isr_as_leader(admin, topic, 0, (1,))
    cluster.kill_broker(1)
    wait_until(lambda: partition_state(admin, "loose", 0).leader == 2, "the unclean election")
    assert partition_state(admin, "strict", 0).leader == -1
