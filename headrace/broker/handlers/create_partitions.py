"""CreatePartitions (api key 37): grow a topic to a larger partition count.

As Kafka's controller (ReplicationControlManager.createPartitions): a topic named twice in one
request is INVALID_REQUEST; an unknown topic UNKNOWN_TOPIC_OR_PARTITION; a count equal to or
below the current one INVALID_PARTITIONS; manual assignments must number exactly the new
partitions and place each on this node once (INVALID_REPLICA_ASSIGNMENT). ``validate_only``
checks without growing. Runs on the event loop thread; partitions are added on the broker's
append thread.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from headrace.broker.handlers.create_topics import check_manual_replicas
from headrace.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidRequest,
    KafkaError,
    UnknownTopicOrPartition,
)

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3


def _current_partitions(log_manager: Any, name: str) -> int:
    topics = log_manager.topics()
    if name not in topics:
        raise UnknownTopicOrPartition(f"The topic '{name}' does not exist.")
    return topics[name].partitions


def _validate(broker: Any, topic: Any) -> None:
    current = _current_partitions(broker.log_manager, topic.name)
    if topic.count == current:
        raise InvalidPartitions(f"Topic already has {current} partition(s).")
    if topic.count < current:
        raise InvalidPartitions(
            f"The topic {topic.name} currently has {current} partition(s); {topic.count} would "
            "not be an increase."
        )
    additional = topic.count - current
    if topic.assignments is not None:
        if len(topic.assignments) != additional:
            raise InvalidReplicaAssignment(
                f"Attempted to add {additional} additional partition(s), but only "
                f"{len(topic.assignments)} assignment(s) were specified."
            )
        for assignment in topic.assignments:
            check_manual_replicas(assignment.broker_ids, broker.node_id)


async def _create(broker: Any, topic: Any, validate_only: bool) -> dict[str, Any]:
    _validate(broker, topic)
    if not validate_only:
        await broker.run_append(broker.log_manager.add_partitions, topic.name, topic.count)
    return {"name": topic.name, "error_code": 0, "error_message": None}


async def handle(ctx, request):
    counts = Counter(topic.name for topic in request.topics)
    results = []
    answered: set[str] = set()
    for topic in request.topics:
        if topic.name in answered:
            continue
        answered.add(topic.name)
        try:
            if counts[topic.name] > 1:
                raise InvalidRequest("Duplicate topic name.")
            results.append(await _create(ctx.broker, topic, request.validate_only))
        except KafkaError as error:
            results.append({"name": topic.name, "error_code": error.code,
                            "error_message": error.message})
    return ctx.respond({"throttle_time": 0, "results": results})
