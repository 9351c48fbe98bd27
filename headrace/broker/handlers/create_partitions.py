"""CreatePartitions (api key 37): grow a topic to a larger partition count.

As Kafka's controller (ReplicationControlManager.createPartitions): a topic named twice in one
request is INVALID_REQUEST; an unknown topic UNKNOWN_TOPIC_OR_PARTITION; a count equal to or
below the current one INVALID_PARTITIONS; manual assignments must number exactly the new
partitions and place each on this node once (INVALID_REPLICA_ASSIGNMENT). Past Kafka's
bound of ``MAX_RECORDS_PER_USER_OP`` new partitions in one request, checked before growing,
the topic that would cross it is UNKNOWN_SERVER_ERROR, as Kafka answers; the log manager
refuses partitions its file-descriptor budget cannot hold (POLICY_VIOLATION). ``validate_only``
checks all of it without growing. Runs on the event loop thread; partitions are added on the broker's
append thread.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from headrace.broker import cluster_admin
from headrace.broker.handlers.create_topics import MAX_RECORDS_PER_USER_OP, check_manual_replicas
from headrace.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidRequest,
    KafkaError,
    UnknownServerError,
    UnknownTopicOrPartition,
)
from headrace.storage.manager import check_descriptor_budget

API_KEY = 37
MIN_VERSION = 0
MAX_VERSION = 3


def _current_partitions(log_manager: Any, name: str) -> int:
    topics = log_manager.topics()
    if name not in topics:
        raise UnknownTopicOrPartition(f"The topic '{name}' does not exist.")
    return topics[name].partitions


def _validate(broker: Any, topic: Any) -> int:
    """The partitions ``topic`` asks to add, if it may."""
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
    return additional


def _check_records_per_user_op(records_before: int, additional: int) -> None:
    """Kafka's controller bounds one request's new PartitionRecords to
    MAX_RECORDS_PER_USER_OP; the topic that would go past it fails with UNKNOWN_SERVER_ERROR
    (its BoundedListTooLongException is no ApiException). Unlike Kafka, whose partitions
    before the bound are kept, the topic gets none."""
    if records_before + additional > MAX_RECORDS_PER_USER_OP:
        raise UnknownServerError()


async def _create(broker: Any, topic: Any, validate_only: bool, records_before: int) -> int:
    """Validate and grow ``topic``; the partitions added (or that would be)."""
    additional = _validate(broker, topic)
    _check_records_per_user_op(records_before, additional)
    if validate_only:
        check_descriptor_budget(additional)
    else:
        await broker.run_append(broker.log_manager.add_partitions, topic.name, topic.count)
    return additional


async def handle(ctx, request):
    if cluster_admin.runs_controller(ctx.broker):
        return await cluster_admin.create_partitions(ctx, request)
    counts = Counter(topic.name for topic in request.topics)
    results = []
    answered: set[str] = set()
    records = 0
    for topic in request.topics:
        if topic.name in answered:
            continue
        answered.add(topic.name)
        try:
            if counts[topic.name] > 1:
                raise InvalidRequest("Duplicate topic name.")
            records += await _create(ctx.broker, topic, request.validate_only, records)
            results.append({"name": topic.name, "error_code": 0, "error_message": None})
        except KafkaError as error:  # Kafka sends no message with UNKNOWN_SERVER_ERROR
            message = None if isinstance(error, UnknownServerError) else error.message
            results.append({"name": topic.name, "error_code": error.code,
                            "error_message": message})
    return ctx.respond({"throttle_time": 0, "results": results})
