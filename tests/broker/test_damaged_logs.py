"""Damaged logs at start-up, against a real broker process on real files.

A torn or garbled active-segment tail is found at every start (clean-shutdown marker or not),
truncated to the last valid batch with a WARNING naming the file and byte, and new records go
after the last valid batch. A partition whose log cannot be loaded (a corrupt sealed segment,
a gap between segments) goes offline -- KAFKA_STORAGE_ERROR for it, one ERROR naming the file
-- while the broker serves every other partition.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.raw_client import RawClient
from tests.broker.test_protocol import (
    FETCH,
    LIST_OFFSETS,
    METADATA,
    PRODUCE,
    _batch,
    _create,
    _produce,
)
from tests.conftest import BrokerProcess

CLIENT_TIMEOUT_S = 30.0
KAFKA_STORAGE_ERROR = 56
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
SEGMENT_BYTES = 4096
RECORDS_PER_PARTITION = 60
# A soft open-file limit far below the 3 files per partition the active segments hold open.
LOW_SOFT_OPEN_FILE_LIMIT = 256


def _start(tmp_path: Path, overrides: dict[str, str] | None = None) -> BrokerProcess:
    data_dir = tmp_path / "data"
    data_dir.mkdir(exist_ok=True)
    broker = BrokerProcess(data_dir, overrides)
    broker.start()
    return broker


def _segment_files(broker: BrokerProcess, topic: str, partition: int = 0) -> list[Path]:
    return sorted((broker.data_dir / f"{topic}-{partition}").glob("*.log"))


def _produce_values(broker: BrokerProcess, topic: str, values: list[bytes],
                    partition: int = 0) -> None:
    with RawClient(broker.bootstrap) as client:
        for value in values:
            assert _produce(client, topic, _batch([value]), partition=partition).error_code == 0


def _produce_with_confluent(bootstrap: str, topic: str, values: list[bytes],
                            partition: int = 0) -> None:
    delivered: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "message.timeout.ms": int(CLIENT_TIMEOUT_S * 1000)})
    for value in values:
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda error, message: delivered.append(error))
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    assert delivered == [None] * len(values)


def _consume_with_confluent(bootstrap: str, topic: str, count: int,
                            partition: int = 0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(topic, partition, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            assert message.error() is None or message.error().code() == KafkaError._PARTITION_EOF
            if message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def _tear_tail(segment: Path, how: str) -> int:
    """Damage the end of ``segment``; returns the byte where the damage starts."""
    size_bytes = segment.stat().st_size
    with open(segment, "r+b") as file:
        if how == "cut":
            file.truncate(size_bytes - 7)
            return _last_batch_start(segment)
        file.seek(size_bytes)
        file.write(os.urandom(97) + b"\xff" * 64)
        return size_bytes


def _last_batch_start(segment: Path) -> int:
    data = segment.read_bytes()
    position = last = 0
    while position + 12 <= len(data):
        last = position
        position += int.from_bytes(data[position + 8:position + 12], "big") + 12
    return last


def _torn_tail_round_trip(tmp_path: Path, how: str) -> None:
    topic = f"torn-{how}"
    broker = _start(tmp_path)
    try:
        with RawClient(broker.bootstrap) as client:
            _create(client, topic)
        values = [f"before-{n}".encode() * 20 for n in range(30)]
        _produce_values(broker, topic, values)
        assert broker.stop() == 0  # a clean shutdown: the marker is written
        segment = _segment_files(broker, topic)[-1]
        damage_at = _tear_tail(segment, how)
        survivors = values[:-1] if how == "cut" else values
        broker.start()
        assert f"{segment}" in broker.log_text() and f"at byte {damage_at}" in broker.log_text()
        after = [f"after-{n}".encode() for n in range(5)]
        _produce_with_confluent(broker.bootstrap, topic, after)
        expected = survivors + after
        assert _consume_with_confluent(broker.bootstrap, topic, len(expected)) == expected
        broker.restart()  # the next start finds a sound log
        assert _consume_with_confluent(broker.bootstrap, topic, len(expected)) == expected
    finally:
        broker.stop()


def test_torn_tail_cut_short_after_clean_shutdown(tmp_path):
    _torn_tail_round_trip(tmp_path, "cut")


def test_garbage_appended_after_clean_shutdown(tmp_path):
    _torn_tail_round_trip(tmp_path, "garbage")


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new_topic = NewTopic(topic, partitions, 1, config={"segment.bytes": str(SEGMENT_BYTES)})
    admin.create_topics([new_topic])[topic].result(CLIENT_TIMEOUT_S)


def _fill_partitions(broker: BrokerProcess, topic: str, partitions: int) -> dict[int, list]:
    """Enough records in every partition for several segments; returns them by partition."""
    written = {p: [f"{p}-{n}-".encode() * 40 for n in range(RECORDS_PER_PARTITION)]
               for p in range(partitions)}
    for partition, values in written.items():
        _produce_values(broker, topic, values, partition)
    assert len(_segment_files(broker, topic, 1)) >= 4
    return written


def _garble_sealed_segment(broker: BrokerProcess, topic: str, partition: int) -> tuple[Path, int]:
    """Flip a byte inside the second batch of a sealed segment and remove its offset index,
    so loading must rebuild it and meets the bad batch. Returns (file, that batch's byte)."""
    segment = _segment_files(broker, topic, partition)[1]
    data = bytearray(segment.read_bytes())
    second = int.from_bytes(data[8:12], "big") + 12
    data[second + 70] ^= 0xFF  # in the records: the CRC no longer matches
    segment.write_bytes(bytes(data))
    segment.with_suffix(".index").unlink()
    return segment, second


def _partition_errors(client: RawClient, topic: str, partition: int) -> dict[str, int]:
    produce = _produce(client, topic, _batch([b"x"]), partition=partition).error_code
    produce_v3 = client.request(PRODUCE, 3, {
        "transactional_id": None, "acks": -1, "timeout": 30000,
        "topic_data": [{"name": topic, "partition_data": [
            {"index": partition, "records": _batch([b"x"])}]}]})
    fetches = {}
    for version in (4, 11):
        body = client.request(FETCH, version, _fetch_body(topic, partition, version))
        fetches[version] = body.responses[0].partitions[0].error_code
    offsets = client.request(LIST_OFFSETS, 7, {
        "replica_id": -1, "isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"partition_index": partition,
                                            "current_leader_epoch": -1, "timestamp": -1}]}]})
    metadata = client.request(METADATA, 12, {"topics": [{"name": topic}],
                                             "allow_auto_topic_creation": False})
    described = metadata.topics[0].partitions[partition]
    return {"produce": produce,
            "produce_v3": produce_v3.responses[0].partition_responses[0].error_code,
            "fetch_v4": fetches[4], "fetch_v11": fetches[11],
            "list_offsets": offsets.topics[0].partitions[0].error_code,
            "metadata": described.error_code, "leader": described.leader_id}


def _fetch_body(topic: str, partition: int, version: int) -> dict:
    return {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": partition, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                 "current_leader_epoch": -1, "log_start_offset": -1}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def _assert_offline_and_others_served(broker: BrokerProcess, topic: str,
                                      written: dict[int, list]) -> None:
    with RawClient(broker.bootstrap) as client:
        assert _partition_errors(client, topic, 1) == {
            "produce": KAFKA_STORAGE_ERROR, "produce_v3": NOT_LEADER_OR_FOLLOWER, "fetch_v4": NOT_LEADER_OR_FOLLOWER,
            "fetch_v11": KAFKA_STORAGE_ERROR, "list_offsets": KAFKA_STORAGE_ERROR,
            "metadata": LEADER_NOT_AVAILABLE, "leader": -1}
    listed = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(
        topic, timeout=CLIENT_TIMEOUT_S).topics[topic].partitions
    assert listed[1].error.code() == KafkaError.LEADER_NOT_AVAILABLE and listed[1].leader == -1
    for partition in (0, 2):
        assert listed[partition].error is None
        _produce_with_confluent(broker.bootstrap, topic, [b"new"], partition)
        expected = written[partition] + [b"new"]
        assert _consume_with_confluent(broker.bootstrap, topic, len(expected),
                                       partition) == expected


def test_corrupt_sealed_segment_takes_only_its_partition_offline(tmp_path):
    topic = "mixed-health"
    broker = _start(tmp_path)
    try:
        _create_topic(broker.bootstrap, topic, 3)
        written = _fill_partitions(broker, topic, 3)
        assert broker.stop() == 0
        segment, position = _garble_sealed_segment(broker, topic, 1)
        damaged_bytes = segment.read_bytes()
        broker.start()
        assert segment.read_bytes() == damaged_bytes  # kept whole for the operator's repair
        errors = [line for line in broker.log_text().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and str(segment) in errors[0] and f"byte {position}" in errors[0]
        _assert_offline_and_others_served(broker, topic, written)
        broker.restart()  # the damage is met again, not forgotten
        with RawClient(broker.bootstrap) as client:
            assert _partition_errors(client, topic, 1)["produce"] == KAFKA_STORAGE_ERROR
    finally:
        broker.stop()


def test_gap_between_segments_takes_the_partition_offline(tmp_path):
    topic = "gappy"
    broker = _start(tmp_path)
    try:
        _create_topic(broker.bootstrap, topic, 3)
        written = _fill_partitions(broker, topic, 3)
        assert broker.stop() == 0
        segments = _segment_files(broker, topic, 1)
        for suffix in (".log", ".index", ".timeindex"):
            segments[1].with_suffix(suffix).unlink()
        broker.start()
        errors = [line for line in broker.log_text().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "gap" in errors[0]
        assert str(segments[0]) in errors[0] and segments[2].name in errors[0]
        _assert_offline_and_others_served(broker, topic, written)
    finally:
        broker.stop()


def test_more_partitions_than_the_soft_open_file_limit_load(tmp_path):
    """Each partition's active segment holds three files open (log, offset and time index): a soft
    limit below that total must not take partitions offline (the broker raises it to the
    hard limit, as the JVM does for Kafka)."""
    topic, partitions = "many-partitions", 200
    broker = _start(tmp_path)
    try:
        _create_topic(broker.bootstrap, topic, partitions)
        assert broker.stop() == 0
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard <= 3 * partitions + LOW_SOFT_OPEN_FILE_LIMIT:
            pytest.skip(f"the hard open-file limit {hard} leaves no room")
        broker.preexec_fn = _limit_soft_open_files_to(LOW_SOFT_OPEN_FILE_LIMIT)
        broker.start()
        assert " ERROR " not in broker.log_text()
        with RawClient(broker.bootstrap) as client:
            metadata = client.request(METADATA, 12, {"topics": [{"name": topic}],
                                                     "allow_auto_topic_creation": False})
            assert [p.error_code for p in metadata.topics[0].partitions] == [0] * partitions
            assert _produce(client, topic, _batch([b"x"]), partition=partitions - 1
                            ).error_code == 0
    finally:
        broker.stop()


# Segment files a broker may not hold open at once: __consumer_offsets' 50 partitions,
# __transaction_state's (one here) and LOW_LIMIT_PARTITIONS more keep their active segments
# open (3 files each); every other partition's 3+ sealed segments must open only when read.
LOW_OPEN_FILE_LIMIT = 512
LOW_LIMIT_PARTITIONS = 40
OFFSETS_TOPIC_PARTITIONS = 50
TRANSACTION_STATE_PARTITIONS = 1


def _limit_soft_open_files_to(limit: int):
    def set_limit() -> None:  # runs in the broker process before it starts
        resource.setrlimit(resource.RLIMIT_NOFILE,
                           (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    return set_limit


def _limit_open_files_to(limit: int):
    def set_limit() -> None:  # runs in the broker process before it starts
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return set_limit


def _segment_file_count(data_dir: Path) -> int:
    return sum(1 for _ in data_dir.glob("*/*.log")) + sum(
        1 for _ in data_dir.glob("*/*index"))


def _consume_every_partition(bootstrap: str, topic: str, written: dict[int, list]
                             ) -> dict[int, list]:
    """Every record of every partition of ``topic`` from offset 0, by partition (bounded by
    the record count and CLIENT_TIMEOUT_S)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0) for partition in written])
    read: dict[int, list] = {partition: [] for partition in written}
    total = sum(len(values) for values in written.values())
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while sum(len(values) for values in read.values()) < total and \
                time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is not None:
                assert message.error() is None, message.error()
                read[message.partition()].append(message.value())
    finally:
        consumer.close()
    return read


def test_more_segment_files_than_even_the_hard_open_file_limit_load_and_serve(tmp_path):
    """Sealed segments hold no descriptor until read: a data directory with more segment
    files than the broker's hard RLIMIT_NOFILE (so raising the soft limit cannot help)
    loads every partition and serves every record of each."""
    topic = "many-segments"
    broker = _start(tmp_path, {
        "transaction.state.log.num.partitions": str(TRANSACTION_STATE_PARTITIONS)})
    try:
        _create_topic(broker.bootstrap, topic, LOW_LIMIT_PARTITIONS)
        written = _fill_partitions(broker, topic, LOW_LIMIT_PARTITIONS)
        assert broker.stop() == 0
        assert _segment_file_count(broker.data_dir) > LOW_OPEN_FILE_LIMIT
        active_partitions = (OFFSETS_TOPIC_PARTITIONS + TRANSACTION_STATE_PARTITIONS
                             + LOW_LIMIT_PARTITIONS)
        assert 3 * active_partitions < LOW_OPEN_FILE_LIMIT * 3 // 4
        broker.preexec_fn = _limit_open_files_to(LOW_OPEN_FILE_LIMIT)
        broker.start()
        assert " ERROR " not in broker.log_text()
        assert _consume_every_partition(broker.bootstrap, topic, written) == written
        assert " ERROR " not in broker.log_text()
    finally:
        broker.stop()


def test_unreadable_offsets_partition_is_one_error_and_the_broker_serves(tmp_path):
    broker = _start(tmp_path)
    try:
        assert broker.stop() == 0
        segment = broker.data_dir / "__consumer_offsets-7" / "00000000000000000000.log"
        segment.unlink()
        segment.mkdir()  # opening it fails (EISDIR)
        broker.start()
        errors = [line for line in broker.log_text().splitlines() if " ERROR " in line]
        assert len(errors) == 1 and "__consumer_offsets-7" in errors[0] and str(segment) in \
            errors[0]
        assert "Traceback" not in broker.log_text()
        with RawClient(broker.bootstrap) as client:
            _create(client, "beside-offline-offsets")
            assert _produce(client, "beside-offline-offsets", _batch([b"x"])).error_code == 0
            assert _partition_errors(client, "__consumer_offsets", 7)["produce"] == \
                KAFKA_STORAGE_ERROR
    finally:
        broker.stop()
