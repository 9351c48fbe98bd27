"""AlterPartitionReassignments (api key 45, v0-1): start, replace or cancel (null replicas)
partition reassignments.

In a cluster the active controller does it (``Controller.alter_partition_reassignments``, as
Kafka's ZooKeeper-mode ``KafkaController.processApiPartitionReassignment``): per partition no
error once the reassignment is written (its data copy and completion follow), or
INVALID_REPLICA_ASSIGNMENT (39, Kafka's messages: empty, duplicate or negative ids, new replicas
on brokers that are not alive), UNKNOWN_TOPIC_OR_PARTITION (3), NO_REASSIGNMENT_IN_PROGRESS (85)
for a cancellation with none, and with v1's ``allow_replication_factor_change`` false a
replication factor change is INVALID_REPLICATION_FACTOR (38, KIP-860). Any other broker answers
NOT_CONTROLLER (41) at the top level, as Kafka's ZooKeeper-mode brokers do.

A single node holds one replica of every partition on itself: reassigning a partition to
``[node.id]`` (or to itself again) needs nothing and succeeds, any other broker is not alive
(INVALID_REPLICA_ASSIGNMENT), and there is never a reassignment to cancel. Runs on the event
loop thread; the controller's work on its thread.
"""

from __future__ import annotations

from typing import Any

from headrace.broker.cluster_admin import request_timeout_ms
from headrace.cluster.partition_reassignment import ReplicaAssignment, check_target
from headrace.errors import (
    KafkaError,
    NoReassignmentInProgress,
    NotController,
    UnknownTopicOrPartition,
)

API_KEY = 45
MIN_VERSION = 0
MAX_VERSION = 1


def requested_targets(request: Any) -> dict[tuple[str, int], tuple[int, ...] | None]:
    """(topic, partition) -> target replicas, None to cancel; the last entry of a duplicate wins."""
    return {
        (topic.name, int(partition.partition_index)):
            None if partition.replicas is None else tuple(int(r) for r in partition.replicas)
        for topic in request.topics for partition in topic.partitions
    }


def _single_node(broker: Any, targets: dict, allow_replication_factor_change: bool) -> dict:
    topics = broker.log_manager.topics()
    node = broker.node_id
    results: dict[tuple[str, int], KafkaError | None] = {}
    for (topic, partition), target in targets.items():
        if topic not in topics or not 0 <= partition < topics[topic].partitions:
            results[(topic, partition)] = UnknownTopicOrPartition("The partition does not exist.")
        elif target is None:
            results[(topic, partition)] = NoReassignmentInProgress("No partition reassignment is in progress.")
        else:
            results[(topic, partition)] = check_target(
                ReplicaAssignment((node,)), target, (node,), allow_replication_factor_change)
    return results


async def handle(ctx, request):
    targets = requested_targets(request)
    allow = getattr(request, "allow_replication_factor_change", True)
    top_error: KafkaError | None = None
    results: dict = {}
    service = getattr(ctx.broker, "controller", None)
    if service is None:
        results = _single_node(ctx.broker, targets, allow)
    elif not service.is_active:
        top_error = NotController("")
    else:
        try:
            results = await service.run(
                lambda controller: controller.alter_partition_reassignments(targets, allow),
                request_timeout_ms(request))
        except KafkaError as error:
            top_error = error
    return ctx.respond({
        "throttle_time": 0,
        "error_code": top_error.code if top_error else 0,
        "error_message": None if top_error is None or isinstance(top_error, NotController)
        else top_error.message,
        "responses": [] if top_error else _by_topic(results),
    })


def _by_topic(results: dict[tuple[str, int], KafkaError | None]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), error in results.items():
        topics.setdefault(topic, []).append({
            "partition_index": partition, "error_code": error.code if error else 0,
            "error_message": error.message if error else None})
    return [{"name": name, "partitions": partitions} for name, partitions in topics.items()]
