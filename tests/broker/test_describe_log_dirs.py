"""DescribeLogDirs (key 35) against a real broker process: a raw client for every version, and
kafka-python's KafkaAdminClient.describe_log_dirs as a client we did not write.

Sizes are checked against the segment files on disk: Kafka reports the sum of ``.log`` sizes.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient

from headrace.broker.handlers.describe_log_dirs import MAX_VERSION, MIN_VERSION

from .raw_client import RawClient

DESCRIBE_LOG_DIRS = 35
REQUEST_TIMEOUT_S = 15.0
PARTITIONS = 3
RECORDS_ON_PARTITION_1 = 20


@pytest.fixture(scope="module")
def topic(broker) -> str:
    """A 3-partition topic with records only on partition 1."""
    name = f"logdirs-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    for future in admin.create_topics([NewTopic(name, PARTITIONS, 1)]).values():
        future.result(REQUEST_TIMEOUT_S)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for index in range(RECORDS_ON_PARTITION_1):
        producer.produce(name, value=b"v" * 100 + str(index).encode(), partition=1)
        producer.flush(REQUEST_TIMEOUT_S)  # one batch per record: several batches on disk
    return name


def _segment_bytes_on_disk(data_dir: Path, topic: str, partition: int) -> int:
    return sum(path.stat().st_size for path in (data_dir / f"{topic}-{partition}").glob("*.log"))


def _describe(broker, version: int, topics) -> object:
    with RawClient(broker.bootstrap) as client:
        return client.request(DESCRIBE_LOG_DIRS, version, {"topics": topics})


def _sizes(result) -> dict[tuple[str, int], int]:
    return {(topic.name, partition.partition_index): partition.partition_size
            for topic in result.topics for partition in topic.partitions}


@pytest.mark.parametrize("version", range(MIN_VERSION, MAX_VERSION + 1))
def test_sizes_of_requested_partitions_match_segment_files(broker, topic, version):
    response = _describe(broker, version, [{"topic": topic, "partitions": [0, 1]}])
    assert len(response.results) == 1
    result = response.results[0]
    assert result.error_code == 0
    assert result.log_dir == os.path.abspath(broker.data_dir)
    sizes = _sizes(result)
    assert sizes == {(topic, 0): 0,
                     (topic, 1): _segment_bytes_on_disk(broker.data_dir, topic, 1)}
    assert sizes[(topic, 1)] > RECORDS_ON_PARTITION_1 * 100
    partitions = [p for t in result.topics for p in t.partitions]
    assert {(p.offset_lag, p.is_future_key) for p in partitions} == {(0, False)}
    if version >= 3:
        assert response.error_code == 0
    if version >= 4:
        volume = os.statvfs(broker.data_dir)
        assert result.total_bytes == volume.f_blocks * volume.f_frsize
        assert 0 < result.usable_bytes <= result.total_bytes


def test_unknown_topics_and_partitions_are_left_out(broker, topic):
    response = _describe(broker, 4, [{"topic": f"missing-{uuid.uuid4().hex[:8]}", "partitions": [0]},
                                     {"topic": topic, "partitions": [2, 7, -1]}])
    (result,) = response.results
    assert result.error_code == 0
    assert _sizes(result) == {(topic, 2): 0}


def test_no_matching_partition_still_lists_the_log_dir(broker):
    response = _describe(broker, 4, [])
    (result,) = response.results
    assert (result.error_code, result.topics) == (0, ())
    assert result.log_dir == os.path.abspath(broker.data_dir)


def test_null_topics_describes_every_partition(broker, topic):
    (result,) = _describe(broker, 2, None).results
    sizes = _sizes(result)
    assert {(topic, p) for p in range(PARTITIONS)} <= set(sizes)
    assert sizes[(topic, 1)] == _segment_bytes_on_disk(broker.data_dir, topic, 1)


def test_kafka_python_admin_client(broker, topic):
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        (answer,) = admin.describe_log_dirs({topic: [1]})
    finally:
        admin.close()
    (log_dir,) = answer["log_dirs"]
    assert log_dir["error_code"] == 0
    (described,) = log_dir["topics"]
    assert described["name"] == topic
    (partition,) = described["partitions"]
    assert partition["partition_index"] == 1
    assert partition["partition_size"] == _segment_bytes_on_disk(broker.data_dir, topic, 1)
