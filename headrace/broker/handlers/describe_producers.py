"""DescribeProducers (key 61), version 0 (Kafka 4.x's only one): per requested partition, the
producers in its log's producer state (``Log.active_producers``) -- id, epoch, last sequence,
last timestamp, the coordinator epoch of its last marker and the first offset of its ongoing
transaction (-1 where there is none), as Kafka's ``UnifiedLog.activeProducers``.

Errors as Kafka's ``KafkaApis.handleDescribeProducersRequest``: an illegal topic name answers
INVALID_TOPIC_EXCEPTION and an unknown topic UNKNOWN_TOPIC_OR_PARTITION for each of its
partitions; an unknown partition of a known topic UNKNOWN_TOPIC_OR_PARTITION; a partition this
broker does not lead (cluster mode) NOT_LEADER_OR_FOLLOWER; an offline log directory
KAFKA_STORAGE_ERROR. Each error carries its message. No authorizer, so
TOPIC_AUTHORIZATION_FAILED never applies.

Runs on the event loop thread; the producer states are read under each log's lock on the
append thread (``run_append``), so a read never waits on the loop for an append.
"""

from __future__ import annotations

from typing import Any

from headrace.broker.handlers.create_topics import validate_topic_name
from headrace.errors import KafkaError

API_KEY = 61
MIN_VERSION = 0
MAX_VERSION = 0


def _producer(state) -> dict[str, Any]:
    return {"producer_id": state.producer_id, "producer_epoch": state.producer_epoch,
            "last_sequence": state.last_sequence, "last_timestamp": state.last_timestamp_ms,
            "coordinator_epoch": state.coordinator_epoch,
            "current_txn_start_offset": state.current_txn_start_offset}


def _error(partition: int, error: KafkaError) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": error.code,
            "error_message": str(error) or None, "active_producers": []}


async def _partition(broker: Any, topic: str, partition: int) -> dict[str, Any]:
    try:
        log = broker.log_manager.get_log(topic, partition)
        producers = await broker.run_append(log.active_producers)
    except KafkaError as error:
        return _error(partition, error)
    return {"partition_index": partition, "error_code": 0, "error_message": None,
            "active_producers": [_producer(state) for state in producers]}


async def _topic(broker: Any, topic: Any) -> dict[str, Any]:
    try:
        validate_topic_name(topic.name)
        broker.log_manager.topic(topic.name)
    except KafkaError as error:
        return {"name": topic.name,
                "partitions": [_error(index, error) for index in topic.partition_indexes]}
    return {"name": topic.name, "partitions": [
        await _partition(broker, topic.name, index) for index in topic.partition_indexes]}


async def handle(ctx, request):
    return ctx.respond({"throttle_time": 0, "topics": [
        await _topic(ctx.broker, topic) for topic in request.topics]})
