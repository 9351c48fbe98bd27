"""A full disk: appends fail with KAFKA_STORAGE_ERROR, the log says so at a bounded rate, and
deleting a topic gives its space back after file.delete.delay.ms, full disk or not.

The broker is a real process whose log directory is a small tmpfs (mounting needs root, as on
CI; elsewhere the test skips, visibly on a machine that could run it). The disk is filled by
producing until the broker refuses, then the topic is deleted and the test waits, bounded,
until the file system reports the space free and a new topic takes writes again.
"""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess
from tests.kernel_features import mount_tmpfs, unmount

DISK_BYTES = 24 << 20
VALUE_BYTES = 64 << 10
MAX_FILLING_RECORDS = 2 * DISK_BYTES // VALUE_BYTES
FAILING_REQUESTS = 60
DELETE_DELAY_MS = 1000
STORAGE_ERROR_LOG_INTERVAL_S = 5.0  # produce.STORAGE_ERROR_LOG_INTERVAL_MS
FREED_WAIT_S = 60.0


def _free_bytes(path) -> int:
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def _produce_one(producer: Producer, topic: str, value: bytes) -> KafkaError | None:
    """Produce one record and wait for its delivery report; its error, or None."""
    outcome: list[KafkaError | None] = []
    producer.produce(topic, value, on_delivery=lambda error, _msg: outcome.append(error))
    producer.flush(30)
    assert outcome, "no delivery report within 30 s"
    return outcome[0]


def _fill_until_refused(producer: Producer, topic: str) -> KafkaError:
    value = b"v" * VALUE_BYTES
    for _ in range(MAX_FILLING_RECORDS):
        error = _produce_one(producer, topic, value)
        if error is not None:
            return error
    raise AssertionError(f"the {DISK_BYTES}-byte disk took {MAX_FILLING_RECORDS} records")


@pytest.fixture
def full_disk_broker(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not mount_tmpfs(str(disk), DISK_BYTES):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    broker = BrokerProcess(disk / "data", {"log.segment.delete.delay.ms": str(DELETE_DELAY_MS),
                                           "offsets.topic.num.partitions": "1"})
    broker.log_path = tmp_path / "broker.log"
    try:
        broker.start()
        yield broker, disk
    finally:
        broker.kill()
        unmount(str(disk))


@pytest.mark.required_where("tmpfs_mount")
def test_a_full_disk_is_reported_at_a_bounded_rate_and_a_deleted_topic_frees_it(
        full_disk_broker):
    broker, disk = full_disk_broker
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("filler", 1, 1)])["filler"].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "retries": 0,
                         "linger.ms": 0, "message.timeout.ms": 30000})

    first_error = _fill_until_refused(producer, "filler")
    assert first_error.code() == KafkaError.KAFKA_STORAGE_ERROR
    started = time.monotonic()
    for _ in range(FAILING_REQUESTS):
        assert _produce_one(producer, "filler", b"v" * VALUE_BYTES) is not None
    elapsed_s = time.monotonic() - started
    lines = broker.log_path.read_text().count("storage error appending to filler-0")
    assert 1 <= lines <= 2 + elapsed_s / STORAGE_ERROR_LOG_INTERVAL_S, lines

    admin.delete_topics(["filler"])["filler"].result(30)
    deadline = time.monotonic() + FREED_WAIT_S
    while _free_bytes(disk) < DISK_BYTES // 2:
        assert time.monotonic() < deadline, f"{_free_bytes(disk)} bytes free after deleting"
        time.sleep(0.1)

    admin.create_topics([NewTopic("after", 1, 1)])["after"].result(30)
    assert _produce_one(producer, "after", b"v" * VALUE_BYTES) is None
