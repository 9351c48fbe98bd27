"""Time retention against a real broker process, driven by a small
log.retention.check.interval.ms: records produced without a timestamp (-1) by
confluent-kafka (librdkafka), kafka-python and a hand-built batch (header max timestamp -1)
stay consumable after many retention checks, with the low watermark at 0, while records
stamped older than retention.ms are deleted. Waits observe the broker's log line for each
completed retention check and the watermarks, never a timer."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from headrace.broker.config import BrokerConfig
from headrace.errors import InvalidConfig
from headrace.protocol import records as record_codec
from headrace.protocol import wire
from tests.broker.raw_client import RawClient
from tests.conftest import BrokerProcess

RETENTION_MS = 60_000
RETENTION_CHECK_INTERVAL_MS = 100
CHECKS_TO_SURVIVE = 5
TOPIC_CONFIG = {"retention.ms": str(RETENTION_MS), "segment.bytes": "1024"}
RECORDS_PER_PRODUCER = 20
VALUE_BYTES = 100
WAIT_LIMIT_S = 60.0
POLL_PAUSE_S = 0.05
NO_TIMESTAMP = -1
CHECK_COMPLETED = "log retention check completed"


@pytest.fixture
def retention_broker(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    process = BrokerProcess(data_dir, {
        "log.retention.check.interval.ms": str(RETENTION_CHECK_INTERVAL_MS),
        "log.initial.task.delay.ms": "0"})
    process.start()
    yield process
    process.stop()


def _wait_until(predicate, what: str) -> None:
    """Poll an observed state, bounded in time."""
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(POLL_PAUSE_S)


def _create_topics(bootstrap: str, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, 1, 1, config=TOPIC_CONFIG) for name in names])
    for future in futures.values():
        future.result(WAIT_LIMIT_S)


def _value(producer: str, index: int) -> bytes:
    return f"{producer}-{index}-".encode().ljust(VALUE_BYTES, b"x")


def _produce_with_librdkafka(bootstrap: str, topic: str, timestamp_ms: int) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    values = [_value("librdkafka", i) for i in range(RECORDS_PER_PRODUCER)]
    for value in values:  # one batch each: the segments roll by segment.bytes
        producer.produce(topic, value, timestamp=timestamp_ms)
        assert producer.flush(WAIT_LIMIT_S) == 0
    return values


def _produce_with_kafka_python(bootstrap: str, topic: str) -> list[bytes]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    values = [_value("kafka-python", i) for i in range(RECORDS_PER_PRODUCER)]
    try:
        for value in values:
            producer.send(topic, value, timestamp_ms=NO_TIMESTAMP).get(WAIT_LIMIT_S)
    finally:
        producer.close()
    return values


def _produce_raw_untimed(bootstrap: str, topic: str) -> list[bytes]:
    """Batches built by hand: every record and the header's max timestamp are -1."""
    values = [_value("raw", i) for i in range(RECORDS_PER_PRODUCER)]
    with RawClient(bootstrap) as client:
        for value in values:
            batch = record_codec.build_batch([(None, value, [], NO_TIMESTAMP)])
            assert int.from_bytes(batch[35:43], "big", signed=True) == NO_TIMESTAMP
            body = client.request(wire.PRODUCE_KEY, 9, {
                "acks": -1, "timeout": 30000, "transactional_id": None,
                "topic_data": [{"name": topic, "partition_data": [{"index": 0,
                                                                   "records": batch}]}]})
            assert body.responses[0].partition_responses[0].error_code == 0
    return values


def _low_watermark(consumer: Consumer, topic: str) -> int:
    low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=WAIT_LIMIT_S,
                                            cached=False)
    return low


def _consume_all(consumer: Consumer, topic: str, count: int) -> list:
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages = []
    deadline = time.monotonic() + WAIT_LIMIT_S
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            messages.append(message)
    return messages


@pytest.mark.parametrize("producer", ["raw", "kafka-python", "librdkafka"])
def test_untimed_records_outlive_retention_checks_while_expired_records_go(retention_broker,
                                                                           producer):
    bootstrap = retention_broker.bootstrap
    untimed, expired = f"untimed-{uuid.uuid4().hex[:8]}", f"expired-{uuid.uuid4().hex[:8]}"
    _create_topics(bootstrap, untimed, expired)
    if producer == "raw":
        sent = _produce_raw_untimed(bootstrap, untimed)
    elif producer == "kafka-python":
        sent = _produce_with_kafka_python(bootstrap, untimed)
    else:
        sent = _produce_with_librdkafka(bootstrap, untimed, NO_TIMESTAMP)
    _produce_with_librdkafka(bootstrap, expired, int(time.time() * 1000) - 10 * RETENTION_MS)
    checks_after_produce = retention_broker.log_text().count(CHECK_COMPLETED)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{untimed}",
                         "enable.auto.commit": False})
    try:
        _wait_until(lambda: _low_watermark(consumer, expired) > 0,
                    "retention to delete the records older than retention.ms")
        _wait_until(lambda: retention_broker.log_text().count(CHECK_COMPLETED)
                    >= checks_after_produce + CHECKS_TO_SURVIVE, "more retention checks")
        assert _low_watermark(consumer, untimed) == 0
        messages = _consume_all(consumer, untimed, len(sent))
    finally:
        consumer.close()
    assert [m.value() for m in messages] == sent
    assert [m.offset() for m in messages] == list(range(len(sent)))
    assert {m.timestamp()[1] for m in messages} == {NO_TIMESTAMP}


@pytest.mark.parametrize(("setting", "minimum"), [
    ("log.retention.check.interval.ms=0", 1), ("log.initial.task.delay.ms=-1", 0),
    ("log.flush.offset.checkpoint.interval.ms=-1", 0),
    ("log.flush.start.offset.checkpoint.interval.ms=-5", 0)])
def test_log_manager_task_intervals_out_of_kafkas_range_stop_the_broker(tmp_path, setting,
                                                                        minimum):
    with pytest.raises(InvalidConfig, match=f"Value must be at least {minimum}"):
        BrokerConfig.load(None, overrides=[f"log.dirs={tmp_path}", setting])


def test_the_initial_task_delay_is_internal_described_only_when_set(tmp_path):
    """Kafka defines log.initial.task.delay.ms with defineInternal: DescribeConfigs lists it
    only when the broker's properties set it; the task intervals are always listed."""
    def described(*settings: str) -> set[str]:
        config = BrokerConfig.load(None, overrides=[f"log.dirs={tmp_path}", *settings])
        return {entry.name for entry in config.describe()}

    assert "log.retention.check.interval.ms" in described()
    assert "log.flush.start.offset.checkpoint.interval.ms" in described()
    assert "log.initial.task.delay.ms" not in described()
    assert "log.initial.task.delay.ms" in described("log.initial.task.delay.ms=0")
