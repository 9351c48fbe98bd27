"""Authorized operations as real clients ask for them, against a real broker process.

Without an authorizer Kafka answers every operation a resource type supports
(``AclEntry.supportedOperations``): these tests check the operation names that
confluent-kafka's AdminClient and kafka-python's KafkaAdminClient decode from the bit sets of
DescribeCluster, Metadata (topic operations) and DescribeGroups, and, over the raw wire, the
cluster operations of Metadata v8-10 and the "omitted" value where they were not asked for
(kafka-python always asks).
"""

from __future__ import annotations

import uuid

from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.admin import KafkaAdminClient

from tests.broker.raw_client import RawClient

TIMEOUT_S = 20
METADATA, DESCRIBE_GROUPS = 3, 15
OMITTED = -(2**31)
CLUSTER_OPERATIONS = {"CREATE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
                      "IDEMPOTENT_WRITE", "ALTER", "DESCRIBE"}
TOPIC_OPERATIONS = {"READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER",
                    "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
GROUP_OPERATIONS = {"READ", "DESCRIBE", "DELETE"}
CLUSTER_BITS = sum(1 << code for code in (5, 7, 8, 9, 10, 11, 12))


def _names(operations) -> set[str]:
    return {operation.name for operation in operations}


def _kafka_python_admin(broker) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=broker.bootstrap,
                            request_timeout_ms=TIMEOUT_S * 1000)


def test_cluster_authorized_operations(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_cluster(include_authorized_operations=True).result(TIMEOUT_S)
    assert _names(described.authorized_operations) == CLUSTER_OPERATIONS
    kafka_python = _kafka_python_admin(broker)
    try:
        assert set(kafka_python.describe_cluster()["authorized_operations"]) == \
            CLUSTER_OPERATIONS
    finally:
        kafka_python.close()


def test_metadata_v8_to_v10_answer_cluster_operations_when_asked(broker):
    with RawClient(broker.bootstrap) as client:
        for version in (8, 9, 10):
            body = {"topics": [], "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False}
            asked = client.request(METADATA, version, {
                **body, "include_cluster_authorized_operations": True})
            not_asked = client.request(METADATA, version, {
                **body, "include_cluster_authorized_operations": False})
            assert (asked.cluster_authorized_operations,
                    not_asked.cluster_authorized_operations) == (CLUSTER_BITS, OMITTED), version


def test_topic_authorized_operations(broker):
    topic, missing = f"ops-{uuid.uuid4().hex[:8]}", f"missing-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    described = admin.describe_topics(TopicCollection([topic]),
                                      include_authorized_operations=True)[topic].result(TIMEOUT_S)
    assert _names(described.authorized_operations) == TOPIC_OPERATIONS
    kafka_python = _kafka_python_admin(broker)
    try:
        topics = {t["name"]: t for t in kafka_python.describe_topics([topic, missing])}
    finally:
        kafka_python.close()
    assert set(topics[topic]["authorized_operations"]) == TOPIC_OPERATIONS
    assert topics[missing]["error_code"] == 3  # UNKNOWN_TOPIC_OR_PARTITION, still described
    assert set(topics[missing]["authorized_operations"]) == TOPIC_OPERATIONS


def test_group_authorized_operations(broker):
    group = f"ops-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    described = admin.describe_consumer_groups(
        [group], include_authorized_operations=True)[group].result(TIMEOUT_S)
    assert _names(described.authorized_operations) == GROUP_OPERATIONS
    kafka_python = _kafka_python_admin(broker)
    try:
        asked = kafka_python.describe_groups([group], include_authorized_operations=True)
    finally:
        kafka_python.close()
    assert set(asked[group]["authorized_operations"]) == GROUP_OPERATIONS
    with RawClient(broker.bootstrap) as client:
        not_asked = client.request(DESCRIBE_GROUPS, 5, {
            "groups": [group], "include_authorized_operations": False})
    assert not_asked.groups[0].authorized_operations == OMITTED
