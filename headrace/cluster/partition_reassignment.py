"""Partition reassignment's replica sets, as Kafka's ``ReplicaAssignment`` (KIP-455), pure.

Owns ``ReplicaAssignment``: a partition's full replica set RS (target replicas first, in the
order asked, then the original ones not in the target), the replicas being added (AR = RS - ORS)
and removed (RR = RS - TRS). The original replicas ORS = RS - AR, the target TRS = RS - RR; a
partition is being reassigned while AR or RR is not empty. In ZooKeeper these are the
``partitions``, ``adding_replicas`` and ``removing_replicas`` of ``/brokers/topics/<t>`` (as
Kafka's ZooKeeper-mode controller stores them), read and written through ``of`` and ``put``.

The reassignment's course (the controller's, ``controller.Controller``): write RS/AR/RR and bump
the leader epoch (the new replicas start following); once TRS is a subset of the ISR
(``is_complete``: the leaders add caught-up followers to the ISR themselves), move the
leadership into TRS if needed (``partition_leadership.elect_reassigned_leader``), drop RR from
the ISR, and write RS = TRS. Cancelling reassigns to ORS, which completes at once.

Also ``check_target``: Kafka's ``KafkaController.validateReplicas`` (INVALID_REPLICA_ASSIGNMENT
with Kafka's messages). Immutable values and pure functions: thread-safe.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from headrace.cluster.zookeeper_records import TopicAssignment
from headrace.errors import InvalidReplicaAssignment, InvalidReplicationFactor, KafkaError


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    replicas: tuple[int, ...]  # RS, target replicas first
    adding: tuple[int, ...] = ()  # AR
    removing: tuple[int, ...] = ()  # RR

    @property
    def origin(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.adding)

    @property
    def target(self) -> tuple[int, ...]:
        return tuple(r for r in self.replicas if r not in self.removing)

    @property
    def is_being_reassigned(self) -> bool:
        return bool(self.adding or self.removing)

    def reassign_to(self, target: Sequence[int]) -> ReplicaAssignment:
        """Kafka's ``reassignTo``: from the original replicas (an ongoing reassignment is
        replaced, not stacked) to ``target``."""
        origin = self.origin
        full = tuple(dict.fromkeys((*target, *origin)))
        return ReplicaAssignment(full, tuple(r for r in full if r not in origin),
                                 tuple(r for r in full if r not in target))

    def completed(self) -> ReplicaAssignment:
        return ReplicaAssignment(self.target)


def of(assignment: TopicAssignment, partition: int) -> ReplicaAssignment:
    return ReplicaAssignment(
        tuple(assignment.partitions.get(partition, ())),
        tuple(assignment.adding_replicas.get(partition, ())),
        tuple(assignment.removing_replicas.get(partition, ())),
    )


def put(assignment: TopicAssignment, partition: int, replica_assignment: ReplicaAssignment) -> TopicAssignment:
    """``assignment`` with the partition's RS, AR and RR replaced (empty AR/RR left out, as
    Kafka writes them)."""
    def with_entry(mapping, value):
        updated = {p: r for p, r in mapping.items() if p != partition}
        if value:
            updated[partition] = tuple(value)
        return updated

    return TopicAssignment(
        topic_id=assignment.topic_id,
        partitions={**assignment.partitions, partition: replica_assignment.replicas},
        adding_replicas=with_entry(assignment.adding_replicas, replica_assignment.adding),
        removing_replicas=with_entry(assignment.removing_replicas, replica_assignment.removing),
    )


def is_complete(replica_assignment: ReplicaAssignment, isr: Collection[int]) -> bool:
    """Kafka's ``isReassignmentComplete``: nothing being reassigned, or TRS within the ISR."""
    return not replica_assignment.is_being_reassigned or set(replica_assignment.target) <= set(isr)


def check_target(current: ReplicaAssignment, target: Sequence[int], live_brokers: Collection[int],
                 allow_replication_factor_change: bool = True) -> KafkaError | None:
    """Kafka's ``validateReplicas`` (and KIP-860's ``allowReplicationFactorChange``)."""
    if not target:
        return InvalidReplicaAssignment("Empty replica list specified in partition reassignment.")
    if len(set(target)) != len(target):
        return InvalidReplicaAssignment(
            f"Duplicate replica ids in partition reassignment replica list: {list(target)}")
    if any(replica < 0 for replica in target):
        return InvalidReplicaAssignment(f"Invalid broker id in replica list: {list(target)}")
    adding = current.reassign_to(target).adding
    if not set(adding) <= set(live_brokers):
        return InvalidReplicaAssignment(
            f"Replica assignment has brokers that are not alive. Replica list: {list(adding)}, "
            f"live broker list: {sorted(live_brokers)}")
    if not allow_replication_factor_change and len(target) != len(current.origin):
        return InvalidReplicationFactor(
            f"The replication factor is changed from {len(current.origin)} to {len(target)}")
    return None
