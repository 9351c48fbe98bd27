"""Kafka 3.9's deprecated and inert topic configs through real admin clients and producers.

``message.format.version`` (deprecated, ignored from 3.0 on), ``message.downconversion.enable``,
``preallocate``, ``unclean.leader.election.enable``, the replication throttles, the compression
levels and the local retention configs are accepted with Kafka's validation, stored and
described, through confluent-kafka's and kafka-python's admin clients; values Kafka refuses
are INVALID_CONFIG. DescribeConfigs v3+ documents which of them have no effect in headrace.
The deprecated ``message.timestamp.difference.max.ms`` does take effect: a producer's record
older than it is refused with INVALID_TIMESTAMP when ``message.timestamp.before.max.ms`` is
left at its maximum, as in Kafka 3.9.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from kafka import KafkaProducer
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.errors import InvalidTimestampError

from tests.broker.raw_client import RawClient

TIMEOUT_S = 20
DESCRIBE_CONFIGS, TOPIC_RESOURCE = 32, 2
INVALID_CONFIG = 40
LONG_MAX = 2**63 - 1
ACCEPTED = {
    "message.format.version": "2.8",
    "message.downconversion.enable": "false",
    "preallocate": "true",
    "unclean.leader.election.enable": "true",
    "follower.replication.throttled.replicas": "0:1,1:1",
    "leader.replication.throttled.replicas": "*",
    "compression.gzip.level": "5",
    "compression.zstd.level": "-5",
    "local.retention.ms": "-2",
}
REFUSED = [
    ("message.format.version", "9.9"),
    ("message.format.version", "4.0"),  # an unstable version: only its IV forms are valid
    ("message.downconversion.enable", "yes"),
    ("follower.replication.throttled.replicas", "0-1"),
    ("compression.gzip.level", "0"),
    ("local.retention.ms", "-3"),
    ("remote.storage.enable", "true"),  # tiered storage is disabled in the broker
]
NO_EFFECT = ("message.format.version", "preallocate",
             "unclean.leader.election.enable", "compression.gzip.level", "local.retention.ms")


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _create_with_confluent(bootstrap: str, topic: str, configs: dict[str, str]) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic]
    try:
        future.result(TIMEOUT_S)
    except KafkaException as raised:
        return raised.args[0].code()
    return KafkaError.NO_ERROR


def _described_with_confluent(bootstrap: str, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return {name: entry.value for name, entry in configs.items()}


def _create_with_kafka_python(bootstrap: str, topic: str, configs: dict[str, str]) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        answer = admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1,
                                              "configs": configs}}, raise_errors=False)
    finally:
        admin.close()
    return answer["topics"][0]["error_code"]


def _described_with_kafka_python(bootstrap: str, topic: str) -> dict[str, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        described = admin.describe_configs(
            [KafkaPythonConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="all")
    finally:
        admin.close()
    return {name: entry["value"] for name, entry in described["topic"][topic].items()}


CLIENTS = {
    "confluent-kafka": (_create_with_confluent, _described_with_confluent),
    "kafka-python": (_create_with_kafka_python, _described_with_kafka_python),
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_deprecated_and_inert_topic_configs_are_accepted_and_validated(broker, client):
    create, describe = CLIENTS[client]
    topic = _unique("inert")
    assert create(broker.bootstrap, topic, ACCEPTED) == KafkaError.NO_ERROR
    described = describe(broker.bootstrap, topic)
    assert {name: described[name] for name in ACCEPTED} == ACCEPTED
    for name, value in REFUSED:
        assert create(broker.bootstrap, _unique("refused"), {name: value}) == INVALID_CONFIG, \
            (name, value)


def test_describe_configs_documents_which_configs_have_no_effect(broker):
    topic = _unique("documented")
    assert _create_with_confluent(broker.bootstrap, topic, {}) == KafkaError.NO_ERROR
    with RawClient(broker.bootstrap) as client:
        body = client.request(DESCRIBE_CONFIGS, 4, {
            "resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": topic,
                           "configuration_keys": None}],
            "include_synonyms": False, "include_documentation": True})
    documentation = {c.name: c.documentation for c in body.results[0].configs}
    assert all("No effect in headrace" in documentation[name] for name in NO_EFFECT)
    assert documentation["message.format.version"].startswith("[DEPRECATED]")
    assert "No effect" not in documentation["retention.ms"]
    assert "No effect" not in documentation["follower.replication.throttled.replicas"]
    assert "No effect" not in documentation["message.timestamp.difference.max.ms"]
    assert "No effect" not in documentation["message.downconversion.enable"]


def _produce_with_confluent(bootstrap: str, topic: str, timestamp_ms: int) -> int:
    outcomes = []
    producer = Producer({"bootstrap.servers": bootstrap, "retries": 0})
    producer.produce(topic, b"old", timestamp=timestamp_ms,
                     on_delivery=lambda error, _message: outcomes.append(error))
    assert producer.flush(TIMEOUT_S) == 0
    return outcomes[0].code() if outcomes[0] else KafkaError.NO_ERROR


def _produce_with_kafka_python(bootstrap: str, topic: str, timestamp_ms: int) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, retries=0)
    try:
        producer.send(topic, b"old", timestamp_ms=timestamp_ms).get(TIMEOUT_S)
    except InvalidTimestampError as raised:
        return raised.errno
    finally:
        producer.close()
    return KafkaError.NO_ERROR


@pytest.mark.parametrize("produce", [_produce_with_confluent, _produce_with_kafka_python])
def test_timestamp_difference_max_ms_refuses_old_records(broker, produce):
    limit_ms = 60_000
    limited, unlimited = _unique("difference"), _unique("unlimited")
    assert _create_with_confluent(broker.bootstrap, limited, {
        "message.timestamp.difference.max.ms": str(limit_ms)}) == KafkaError.NO_ERROR
    assert _create_with_confluent(broker.bootstrap, unlimited, {}) == KafkaError.NO_ERROR
    an_hour_ago_ms = int(time.time() * 1000) - 3_600_000

    assert produce(broker.bootstrap, limited, an_hour_ago_ms) == KafkaError.INVALID_TIMESTAMP
    assert produce(broker.bootstrap, unlimited, an_hour_ago_ms) == KafkaError.NO_ERROR
    described = _described_with_confluent(broker.bootstrap, limited)
    assert described["message.timestamp.before.max.ms"] == str(LONG_MAX)  # as configured
