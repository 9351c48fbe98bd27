"""The background scrub against a real broker process on real files: a sealed segment
damaged while the broker runs (a flipped bit; a zeroed 4 KiB page) takes its partition
offline -- one ERROR naming the file and the bad batch's byte, KAFKA_STORAGE_ERROR (or
NOT_LEADER_OR_FOLLOWER for old versions) for it -- and a confluent-kafka consumer never
receives a record of the damaged batch, while the other partitions keep serving."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.broker.config import BrokerConfig
from headrace.errors import InvalidConfig
from tests.broker.test_damaged_logs import (
    CLIENT_TIMEOUT_S,
    _assert_offline_and_others_served,
    _produce_values,
    _segment_files,
    _start,
)
from tests.conftest import BrokerProcess

SEGMENT_BYTES = 16384
RECORDS_PER_PARTITION = 250
PAGE_BYTES = 4096
FAST_SCRUB = {"log.scrub.interval.ms": "100", "log.scrub.io.max.bytes.per.second": "1e9"}
WAIT_S = 30.0
OFFLINE_CONSUME_S = 3.0  # how long a consumer of the offline partition is watched
DAMAGED_PARTITION = 1


def _fill(broker: BrokerProcess, topic: str) -> dict[int, list[bytes]]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    new_topic = NewTopic(topic, 3, 1, config={"segment.bytes": str(SEGMENT_BYTES)})
    admin.create_topics([new_topic])[topic].result(CLIENT_TIMEOUT_S)
    written = {p: [f"{p}-{n:04d}-".encode() * 30 for n in range(RECORDS_PER_PARTITION)]
               for p in range(3)}
    for partition, values in written.items():
        _produce_values(broker, topic, values, partition)
    assert len(_segment_files(broker, topic, DAMAGED_PARTITION)) >= 4
    return written


def _batch_starts(data: bytes) -> list[int]:
    starts, position = [], 0
    while position + 12 <= len(data):
        starts.append(position)
        position += int.from_bytes(data[position + 8:position + 12], "big") + 12
    return starts


def _damage_in_place(segment: Path, how: str) -> int:
    """Damage ``segment`` in place (as bit rot would: same file, same inode); returns the
    position of the first batch it breaks."""
    data = segment.read_bytes()
    assert len(data) >= 2 * PAGE_BYTES
    with open(segment, "r+b") as file:
        if how == "flip":
            second = _batch_starts(data)[1]
            file.seek(second + 70)  # in the records: covered by the CRC
            file.write(bytes([data[second + 70] ^ 0x04]))
            return second
        file.seek(PAGE_BYTES)
        file.write(bytes(PAGE_BYTES))
    return max(start for start in _batch_starts(data) if start < PAGE_BYTES)


def _received_from_offset_zero(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    """What a confluent-kafka consumer of ``partition`` receives in ``OFFLINE_CONSUME_S``
    (librdkafka does not verify CRCs by default: a damaged record would be delivered)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, partition, 0)])
    received, deadline = [], time.monotonic() + OFFLINE_CONSUME_S
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                received.append(message.value())
    finally:
        consumer.close()
    return received


def _wait_for_log(broker: BrokerProcess, text: str, since_byte: int) -> str:
    deadline = time.monotonic() + WAIT_S
    while text not in (logged := broker.log_text(since_byte)):
        assert time.monotonic() < deadline, f"no {text!r} in the broker's log"
        assert broker.process.poll() is None, logged
        time.sleep(0.05)
    return logged


def _wait_for_passes(broker: BrokerProcess, since_byte: int, passes: int) -> str:
    deadline = time.monotonic() + WAIT_S
    while (logged := broker.log_text(since_byte)).count("log scrub pass completed") < passes:
        assert time.monotonic() < deadline, "the scrub stopped passing"
        time.sleep(0.05)
    return logged


def _damaged_while_running(tmp_path: Path, how: str) -> None:
    topic = f"scrubbed-{how}"
    broker = _start(tmp_path, FAST_SCRUB)
    try:
        written = _fill(broker, topic)
        segment = _segment_files(broker, topic, DAMAGED_PARTITION)[1]
        mark = broker.log_bytes()
        bad_batch = _damage_in_place(segment, how)
        logged = _wait_for_log(broker, f"in {segment} at byte {bad_batch}", mark)
        logged = _wait_for_passes(broker, mark + len(logged.encode()), 2)
        errors = [line for line in broker.log_text(mark).splitlines() if " ERROR " in line]
        assert len(errors) == 1 and f"{topic}-{DAMAGED_PARTITION} is offline" in errors[0]
        # No record from the damaged partition at all, so none from its bad batch.
        assert _received_from_offset_zero(broker.bootstrap, topic, DAMAGED_PARTITION) == []
        _assert_offline_and_others_served(broker, topic, written)
        for partition in (0, 2):
            written[partition].append(b"new")
        broker.stop()
        broker.overrides["log.scrub.enable"] = "false"
        broker.start()  # a restart meets the damage again (the load), not forgetting it
        assert f"{segment}" in broker.log_text(mark)
        _assert_offline_and_others_served(broker, topic, written)
    finally:
        broker.stop()


def test_a_bit_flipped_in_a_sealed_segment_takes_its_partition_offline(tmp_path):
    _damaged_while_running(tmp_path, "flip")


def test_a_zeroed_page_in_a_sealed_segment_takes_its_partition_offline(tmp_path):
    _damaged_while_running(tmp_path, "zero")


@pytest.mark.parametrize(("setting", "message"), [
    ("log.scrub.io.max.bytes.per.second=0", "Value must be above 0"),
    ("log.scrub.interval.ms=0", "Value must be at least 1")])
def test_scrub_settings_out_of_range_stop_the_broker(tmp_path, setting, message):
    with pytest.raises(InvalidConfig, match=message):
        BrokerConfig.load(None, overrides=[f"log.dirs={tmp_path}", setting])
