"""Topic administration in ZooKeeper as Kafka's ``AdminZkClient`` does it, from any broker.

Owns the writes that do not need the controller's epoch (Kafka's brokers make them directly):
a new topic's assignment and config (``create_topic_assignment``: CreateTopics on the controller,
auto-creation from Metadata and the internal ``__consumer_offsets`` topic on any broker),
the partitions CreatePartitions adds, a deletion request (``/admin/delete_topics/<t>``), a topic
config change (``/config/topics/<t>`` plus a ``/config/changes/config_change_<seq>``
notification, version 2) and a controlled-shutdown request. The controller, watching those
znodes, does the rest (partition states, deletion, leadership).

Controlled shutdown goes through a znode of headrace's own, ``/headrace/controlled_shutdown/<id>``
(not Kafka's: Kafka's brokers send a ControlledShutdown RPC, whose schema the kio codec, following
Kafka 4.x, no longer has; a znode also keeps ZooKeeper the only channel between brokers and the
controller). The broker creates it ephemeral with ``{"version":1,"broker_epoch":E}``; the
controller moves leaderships away and sets ``"partitions_remaining"`` (``[[topic, p], ...]``,
the partitions it still leads that have other replicas; empty when it may stop).

Replication factors: any from 1 up to the number of live brokers (INVALID_REPLICATION_FACTOR
otherwise, with Kafka's messages); replicas placed by Kafka's rack-unaware assignment
(``zookeeper_records.assign_replicas_to_brokers``). ``min.insync.replicas`` is not checked
against the replication factor (Kafka accepts a larger one: acks=all writes then answer
NOT_ENOUGH_REPLICAS).

Functions take a connected ``KazooClient``; they block on ZooKeeper (call them from a thread,
never from the event loop). Thread-safe as kazoo is. Reads are retried across a lost
connection with the client's bounded command retry; writes (multi-ops, conditional sets,
creates) are not: a write whose answer was lost may have been applied, so its caller sees the
error and asks again.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.errors import (
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    TopicAlreadyExists,
    UnknownTopicOrPartition,
)

CONTROLLED_SHUTDOWN = "/headrace/controlled_shutdown"


def controlled_shutdown_path(broker_id: int) -> str:
    return f"{CONTROLLED_SHUTDOWN}/{broker_id}"


def live_broker_ids(zk: KazooClient) -> list[int]:
    return sorted(int(child) for child in zk.retry(zk.get_children, paths.BROKER_IDS) if child.isdigit())


def check_replication_factor(replication_factor: int, live_brokers: int) -> None:
    """Kafka's AdminUtils checks: at least 1, at most the live brokers."""
    if replication_factor <= 0:
        raise InvalidReplicationFactor("Replication factor must be larger than 0.")
    if replication_factor > live_brokers:
        raise InvalidReplicationFactor(
            f"Replication factor: {replication_factor} larger than available brokers: {live_brokers}."
        )


def check_manual_assignment(assignment: Mapping[int, Sequence[int]], live_brokers: Sequence[int]) -> None:
    """Kafka's AdminZkClient.validateReplicaAssignment for a manual assignment."""
    sizes = {len(replicas) for replicas in assignment.values()}
    for partition, replicas in assignment.items():
        if not replicas or len(set(replicas)) != len(replicas):
            raise InvalidReplicaAssignment(
                f"Duplicate brokers not allowed in replica assignment: {list(replicas)} for partition {partition}."
            )
        missing = [replica for replica in replicas if replica not in live_brokers]
        if missing:
            raise InvalidReplicaAssignment(
                f"Unknown broker(s) in replica assignment: {missing}."
            )
    if len(sizes) > 1:
        raise InvalidReplicaAssignment("All partitions should have the same number of replicas")
    check_replication_factor(sizes.pop(), len(live_brokers))


def topic_exists(zk: KazooClient, topic: str) -> bool:
    return zk.retry(zk.exists, paths.topic_path(topic)) is not None


def read_assignment(zk: KazooClient, topic: str) -> records.TopicAssignment:
    try:
        data, _ = zk.retry(zk.get, paths.topic_path(topic))
    except NoNodeError:
        raise UnknownTopicOrPartition(f"Topic {topic} does not exist.") from None
    return records.decode_topic_assignment(topic, data)


def create_topic_assignment(
    zk: KazooClient,
    name: str,
    partitions: int,
    replication_factor: int,
    configs: Mapping[str, str],
    *,
    manual_assignment: Mapping[int, Sequence[int]] | None = None,
    rng: random.Random | None = None,
) -> records.TopicAssignment:
    """Write ``/config/topics/<t>`` and ``/brokers/topics/<t>`` in one multi-op (Kafka writes
    the config first, then the assignment); TOPIC_ALREADY_EXISTS when the topic is there."""
    live = live_broker_ids(zk)
    if manual_assignment is not None:
        check_manual_assignment(manual_assignment, live)
        replicas = {p: tuple(r) for p, r in manual_assignment.items()}
    else:
        check_replication_factor(replication_factor, len(live))
        replicas = records.assign_replicas_to_brokers(live, partitions, replication_factor, rng=rng)
    assignment = records.TopicAssignment(topic_id=records.new_topic_id(), partitions=replicas)
    transaction = zk.transaction()
    _set_or_create_config(zk, transaction, name, configs)
    transaction.create(paths.topic_path(name), records.encode_topic_assignment(assignment))
    results = transaction.commit()
    if any(isinstance(result, NodeExistsError) for result in results):
        raise TopicAlreadyExists(f"Topic '{name}' already exists.")
    _raise_first_failure(results)
    return assignment


def _set_or_create_config(zk: KazooClient, transaction, topic: str, configs: Mapping[str, str]) -> None:
    path, data = paths.topic_config_path(topic), records.encode_entity_config(configs)
    if zk.retry(zk.exists, path) is None:
        transaction.create(path, data)
    else:
        transaction.set_data(path, data)


def _raise_first_failure(results: list) -> None:
    for result in results:
        if isinstance(result, Exception):
            raise result


def add_partitions(
    zk: KazooClient, topic: str, partition_count: int,
    manual_assignment: Sequence[Sequence[int]] | None = None,
) -> dict[int, tuple[int, ...]]:
    """Extend ``/brokers/topics/<t>`` to ``partition_count`` partitions, conditional on the
    assignment's zkVersion; the partitions added and their replicas."""
    data, stat = _read_topic(zk, topic)
    assignment = records.decode_topic_assignment(topic, data)
    live = live_broker_ids(zk)
    if manual_assignment is None:
        added = records.assign_added_partitions(live, assignment.partitions, partition_count)
    else:
        added = {len(assignment.partitions) + i: tuple(r) for i, r in enumerate(manual_assignment)}
        check_manual_assignment(added, live)
    check_replication_factor(len(next(iter(added.values()))), len(live))
    extended = records.TopicAssignment(
        topic_id=assignment.topic_id, partitions={**assignment.partitions, **added},
        adding_replicas=assignment.adding_replicas, removing_replicas=assignment.removing_replicas,
    )
    zk.set(paths.topic_path(topic), records.encode_topic_assignment(extended), version=stat.version)
    return added


def _read_topic(zk: KazooClient, topic: str):
    try:
        return zk.retry(zk.get, paths.topic_path(topic))
    except NoNodeError:
        raise UnknownTopicOrPartition(f"Topic {topic} does not exist.") from None


def request_topic_deletion(zk: KazooClient, topic: str) -> None:
    """Create ``/admin/delete_topics/<t>``; a topic already marked for deletion stays marked
    (Kafka swallows TopicAlreadyMarkedForDeletion)."""
    if not topic_exists(zk, topic):
        raise UnknownTopicOrPartition("This server does not host this topic-partition.")
    try:
        zk.create(paths.delete_topic_path(topic), makepath=True)
    except NodeExistsError:
        pass


def read_topic_config(zk: KazooClient, topic: str) -> dict[str, str]:
    try:
        data, _ = zk.retry(zk.get, paths.topic_config_path(topic))
    except NoNodeError:
        return {}
    return records.decode_entity_config(data)


def change_topic_config(zk: KazooClient, topic: str, configs: Mapping[str, str]) -> None:
    """Kafka's AdminZkClient.changeTopicConfig: replace the topic's overrides, then announce
    the change with a sequential ``config_change_`` notification (version 2)."""
    if not topic_exists(zk, topic):
        raise UnknownTopicOrPartition(f"Topic {topic} does not exist.")
    transaction = zk.transaction()
    _set_or_create_config(zk, transaction, topic, configs)
    _raise_first_failure(transaction.commit())
    zk.create(
        paths.config_change_path_prefix(),
        records.encode_config_change_notification("topics", topic),
        sequence=True, makepath=True,
    )


def request_controlled_shutdown(zk: KazooClient, broker_id: int, broker_epoch: int) -> str:
    """Create (or renew) this broker's ephemeral controlled-shutdown request; its path."""
    path = controlled_shutdown_path(broker_id)
    data = json.dumps({"version": 1, "broker_epoch": broker_epoch}).encode()
    try:
        zk.delete(path)
    except NoNodeError:
        pass
    zk.create(path, data, ephemeral=True, makepath=True)
    return path


def decode_controlled_shutdown(data: bytes) -> tuple[int, list[tuple[str, int]] | None]:
    """(broker epoch, partitions still led, or None while the controller has not answered)."""
    record = json.loads(data) if data else {}
    remaining = record.get("partitions_remaining")
    broker_epoch = record.get("broker_epoch", -1)
    if remaining is None:
        return broker_epoch, None
    return broker_epoch, [(str(topic), int(partition)) for topic, partition in remaining]


def encode_controlled_shutdown_answer(broker_epoch: int, remaining: Sequence[tuple[str, int]]) -> bytes:
    return json.dumps({
        "version": 1, "broker_epoch": broker_epoch,
        "partitions_remaining": [[topic, partition] for topic, partition in remaining],
    }).encode()
