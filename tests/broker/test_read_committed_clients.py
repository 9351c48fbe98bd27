"""read_committed consumers of kafka-python and aiokafka, and the last stable offset seen on
the wire, against a real broker process: records written by confluent-kafka's transactional
producer, aborted ones never delivered; an open transaction holds read_committed readers at
its first offset, also across a SIGKILL of the broker, until a new producer with the same
transactional id fences and aborts it."""

from __future__ import annotations

import asyncio
import uuid

from confluent_kafka import Producer

from tests.broker.raw_client import RawClient
from tests.broker.test_transactions import TIMEOUT_S, _producer, _topic
from tests.record_reading import iter_headers

FETCH, LIST_OFFSETS = 1, 2
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LATEST = -1
COMMITTED = [b"c0", b"c1", b"c2"]


def _write_committed_aborted_committed(bootstrap: str, topic: str) -> None:
    producer = _producer(bootstrap, f"tx-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(TIMEOUT_S)
    for values, commit in (([b"c0", b"c1"], True), ([b"a0", b"a1"], False), ([b"c2"], True)):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, value, partition=0)
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.flush(TIMEOUT_S)  # the aborted records are in the log, then aborted
            producer.abort_transaction(TIMEOUT_S)


def _kafka_python_values(bootstrap: str, topic: str, isolation_level: str) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level=isolation_level, consumer_timeout_ms=5000)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek_to_beginning()
    values = [message.value for message in consumer]  # ends 5 s after the last record
    consumer.close()
    return values


def _aiokafka_values(bootstrap: str, topic: str, wanted: int) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.structs import TopicPartition

    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            values: list[bytes] = []
            for _ in range(TIMEOUT_S):  # bounded: one getmany of at most 1 s each
                if len(values) >= wanted:
                    break
                batches = await consumer.getmany(timeout_ms=1000)
                values.extend(m.value for messages in batches.values() for m in messages)
            return values
        finally:
            await consumer.stop()

    return asyncio.run(run())


def test_kafka_python_read_committed_never_sees_aborted_records(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    _write_committed_aborted_committed(broker.bootstrap, topic)
    assert _kafka_python_values(broker.bootstrap, topic, "read_committed") == COMMITTED
    uncommitted = _kafka_python_values(broker.bootstrap, topic, "read_uncommitted")
    assert uncommitted == [b"c0", b"c1", b"a0", b"a1", b"c2"]


def test_aiokafka_read_committed_never_sees_aborted_records(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    _write_committed_aborted_committed(broker.bootstrap, topic)
    assert _aiokafka_values(broker.bootstrap, topic, len(COMMITTED)) == COMMITTED


def _latest(bootstrap: str, topic: str, isolation_level: int) -> int:
    with RawClient(bootstrap) as client:
        response = client.request(LIST_OFFSETS, 7, {
            "replica_id": -1, "isolation_level": isolation_level, "topics": [
                {"name": topic, "partitions": [
                    {"partition_index": 0, "timestamp": LATEST, "current_leader_epoch": -1}]}]})
    [partition] = response.topics[0].partitions
    assert partition.error_code == 0
    return partition.offset


def _fetch_committed(bootstrap: str, topic: str):
    with RawClient(bootstrap) as client:
        response = client.request(FETCH, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 10_000_000,
            "isolation_level": READ_COMMITTED, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "fetch_offset": 0, "partition_max_bytes": 10_000_000,
                "current_leader_epoch": -1, "last_fetched_epoch": -1,
                "log_start_offset": -1}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    return response.responses[0].partitions[0]


def test_an_open_transaction_survives_a_broker_sigkill_until_its_successor_aborts_it(
        fresh_broker):
    bootstrap = fresh_broker.bootstrap
    topic = _topic(bootstrap, partitions=1)
    plain = Producer({"bootstrap.servers": bootstrap})
    plain.produce(topic, b"before", partition=0)
    plain.flush(TIMEOUT_S)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    zombie = _producer(bootstrap, transactional_id)
    zombie.init_transactions(TIMEOUT_S)
    zombie.begin_transaction()
    zombie.produce(topic, b"open", partition=0)
    zombie.flush(TIMEOUT_S)
    plain.produce(topic, b"after", partition=0)
    plain.flush(TIMEOUT_S)
    assert (_latest(bootstrap, topic, READ_COMMITTED), _latest(bootstrap, topic,
                                                                READ_UNCOMMITTED)) == (1, 3)

    fresh_broker.kill()
    fresh_broker.start()
    assert _latest(bootstrap, topic, READ_COMMITTED) == 1  # the open transaction recovered
    held = _fetch_committed(bootstrap, topic)
    assert (held.high_watermark, held.last_stable_offset) == (3, 1)
    assert [h.base_offset for _, h in iter_headers(held.records)] == [0]  # "before" only

    successor = _producer(bootstrap, transactional_id)
    successor.init_transactions(TIMEOUT_S)  # fences the zombie, aborting its transaction
    assert _latest(bootstrap, topic, READ_COMMITTED) == 4  # past the abort marker at 3
    released = _fetch_committed(bootstrap, topic)
    assert released.last_stable_offset == released.high_watermark == 4
    assert [t.first_offset for t in released.aborted_transactions] == [1]
    assert _kafka_python_values(bootstrap, topic, "read_committed") == [b"before", b"after"]
