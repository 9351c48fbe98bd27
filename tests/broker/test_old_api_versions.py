"""The oldest versions Kafka 3.9 serves of OffsetCommit (v0-1), OffsetFetch (v0),
DeleteTopics (v0) and DescribeLogDirs (v0), against a real broker process: kafka-python with
``api_version=(0, 8, 2)`` (OffsetCommit / OffsetFetch v1) keeping a group's position, raw
requests for each new version, and malformed frames closing only their connection."""

from __future__ import annotations

import struct
import time
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as RdTopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as PyTopicPartition

from headrace.coordinator.records import (
    OffsetCommitKey,
    OffsetCommitValue,
    decode_key,
    decode_offset_commit_value,
    partition_for_group,
)
from headrace.protocol import wire
from tests.broker.raw_client import RawClient
from tests.broker.test_clients import _create_topic
from tests.broker.test_malformed_requests import _one_warning_for, _send_and_wait_for_close
from tests.broker.test_old_protocols import poll_kafka_python

OFFSET_COMMIT, OFFSET_FETCH, DELETE_TOPICS, DESCRIBE_LOG_DIRS, API_VERSIONS = 8, 9, 20, 35, 18
UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION = 3, 35
CLIENT_TIMEOUT_S = 30
OLD_KAFKA_PYTHON = (0, 8, 2)  # OffsetCommit v1, OffsetFetch v1, FindCoordinator v0


def _kafka_python_consume(bootstrap: str, topic: str, group: str, count: int) -> list:
    """``count`` records of partition 0 from ``group``'s committed position, then a commit."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, api_version=OLD_KAFKA_PYTHON,
                             group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", consumer_timeout_ms=2000)
    consumer.assign([PyTopicPartition(topic, 0)])
    received = poll_kafka_python(consumer, count)
    consumer.commit()
    consumer.close()
    return received


def test_kafka_python_0_8_2_resumes_a_group_from_its_committed_offset(broker):
    topic = _create_topic(broker.bootstrap, partitions=1)
    group = f"old-group-{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=OLD_KAFKA_PYTHON)
    for i in range(20):
        producer.send(topic, value=b"v%d" % i, partition=0)
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close()
    first = _kafka_python_consume(broker.bootstrap, topic, group, 12)
    assert [m.offset for m in first] == list(range(12))
    rest = _kafka_python_consume(broker.bootstrap, topic, group, 8)
    assert [(m.offset, m.value) for m in rest] == [(i, b"v%d" % i) for i in range(12, 20)]
    modern = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    committed = modern.committed([RdTopicPartition(topic, 0)], timeout=CLIENT_TIMEOUT_S)
    modern.close()
    assert committed[0].offset == 20  # v1 commits are the coordinator's, seen by v8 fetches


def _offset_commit(bootstrap: str, version: int, group: str, topic: str, partition: int,
                   offset: int, commit_timestamp: int = -1) -> list[tuple[str, int, int]]:
    """(topic, partition, error_code) of a hand-made OffsetCommit v0-1 (v1: generation -1,
    no member)."""
    body = struct.pack(">h", len(group)) + group.encode()
    if version == 1:
        body += struct.pack(">ih", -1, 0)
    body += struct.pack(">ih", 1, len(topic)) + topic.encode() + struct.pack(">iiq", 1, partition,
                                                                             offset)
    if version == 1:
        body += struct.pack(">q", commit_timestamp)
    body += struct.pack(">h", 2) + b"md"
    with RawClient(bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", OFFSET_COMMIT, version, 7, 3) + b"raw" + body)
        frame = client.receive_frame()
    correlation_id, decoded = wire.decode_response(OFFSET_COMMIT, version, frame)
    assert correlation_id == 7
    return [(t.name, p.partition_index, p.error_code) for t in decoded.topics
            for p in t.partitions]


def _committed(bootstrap: str, version: int, group: str, topic: str) -> list[tuple]:
    with RawClient(bootstrap) as client:
        response = client.request(OFFSET_FETCH, version, {
            "group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}]})
    return [(p.partition_index, p.committed_offset, p.metadata, p.error_code)
            for t in response.topics for p in t.partitions]


def test_offset_commit_v1_is_stored_by_the_coordinator(broker):
    topic = _create_topic(broker.bootstrap, partitions=1)
    group = f"v1-{uuid.uuid4().hex[:8]}"
    assert _offset_commit(broker.bootstrap, 1, group, topic, 0, 42) == [(topic, 0, 0)]
    assert _committed(broker.bootstrap, 1, group, topic) == [(0, 42, "md", 0)]
    assert _offset_commit(broker.bootstrap, 1, group, topic, 5, 1) == [
        (topic, 5, UNKNOWN_TOPIC_OR_PARTITION)]


def _stored_commit(bootstrap: str, group: str, topic: str) -> OffsetCommitValue:
    """The last value ``__consumer_offsets`` holds for ``group``'s commit of partition 0."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                         "enable.auto.commit": False})
    consumer.assign([RdTopicPartition("__consumer_offsets", partition_for_group(group), 0)])
    wanted, found = OffsetCommitKey(group, topic, 0), None
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while found is None and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=1):
            if message.error() is None and decode_key(message.key()) == wanted:
                found = decode_offset_commit_value(message.value())
    consumer.close()
    assert found is not None
    return found


def test_offset_commit_v1_keeps_its_commit_timestamp(broker):
    topic = _create_topic(broker.bootstrap, partitions=1)
    group = f"v1-time-{uuid.uuid4().hex[:8]}"
    assert _offset_commit(broker.bootstrap, 1, group, topic, 0, 7,
                          commit_timestamp=1_234_567_890) == [(topic, 0, 0)]
    stored = _stored_commit(broker.bootstrap, group, topic)
    assert (stored.offset, stored.metadata, stored.commit_timestamp_ms) == (7, "md", 1_234_567_890)


def test_offset_commit_and_fetch_v0_answer_unsupported_version_as_kraft_kafka(broker):
    """v0 is ZooKeeper's: a Kafka 3.9 broker without it refuses it per partition."""
    topic = _create_topic(broker.bootstrap, partitions=1)
    group = f"v0-{uuid.uuid4().hex[:8]}"
    assert _offset_commit(broker.bootstrap, 0, group, topic, 0, 42) == [
        (topic, 0, UNSUPPORTED_VERSION)]
    assert _offset_commit(broker.bootstrap, 0, group, "no-such-topic", 0, 42) == [
        ("no-such-topic", 0, UNKNOWN_TOPIC_OR_PARTITION)]
    assert _committed(broker.bootstrap, 1, group, topic) == [(0, -1, "", 0)]  # nothing stored
    assert _offset_commit(broker.bootstrap, 1, group, topic, 0, 42) == [(topic, 0, 0)]
    assert _committed(broker.bootstrap, 0, group, topic) == [(0, -1, "", UNSUPPORTED_VERSION)]


def _delete_topics_v0(bootstrap: str, names: list[str]) -> list[tuple[str, int]]:
    body = struct.pack(">i", len(names))
    for name in names:
        body += struct.pack(">h", len(name)) + name.encode()
    body += struct.pack(">i", 30_000)
    with RawClient(bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", DELETE_TOPICS, 0, 9, 3) + b"raw" + body)
        frame = client.receive_frame()
    correlation_id, count = struct.unpack_from(">ii", frame)
    assert correlation_id == 9
    position, answers = 8, []
    for _ in range(count):
        (length,) = struct.unpack_from(">h", frame, position)
        name = frame[position + 2:position + 2 + length].decode()
        (error_code,) = struct.unpack_from(">h", frame, position + 2 + length)
        answers.append((name, error_code))
        position += 4 + length
    assert position == len(frame)  # no throttle_time_ms in v0
    return answers


def test_delete_topics_v0_deletes_and_answers_without_throttle_time(broker):
    topic = _create_topic(broker.bootstrap, partitions=1)
    assert _delete_topics_v0(broker.bootstrap, [topic, "no-such-topic"]) == [
        (topic, 0), ("no-such-topic", UNKNOWN_TOPIC_OR_PARTITION)]
    with RawClient(broker.bootstrap) as client:
        metadata = client.request(3, 4, {"topics": [{"name": topic}],
                                             "allow_auto_topic_creation": False})
    assert metadata.topics[0].error_code == UNKNOWN_TOPIC_OR_PARTITION


def test_describe_log_dirs_v0_answers_as_v1(broker):
    topic = _create_topic(broker.bootstrap, partitions=2)
    with RawClient(broker.bootstrap) as client:
        response = client.request(DESCRIBE_LOG_DIRS, 0, {
            "topics": [{"topic": topic, "partitions": [0, 1, 7]}]})
    [result] = response.results
    assert result.error_code == 0
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in result.topics] == [
        (topic, [0, 1])]


def test_api_versions_lists_the_old_versions(broker):
    with RawClient(broker.bootstrap) as client:
        response = client.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                     "client_software_version": "1"})
    ranges = {key.api_key: (key.min_version, key.max_version) for key in response.api_keys}
    assert [ranges[key][0] for key in (OFFSET_COMMIT, OFFSET_FETCH, DELETE_TOPICS,
                                       DESCRIBE_LOG_DIRS)] == [0, 0, 0, 0]
    assert ranges[19][0] == ranges[32][0] == 0  # CreateTopics, DescribeConfigs
    assert (ranges[1][1], ranges[2]) == (17, (0, 9))  # Fetch, ListOffsets: as Kafka 3.9


@pytest.mark.parametrize("version", [0, 1])
def test_a_truncated_offset_commit_v0_or_v1_closes_with_one_warning(fresh_broker, version):
    body = struct.pack(">h", 1) + b"g" + (struct.pack(">ih", -1, 0) if version else b"")
    body += struct.pack(">ih", 1, 1) + b"t" + struct.pack(">ii", 1, 0)  # the offset is cut
    frame = struct.pack(">hhih", OFFSET_COMMIT, version, 1, 3) + b"cut" + body
    log_start = fresh_broker.log_bytes()
    port = _send_and_wait_for_close(fresh_broker.bootstrap, struct.pack(">i", len(frame)) + frame)
    assert f"api key {OFFSET_COMMIT} v{version}" in _one_warning_for(fresh_broker, port, log_start)
    assert fresh_broker.process.poll() is None
    with RawClient(fresh_broker.bootstrap) as other:
        assert other.request(API_VERSIONS, 0, {}).error_code == 0


# ---------------------------------------------------------------- admin APIs


def _old_admin(bootstrap: str, api_version: tuple[int, ...]):
    from kafka import KafkaAdminClient
    return KafkaAdminClient(bootstrap_servers=bootstrap, api_version=api_version,
                            request_timeout_ms=CLIENT_TIMEOUT_S * 1000)


def _topic_names(bootstrap: str) -> set[str]:
    with RawClient(bootstrap) as client:
        return {topic.name for topic in client.request(3, 1, {"topics": None}).topics}


@pytest.mark.parametrize("api_version", [(0, 10, 1), (0, 10, 2)])  # CreateTopics v0, v1
def test_kafka_python_old_admin_creates_and_deletes_topics(broker, api_version):
    from kafka.admin import NewTopic as PyNewTopic
    name = f"old-admin-{uuid.uuid4().hex[:8]}"
    admin = _old_admin(broker.bootstrap, api_version)
    try:
        admin.create_topics([PyNewTopic(name, 3, 1, topic_configs={"retention.ms": "60000"})])
        assert name in _topic_names(broker.bootstrap)
        admin.delete_topics([name])  # DeleteTopics v0
        assert name not in _topic_names(broker.bootstrap)
    finally:
        admin.close()


def _create_topics_v0_v1(bootstrap: str, version: int, name: str, partitions: int) -> list:
    """(name, error_code, error_message or "v0") of a hand-made CreateTopics v0-1."""
    body = struct.pack(">ih", 1, len(name)) + name.encode()
    body += struct.pack(">ihii", partitions, 1, 0, 0) + struct.pack(">i", 30_000)
    if version == 1:
        body += b"\x00"  # validate_only
    with RawClient(bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", 19, version, 4, 3) + b"raw" + body)
        frame = client.receive_frame()
    correlation_id, count = struct.unpack_from(">ii", frame)
    assert (correlation_id, count) == (4, 1)
    (length,) = struct.unpack_from(">h", frame, 8)
    topic = frame[10:10 + length].decode()
    (error_code,) = struct.unpack_from(">h", frame, 10 + length)
    message: str | None = "v0"
    position = 12 + length
    if version == 1:
        (message_length,) = struct.unpack_from(">h", frame, position)
        position += 2 + max(message_length, 0)
        message = None if message_length < 0 else frame[position - message_length:position].decode()
    assert position == len(frame)  # no throttle_time_ms before v2
    return [(topic, error_code, message)]


@pytest.mark.parametrize("version", [0, 1])
def test_create_topics_v0_v1_answer_without_throttle_time(broker, version):
    name = f"raw-create-{uuid.uuid4().hex[:8]}"
    assert _create_topics_v0_v1(broker.bootstrap, version, name, 2) == [
        (name, 0, None if version else "v0")]
    [(_, error_code, message)] = _create_topics_v0_v1(broker.bootstrap, version, name, 2)
    assert error_code == 36  # TOPIC_ALREADY_EXISTS
    assert (message == "v0") if version == 0 else ("already exists" in message)


def test_kafka_python_0_11_describes_configs_with_v0(broker):
    from kafka.admin import ConfigResource, ConfigResourceType
    topic = _create_topic(broker.bootstrap, partitions=1)
    admin = _old_admin(broker.bootstrap, (0, 11))
    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, ["retention.ms", "cleanup.policy"])],
            config_filter="all")
    finally:
        admin.close()
    configs = {name: (c["value"], c["read_only"], c["is_default"], c["is_sensitive"])
               for name, c in described["topic"][topic].items()}  # is_default: v0 only
    assert configs == {"retention.ms": ("604800000", False, False, False),
                       "cleanup.policy": ("delete", False, False, False)}


# ---------------------------------------------------------------- ListOffsets v8-9


def _list_offsets(bootstrap: str, version: int, topic: str, timestamp: int) -> tuple:
    with RawClient(bootstrap) as client:
        response = client.request(2, version, {"replica_id": -1, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "timestamp": timestamp}]}]})
    [partition] = response.topics[0].partitions
    return partition.error_code, partition.offset, partition.timestamp, partition.leader_epoch


def test_list_offsets_v8_v9_special_timestamps_as_kafka_without_tiered_storage(broker):
    topic = _create_topic(broker.bootstrap, partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for i in range(5):
        producer.send(topic, value=b"v%d" % i, partition=0)
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close()
    with RawClient(broker.bootstrap) as client:
        client.request(21, 2, {"topics": [{"name": topic, "partitions": [
            {"partition_index": 0, "offset": 2}]}], "timeout": 30_000})  # log start 2
    assert _list_offsets(broker.bootstrap, 8, topic, -4)[:3] == (0, 2, -1)  # earliest local
    assert _list_offsets(broker.bootstrap, 9, topic, -5) == (0, -1, -1, -1)  # nothing tiered
    assert _list_offsets(broker.bootstrap, 9, topic, -1)[:2] == (0, 5)
    for version, timestamp in ((7, -4), (8, -5), (6, -3), (9, -6)):  # before their version
        assert _list_offsets(broker.bootstrap, version, topic, timestamp) == (
            UNSUPPORTED_VERSION, -1, -1, -1)


def test_fetch_v17_reads_records_as_v16(broker):
    topic = _create_topic(broker.bootstrap, partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    producer.send(topic, value=b"seventeen", partition=0)
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close()
    with RawClient(broker.bootstrap) as client:
        topic_id = client.request(3, 12, {"topics": [{"name": topic}]}).topics[0].topic_id
        answers = [client.request(1, version, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "topics": [{"topic_id": topic_id, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                 "current_leader_epoch": -1, "log_start_offset": -1}]}]})
            for version in (16, 17)]
    v16, v17 = ([(p.error_code, p.high_watermark, bytes(p.records))
                 for t in a.responses for p in t.partitions] for a in answers)
    assert v17 == v16 and v17[0][:2] == (0, 1) and b"seventeen" in v17[0][2]


def _read_string(frame: bytes, position: int) -> tuple[str | None, int]:
    (length,) = struct.unpack_from(">h", frame, position)
    if length < 0:
        return None, position + 2
    return frame[position + 2:position + 2 + length].decode(), position + 2 + length


def test_describe_configs_v0_answers_an_unknown_topic_with_its_error(broker):
    body = struct.pack(">ibh", 2, 2, len("no-such-topic")) + b"no-such-topic"
    body += struct.pack(">i", -1)  # every config
    body += struct.pack(">bh", 4, 1) + b"1" + struct.pack(">ih", 1, len("log.dirs")) + b"log.dirs"
    with RawClient(broker.bootstrap) as client:
        client.send_bytes(struct.pack(">i", 10 + len("raw") + len(body)) +
                          struct.pack(">hhih", 32, 0, 6, 3) + b"raw" + body)
        frame = client.receive_frame()
    correlation_id, throttle_time_ms, count = struct.unpack_from(">iii", frame)
    assert (correlation_id, throttle_time_ms, count) == (6, 0, 2)
    results, position = [], 12
    for _ in range(count):
        (error_code,) = struct.unpack_from(">h", frame, position)
        message, position = _read_string(frame, position + 2)
        (resource_type,) = struct.unpack_from(">b", frame, position)
        name, position = _read_string(frame, position + 1)
        (config_count,) = struct.unpack_from(">i", frame, position)
        position += 4
        configs = []
        for _ in range(config_count):
            config_name, position = _read_string(frame, position)
            value, position = _read_string(frame, position)
            configs.append((config_name, value is not None, *struct.unpack_from(">???", frame,
                                                                                 position)))
            position += 3
        results.append((error_code, message is not None, resource_type, name, configs))
    assert position == len(frame)
    assert results == [
        (UNKNOWN_TOPIC_OR_PARTITION, True, 2, "no-such-topic", []),
        (0, False, 4, "1", [("log.dirs", True, True, False, False)])]  # read-only, not default
