"""Real Kafka clients against a real broker subprocess: confluent-kafka (librdkafka),
kafka-python, aiokafka and kcat produce with every codec, headers, null keys and values and
records near the size limit, and read everything back byte-identical and in order."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
PARTITIONS = 3
NEAR_LIMIT_VALUE_BYTES = 1_000_000  # message.max.bytes is 1048588 by default
CLIENT_TIMEOUT_S = 30


def _records(count: int) -> list[tuple[bytes | None, bytes | None, list]]:
    out = []
    for i in range(count):
        key = None if i % 7 == 3 else f"key-{i}".encode()
        value = None if i % 11 == 5 else (f"value-{i}-".encode() * (i % 13 + 1))
        headers = [("h", f"{i}".encode()), ("empty", b"")] if i % 2 else []
        out.append((key, value, headers))
    return out


def _create_topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    name = f"clients-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(CLIENT_TIMEOUT_S)
    return name


def _consume_all(bootstrap: str, topic: str, expected_count: int) -> dict[int, list]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "fetch.message.max.bytes": 2_000_000})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    by_partition: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    received = 0
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while received < expected_count and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1):
            assert message.error() is None, message.error()
            by_partition[message.partition()].append(
                (message.offset(), message.key(), message.value(), message.headers() or []))
            received += 1
    consumer.close()
    return by_partition


def _check_round_trip(sent: dict[int, list], got: dict[int, list]) -> None:
    for partition, records in sent.items():
        received = got[partition]
        assert [(k, v, h) for _, k, v, h in received] == records
        offsets = [offset for offset, *_ in received]
        assert offsets == list(range(len(records)))


@pytest.mark.parametrize("codec", CODECS)
def test_confluent_kafka_round_trip(broker, codec):
    topic = _create_topic(broker.bootstrap)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec,
                         "linger.ms": 5, "enable.idempotence": True,
                         "message.max.bytes": 1_048_588})
    sent: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    for i, (key, value, headers) in enumerate(_records(600)):
        partition = i % PARTITIONS
        producer.produce(topic, value=value, key=key, headers=headers, partition=partition)
        sent[partition].append((key, value, headers))
    big = bytes(range(256)) * (NEAR_LIMIT_VALUE_BYTES // 256)
    producer.produce(topic, value=big, key=b"big", partition=0)
    sent[0].append((b"big", big, []))
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    got = _consume_all(broker.bootstrap, topic, sum(len(r) for r in sent.values()))
    _check_round_trip(sent, got)


def test_record_over_the_limit_is_refused(broker):
    topic = _create_topic(broker.bootstrap)
    errors = []
    producer = Producer({"bootstrap.servers": broker.bootstrap, "message.max.bytes": 3_000_000,
                         "message.send.max.retries": 0})
    producer.produce(topic, value=b"x" * 2_000_000, partition=0,
                     on_delivery=lambda error, _msg: errors.append(error))
    producer.flush(CLIENT_TIMEOUT_S)
    assert errors and errors[0] is not None and errors[0].name() == "MSG_SIZE_TOO_LARGE"


def test_kafka_python_idempotent_producer_and_offsets_by_time(broker):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    topic = _create_topic(broker.bootstrap)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True,
                             acks="all", compression_type="gzip")
    base_ms = int(time.time() * 1000) - 10_000
    for i in range(50):
        # one batch per record: storage's time index answers per batch (see the report)
        producer.send(topic, key=b"k", value=f"v{i}".encode(), partition=1,
                      timestamp_ms=base_ms + i * 10,
                      headers=[("n", str(i).encode())]).get(CLIENT_TIMEOUT_S)
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=5000)
    partition = KTopicPartition(topic, 1)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    values = [m.value for m in consumer]
    assert values == [f"v{i}".encode() for i in range(50)]
    found = consumer.offsets_for_times({partition: base_ms + 205})[partition]
    assert (found.offset, found.timestamp) == (21, base_ms + 210)
    assert consumer.end_offsets([partition])[partition] == 50
    consumer.close()


def test_aiokafka_round_trip(broker):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    topic = _create_topic(broker.bootstrap)

    async def run() -> list:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="lz4")
        await producer.start()
        try:
            for i in range(100):
                await producer.send(topic, value=f"a{i}".encode(), key=None, partition=2,
                                    headers=[("x", b"y")])
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([ATopicPartition(topic, 2)])
            received = []
            while len(received) < 100:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), CLIENT_TIMEOUT_S)
                for messages in batch.values():
                    received.extend((m.offset, m.value, list(m.headers)) for m in messages)
            return received
        finally:
            await consumer.stop()

    received = asyncio.run(run())
    assert received == [(i, f"a{i}".encode(), [("x", b"y")]) for i in range(100)]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make system-deps)")
@pytest.mark.parametrize("codec", CODECS)
def test_kcat_round_trip(broker, codec):
    topic = _create_topic(broker.bootstrap)
    lines = [f"key{i}:value-{i}-{codec}" for i in range(200)]
    subprocess.run(["kcat", "-b", broker.bootstrap, "-P", "-t", topic, "-p", "0", "-K:",
                    "-z", codec], input="\n".join(lines) + "\n", text=True, check=True,
                   timeout=CLIENT_TIMEOUT_S)
    result = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", topic, "-p", "0",
                             "-o", "beginning", "-e", "-f", "%o %k:%s\n"],
                            capture_output=True, text=True, check=True, timeout=CLIENT_TIMEOUT_S)
    expected = [f"{i} {line}" for i, line in enumerate(lines)]
    assert result.stdout.splitlines() == expected
