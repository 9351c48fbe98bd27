"""Dynamic broker configs as Kafka 3.9 takes them, through real admin clients and a real broker.

Per-broker configs (resource name = the broker id) are set with confluent-kafka's
IncrementalAlterConfigs and kafka-python's alter_configs, described with source
DYNAMIC_BROKER_CONFIG and survive a restart. Changes Kafka refuses (a read-only config, a value
out of range or of the wrong type, a thread pool more than doubled) answer INVALID_REQUEST with
Kafka's message, as 3.9's ConfigAdminManager does. The cluster-wide default (empty resource
name) cannot be addressed by either Python admin client (both require an integer broker id), so
it is set and described over the raw wire; its effect, its DYNAMIC_DEFAULT_BROKER_CONFIG source
and its precedence below a per-broker value are read back through confluent-kafka.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from tests.broker.raw_client import RawClient

TIMEOUT_S = 20
NODE_ID = "1"
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
BROKER_RESOURCE, SET = 4, 0
INVALID_REQUEST = 42
DYNAMIC_BROKER = ConfigSource.DYNAMIC_BROKER_CONFIG.value
DYNAMIC_DEFAULT_BROKER = ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value


def _set_with_confluent(bootstrap: str, configs: dict[str, str]) -> tuple[int, str]:
    entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
               for name, value in configs.items()]
    resource = ConfigResource(ResourceType.BROKER, NODE_ID, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
    except KafkaException as raised:
        return raised.args[0].code(), raised.args[0].str()
    return 0, ""


def _set_with_kafka_python(bootstrap: str, configs: dict[str, str]) -> tuple[int, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        answer = admin.alter_configs(
            [KafkaPythonConfigResource(ConfigResourceType.BROKER, NODE_ID, configs=configs)],
            raise_on_unknown=False)
    finally:
        admin.close()
    result = answer["broker"][NODE_ID]
    if result == "OK":
        return 0, ""
    code, _, message = result.partition("] ")
    return int(code.removeprefix("[Error ")), message.partition(": ")[2]


def _broker_described(bootstrap: str) -> dict[str, tuple[str | None, int]]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.BROKER, NODE_ID)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return {name: (entry.value, entry.source) for name, entry in configs.items()}


def _kafka_python_described(bootstrap: str, names: list[str]) -> dict[str, tuple[str, str]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        described = admin.describe_configs([KafkaPythonConfigResource(
            ConfigResourceType.BROKER, NODE_ID, configs=dict.fromkeys(names))])
    finally:
        admin.close()
    return {name: (entry["value"], entry["config_source"])
            for name, entry in described["broker"][NODE_ID].items()}


def test_per_broker_configs_are_set_described_and_survive_a_restart(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    assert _set_with_confluent(bootstrap, {"sasl.kerberos.min.time.before.relogin": "120000",
                                           "log.cleaner.backoff.ms": "20000"}) == (0, "")
    assert _set_with_kafka_python(bootstrap, {"max.connections": "1000"}) == (0, "")
    wanted = {"sasl.kerberos.min.time.before.relogin": "120000",
              "log.cleaner.backoff.ms": "20000", "max.connections": "1000"}
    for _ in range(2):
        described = _broker_described(bootstrap)
        assert {name: described[name] for name in wanted} == {
            name: (value, DYNAMIC_BROKER) for name, value in wanted.items()}
        assert _kafka_python_described(bootstrap, list(wanted)) == {
            name: (value, "DYNAMIC_BROKER_CONFIG") for name, value in wanted.items()}
        fresh_broker.restart()


REFUSED = [
    ({"num.partitions": "3"}, "Cannot update these configs dynamically: Set(num.partitions)"),
    ({"log.retention.hours": "1"},  # only the first synonym, log.retention.ms, is dynamic
     "Cannot update these configs dynamically: Set(log.retention.hours)"),
    ({"max.connections": "-1"},
     "Invalid value -1 for configuration max.connections: Value must be at least 0"),
    ({"sasl.kerberos.min.time.before.relogin": "soon"},
     "Invalid value soon for configuration sasl.kerberos.min.time.before.relogin: "
     "Not a number of type LONG"),
    ({"num.io.threads": "17"}, "Dynamic thread count update validation failed for "
     "num.io.threads=17, value should not be greater than double the current value 8"),
]


@pytest.mark.parametrize("alter", [_set_with_confluent, _set_with_kafka_python])
def test_changes_kafka_refuses_answer_invalid_request(broker, alter):
    for configs, message in REFUSED:
        assert alter(broker.bootstrap, configs) == (INVALID_REQUEST, message)
    described = _broker_described(broker.bootstrap)
    assert described["num.io.threads"] == ("8", ConfigSource.DEFAULT_CONFIG.value)


def _raw_set_default(client: RawClient, configs: dict[str, str]):
    body = client.request(INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [{
        "resource_type": BROKER_RESOURCE, "resource_name": "",
        "configs": [{"name": n, "config_operation": SET, "value": v}
                    for n, v in configs.items()]}], "validate_only": False})
    return body.responses[0].error_code, body.responses[0].error_message


def _raw_default_described(client: RawClient) -> dict[str, tuple[str, int]]:
    body = client.request(DESCRIBE_CONFIGS, 4, {"resources": [{
        "resource_type": BROKER_RESOURCE, "resource_name": "", "configuration_keys": None}],
        "include_synonyms": True, "include_documentation": False})
    return {c.name: (c.value, c.config_source) for c in body.results[0].configs}


def _topic_retention(bootstrap: str, topic: str) -> tuple[str, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entry = admin.describe_configs([resource])[resource].result(TIMEOUT_S)["retention.ms"]
    return entry.value, entry.source


def test_cluster_default_applies_below_the_per_broker_value_and_persists(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    topic = f"defaults-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(TIMEOUT_S)
    with RawClient(bootstrap) as client:
        assert _raw_set_default(client, {"log.retention.ms": "1234567"}) == (0, None)
        assert _raw_set_default(client, {"sasl.kerberos.min.time.before.relogin": "5"}) == (
            INVALID_REQUEST, "Cannot update these configs at default cluster level, broker id "
            "must be specified: Set(sasl.kerberos.min.time.before.relogin)")
        assert _raw_default_described(client) == {
            "log.retention.ms": ("1234567", DYNAMIC_DEFAULT_BROKER)}
    assert _broker_described(bootstrap)["log.retention.ms"] == ("1234567", DYNAMIC_DEFAULT_BROKER)
    assert _topic_retention(bootstrap, topic) == ("1234567", DYNAMIC_DEFAULT_BROKER)

    assert _set_with_kafka_python(bootstrap, {"log.retention.ms": "7654321"}) == (0, "")
    fresh_broker.restart()
    assert _broker_described(bootstrap)["log.retention.ms"] == ("7654321", DYNAMIC_BROKER)
    assert _topic_retention(bootstrap, topic) == ("7654321", DYNAMIC_BROKER)
    with RawClient(bootstrap) as client:
        assert _raw_default_described(client) == {
            "log.retention.ms": ("1234567", DYNAMIC_DEFAULT_BROKER)}
