"""Damaged logs at start-up, against a real broker process on real files.

A torn or garbled active-segment tail is found at every start (clean-shutdown marker or not),
truncated to the last valid batch with a WARNING naming the file and byte, and new records go
after the last valid batch. A partition whose log cannot be loaded (a corrupt sealed segment,
a gap between segments) goes offline -- KAFKA_STORAGE_ERROR for it, one ERROR naming the file
-- while the broker serves every other partition.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from headrace.protocol import records as record_codec
from tests.broker.raw_client import RawClient
from tests.broker.test_protocol import METADATA, _batch, _create, _fetch, _produce
from tests.conftest import BrokerProcess

CLIENT_TIMEOUT_S = 30.0
KAFKA_STORAGE_ERROR = 56
LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
LIST_OFFSETS = 2


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
