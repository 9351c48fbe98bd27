"""Topic and partition creation a client must not be able to abuse, against a real broker
process: Kafka's bound on the metadata records of one request (CreateTopics: POLICY_VIOLATION
for every topic, nothing created; CreatePartitions: UNKNOWN_SERVER_ERROR, the topic
unchanged), the file-descriptor budget of the log manager (POLICY_VIOLATION, no partial
partitions), a large creation that leaves the event loop serving other connections, and the
offsets topic, which clients can neither delete nor create (INVALID_REQUEST)."""

from __future__ import annotations

import resource
import select
import socket
import struct
import uuid

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from headrace.broker.handlers.create_topics import MAX_RECORDS_PER_USER_OP
from headrace.protocol import wire
from tests.broker.raw_client import RawClient
from tests.conftest import _start

REQUEST_TIMEOUT_S = 30.0
POLICY_VIOLATION, UNKNOWN_SERVER_ERROR, INVALID_REQUEST = 44, -1, 42
CREATE_TOPICS, CREATE_PARTITIONS, API_VERSIONS = 19, 37, 18
OFFSETS_TOPIC = "__consumer_offsets"
BOUND_MESSAGE = "Unable to perform excessively large batch operation."
# seed 21 case 4848: CreatePartitions v3 growing __consumer_offsets to 2^31 - 1 partitions
CREATE_PARTITIONS_2_31 = bytes.fromhex(
    "0000004d0025000300000001000466757a7a0004135f5f636f6e73756d65725f6f6666736574737fffffff"
    "0000082d79626162c3a9ffffffff01000a63c3a97a5f7a2d782d000000010100000000ad0000")
SMALL_DESCRIPTOR_LIMIT = 1024
OVER_SMALL_BUDGET_PARTITIONS = 400  # 1,200 descriptors: more than 1,024 allow
LARGE_CREATION_PARTITIONS = 1500
CREATION_START_POLLS = 1000
CREATION_START_POLL_S = 0.01
OTHER_CORRELATION_ID = 77


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _partition_dirs(broker, topic: str) -> list:
    return [p for p in broker.data_dir.iterdir() if p.name.startswith(f"{topic}-")]


def _confluent_error(future) -> tuple[int, str]:
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=REQUEST_TIMEOUT_S)
    return raised.value.args[0].code(), raised.value.args[0].str()


def _confluent_error_code(future) -> int:
    return _confluent_error(future)[0]


def test_create_topics_over_kafkas_record_bound_creates_nothing(broker):
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    single, first, second = _name("bound"), _name("bound-a"), _name("bound-b")
    futures = admin.create_topics([NewTopic(single, MAX_RECORDS_PER_USER_OP, 1)],
                                  operation_timeout=REQUEST_TIMEOUT_S)
    assert _confluent_error(futures[single]) == (POLICY_VIOLATION, BOUND_MESSAGE)  # 10,001
    half = MAX_RECORDS_PER_USER_OP // 2
    futures = admin.create_topics([NewTopic(first, half, 1), NewTopic(second, half, 1)],
                                  operation_timeout=REQUEST_TIMEOUT_S)
    assert [_confluent_error(futures[n]) for n in (first, second)] == [
        (POLICY_VIOLATION, BOUND_MESSAGE)] * 2
    topics = admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics
    assert not {single, first, second} & set(topics)
    assert not _partition_dirs(broker, single) + _partition_dirs(broker, first)


def test_kafka_python_create_topics_over_the_bound_is_policy_violation(broker):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        name = _name("kp-bound")
        response = client.create_topics([KpNewTopic(name, 2**31 - 1, 1)], raise_errors=False)
        assert [(t["name"], t["error_code"], t["error_message"])
                for t in response["topics"]] == [(name, POLICY_VIOLATION, BOUND_MESSAGE)]
        assert name not in client.list_topics()
        assert not _partition_dirs(broker, name)
    finally:
        client.close()


def test_create_partitions_over_the_bound_leaves_the_topic_unchanged(broker):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KpNewPartitions

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = _name("grow")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(timeout=REQUEST_TIMEOUT_S)
    futures = admin.create_partitions([NewPartitions(name, MAX_RECORDS_PER_USER_OP + 2)],
                                      operation_timeout=REQUEST_TIMEOUT_S)
    assert _confluent_error_code(futures[name]) == UNKNOWN_SERVER_ERROR
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        response = client.create_partitions({name: KpNewPartitions(2**31 - 1)},
                                            raise_errors=False)
        assert [(r.name, r.error_code) for r in response.results] == [
            (name, UNKNOWN_SERVER_ERROR)]
    finally:
        client.close()
    assert len(admin.list_topics(name, timeout=REQUEST_TIMEOUT_S).topics[name].partitions) == 1
    assert len(_partition_dirs(broker, name)) == 1


def test_the_fuzzers_create_partitions_frame_is_refused_up_front(broker):
    before = len(_partition_dirs(broker, OFFSETS_TOPIC))
    with RawClient(broker.bootstrap) as client:
        client.send_bytes(CREATE_PARTITIONS_2_31)
        _, response = wire.decode_response(CREATE_PARTITIONS, 3, client.receive_frame())
    assert (response.results[0].name, response.results[0].error_code) == (
        OFFSETS_TOPIC, UNKNOWN_SERVER_ERROR)
    assert len(_partition_dirs(broker, OFFSETS_TOPIC)) == before


def test_partitions_beyond_the_descriptor_budget_are_refused_whole(tmp_path):
    broker = _start(tmp_path)
    try:
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE,
                         (SMALL_DESCRIPTOR_LIMIT, SMALL_DESCRIPTOR_LIMIT))
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        name = _name("fds")
        futures = admin.create_topics([NewTopic(name, OVER_SMALL_BUDGET_PARTITIONS, 1)],
                                      operation_timeout=REQUEST_TIMEOUT_S)
        assert _confluent_error_code(futures[name]) == POLICY_VIOLATION
        assert not _partition_dirs(broker, name)
        small = _name("fits")  # the broker still creates what fits, and serves it
        admin.create_topics([NewTopic(small, 4, 1)])[small].result(timeout=REQUEST_TIMEOUT_S)
        for validate_only in (True, False):
            futures = admin.create_partitions(
                [NewPartitions(small, OVER_SMALL_BUDGET_PARTITIONS)],
                validate_only=validate_only, operation_timeout=REQUEST_TIMEOUT_S)
            assert _confluent_error_code(futures[small]) == POLICY_VIOLATION
        assert len(_partition_dirs(broker, small)) == 4
        assert "unexpected error handling a request" not in broker.log_text()
    finally:
        broker.stop()


def _api_versions_frame(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", API_VERSIONS, 0, correlation_id, 4) + b"test"
    return struct.pack(">i", len(body)) + body


def _has_bytes_waiting(sock: socket.socket, timeout_s: float) -> bool:
    return bool(select.select([sock], [], [], timeout_s)[0])


def test_a_large_creation_leaves_other_connections_served(fresh_broker):
    """While one connection waits for a topic of many partitions, another one's request is
    answered first: the creation runs off the event loop."""
    name = _name("large")
    with RawClient(fresh_broker.bootstrap) as creator, \
            RawClient(fresh_broker.bootstrap) as other:
        creator.send(CREATE_TOPICS, 7, {"timeout_ms": 60_000, "validate_only": False, "topics": [
            {"name": name, "num_partitions": LARGE_CREATION_PARTITIONS,
             "replication_factor": 1, "assignments": [], "configs": []}]})
        for _ in range(CREATION_START_POLLS):  # until the creation has begun
            if _partition_dirs(fresh_broker, name):
                break
            assert not _has_bytes_waiting(creator.sock, CREATION_START_POLL_S)
        else:
            pytest.fail("no partition directory appeared")
        other.send_bytes(_api_versions_frame(OTHER_CORRELATION_ID))
        assert struct.unpack(">i", other.receive_frame()[:4]) == (OTHER_CORRELATION_ID,)
        assert not _has_bytes_waiting(creator.sock, 0)  # still creating
        _, created = wire.decode_response(CREATE_TOPICS, 7, creator.receive_frame())
        assert created.topics[0].error_code == 0
    assert len(_partition_dirs(fresh_broker, name)) == LARGE_CREATION_PARTITIONS


def _commit_and_fetch(bootstrap: str, topic: str, offset: int) -> int:
    """Commit ``offset`` for ``topic``-0 in a new group and read it back."""
    group = _name("group")
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        return consumer.committed([TopicPartition(topic, 0)], timeout=REQUEST_TIMEOUT_S)[0].offset
    finally:
        consumer.close()


def test_clients_cannot_delete_or_recreate_the_offsets_topic(fresh_broker):
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewTopic as KpNewTopic

    admin = AdminClient({"bootstrap.servers": fresh_broker.bootstrap})
    admin.create_topics([NewTopic("data", 1, 1)])["data"].result(timeout=REQUEST_TIMEOUT_S)
    deleted = admin.delete_topics([OFFSETS_TOPIC], operation_timeout=REQUEST_TIMEOUT_S)
    assert _confluent_error_code(deleted[OFFSETS_TOPIC]) == INVALID_REQUEST
    created = admin.create_topics([NewTopic(OFFSETS_TOPIC, 1, 1)],
                                  operation_timeout=REQUEST_TIMEOUT_S)
    assert _confluent_error(created[OFFSETS_TOPIC]) == (
        INVALID_REQUEST, f"Creation of internal topic {OFFSETS_TOPIC} is prohibited.")
    client = KafkaAdminClient(bootstrap_servers=fresh_broker.bootstrap)
    try:
        response = client.delete_topics([OFFSETS_TOPIC], raise_errors=False)
        assert [(t["name"], t["error_code"]) for t in response["topics"]] == [
            (OFFSETS_TOPIC, INVALID_REQUEST)]
        response = client.create_topics([KpNewTopic(OFFSETS_TOPIC, 1, 1)], raise_errors=False)
        assert [(t["name"], t["error_code"]) for t in response["topics"]] == [
            (OFFSETS_TOPIC, INVALID_REQUEST)]
    finally:
        client.close()
    assert _commit_and_fetch(fresh_broker.bootstrap, "data", 5) == 5
    fresh_broker.restart()
    assert _commit_and_fetch(fresh_broker.bootstrap, "data", 7) == 7
