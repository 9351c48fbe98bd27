"""Transaction markers on a compacted topic inside a real broker: a confluent-kafka
transactional producer commits and aborts transactions over a few keys, plain writes follow
in rounds, and the broker's cleaner runs after each. Markers whose transactions have no data
left go once delete.retention.ms (0 here) has passed, and a read_committed consumer reading
from the start sees, after every cleaning, the latest committed value of every key."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.broker.test_cleaner_broker import (
    CLEANER_OVERRIDES,
    COMPACT_TOPIC_CONFIG,
    MAX_BATCH_BYTES,
    _wait_for_cleaning,
)
from tests.broker.test_transactions import _markers
from tests.conftest import BrokerProcess

TIMEOUT_S = 30
TRANSACTIONS = 24
KEYS = 6
FILLER_RECORDS = 300
MAX_ROUNDS = 6
POLL_LIMIT = 400


def _create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {**COMPACT_TOPIC_CONFIG, "delete.retention.ms": "0"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(TIMEOUT_S)


def _transactions(bootstrap: str, topic: str, oracle: dict[bytes, bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                         "transactional.id": f"markers-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(TIMEOUT_S)
    for number in range(TRANSACTIONS):
        commit = number % 3 != 0
        producer.begin_transaction()
        written = {b"k%d" % ((number + i) % KEYS): b"%s-%d-%d" % (
            b"committed" if commit else b"aborted", number, i) for i in range(2)}
        for key, value in written.items():
            producer.produce(topic, key=key, value=value, partition=0)
        if commit:
            producer.commit_transaction(TIMEOUT_S)
            oracle.update(written)
        else:
            assert producer.flush(TIMEOUT_S) == 0  # written, then aborted
            producer.abort_transaction(TIMEOUT_S)


def _filler(bootstrap: str, topic: str, round_number: int, oracle: dict[bytes, bytes]) -> int:
    """Plain writes over their own keys (new dirty data, rolled segments); the log end."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5,
                         "batch.size": MAX_BATCH_BYTES})
    failures = []
    for index in range(FILLER_RECORDS):
        key, value = b"filler-%d" % (index % 40), b"round-%d-%d" % (round_number, index)
        producer.produce(topic, key=key, value=value, partition=0,
                         on_delivery=lambda error, _: error and failures.append(error))
        oracle[key] = value
    assert producer.flush(TIMEOUT_S) == 0
    assert not failures, failures
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=TIMEOUT_S)[1]
    finally:
        consumer.close()


def _read_committed(bootstrap: str, topic: str) -> dict[bytes, bytes]:
    """Latest value per key a read_committed consumer reads from the start to the end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    latest: dict[bytes, bytes] = {}
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        for _ in range(POLL_LIMIT):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return latest
                raise KafkaException(message.error())
            latest[message.key()] = message.value()
    finally:
        consumer.close()
    raise AssertionError(f"no end of partition within {POLL_LIMIT} polls")


def test_markers_go_after_their_data_and_read_committed_keeps_the_oracle(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = BrokerProcess(data_dir, CLEANER_OVERRIDES)
    broker.start()
    try:
        topic = f"compacted-txn-{uuid.uuid4().hex[:8]}"
        _create_topic(broker.bootstrap, topic)
        oracle: dict[bytes, bytes] = {}
        _transactions(broker.bootstrap, topic, oracle)
        cleaned_to = 0  # (cleanings may already run while the transactions are written)
        for round_number in range(MAX_ROUNDS):
            log_end = _filler(broker.bootstrap, topic, round_number, oracle)
            status = _wait_for_cleaning(data_dir, topic, after_offset=max(cleaned_to,
                                                                          log_end // 2))
            cleaned_to = status["last_cleaning"]["end_offset"]
            assert _read_committed(broker.bootstrap, topic) == oracle
            if len(_markers(broker.bootstrap, topic, 0)) < TRANSACTIONS:
                break
        remaining = _markers(broker.bootstrap, topic, 0)
        assert 0 < len(remaining) < TRANSACTIONS  # the last transaction's marker stays
    finally:
        broker.stop()
