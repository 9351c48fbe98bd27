"""OffsetCommit for partitions that do not exist, as Kafka 3.9 answers it, through real clients.

A topic the broker does not have, or a partition index beyond a topic's count, answers
UNKNOWN_TOPIC_OR_PARTITION and nothing is stored for it, while the existing partitions of the
same request are committed. Each committing client (confluent-kafka's Consumer and
AdminClient.alter_consumer_group_offsets, kafka-python's KafkaAdminClient.alter_group_offsets)
is checked against the shared broker; what was stored is read back with OffsetFetch through
confluent-kafka's AdminClient (an offset never committed is reported as -1001, "invalid").
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaPythonTopicPartition

TIMEOUT_S = 20
PARTITIONS = 2
BEYOND_COUNT = 7
NOT_COMMITTED = -1001  # librdkafka's OFFSET_INVALID


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _commit_with_confluent_consumer(bootstrap: str, group: str,
                                    offsets: dict[tuple[str, int], int]) -> dict:
    """librdkafka reports the commit as failed with the first partition's error."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                        asynchronous=False)
    except KafkaException as raised:
        return {"request": raised.args[0].code()}
    finally:
        consumer.close()
    return {"request": KafkaError.NO_ERROR}


def _commit_with_confluent_admin(bootstrap: str, group: str,
                                 offsets: dict[tuple[str, int], int]) -> dict:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])
    result = admin.alter_consumer_group_offsets([request])[group].result(TIMEOUT_S)
    return {(tp.topic, tp.partition): tp.error.code() if tp.error else KafkaError.NO_ERROR
            for tp in result.topic_partitions}


def _commit_with_kafka_python_admin(bootstrap: str, group: str,
                                    offsets: dict[tuple[str, int], int]) -> dict:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        result = admin.alter_group_offsets(group, {
            KafkaPythonTopicPartition(t, p): OffsetAndMetadata(o, "", -1)
            for (t, p), o in offsets.items()})
    finally:
        admin.close()
    return {(tp.topic, tp.partition): error.errno for tp, error in result.items()}


def _stored(bootstrap: str, group: str, partitions: list[tuple[str, int]]) -> dict:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in partitions])
    result = admin.list_consumer_group_offsets([request])[group].result(TIMEOUT_S)
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}


@pytest.mark.parametrize("commit", [_commit_with_confluent_consumer,
                                    _commit_with_confluent_admin,
                                    _commit_with_kafka_python_admin])
def test_commit_to_missing_topic_or_partition_is_refused_and_not_stored(broker, commit):
    existing, missing = _unique("committed"), _unique("missing")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(existing, PARTITIONS, 1)])[existing].result(TIMEOUT_S)
    group = _unique("group")
    offsets = {(missing, 0): 5, (existing, 0): 3, (existing, BEYOND_COUNT): 4}

    answered = commit(broker.bootstrap, group, offsets)

    unknown = KafkaError.UNKNOWN_TOPIC_OR_PART
    if "request" in answered:
        assert answered == {"request": unknown}
    else:
        assert answered == {(missing, 0): unknown, (existing, 0): KafkaError.NO_ERROR,
                            (existing, BEYOND_COUNT): unknown}
    assert _stored(broker.bootstrap, group, list(offsets)) == {
        (missing, 0): NOT_COMMITTED, (existing, 0): 3, (existing, BEYOND_COUNT): NOT_COMMITTED}
