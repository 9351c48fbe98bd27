"""Clients that skip ApiVersions against a real broker: Produce v0-2 (magic 0/1 message
sets, up-converted) and Fetch v0-3 (v2 batches down-converted to magic 0/1), as Kafka 3.9
serves them -- librdkafka with ``broker.version.fallback=0.9.0``, kafka-python with
``api_version=(0, 9)`` and ``(0, 10)``, kcat, and raw requests for the error codes."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time
import uuid
import zlib

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, TIMESTAMP_NOT_AVAILABLE, Consumer, Producer
from confluent_kafka import TopicPartition as RdTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as PyTopicPartition

from headrace.protocol import records as record_codec
from headrace.protocol import wire
from tests.broker.raw_client import RawClient
from tests.broker.test_clients import _create_topic

PRODUCE, FETCH, LIST_OFFSETS, API_VERSIONS = 0, 1, 2, 18
CORRUPT_MESSAGE, INVALID_RECORD, UNSUPPORTED_COMPRESSION_TYPE = 2, 87, 76
UNSUPPORTED_VERSION = 35
CLIENT_TIMEOUT_S = 30
RECORD_COUNT = 30
OLD_LIBRDKAFKA = {"api.version.request": False, "broker.version.fallback": "0.9.0"}
LEGACY_CODECS = ["none", "gzip", "snappy", "lz4"]


def _records(count: int = RECORD_COUNT) -> list[tuple[bytes | None, bytes | None]]:
    return [(None if i % 7 == 3 else b"key-%d" % i,
             None if i % 11 == 5 else b"value-%d-" % i * (i % 5 + 1)) for i in range(count)]


def _one_partition_topic(bootstrap: str, configs: dict[str, str] | None = None) -> str:
    if not configs:
        return _create_topic(bootstrap, partitions=1)
    name = f"old-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(CLIENT_TIMEOUT_S)
    return name


def _rdkafka_produce(bootstrap: str, topic: str, config: dict, records, headers=None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})
    failures = []
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0, headers=headers,
                         on_delivery=lambda error, _: failures.append(error) if error else None)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    assert failures == []


def _rdkafka_consume(bootstrap: str, topic: str, config: dict, count: int) -> list:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, **config})
    consumer.assign([RdTopicPartition(topic, 0, 0)])
    received = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while len(received) < count and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1):
            assert message.error() is None, message.error()
            received.append(message)
    consumer.close()
    return received


def _kafka_python_consume(bootstrap: str, topic: str, api_version, count: int) -> list:
    """Every record from the earliest offset (found with ListOffsets: v0 for old versions)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=api_version,
                             consumer_timeout_ms=2000, auto_offset_reset="earliest")
    consumer.assign([PyTopicPartition(topic, 0)])
    received = poll_kafka_python(consumer, count)
    consumer.close()
    return received


def poll_kafka_python(consumer, count: int) -> list:
    """Up to ``count`` messages from a kafka-python consumer (created with
    ``consumer_timeout_ms``), polling for at most ``CLIENT_TIMEOUT_S``."""
    received = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while len(received) < count and time.monotonic() < deadline:
        for message in consumer:  # ends after consumer_timeout_ms without a message
            received.append(message)
            if len(received) == count:
                break
    return received


# ---------------------------------------------------------------- real clients


@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_librdkafka_0_9_produces_and_both_old_and_new_consumers_read(broker, codec):
    topic = _one_partition_topic(broker.bootstrap)
    records = _records()
    _rdkafka_produce(broker.bootstrap, topic, {**OLD_LIBRDKAFKA, "compression.codec": codec},
                     records)
    for config in (OLD_LIBRDKAFKA, {}):
        received = _rdkafka_consume(broker.bootstrap, topic, config, RECORD_COUNT)
        assert [(m.offset(), m.key(), m.value()) for m in received] == [
            (offset, key, value) for offset, (key, value) in enumerate(records)]
    old = _rdkafka_consume(broker.bootstrap, topic, OLD_LIBRDKAFKA, 1)
    assert old[0].timestamp()[0] == TIMESTAMP_NOT_AVAILABLE  # magic 0 has none


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_records_of_a_modern_producer_reach_old_consumers_without_headers(broker, codec):
    topic = _one_partition_topic(broker.bootstrap)
    records = _records()
    _rdkafka_produce(broker.bootstrap, topic, {"compression.codec": codec}, records,
                     headers=[("trace", b"x")])
    old = _rdkafka_consume(broker.bootstrap, topic, OLD_LIBRDKAFKA, RECORD_COUNT)
    assert [(m.offset(), m.key(), m.value(), m.headers()) for m in old] == [
        (offset, key, value, None) for offset, (key, value) in enumerate(records)]
    modern = _rdkafka_consume(broker.bootstrap, topic, {}, RECORD_COUNT)
    magic_1 = _kafka_python_consume(broker.bootstrap, topic, (0, 10), RECORD_COUNT)
    assert [(m.offset, m.key, m.value, m.timestamp, m.headers) for m in magic_1] == [
        (m.offset(), m.key(), m.value(), m.timestamp()[1], []) for m in modern]


@pytest.mark.parametrize("api_version", [(0, 9), (0, 10)])
@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4"])
def test_kafka_python_old_api_versions_round_trip(broker, api_version, codec):
    topic = _one_partition_topic(broker.bootstrap)
    records = _records()
    now_ms = int(time.time() * 1000)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=api_version,
                             compression_type=codec)
    futures = [producer.send(topic, key=key, value=value, partition=0, timestamp_ms=now_ms + i)
               for i, (key, value) in enumerate(records)]
    producer.flush(CLIENT_TIMEOUT_S)
    assert [future.get(CLIENT_TIMEOUT_S).offset for future in futures] == list(range(RECORD_COUNT))
    producer.close()
    received = _kafka_python_consume(broker.bootstrap, topic, api_version, RECORD_COUNT)
    assert [(m.offset, m.key, m.value) for m in received] == [
        (offset, key, value) for offset, (key, value) in enumerate(records)]
    modern = _rdkafka_consume(broker.bootstrap, topic, {}, RECORD_COUNT)
    if api_version == (0, 10):  # magic 1 carries CreateTime timestamps through the log
        assert [m.timestamp() for m in modern] == [
            (TIMESTAMP_CREATE_TIME, now_ms + i) for i in range(RECORD_COUNT)]
        assert [m.timestamp for m in received] == [now_ms + i for i in range(RECORD_COUNT)]


def test_a_librdkafka_0_9_consumer_group_resumes_from_its_committed_offsets(broker):
    topic = _one_partition_topic(broker.bootstrap)
    records = _records()
    _rdkafka_produce(broker.bootstrap, topic, OLD_LIBRDKAFKA, records)
    group = {**OLD_LIBRDKAFKA, "bootstrap.servers": broker.bootstrap, "group.id": topic,
             "auto.offset.reset": "earliest", "enable.auto.commit": False}
    offsets = []
    for wanted, commit in ((RECORD_COUNT // 2, True), (RECORD_COUNT - RECORD_COUNT // 2, False)):
        consumer = Consumer(group)
        consumer.subscribe([topic])
        received: list = []
        deadline = time.monotonic() + CLIENT_TIMEOUT_S
        while len(received) < wanted and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None, message.error()
                received.append(message)
        if commit:
            consumer.commit(message=received[-1], asynchronous=False)
        consumer.close()
        offsets += [message.offset() for message in received]
    assert offsets == list(range(RECORD_COUNT))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed (make system-deps)")
@pytest.mark.parametrize("fallback", ["0.8.2", "0.9.0"])
def test_kcat_with_old_protocols_round_trips(broker, fallback):
    topic = _one_partition_topic(broker.bootstrap)
    old = ["-X", "api.version.request=false", "-X", f"broker.version.fallback={fallback}"]
    lines = [f"key-{i}:value-{i}" for i in range(RECORD_COUNT)]
    subprocess.run(["kcat", "-b", broker.bootstrap, *old, "-P", "-t", topic, "-p", "0", "-K:",
                    "-z", "snappy"], input="\n".join(lines) + "\n", text=True, check=True,
                   timeout=CLIENT_TIMEOUT_S)
    result = subprocess.run(["kcat", "-b", broker.bootstrap, *old, "-C", "-t", topic, "-p", "0",
                             "-o", "beginning", "-e", "-f", "%o %k:%s\n"], capture_output=True,
                            text=True, check=True, timeout=CLIENT_TIMEOUT_S)
    assert result.stdout.splitlines() == [f"{i} {line}" for i, line in enumerate(lines)]


# ---------------------------------------------------------------- raw requests


def _legacy_message(offset: int, magic: int, key: bytes, value: bytes, crc_flip: int = 0) -> bytes:
    body = struct.pack(">bb", magic, 0) + (struct.pack(">q", int(time.time() * 1000))
                                           if magic == 1 else b"")
    body += struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value
    message = struct.pack(">I", zlib.crc32(body) ^ crc_flip) + body
    return struct.pack(">qi", offset, len(message)) + message


def _produce(bootstrap: str, version: int, topic: str, records: bytes) -> tuple[int, int, bytes]:
    """(error_code, base_offset, the rest of the partition response) of a hand-made
    Produce request: v0-2 have no transactional_id, v3+ a null one."""
    body = b"" if version < 3 else struct.pack(">h", -1)
    body += struct.pack(">hii", -1, 30_000, 1) + struct.pack(">h", len(topic)) + topic.encode()
    body += struct.pack(">iii", 1, 0, len(records)) + records
    with RawClient(bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", PRODUCE, version, 1, 3) + b"raw" + body)
        frame = client.receive_frame()
    position = 4 + 4 + 2 + len(topic) + 4  # correlation id, topics, name, partitions
    _, error_code, base_offset = struct.unpack_from(">ihq", frame, position)
    return error_code, base_offset, frame[position + 14:]


@pytest.mark.parametrize("version, magic", [(0, 0), (1, 0), (2, 1)])
def test_produce_v0_to_v2_answers_corrupt_message_for_a_bad_crc(broker, version, magic):
    topic = _one_partition_topic(broker.bootstrap)
    good = _legacy_message(0, magic, b"k", b"good")
    bad = _legacy_message(1, magic, b"k", b"bad", crc_flip=0x10)
    assert _produce(broker.bootstrap, version, topic, good + bad)[0] == CORRUPT_MESSAGE
    error_code, base_offset, rest = _produce(broker.bootstrap, version, topic, good)
    assert (error_code, base_offset) == (0, 0)
    expected_rest = {0: b"", 1: struct.pack(">i", 0), 2: struct.pack(">qi", -1, 0)}[version]
    assert rest == expected_rest  # log_append_time (v2), throttle_time_ms (v1+)
    received = _rdkafka_consume(broker.bootstrap, topic, {}, 1)
    assert [(m.offset(), m.value()) for m in received] == [(0, b"good")]


def test_produce_v0_to_v2_take_v2_batches_too_as_kafka_does(broker):
    topic = _one_partition_topic(broker.bootstrap)
    batch = record_codec.build_batch([(b"k", b"v2 batch", [], int(time.time() * 1000))])
    assert [_produce(broker.bootstrap, version, topic, batch)[:2] for version in (0, 1, 2)] == [
        (0, 0), (0, 1), (0, 2)]


def test_produce_v3_refuses_magic_0_and_1_as_kafka_does(broker):
    topic = _one_partition_topic(broker.bootstrap)
    legacy = _legacy_message(0, 1, b"k", b"v")
    assert _produce(broker.bootstrap, 3, topic, legacy)[0] == INVALID_RECORD


def _fetch(bootstrap: str, version: int, topic: str, partition_max_bytes: int) -> tuple:
    """(error_code, high_watermark, records) of partition 0 from a hand-made Fetch v0-3."""
    body = struct.pack(">iii", -1, 0, 0)
    if version >= 3:
        body += struct.pack(">i", 50_000_000)
    body += struct.pack(">ih", 1, len(topic)) + topic.encode()
    body += struct.pack(">iiqi", 1, 0, 0, partition_max_bytes)
    with RawClient(bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", FETCH, version, 1, 3) + b"raw" + body)
        frame = client.receive_frame()
    position = 4 + (4 if version >= 1 else 0) + 4 + 2 + len(topic) + 4
    _, error_code, high_watermark, size = struct.unpack_from(">ihqi", frame, position)
    records = frame[position + 18:]
    assert len(records) == size
    return error_code, high_watermark, records


def _produce_v2_batch(bootstrap: str, topic: str, count: int) -> None:
    now_ms = int(time.time() * 1000)
    batch = record_codec.build_batch([(b"k", b"v%d" % i, [], now_ms) for i in range(count)])
    assert _produce(bootstrap, 3, topic, batch)[0] == 0


@pytest.mark.parametrize("version, magic", [(0, 0), (1, 0), (2, 1), (3, 1)])
def test_fetch_v0_to_v3_answers_magic_0_or_1_messages(broker, version, magic):
    topic = _one_partition_topic(broker.bootstrap)
    _produce_v2_batch(broker.bootstrap, topic, 5)
    error_code, high_watermark, records = _fetch(broker.bootstrap, version, topic, 1_000_000)
    assert (error_code, high_watermark) == (0, 5)
    assert {records[16 + at] for at in _entry_positions(records)} == {magic}
    assert [r.value for r in record_codec.decode_legacy(records)] == [b"v%d" % i for i in range(5)]


def _entry_positions(message_set: bytes) -> list[int]:
    position, starts = 0, []
    while position < len(message_set):
        starts.append(position)
        position += struct.unpack_from(">i", message_set, position + 8)[0] + 12
    return starts


def test_fetch_v3_sends_a_whole_first_batch_larger_than_the_limit_v2_does_not(broker):
    topic = _one_partition_topic(broker.bootstrap)
    _produce_v2_batch(broker.bootstrap, topic, 20)
    records = _fetch(broker.bootstrap, 3, topic, 100)[2]
    assert len(record_codec.decode_legacy(records)) == 20  # converted: larger than fetched
    assert _fetch(broker.bootstrap, 2, topic, 100)[2] == b""  # v0-2: a hard limit


def test_fetch_below_v10_of_a_zstd_topic_is_unsupported_compression_type(broker):
    topic = _one_partition_topic(broker.bootstrap, {"compression.type": "zstd"})
    _produce_v2_batch(broker.bootstrap, topic, 3)
    assert _fetch(broker.bootstrap, 1, topic, 1_000_000)[:2] == (UNSUPPORTED_COMPRESSION_TYPE, -1)
    with RawClient(broker.bootstrap) as client:  # v4-9 are not down-converted: the config says
        for version, expected in ((4, UNSUPPORTED_COMPRESSION_TYPE), (10, 0)):
            body = client.request(FETCH, version, {
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1_000_000,
                "isolation_level": 0, "session_id": 0, "session_epoch": -1, "topics": [
                    {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                     "partition_max_bytes": 1_000_000}]}]})
            assert body.responses[0].partitions[0].error_code == expected


def test_a_topic_without_down_conversion_answers_old_fetches_unsupported_version(broker):
    topic = _one_partition_topic(broker.bootstrap, {"message.downconversion.enable": "false"})
    _produce_v2_batch(broker.bootstrap, topic, 3)
    assert _fetch(broker.bootstrap, 3, topic, 1_000_000) == (UNSUPPORTED_VERSION, -1, b"")
    received = _rdkafka_consume(broker.bootstrap, topic, {}, 3)  # v4+ read the batches as is
    assert [m.value() for m in received] == [b"v0", b"v1", b"v2"]


def test_api_versions_advertises_produce_fetch_and_list_offsets_from_v0(broker):
    with RawClient(broker.bootstrap) as client:
        response = client.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                     "client_software_version": "1"})
    ranges = {key.api_key: (key.min_version, key.max_version) for key in response.api_keys}
    assert ranges[PRODUCE][0] == ranges[FETCH][0] == ranges[LIST_OFFSETS][0] == 0
    assert wire.response_is_flexible(PRODUCE, 2) is False


def _list_offsets_v0(bootstrap: str, topic: str, timestamp: int, max_num_offsets: int,
                     replica_id: int = -1) -> tuple[int, list[int]]:
    """(error_code, old_style_offsets) of partition 0 from a hand-made ListOffsets v0."""
    body = struct.pack(">iih", replica_id, 1, len(topic)) + topic.encode()
    body += struct.pack(">iiqi", 1, 0, timestamp, max_num_offsets)
    with RawClient(bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", LIST_OFFSETS, 0, 1, 3) + b"raw" + body)
        frame = client.receive_frame()
    position = 4 + 4 + 2 + len(topic) + 4
    _, error_code, count = struct.unpack_from(">ihi", frame, position)
    return error_code, list(struct.unpack_from(f">{count}q", frame, position + 10))


def test_list_offsets_v0_answers_kafkas_legacy_offsets_before(broker):
    topic = _one_partition_topic(broker.bootstrap, {"segment.bytes": "1024"})
    for _ in range(8):  # ~0.4 KB batches: a 1 KB segment holds two
        _produce_v2_batch(broker.bootstrap, topic, 30)
    assert _list_offsets_v0(broker.bootstrap, topic, -2, 1) == (0, [0])
    assert _list_offsets_v0(broker.bootstrap, topic, -1, 1) == (0, [240])
    error_code, offsets = _list_offsets_v0(broker.bootstrap, topic, -1, 10)
    assert (error_code, offsets[0], offsets[-1]) == (0, 240, 0)  # the end, segment bases
    assert offsets == sorted(set(offsets), reverse=True) and len(offsets) >= 3
    assert _list_offsets_v0(broker.bootstrap, topic, 0, 10) == (0, [])  # nothing that old
    assert _list_offsets_v0(broker.bootstrap, topic, -3, 1)[0] == UNSUPPORTED_VERSION
