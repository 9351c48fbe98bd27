"""The admin APIs end to end: real client libraries against a real headrace broker process.

confluent-kafka's AdminClient (librdkafka) exercises every API and error code; kafka-python's
KafkaAdminClient and aiokafka's AIOKafkaAdminClient check that their encodings and versions
work too. Topic names are unique per test because the ``broker`` fixture is shared by the
session; the persistence test restarts its own ``fresh_broker``.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

REQUEST_TIMEOUT_S = 15.0
NODE_ID = 1


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def admin(broker):
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _error_code(future) -> int:
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=REQUEST_TIMEOUT_S)
    return raised.value.args[0].code()


def _create(admin: AdminClient, *topics: NewTopic, validate_only: bool = False) -> dict:
    return admin.create_topics(list(topics), validate_only=validate_only,
                               operation_timeout=REQUEST_TIMEOUT_S)


def _topic_configs(admin: AdminClient, topic: str) -> dict:
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    return next(iter(futures.values())).result(timeout=REQUEST_TIMEOUT_S)


def _broker_configs(admin: AdminClient) -> dict:
    futures = admin.describe_configs([ConfigResource(ResourceType.BROKER, str(NODE_ID))])
    return next(iter(futures.values())).result(timeout=REQUEST_TIMEOUT_S)


def _partition_count(admin: AdminClient, topic: str) -> int:
    return len(admin.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics[topic].partitions)


def test_confluent_create_topics_and_their_errors(admin):
    name = _name("created")
    _create(admin, NewTopic(name, 3, 1, config={"retention.ms": "60000"}))[name].result(
        timeout=REQUEST_TIMEOUT_S)
    assert _partition_count(admin, name) == 3
    assert _topic_configs(admin, name)["retention.ms"].value == "60000"
    cases = {
        name: (NewTopic(name, 1, 1), KafkaError.TOPIC_ALREADY_EXISTS),
        _name("zero"): (NewTopic(_name("zero"), 0, 1), KafkaError.INVALID_PARTITIONS),
        _name("rf"): (NewTopic(_name("rf"), 1, 3), KafkaError.INVALID_REPLICATION_FACTOR),
        _name("cfg"): (NewTopic(_name("cfg"), 1, 1, config={"retention.ms": "-5"}),
                       KafkaError.INVALID_CONFIG),
        "bad/name": (NewTopic("bad/name", 1, 1), KafkaError.TOPIC_EXCEPTION),
    }
    for _, (topic, code) in cases.items():
        assert _error_code(_create(admin, topic)[topic.topic]) == code, topic.topic
    placed = _name("placed")
    _create(admin, NewTopic(placed, 2, -1, replica_assignment=[[NODE_ID], [NODE_ID]]))[placed].result(
        timeout=REQUEST_TIMEOUT_S)
    assert _partition_count(admin, placed) == 2
    elsewhere = _name("elsewhere")
    assert _error_code(_create(admin, NewTopic(elsewhere, 1, -1, replica_assignment=[[7]]))[elsewhere]) \
        == KafkaError.INVALID_REPLICA_ASSIGNMENT


def test_confluent_create_topics_validate_only_and_delete_topics(admin):
    dry = _name("dry")
    _create(admin, NewTopic(dry, 2, 1), validate_only=True)[dry].result(timeout=REQUEST_TIMEOUT_S)
    assert dry not in admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics
    doomed = _name("doomed")
    _create(admin, NewTopic(doomed, 1, 1))[doomed].result(timeout=REQUEST_TIMEOUT_S)
    admin.delete_topics([doomed], operation_timeout=REQUEST_TIMEOUT_S)[doomed].result(
        timeout=REQUEST_TIMEOUT_S)
    assert doomed not in admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics
    missing = admin.delete_topics([doomed], operation_timeout=REQUEST_TIMEOUT_S)[doomed]
    assert _error_code(missing) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_create_partitions(admin):
    name = _name("grown")
    _create(admin, NewTopic(name, 1, 1))[name].result(timeout=REQUEST_TIMEOUT_S)

    def grow(count: int, validate_only: bool = False):
        return admin.create_partitions([NewPartitions(name, count)], validate_only=validate_only,
                                       operation_timeout=REQUEST_TIMEOUT_S)[name]

    grow(4, validate_only=True).result(timeout=REQUEST_TIMEOUT_S)
    assert _partition_count(admin, name) == 1
    grow(3).result(timeout=REQUEST_TIMEOUT_S)
    assert _partition_count(admin, name) == 3
    assert _error_code(grow(2)) == KafkaError.INVALID_PARTITIONS
    assert _error_code(grow(3)) == KafkaError.INVALID_PARTITIONS


def test_confluent_describe_configs_topic_and_broker(admin):
    name = _name("described")
    _create(admin, NewTopic(name, 1, 1, config={"cleanup.policy": "compact"}))[name].result(
        timeout=REQUEST_TIMEOUT_S)
    configs = _topic_configs(admin, name)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert not configs["segment.bytes"].is_read_only
    broker_configs = _broker_configs(admin)
    assert broker_configs["node.id"].value == str(NODE_ID) and broker_configs["node.id"].is_read_only
    missing = admin.describe_configs([ConfigResource(ResourceType.TOPIC, _name("absent"))])
    assert _error_code(next(iter(missing.values()))) == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_alter_and_incremental_alter_topic_configs(admin):
    name = _name("altered")
    _create(admin, NewTopic(name, 1, 1, config={"retention.ms": "60000"}))[name].result(
        timeout=REQUEST_TIMEOUT_S)
    legacy = ConfigResource(ResourceType.TOPIC, name, set_config={"segment.ms": "120000"})
    next(iter(admin.alter_configs([legacy]).values())).result(timeout=REQUEST_TIMEOUT_S)
    configs = _topic_configs(admin, name)
    assert configs["segment.ms"].value == "120000"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value  # replaced

    def incremental(*entries: ConfigEntry):
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=list(entries))
        return next(iter(admin.incremental_alter_configs([resource]).values()))

    incremental(ConfigEntry("retention.ms", "90000", incremental_operation=AlterConfigOpType.SET),
                ConfigEntry("segment.ms", None, incremental_operation=AlterConfigOpType.DELETE)
                ).result(timeout=REQUEST_TIMEOUT_S)
    incremental(ConfigEntry("cleanup.policy", "compact",
                            incremental_operation=AlterConfigOpType.APPEND)
                ).result(timeout=REQUEST_TIMEOUT_S)
    configs = _topic_configs(admin, name)
    assert configs["retention.ms"].value == "90000"
    assert configs["segment.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert set(configs["cleanup.policy"].value.split(",")) == {"compact", "delete"}
    incremental(ConfigEntry("cleanup.policy", "delete",
                            incremental_operation=AlterConfigOpType.SUBTRACT)
                ).result(timeout=REQUEST_TIMEOUT_S)
    assert _topic_configs(admin, name)["cleanup.policy"].value == "compact"
    bad = incremental(ConfigEntry("retention.ms", "soon",
                                  incremental_operation=AlterConfigOpType.SET))
    assert _error_code(bad) == KafkaError.INVALID_CONFIG
    not_a_list = incremental(ConfigEntry("retention.ms", "1",
                                         incremental_operation=AlterConfigOpType.APPEND))
    assert _error_code(not_a_list) == KafkaError.INVALID_CONFIG


def test_confluent_describe_cluster(admin, broker):
    cluster = admin.describe_cluster(request_timeout=REQUEST_TIMEOUT_S).result(
        timeout=REQUEST_TIMEOUT_S)
    assert cluster.cluster_id
    assert cluster.controller.id == NODE_ID
    assert [(node.id, node.host, node.port) for node in cluster.nodes] == [
        (NODE_ID, "127.0.0.1", broker.port)]


def test_confluent_delete_records(admin, broker):
    name = _name("trimmed")
    _create(admin, NewTopic(name, 1, 1))[name].result(timeout=REQUEST_TIMEOUT_S)
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for index in range(10):
        producer.produce(name, f"value-{index}".encode(), partition=0)
    assert producer.flush(REQUEST_TIMEOUT_S) == 0

    def delete(offset: int):
        return admin.delete_records([TopicPartition(name, 0, offset)],
                                    operation_timeout=REQUEST_TIMEOUT_S)

    deleted = next(iter(delete(4).values())).result(timeout=REQUEST_TIMEOUT_S)
    assert deleted.low_watermark == 4
    low, high = _watermarks(broker, name)
    assert (low, high) == (4, 10)
    assert _error_code(next(iter(delete(11).values()))) == KafkaError.OFFSET_OUT_OF_RANGE
    to_end = next(iter(delete(-1).values())).result(timeout=REQUEST_TIMEOUT_S)
    assert to_end.low_watermark == 10


def _watermarks(broker, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": _name("wm")})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=REQUEST_TIMEOUT_S)
    finally:
        consumer.close()


def test_configs_survive_a_restart(fresh_broker):
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap})
    name = _name("kept")
    _create(admin, NewTopic(name, 2, 1, config={"retention.ms": "70000"}))[name].result(
        timeout=REQUEST_TIMEOUT_S)
    incremental = ConfigResource(ResourceType.BROKER, str(NODE_ID), incremental_configs=[
        ConfigEntry("log.segment.bytes", "5000000", incremental_operation=AlterConfigOpType.SET)])
    next(iter(admin.incremental_alter_configs([incremental]).values())).result(
        timeout=REQUEST_TIMEOUT_S)
    fresh_broker.restart()
    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap})
    configs = _topic_configs(admin, name)
    assert configs["retention.ms"].value == "70000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].value == "5000000"
    assert configs["segment.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert _broker_configs(admin)["log.segment.bytes"].value == "5000000"


def test_kafka_python_admin_client(broker):
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions
    from kafka.admin import NewTopic as KpNewTopic

    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        name = _name("kp")
        client.create_topics([KpNewTopic(name, 1, 1, topic_configs={"retention.ms": "80000"})])
        client.create_partitions({name: KpNewPartitions(2)})
        client.alter_configs([KpConfigResource(ConfigResourceType.TOPIC, name,
                                               configs={"segment.ms": "90000"})])
        described = client.describe_configs([KpConfigResource(ConfigResourceType.TOPIC, name)],
                                            config_filter="all")["topic"][name]
        assert described["segment.ms"]["value"] == "90000"
        assert described["retention.ms"]["value"] == "80000"
        assert described["segment.bytes"]["config_source"] == "DEFAULT_CONFIG"
        assert client.describe_cluster()["controller_id"] == NODE_ID
        client.delete_topics([name])
        assert name not in client.list_topics()
    finally:
        client.close()


def test_aiokafka_admin_client(broker):
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as AioNewPartitions
    from aiokafka.admin import NewTopic as AioNewTopic
    from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType as AioResourceType

    async def exercise() -> None:
        client = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await client.start()
        try:
            name = _name("aio")
            await client.create_topics([AioNewTopic(name, 1, 1)])
            await client.create_partitions({name: AioNewPartitions(3)})
            await client.alter_configs([AioConfigResource(AioResourceType.TOPIC, name,
                                                          configs={"retention.ms": "95000"})])
            described = await client.describe_configs(
                [AioConfigResource(AioResourceType.TOPIC, name)])
            entries = {entry[0]: entry[1] for response in described
                       for resource in response.resources for entry in resource[4]}
            assert entries["retention.ms"] == "95000"
            cluster = await client.describe_cluster()
            assert cluster["controller_id"] == NODE_ID
            await client.delete_topics([name])
            assert name not in await client.list_topics()
        finally:
            await client.close()

    asyncio.run(exercise())


def test_a_249_character_topic_works_with_two_clients_and_250_is_refused(broker, admin):
    from confluent_kafka import Consumer
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition
    from kafka.admin import ConfigResource as KpConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic
    from kafka.errors import InvalidTopicError

    name = _name("longest").ljust(249, "x")  # Kafka's longest legal name
    _create(admin, NewTopic(name, 2, 1, config={"retention.ms": "80000"}))[name].result(
        timeout=REQUEST_TIMEOUT_S)
    kp_producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    kp_producer.send(name, b"from kafka-python", partition=1).get(REQUEST_TIMEOUT_S)
    kp_producer.close()
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce(name, b"from confluent-kafka", partition=1)
    assert producer.flush(REQUEST_TIMEOUT_S) == 0
    expected = [b"from kafka-python", b"from confluent-kafka"]

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": _name("longest"),
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(name, 1, 0)])
    consumed = [m.value() for m in consumer.consume(2, timeout=REQUEST_TIMEOUT_S)]
    consumer.close()
    assert consumed == expected
    kp_consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                consumer_timeout_ms=5000)
    kp_consumer.assign([KTopicPartition(name, 1)])
    kp_consumer.seek_to_beginning()
    assert [m.value for m in kp_consumer] == expected
    kp_consumer.close()

    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[ConfigEntry(
        "retention.ms", "90000", incremental_operation=AlterConfigOpType.SET)])
    next(iter(admin.incremental_alter_configs([resource]).values())).result(
        timeout=REQUEST_TIMEOUT_S)
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        described = client.describe_configs(
            [KpConfigResource(ConfigResourceType.TOPIC, name)])["topic"][name]
        assert described["retention.ms"]["value"] == "90000"
        client.delete_topics([name])
        assert name not in client.list_topics()
        too_long = _name("refused").ljust(250, "x")
        with pytest.raises(InvalidTopicError):
            client.create_topics([KpNewTopic(too_long, 1, 1)])
    finally:
        client.close()
    assert _error_code(_create(admin, NewTopic(too_long, 1, 1))[too_long]) == (
        KafkaError.TOPIC_EXCEPTION)
    assert name not in admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics
