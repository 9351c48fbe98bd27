"""What the active controller knows of the cluster, read from ZooKeeper when it wins.

Owns ``ControllerContext`` (the controller epoch and the zkVersion of ``/controller_epoch`` every
write is checked against, the live brokers with their broker epoch (the czxid of their
``/brokers/ids/<id>`` znode), the topics' assignments, each partition's state with its
zkVersion, the brokers shutting down) and ``load_context``, which reads it all afresh.

Only the controller's event thread touches a context; a resigned controller drops its context
and loads a new one if it wins again. Not thread-safe by itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records


@dataclass(frozen=True, slots=True)
class VersionedState:
    state: records.PartitionState
    zk_version: int


@dataclass(slots=True)
class ControllerContext:
    epoch: int
    epoch_zk_version: int
    live_brokers: dict[int, int] = field(default_factory=dict)  # broker id -> broker epoch
    assignments: dict[str, records.TopicAssignment] = field(default_factory=dict)
    states: dict[tuple[str, int], VersionedState] = field(default_factory=dict)
    shutting_down: set[int] = field(default_factory=set)

    def electable_brokers(self) -> set[int]:
        """Live brokers not shutting down: those a leader may be elected on (Kafka's
        ``isReplicaOnline`` without shutting-down brokers)."""
        return set(self.live_brokers) - self.shutting_down

    def partitions(self):
        """(topic, partition, replicas) of every assigned partition, in topic then partition order."""
        for topic in sorted(self.assignments):
            for partition, replicas in sorted(self.assignments[topic].partitions.items()):
                yield topic, partition, replicas

    def replicas(self, topic: str, partition: int) -> tuple[int, ...]:
        return tuple(self.assignments[topic].partitions.get(partition, ()))

    def drop_topic(self, topic: str) -> None:
        assignment = self.assignments.pop(topic, None)
        for partition in assignment.partitions if assignment else ():
            self.states.pop((topic, partition), None)


def read_live_brokers(zk: KazooClient) -> dict[int, int]:
    """Broker id -> broker epoch (czxid of its registration) of every registered broker."""
    brokers = {}
    for child in zk.get_children(paths.BROKER_IDS):
        stat = zk.exists(paths.broker_id_path(int(child))) if child.isdigit() else None
        if stat is not None:
            brokers[int(child)] = stat.czxid
    return brokers


def read_partition_state(zk: KazooClient, topic: str, partition: int) -> VersionedState | None:
    path = paths.partition_state_path(topic, partition)
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None
    return VersionedState(records.decode_partition_state(data, path), stat.version)


def read_partition_states(zk: KazooClient, keys) -> dict[tuple[str, int], VersionedState]:
    """The states of ``keys`` ((topic, partition) pairs) as ZooKeeper has them now, read in
    one pipelined batch; missing znodes are left out."""
    pending = [(key, zk.get_async(paths.partition_state_path(*key))) for key in keys]
    states = {}
    for key, result in pending:
        try:
            data, stat = result.get()
        except NoNodeError:
            continue
        states[key] = VersionedState(records.decode_partition_state(data, paths.partition_state_path(*key)),
                                     stat.version)
    return states


def read_topic(zk: KazooClient, context: ControllerContext, topic: str) -> None:
    """Load one topic's assignment and partition states into ``context``."""
    try:
        data, _ = zk.get(paths.topic_path(topic))
    except NoNodeError:
        context.drop_topic(topic)
        return
    assignment = records.decode_topic_assignment(topic, data)
    context.assignments[topic] = assignment
    for partition in assignment.partitions:
        state = read_partition_state(zk, topic, partition)
        if state is not None:
            context.states[(topic, partition)] = state


def load_context(zk: KazooClient, epoch: int, epoch_zk_version: int, shutdown_path: str) -> ControllerContext:
    context = ControllerContext(epoch=epoch, epoch_zk_version=epoch_zk_version)
    context.live_brokers = read_live_brokers(zk)
    for topic in zk.get_children(paths.TOPICS):
        read_topic(zk, context, topic)
    if zk.exists(shutdown_path) is not None:
        context.shutting_down = {
            int(child) for child in zk.get_children(shutdown_path)
            if child.isdigit() and int(child) in context.live_brokers
        }
    return context
