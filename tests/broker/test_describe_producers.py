"""DescribeProducers (key 61) against a real broker: the producer state of real confluent-kafka
idempotent and transactional producers, read with the raw wire client, and Kafka's error
codes for bad topics and partitions. (confluent-kafka's AdminClient, librdkafka 2.x, has no
DescribeProducers call; ``headrace transactions describe-producers`` is tested in tests/cli.)
"""

from __future__ import annotations

import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from headrace import errors
from tests.broker.raw_client import RawClient

DESCRIBE_PRODUCERS = 61
TIMEOUT_S = 30
SINGLE_NODE_COORDINATOR_EPOCH = 0


def _topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"producers-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)
    return name


def _describe(bootstrap: str, topics: dict[str, list[int]]):
    with RawClient(bootstrap) as client:
        response = client.request(DESCRIBE_PRODUCERS, 0, {"topics": [
            {"name": name, "partition_indexes": partitions}
            for name, partitions in topics.items()]})
    return {(topic.name, partition.partition_index): partition
            for topic in response.topics for partition in topic.partitions}


def _producers(bootstrap: str, topic: str, partition: int = 0) -> dict[int, object]:
    described = _describe(bootstrap, {topic: [partition]})[(topic, partition)]
    assert described.error_code == 0
    return {state.producer_id: state for state in described.active_producers}


def test_an_idempotent_producer_is_described_with_its_last_sequence(broker):
    topic = _topic(broker.bootstrap)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True,
                         "linger.ms": 0})
    for index in range(3):
        producer.produce(topic, f"v{index}".encode(), partition=0, timestamp=1_700_000_000_000
                         + index)
        producer.flush(TIMEOUT_S)
    (state,) = _producers(broker.bootstrap, topic).values()
    assert state.producer_id >= 0
    assert (state.producer_epoch, state.last_sequence, state.last_timestamp,
            state.coordinator_epoch, state.current_txn_start_offset) == (
        0, 2, 1_700_000_000_002, -1, -1)


def test_an_open_transaction_shows_its_start_offset_until_it_commits(broker):
    topic = _topic(broker.bootstrap)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, b"before", partition=0)
    plain.flush(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": broker.bootstrap,
                         "transactional.id": f"tx-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(TIMEOUT_S)
    open_states = [s for s in _producers(broker.bootstrap, topic).values()
                   if s.current_txn_start_offset >= 0]
    assert [(s.current_txn_start_offset, s.last_sequence) for s in open_states] == [(1, 0)]
    producer_id = open_states[0].producer_id
    producer.commit_transaction(TIMEOUT_S)
    committed = _producers(broker.bootstrap, topic)[producer_id]
    assert (committed.current_txn_start_offset, committed.coordinator_epoch) == (
        -1, SINGLE_NODE_COORDINATOR_EPOCH)


def test_a_partition_without_producers_has_none(broker):
    topic = _topic(broker.bootstrap)
    assert _producers(broker.bootstrap, topic) == {}


def test_bad_topics_and_partitions_get_kafkas_error_codes(broker):
    topic = _topic(broker.bootstrap, partitions=2)
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    described = _describe(broker.bootstrap, {
        topic: [1, 2], missing: [0], "bad/name": [0], "": [0, 1]})
    codes = {key: partition.error_code for key, partition in described.items()}
    assert codes == {
        (topic, 1): 0,
        (topic, 2): errors.UnknownTopicOrPartition.code,
        (missing, 0): errors.UnknownTopicOrPartition.code,
        ("bad/name", 0): errors.InvalidTopic.code,
        ("", 0): errors.InvalidTopic.code, ("", 1): errors.InvalidTopic.code,
    }
    assert described[(topic, 2)].active_producers == ()
    assert "bad/name" in described[("bad/name", 0)].error_message
